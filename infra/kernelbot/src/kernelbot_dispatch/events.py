"""One callback from the service: a job entering a state, as the signed body carries it.

Body: ``{"type": "job.<state>", "timestamp", "data": {"run_id", "state", "gpu", "queue",
"build", "verdict", "build_state", "timings", "error", "result"}}``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, cast

#: A job only moves to a higher rank; ``finished`` and ``failed`` share the top one, so a
#: callback whose rank is not above the one already seen is stale or a repeat.
STATE_RANK: dict[str, int] = {
    "submitted": 0,
    "scheduled": 1,
    "running": 2,
    "finished": 3,
    "failed": 3,
}
TERMINAL_RANK = 3


class InvalidEvent(ValueError):
    """A verified body that is not a job callback we can read."""


class UnknownEvent(InvalidEvent):
    """A well-formed callback of a type this version does not know (accepted, ignored)."""


@dataclasses.dataclass(frozen=True)
class CallbackEvent:
    """A job's state change. ``id`` is the ``webhook-id``: one per run and state."""

    id: str
    type: str
    timestamp: str
    data: Mapping[str, Any]

    @classmethod
    def from_body(cls, webhook_id: str, body: Any) -> CallbackEvent:
        if not isinstance(body, Mapping) or not isinstance(body.get("data"), Mapping):
            raise InvalidEvent("expected an object with a `data` object")
        kind, data = body.get("type"), body["data"]
        if not isinstance(kind, str) or not kind.startswith("job."):
            raise UnknownEvent(f"unknown event type {str(kind)[:64]!r}")
        if not isinstance(data.get("run_id"), str) or not data["run_id"]:
            raise InvalidEvent("data.run_id must be a non-empty string")
        state = data.get("state", kind.removeprefix("job."))
        if state not in STATE_RANK:
            raise UnknownEvent(f"unknown state {str(state)[:64]!r}")
        timestamp = body.get("timestamp")
        return cls(
            id=webhook_id,
            type=kind,
            timestamp=timestamp if isinstance(timestamp, str) else "",
            data={**data, "state": state},
        )

    @property
    def run_id(self) -> str:
        return cast(str, self.data["run_id"])  # from_body checked it is a non-empty str

    @property
    def state(self) -> str:
        return cast(str, self.data["state"])  # from_body checked it is a key of STATE_RANK

    @property
    def rank(self) -> int:
        return STATE_RANK[self.state]

    @property
    def terminal(self) -> bool:
        return self.rank >= TERMINAL_RANK

    def to_body(self) -> dict[str, Any]:
        """The callback's body again (what the inboxes store)."""
        return {"type": self.type, "timestamp": self.timestamp, "data": dict(self.data)}
