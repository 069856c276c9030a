"""A small JSON client for the Kubernetes REST API (stdlib only).

The agent runs one per node; importing the full ``kubernetes`` package would
cost ~40 MB per agent, so this speaks the few verbs it needs over
``http.client`` with the cluster CA and a client certificate.
"""

from __future__ import annotations

import http.client
import json
import ssl
import urllib.parse
from collections.abc import Iterator
from pathlib import Path


class ApiError(Exception):
    """The API server answered with a non-2xx status.

    Attributes:
        status: the HTTP status code.
        body: the decoded Status object (or ``{"message": raw text}``).
    """

    def __init__(self, method: str, path: str, status: int, body: dict):
        self.status = status
        self.body = body
        super().__init__(f"{method} {path}: {status} {body.get('reason', '')}: {body.get('message', '')}")


class KubeApi:
    """JSON requests against one API server.

    Args:
        host: API server host (an IP on loopback here).
        port: API server TLS port.
        pki_dir: folder with ``ca.crt``, ``admin.crt`` and ``admin.key``.
        timeout_s: per-request socket timeout.
    """

    def __init__(self, host: str, port: int, pki_dir: Path, timeout_s: float = 10.0):
        self.host, self.port, self.timeout_s = host, port, timeout_s
        self._ctx = ssl.create_default_context(cafile=str(pki_dir / "ca.crt"))
        self._ctx.load_cert_chain(str(pki_dir / "admin.crt"), str(pki_dir / "admin.key"))

    def _conn(self, timeout_s: float | None = None) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(self.host, self.port, context=self._ctx,
                                           timeout=timeout_s or self.timeout_s)

    def request(self, method: str, path: str, body: dict | None = None, *,
                query: dict | None = None, content_type: str = "application/json") -> dict:
        """Send one request and return the decoded JSON answer.

        Raises:
            ApiError: non-2xx answer.
            OSError: the server could not be reached.
        """
        if query:
            path = f"{path}?{urllib.parse.urlencode(query)}"
        conn = self._conn()
        try:
            data = None if body is None else json.dumps(body).encode()
            headers = {"Accept": "application/json"}
            if data is not None:
                headers["Content-Type"] = content_type
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
        finally:
            conn.close()
        try:
            decoded = json.loads(raw) if raw else {}
        except json.JSONDecodeError:
            decoded = {"message": raw.decode(errors="replace")}
        if resp.status >= 300:
            raise ApiError(method, path, resp.status, decoded)
        return decoded

    def get(self, path: str, **query) -> dict:
        return self.request("GET", path, query=query or None)

    def create(self, path: str, body: dict) -> dict:
        return self.request("POST", path, body)

    def merge_patch(self, path: str, body: dict) -> dict:
        return self.request("PATCH", path, body, content_type="application/merge-patch+json")

    def strategic_patch(self, path: str, body: dict) -> dict:
        return self.request("PATCH", path, body, content_type="application/strategic-merge-patch+json")

    def delete(self, path: str, body: dict | None = None) -> dict:
        return self.request("DELETE", path, body)

    def watch(self, path: str, resource_version: str, timeout_s: int = 60, **query) -> Iterator[dict]:
        """Yield watch events (``{"type": ..., "object": ...}``) until the server ends the stream.

        Raises:
            ApiError: the watch could not start (410 Gone means: list again).
        """
        q = {"watch": "1", "resourceVersion": resource_version,
             "timeoutSeconds": str(timeout_s), "allowWatchBookmarks": "true", **query}
        full = f"{path}?{urllib.parse.urlencode(q)}"
        conn = self._conn(timeout_s=timeout_s + 10)
        try:
            conn.request("GET", full, headers={"Accept": "application/json"})
            resp = conn.getresponse()
            if resp.status >= 300:
                raw = resp.read()
                raise ApiError("GET", full, resp.status, json.loads(raw or b"{}"))
            while True:
                line = resp.readline()
                if not line:
                    return
                event = json.loads(line)
                if event.get("type") == "ERROR":
                    obj = event.get("object", {})
                    raise ApiError("WATCH", full, obj.get("code", 500), obj)
                yield event
        finally:
            conn.close()
