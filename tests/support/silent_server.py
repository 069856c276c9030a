"""A loopback TCP server that accepts every connection and never answers (an API server or controller that
hangs behind a live connection): the kernel completes the handshake, no one reads the request."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import yaml


class SilentServer:
    """Listens on 127.0.0.1, accepts every connection, reads nothing, answers nothing; `stop()` ends it."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.listener.settimeout(0.1)  # accept() wakes to see stop(): closing a socket does not wake it
        self.stopping = threading.Event()
        self.accepted: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, name="silent-server", daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            self.accepted.append(conn)

    def kubeconfig(self, folder: Path) -> Path:
        """Writes `folder/kubeconfig` naming this server as the cluster (plain http, a dummy token)."""
        path = folder / "kubeconfig"
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "silent",
            "clusters": [{"name": "silent", "cluster": {"server": f"http://127.0.0.1:{self.port}"}}],
            "users": [{"name": "silent", "user": {"token": "not-a-secret"}}],
            "contexts": [{"name": "silent", "context": {"cluster": "silent", "user": "silent"}}]}))
        return path

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join()
        self.listener.close()
        for conn in self.accepted:
            conn.close()
