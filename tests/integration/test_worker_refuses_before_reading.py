"""Issue 31 RISK 5: a slice worker refuses an unauthenticated call before it reads the request body.

A real worker process; 4 unauthenticated Step calls of 250 MiB each. Before the fix the refusal was a unary
handler, so gRPC read each whole body into the worker first (the review measured RSS 801 -> 1681 MB); now
the refusal never asks for the message, and HTTP/2 flow control holds the rest at the sender.
"""

from __future__ import annotations

import threading

import grpc
import psutil

from elastic_jax import wire

BODY_BYTES = 250 * 2**20
CALLS = 4


class PeakRss:
    """Samples a process's resident set size every 5 ms in a thread, keeping the peak (bytes)."""

    def __init__(self, pid: int):
        self.process = psutil.Process(pid)
        self.peak = self.process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __enter__(self) -> "PeakRss":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def test_unauthenticated_bodies_are_refused_without_being_read(worker_factory):
    worker = worker_factory()
    body = bytes(BODY_BYTES)
    before = psutil.Process(worker.pid).memory_info().rss
    codes = []
    with PeakRss(worker.pid) as rss, grpc.insecure_channel(worker.address, options=wire.CHANNEL_OPTIONS) as channel:
        call = channel.unary_unary(wire.method_path(wire.STEP))
        for _ in range(CALLS):
            try:
                call(body, metadata=wire.auth_metadata("wrong"), timeout=60)
            except grpc.RpcError as e:
                codes.append(e.code())
    assert codes == [grpc.StatusCode.UNAUTHENTICATED] * CALLS
    grown = rss.peak - before
    # One body read whole would be 250 MiB; a few flow-control windows are a few MiB.
    assert grown < 64 * 2**20, f"worker RSS grew {grown / 2**20:.0f} MiB (peak) for refused calls"
    assert worker.popen.poll() is None
