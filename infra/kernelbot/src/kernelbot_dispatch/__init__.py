"""kernelbot's side of kernelbot-dispatch: a launcher that submits to the service and a
callback route that receives its signed job callbacks, joined by an inbox."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .callbacks import CallbackApp, callback_app
from .events import CallbackEvent
from .gpus import GPU_TO_SM, DispatchGPU, register_gpus
from .inbox import DEFAULT_RETENTION, Inbox, MemoryInbox, RecoverableInbox, SqliteInbox
from .launcher import DispatchError, DispatchLauncher, gpu_name
from .queue_status import RunnerQueueStatus
from .results import FullResult, full_result_from_json, full_result_to_json

if TYPE_CHECKING:
    from .postgres import PostgresInbox as PostgresInbox


def __getattr__(name: str) -> type[PostgresInbox]:
    # PostgresInbox needs psycopg (the `postgres` extra): imported only when asked for,
    # and left out of __all__ so that `import *` works without it.
    if name == "PostgresInbox":
        from .postgres import PostgresInbox

        return PostgresInbox
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEFAULT_RETENTION",
    "GPU_TO_SM",
    "CallbackApp",
    "CallbackEvent",
    "DispatchError",
    "DispatchGPU",
    "DispatchLauncher",
    "FullResult",
    "Inbox",
    "MemoryInbox",
    "RecoverableInbox",
    "RunnerQueueStatus",
    "SqliteInbox",
    "callback_app",
    "full_result_from_json",
    "full_result_to_json",
    "gpu_name",
    "register_gpus",
]
