"""Where callbacks wait for whoever waits on their run.

The callback route and the launcher waiting on a run need not be in the same process:
kernelbot may run several workers behind one URL, and a callback reaches whichever one the
load balancer picks. The callback route only ``put``s; the launcher only ``wait``s. Any
store reachable by both fits behind the :class:`Inbox` protocol:

* :class:`MemoryInbox`: one process (any number of threads and event loops);
* :class:`SqliteInbox`: several processes on one host sharing a file;
* :class:`~.postgres.PostgresInbox`: several hosts sharing a PostgreSQL database
  (``LISTEN/NOTIFY`` wakes the waiters; the ``postgres`` extra);
* any other store: implement the two methods on it.

Each inbox keeps only the newest state per run: a callback whose state is not above the
one held (a redelivery, or an earlier state arriving late) changes nothing. It keeps
events for runs nobody waits on yet, so a callback that beats the submission's answer
is waiting for the launcher when it starts to listen.

The inboxes here also remember which runs' results were handed to kernelbot
(:class:`RecoverableInbox`: ``take``), so that after a restart the launcher's ``recover``
can list the ended runs nobody took: those that ended while kernelbot was down.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import threading
import time
from collections import OrderedDict
from typing import Protocol, runtime_checkable

from .events import TERMINAL_RANK, CallbackEvent

#: How long a run's newest event is kept: longer than any job lives (the service ends an
#: open job after ``JOB_MAX_AGE_SECS``, 6 h by default) and than redelivery lasts (24 h).
DEFAULT_RETENTION = 24 * 3600.0


@runtime_checkable
class Inbox(Protocol):
    async def put(self, event: CallbackEvent) -> bool:
        """Records ``event``; False when it is a repeat or older than the run's newest."""
        ...

    async def wait(self, run_id: str, after_rank: int, timeout: float) -> CallbackEvent | None:
        """The run's newest event once its rank is above ``after_rank``; None on timeout."""
        ...


@runtime_checkable
class RecoverableInbox(Inbox, Protocol):
    """An inbox that also knows which runs' results kernelbot was given."""

    async def take(self, run_id: str) -> bool:
        """Records that the run's result was handed to kernelbot; True the first time."""
        ...

    async def untaken(self, min_age: float = 0.0) -> list[CallbackEvent]:
        """The ended runs' events nobody took, recorded at least ``min_age`` s ago, oldest
        first."""
        ...


def _advances(held: CallbackEvent | None, new: CallbackEvent) -> bool:
    return held is None or (new.id != held.id and new.rank > held.rank)


class MemoryInbox:
    """An inbox in this process's memory, safe across threads and event loops."""

    def __init__(self, *, max_runs: int = 10_000, retention: float = DEFAULT_RETENTION):
        self._max_runs = max_runs
        self._retention = retention
        self._lock = threading.Lock()
        # run id -> (received at, event), oldest first.
        self._events: OrderedDict[str, tuple[float, CallbackEvent]] = OrderedDict()
        # run id -> taken at, oldest first.
        self._taken: OrderedDict[str, float] = OrderedDict()
        self._waiters: dict[str, list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]] = {}

    async def put(self, event: CallbackEvent) -> bool:
        now = time.monotonic()
        with self._lock:
            held = self._events.get(event.run_id)
            if not _advances(held[1] if held else None, event):
                return False
            self._events[event.run_id] = (now, event)
            self._events.move_to_end(event.run_id)
            self._prune(now)
            waiters = self._waiters.pop(event.run_id, [])
        for loop, future in waiters:
            loop.call_soon_threadsafe(_wake, future)
        return True

    def _prune(self, now: float) -> None:
        while self._events:
            received, _ = next(iter(self._events.values()))
            if len(self._events) <= self._max_runs and now - received < self._retention:
                break
            self._events.popitem(last=False)
        while self._taken:
            taken = next(iter(self._taken.values()))
            if len(self._taken) <= self._max_runs and now - taken < self._retention:
                break
            self._taken.popitem(last=False)

    async def take(self, run_id: str) -> bool:
        now = time.monotonic()
        with self._lock:
            if run_id in self._taken:
                return False
            self._taken[run_id] = now
            self._prune(now)
            return True

    async def untaken(self, min_age: float = 0.0) -> list[CallbackEvent]:
        now = time.monotonic()
        with self._lock:
            return [
                event
                for received, event in self._events.values()
                if event.rank >= TERMINAL_RANK
                and event.run_id not in self._taken
                and now - received >= min_age
            ]

    async def wait(self, run_id: str, after_rank: int, timeout: float) -> CallbackEvent | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout, 0.0)
        while True:
            with self._lock:
                held = self._events.get(run_id)
                if held and held[1].rank > after_rank:
                    return held[1]
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return None
                future = loop.create_future()
                entry = (loop, future)
                self._waiters.setdefault(run_id, []).append(entry)
            try:
                await asyncio.wait({future}, timeout=remaining)
            finally:
                with self._lock:
                    waiting = self._waiters.get(run_id, [])
                    if entry in waiting:
                        waiting.remove(entry)
                        if not waiting:
                            del self._waiters[run_id]


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class SqliteInbox:
    """An inbox in a SQLite file, shared by the processes of one host.

    Every call opens its own connection in a worker thread (``asyncio.to_thread``), so any
    thread or process may use the same file; WAL lets readers poll while a writer writes.
    Waiting polls the file every ``poll_interval`` seconds. Not for network file systems.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        poll_interval: float = 0.25,
        retention: float = DEFAULT_RETENTION,
    ):
        self.path = os.fspath(path)
        self.poll_interval = poll_interval
        self.retention = retention
        # Results hold users' code output: the file is the owner's only.
        os.close(os.open(self.path, os.O_CREAT | os.O_RDWR, 0o600))
        with self._connect() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(
                "CREATE TABLE IF NOT EXISTS callback_events ("
                " run_id TEXT PRIMARY KEY, rank INTEGER NOT NULL, event_id TEXT NOT NULL,"
                " body TEXT NOT NULL, received_at REAL NOT NULL)"
            )
            db.execute(
                "CREATE INDEX IF NOT EXISTS callback_events_received"
                " ON callback_events (received_at)"
            )
            db.execute(
                "CREATE TABLE IF NOT EXISTS taken_runs ("
                " run_id TEXT PRIMARY KEY, taken_at REAL NOT NULL)"
            )
            db.execute(
                "CREATE INDEX IF NOT EXISTS taken_runs_taken ON taken_runs (taken_at)"
            )

    def _connect(self) -> _Connection:
        return _Connection(self.path)

    def _put(self, event: CallbackEvent) -> bool:
        now = time.time()
        with self._connect() as db:
            # One statement, so two processes recording the same run cannot interleave.
            changed = db.execute(
                "INSERT INTO callback_events (run_id, rank, event_id, body, received_at)"
                " VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT (run_id) DO UPDATE SET rank = excluded.rank,"
                " event_id = excluded.event_id, body = excluded.body,"
                " received_at = excluded.received_at"
                " WHERE excluded.rank > callback_events.rank"
                " AND excluded.event_id != callback_events.event_id",
                (event.run_id, event.rank, event.id, json.dumps(event.to_body()), now),
            ).rowcount
            db.execute("DELETE FROM callback_events WHERE received_at < ?", (now - self.retention,))
        return changed > 0

    def _get(self, run_id: str) -> CallbackEvent | None:
        with self._connect() as db:
            row = db.execute(
                "SELECT event_id, body FROM callback_events WHERE run_id = ?", (run_id,)
            ).fetchone()
        return None if row is None else CallbackEvent.from_body(row[0], json.loads(row[1]))

    def _take(self, run_id: str) -> bool:
        now = time.time()
        with self._connect() as db:
            taken = db.execute(
                "INSERT INTO taken_runs (run_id, taken_at) VALUES (?, ?)"
                " ON CONFLICT (run_id) DO NOTHING",
                (run_id, now),
            ).rowcount
            db.execute("DELETE FROM taken_runs WHERE taken_at < ?", (now - self.retention,))
        return taken > 0

    def _untaken(self, min_age: float) -> list[CallbackEvent]:
        with self._connect() as db:
            rows = db.execute(
                "SELECT event_id, body FROM callback_events e WHERE rank >= ?"
                " AND received_at <= ?"
                " AND NOT EXISTS (SELECT 1 FROM taken_runs t WHERE t.run_id = e.run_id)"
                " ORDER BY received_at",
                (TERMINAL_RANK, time.time() - min_age),
            ).fetchall()
        return [CallbackEvent.from_body(row[0], json.loads(row[1])) for row in rows]

    async def put(self, event: CallbackEvent) -> bool:
        return await asyncio.to_thread(self._put, event)

    async def take(self, run_id: str) -> bool:
        return await asyncio.to_thread(self._take, run_id)

    async def untaken(self, min_age: float = 0.0) -> list[CallbackEvent]:
        return await asyncio.to_thread(self._untaken, min_age)

    async def wait(self, run_id: str, after_rank: int, timeout: float) -> CallbackEvent | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout, 0.0)
        while True:
            event = await asyncio.to_thread(self._get, run_id)
            if event is not None and event.rank > after_rank:
                return event
            remaining = deadline - loop.time()
            if remaining <= 0:
                return None
            await asyncio.sleep(min(self.poll_interval, remaining))


class _Connection:
    """A short-lived connection that commits on success and always closes."""

    def __init__(self, path: str):
        self._db = sqlite3.connect(path, timeout=10.0)

    def __enter__(self) -> sqlite3.Connection:
        return self._db

    def __exit__(self, kind: object, *_: object) -> None:
        try:
            if kind is None:
                self._db.commit()
        finally:
            self._db.close()
