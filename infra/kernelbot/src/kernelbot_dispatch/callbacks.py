"""The route the service's signed job callbacks arrive at, as a plain ASGI app.

It has no framework dependency, so kernelbot mounts it in its FastAPI app
(``app.mount("/kernelbot-dispatch/callbacks", callback_app(...))``) and tests serve it
with uvicorn alone. It verifies before it parses (Standard Webhooks), records the event in
the inbox and answers 204; the launcher waiting on the run reads it from there.

Answers: 204 recorded (also a repeat, a stale state, an unknown run id: it may belong to
another process or an earlier run; and an unknown event type), 400 not JSON or not a job
callback, 401 no valid signature, 405 not POST, 413 body too large, 503 the inbox failed
(the service retries).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from standardwebhooks import Webhook

from .events import CallbackEvent, InvalidEvent, UnknownEvent
from .inbox import Inbox

log = logging.getLogger(__name__)

#: A finished job's callback carries its whole result (logs capped at 16 KiB per run, at
#: most 32 runs): 8 MiB is well above any, and bounds what a caller can make us buffer.
MAX_BODY = 8 * 1024 * 1024

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class _TooLarge(Exception):
    pass


def _webhooks(secret: str | Iterable[str]) -> list[Webhook]:
    """One verifier per secret; a string may hold several, space-separated (rotation)."""
    secrets = secret.split() if isinstance(secret, str) else [s.strip() for s in secret]
    secrets = [s for s in secrets if s]
    if not secrets:
        raise ValueError("callback_app needs at least one signing secret")
    try:
        return [Webhook(s) for s in secrets]
    except Exception:
        # The secret itself is never part of the message.
        raise ValueError("a callback secret is not a valid whsec_<base64> key") from None


def _verified(webhooks: list[Webhook], body: bytes, headers: dict[str, str]) -> bool:
    for webhook in webhooks:
        try:
            webhook.verify(body, headers, json_parse=False)
            return True
        except Exception:  # bad signature, stale timestamp, malformed header, not UTF-8
            continue
    return False


async def _read_body(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ConnectionError("client went away")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _answer(
    send: Send, status: int, body: dict[str, str] | None = None, **headers: str
) -> None:
    payload = b"" if body is None else json.dumps(body).encode()
    raw = [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()]
    if body is not None:
        raw.append((b"content-type", b"application/json"))
    raw.append((b"content-length", str(len(payload)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": payload})


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


class CallbackApp:
    """The callback route as an ASGI app (an object, not a function, so Starlette's
    ``Route`` serves it as an app rather than calling it as an endpoint)."""

    def __init__(self, webhooks: list[Webhook], inbox: Inbox, max_body: int):
        self._webhooks = webhooks
        self._inbox = inbox
        self._max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            return await _lifespan(receive, send)
        if scope["type"] != "http":
            return
        if scope["method"] != "POST":
            return await _answer(send, 405, {"error": "method_not_allowed"}, allow="POST")
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            if int(headers.get("content-length", "0")) > self._max_body:
                raise _TooLarge
            body = await _read_body(receive, self._max_body)
        except _TooLarge:
            return await _answer(send, 413, {"error": "too_large"})
        except ValueError:
            return await _answer(send, 400, {"error": "bad_content_length"})
        except ConnectionError:
            return
        if not _verified(self._webhooks, body, headers):
            return await _answer(send, 401, {"error": "bad_signature"})
        try:
            parsed = json.loads(body)
        except ValueError:
            return await _answer(send, 400, {"error": "invalid_json"})
        webhook_id = headers["webhook-id"]
        try:
            event = CallbackEvent.from_body(webhook_id, parsed)
        except UnknownEvent as e:
            log.info("ignoring callback %s: %s", webhook_id[:80], e)
            return await _answer(send, 204)
        except InvalidEvent as e:
            return await _answer(send, 400, {"error": "invalid_event", "message": str(e)})
        try:
            recorded = await self._inbox.put(event)
        except Exception:
            log.exception("cannot record callback %s", webhook_id[:80])
            return await _answer(send, 503, {"error": "unavailable"})
        outcome = "recorded" if recorded else "a repeat or stale"
        log.debug("callback %s for %s: %s", event.type, event.run_id, outcome)
        return await _answer(send, 204)


def callback_app(
    secret: str | Iterable[str], inbox: Inbox, *, max_body: int = MAX_BODY
) -> CallbackApp:
    """The callback route: any of ``secret``'s keys may have signed a callback.

    ``secret`` is ``CALLBACK_SECRET`` as the service has it (``whsec_<base64>``, several
    space-separated while rotating) or a list of such keys. Serve it at an exact path with
    ``Route(path, app)``, or under a prefix with ``app.mount(prefix, app)`` (Starlette then
    answers the bare prefix with a redirect to ``prefix/``: give the service that URL).
    """
    return CallbackApp(_webhooks(secret), inbox, max_body)
