"""The controller's control API (DESIGN.md, "Control API").

    GET  /healthz              process alive
    GET  /readyz               trainer built, checkpoint location reachable
    GET  /v1/status            ControllerStatus            (bearer token)
    PUT  /v1/slices/{index}    SliceReport -> SliceReportResult (bearer token)
    GET  /metrics              Prometheus text format

`/v1/*` needs `Authorization: Bearer <token>` (the per-job Secret). The check
runs in a middleware, before the body is read, so an unauthenticated request
gets 401 whatever its body and changes nothing. A bad body gets 422, an index
outside 0..count-1 gets 404, and neither changes state.
"""

from __future__ import annotations

import hmac
import logging
import threading
import time
from collections.abc import Callable

import uvicorn
from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse

from elastic_jax.api.control import ControllerStatus, SliceReport, SliceReportResult, StopRequest
from elastic_jax.controller.elastic.slice_set import SliceSet
from elastic_jax.controller.metrics import ControllerMetrics

_logger = logging.getLogger(__name__)


def create_app(
    slice_set: SliceSet,
    status: Callable[[], ControllerStatus],
    metrics: ControllerMetrics,
    token: str,
    ready: Callable[[], bool],
    stop: Callable[[str], bool] | None = None,
) -> FastAPI:
    """Builds the FastAPI app.

    Args:
      slice_set: receives slice reports.
      status: returns the current status (called per request).
      metrics: the registry served at /metrics.
      token: the bearer token required on /v1/*.
      ready: readiness predicate for /readyz.
      stop: `stop(reason) -> accepted` for `POST /v1/stop`; False (not
        started yet) answers 409. None: the endpoint answers 409.

    Raises:
      ValueError: empty token (an API without auth is never served).
    """
    if not token:
        raise ValueError("the control API needs a non-empty bearer token")
    app = FastAPI(title="elastic-jax controller", version="v1", docs_url=None, redoc_url=None)
    expected = f"Bearer {token}".encode()

    @app.middleware("http")
    async def require_token(request: Request, call_next):
        if request.url.path.startswith("/v1/"):
            given = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                return JSONResponse({"detail": "missing or invalid bearer token"}, status_code=401,
                                    headers={"WWW-Authenticate": "Bearer"})
        return await call_next(request)

    @app.get("/healthz", response_class=PlainTextResponse)
    def healthz() -> str:
        return "ok"

    @app.get("/readyz", response_class=PlainTextResponse)
    def readyz() -> Response:
        if ready():
            return PlainTextResponse("ready")
        return PlainTextResponse("not ready", status_code=503)

    @app.get("/v1/status", response_model=ControllerStatus, response_model_by_alias=True)
    def get_status() -> ControllerStatus:
        return status()

    @app.put("/v1/slices/{index}", response_model=SliceReportResult, response_model_by_alias=True)
    def put_slice(index: int, report: SliceReport) -> SliceReportResult:
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
    def post_stop(request: StopRequest) -> dict:
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
    """

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 8080):
        self._config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, lifespan="off")
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
