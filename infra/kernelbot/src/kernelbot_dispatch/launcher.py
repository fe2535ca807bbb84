"""A kernelbot launcher that runs submissions through kernelbot-dispatch.

Instead of polling Buildkite until a build ends (kernelbot's Buildkite launcher), it submits
to the service's API and waits for the service's signed callbacks, which the callback route
(see :mod:`.callbacks`) puts in a shared :class:`~.inbox.Inbox`. Only when no callback came
for ``fallback_after`` seconds does it poll the service, slowly; a callback still wins.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
import random
import re
import time
import uuid
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

import httpx

from . import queue_status
from .events import STATE_RANK, TERMINAL_RANK, CallbackEvent
from .gpus import RUNNER, DispatchGPU
from .inbox import Inbox, RecoverableInbox
from .queue_status import RunnerQueueStatus
from .results import FullResult, failed_result, full_result_from_json

try:
    # mypy checks the launcher against the stand-in below: kernelbot's class is unknown
    # (Any) to it, and a class may not subclass Any under --strict.
    if not TYPE_CHECKING:
        from libkernelbot.launchers.launcher import Launcher as _Base
except ImportError:  # not running inside kernelbot

    class _Base:
        """kernelbot's ``Launcher`` shape: a name and the GPU enum it serves."""

        def __init__(self, name: str, gpus: type[enum.Enum]):
            self.name = name
            self.gpus = gpus


log = logging.getLogger(__name__)

#: Statuses worth another try with the same run id (the API's idempotency key).
RETRYABLE = {429, 500, 502, 503, 504}

#: kernelbot's timeout for a mode the config gives none (the runner's default too).
DEFAULT_MODE_TIMEOUT = 180.0
#: The runner's budget for one whole evaluation, every compile and run: no config makes
#: it run longer (it clamps each timeout to it, and stops there).
EVALUATION_BUDGET = 16 * 60.0
#: The service's ``QUEUE_TIMEOUT_SECS`` by default: how long a build may wait for an agent.
QUEUE_TIMEOUT = 900.0
#: What a run may take beyond its queue wait and its config's timeouts: the image pull,
#: compiles, the upload, the service's processing and callback, an agent-lost retry.
DEADLINE_MARGIN = 900.0


class DispatchError(Exception):
    """The API refused a submission, or could not be reached; ``str()`` is what kernelbot
    shows the user. ``maybe_created``: an attempt may have created the job all the same."""

    def __init__(self, message: str, *, maybe_created: bool = False):
        super().__init__(message)
        self.maybe_created = maybe_created


def gpu_name(gpu: Any) -> str:
    """``H100_BK`` from a name, an enum member or kernelbot's ``GPU`` record."""
    if isinstance(gpu, str):
        return gpu
    name = getattr(gpu, "name", None)
    return name if isinstance(name, str) else str(getattr(gpu, "value", gpu))


def new_run_id() -> str:
    return f"kb-{uuid.uuid4().hex}"


def _api_error(answer: httpx.Response) -> tuple[str | None, str]:
    """The API's ``{"error", "message", "field"}``: its code, and one line for the user."""
    try:
        body = answer.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        return None, f"kernelbot-dispatch answered {answer.status_code}"
    code = body.get("error")
    text = f"{body.get('message') or code} ({answer.status_code} {code})"
    if body.get("field"):
        text += f"; field `{body['field']}`"
    return code, text


def _json_object(answer: httpx.Response) -> dict[str, Any]:
    """The answer's JSON object, or ``{}`` when it holds none (read as "nothing known")."""
    try:
        body = answer.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _mode_timeout(config: dict[str, Any], key: str) -> float:
    """One of the config's timeouts as the runner reads it: a positive number of seconds
    (clamped to the evaluation's budget), else kernelbot's default."""
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return DEFAULT_MODE_TIMEOUT
    if not math.isfinite(value) or value <= 0:
        return DEFAULT_MODE_TIMEOUT
    return min(float(value), EVALUATION_BUDGET)


def evaluation_secs(config: Any) -> float:
    """How long the runner may take over ``config``: the timeouts of the modes it runs
    (a leaderboard or private run: test, benchmark and ranked; profile: the benchmark
    timeout per benchmark), at most the runner's whole budget."""
    if not isinstance(config, dict):
        return EVALUATION_BUDGET
    mode = config.get("mode")
    if mode == "test":
        total = _mode_timeout(config, "test_timeout")
    elif mode == "benchmark":
        total = _mode_timeout(config, "benchmark_timeout")
    elif mode == "profile":
        benchmarks = config.get("benchmarks")
        runs = len(benchmarks) if isinstance(benchmarks, list) else 1
        total = _mode_timeout(config, "benchmark_timeout") * max(1, runs)
    else:  # leaderboard, private
        keys = ("test_timeout", "benchmark_timeout", "ranked_timeout")
        total = sum(_mode_timeout(config, key) for key in keys)
    return min(total, EVALUATION_BUDGET)


def _link(build: Any) -> str:
    if isinstance(build, dict) and build.get("web_url"):
        return f"build [#{build.get('number')}](<{build['web_url']}>)"
    return "no build yet"


class DispatchLauncher(_Base):
    """Runs kernelbot submissions on kernelbot-dispatch (Buildkite behind a webhook service).

    ``http`` may be a shared ``httpx.AsyncClient``; the token is sent per request. Without
    one the launcher makes its own (close it with :meth:`aclose`).

    A run that has not ended by its deadline (:meth:`deadline_for`: the queue's wait,
    ``max_queue_secs`` when set, else the service's ``queue_timeout``; plus the config's
    timeouts; plus ``deadline_margin``) is looked up once more, then canceled, and
    ``run_submission`` returns a failed result instead of waiting on. ``max_queue_secs``,
    when set, is sent with each submission (the service takes 1 to 3600). With
    ``cache=False`` every submission asks for a run of its own: by default the service
    answers a ``test`` or ``benchmark`` identical to a recent run from that run's result
    (``RESULT_CACHE_SECS``), with no GPU time spent. ``priority="background"`` (a launcher
    for re-evaluations) submits runs that take a GPU only when one is idle and nothing else
    waits.
    """

    def __init__(
        self,
        api_url: str,
        api_token: str,
        inbox: Inbox,
        *,
        gpus: type[enum.Enum] | None = None,
        fallback_after: float = 300.0,
        poll_interval: float = 60.0,
        http: httpx.AsyncClient | None = None,
        name: str = RUNNER,
        submit_attempts: int = 5,
        retry_backoff: float = 1.0,
        request_timeout: float = 30.0,
        cancel_timeout: float = 5.0,
        cancel_window: float = 60.0,
        queue_timeout: float = QUEUE_TIMEOUT,
        max_queue_secs: int | None = None,
        deadline_margin: float = DEADLINE_MARGIN,
        cache: bool = True,
        priority: str = "normal",
    ):
        super().__init__(name=name, gpus=gpus or DispatchGPU)
        self.api_url = api_url.rstrip("/")
        self.inbox = inbox
        self.fallback_after = fallback_after
        self.poll_interval = poll_interval
        self.submit_attempts = max(1, submit_attempts)
        self.retry_backoff = retry_backoff
        self.request_timeout = request_timeout
        self.cancel_timeout = cancel_timeout
        self._auth = {"Authorization": f"Bearer {api_token}"}
        self._own_http = http is None
        self._http = http or httpx.AsyncClient(timeout=request_timeout)
        self.cancel_window = cancel_window
        self.queue_timeout = queue_timeout
        self.max_queue_secs = max_queue_secs
        self.deadline_margin = deadline_margin
        self.cache = cache
        if priority not in ("normal", "background"):
            raise ValueError(f"priority must be 'normal' or 'background', not {priority!r}")
        self.priority = priority
        self._cancels: set[asyncio.Task[None]] = set()

    async def aclose(self) -> None:
        """Lets cancels still being retried finish, then closes the HTTP client."""
        if self._cancels:
            await asyncio.gather(*self._cancels, return_exceptions=True)
        if self._own_http:
            await self._http.aclose()

    # -- kernelbot's launcher interface -------------------------------------------------

    async def run_submission(
        self,
        config: dict[str, Any],
        gpu_type: Any,
        status: Any,
        *,
        run_id: str | None = None,
        user: str | None = None,
    ) -> FullResult:
        """Submits ``config`` to ``gpu_type``'s queue and returns kernelbot's ``FullResult``.

        The run id is chosen before the POST: it is the API's idempotency key (a retried
        POST cannot make a second job) and callbacks may arrive before the answer (the
        inbox holds them). By default it is a fresh ``kb-<uuid hex>``; kernelbot may name
        the run itself (``run_id``: 1 to 64 of ``A-Za-z0-9_.-``, unique per run), so that
        after a restart it knows whose result :meth:`recover` hands it. ``user`` (kernelbot's
        user id, opaque, 1 to 64 characters without spaces) is the service's fair share: at
        most a few of one user's runs per queue have a build at once, the rest wait their
        turn, and the status shows each run's place. Cancelling the task cancels the job.
        However it ends, the run is recorded in the inbox as taken.
        """
        run_id = run_id or new_run_id()
        gpu = gpu_name(gpu_type)
        deadline = asyncio.get_running_loop().time() + self.deadline_for(config)
        await status.push(f"⏳ Submitting to kernelbot-dispatch ({gpu})")
        try:
            try:
                accepted = await self._submit(run_id, gpu, config, user)
            except DispatchError as e:
                if e.maybe_created:
                    await self._cancel(run_id)  # nobody will read its result
                await status.update(f"❌ {e}")
                return failed_result(str(e))
            await self._show_accepted(accepted, gpu, status)
            ended = STATE_RANK.get(str(accepted.get("state")), 0) >= TERMINAL_RANK
            return await self._follow(run_id, gpu, status, deadline, poll_now=ended)
        except asyncio.CancelledError:
            await self._cancel(run_id)
            raise
        finally:
            await self._hand_over(run_id)

    async def recover(
        self, run_ids: Iterable[str] | None = None, *, settle: float = 60.0
    ) -> dict[str, FullResult]:
        """Results of runs that ended while nobody waited on them (kernelbot was down), by
        run id, as ``run_submission`` returns them.

        Without ``run_ids``: the ended runs the inbox holds that nobody took (no launcher
        returned them, no earlier ``recover`` did), recorded at least ``settle`` seconds
        ago (a launcher still waiting on a run takes it at once; ``settle`` keeps this from
        taking it first). This needs a :class:`~.inbox.RecoverableInbox` (the package's
        inboxes all are).

        With ``run_ids``: each of those runs that has ended, from the inbox, else from
        ``GET /submissions/{run_id}``, taken or not. A run still open, one the service does
        not know, or one it cannot be asked about now is left out: ask again later.

        Every run returned is recorded as taken, so a later ``recover()`` leaves it out.
        """
        if run_ids is None:
            return await self._recover_untaken(settle)
        ids = list(dict.fromkeys(run_ids))
        limit = asyncio.Semaphore(8)

        async def ended(run_id: str) -> FullResult | None:
            async with limit:
                return await self._ended(run_id)

        found = await asyncio.gather(*(ended(run_id) for run_id in ids))
        results = {}
        for run_id, result in zip(ids, found, strict=True):
            if result is not None:
                await self._hand_over(run_id)
                results[run_id] = result
        return results

    def deadline_for(self, config: Any) -> float:
        """Seconds ``run_submission`` waits for ``config``'s run before giving it up: the
        queue's wait, the evaluation's (:func:`evaluation_secs`) and the margin."""
        queue = self.max_queue_secs if self.max_queue_secs is not None else self.queue_timeout
        return queue + evaluation_secs(config) + self.deadline_margin

    async def get_queue_status(
        self, gpu: Any, config: dict[str, Any] | None = None
    ) -> RunnerQueueStatus:
        """kernelbot's ``RunnerQueueStatus`` for the queue behind ``gpu`` (``config`` is not
        needed: one queue serves a GPU): jobs queued and running, idle connected agents;
        ``status="unavailable"`` with the reason when the service cannot say. It never
        raises: whatever goes wrong (no answer, an error status, a body that is not a JSON
        object, a bug) is an unavailable status naming it."""
        try:
            name = gpu_name(gpu)
        except Exception as e:
            reason = f"cannot name the GPU: {type(e).__name__}: {e}"
            return queue_status.unavailable(self.name, "?", reason)
        try:
            return await self._queue_status(name)
        except Exception as e:
            log.warning("queue status of %s", name, exc_info=True)
            reason = f"cannot read kernelbot-dispatch's queue status: {type(e).__name__}: {e}"
            return queue_status.unavailable(self.name, name, reason)

    async def _queue_status(self, name: str) -> RunnerQueueStatus:
        try:
            answer = await self._http.get(
                f"{self.api_url}/queues/{name}", headers=self._auth, timeout=self.request_timeout
            )
        except httpx.HTTPError as e:
            reason = f"kernelbot-dispatch unreachable: {str(e) or type(e).__name__}"
            return queue_status.unavailable(self.name, name, reason)
        if answer.status_code != 200:
            return queue_status.unavailable(self.name, name, _api_error(answer)[1])
        try:
            body = answer.json()
        except ValueError:  # not JSON, or not UTF-8
            body = None
        if not isinstance(body, dict):
            reason = "kernelbot-dispatch answered 200 without a JSON object"
            return queue_status.unavailable(self.name, name, reason)
        return queue_status.available(self.name, name, body)

    # -- recovering ------------------------------------------------------------------------

    async def _recover_untaken(self, settle: float) -> dict[str, FullResult]:
        inbox = self.inbox
        if not isinstance(inbox, RecoverableInbox):
            raise TypeError(
                f"recover() without run ids needs an inbox that lists ended runs "
                f"(take and untaken); {type(inbox).__name__} has not"
            )
        results = {}
        for event in await inbox.untaken(settle):
            if await inbox.take(event.run_id):  # another process may recover it too
                results[event.run_id] = _result_of_callback(event)
        return results

    async def _ended(self, run_id: str) -> FullResult | None:
        """The run's result if it has ended: from its callback, else from the service."""
        try:
            event = await self.inbox.wait(run_id, TERMINAL_RANK - 1, 0)
        except Exception:
            log.warning("reading the inbox for %s", run_id, exc_info=True)
            event = None
        if event is not None:
            return _result_of_callback(event)
        view = await self._poll(run_id) or {}
        if STATE_RANK.get(str(view.get("state")), -1) >= TERMINAL_RANK:
            return _result_of_view(view)
        return None

    async def _hand_over(self, run_id: str) -> None:
        """Records in the inbox that kernelbot has had the run's outcome (best effort: a
        run not recorded may only be recovered twice)."""
        if not isinstance(self.inbox, RecoverableInbox):
            return
        try:
            await asyncio.wait_for(self.inbox.take(run_id), self.cancel_timeout)
        except Exception:
            log.warning("recording %s as taken", run_id, exc_info=True)

    # -- submitting ------------------------------------------------------------------------

    async def _submit(
        self, run_id: str, gpu: str, config: dict[str, Any], user: str | None = None
    ) -> dict[str, Any]:
        """POSTs the submission, retrying what may pass later; the 200/202 answer's body."""
        body: dict[str, Any] = {"run_id": run_id, "gpu": gpu, "config": config}
        if self.max_queue_secs is not None:
            body["max_queue_secs"] = self.max_queue_secs
        if not self.cache:
            body["cache"] = False
        if self.priority != "normal":
            body["priority"] = self.priority
        user_key = _user_key(user)
        if user_key is not None:
            body["user"] = user_key
        problem = "no attempt made"
        answer: httpx.Response | None = None
        # Whether an attempt may have recorded the job (and built it) before failing: one
        # that timed out or got a 5xx; a refused connection never reached the service.
        maybe_created = False
        for attempt in range(self.submit_attempts):
            if attempt:
                await asyncio.sleep(self._backoff(attempt, answer))
            answer = None
            try:
                answer = await self._http.post(
                    f"{self.api_url}/submissions",
                    json=body,
                    headers=self._auth,
                    timeout=self.request_timeout,
                )
            except httpx.HTTPError as e:  # connection refused, reset, timed out
                maybe_created |= not isinstance(e, httpx.ConnectError)
                problem = f"kernelbot-dispatch unreachable: {type(e).__name__}"
                log.warning("submitting %s: %s (attempt %d)", run_id, problem, attempt + 1)
                continue
            if answer.status_code in (200, 202):
                return _json_object(answer)
            code, problem = _api_error(answer)
            # A 502 `buildkite_error` is Buildkite's final refusal (the job is kept failed);
            # a 429 `rate_limited` is the user's waiting limit (nothing was recorded): trying
            # again within seconds only asks again. A bare 429 (a gateway's) is retried.
            final = answer.status_code not in RETRYABLE or code in (
                "buildkite_error",
                "rate_limited",
            )
            if final:
                # Only an earlier attempt (timed out, 5xx) may have recorded a job to cancel:
                # this answer's refusal recorded none, or failed the one it kept.
                raise DispatchError(
                    f"kernelbot-dispatch refused the submission: {problem}",
                    maybe_created=maybe_created,
                )
            maybe_created |= answer.status_code >= 500
            log.warning("submitting %s: %s (attempt %d)", run_id, problem, attempt + 1)
        raise DispatchError(
            f"could not submit to kernelbot-dispatch: {problem}", maybe_created=maybe_created
        )

    def _backoff(self, attempt: int, answer: httpx.Response | None) -> float:
        retry_after = answer.headers.get("retry-after") if answer is not None else None
        if retry_after and retry_after.isdigit():
            return min(float(retry_after), 30.0)
        return self.retry_backoff * 2.0 ** (attempt - 1) * (0.5 + random.random() / 2)

    async def _show_accepted(self, accepted: dict[str, Any], gpu: str, status: Any) -> None:
        place = _place(accepted)
        if accepted.get("build"):
            await status.update(f"⏳ Queued for {gpu}: {_link(accepted['build'])}{place}")
        elif accepted.get("waiting") == "user_limit":
            await status.update(
                f"⏳ Waiting for its turn on {gpu}: GPUs go by share, fewest runs first{place}"
            )
        else:
            await status.update(f"⏳ Submitted for {gpu}: waiting for a build{place}")

    async def _cancel(self, run_id: str) -> None:
        """Cancels the run: waits for the first answer (briefly, shielded from the
        cancellation that triggered it), and goes on trying in the background if that was
        not final."""
        task = asyncio.ensure_future(self._cancel_until_answered(run_id))
        self._cancels.add(task)
        task.add_done_callback(self._cancels.discard)
        try:
            await asyncio.wait_for(asyncio.shield(task), self.cancel_timeout)
        except (asyncio.TimeoutError, asyncio.CancelledError):
            pass  # it goes on by itself

    async def _cancel_until_answered(self, run_id: str) -> None:
        """POSTs the cancel until the service answers for the run (202, or 409: it has
        ended). A 404 is tried again: a submit still in flight may record the job after our
        cancel arrived. Gives up after ``cancel_window`` seconds."""
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + self.cancel_window
        wait = 0.5
        while True:
            try:
                answer = await self._http.post(
                    f"{self.api_url}/submissions/{run_id}/cancel",
                    headers=self._auth,
                    timeout=self.cancel_timeout,
                )
                log.info("cancel %s: %s", run_id, answer.status_code)
                if answer.status_code in (202, 409):
                    return
                if answer.status_code != 404 and answer.status_code not in RETRYABLE:
                    return  # refused for good (401): nothing to gain by repeating
            except httpx.HTTPError as e:
                log.warning("cancel %s failed: %s", run_id, e)
            if loop.time() + wait > give_up_at:
                log.warning("cancel %s: no answer for the run; giving up", run_id)
                return
            await asyncio.sleep(wait)
            wait = min(wait * 2, 5.0)

    # -- waiting ---------------------------------------------------------------------------

    async def _follow(
        self, run_id: str, gpu: str, status: Any, deadline: float, *, poll_now: bool = False
    ) -> FullResult:
        """Waits for the run's end: callbacks first, polling after ``fallback_after`` s of
        silence (at once with ``poll_now``: a repeated run id whose job has ended), until
        ``deadline`` (the loop's clock). Every newer state, from either, updates the status
        line."""
        loop = asyncio.get_running_loop()
        rank = STATE_RANK["submitted"]
        last_news = loop.time()
        next_poll: float | None = last_news if poll_now else None
        while True:
            now = loop.time()
            if now >= deadline:
                return await self._give_up(run_id, gpu, status, rank)
            if next_poll is None and now - last_news >= self.fallback_after:
                log.info("no callback for %s in %.0f s: polling", run_id, now - last_news)
                next_poll = now
            until = next_poll if next_poll is not None else last_news + self.fallback_after
            until = min(until, deadline)
            try:
                event = await self.inbox.wait(run_id, rank, max(0.0, until - now))
            except Exception:  # a store hiccup must not lose the run: polling still works
                log.exception("waiting on the inbox for %s", run_id)
                await asyncio.sleep(min(1.0, max(0.0, until - now)))
                event = None
            if event is not None:
                rank, last_news, next_poll = event.rank, loop.time(), None
                await self._show(event.data, gpu, status)
                if event.terminal:
                    return _result_of_callback(event)
                continue
            if next_poll is not None and loop.time() >= next_poll:
                next_poll = loop.time() + self.poll_interval
                view = await self._poll(run_id) or {}
                news = STATE_RANK.get(str(view.get("state")), -1)
                if news > rank:
                    rank = news
                    await self._show(view, gpu, status)
                    if rank >= TERMINAL_RANK:
                        return _result_of_view(view)

    async def _give_up(self, run_id: str, gpu: str, status: Any, rank: int) -> FullResult:
        """The deadline passed: one last look at the run (its callback may have come this
        instant, or its end without a callback), else cancel it (nobody will read its
        result) and say so."""
        try:
            event = await self.inbox.wait(run_id, TERMINAL_RANK - 1, 0)
        except Exception:
            log.warning("reading the inbox for %s", run_id, exc_info=True)
            event = None
        if event is not None:
            await self._show(event.data, gpu, status)
            return _result_of_callback(event)
        view = await self._poll(run_id) or {}
        if STATE_RANK.get(str(view.get("state")), -1) >= TERMINAL_RANK:
            await self._show(view, gpu, status)
            return _result_of_view(view)
        log.warning("run %s has not ended by its deadline: canceling it", run_id)
        await self._cancel(run_id)
        state = view.get("state") or next(s for s, r in STATE_RANK.items() if r == rank)
        error = (
            f"kernelbot-dispatch gave no result in time: run {run_id} was still {state} at "
            f"its deadline, and was canceled"
        )
        await status.update(f"❌ No result in time on {gpu}: canceled")
        return failed_result(error)

    async def _poll(self, run_id: str) -> dict[str, Any] | None:
        try:
            answer = await self._http.get(
                f"{self.api_url}/submissions/{run_id}",
                headers=self._auth,
                timeout=self.request_timeout,
            )
        except httpx.HTTPError as e:
            log.warning("polling %s: %s", run_id, e)
            return None
        if answer.status_code != 200:
            log.warning("polling %s: %s", run_id, _api_error(answer)[1])
            return None
        return _json_object(answer)

    async def _show(self, job: Any, gpu: str, status: Any) -> None:
        """One status line for a state; ``job`` is a callback's ``data`` or a polled view."""
        state, build = job.get("state"), _link(job.get("build"))
        if state == "submitted" and job.get("waiting") == "user_limit":
            await status.update(
                f"⏳ Waiting for its turn on {gpu}: GPUs go by share, fewest runs first"
                f"{_place(job)}"
            )
        elif state == "scheduled":
            await status.update(
                f"⏳ Queued on `{job.get('queue')}` for {gpu}: {build}{_place(job)}"
            )
        elif state == "running":
            await status.update(f"⏳ Running on {gpu}: {build}")
        elif state == "finished":
            verdict = job.get("verdict") or (job.get("result") or {}).get("verdict")
            mark = "✅" if verdict == "passed" else "❌"
            await status.update(f"{mark} Finished on {gpu} ({verdict}): {build}")
        elif state == "failed":
            await status.update(f"❌ Failed before running on {gpu}: {build}")


_USER = re.compile(r"[^\s\x00-\x1f\x7f]{1,64}")


def _user_key(user: Any) -> str | None:
    """kernelbot's user id as the service takes it (1 to 64 characters without spaces), or
    ``None`` (the run then counts as a user of its own): an id that does not fit is left
    out with a warning rather than have the submission refused."""
    if user is None:
        return None
    text = str(user)
    if _USER.fullmatch(text):
        return text
    log.warning("user id %r does not fit the service's 1-64 characters; sent without", text)
    return None


def _place(job: dict[str, Any], now: float | None = None) -> str:
    """`` — 3rd in line, expected to start in about 4 min`` from an answer's
    ``queue_position`` and ``expected_start``; empty when it has none. Plain text: kernelbot's
    reporters are not all Discord (its API and CLI show the line as it is)."""
    position = job.get("queue_position")
    if not isinstance(position, int) or isinstance(position, bool) or position < 1:
        return ""
    if position % 100 in (11, 12, 13):
        suffix = "th"
    else:
        suffix = {1: "st", 2: "nd", 3: "rd"}.get(position % 10, "th")
    text = " — next to start" if position == 1 else f" — {position}{suffix} in line"
    start = job.get("expected_start")
    if isinstance(start, str):
        try:
            when = datetime.fromisoformat(start.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return text
        minutes = round((when - (time.time() if now is None else now)) / 60)
        text += ", expected to start " + ("now" if minutes <= 0 else f"in about {minutes} min")
    return text


def _no_result_error(verdict: Any, build_state: Any, error: Any) -> str:
    if error:
        return str(error)
    if build_state:
        return f"no result ({verdict}; build {build_state})"
    return f"no result ({verdict})"


def _result_of_callback(event: CallbackEvent) -> FullResult:
    data = event.data
    if event.state == "finished" and isinstance(data.get("result"), dict):
        return full_result_from_json(data["result"])
    if event.state == "failed":
        return failed_result(str(data.get("error") or "the submission failed"))
    return failed_result(
        _no_result_error(data.get("verdict"), data.get("build_state"), data.get("error"))
    )


def _result_of_view(view: dict[str, Any]) -> FullResult:
    outcome = view.get("result") or {}
    if view.get("state") == "finished" and isinstance(outcome.get("result"), dict):
        return full_result_from_json(outcome["result"])
    if view.get("state") == "failed":
        return failed_result(str(view.get("failure") or outcome.get("error") or "failed"))
    return failed_result(
        _no_result_error(
            outcome.get("verdict") or view.get("verdict"),
            outcome.get("build_state"),
            outcome.get("error"),
        )
    )
