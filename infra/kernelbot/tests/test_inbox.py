"""Inboxes: newest state per run, repeats ignored, waiters woken across instances."""

from __future__ import annotations

import asyncio
import os
import stat
import threading

import pytest
from dispatch_helpers import callback_body, webhook_id

from kernelbot_dispatch import CallbackEvent, MemoryInbox, SqliteInbox


def event(run_id: str, state: str) -> CallbackEvent:
    return CallbackEvent.from_body(webhook_id(run_id, state), callback_body(run_id, state))


@pytest.fixture(params=["memory", "sqlite"])
def inbox(request, tmp_path):
    if request.param == "memory":
        return MemoryInbox()
    return SqliteInbox(tmp_path / "inbox.sqlite3", poll_interval=0.02)


async def test_keeps_the_newest_state_and_ignores_repeats_and_late_ones(inbox):
    assert await inbox.put(event("kb-1", "scheduled"))
    assert not await inbox.put(event("kb-1", "scheduled"))
    assert await inbox.put(event("kb-1", "finished"))
    assert not await inbox.put(event("kb-1", "running"))
    assert not await inbox.put(event("kb-1", "failed"))  # same rank as finished
    held = await inbox.wait("kb-1", 0, timeout=0)
    assert held.state == "finished" and held.data["result"]["success"] is True
    assert await inbox.wait("kb-1", 3, timeout=0.05) is None
    assert await inbox.wait("kb-unknown", 0, timeout=0.05) is None


async def test_a_waiter_wakes_when_a_newer_state_arrives(inbox):
    await inbox.put(event("kb-1", "scheduled"))
    waiter = asyncio.create_task(inbox.wait("kb-1", 1, timeout=5))
    await asyncio.sleep(0.05)
    assert not waiter.done()
    await inbox.put(event("kb-1", "running"))
    got = await asyncio.wait_for(waiter, 2)
    assert got.state == "running"


async def test_ended_runs_nobody_took_are_listed_until_taken(inbox):
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


async def test_memory_inbox_wakes_a_waiter_on_another_threads_loop():
    inbox = MemoryInbox()
    waiter = asyncio.create_task(inbox.wait("kb-1", 0, timeout=5))
    await asyncio.sleep(0.02)
    thread = threading.Thread(target=asyncio.run, args=(inbox.put(event("kb-1", "running")),))
    thread.start()
    got = await asyncio.wait_for(waiter, 2)
    thread.join()
    assert got.state == "running"


async def test_two_sqlite_instances_share_one_file(tmp_path):
    path = tmp_path / "shared.sqlite3"
    writer, reader = SqliteInbox(path), SqliteInbox(path, poll_interval=0.02)
    waiter = asyncio.create_task(reader.wait("kb-1", 0, timeout=5))
    await asyncio.sleep(0.05)
    await writer.put(event("kb-1", "finished"))
    got = await asyncio.wait_for(waiter, 2)
    assert got.id == webhook_id("kb-1", "finished")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


async def test_old_runs_are_pruned(tmp_path):
    sqlite = SqliteInbox(tmp_path / "prune.sqlite3", retention=0.05)
    memory = MemoryInbox(retention=0.05)
    for inbox in (sqlite, memory):
        await inbox.put(event("kb-old", "finished"))
        await inbox.take("kb-taken-old")
        await asyncio.sleep(0.1)
        await inbox.put(event("kb-new", "running"))
        await inbox.take("kb-taken-new")
        assert await inbox.wait("kb-old", 0, timeout=0) is None
        assert await inbox.wait("kb-new", 0, timeout=0) is not None
        assert await inbox.untaken() == []
        assert await inbox.take("kb-taken-old")  # forgotten: taken again
        assert not await inbox.take("kb-taken-new")
    capped = MemoryInbox(max_runs=2)
    for n in range(3):
        await capped.put(event(f"kb-{n}", "running"))
    assert await capped.wait("kb-0", 0, timeout=0) is None
    assert await capped.wait("kb-2", 0, timeout=0) is not None
