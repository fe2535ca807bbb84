"""An inbox in PostgreSQL, for kernelbot processes on several hosts (kernelbot already
runs on Postgres).

Two tables, ``<prefix>_events`` (each run's newest callback) and ``<prefix>_taken`` (the
runs whose result kernelbot was given), created on first use. A ``put`` that records a
newer state sends ``NOTIFY <prefix>_callbacks, '<run id>'`` in the same transaction, so
it is heard once committed. Each event loop that waits keeps one connection that
``LISTEN``s and wakes the waiters of the run named; a waiter also looks again every
``recheck_interval`` seconds, and every waiter looks again whenever that connection is
made anew, so a notification lost while it was down costs at most a look. Every other
call opens a short-lived connection of its own: any thread, loop or process may share
one inbox.

Needs psycopg 3: ``pip install "kernelbot-dispatch-launcher[postgres]"``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import weakref
from typing import Any

try:
    import psycopg
    from psycopg import sql
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError(
        "PostgresInbox needs psycopg 3: pip install 'kernelbot-dispatch-launcher[postgres]'"
    ) from e

from .events import TERMINAL_RANK, CallbackEvent
from .inbox import DEFAULT_RETENTION

log = logging.getLogger(__name__)

#: Names made from the prefix stay plain identifiers, well under Postgres' 63 bytes.
_PREFIX = re.compile(r"[a-z_][a-z0-9_]{0,40}")


class PostgresInbox:
    """An inbox in a PostgreSQL database that every kernelbot process can reach.

    ``conninfo`` is a libpq connection string or URL (``postgresql://user@host/db``); set
    a schema with its ``options=-csearch_path=...``. ``prefix`` names the tables and the
    notification channel (several deployments may share a database with different ones).
    """

    def __init__(
        self,
        conninfo: str,
        *,
        prefix: str = "kernelbot_dispatch",
        retention: float = DEFAULT_RETENTION,
        recheck_interval: float = 30.0,
        connect_timeout: float = 10.0,
    ):
        if not _PREFIX.fullmatch(prefix):
            raise ValueError("prefix must be 1 to 41 of a-z, 0-9 and _, not starting with a digit")
        self.conninfo = conninfo
        self.prefix = prefix
        self.channel = f"{prefix}_callbacks"
        self.retention = retention
        self.recheck_interval = recheck_interval
        self.connect_timeout = connect_timeout
        self._names = {
            "events": sql.Identifier(f"{prefix}_events"),
            "events_received": sql.Identifier(f"{prefix}_events_received"),
            "taken": sql.Identifier(f"{prefix}_taken"),
            "taken_at": sql.Identifier(f"{prefix}_taken_at"),
        }
        self._schema_ready = False
        self._listeners: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Listener] = (
            weakref.WeakKeyDictionary()
        )

    def __repr__(self) -> str:  # never the connection string: it may hold a password
        return f"PostgresInbox(prefix={self.prefix!r})"

    # -- connections and schema ----------------------------------------------------------

    def _sql(self, text: str) -> sql.Composed:
        return sql.SQL(text).format(**self._names)

    async def _connect(self, **options: Any) -> psycopg.AsyncConnection:
        conn = await psycopg.AsyncConnection.connect(
            self.conninfo, connect_timeout=max(1, round(self.connect_timeout)), **options
        )
        if not self._schema_ready:
            try:
                await self._create_schema(conn)
            except BaseException:
                await conn.close()
                raise
        return conn

    async def _create_schema(self, conn: psycopg.AsyncConnection) -> None:
        # One creator at a time: concurrent CREATE ... IF NOT EXISTS may still collide.
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (self.prefix,))
            await conn.execute(
                self._sql(
                    "CREATE TABLE IF NOT EXISTS {events} ("
                    " run_id text PRIMARY KEY, rank integer NOT NULL, event_id text NOT NULL,"
                    " body text NOT NULL, received_at timestamptz NOT NULL)"
                )
            )
            await conn.execute(
                self._sql("CREATE INDEX IF NOT EXISTS {events_received} ON {events} (received_at)")
            )
            await conn.execute(
                self._sql(
                    "CREATE TABLE IF NOT EXISTS {taken} ("
                    " run_id text PRIMARY KEY, taken_at timestamptz NOT NULL)"
                )
            )
            await conn.execute(
                self._sql("CREATE INDEX IF NOT EXISTS {taken_at} ON {taken} (taken_at)")
            )
        self._schema_ready = True

    # -- the Inbox protocol ----------------------------------------------------------------

    async def put(self, event: CallbackEvent) -> bool:
        async with await self._connect() as conn:
            # One statement, so two processes recording the same run cannot interleave.
            cursor = await conn.execute(
                self._sql(
                    "INSERT INTO {events} (run_id, rank, event_id, body, received_at)"
                    " VALUES (%s, %s, %s, %s, now())"
                    " ON CONFLICT (run_id) DO UPDATE SET rank = excluded.rank,"
                    " event_id = excluded.event_id, body = excluded.body,"
                    " received_at = excluded.received_at"
                    " WHERE excluded.rank > {events}.rank"
                    " AND excluded.event_id <> {events}.event_id"
                ),
                (event.run_id, event.rank, event.id, json.dumps(event.to_body())),
            )
            changed = cursor.rowcount > 0
            if changed:  # heard by the listeners once this transaction commits
                await conn.execute("SELECT pg_notify(%s, %s)", (self.channel, event.run_id))
            await conn.execute(
                self._sql(
                    "DELETE FROM {events} WHERE received_at < now() - %s::float8 * interval '1 s'"
                ),
                (self.retention,),
            )
        return changed

    async def _get(self, run_id: str) -> CallbackEvent | None:
        async with await self._connect() as conn:
            cursor = await conn.execute(
                self._sql("SELECT event_id, body FROM {events} WHERE run_id = %s"), (run_id,)
            )
            row = await cursor.fetchone()
        return None if row is None else CallbackEvent.from_body(row[0], json.loads(row[1]))

    async def wait(self, run_id: str, after_rank: int, timeout: float) -> CallbackEvent | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout, 0.0)
        if timeout <= 0:
            event = await self._get(run_id)
            return event if event is not None and event.rank > after_rank else None
        listener = self._listener(loop)
        woken = listener.subscribe(run_id)
        try:
            while True:
                woken.clear()  # before looking: a notification from now on is not missed
                event = await self._get(run_id)
                if event is not None and event.rank > after_rank:
                    return event
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return None
                # While the listener is down, look more often than when it hears for us.
                interval = self.recheck_interval if listener.listening else 1.0
                try:
                    await asyncio.wait_for(woken.wait(), min(remaining, interval))
                except asyncio.TimeoutError:
                    pass
        finally:
            listener.unsubscribe(run_id, woken)

    # -- what recover() needs ----------------------------------------------------------------

    async def take(self, run_id: str) -> bool:
        async with await self._connect() as conn:
            cursor = await conn.execute(
                self._sql(
                    "INSERT INTO {taken} (run_id, taken_at) VALUES (%s, now())"
                    " ON CONFLICT (run_id) DO NOTHING"
                ),
                (run_id,),
            )
            taken = cursor.rowcount > 0
            await conn.execute(
                self._sql(
                    "DELETE FROM {taken} WHERE taken_at < now() - %s::float8 * interval '1 s'"
                ),
                (self.retention,),
            )
        return taken

    async def untaken(self, min_age: float = 0.0) -> list[CallbackEvent]:
        async with await self._connect() as conn:
            cursor = await conn.execute(
                self._sql(
                    "SELECT event_id, body FROM {events} e WHERE rank >= %s"
                    " AND received_at <= now() - %s::float8 * interval '1 s'"
                    " AND NOT EXISTS (SELECT 1 FROM {taken} t WHERE t.run_id = e.run_id)"
                    " ORDER BY received_at, run_id"
                ),
                (TERMINAL_RANK, min_age),
            )
            rows = await cursor.fetchall()
        return [CallbackEvent.from_body(row[0], json.loads(row[1])) for row in rows]

    # -- listening ---------------------------------------------------------------------------

    def _listener(self, loop: asyncio.AbstractEventLoop) -> _Listener:
        listener = self._listeners.get(loop)
        if listener is None or listener.stopped:
            listener = self._listeners[loop] = _Listener(self)
        return listener

    async def aclose(self) -> None:
        """Stops this loop's listener (and asks other running loops to stop theirs)."""
        current = asyncio.get_running_loop()
        for loop, listener in list(self._listeners.items()):
            if loop is current:
                await listener.stop()
            elif loop.is_running():
                loop.call_soon_threadsafe(listener.cancel)
        self._listeners.clear()


class _Listener:
    """One ``LISTEN`` connection of an event loop, waking the waiters of the run a
    notification names; made anew (and every waiter woken) when it breaks."""

    def __init__(self, inbox: PostgresInbox):
        self._inbox = inbox
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self.listening = False
        self._task = asyncio.get_running_loop().create_task(self._run())

    @property
    def stopped(self) -> bool:
        return self._task.done()

    def subscribe(self, run_id: str) -> asyncio.Event:
        woken = asyncio.Event()
        self._waiters.setdefault(run_id, set()).add(woken)
        return woken

    def unsubscribe(self, run_id: str, woken: asyncio.Event) -> None:
        waiting = self._waiters.get(run_id)
        if waiting is not None:
            waiting.discard(woken)
            if not waiting:
                del self._waiters[run_id]

    def _wake(self, run_id: str) -> None:
        for woken in self._waiters.get(run_id, ()):
            woken.set()

    def _wake_all(self) -> None:
        for waiting in self._waiters.values():
            for woken in waiting:
                woken.set()

    async def _run(self) -> None:
        inbox, pause = self._inbox, 0.5
        while True:
            try:
                async with await inbox._connect(autocommit=True) as conn:
                    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(inbox.channel)))
                    self.listening, pause = True, 0.5
                    self._wake_all()  # what came while nobody listened: look again
                    async for notification in conn.notifies():
                        self._wake(notification.payload)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("listening for callbacks: %s; again in %.1f s", e, pause)
            finally:
                self.listening = False
            await asyncio.sleep(pause)
            pause = min(pause * 2, 10.0)

    def cancel(self) -> None:
        self._task.cancel()

    async def stop(self) -> None:
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
