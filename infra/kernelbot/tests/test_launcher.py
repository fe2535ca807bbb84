"""The launcher against a fake submit API served on loopback: submitting, retrying,
refusals, callbacks, the polling fallback, cancellation, queue status, and a callback
received by another process."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from dispatch_helpers import (
    FULL_RESULT,
    FakeApi,
    RecordingStatus,
    ServerThread,
    callback_body,
    job_view,
    new_secret,
    signed_headers,
    webhook_id,
)

from kernelbot_dispatch import (
    CallbackEvent,
    DispatchLauncher,
    FullResult,
    Inbox,
    MemoryInbox,
    RecoverableInbox,
    RunnerQueueStatus,
    SqliteInbox,
    full_result_to_json,
)
from kernelbot_dispatch.postgres import PostgresInbox

TOKEN = "test-token"
QUEUE_TIMEOUT = "no agent on queue `h100` started it in time"
CONFIG = {"lang": "py", "mode": "test", "main": "eval.py", "sources": {"eval.py": "pass"}}


def event(run_id: str, state: str, **data: Any) -> CallbackEvent:
    return CallbackEvent.from_body(webhook_id(run_id, state), callback_body(run_id, state, **data))


def launcher(api: ServerThread, inbox: Inbox, **options: Any) -> DispatchLauncher:
    options = {"fallback_after": 30.0, "poll_interval": 30.0, "retry_backoff": 0.01, **options}
    return DispatchLauncher(api.url, TOKEN, inbox, **options)


async def run(
    launch: DispatchLauncher, status: RecordingStatus | None = None, gpu: str = "H100_BK"
) -> FullResult:
    try:
        return await asyncio.wait_for(
            launch.run_submission(dict(CONFIG), gpu, status or RecordingStatus()), 20
        )
    finally:
        await launch.aclose()


async def test_callbacks_drive_the_status_and_the_finished_one_is_the_result() -> None:
    inbox = MemoryInbox()

    async def on_submit(run_id: str) -> None:
        async def later() -> None:
            for state in ("scheduled", "running", "finished"):
                await asyncio.sleep(0.05)
                await inbox.put(event(run_id, state))

        asyncio.get_running_loop().create_task(later())

    fake, status = FakeApi(on_submit=on_submit), RecordingStatus()
    with ServerThread(fake) as api:
        result = await run(launcher(api, inbox), status)
    assert full_result_to_json(result) == FULL_RESULT
    [post] = fake.requests
    assert post.path == "/submissions" and post.headers["authorization"] == f"Bearer {TOKEN}"
    assert set(post.json) == {"run_id", "gpu", "config"}
    assert post.json["gpu"] == "H100_BK" and post.json["config"] == CONFIG
    assert post.json["run_id"].startswith("kb-") and len(post.json["run_id"]) == 35
    link = "[#7](<https://buildkite.com/org/kernelbot/builds/7>)"
    assert any(line.startswith("⏳ Queued") and link in line for line in status.shown)
    assert any(line.startswith("⏳ Running on H100_BK") and link in line for line in status.shown)
    assert status.lines[-1].startswith("✅ Finished on H100_BK (passed)")
    assert fake.paths("GET") == []


@pytest.mark.parametrize(
    "answer, expected",
    [
        (
            (
                422,
                {
                    "error": "invalid_config",
                    "field": "config.tests",
                    "message": "tests must be a list",
                },
            ),
            ["tests must be a list", "config.tests", "422"],
        ),
        ((401, {"error": "unauthorized", "message": "unauthorized"}), ["401", "unauthorized"]),
        ((413, {"error": "too_large", "message": "config is 200000 bytes"}), ["200000 bytes"]),
        (
            (502, {"error": "buildkite_error", "message": "Buildkite did not create the build"}),
            ["Buildkite did not create the build"],
        ),
        (
            (
                429,
                {
                    "error": "rate_limited",
                    "message": "this user already has 20 submissions waiting for a GPU",
                },
            ),
            ["20 submissions waiting", "429"],
        ),
        (
            (
                429,
                {
                    "error": "rate_limited",
                    "message": "this user has used 3612 of their 3600 GPU seconds for the last "
                    "24 hours; enough frees to submit again in about 5400 s",
                },
            ),
            ["3600 GPU seconds", "about 5400 s", "429"],
        ),
    ],
)
async def test_a_refusal_is_a_failed_result_naming_why_without_retrying(
    answer: tuple[int, dict[str, Any]], expected: list[str]
) -> None:
    fake = FakeApi(submit_answers=[answer, (202, {})])
    with ServerThread(fake) as api:
        result = await run(launcher(api, MemoryInbox()))
    assert result.success is False and result.runs == {}
    for text in expected:
        assert text in result.error
    assert len(fake.paths("POST")) == 1


async def test_unavailable_then_accepted_is_retried_with_the_same_run_id() -> None:
    inbox = MemoryInbox()

    async def on_submit(run_id: str) -> None:
        await inbox.put(event(run_id, "finished"))  # a callback that beats the 202

    fake = FakeApi(
        submit_answers=[
            (503, {"error": "unavailable", "message": "try later"}),
            (429, {}),
            (202, {}),
        ],
        on_submit=on_submit,
    )
    with ServerThread(fake) as api:
        result = await run(launcher(api, inbox))
    assert result.success is True and result.runs["test"].run.passed
    posts = [r for r in fake.requests if r.method == "POST"]
    assert len(posts) == 3
    assert len({p.json["run_id"] for p in posts}) == 1


async def test_an_unreachable_api_ends_in_a_failed_result_after_the_retries() -> None:
    with ServerThread(FakeApi()) as api:
        url = api.url
    launch = DispatchLauncher(url, TOKEN, MemoryInbox(), retry_backoff=0.01, submit_attempts=3)
    result = await run(launch)
    assert result.success is False and "unreachable" in result.error


async def test_without_callbacks_it_falls_back_to_polling_and_a_callback_still_wins() -> None:
    fake = FakeApi()
    submitted_at: dict[str, float] = {}

    async def on_submit(run_id: str) -> None:
        submitted_at[run_id] = time.monotonic()
        fake.views[run_id] = job_view(run_id, "finished", FULL_RESULT)

    fake.on_submit = on_submit
    status = RecordingStatus()
    with ServerThread(fake) as api:
        result = await run(
            launcher(api, MemoryInbox(), fallback_after=0.3, poll_interval=0.1), status
        )
    assert full_result_to_json(result) == FULL_RESULT
    [run_id] = submitted_at
    assert fake.paths("GET") == [f"/submissions/{run_id}"]
    assert status.lines[-1].startswith("✅ Finished on H100_BK (passed)")

    # Polling a job that stays running: the callback ends the wait.
    inbox, fake = MemoryInbox(), FakeApi()

    async def keep_running(run_id: str) -> None:
        fake.views[run_id] = job_view(run_id, "running")

        async def later() -> None:
            await asyncio.sleep(0.5)
            await inbox.put(event(run_id, "finished", result={**FULL_RESULT, "error": "from cb"}))

        asyncio.get_running_loop().create_task(later())

    fake.on_submit = keep_running
    with ServerThread(fake) as api:
        started = time.monotonic()
        result = await run(launcher(api, inbox, fallback_after=0.05, poll_interval=0.1))
    assert result.error == "from cb"
    assert len(fake.paths("GET")) >= 2
    assert time.monotonic() - started < 3


async def test_polling_waits_for_the_fallback_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeApi()
    times: dict[str, float] = {}

    async def on_submit(run_id: str) -> None:
        times["submitted"] = time.monotonic()
        fake.views[run_id] = job_view(run_id, "finished", FULL_RESULT)

    fake.on_submit = on_submit
    original = fake._route

    async def route(method: str, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        if method == "GET":
            times.setdefault("polled", time.monotonic())
        return await original(method, path, body)

    monkeypatch.setattr(fake, "_route", route)
    with ServerThread(fake) as api:
        await run(launcher(api, MemoryInbox(), fallback_after=0.4, poll_interval=0.1))
    assert times["polled"] - times["submitted"] >= 0.35


async def test_an_ending_without_a_result_is_a_failed_result_with_the_reason() -> None:
    inbox = MemoryInbox()
    endings = {
        "kb-timeout": event(
            "kb-timeout",
            "finished",
            verdict="queue_timeout",
            build_state="canceled",
            error=QUEUE_TIMEOUT,
            result=None,
        ),
        "kb-failed": event("kb-failed", "failed", error="Buildkite did not create the build"),
    }
    fake = FakeApi()

    async def on_submit(run_id: str) -> None:
        name = "kb-timeout" if len(fake.paths("POST")) == 1 else "kb-failed"
        ending = endings[name]
        body = ending.to_body()
        body["data"]["run_id"] = run_id
        await inbox.put(CallbackEvent.from_body(ending.id + run_id, body))

    fake.on_submit = on_submit
    with ServerThread(fake) as api:
        timed_out = await run(launcher(api, inbox))
        failed = await run(launcher(api, inbox))
    assert (timed_out.success, timed_out.error) == (False, QUEUE_TIMEOUT)
    assert (failed.success, failed.error) == (False, "Buildkite did not create the build")


QUICK = {**CONFIG, "test_timeout": 1}


async def test_a_run_that_never_ends_is_given_up_at_its_deadline_and_canceled() -> None:
    # The service accepts the run and then it never moves: no callback, a view that stays
    # `running`. The deadline: 0.3 s queue + 1 s test timeout + 0.2 s margin.
    fake = FakeApi()

    async def on_submit(run_id: str) -> None:
        fake.views[run_id] = job_view(run_id, "running")

    fake.on_submit = on_submit
    status = RecordingStatus()
    with ServerThread(fake) as api:
        launch = launcher(api, MemoryInbox(), queue_timeout=0.3, deadline_margin=0.2)
        assert launch.deadline_for(QUICK) == pytest.approx(1.5)
        started = time.monotonic()
        try:
            result = await asyncio.wait_for(
                launch.run_submission(dict(QUICK), "H100_BK", status), 20
            )
        finally:
            await launch.aclose()
        took = time.monotonic() - started
    run_id = fake.requests[0].json["run_id"]
    assert result.success is False and result.runs == {}
    assert "no result in time" in result.error and run_id in result.error
    assert "running" in result.error
    assert 1.4 <= took < 6, took
    assert [(r.method, r.path) for r in fake.requests] == [
        ("POST", "/submissions"),
        ("GET", f"/submissions/{run_id}"),
        ("POST", f"/submissions/{run_id}/cancel"),
    ]
    assert status.lines[-1] == "❌ No result in time on H100_BK: canceled"


async def test_at_its_deadline_a_run_that_ended_without_a_callback_gives_its_result() -> None:
    fake = FakeApi()

    async def on_submit(run_id: str) -> None:
        fake.views[run_id] = job_view(run_id, "finished", FULL_RESULT)

    fake.on_submit = on_submit
    with ServerThread(fake) as api:
        launch = launcher(api, MemoryInbox(), queue_timeout=0.1, deadline_margin=0.1)
        result = await asyncio.wait_for(
            launch.run_submission(dict(QUICK), "H100_BK", RecordingStatus()), 20
        )
        await launch.aclose()
    assert full_result_to_json(result) == FULL_RESULT
    assert fake.paths("POST") == ["/submissions"]  # nothing canceled
    assert len(fake.paths("GET")) == 1


@pytest.mark.parametrize(
    "config, evaluation",
    [
        ({"mode": "test"}, 180),
        ({"mode": "test", "test_timeout": 60, "benchmark_timeout": 999}, 60),
        ({"mode": "benchmark", "benchmark_timeout": 90.5}, 90.5),
        (
            {
                "mode": "leaderboard",
                "test_timeout": 30,
                "benchmark_timeout": 60,
                "ranked_timeout": 90,
            },
            180,
        ),
        ({"mode": "private"}, 540),
        ({"mode": "profile", "benchmarks": [{}, {}, {}], "benchmark_timeout": 100}, 300),
        ({"mode": "profile"}, 180),
        # The runner clamps every timeout, and the whole evaluation, to its 16 minutes.
        ({"mode": "leaderboard", "test_timeout": 5000}, 960),
        ({"mode": "test", "test_timeout": 10**9}, 960),
        # What the runner would refuse or read as missing: kernelbot's default.
        ({"mode": "test", "test_timeout": -5}, 180),
        ({"mode": "test", "test_timeout": "60"}, 180),
        ({"mode": "test", "test_timeout": True}, 180),
        ({"mode": "test", "test_timeout": float("nan")}, 180),
        ({"mode": "test", "test_timeout": None}, 180),
        ("not a config", 960),
    ],
)
def test_the_deadline_is_the_queue_wait_the_configs_timeouts_and_a_margin(
    config: Any, evaluation: float
) -> None:
    launch = DispatchLauncher("http://dispatch.test", TOKEN, MemoryInbox())
    assert launch.deadline_for(config) == 900 + evaluation + 900
    own_queue = DispatchLauncher(
        "http://dispatch.test", TOKEN, MemoryInbox(), max_queue_secs=60, deadline_margin=30
    )
    assert own_queue.deadline_for(config) == 60 + evaluation + 30


async def test_max_queue_secs_is_sent_with_the_submission() -> None:
    inbox = MemoryInbox()

    async def on_submit(run_id: str) -> None:
        await inbox.put(event(run_id, "finished"))

    fake = FakeApi(on_submit=on_submit)
    with ServerThread(fake) as api:
        result = await run(launcher(api, inbox, max_queue_secs=120))
    assert result.success is True
    assert fake.requests[0].json["max_queue_secs"] == 120


async def test_cache_false_asks_for_a_run_of_its_own() -> None:
    inbox = MemoryInbox()

    async def on_submit(run_id: str) -> None:
        await inbox.put(event(run_id, "finished"))

    fake = FakeApi(on_submit=on_submit)
    with ServerThread(fake) as api:
        await run(launcher(api, inbox))
        await run(launcher(api, inbox, cache=False))
    assert "cache" not in fake.requests[0].json, "the service's default: answers may be reused"
    assert fake.requests[1].json["cache"] is False


async def test_a_background_launcher_says_so_and_a_wrong_priority_is_refused() -> None:
    inbox = MemoryInbox()

    async def on_submit(run_id: str) -> None:
        await inbox.put(event(run_id, "finished"))

    fake = FakeApi(on_submit=on_submit)
    with ServerThread(fake) as api:
        await run(launcher(api, inbox))
        await run(launcher(api, inbox, priority="background"))
        with pytest.raises(ValueError, match="priority"):
            launcher(api, inbox, priority="urgent")
    assert "priority" not in fake.requests[0].json
    assert fake.requests[1].json["priority"] == "background"


async def test_the_user_is_sent_and_a_waiting_run_shows_its_place() -> None:
    inbox = MemoryInbox()

    async def on_submit(run_id: str) -> None:
        await inbox.put(event(run_id, "finished"))

    waiting = {
        "state": "submitted",
        "build": None,
        "waiting": "user_limit",
        "queue_position": 3,
        "expected_start": "2026-11-25T16:30:00.000Z",
    }
    fake = FakeApi(submit_answers=[(202, waiting)], on_submit=on_submit)
    status = RecordingStatus()
    with ServerThread(fake) as api:
        launch = launcher(api, inbox)
        result = await launch.run_submission(dict(CONFIG), "H100_BK", status, user="4815162342")
        await launch.aclose()
    assert result.success is True
    assert fake.requests[0].json["user"] == "4815162342"
    shown = "\n".join(status.shown)
    assert "Waiting for its turn on H100_BK" in shown, shown
    assert "3rd in line, expected to start" in shown, shown
    assert "<t:" not in shown, "plain text: not every reporter is Discord"


def test_a_place_reads_as_plain_text_at_the_time_it_is_shown() -> None:
    from kernelbot_dispatch.launcher import _place, _user_key

    start = "2026-11-25T16:30:00.000Z"
    at = 1795624200.0
    cases: list[tuple[dict[str, Any], str]] = [
        ({"queue_position": 1}, " — next to start"),
        ({"queue_position": 12, "expected_start": start}, " — 12th in line, expected to start now"),
        (
            {"queue_position": 22, "expected_start": start},
            " — 22nd in line, expected to start in about 4 min",
        ),
        ({"queue_position": 0}, ""),
        ({"queue_position": True}, ""),
        ({}, ""),
    ]
    for job, shown in cases:
        now = at if job.get("queue_position") == 12 else at - 240
        assert _place(job, now=now) == shown, job
    assert _user_key(4815162342) == "4815162342"
    assert _user_key("a b") is None and _user_key("x" * 65) is None and _user_key(None) is None


async def submitted(launch: DispatchLauncher, fake: FakeApi) -> asyncio.Task[FullResult]:
    """A running submission's task, once its POST has reached `fake`."""
    task = asyncio.create_task(launch.run_submission(dict(CONFIG), "H100_BK", RecordingStatus()))
    for _ in range(200):
        if fake.paths("POST"):
            break
        await asyncio.sleep(0.01)
    return task


async def test_a_cancel_that_beats_the_job_is_repeated_until_the_job_is_known() -> None:
    # The cancel reached the service before the (slow) submit recorded the job: 404, twice.
    fake = FakeApi(cancel_answers=[404, 404])
    with ServerThread(fake) as api:
        launch = launcher(api, MemoryInbox(), cancel_window=10.0)
        task = await submitted(launch, fake)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await launch.aclose()  # waits for the cancel's retries
    run_id = fake.requests[0].json["run_id"]
    cancels = [r for r in fake.requests if r.path == f"/submissions/{run_id}/cancel"]
    assert len(cancels) == 3, [r.path for r in fake.requests]


async def test_a_submit_that_may_have_landed_is_cancelled_when_given_up() -> None:
    # Every attempt answered 503: the job may exist all the same, and nobody would read it.
    fake = FakeApi(submit_answers=[(503, {"error": "unavailable", "message": "down"})] * 2)
    with ServerThread(fake) as api:
        result = await run(launcher(api, MemoryInbox(), submit_attempts=2))
    assert result.success is False and "could not submit" in result.error
    run_id = fake.requests[0].json["run_id"]
    assert fake.paths("POST")[-1] == f"/submissions/{run_id}/cancel"


async def test_cancelling_the_task_cancels_the_job() -> None:
    fake = FakeApi()
    with ServerThread(fake) as api:
        launch = launcher(api, MemoryInbox())
        task = await submitted(launch, fake)
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await launch.aclose()
    run_id = fake.requests[0].json["run_id"]
    cancel = fake.requests[-1]
    assert (cancel.method, cancel.path) == ("POST", f"/submissions/{run_id}/cancel")
    assert cancel.headers["authorization"] == f"Bearer {TOKEN}"


QUEUE_BODY = {
    "gpu": "H100_BK",
    "queue": "h100",
    "agents": {
        "total": 3,
        "idle": 2,
        "busy": 1,
        "list": [
            {"name": "node-1-gpu0", "busy": True},
            {"name": "node-1-gpu1", "busy": False},
            {"name": "node-1-gpu2", "busy": False},
        ],
    },
    "jobs": {"queued": 4, "running": 1},
    "oldest_queued_secs": 42.5,
}


async def queue_status(
    answer: tuple[int, dict[str, Any]] | None, gpu: str = "H100_BK"
) -> tuple[RunnerQueueStatus, list[str]]:
    """The launcher's queue status for ``gpu`` when the API answers ``answer`` (None: the
    API is not there at all); and the paths it asked."""
    fake = FakeApi(queue_answer=answer or (200, {}))

    async def ask(url: str) -> RunnerQueueStatus:
        launch = DispatchLauncher(url, TOKEN, MemoryInbox(), request_timeout=5.0)
        try:
            return await launch.get_queue_status(gpu, {"lang": "py"})
        finally:
            await launch.aclose()

    if answer is None:
        with socket.socket() as closed:  # a port nothing listens on once it is closed
            closed.bind(("127.0.0.1", 0))
            port = closed.getsockname()[1]
        return await ask(f"http://127.0.0.1:{port}"), fake.paths("GET")
    with ServerThread(fake) as api:
        status = await ask(api.url)
    return status, fake.paths("GET")


async def test_queue_status_is_kernelbots_runner_queue_status() -> None:
    status, paths = await queue_status((200, QUEUE_BODY))
    assert type(status) is RunnerQueueStatus
    assert status.to_dict() == {
        "runner": "Dispatch",
        "gpu": "H100_BK",
        "queued_jobs": 4,
        "running_jobs": 1,
        "available_runners": 2,
        "status": "available",
        "error": None,
    }
    assert paths == ["/queues/H100_BK"]


async def test_queue_status_of_a_gpu_the_service_does_not_serve_is_unavailable() -> None:
    answer = (404, {"error": "not_found", "message": "unknown gpu \"T4\"; known: H100_BK"})
    status, paths = await queue_status(answer, gpu="T4")
    assert paths == ["/queues/T4"]
    assert (status.runner, status.gpu, status.status) == ("Dispatch", "T4", "unavailable")
    assert status.queued_jobs is None and status.available_runners is None
    assert 'unknown gpu "T4"' in status.error and "404" in status.error


@pytest.mark.parametrize(
    "answer",
    [
        (502, {"error": "buildkite_error", "message": "the Buildkite agents API failed: 500"}),
        (503, {"error": "unavailable", "message": "the job store cannot be reached"}),
    ],
)
async def test_queue_status_when_buildkite_or_the_store_fails_is_unavailable(
    answer: tuple[int, dict[str, Any]],
) -> None:
    status, _ = await queue_status(answer)
    assert status.status == "unavailable" and status.queued_jobs is None
    assert answer[1]["message"] in status.error and str(answer[0]) in status.error


async def test_queue_status_when_the_service_is_unreachable_is_unavailable_not_an_exception() -> (
    None
):
    status, paths = await queue_status(None)
    assert paths == []
    assert status.to_dict() == {
        "runner": "Dispatch",
        "gpu": "H100_BK",
        "queued_jobs": None,
        "running_jobs": None,
        "available_runners": None,
        "status": "unavailable",
        "error": status.error,
    }
    assert status.error.startswith("kernelbot-dispatch unreachable: ")


async def test_queue_status_ignores_counts_that_are_not_counts() -> None:
    body = {**QUEUE_BODY, "jobs": {"queued": "many", "running": -1}, "agents": ["x"]}
    status, _ = await queue_status((200, body))
    assert status.status == "available"
    assert (status.queued_jobs, status.running_jobs, status.available_runners) == (None, None, None)


async def test_kernelbot_may_name_the_run_and_the_returned_run_is_taken() -> None:
    inbox = MemoryInbox()

    async def on_submit(run_id: str) -> None:
        await inbox.put(event(run_id, "finished"))

    fake = FakeApi(on_submit=on_submit)
    with ServerThread(fake) as api:
        launch = launcher(api, inbox)
        result = await launch.run_submission(
            dict(CONFIG), "H100_BK", RecordingStatus(), run_id="kb-42-H100_BK-leaderboard"
        )
        assert result.success is True
        assert fake.requests[0].json["run_id"] == "kb-42-H100_BK-leaderboard"
        # kernelbot has had it: a recovery after a restart does not hand it over again.
        assert await launch.recover(settle=0) == {}
        await launch.aclose()


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
async def test_recover_returns_the_runs_that_ended_while_kernelbot_was_down(
    store: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    open_inbox: Callable[[], RecoverableInbox]
    if store == "sqlite":
        path = tmp_path / "inbox.sqlite3"
        open_inbox = functools.partial(SqliteInbox, path)
    else:
        url = request.getfixturevalue("postgres_url")
        open_inbox = functools.partial(PostgresInbox, url)
    # kernelbot was down; the callback route (another process) recorded two endings and a
    # run still going.
    route = open_inbox()
    await route.put(event("kb-7-H100_BK-test", "finished"))
    await route.put(event("kb-8-H100_BK-test", "failed", error="Buildkite refused the build"))
    await route.put(event("kb-9-H100_BK-test", "running"))
    # kernelbot starts again: a new launcher on the same inbox.
    launch = DispatchLauncher("http://dispatch.test", TOKEN, open_inbox())
    try:
        assert await launch.recover() == {}  # not settled: a launcher may still take them
        recovered = await launch.recover(settle=0)
        assert list(recovered) == ["kb-7-H100_BK-test", "kb-8-H100_BK-test"]
        assert full_result_to_json(recovered["kb-7-H100_BK-test"]) == FULL_RESULT
        failed = recovered["kb-8-H100_BK-test"]
        assert (failed.success, failed.error) == (False, "Buildkite refused the build")
        assert await launch.recover(settle=0) == {}  # handed over once
        # Another process recovering at the same time gets none of them twice either.
        other = DispatchLauncher("http://dispatch.test", TOKEN, open_inbox())
        await route.put(event("kb-9-H100_BK-test", "finished"))
        both = await asyncio.gather(other.recover(settle=0), launch.recover(settle=0))
        assert sorted(run for got in both for run in got) == ["kb-9-H100_BK-test"]
        await other.aclose()
    finally:
        await launch.aclose()


async def test_recover_by_run_id_reads_the_inbox_then_asks_the_service() -> None:
    inbox = MemoryInbox()
    await inbox.put(event("kb-called-back", "finished"))
    await inbox.take("kb-called-back")  # returned once already: kernelbot asks all the same
    fake = FakeApi()
    fake.views["kb-polled"] = job_view("kb-polled", "finished", FULL_RESULT)
    fake.views["kb-running"] = job_view("kb-running", "running")
    fake.views["kb-timed-out"] = {
        **job_view("kb-timed-out", "finished"),
        "verdict": "queue_timeout",
        "result": {
            "verdict": "queue_timeout",
            "build_state": "canceled",
            "error": QUEUE_TIMEOUT,
            "result": None,
        },
    }
    with ServerThread(fake) as api:
        launch = launcher(api, inbox)
        ids = ["kb-called-back", "kb-polled", "kb-running", "kb-unknown", "kb-timed-out"]
        recovered = await launch.recover([*ids, "kb-polled"])
        await launch.aclose()
    assert list(recovered) == ["kb-called-back", "kb-polled", "kb-timed-out"]
    assert full_result_to_json(recovered["kb-called-back"]) == FULL_RESULT
    assert full_result_to_json(recovered["kb-polled"]) == FULL_RESULT
    timed_out = recovered["kb-timed-out"]
    assert (timed_out.success, timed_out.error) == (False, QUEUE_TIMEOUT)
    assert sorted(fake.paths("GET")) == sorted(f"/submissions/{r}" for r in ids[1:])
    assert not await inbox.take("kb-polled")  # recorded as taken


async def test_recover_without_run_ids_needs_an_inbox_that_lists() -> None:
    class PlainInbox:
        async def put(self, event: CallbackEvent) -> bool:
            return True

        async def wait(
            self, run_id: str, after_rank: int, timeout: float
        ) -> CallbackEvent | None:
            return None

    launch = DispatchLauncher("http://dispatch.test", TOKEN, PlainInbox())
    try:
        with pytest.raises(TypeError, match="PlainInbox"):
            await launch.recover()
    finally:
        await launch.aclose()


def raising(error: Exception) -> Callable[[httpx.Request], httpx.Response]:
    def handler(request: httpx.Request) -> httpx.Response:
        raise error

    return handler


def answering(status: int, content: bytes) -> Callable[[httpx.Request], httpx.Response]:
    return lambda request: httpx.Response(status, content=content)


@pytest.mark.parametrize(
    "handler, reason",
    [
        (answering(200, b"[1, 2]"), "answered 200 without a JSON object"),
        (answering(200, b"null"), "answered 200 without a JSON object"),
        (answering(200, b'"busy"'), "answered 200 without a JSON object"),
        (answering(200, b"<html>ok</html>"), "answered 200 without a JSON object"),
        (answering(200, b"\xff\xfe{"), "answered 200 without a JSON object"),
        (answering(200, b""), "answered 200 without a JSON object"),
        (answering(500, b"<html>Internal Server Error</html>"), "answered 500"),
        (answering(503, b'{"error": "unavailable"}'), "(503 unavailable)"),
        (raising(httpx.ReadTimeout("timed out")), "unreachable: timed out"),
        (raising(httpx.ConnectError("refused")), "unreachable: refused"),
        (raising(httpx.RemoteProtocolError("bad")), "unreachable: bad"),
        (raising(KeyError("jobs")), "KeyError"),
        (raising(TypeError("not a mapping")), "TypeError: not a mapping"),
        (raising(ValueError("bad value")), "ValueError: bad value"),
        (raising(asyncio.TimeoutError()), "TimeoutError"),
        (raising(RuntimeError("a bug")), "RuntimeError: a bug"),
    ],
)
async def test_queue_status_never_raises_and_says_why_it_is_unavailable(
    handler: Callable[[httpx.Request], httpx.Response], reason: str
) -> None:
    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    launch = DispatchLauncher("http://dispatch.test", TOKEN, MemoryInbox(), http=http)
    try:
        status = await launch.get_queue_status("H100_BK")
    finally:
        await http.aclose()
    assert (status.runner, status.gpu, status.status) == ("Dispatch", "H100_BK", "unavailable")
    assert (status.queued_jobs, status.running_jobs, status.available_runners) == (None,) * 3
    assert reason in status.error


async def test_queue_status_of_a_gpu_it_cannot_name_is_unavailable_not_an_exception() -> None:
    class Unnamed:
        @property
        def name(self) -> str:
            raise RuntimeError("no name")

    http = httpx.AsyncClient(transport=httpx.MockTransport(answering(200, b"{}")))
    launch = DispatchLauncher("http://dispatch.test", TOKEN, MemoryInbox(), http=http)
    try:
        status = await launch.get_queue_status(Unnamed())
    finally:
        await http.aclose()
    assert (status.runner, status.gpu, status.status) == ("Dispatch", "?", "unavailable")
    assert "cannot name the GPU: RuntimeError: no name" in status.error


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
async def test_a_callback_received_by_another_process_reaches_the_waiting_launcher(
    store: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Process A serves the callback route on an inbox (a SQLite file, or a Postgres
    database); this process's launcher waits on its own inbox on the same store. The fake
    API sends the signed callbacks, as the service does, before it answers the submission."""
    port_file, secret = tmp_path / "port", new_secret()
    inbox: SqliteInbox | PostgresInbox
    if store == "sqlite":
        db = str(tmp_path / "inbox.sqlite3")
        inbox = SqliteInbox(db, poll_interval=0.05)
    else:
        db = request.getfixturevalue("postgres_url")
        inbox = PostgresInbox(db)
    server = subprocess.Popen(  # noqa: ASYNC220 (returns at once; the test polls it)
        [
            sys.executable,
            str(Path(__file__).with_name("serve_callbacks.py")),
            db,
            str(port_file),
        ],
        env={**os.environ, "CALLBACK_SECRET": secret},
    )
    try:
        deadline = time.monotonic() + 20
        while not port_file.exists():
            assert server.poll() is None, "the callback process exited"
            assert time.monotonic() < deadline, "the callback process did not start"
            await asyncio.sleep(0.05)
        callback_url = f"http://127.0.0.1:{port_file.read_text()}/kernelbot-dispatch/callbacks"
        delivered: list[int] = []

        async def on_submit(run_id: str) -> None:
            async with httpx.AsyncClient() as client:
                for state in ("scheduled", "finished"):
                    body = json.dumps(callback_body(run_id, state)).encode()
                    headers = signed_headers(secret, body, webhook_id(run_id, state))
                    answer = await client.post(callback_url, content=body, headers=headers)
                    delivered.append(answer.status_code)

        fake = FakeApi(on_submit=on_submit)
        with ServerThread(fake) as api:
            result = await run(launcher(api, inbox, fallback_after=60))
        assert delivered == [204, 204]
        assert full_result_to_json(result) == FULL_RESULT
        assert fake.paths("GET") == []
    finally:
        server.terminate()
        server.wait(10)
        if isinstance(inbox, PostgresInbox):
            await inbox.aclose()
