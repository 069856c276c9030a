"""Client for the controller's control API, used by the operator and the local launcher.

The controller runs a tenant's image or program (`spec.controller.image`,
`spec.controller.command`), so its answers are untrusted input to the
operator, which serves every tenant: each answer is read with a byte cap and
a deadline for the whole request, and a malformed one is a `ControlApiError`,
never an exception that escapes into the operator (a trial's controller that
streamed a 1 GB status body got the operator OOMKilled in a loop).
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pydantic

from elastic_jax.api.control import (MAX_STATUS_WAIT_S, ControllerStatus, ReportedState, SliceReport,
                                      SliceReportResult, StopRequest)

# Bytes of one answer the client reads at most. A status of 64 slices with its capped recovery history is
# tens of KiB; /metrics (histograms) some hundreds.
MAX_ANSWER_BYTES = 1 << 20
MAX_METRICS_BYTES = 8 << 20
# Requests one client may have in flight; exchanges a controller never finished count until it does.
MAX_IN_FLIGHT = 4


class ControlApiError(RuntimeError):
    """The controller refused a request (4xx) or stayed unreachable through every retry.

    Attributes:
      status_code: the HTTP status (with UNREACHABLE: the last 5xx), or None when no HTTP answer came or
        the answer was unusable.
      kind: INVALID (an answer too big, too slow or malformed, or too many unfinished: the controller
        answers wrongly), UNREACHABLE (no connection, or 5xx, through every retry: not up yet, or gone),
        or REFUSED (4xx: the controller refused the request).
    """

    INVALID, UNREACHABLE, REFUSED = "invalid", "unreachable", "refused"

    def __init__(self, message: str, status_code: int | None = None, kind: str | None = None):
        super().__init__(message)
        self.status_code = status_code
        self.kind = kind or (self.REFUSED if status_code is not None and status_code < 500 else self.UNREACHABLE)


class ControlClient:
    """Talks to one controller.

    Args:
      base_url: e.g. http://127.0.0.1:8080 or http://job-controller.ns.svc:8080.
      token: the bearer token from the job's Secret.
      timeout_s: per-request timeout in seconds.
    """

    def __init__(self, base_url: str, token: str, timeout_s: float = 2.0):
        self.base_url = base_url.rstrip("/")
        self._timeout_s = timeout_s
        self._http = httpx.Client(
            base_url=self.base_url, timeout=timeout_s, headers={"Authorization": f"Bearer {token}"}, trust_env=False
        )
        self._in_flight = threading.BoundedSemaphore(MAX_IN_FLIGHT)
        # Notified when an exchange ends or the client closes: a caller waiting on a long poll is let go.
        self._done = threading.Condition()
        self._closed = False

    def close(self) -> None:
        """Closes the connection pool; a caller waiting on an exchange returns at once (`ControlApiError`)."""
        with self._done:
            self._closed = True
            self._done.notify_all()
        self._http.close()

    def _send(self, method: str, path: str, max_bytes: int, timeout_s: float | None = None,
              **kwargs) -> tuple[int, bytes]:
        """One request: (status code, body), the body read up to `max_bytes`, the whole exchange (headers
        included) within `timeout_s` (None: the client's timeout).

        httpx's timeout bounds each read, so a controller that trickles its header block a byte at a time
        would hold the caller (an operator handler thread) for hours: the exchange runs on its own daemon
        thread and the caller waits at most twice the timeout plus 0.5 s (the second timeout only for an
        exchange still running after the first: a peer that sent nothing ends by httpx's read timeout,
        which may be late on a loaded machine, and is no answer, not a wrong one). An abandoned exchange keeps its slot until the
        controller ends it; with `MAX_IN_FLIGHT` slots taken, further requests fail at once.

        Raises:
          httpx.TransportError: connection failed.
          ControlApiError: the answer is larger than `max_bytes` or slower than the timeout, or
            `MAX_IN_FLIGHT` earlier exchanges are still unfinished (final: a controller that does this
            once does it again), or the client was closed meanwhile (UNREACHABLE).
        """
        timeout_s = self._timeout_s if timeout_s is None else timeout_s
        if not self._in_flight.acquire(blocking=False):
            raise ControlApiError(f"{method} {path}: {MAX_IN_FLIGHT} earlier requests still unanswered",
                                  kind=ControlApiError.INVALID)
        outcome: list = []

        def exchange() -> None:
            try:
                result = ("ok", self._exchange(method, path, max_bytes, timeout_s, **kwargs))
            except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
                result = ("error", e)
            finally:
                self._in_flight.release()
            with self._done:
                outcome.append(result)
                self._done.notify_all()

        worker = threading.Thread(target=exchange, name=f"control-api {method} {path}", daemon=True)
        worker.start()
        with self._done:  # (the body loop's own deadline ends a slow body first)
            self._done.wait_for(lambda: outcome or self._closed, timeout_s + 0.5)
            if not outcome and not self._closed:
                # A peer that sends nothing (a SIGSTOPped controller: the kernel accepts, nobody answers) ends
                # the exchange with httpx's own read timeout at ~timeout_s, a transport error: no answer. On a
                # loaded machine that thread can wake after the 0.5 s slack, and silence then read as a wrong
                # answer (ControllerAnswersRefused) instead of none (ControllerUnresponsive). One timeout more
                # tells them apart: a trickling peer keeps each read short, so its exchange is still running.
                self._done.wait_for(lambda: outcome or self._closed, timeout_s)
        if not outcome:
            if self._closed:
                raise ControlApiError(f"{method} {path}: client closed", kind=ControlApiError.UNREACHABLE)
            raise ControlApiError(f"{method} {path}: answer not complete within {timeout_s} s",
                                  kind=ControlApiError.INVALID)
        kind, value = outcome[0]
        if kind == "error":
            if self._closed and isinstance(value, RuntimeError):
                # httpx's "the client has been closed": a request sent as `close` ran (the job's controller
                # pod changed); the same answer as a caller already waiting gets.
                raise ControlApiError(f"{method} {path}: client closed", kind=ControlApiError.UNREACHABLE) from None
            raise value
        return value

    def _exchange(self, method: str, path: str, max_bytes: int, timeout_s: float, **kwargs) -> tuple[int, bytes]:
        """`_send`'s exchange, on its own thread: the body read up to `max_bytes` by the deadline."""
        deadline = time.monotonic() + timeout_s
        with self._http.stream(method, path, timeout=timeout_s, **kwargs) as response:
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > max_bytes:
                raise ControlApiError(f"{method} {path}: answer of {declared} bytes refused (at most {max_bytes})",
                                      kind=ControlApiError.INVALID)
            body = bytearray()
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > max_bytes:
                    raise ControlApiError(f"{method} {path}: answer longer than {max_bytes} bytes refused",
                                          kind=ControlApiError.INVALID)
                if time.monotonic() > deadline:
                    raise ControlApiError(f"{method} {path}: answer not complete within {timeout_s} s",
                                          kind=ControlApiError.INVALID)
            return response.status_code, bytes(body)

    def _request(self, method: str, path: str, retries: int, backoff_s: float, max_bytes: int = MAX_ANSWER_BYTES,
                 timeout_s: float | None = None, **kwargs) -> bytes:
        """Sends with exponential backoff on connection errors and 5xx; 4xx is final. Returns the body.

        Raises:
          ControlApiError: 4xx, an answer over `max_bytes` or the timeout, or unreachable after `retries`.
        """
        delay = backoff_s
        last: Exception | None = None
        for attempt in range(retries + 1):
            try:
                code, body = self._send(method, path, max_bytes, timeout_s, **kwargs)
            except httpx.TransportError as e:
                last = e
            else:
                if code < 400:
                    return body
                if code < 500:
                    raise ControlApiError(f"{method} {path}: {code} {body[:300].decode(errors='replace')}", code)
                last = ControlApiError(f"{method} {path}: {code}", code)
            if attempt < retries:
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
        # (the last 5xx's code stays: the process answered, so it is not frozen: `JobTracker.unanswered`)
        raise ControlApiError(f"{method} {self.base_url}{path}: unreachable after {retries + 1} tries ({last})",
                              last.status_code if isinstance(last, ControlApiError) else None,
                              kind=ControlApiError.UNREACHABLE)

    @staticmethod
    def _parse(model, method: str, path: str, body: bytes):
        """`model` from a JSON answer; a malformed answer is a ControlApiError naming what is wrong."""
        try:
            return model.model_validate(json.loads(body))
        except (ValueError, pydantic.ValidationError) as e:
            raise ControlApiError(f"{method} {path}: malformed answer: {str(e)[:300]}", kind=ControlApiError.INVALID) from None

    def report_slice(
        self,
        index: int,
        state: ReportedState,
        generation: int,
        addresses: list[str] | None = None,
        reason: str | None = None,
        retries: int = 5,
        backoff_s: float = 0.1,
    ) -> SliceReportResult:
        """`PUT /v1/slices/{index}`.

        Raises:
          ControlApiError: rejected (401/404/422) or unreachable after `retries`.
        """
        body = SliceReport(state=state, generation=generation, addresses=addresses or [], reason=reason)
        answer = self._request(
            "PUT", f"/v1/slices/{index}", retries, backoff_s, json=body.model_dump(mode="json", by_alias=True)
        )
        return self._parse(SliceReportResult, "PUT", f"/v1/slices/{index}", answer)

    def status(self, retries: int = 0, backoff_s: float = 0.1, after: int | None = None,
               wait_s: float = 0.0) -> ControllerStatus:
        """`GET /v1/status`; with `after` and `wait_s`, a long poll (docs/control-api.md).

        Args:
          retries, backoff_s: on connection errors and 5xx.
          after: the `version` the caller has; the controller answers once its status has another
            (at once when it already has), or when `wait_s` ends. A controller without versions
            (version 0 in its answers) answers at once.
          wait_s: seconds the controller may hold the answer, at most `control.MAX_STATUS_WAIT_S`;
            the exchange may take that long plus the client's timeout.

        Raises:
          ControlApiError: rejected or unreachable.
          ValueError: `wait_s` outside [0, MAX_STATUS_WAIT_S].
        """
        if not 0 <= wait_s <= MAX_STATUS_WAIT_S:
            raise ValueError(f"wait_s must be in [0, {MAX_STATUS_WAIT_S}], not {wait_s}")
        params = {} if after is None or wait_s <= 0 else {"after": after, "wait": wait_s}
        answer = self._request("GET", "/v1/status", retries, backoff_s, params=params,
                               timeout_s=self._timeout_s + (wait_s if params else 0.0))
        return self._parse(ControllerStatus, "GET", "/v1/status", answer)

    def stop(self, reason: str, retries: int = 0, backoff_s: float = 0.1) -> None:
        """`POST /v1/stop`: ask the run to stop (abandon the in-flight step, checkpoint, exit STOPPED).

        Raises:
          ControlApiError: rejected (401, 409 before the run started) or unreachable.
        """
        self._request("POST", "/v1/stop", retries, backoff_s,
                      json=StopRequest(reason=reason[:256]).model_dump(mode="json", by_alias=True))

    def ready(self) -> bool:
        """True when `GET /readyz` answers 200 (no retries)."""
        try:
            return self._send("GET", "/readyz", 4096)[0] == 200
        except (httpx.TransportError, ControlApiError):
            return False

    def metrics_text(self) -> str:
        """`GET /metrics` (Prometheus text)."""
        return self._request("GET", "/metrics", 2, 0.1, max_bytes=MAX_METRICS_BYTES).decode(errors="replace")
