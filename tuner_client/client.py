"""The one HTTP client of the tuning server's REST API.

One place for the base URL, the bearer token, timeouts, retries and the mapping of
HTTP errors to exceptions (:mod:`tuner_client.errors`); each route is a typed method
that sends and returns the contract's models (:mod:`schemas.api`).

The one retry loop, with exponential backoff, bounded by ``retries`` (None: until
``stop``): a request that never reached the server (connection refused, connect
timeout) is always sent again; one that may have reached it (a read timeout, a dropped
connection, a 5xx) only where the server treats it idempotently: reads, heartbeat,
results and release (by trial id), cancel. Submitting a job, registering a worker,
leasing trials, deregistering and importing records are not sent twice once they may
have arrived (a lease sent twice leaves the first batch leased to nobody); the
:class:`~tuner_client.errors.Unavailable` raised then says ``sent``. A request the
server answers 500 :data:`MAX_500` times is raised even when retrying without bound:
the server fails on that very request, it is not down.
"""

from __future__ import annotations

import copy
import gc
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Self
from urllib.parse import quote

import httpx
from pydantic import TypeAdapter, ValidationError
from pydantic_core import from_json

from schemas import Target, Workload
from schemas.api import (
    MAX_BEST_WORKLOADS,
    BestItem,
    BestRequest,
    BestResponse,
    Deregistered,
    Health,
    HeartbeatAnswer,
    ImportResponse,
    JobCancelled,
    JobCreated,
    JobRequest,
    JobView,
    LeaseAnswer,
    LeaseRequest,
    Readiness,
    RecordPage,
    RecordSearchPage,
    Registered,
    Released,
    Results,
    ResultsAccepted,
    TrialIds,
    TrialPage,
    TrialResult,
    WorkerInfo,
    WorkerRegistration,
)
from tuner_client.errors import ApiError, BadAnswer, Unavailable, error_for

log = logging.getLogger("tuner.client")

API = "/api/v1"
# A request answered 500 this often is raised, however many retries are left.
MAX_500 = 5
# What stops retrying: an event that is set, or a callable that answers True.
Stop = threading.Event | Callable[[], bool]
# GET /api/v1/records answers at most this many records a page.
RECORDS_PAGE = 10_000


@dataclass(frozen=True)
class PretunedLog:
    """``GET /api/v1/logs/{target}``: the best record per workload for a target as
    AutoTVM lines, and its ETag. ``text`` is None when the ``etag`` asked with still
    matches (304: the copy in hand is current)."""

    text: str | None
    etag: str | None


class TunerClient:
    """A tuning server at ``url``, as ``token`` (None: a server without auth).

    ``timeout``: seconds a request may take (a lease adds its long-poll wait);
    ``retries``: how many times a failed request is tried again (None: until ``stop``),
    waiting ``backoff_s``, then twice as long each time, at most ``max_backoff_s``;
    ``stop`` (an event, or a callable answering True) ends the retries, checked between
    attempts and during the waits: the last failure is raised at once."""

    def __init__(self, url: str, token: str | None = None, *, timeout: float = 30.0,
                 retries: int | None = 3, backoff_s: float = 0.2,
                 max_backoff_s: float = 5.0, stop: Stop | None = None) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"server URL {url!r} is not an http:// or https:// URL")
        if (retries is not None and retries < 0) or backoff_s < 0 or max_backoff_s < 0:
            raise ValueError("retries and backoff must not be negative")
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.stop = stop
        self._http = httpx.Client(base_url=self.url, timeout=timeout)
        self._owner = True
        self.use_token(token)

    # -- lifecycle ---------------------------------------------------------------------
    def close(self) -> None:
        """Close the connections (a view from :meth:`with_retries` leaves them open)."""
        if self._owner:
            self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TunerClient({self.url!r})"

    def use_token(self, token: str | None) -> None:
        """Send ``token`` from now on (a worker switches to the one its registration
        answered); None sends none. Views from :meth:`with_retries` share it."""
        if token:
            self._http.headers["Authorization"] = f"Bearer {token}"
        else:
            self._http.headers.pop("Authorization", None)

    def with_retries(self, retries: int | None, stop: Stop | None = None) -> TunerClient:
        """This client, sharing its connections and token, with another retry budget
        and stop (a worker's heartbeat fails at once: the next beat replaces it)."""
        view = copy.copy(self)
        view.retries, view.stop, view._owner = retries, stop, False
        return view

    def url_of(self, route: str) -> str:
        """The full URL of an API route, e.g. ``url_of("records/best")``: for naming
        where an answer came from."""
        return f"{self.url}{API}/{route.lstrip('/')}"

    def stopped(self) -> bool:
        """Whether ``stop`` says to retry no more."""
        stop = self.stop
        if stop is None:
            return False
        return stop.is_set() if isinstance(stop, threading.Event) else stop()

    def backoff(self, attempt: int) -> bool:
        """Wait before retry number ``attempt + 1`` (exponential, capped); False, at
        once, when ``stop`` says to stop (before or during the wait)."""
        delay = self._delay(attempt)
        if isinstance(self.stop, threading.Event):
            return not self.stop.wait(delay)
        deadline = time.monotonic() + delay
        while not self.stopped():
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            time.sleep(min(left, 0.05))
        return False

    def _delay(self, attempt: int) -> float:
        return min(self.backoff_s * 2 ** attempt, self.max_backoff_s)

    # -- the one request path ------------------------------------------------------------
    def _send(self, method: str, path: str, *, idempotent: bool,
              timeout: float | None = None, ok: tuple[int, ...] = (),
              **kwargs: Any) -> httpx.Response:
        """The answer to ``method path``, retried as the module says; an error status
        (but those in ``ok``) raises its :class:`ApiError`."""
        attempt = errors_500 = 0
        while True:
            answer: httpx.Response | None = None
            sent, state = True, "no answer"
            try:
                answer = self._http.request(method, path, timeout=timeout or self.timeout,
                                            **kwargs)
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as err:
                reason, sent, state = _reason(err), False, "unreachable"  # never arrived
            except httpx.TransportError as err:  # it may have reached the server
                reason = _reason(err)
                if isinstance(err, httpx.TimeoutException):
                    state = "no answer in time"
            else:
                if answer.status_code < 500 or answer.status_code in ok:
                    return self._checked(answer, method, path, ok)
                errors_500 += answer.status_code == 500
                reason = f"{answer.status_code} {_detail(answer)[:200]}"
            again = ((idempotent or not sent) and errors_500 < MAX_500
                     and (self.retries is None or attempt < self.retries))
            if again and not self.stopped():
                log.info("server unavailable: %s %s%s (%s); retrying in %.1f s", method,
                         self.url, path, reason, self._delay(attempt))
                if self.backoff(attempt):
                    attempt += 1
                    continue
            if answer is not None:
                raise self._error(answer, method, path)
            tries = f" after {attempt + 1} tries" if attempt else ""
            hint = "; is the server running?" if not sent else ""
            raise Unavailable(None, f"{state}{tries} ({reason}){hint}", method, path,
                              self.url, sent=sent)

    def _checked(self, answer: httpx.Response, method: str, path: str,
                 ok: tuple[int, ...]) -> httpx.Response:
        if answer.is_error and answer.status_code not in ok:
            raise self._error(answer, method, path)
        return answer

    def _error(self, answer: httpx.Response, method: str, path: str) -> ApiError:
        return error_for(answer.status_code)(answer.status_code, _detail(answer), method,
                                             path, self.url)

    def _json(self, model: Any, method: str, path: str, *, idempotent: bool,
              **kwargs: Any) -> Any:
        """The answer's body as ``model`` (a model class or a type such as
        ``list[JobView]``); :class:`BadAnswer` when it is not one."""
        answer = self._send(method, path, idempotent=idempotent, **kwargs)
        return self._parse(answer, model, method, path)

    def _parse(self, answer: httpx.Response, model: Any, method: str, path: str) -> Any:
        try:
            return TypeAdapter(model).validate_json(answer.content)
        except ValidationError as err:
            name = getattr(model, "__name__", str(model))
            raise BadAnswer(answer.status_code, f"not a {name} answer "
                                                f"({err.error_count()} problems, first: "
                                                f"{err.errors()[0]['msg']}); is it a tuning "
                                                f"server of this version?",
                            method, path, self.url) from None

    # -- health ----------------------------------------------------------------------------
    def health(self) -> Health:
        """``/healthz``: the process answers."""
        return self._json(Health, "GET", "/healthz", idempotent=True)

    def ready(self) -> Readiness:
        """``/readyz``: whether the database and the queue answer. A server that is up
        but not ready answers (503, not retried) with what is missing."""
        answer = self._send("GET", "/readyz", idempotent=True, ok=(503,))
        readiness: Readiness = self._parse(answer, Readiness, "GET", "/readyz")
        return readiness

    # -- jobs ------------------------------------------------------------------------------
    def submit_job(self, job: JobRequest) -> int:
        """Submit a job; its id. Not retried once it may have reached the server."""
        created: JobCreated = self._json(JobCreated, "POST", f"{API}/jobs", idempotent=False,
                                         json=job.model_dump(mode="json"))
        return created.id

    def jobs(self, limit: int = 100, offset: int = 0) -> list[JobView]:
        """Jobs, newest first (without their tuning curves)."""
        return self._json(list[JobView], "GET", f"{API}/jobs", idempotent=True,
                          params={"limit": limit, "offset": offset})

    def job(self, job_id: int, curves: bool = True) -> JobView:
        """A job with its tasks (and each task's tuning curve unless ``curves`` is off)."""
        return self._json(JobView, "GET", f"{API}/jobs/{job_id}", idempotent=True,
                          params={"curves": curves})

    def cancel_job(self, job_id: int) -> JobCancelled:
        """Cancel a job that has not ended; its state after."""
        return self._json(JobCancelled, "POST", f"{API}/jobs/{job_id}/cancel",
                          idempotent=True)

    def trials(self, job_id: int, task_id: int, after: int | None = None,
               limit: int | None = None) -> TrialPage:
        """A task's measured trials in order; ``after`` (a trial id) only those since."""
        params = {k: v for k, v in (("after", after), ("limit", limit)) if v is not None}
        return self._json(TrialPage, "GET", f"{API}/jobs/{job_id}/tasks/{task_id}/trials",
                          idempotent=True, params=params)

    # -- workers ---------------------------------------------------------------------------
    def workers(self) -> list[WorkerInfo]:
        """Every registered worker, newest first, with its pace and error rate."""
        return self._json(list[WorkerInfo], "GET", f"{API}/workers", idempotent=True)

    def register_worker(self, registration: WorkerRegistration) -> Registered:
        """Register a worker; the answer's token speaks for it alone (pass it to
        :meth:`use_token`). Not retried once it may have reached the server."""
        return self._json(Registered, "POST", f"{API}/workers", idempotent=False,
                          json=registration.model_dump(mode="json"))

    def lease(self, worker_id: int, max_trials: int = 1, wait_s: float = 10.0
              ) -> LeaseAnswer:
        """Up to ``max_trials`` trials for this worker, waiting up to ``wait_s`` for work.
        Not retried once it may have reached the server: the trials it leased would go
        to nobody until their leases expire, each counting as an attempt."""
        body = LeaseRequest(max_trials=max_trials, wait_s=wait_s)
        return self._json(LeaseAnswer, "POST", f"{API}/workers/{worker_id}/lease",
                          idempotent=False, timeout=self.timeout + wait_s,
                          json=body.model_dump(mode="json"))

    def heartbeat(self, worker_id: int, trial_ids: Sequence[int]) -> int:
        """Extend these leases; how many were. :class:`Conflict` (nothing extended)
        names the trials no longer this worker's."""
        answer: HeartbeatAnswer = self._json(
            HeartbeatAnswer, "POST", f"{API}/workers/{worker_id}/heartbeat", idempotent=True,
            json=TrialIds(trial_ids=list(trial_ids)).model_dump(mode="json"))
        return answer.extended

    def report_results(self, worker_id: int, results: Sequence[TrialResult]
                       ) -> ResultsAccepted:
        """Store measured results, each once (a repeat counts as a duplicate)."""
        return self._json(ResultsAccepted, "POST", f"{API}/workers/{worker_id}/results",
                          idempotent=True,
                          json=Results(results=list(results)).model_dump(mode="json"))

    def release(self, worker_id: int, trial_ids: Sequence[int]) -> int:
        """Give trials back unmeasured; how many went back to the queue."""
        answer: Released = self._json(
            Released, "POST", f"{API}/workers/{worker_id}/release", idempotent=True,
            json=TrialIds(trial_ids=list(trial_ids)).model_dump(mode="json"))
        return answer.released

    def deregister(self, worker_id: int) -> Deregistered:
        """The worker stops: its leases go back, its tokens stop working (so this is not
        retried once it may have reached the server)."""
        return self._json(Deregistered, "DELETE", f"{API}/workers/{worker_id}",
                          idempotent=False)

    # -- records ---------------------------------------------------------------------------
    def records(self, target: Target | str | None = None, template: str | None = None,
                workload: Workload | None = None, limit: int = 100, offset: int = 0
                ) -> RecordPage:
        """A page of records as AutoTVM JSON objects; ``target`` a kind matches every
        model of it; ``workload`` filters by its template and arguments."""
        params: dict[str, Any] = {"limit": limit, "offset": offset}
        if target is not None:
            params["target"] = str(target)
        if workload is not None:
            params["template"] = workload.template
            params["workload"] = json.dumps(workload.args_json(), separators=(",", ":"))
        elif template is not None:
            params["template"] = template
        return self._json(RecordPage, "GET", f"{API}/records", idempotent=True, params=params)

    def iter_records(self, target: Target | str | None = None, template: str | None = None,
                     workload: Workload | None = None) -> Iterator[dict[str, Any]]:
        """Every matching record, a page at a time."""
        offset = 0
        while True:
            page = self.records(target, template, workload, RECORDS_PAGE, offset)
            yield from page.items
            offset += len(page.items)
            if not page.items or offset >= page.total:
                return

    def search_records(self, target: Target | str | None = None, template: str | None = None,
                       workload: str | None = None, best: bool = True, limit: int = 100,
                       offset: int = 0) -> RecordSearchPage:
        """The dashboard's search: ``workload`` is a substring of the workload key;
        ``best`` keeps the best record per device model and workload."""
        params: dict[str, Any] = {"best": best, "limit": limit, "offset": offset}
        for name, value in (("target", target), ("template", template),
                            ("workload", workload)):
            if value is not None:
                params[name] = str(value)
        return self._json(RecordSearchPage, "GET", f"{API}/records/search", idempotent=True,
                          params=params)

    def best(self, target: Target | str, workloads: Sequence[Workload]) -> list[BestItem]:
        """The best record of each workload on ``target`` and the rule that found it, in
        order (asked :data:`MAX_BEST_WORKLOADS` at a time)."""
        items: list[BestItem] = []
        path = f"{API}/records/best"
        for start in range(0, len(workloads), MAX_BEST_WORKLOADS):
            asked = list(workloads[start:start + MAX_BEST_WORKLOADS])
            body = BestRequest(target=str(target), workloads=asked)
            answer = self._send("POST", path, idempotent=True, content=body.model_dump_json(),
                                headers={"content-type": "application/json"})
            found = _best_items(answer.content, asked)
            if found is None:  # not the plain echo of what was asked: validated in full
                found = self._parse(answer, BestResponse, "POST", path).items
            items += found
        return items

    def import_records(self, lines: Iterable[str] | str) -> ImportResponse:
        """Store AutoTVM log lines (the text, or its lines) as imported records; refused
        lines are counted and the first named. Not retried once it may have arrived."""
        text = lines if isinstance(lines, str) else "\n".join(lines)
        return self._json(ImportResponse, "POST", f"{API}/records/import", idempotent=False,
                          content=text.encode(), headers={"content-type": "text/plain"})

    def pretuned_log(self, target: Target | str, etag: str | None = None) -> PretunedLog:
        """The pretuned log of ``target`` (best record per workload, AutoTVM lines);
        with the ``etag`` of a copy in hand, ``text`` is None while it is current."""
        path = f"{API}/logs/{quote(str(target), safe='=,')}"
        headers = {"If-None-Match": etag} if etag else {}
        answer = self._send("GET", path, idempotent=True, headers=headers)
        if answer.status_code == 304:
            return PretunedLog(None, answer.headers.get("ETag", etag))
        return PretunedLog(answer.text, answer.headers.get("ETag"))


def _best_items(content: bytes, asked: list[Workload]) -> list[BestItem] | None:
    """The items of a BestResponse that answers ``asked`` in order, each naming its
    workload as asked: built from the workloads in hand, not validated anew (10,000
    items parse in a tenth of the time); None for any other answer, which ``_parse``
    then validates (a BadAnswer, or the items as the server named them)."""
    enabled = gc.isenabled()
    gc.disable()  # a million objects: CPython's collections as they grow cost 5x the parse
    try:
        try:  # pydantic's parser (Rust): 0.7x of json.loads's time on 10,000 items
            body = from_json(content)
        except ValueError:  # past its 200 levels of nesting, say (the stdlib reads deeper)
            body = json.loads(content)
        return _echoed(body, asked)
    except (ValueError, RecursionError):
        return None
    finally:
        if enabled:
            gc.enable()


def _echoed(body: Any, asked: list[Workload]) -> list[BestItem] | None:
    """``_best_items`` of the parsed answer."""
    found = body.get("items") if type(body) is dict and len(body) == 1 else None
    if type(found) is not list or len(found) != len(asked):
        return None
    items = []
    for item, workload in zip(found, asked, strict=True):
        if type(item) is not dict or len(item) != 3:
            return None
        named, rule, record = item.get("workload"), item.get("rule"), item.get("record")
        if (type(rule) is not str or (record is not None and type(record) is not dict)
                or type(named) is not dict or len(named) != 2
                or named.get("template") != workload.template
                or named.get("args") != workload.args_json()):
            return None
        items.append(BestItem.model_construct(workload=workload, rule=rule, record=record))
    return items


def _detail(answer: httpx.Response) -> str:
    """The server's ``detail`` message, else the body's start, else the HTTP reason."""
    try:
        body = answer.json()
    except ValueError:
        return answer.text.strip()[:500] or answer.reason_phrase
    if isinstance(body, dict) and "detail" in body:
        return str(body["detail"])
    return str(body)[:500]


def _reason(err: httpx.TransportError) -> str:
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
