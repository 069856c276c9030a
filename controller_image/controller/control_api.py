"""The controller's control API (docs/control-api.md).

    GET  /healthz              alive and making progress (503: stalled, see watchdog.py) (public)
    GET  /readyz               trainer built, checkpoint reachable (public)
    GET  /v1/status            ControllerStatus                    (bearer token)
         ?after=<version>&wait=<s>  ... once its version is not `after` (long poll, status_feed.py)
    PUT  /v1/slices/{index}    SliceReport -> SliceReportResult    (bearer token)
    GET  /metrics              Prometheus text format              (bearer token)

Only the two probes are public (the kubelet calls them without credentials
and they say nothing but ok/ready). Everything else, `/metrics` included
(it carries the job's loss, step and slice history), needs
`Authorization: Bearer <token>` (the per-job Secret); Prometheus scrapes it
with that token (docs/security.md). There is no `/openapi.json` or `/docs`.

The check runs in an ASGI middleware before the body is read, so an
unauthenticated request gets 401 whatever its body and changes nothing. A
body over `MAX_BODY_BYTES` gets 413 (read no further); a bad body gets 422
naming the fields, never echoing what was sent; an index outside
0..count+spares-1 gets 404; a body that is not JSON (by Content-Type or content), not UTF-8, nests too
deeply, repeats a key or holds an integer of more than 20 digits gets 422
like any other invalid body (`parse_body`); a generation further ahead of this process's clock
than `control.MAX_GENERATION_AHEAD_S` gets 422. None of them changes state.
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
import time
from collections.abc import Callable

import uvicorn
from fastapi import FastAPI, HTTPException, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse

from pydantic import BaseModel, ValidationError

from elastic_jax import contract
from elastic_jax.api.control import (MAX_GENERATION_AHEAD_S, MAX_STATUS_WAIT_S, ControllerStatus, SliceReport,
                                      SliceReportResult, StopRequest)
from elastic_jax.api.job import INT64_MAX
from elastic_jax.controller import http_limits
from elastic_jax.controller.elastic.slice_set import SliceSet
from elastic_jax.controller.metrics import ControllerMetrics
from elastic_jax.controller.status_feed import StatusFeed

_logger = logging.getLogger(__name__)

# Paths served without a token: the kubelet's probes.
PUBLIC_PATHS = frozenset({"/healthz", "/readyz"})
# The largest request body read. The largest valid slice report (256 addresses of
# 300 characters, a 1024-character reason) is about 80 KiB; a real one is well under
# 10 KiB. Anything bigger is refused (413) before it is buffered or parsed.
MAX_BODY_BYTES = 128 * 1024


class _Guard:
    """ASGI middleware: bearer token on every non-public path, then a body size cap.

    Pure ASGI (not FastAPI's `@app.middleware`), so it answers 401 or 413
    without reading the body, and counts the bytes of a body sent without a
    Content-Length as they arrive.

    Args:
      app: the wrapped ASGI app.
      token: the bearer token.
      max_body_bytes: the body size cap.
    """

    def __init__(self, app, token: str, max_body_bytes: int):
        self.app = app
        self._expected = f"Bearer {token}".encode()
        self._max = max_body_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        if scope["path"] not in PUBLIC_PATHS and not hmac.compare_digest(
                headers.get(b"authorization", b""), self._expected):
            return await JSONResponse({"detail": "missing or invalid bearer token"}, status_code=401,
                                      headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self._max):
            return await self._too_large(scope, receive, send)
        received = 0
        answered = False  # this middleware sent the 413; drop whatever the app sends after

        async def limited_receive():
            nonlocal received, answered
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self._max and not answered:
                    answered = True
                    await self._too_large(scope, receive, send)
                    return {"type": "http.disconnect"}  # the app stops reading and gives up
            return message

        async def guarded_send(message):
            if not answered:
                await send(message)

        await self.app(scope, limited_receive, guarded_send)

    async def _too_large(self, scope, receive, send):
        await JSONResponse({"detail": f"request body over {self._max} bytes"}, status_code=413,
                           headers={"Connection": "close"})(scope, receive, send)


def _validation_errors(error: RequestValidationError) -> list[dict[str, object]]:
    """Field paths and messages of a bad request, without the input or context (never echo a body)."""
    return [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", ""))[:200], "type": e.get("type", "")}
            for e in error.errors()[:20]]


# The longest integer literal a body may hold: a generation is an int64 (19 digits and a sign).
# Longer ones are refused as out of range by field (Python's own int() refuses 4300+ digits,
# which FastAPI answered with a bare 400).
_MAX_INT_DIGITS = 20


class _OutOfRangeInt:
    """Stands in for an integer literal of more than `_MAX_INT_DIGITS` digits while parsing a body."""

    def __init__(self, digits: int):
        self.digits = digits


def _body_error(loc: tuple, msg: str, type_: str = "json_invalid") -> RequestValidationError:
    return RequestValidationError([{"loc": ("body", *loc), "msg": msg, "type": type_}])


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    seen: dict[str, object] = {}
    for key, value in pairs:
        if key in seen:
            raise _body_error((key,), "key appears twice in one object", "json_duplicate_key")
        seen[key] = value
    return seen


def parse_body(raw: bytes, model: type[BaseModel], content_type: str | None = "application/json") -> BaseModel:
    """Parses and validates a JSON request body; every invalid body is one `RequestValidationError` (422).

    Refused, each with the field (`loc`) named where there is one: a
    Content-Type other than application/json (a missing one too), bytes that
    are not UTF-8, malformed JSON, nesting too deep, a key repeated in one
    object (which value would win is parser-dependent), an integer literal of
    more than `_MAX_INT_DIGITS` digits (out of range for every field), and
    anything `model` refuses. Messages never echo the input.

    Args:
      raw: the request body.
      model: the pydantic model of the body.
      content_type: the request's Content-Type header (None: missing).

    Raises:
      RequestValidationError: the body is invalid (locs start with "body").
    """
    if (content_type or "").split(";")[0].strip().lower() != "application/json":
        raise _body_error((), "Content-Type must be application/json", "content_type")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _body_error((), f"not UTF-8 (byte {e.start})") from None

    def parse_int(literal: str) -> object:
        digits = len(literal.lstrip("-"))
        return _OutOfRangeInt(digits) if digits > _MAX_INT_DIGITS else int(literal)

    try:
        data = json.loads(text, parse_int=parse_int, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as e:
        raise _body_error((), f"invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    except RecursionError:
        raise _body_error((), "JSON nested too deeply") from None
    try:
        return model.model_validate(data, strict=True)
    except ValidationError as e:
        errors = []
        for err in e.errors():
            bad = err.get("input")
            msg = (f"integer of {bad.digits} digits is out of range" if isinstance(bad, _OutOfRangeInt)
                   else err.get("msg", ""))
            errors.append({"loc": ("body", *err.get("loc", ())), "msg": msg, "type": err.get("type", "")})
        raise RequestValidationError(errors) from None


def create_app(
    slice_set: SliceSet,
    status: Callable[[], ControllerStatus],
    metrics: ControllerMetrics,
    token: str,
    ready: Callable[[], bool],
    stop: Callable[[str], bool] | None = None,
    stalled: Callable[[], str | None] | None = None,
) -> FastAPI:
    """Builds the FastAPI app.

    Args:
      slice_set: receives slice reports.
      status: returns the current status (called per request, and every `status_feed.TICK_S` while a
        long poll waits; its `version` is set by the app's `StatusFeed`).
      metrics: the registry served at /metrics.
      token: the bearer token required on /v1/*.
      ready: readiness predicate for /readyz.
      stop: `stop(reason) -> accepted` for `POST /v1/stop`; False (not
        started yet) answers 409. None: the endpoint answers 409.
      stalled: `stalled() -> reason | None` (the no-progress watchdog); a
        reason makes `/healthz` answer 503. None: always healthy.

    Raises:
      ValueError: empty token (an API without auth is never served).
    """
    if not token:
        raise ValueError("the control API needs a non-empty bearer token")
    app = FastAPI(title="elastic-jax controller", version="v1", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(_Guard, token=token, max_body_bytes=MAX_BODY_BYTES)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_request, error: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": _validation_errors(error)}, status_code=422)

    @app.get("/healthz", response_class=PlainTextResponse)
    def healthz() -> Response:
        reason = stalled() if stalled is not None else None
        if reason:  # public: the reason itself goes to the log (and the pod's termination message)
            return PlainTextResponse("stalled", status_code=503)
        return PlainTextResponse("ok")

    @app.get("/readyz", response_class=PlainTextResponse)
    def readyz() -> Response:
        if ready():
            return PlainTextResponse("ready")
        return PlainTextResponse("not ready", status_code=503)

    feed = StatusFeed(status)

    @app.get("/v1/status", response_model=ControllerStatus, response_model_by_alias=True)
    async def get_status(
        request: Request,
        after: int | None = Query(default=None, ge=0, le=INT64_MAX,
                                  description="the version the caller has: wait while the status still has it"),
        wait: float = Query(default=0.0, ge=0.0, le=MAX_STATUS_WAIT_S, allow_inf_nan=False,
                            description="seconds to wait at most for the version to move"),
    ) -> ControllerStatus:
        return await feed.answer(after, wait, lambda: run_in_threadpool(feed.current), request.is_disconnected)

    @app.put("/v1/slices/{index}", response_model=SliceReportResult, response_model_by_alias=True)
    async def put_slice(index: int, request: Request) -> SliceReportResult:
        report = parse_body(await request.body(), SliceReport, request.headers.get("content-type"))
        try:
            return await run_in_threadpool(_apply_slice_report, index, report)
        finally:
            feed.poke()

    def _apply_slice_report(index: int, report: SliceReport) -> SliceReportResult:
        ahead_s = (report.generation - time.time_ns()) / 1e9
        if ahead_s > MAX_GENERATION_AHEAD_S:
            # A generation far in the future would make every later report stale:
            # the slice would be locked out until the clock caught up (centuries for 2**63-1).
            raise HTTPException(status_code=422, detail=(
                f"generation is {ahead_s:.0f} s ahead of this controller's clock (at most "
                f"{MAX_GENERATION_AHEAD_S} s: generations are nanosecond timestamps)"))
        try:
            applied, generation = slice_set.apply_report(index, report)
        except IndexError as e:
            raise HTTPException(status_code=404, detail=str(e)) from None
        except ValueError as e:
            raise HTTPException(status_code=422, detail=str(e)) from None
        if applied:
            _logger.info("slice %d reported %s (generation %d)", index, report.state, report.generation)
        return SliceReportResult(applied=applied, slice_index=index, generation=generation)

    @app.post("/v1/stop", status_code=202)
    async def post_stop(http_request: Request) -> dict:
        request = parse_body(await http_request.body(), StopRequest, http_request.headers.get("content-type"))
        try:
            return await run_in_threadpool(_stop, request)
        finally:
            feed.poke()

    def _stop(request: StopRequest) -> dict:
        if stop is None or not stop(request.reason):
            raise HTTPException(status_code=409, detail="the run has not started; stop the process instead")
        _logger.info("stop requested: %s", request.reason, extra={"event": "stop_requested", "reason": request.reason})
        return {"stopping": True}

    @app.get("/metrics")
    def get_metrics() -> Response:
        return Response(metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return app


class ControlApiServer:
    """Serves the app with uvicorn in a daemon thread.

    Args:
      app: the FastAPI app.
      host: bind address (0.0.0.0 in a pod, 127.0.0.1 locally).
      port: TCP port; 0 picks a free one (read `port` after `start()`).
      read_timeout_s: seconds a client has to send a whole request before its connection is closed.
      max_connections: open connections at most; past it the longest-waiting incomplete request is closed
        (`http_limits.BoundedH11Protocol`).
    """

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = contract.CONTROLLER_PORT,
                 read_timeout_s: float = http_limits.READ_TIMEOUT_S,
                 max_connections: int = http_limits.MAX_CONNECTIONS):
        self._config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, lifespan="off",
                                      http=http_limits.bounded_protocol(read_timeout_s, max_connections))
        self._server = uvicorn.Server(self._config)
        self._thread: threading.Thread | None = None
        self.host = host
        self.port = port

    def start(self, timeout_s: float = 10.0) -> None:
        """Starts serving; returns once the socket listens.

        Raises:
          RuntimeError: the server did not start within `timeout_s` seconds (e.g. port in use).
        """
        self._thread = threading.Thread(target=self._server.run, name="control-api", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"control API could not listen on {self.host}:{self.port}")
            time.sleep(0.02)
        if self.port == 0:
            self.port = self._server.servers[0].sockets[0].getsockname()[1]

    def stop(self) -> None:
        """Stops serving and joins the thread."""
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=5)
