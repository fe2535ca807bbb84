"""Inboxes: newest state per run, repeats ignored, waiters woken across instances."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest
from dispatch_helpers import callback_body, webhook_id

from kernelbot_dispatch import CallbackEvent, MemoryInbox, RecoverableInbox, SqliteInbox
from kernelbot_dispatch.postgres import PostgresInbox


def event(run_id: str, state: str) -> CallbackEvent:
    return CallbackEvent.from_body(webhook_id(run_id, state), callback_body(run_id, state))


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def inbox(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[RecoverableInbox]:
    if request.param == "memory":
        yield MemoryInbox()
    elif request.param == "sqlite":
        yield SqliteInbox(tmp_path / "inbox.sqlite3", poll_interval=0.02)
    else:
        # Rechecks far apart: a waiter woken in time was woken by NOTIFY.
        inbox = PostgresInbox(request.getfixturevalue("postgres_url"), recheck_interval=30)
        yield inbox
        await inbox.aclose()


async def test_keeps_the_newest_state_and_ignores_repeats_and_late_ones(
    inbox: RecoverableInbox,
) -> None:
    assert await inbox.put(event("kb-1", "scheduled"))
    assert not await inbox.put(event("kb-1", "scheduled"))
    assert await inbox.put(event("kb-1", "finished"))
    assert not await inbox.put(event("kb-1", "running"))
    assert not await inbox.put(event("kb-1", "failed"))  # same rank as finished
    held = await inbox.wait("kb-1", 0, timeout=0)
    assert held is not None
    assert held.state == "finished" and held.data["result"]["success"] is True
    assert await inbox.wait("kb-1", 3, timeout=0.05) is None
    assert await inbox.wait("kb-unknown", 0, timeout=0.05) is None


async def test_a_waiter_wakes_when_a_newer_state_arrives(inbox: RecoverableInbox) -> None:
    await inbox.put(event("kb-1", "scheduled"))
    waiter = asyncio.create_task(inbox.wait("kb-1", 1, timeout=5))
    await asyncio.sleep(0.05)
    assert not waiter.done()
    await inbox.put(event("kb-1", "running"))
    got = await asyncio.wait_for(waiter, 2)
    assert got is not None and got.state == "running"


async def test_ended_runs_nobody_took_are_listed_until_taken(inbox: RecoverableInbox) -> None:
    await inbox.put(event("kb-open", "running"))
    await inbox.put(event("kb-done", "finished"))
    await inbox.put(event("kb-failed", "failed"))
    listed = await inbox.untaken()
    assert [(e.run_id, e.state) for e in listed] == [
        ("kb-done", "finished"),
        ("kb-failed", "failed"),
    ]
    assert listed[0].data["result"]["success"] is True
    assert await inbox.untaken(min_age=60) == []  # not yet settled
    assert await inbox.take("kb-done")
    assert not await inbox.take("kb-done")  # once only
    assert [e.run_id for e in await inbox.untaken()] == ["kb-failed"]
    # A run taken before its callback came (its result was polled) is not listed either.
    assert await inbox.take("kb-polled")
    await inbox.put(event("kb-polled", "finished"))
    assert [e.run_id for e in await inbox.untaken()] == ["kb-failed"]


async def test_memory_inbox_wakes_a_waiter_on_another_threads_loop() -> None:
    inbox = MemoryInbox()
    waiter = asyncio.create_task(inbox.wait("kb-1", 0, timeout=5))
    await asyncio.sleep(0.02)
    thread = threading.Thread(target=asyncio.run, args=(inbox.put(event("kb-1", "running")),))
    thread.start()
    got = await asyncio.wait_for(waiter, 2)
    thread.join()
    assert got is not None and got.state == "running"


async def test_two_sqlite_instances_share_one_file(tmp_path: Path) -> None:
    path = tmp_path / "shared.sqlite3"
    writer, reader = SqliteInbox(path), SqliteInbox(path, poll_interval=0.02)
    waiter = asyncio.create_task(reader.wait("kb-1", 0, timeout=5))
    await asyncio.sleep(0.05)
    await writer.put(event("kb-1", "finished"))
    got = await asyncio.wait_for(waiter, 2)
    assert got is not None and got.id == webhook_id("kb-1", "finished")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


async def test_old_runs_are_pruned(tmp_path: Path, postgres_url: str) -> None:
    sqlite = SqliteInbox(tmp_path / "prune.sqlite3", retention=0.3)
    memory = MemoryInbox(retention=0.3)
    postgres = PostgresInbox(postgres_url, retention=0.3)
    for inbox in (sqlite, memory, postgres):
        await inbox.put(event("kb-old", "finished"))
        await inbox.take("kb-taken-old")
        await asyncio.sleep(0.4)
        # Recording prunes what is older than the retention.
        await inbox.put(event("kb-new", "running"))
        await inbox.take("kb-taken-new")
        assert await inbox.wait("kb-new", 0, timeout=0) is not None
        assert not await inbox.take("kb-taken-new")
        assert await inbox.wait("kb-old", 0, timeout=0) is None
        assert await inbox.untaken() == []
        assert await inbox.take("kb-taken-old")  # forgotten: taken again
    capped = MemoryInbox(max_runs=2)
    for n in range(3):
        await capped.put(event(f"kb-{n}", "running"))
    assert await capped.wait("kb-0", 0, timeout=0) is None
    assert await capped.wait("kb-2", 0, timeout=0) is not None


async def test_postgres_inboxes_in_other_processes_hear_a_callback_as_it_arrives(
    postgres_url: str,
) -> None:
    """Two kernelbot workers (two inboxes, each with its own LISTEN connection) wait on one
    run; the callback route records it in another process. Both wake as it is recorded,
    long before their next look at the table (60 s)."""
    workers = [PostgresInbox(postgres_url, recheck_interval=60) for _ in range(2)]
    try:
        await workers[0].put(event("kb-1", "scheduled"))
        waiters = [asyncio.create_task(w.wait("kb-1", 1, timeout=50)) for w in workers]
        await _listening(workers)
        await asyncio.to_thread(_put_from_another_process, postgres_url, "kb-1", "finished")
        got = await asyncio.wait_for(asyncio.gather(*waiters), 20)
        assert [e.state if e else None for e in got] == ["finished", "finished"]
    finally:
        for w in workers:
            await w.aclose()


async def test_a_postgres_waiter_hears_again_once_its_connection_is_back(postgres_url: str) -> None:
    listening = PostgresInbox(postgres_url, recheck_interval=60)
    writer = PostgresInbox(postgres_url)
    try:
        waiter = asyncio.create_task(listening.wait("kb-1", 0, timeout=50))
        await _listening([listening])
        before = await _listeners(postgres_url)
        # The server drops the LISTEN connection (a restart, a failover, a network cut).
        async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as admin:
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) pid", (before,)
            )
        await writer.put(event("kb-1", "running"))
        got = await asyncio.wait_for(waiter, 10)
        assert got is not None and got.state == "running"
        # It listens again on a new connection, and a callback wakes its waiters at once.
        for _ in range(500):
            after = await _listeners(postgres_url)
            if after and not set(after) & set(before):
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError("the listener did not come back")
        await _listening([listening])
        waiter = asyncio.create_task(listening.wait("kb-2", 0, timeout=50))
        await asyncio.sleep(0.1)
        await writer.put(event("kb-2", "running"))
        # Heard, not looked up: the next look would be 60 s away.
        got = await asyncio.wait_for(waiter, 20)
        assert got is not None and got.state == "running"
    finally:
        await listening.aclose()


async def _listeners(url: str) -> list[int]:
    """The server processes of the connections that LISTEN."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as admin:
        cursor = await admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE query LIKE 'LISTEN %%'"
            " AND pid <> pg_backend_pid()",
            (),
        )
        return [row[0] for row in await cursor.fetchall()]


async def test_postgres_inbox_names_are_checked_and_its_url_is_not_shown(postgres_url: str) -> None:
    with pytest.raises(ValueError):
        PostgresInbox(postgres_url, prefix="kb; DROP TABLE x")
    assert "127.0.0.1" not in repr(PostgresInbox("postgresql://u:secret@127.0.0.1/db"))
    # Two prefixes in one database are two inboxes.
    one, two = PostgresInbox(postgres_url), PostgresInbox(postgres_url, prefix="other")
    await one.put(event("kb-1", "finished"))
    assert await two.wait("kb-1", 0, timeout=0) is None
    got = await one.wait("kb-1", 0, timeout=0)
    assert got is not None and got.state == "finished"


async def _listening(inboxes: list[PostgresInbox]) -> None:
    """Until each inbox's listener in this loop has its LISTEN in place."""
    loop = asyncio.get_running_loop()
    for _ in range(500):
        if all(i._listeners.get(loop) and i._listeners[loop].listening for i in inboxes):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the listeners did not start listening")


def _put_from_another_process(url: str, run_id: str, state: str) -> None:
    body = json.dumps(callback_body(run_id, state))
    script = (
        "import asyncio, json, sys\n"
        "from kernelbot_dispatch import CallbackEvent\n"
        "from kernelbot_dispatch.postgres import PostgresInbox\n"
        "event = CallbackEvent.from_body(sys.argv[2], json.loads(sys.argv[3]))\n"
        "assert asyncio.run(PostgresInbox(sys.argv[1]).put(event))\n"
    )
    subprocess.run(
        [sys.executable, "-c", script, url, webhook_id(run_id, state), body],
        check=True,
        timeout=30,
    )
