"""Stand-ins for the Pathways processes, for ``test_pathways_standin.py`` (standard library only).

No Pathways image runs off Google Cloud. These play the network parts that
matter for start-up and head restarts, in the pods the operator renders,
with the rendered ports, arguments and environment:

- ``rm``: the resource manager. Listens on ``--server_port`` (29001) and the
  second port the references open (29002); a worker registers with one line
  ``REGISTER <slice> <host>`` and gets ``OK <this pod>``; the connection stays
  open, as a Pathways worker's does. Each registration is one line in
  ``$STANDIN_STATE/registered``.
- ``proxy``: the IFRT proxy. Listens on ``--server_port`` (29000).
- ``controller``: the user's JAX program. ``/readyz`` answers 200 only once
  ``$STANDIN_EXPECTED`` workers registered and the proxy answers, as the real
  controller is Ready only after ``jax.devices()`` (which needs the workers
  registered) returned; ``/healthz`` always 200.
- ``worker``: a Pathways worker. Connects to ``--resource_manager_address``
  exactly as rendered (the kubelet expanded ``$(PATHWAYS_HEAD)``), retrying
  every second while the name does not resolve or nobody listens (what a
  worker started before its head does), registers, prints
  ``registered with <pod>``, and connects again when that head goes away.

Usage: ``python pathways_standin.py ROLE [rendered args ...]``.
"""

from __future__ import annotations

import http.server
import os
import socket
import sys
import threading
import time


def _flag(args: list[str], name: str) -> str:
    prefix = f"--{name}="
    return next(a[len(prefix):] for a in args if a.startswith(prefix))


def _log(message: str) -> None:
    print(message, flush=True)


def _listen(port: int, handle) -> threading.Thread:
    server = socket.create_server(("0.0.0.0", port), reuse_port=False)
    server.listen(64)

    def loop() -> None:
        while True:
            conn, _ = server.accept()
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def _state_file() -> str:
    return os.path.join(os.environ["STANDIN_STATE"], "registered")


def resource_manager(args: list[str]) -> None:
    pod = os.environ.get("HOSTNAME", "?")
    lock = threading.Lock()
    open(_state_file(), "w").close()  # a restarted RM forgets every worker, as the real one does

    def handle(conn: socket.socket) -> None:
        with conn:
            line = conn.makefile("r").readline().split()
            if len(line) != 3 or line[0] != "REGISTER":
                return
            with lock, open(_state_file(), "a") as f:
                f.write(f"{line[1]} {line[2]}\n")
            _log(f"registered slice {line[1]} host {line[2]}")
            conn.sendall(f"OK {pod}\n".encode())
            while conn.recv(1024):  # held open until the worker goes
                pass

    port = int(_flag(args, "server_port"))
    _listen(port + 1, lambda c: c.close())
    _listen(port, handle).join()


def proxy(args: list[str]) -> None:
    _listen(int(_flag(args, "server_port")), lambda c: c.close()).join()


def controller(_args: list[str]) -> None:
    expected = int(os.environ["STANDIN_EXPECTED"])

    def ready() -> bool:
        try:
            with open(_state_file()) as f:
                registered = len(f.readlines())
            socket.create_connection(("127.0.0.1", 29000), timeout=2).close()
        except OSError:
            return False
        return registered >= expected

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            ok = self.path == "/healthz" or (self.path == "/readyz" and ready())
            self.send_response(200 if ok else 503)
            self.end_headers()

        def log_message(self, *_a) -> None:
            pass

    http.server.ThreadingHTTPServer(("0.0.0.0", int(os.environ.get("ELASTIC_JAX_PORT", "8080"))),
                                    Handler).serve_forever()


def worker(args: list[str]) -> None:
    host, _, port = _flag(args, "resource_manager_address").rpartition(":")
    slice_id, me = os.environ["MEGASCALE_SLICE_ID"], socket.gethostname()
    _log(f"resource manager address {host}:{port}")
    while True:
        try:
            conn = socket.create_connection((host, int(port)), timeout=5)
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


if __name__ == "__main__":
    {"rm": resource_manager, "proxy": proxy, "controller": controller, "worker": worker}[sys.argv[1]](sys.argv[2:])
