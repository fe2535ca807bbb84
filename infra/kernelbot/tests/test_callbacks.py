"""The callback route: Standard Webhooks verification, answers, and recording once."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import httpx
import pytest
from dispatch_helpers import callback_body, new_secret, signed_headers, webhook_id

from kernelbot_dispatch import CallbackApp, CallbackEvent, MemoryInbox, callback_app

PATH = "/kernelbot-dispatch/callbacks"


class CountingInbox(MemoryInbox):
    """Counts what the inbox really recorded (repeats and stale states are not)."""

    def __init__(self) -> None:
        super().__init__()
        self.recorded: list[CallbackEvent] = []

    async def put(self, event: CallbackEvent) -> bool:
        new = await super().put(event)
        if new:
            self.recorded.append(event)
        return new


def client(app: CallbackApp) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://kb")


def finished(run_id: str = "kb-1") -> tuple[bytes, str]:
    return json.dumps(callback_body(run_id, "finished")).encode(), webhook_id(run_id, "finished")


async def test_a_valid_signature_is_recorded_with_its_result() -> None:
    secret, inbox = new_secret(), CountingInbox()
    body, msg_id = finished()
    async with client(callback_app(secret, inbox)) as c:
        answer = await c.post(PATH, content=body, headers=signed_headers(secret, body, msg_id))
    assert answer.status_code == 204
    event = await inbox.wait("kb-1", 0, timeout=0)
    assert event is not None and event.id == msg_id and event.state == "finished"
    assert event.data["result"]["runs"]["test"]["run"]["passed"] is True


@pytest.mark.parametrize(
    "case", ["tampered body", "wrong secret", "stale timestamp", "missing headers", "garbage"]
)
async def test_what_the_service_did_not_sign_is_refused(case: str) -> None:
    secret, inbox = new_secret(), CountingInbox()
    body, msg_id = finished()
    headers = signed_headers(secret, body, msg_id)
    if case == "tampered body":
        body = body.replace(b'"passed": true', b'"passed": false')
        assert b'"passed": false' in body
    elif case == "wrong secret":
        headers = signed_headers(new_secret(), body, msg_id)
    elif case == "stale timestamp":
        headers = signed_headers(
            secret, body, msg_id, datetime.now(timezone.utc) - timedelta(minutes=10)
        )
    elif case == "missing headers":
        del headers["webhook-signature"]
    else:
        headers["webhook-signature"] = "v1 no-comma v2,???"
    async with client(callback_app(secret, inbox)) as c:
        answer = await c.post(PATH, content=body, headers=headers)
    assert (answer.status_code, answer.json()) == (401, {"error": "bad_signature"})
    assert secret.removeprefix("whsec_") not in answer.text
    assert inbox.recorded == []


async def test_any_of_several_secrets_verifies_while_rotating() -> None:
    old, new, inbox = new_secret(), new_secret(), CountingInbox()
    body, msg_id = finished()
    # The app holds both; the service signed with the second only.
    for secrets in (f"{old} {new}", [old, new]):
        inbox = CountingInbox()
        async with client(callback_app(secrets, inbox)) as c:
            answer = await c.post(PATH, content=body, headers=signed_headers(new, body, msg_id))
        assert answer.status_code == 204
        assert [e.id for e in inbox.recorded] == [msg_id]
    async with client(callback_app(old, CountingInbox())) as c:
        answer = await c.post(PATH, content=body, headers=signed_headers(new, body, msg_id))
    assert answer.status_code == 401


async def test_a_redelivered_webhook_id_is_recorded_once() -> None:
    secret, inbox = new_secret(), CountingInbox()
    body, msg_id = finished()
    async with client(callback_app(secret, inbox)) as c:
        answers = [
            await c.post(PATH, content=body, headers=signed_headers(secret, body, msg_id))
            for _ in range(3)
        ]
    assert [a.status_code for a in answers] == [204, 204, 204]
    assert [e.id for e in inbox.recorded] == [msg_id]


async def test_an_earlier_state_arriving_late_changes_nothing_and_unknown_runs_are_accepted() -> (
    None
):
    secret, inbox = new_secret(), CountingInbox()
    async with client(callback_app(secret, inbox)) as c:
        for state in ("finished", "running", "scheduled"):
            body = json.dumps(callback_body("kb-other-process", state)).encode()
            msg_id = webhook_id("kb-other-process", state)
            answer = await c.post(PATH, content=body, headers=signed_headers(secret, body, msg_id))
            assert answer.status_code == 204
    assert [e.state for e in inbox.recorded] == ["finished"]


async def test_only_post_with_a_bounded_json_job_body_is_taken() -> None:
    secret, inbox = new_secret(), CountingInbox()
    async with client(callback_app(secret, inbox)) as c:
        get = await c.get(PATH)
        assert (get.status_code, get.headers["allow"]) == (405, "POST")

        huge = b"x" * (8 * 1024 * 1024 + 1)
        too_large = await c.post(PATH, content=huge, headers=signed_headers(secret, b"{}"))
        assert too_large.status_code == 413

        not_json = b"not json"
        answer = await c.post(PATH, content=not_json, headers=signed_headers(secret, not_json))
        assert (answer.status_code, answer.json()["error"]) == (400, "invalid_json")

        no_run = json.dumps({"type": "job.finished", "data": {"state": "finished"}}).encode()
        answer = await c.post(PATH, content=no_run, headers=signed_headers(secret, no_run))
        assert (answer.status_code, answer.json()["error"]) == (400, "invalid_event")

        # A type this version does not know is accepted (so it is not redelivered), not kept.
        future = json.dumps({"type": "job.paused", "data": {"run_id": "kb-2"}}).encode()
        answer = await c.post(PATH, content=future, headers=signed_headers(secret, future))
        assert answer.status_code == 204
    assert inbox.recorded == []


async def test_a_failing_inbox_asks_for_redelivery() -> None:
    class BrokenInbox(MemoryInbox):
        async def put(self, event: CallbackEvent) -> bool:
            raise OSError("disk full")

    secret = new_secret()
    body, msg_id = finished()
    async with client(callback_app(secret, BrokenInbox())) as c:
        answer = await c.post(PATH, content=body, headers=signed_headers(secret, body, msg_id))
    assert answer.status_code == 503


def test_an_unusable_secret_is_refused_without_being_quoted() -> None:
    bad: str | list[str]
    for bad in ("", "   ", []):
        with pytest.raises(ValueError):
            callback_app(bad, MemoryInbox())
    with pytest.raises(ValueError) as refused:
        callback_app("whsec_", MemoryInbox())
    assert "whsec_" not in str(refused.value).replace("whsec_<base64>", "")
