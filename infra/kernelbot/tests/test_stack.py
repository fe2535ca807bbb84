"""Round trips against the real local stack (`cargo run --bin local -- --serve`): the submit
and webhook functions, the Buildkite stand-in running the real runner, and callbacks to a
callback route served here.

The stack is started once for the module: ``cargo run --quiet --bin local -- --serve`` from
the repository root, or ``$KERNELBOT_LOCAL_BIN --serve`` when that variable names a built
binary. It is ready once it has written ``<KERNELBOT_DATA_DIR>/submit-url``.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from dispatch_helpers import RecordingStatus, ServerThread, new_secret

from kernelbot_dispatch import CallbackEvent, DispatchLauncher, MemoryInbox, callback_app

pytestmark = pytest.mark.stack

REPO_ROOT = Path(__file__).resolve().parents[3]
STARTUP_TIMEOUT = 180.0
RUN_TIMEOUT = 240.0

# kernelbot's Python harness protocol, as `src/bin/local.rs` uses it: mode and cases file
# as arguments, `key: value` lines on the POPCORN_FD pipe.
EVAL_PY = r"""import os, random, sys, time
from submission import custom_kernel

def reference(data):
    a, b = data
    return [x + y for x, y in zip(a, b)]

mode, cases = sys.argv[1], [l for l in open(sys.argv[2]).read().splitlines() if l]
kind = "test" if mode == "test" else "benchmark"
out = os.fdopen(int(os.environ["POPCORN_FD"]), "w")
def say(key, value):
    print(f"{key}: {value}", file=out, flush=True)

say(f"{kind}-count", len(cases))
ok = True
for i, case in enumerate(cases):
    spec = dict(kv.split(": ") for kv in case.split("; "))
    rng = random.Random(int(spec.get("seed", 0)))
    n = int(spec["size"])
    data = ([rng.random() for _ in range(n)], [rng.random() for _ in range(n)])
    say(f"{kind}.{i}.spec", case)
    if mode == "test":
        passed = custom_kernel(data) == reference(data)
        ok &= passed
        say(f"{kind}.{i}.status", "pass" if passed else "fail")
    else:
        times = []
        for _ in range(20):
            start = time.perf_counter_ns()
            custom_kernel(data)
            times.append(time.perf_counter_ns() - start)
        mean = sum(times) / len(times)
        say(f"{kind}.{i}.runs", len(times)); say(f"{kind}.{i}.mean", mean)
        say(f"{kind}.{i}.status", "pass")
say("check", "pass" if ok else "fail")
sys.exit(0 if ok else 112)
"""

RIGHT = "def custom_kernel(data):\n    a, b = data\n    return [x + y for x, y in zip(a, b)]\n"
WRONG = "def custom_kernel(data):\n    a, b = data\n    return [x - y for x, y in zip(a, b)]\n"


def config(submission: str) -> dict[str, Any]:
    """A kernelbot-style config (what `build_task_config` makes) in `test` mode."""
    return {
        "lang": "py",
        "mode": "test",
        "main": "eval.py",
        "sources": {"eval.py": EVAL_PY, "submission.py": submission},
        "tests": [{"size": 1024, "seed": 1}, {"size": 4096, "seed": 2}, {"size": 16384, "seed": 3}],
        "benchmarks": [{"size": 65536, "seed": 4}],
        "test_timeout": 60,
        "benchmark_timeout": 60,
        "ranked_timeout": 60,
    }


class RecordingInbox(MemoryInbox):
    """Keeps every verified callback the route received, repeats included."""

    def __init__(self) -> None:
        super().__init__()
        self.received: list[CallbackEvent] = []

    async def put(self, event: CallbackEvent) -> bool:
        self.received.append(event)
        return await super().put(event)

    def types_for(self, run_id: str) -> list[str]:
        return [e.type for e in self.received if e.run_id == run_id]


@dataclass
class Stack:
    api_url: str
    token: str
    inbox: RecordingInbox


def _command() -> list[str]:
    binary = os.environ.get("KERNELBOT_LOCAL_BIN")
    if binary:
        return [binary, "--serve"]
    if shutil.which("cargo") is None:
        pytest.skip("cargo is not installed and KERNELBOT_LOCAL_BIN is not set")
    return ["cargo", "run", "--quiet", "--bin", "local", "--", "--serve"]


def _log_tail(log: Path) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-40:])


def _wait_until_serving(process: subprocess.Popen[bytes], url_file: Path, log: Path) -> str:
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the local stack exited ({process.returncode}):\n{_log_tail(log)}")
        url = url_file.read_text().strip() if url_file.exists() else ""
        if url.startswith("http://"):
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    return url
            except httpx.HTTPError:
                pass
        time.sleep(0.2)
    pytest.fail(f"no {url_file.name} within {STARTUP_TIMEOUT:.0f} s:\n{_log_tail(log)}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    """The stack runs in its own process group (cargo and the binary it started)."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGINT)
        process.wait(15)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)
    except ProcessLookupError:
        pass


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    command = _command()
    data_dir = tmp_path_factory.mktemp("kernelbot-data")
    log = data_dir / "stack.log"
    inbox, secret, token = RecordingInbox(), new_secret(), secrets.token_hex(24)
    with ServerThread(callback_app(secret, inbox)) as callbacks:
        env = {
            **os.environ,
            "CALLBACK_URL": f"{callbacks.url}/",
            "CALLBACK_SECRET": secret,
            "SUBMIT_API_TOKEN": token,
            "KERNELBOT_DATA_DIR": str(data_dir),
        }
        with log.open("wb") as out:
            process = subprocess.Popen(
                command,
                cwd=REPO_ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        try:
            url = _wait_until_serving(process, data_dir / "submit-url", log)
            yield Stack(api_url=url, token=token, inbox=inbox)
        finally:
            _stop(process)


class Launch:
    """A launcher on the stack whose requests are recorded, to tell callbacks from polls."""

    def __init__(self, stack: Stack):
        self.requests: list[httpx.Request] = []

        async def record(request: httpx.Request) -> None:
            self.requests.append(request)

        self.http = httpx.AsyncClient(timeout=30, event_hooks={"request": [record]})
        # A fallback far beyond the run's timeout: a result can only come from a callback.
        self.launcher = DispatchLauncher(
            stack.api_url, stack.token, stack.inbox, fallback_after=3600, http=self.http
        )

    async def run(self, submission: str) -> tuple[Any, RecordingStatus, str]:
        status = RecordingStatus()
        try:
            result = await asyncio.wait_for(
                self.launcher.run_submission(config(submission), "H100_BK", status), RUN_TIMEOUT
            )
        finally:
            await self.http.aclose()
        [post] = [r for r in self.requests if r.method == "POST"]
        run_id = json.loads(post.content)["run_id"]
        assert not [r for r in self.requests if r.method == "GET"], "polled: no callback came"
        return result, status, run_id


async def test_a_passing_kernel_comes_back_as_a_passing_full_result(stack: Stack) -> None:
    result, status, run_id = await Launch(stack).run(RIGHT)
    assert result.success is True, result.error
    test = result.runs["test"]
    assert test.run is not None and test.run.success and test.run.passed
    assert test.run.result["check"] == "pass" and test.run.result["test-count"] == "3"
    assert result.system.platform
    assert any(line.startswith("⏳ Queued") and "/builds/" in line for line in status.shown)
    assert any(line.startswith("⏳ Running on H100_BK") for line in status.shown), status.shown
    assert status.lines[-1].startswith("✅ Finished on H100_BK (passed)")
    received = stack.inbox.types_for(run_id)
    assert "job.finished" in received and "job.running" in received, received


async def test_a_wrong_kernel_comes_back_with_its_failed_test_run(stack: Stack) -> None:
    result, status, run_id = await Launch(stack).run(WRONG)
    assert result.success is True, result.error  # the evaluation ran; the kernel failed
    run = result.runs["test"].run
    assert run is not None and run.success and not run.passed
    assert run.result["check"] == "fail"
    assert run.result["test.0.status"] == "fail"
    finished = next(e for e in stack.inbox.received if e.run_id == run_id and e.terminal)
    assert finished.data["verdict"] == "failed"
    assert status.lines[-1].startswith("❌ Finished on H100_BK (failed)")


async def test_queue_status_counts_the_stand_in_agent(stack: Stack) -> None:
    launcher = DispatchLauncher(stack.api_url, stack.token, stack.inbox)
    try:
        queue = await launcher.get_queue_status("H100_BK")
        unknown = await launcher.get_queue_status("T4")
    finally:
        await launcher.aclose()
    assert queue.status == "available" and queue.error is None, queue
    assert (queue.runner, queue.gpu) == ("Dispatch", "H100_BK")
    assert queue.available_runners is not None and queue.available_runners >= 0
    assert queue.queued_jobs is not None and queue.running_jobs is not None
    assert unknown.status == "unavailable" and "T4" in unknown.error
