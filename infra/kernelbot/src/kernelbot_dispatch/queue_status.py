"""A queue's status as kernelbot main reports it (``RunnerQueueStatus``), from the service's
``GET /queues/{gpu}`` answer."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

try:
    from libkernelbot.launchers.launcher import RunnerQueueStatus
except ImportError:  # not running inside kernelbot (or one from before it had this type)

    @dataclass
    class RunnerQueueStatus:  # type: ignore[no-redef]
        """kernelbot's ``libkernelbot.launchers.launcher.RunnerQueueStatus``, field for field."""

        runner: str
        gpu: str
        queued_jobs: int | None
        running_jobs: int | None = None
        available_runners: int | None = None
        status: str = "available"
        error: str | None = None

        def to_dict(self) -> dict[str, Any]:
            return asdict(self)


__all__ = ["RunnerQueueStatus", "available", "unavailable"]


def _count(value: Any) -> int | None:
    """A count the service gave, or None for anything that is not one."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _object(value: Any) -> dict[str, Any]:
    """A JSON object the service gave, or ``{}`` for anything that is not one."""
    return value if isinstance(value, dict) else {}


def available(runner: str, gpu: str, body: dict[str, Any]) -> RunnerQueueStatus:
    """The status from a 200 answer: jobs waiting and running, and idle connected agents."""
    jobs, agents = _object(body.get("jobs")), _object(body.get("agents"))
    return RunnerQueueStatus(
        runner=runner,
        gpu=gpu,
        queued_jobs=_count(jobs.get("queued")),
        running_jobs=_count(jobs.get("running")),
        available_runners=_count(agents.get("idle")),
        status="available",
        error=None,
    )


def unavailable(runner: str, gpu: str, error: str) -> RunnerQueueStatus:
    """The status when the service cannot say: never an exception, always a readable reason."""
    return RunnerQueueStatus(
        runner=runner,
        gpu=gpu,
        queued_jobs=None,
        status="unavailable",
        error=error,
    )
