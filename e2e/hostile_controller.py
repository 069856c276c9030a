"""A hostile controller for the operator's e2e tests: serves the control API with answers a tenant's program
could send (`spec.controller.command: [python, e2e/hostile_controller.py, MODE]`).

MODE nan: a status with a NaN loss, an infinite initial loss and an infinite recovery time (Python's json
writes those literals), step 5. MODE int64: a status whose step is 2**64. Slice reports are acknowledged.
Listens where the operator renders the controller to listen (`ELASTIC_JAX_HOST`, port 8080); runs until
its pod is deleted.
"""

from __future__ import annotations

import http.server
import json
import os
import sys

from elastic_jax import contract

STATUS = {"phase": "Running", "step": 5, "totalSteps": 10**6, "desiredSlices": 1, "minSlices": 1,
          "activeSlices": [0], "inactiveSlices": [], "slices": [], "pid": os.getpid()}
MODES = {
    "nan": {**STATUS, "loss": float("nan"), "initialLoss": float("inf"),
            "recoveryHistory": [{"cause": "slice_down", "slices": [0], "atStep": 2, "seconds": float("inf")}]},
    "int64": {**STATUS, "step": 2**64},
}


class _Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _send(self, body: dict | str) -> None:
        data = (body if isinstance(body, str) else json.dumps(body)).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # noqa: N802
        self._send(MODES[self.server.mode] if self.path == "/v1/status" else "ok")

    def do_PUT(self):  # noqa: N802
        report = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        index = int(self.path.rsplit("/", 1)[1]) if self.path.startswith("/v1/slices/") else 0
        self._send({"applied": True, "sliceIndex": index, "generation": report.get("generation", 0)})


def main() -> None:
    server = http.server.ThreadingHTTPServer((os.environ.get(contract.ENV_HOST) or "127.0.0.1", contract.CONTROLLER_PORT),
                                           _Handler)
    server.mode = sys.argv[1]
    server.serve_forever()


if __name__ == "__main__":
    main()
