"""Client for the controller's control API, used by the operator and the local launcher."""

from __future__ import annotations

import time

import httpx

from elastic_jax.api.control import ControllerStatus, SliceReport, SliceReportResult, SliceState, StopRequest


class ControlApiError(RuntimeError):
    """The controller refused a request (4xx) or stayed unreachable through every retry.

    Attributes:
      status_code: the HTTP status, or None when the controller was unreachable.
    """

    def __init__(self, message: str, status_code: int | None = None):
        super().__init__(message)
        self.status_code = status_code


class ControlClient:
    """Talks to one controller.

    Args:
      base_url: e.g. http://127.0.0.1:8080 or http://job-controller.ns.svc:8080.
      token: the bearer token from the job's Secret.
      timeout_s: per-request timeout in seconds.
    """

    def __init__(self, base_url: str, token: str, timeout_s: float = 2.0):
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.base_url, timeout=timeout_s, headers={"Authorization": f"Bearer {token}"}, trust_env=False
        )

    def close(self) -> None:
        """Closes the connection pool."""
        self._http.close()

    def _request(self, method: str, path: str, retries: int, backoff_s: float, **kwargs) -> httpx.Response:
        """Sends with exponential backoff on connection errors and 5xx; 4xx is final."""
        delay = backoff_s
        last: Exception | None = None
        for attempt in range(retries + 1):
            try:
                response = self._http.request(method, path, **kwargs)
            except httpx.TransportError as e:
                last = e
            else:
                if response.status_code < 400:
                    return response
                if response.status_code < 500:
                    raise ControlApiError(
                        f"{method} {path}: {response.status_code} {response.text[:300]}", response.status_code
                    )
                last = ControlApiError(f"{method} {path}: {response.status_code}", response.status_code)
            if attempt < retries:
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
        raise ControlApiError(f"{method} {self.base_url}{path}: unreachable after {retries + 1} tries ({last})")

    def report_slice(
        self,
        index: int,
        state: SliceState,
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
        response = self._request(
            "PUT", f"/v1/slices/{index}", retries, backoff_s, json=body.model_dump(mode="json", by_alias=True)
        )
        return SliceReportResult.model_validate(response.json())

    def status(self, retries: int = 0, backoff_s: float = 0.1) -> ControllerStatus:
        """`GET /v1/status`.

        Raises:
          ControlApiError: rejected or unreachable.
        """
        return ControllerStatus.model_validate(self._request("GET", "/v1/status", retries, backoff_s).json())

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
            return self._http.get("/readyz").status_code == 200
        except httpx.TransportError:
            return False

    def metrics_text(self) -> str:
        """`GET /metrics` (Prometheus text)."""
        return self._request("GET", "/metrics", 2, 0.1).text
