"""Stand-ins for the Pathways processes (standard library only, plus PyYAML for the controller's manifest).

No Pathways image runs off Google Cloud. These play the network parts that
matter for start-up and head restarts, in the pods the operator renders,
with the rendered ports, arguments and environment. Two users:

- ``e2e/kind/test_pathways_standin.py`` (kind): the test puts this file in the
  rendered pods (a ConfigMap) and runs one role per container.
- ``e2e/test_pathways_operator.py`` (local control plane): the node agent's
  image table (``e2e/nodeagent/images.py``) runs the pinned Pathways images
  as the ``server`` and ``proxy`` roles, and a test image as ``controller``,
  so the *operator* renders, creates and restarts everything.

Each server listens on the pod's own IP (the pod's hostname as its
``/etc/hosts`` gives it), and an address the renderer gives as 127.0.0.1 (the
proxy's resource manager, the controller's proxy) means this pod's IP: on a
real kubelet that is the same pod, and on the local control plane, where every
pod shares the host's network, 127.0.0.1 would be any pod's.

Roles:

- ``server``: Google's ``server`` image, which is the resource manager with
  ``--node_type=resource_manager`` and a TPU worker otherwise.
- ``rm``: the resource manager. Listens on ``--server_port`` (29001) and the
  second port the references open (29002); a worker registers with one line
  ``REGISTER <slice> <host>`` and gets ``OK <this pod>``; the connection stays
  open, as a Pathways worker's does, and the registration ends with it.
  ``STATUS`` answers ``SLICES <slice> ...`` (one entry per registered host).
  With ``$STANDIN_RM_HOLD_DIR`` set (the node agent's image table sets it), a
  file ``<that dir>/<namespace>.<pod>`` keeps the resource manager from
  listening while it exists: a test holds the head in its start-up that way. With ``$STANDIN_STATE``, each
  registration is also a line in ``$STANDIN_STATE/registered``.
- ``proxy``: the IFRT proxy. Listens on ``--server_port`` (29000).
- ``controller``: the user's JAX program. With ``$STANDIN_EXPECTED`` (kind):
  ``/readyz`` answers 200 only once that many workers registered and the proxy
  answers. Without it (under the operator): the control API the operator
  drives (bearer token from ``$ELASTIC_JAX_TOKEN_FILE``; ``GET /v1/status``,
  ``PUT /v1/slices/{i}``, ``/healthz``, ``/readyz``), as the real controller on
  Pathways: ``/readyz`` turns 200 once ``jax.devices()`` would return (one
  slice registered with the resource manager, the proxy answering); a slice is
  active when registered and reported Ready by the operator; fewer active than
  ``spec.slices.minSlices`` is the pause (phase ``WaitingForSlices``),
  otherwise ``Running``, one step a second ("training"), exit 0 after
  ``spec.training.steps``.
- ``worker``: a Pathways worker. Connects to ``--resource_manager_address``
  exactly as rendered (the kubelet expanded ``$(PATHWAYS_HEAD)``), retrying
  every second while the name does not resolve or nobody listens (what a
  worker started before its head does), registers, prints
  ``registered with <pod>``, and connects again when that head goes away.

Usage: ``python pathways_standin.py ROLE [rendered args ...]``.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import signal
import socket
import sys
import threading
import time


def _flag(args: list[str], name: str) -> str:
    prefix = f"--{name}="
    return next(a[len(prefix):] for a in args if a.startswith(prefix))


def _log(message: str) -> None:
    print(message, flush=True)


def _pod_ip() -> str:
    """This pod's IP: its hostname in the pod's /etc/hosts (the kubelet, and the node agent, write it)."""
    return socket.gethostbyname(os.environ["HOSTNAME"])


def _here(host: str) -> str:
    """A rendered address: 127.0.0.1 is this pod (see the module docstring)."""
    return _pod_ip() if host in ("127.0.0.1", "localhost") else host


def _listen(port: int, handle) -> threading.Thread:
    server = socket.create_server((_pod_ip(), port))
    server.listen(64)

    def loop() -> None:
        while True:
            conn, _ = server.accept()
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def _state_file() -> str | None:
    folder = os.environ.get("STANDIN_STATE")
    return os.path.join(folder, "registered") if folder else None


def resource_manager(args: list[str]) -> None:
    pod = os.environ.get("HOSTNAME", "?")
    lock = threading.Lock()
    registered: dict[int, tuple[str, str]] = {}  # connection id -> (slice, host)
    if _state_file():
        open(_state_file(), "w").close()  # a restarted RM forgets every worker, as the real one does
    hold = os.environ.get("STANDIN_RM_HOLD_DIR")
    hold = hold and os.path.join(hold, f"{os.environ.get('POD_NAMESPACE', '')}.{pod}")
    if hold and os.path.exists(hold):
        _log(f"held: not listening while {hold} exists")
    while hold and os.path.exists(hold):
        time.sleep(0.2)  # not listening: the startupProbe does not pass

    def handle(conn: socket.socket) -> None:
        with conn:
            line = conn.makefile("r").readline().split()
            if line == ["STATUS"]:
                with lock:
                    slices = " ".join(s for s, _ in registered.values())
                conn.sendall(f"SLICES {slices}\n".encode())
                return
            if len(line) != 3 or line[0] != "REGISTER":
                return
            with lock:
                registered[id(conn)] = (line[1], line[2])
                if _state_file():
                    with open(_state_file(), "a") as f:
                        f.write(f"{line[1]} {line[2]}\n")
            _log(f"registered slice {line[1]} host {line[2]}")
            conn.sendall(f"OK {pod}\n".encode())
            try:
                while conn.recv(1024):  # held open until the worker goes
                    pass
            except OSError:
                pass
            with lock:
                registered.pop(id(conn), None)
            _log(f"slice {line[1]} host {line[2]} gone")

    port = int(_flag(args, "server_port"))
    _listen(port + 1, lambda c: c.close())
    _log(f"resource manager listening on {_pod_ip()}:{port}")
    _listen(port, handle).join()


def proxy(args: list[str]) -> None:
    _listen(int(_flag(args, "server_port")), lambda c: c.close()).join()


def server(args: list[str]) -> None:
    """Google's server image: the resource manager or a TPU worker, as its flags say."""
    (resource_manager if "--node_type=resource_manager" in args else worker)(args)


def _answers(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=2).close()
    except OSError:
        return False
    return True


def _registered_slices(rm_port: int = 29001) -> set[int] | None:
    """Slices with a host registered with this pod's resource manager (None: it does not answer)."""
    try:
        with socket.create_connection((_pod_ip(), rm_port), timeout=2) as conn:
            conn.sendall(b"STATUS\n")
            reply = conn.makefile("r").readline().split()
    except OSError:
        return None
    return {int(s) for s in reply[1:]} if reply[:1] == ["SLICES"] else None


def _expected_controller(_args: list[str]) -> None:
    expected = int(os.environ["STANDIN_EXPECTED"])

    def ready() -> bool:
        try:
            with open(_state_file()) as f:
                registered = len(f.readlines())
        except OSError:
            return False
        return _answers(_pod_ip(), 29000) and registered >= expected

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            ok = self.path == "/healthz" or (self.path == "/readyz" and ready())
            self.send_response(200 if ok else 503)
            self.end_headers()

        def log_message(self, *_a) -> None:
            pass

    http.server.ThreadingHTTPServer((_pod_ip(), int(os.environ.get("ELASTIC_JAX_PORT", "8080"))),
                                    Handler).serve_forever()


class _Training:
    """The operator-driven controller's state: slices the operator reported, steps made."""

    def __init__(self, spec: dict):
        slices = spec.get("slices") or {}
        self.count = int(slices.get("count", 1))
        self.min_slices = int(slices.get("minSlices") or self.count)
        self.total_steps = int((spec.get("training") or {}).get("steps", 1))
        self.lock = threading.Lock()
        self.reports: dict[int, tuple[str, int, list[str]]] = {}  # slice -> (state, generation, addresses)
        self.visible: set[int] = set()
        self.step = 0
        self.phase = "Starting"

    def report(self, index: int, body: dict) -> dict:
        with self.lock:
            generation = int(body["generation"])
            last = self.reports.get(index, ("", -1, []))[1]
            applied = generation > last
            if applied:
                self.reports[index] = (body["state"], generation, list(body.get("addresses") or []))
            _log(f"slice {index} reported {body['state']} (applied {applied})")
            return {"applied": applied, "sliceIndex": index, "generation": max(generation, last)}

    def active(self) -> list[int]:
        return sorted(i for i in self.visible if self.reports.get(i, ("",))[0] == "Ready")

    def tick(self) -> None:
        """One second of the training loop: list the devices, then step or pause."""
        visible = _registered_slices()
        with self.lock:
            self.visible = visible or set()
            active = self.active()
            if not self.visible or not _answers(_pod_ip(), 29000):
                self.phase = "Starting"  # jax.devices() has not returned
            elif len(active) < self.min_slices:
                self.phase = "WaitingForSlices"
            else:
                self.phase = "Running"
                self.step += 1
        if self.step >= self.total_steps:
            _log(f"trained {self.step} steps")
            os._exit(0)

    def status(self) -> dict:
        with self.lock:
            active = self.active()
            views = []
            for i in range(self.count):
                state, generation, addresses = self.reports.get(i, ("Unknown", 0, []))
                shown = "Active" if i in active else state if state in ("Ready", "Down", "Draining") else "Unknown"
                views.append({"index": i, "state": shown, "generation": generation, "addresses": addresses,
                              "failures": 0})
            return {"phase": self.phase, "step": self.step, "totalSteps": self.total_steps,
                    "desiredSlices": self.count, "minSlices": self.min_slices, "activeSlices": active,
                    "inactiveSlices": [i for i in range(self.count) if i not in active], "slices": views,
                    "pid": os.getpid()}


def _operator_controller(_args: list[str]) -> None:
    import yaml  # the controller's environment has it (elastic-jax depends on PyYAML)

    with open(os.environ["ELASTIC_JAX_MANIFEST"]) as f:
        training = _Training(yaml.safe_load(f)["spec"])
    with open(os.environ["ELASTIC_JAX_TOKEN_FILE"]) as f:
        token = f.read().strip()
    slice_path = re.compile(r"^/v1/slices/(\d+)$")

    class Handler(http.server.BaseHTTPRequestHandler):
        def _reply(self, code: int, body: dict | None = None) -> None:
            data = json.dumps(body or {}).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self) -> bool:
            if self.headers.get("Authorization") == f"Bearer {token}":
                return True
            self._reply(401, {"detail": "unauthorized"})
            return False

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path == "/healthz":
                self._reply(200)
            elif self.path == "/readyz":
                self._reply(200 if training.phase != "Starting" else 503)
            elif self.path == "/v1/status" and self._authorized():
                self._reply(200, training.status())
            elif self.path != "/v1/status":
                self._reply(404)

        def do_PUT(self) -> None:  # noqa: N802
            m = slice_path.match(self.path)
            if not self._authorized():
                return
            if m is None:
                self._reply(404)
                return
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            self._reply(200, training.report(int(m.group(1)), body))

        def log_message(self, *_a) -> None:
            pass

    def loop() -> None:
        while True:
            training.tick()
            time.sleep(1)

    threading.Thread(target=loop, daemon=True).start()
    host = os.environ.get("ELASTIC_JAX_HOST") or _pod_ip()
    _log(f"controller stand-in: control API on {host}:{os.environ.get('ELASTIC_JAX_PORT', '8080')}")
    http.server.ThreadingHTTPServer((host, int(os.environ.get("ELASTIC_JAX_PORT", "8080"))), Handler).serve_forever()


def controller(args: list[str]) -> None:
    (_expected_controller if os.environ.get("STANDIN_EXPECTED") else _operator_controller)(args)


def worker(args: list[str]) -> None:
    host, _, port = _flag(args, "resource_manager_address").rpartition(":")
    slice_id, me = os.environ["MEGASCALE_SLICE_ID"], os.environ.get("HOSTNAME") or socket.gethostname()
    _log(f"resource manager address {host}:{port}")
    while True:
        try:
            conn = socket.create_connection((_here(host), int(port)), timeout=5)
        except OSError as e:
            _log(f"resource manager not reachable yet: {e}")
            time.sleep(1)
            continue
        with conn:
            conn.settimeout(None)
            conn.sendall(f"REGISTER {slice_id} {me}\n".encode())
            reply = conn.makefile("r").readline().split()
            if reply[:1] == ["OK"]:
                _log(f"registered with {reply[1]}")
                try:
                    while conn.recv(1024):
                        pass
                except OSError:
                    pass
                _log("resource manager gone")
        time.sleep(1)


ROLES = {"server": server, "rm": resource_manager, "proxy": proxy, "controller": controller, "worker": worker}


def exit_on_sigterm() -> None:
    """SIGTERM ends the stand-in at once (exit status 128 + 15), as it ends the processes it stands in for.

    On kind each role is its container's PID 1, and the kernel does not deliver a signal to PID 1
    that has no handler: a deleted pod then waited its whole grace period (30 s for a worker, 60 s
    for the head) for the kubelet's SIGKILL.
    """
    signal.signal(signal.SIGTERM, lambda signum, _frame: os._exit(128 + signum))


if __name__ == "__main__":
    exit_on_sigterm()
    ROLES[sys.argv[1]](sys.argv[2:])
