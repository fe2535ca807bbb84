"""Shared test helpers: signing callbacks as the service does, serving ASGI apps on loopback
in a thread, a scripted fake of the submit API, and a status reporter that records."""

from __future__ import annotations

import base64
import copy
import json
import os
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import uvicorn
from standardwebhooks import Webhook


def new_secret() -> str:
    return "whsec_" + base64.b64encode(os.urandom(24)).decode()


def signed_headers(
    secret: str, body: bytes, msg_id: str = "msg_test", when: datetime | None = None
) -> dict[str, str]:
    """The headers the service sends with ``body`` (Standard Webhooks, one key)."""
    when = when or datetime.now(timezone.utc)
    return {
        "content-type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(when.timestamp())),
        "webhook-signature": Webhook(secret).sign(msg_id, when, body.decode()),
    }


# A result as the service's runner writes it for a `test` run that passed (leaderboard
# fields included), with a key kernelbot does not know.
FULL_RESULT: dict[str, Any] = {
    "success": True,
    "error": "",
    "system": {
        "gpu": "NVIDIA H100 80GB HBM3",
        "device_count": 1,
        "cpu": "AMD EPYC 9654 96-Core Processor",
        "runtime": "CUDA",
        "platform": "Linux-6.8.0-x86_64-with-glibc2.39",
        "torch": "2.7.0+cu128",
        "hostname": "gpu-node-3",
    },
    "runs": {
        "test": {
            "start": "2026-07-16T10:00:01.123456",
            "end": "2026-07-16T10:00:03.654321",
            "compilation": None,
            "run": {
                "success": True,
                "passed": True,
                "command": "python3 eval.py test /tmp/cases.txt",
                "stdout": "",
                "stderr": "",
                "exit_code": 0,
                "duration": 2.53,
                "result": {
                    "test-count": "2",
                    "test.0.spec": "size: 1024; seed: 1",
                    "test.0.status": "pass",
                    "test.1.spec": "size: 4096; seed: 2",
                    "test.1.status": "pass",
                    "check": "pass",
                },
            },
            "profile": None,
        },
        "leaderboard": {
            "start": "2026-07-16T10:00:03.700000",
            "end": "2026-07-16T10:00:09.000001",
            "compilation": {
                "nvcc_found": True,
                "nvcc_version": "Cuda compilation tools, release 12.8",
                "success": True,
                "command": "nvcc -O3 eval.cu -o eval.out",
                "stdout": "",
                "stderr": "",
                "exit_code": 0,
            },
            "run": {
                "success": True,
                "passed": True,
                "command": "./eval.out leaderboard /tmp/cases.txt",
                "stdout": "",
                "stderr": "",
                "exit_code": 0,
                "duration": 5.3,
                "result": {"benchmark-count": "1", "benchmark.0.mean": "1940000.0"},
            },
            "profile": {"profiler": "rocPROF", "trace": "", "download_url": None},
        },
    },
}


def callback_body(run_id: str, state: str, **data: Any) -> dict[str, Any]:
    """A callback body as the service renders it for ``state``."""
    body: dict[str, Any] = {
        "type": f"job.{state}",
        "timestamp": "2026-07-16T10:00:00.000Z",
        "data": {
            "run_id": run_id,
            "state": state,
            "gpu": "H100_BK",
            "queue": "h100",
            "build": {
                "id": "0190-build",
                "number": 7,
                "web_url": "https://buildkite.com/org/kernelbot/builds/7",
            },
            "verdict": None,
            "build_state": None,
            "timings": {"queued_secs": None, "ran_secs": None},
            "error": None,
            "result": None,
        },
    }
    if state == "finished":
        body["data"].update(
            verdict="passed",
            build_state="passed",
            timings={"queued_secs": 1.5, "ran_secs": 8.0},
            result=copy.deepcopy(FULL_RESULT),
        )
    body["data"].update(data)
    return body


def webhook_id(run_id: str, state: str) -> str:
    return f"msg_{state}_{run_id}"


class ServerThread:
    """Serves an ASGI app with uvicorn on a loopback port this object bound, in a thread."""

    def __init__(self, app: Any):
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    def __enter__(self) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *_: object) -> None:
        self.server.should_exit = True
        self._thread.join(10)
        self._sock.close()


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    json: Any


@dataclass
class FakeApi:
    """The submit API, scripted. ``submit_answers`` are given in order (then 202s);
    ``on_submit`` runs (in the server's loop) before a 202 is answered."""

    submit_answers: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    views: dict[str, dict[str, Any]] = field(default_factory=dict)
    queue_answer: tuple[int, dict[str, Any]] = (404, {"error": "not_found", "message": "no"})
    on_submit: Callable[[str], Awaitable[None]] | None = None
    #: Statuses the cancel endpoint answers first, in order (then 202).
    cancel_answers: list[int] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)

    def paths(self, method: str) -> list[str]:
        return [r.path for r in self.requests if r.method == method]

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        body = json.loads(raw) if raw else None
        method, path = scope["method"], scope["path"]
        self.requests.append(Request(method, path, headers, body))
        status, answer = await self._route(method, path, body)
        payload = json.dumps(answer).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": payload})

    async def _route(self, method: str, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        parts = path.strip("/").split("/")
        if method == "POST" and parts == ["submissions"]:
            status, answer = self.submit_answers.pop(0) if self.submit_answers else (202, {})
            if status in (200, 202):
                if self.on_submit is not None:
                    await self.on_submit(body["run_id"])
                answer = {
                    "run_id": body["run_id"],
                    "state": "scheduled",
                    "build": callback_body(body["run_id"], "scheduled")["data"]["build"],
                    **answer,
                }
            return status, answer
        if method == "GET" and len(parts) == 2 and parts[0] == "submissions":
            view = self.views.get(parts[1])
            return (200, view) if view else (404, {"error": "not_found", "message": "none"})
        if method == "POST" and len(parts) == 3 and parts[2] == "cancel":
            if self.cancel_answers:
                return self.cancel_answers.pop(0), {"error": "not_found", "message": "none"}
            return 202, {"run_id": parts[1], "state": "scheduled"}
        if method == "GET" and parts[0] == "queues":
            return self.queue_answer
        return 404, {"error": "not_found", "message": path}


def job_view(run_id: str, state: str, result: dict[str, Any] | None = None) -> dict[str, Any]:
    """``GET /submissions/{run_id}`` as the service answers it."""
    finished = state == "finished"
    return {
        "run_id": run_id,
        "state": state,
        "gpu": "H100_BK",
        "queue": "h100",
        "title": None,
        "build": callback_body(run_id, state)["data"]["build"],
        "failure": None,
        "created_at": "2026-07-16T10:00:00.000Z",
        "updated_at": "2026-07-16T10:00:09.000Z",
        "verdict": "passed" if finished else None,
        "result": {
            "build_state": "passed",
            "verdict": "passed",
            "error": None,
            "result": result,
            "timings": {"queued_secs": 1.5, "ran_secs": 8.0},
        }
        if finished
        else None,
        "delivery": {"discord": None},
    }


class RecordingStatus:
    """kernelbot's ``RunProgressReporter`` interface, keeping every line ever shown."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.shown: list[str] = []

    async def push(self, content: str | list[str]) -> None:
        for line in [content] if isinstance(content, str) else content:
            self.lines.append(line)
            self.shown.append(line)

    async def update(self, new_content: str) -> None:
        self.lines[-1] = new_content
        self.shown.append(new_content)

    async def update_title(self, new_title: str) -> None:
        self.title = new_title
