"""Slice worker process fixtures: real `elastic-jax-worker` processes on 127.0.0.1.

    def test_something(worker_factory):
        a, b = worker_factory.start_many(2)          # slice 0 and 1, started in parallel
        c = worker_factory(slice_index=2, host_devices=2)
        a.kill(signal.SIGKILL); a.restart()          # same address, fresh process

Every process the factory started is stopped in teardown by PID (SIGTERM,
then SIGKILL after a few seconds; a SIGSTOPped one gets SIGCONT first), and
teardown fails if one is still alive.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from elastic_jax.controller.elastic.errors import SliceDownError
from elastic_jax.controller.slice_client import SliceClient
from elastic_jax.local.processes import free_port

# A worker imports jax before it serves: about 2 s alone, more when the
# 2 cores are busy with other test processes.
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 5.0
# The installed console script when it sits beside this interpreter (the venv),
# else the same entry point through `-m`.
_SCRIPT = Path(sys.executable).with_name("elastic-jax-worker")
WORKER_COMMAND = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "elastic_jax.worker.main"]
# The job token every test worker requires (written to a file beside its log).
TOKEN = "test-worker-token"


class WorkerProcess:
    """One worker process (and its replacements after `restart`).

    Attributes:
      slice_index: the slice it serves.
      host_devices: its JAX CPU device count.
      port / address: where it listens ("127.0.0.1:port"); kept across restarts.
      popen: the current `subprocess.Popen`.
      log_path: its stderr (JSON lines), appended across restarts.
    """

    def __init__(self, slice_index: int, host_devices: int, log_dir: Path, extra_args: tuple[str, ...] = (),
                 env: dict[str, str] | None = None):
        self.slice_index = slice_index
        self.host_devices = host_devices
        self.extra_args = extra_args
        self.env = env
        self.token_file = log_dir / "token"
        if not self.token_file.exists():
            self.token_file.write_text(TOKEN)
        self.move_to(free_port())
        self.log_path = log_dir / f"worker-{slice_index}-{self.port}.log"
        self.popen: subprocess.Popen | None = None
        self.all_pids: list[int] = []

    def move_to(self, port: int) -> None:
        """Listen on `port` from the next `spawn` on."""
        self.port = port
        self.address = f"127.0.0.1:{port}"

    @property
    def pid(self) -> int:
        """PID of the current process."""
        assert self.popen is not None
        return self.popen.pid

    def spawn(self) -> None:
        """Start the process without waiting for it to serve (see `wait_ready`)."""
        command = [
            *WORKER_COMMAND,
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--slice-index", str(self.slice_index),
            "--host-devices", str(self.host_devices),
            "--token-file", str(self.token_file),
            *self.extra_args,
        ]  # fmt: skip
        env = {**os.environ, **self.env} if self.env else None
        with open(self.log_path, "ab") as log:
            self.popen = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          env=env)
        self.all_pids.append(self.popen.pid)

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> dict:
        """Poll Ping until this process answers; returns the Ping reply.

        Raises:
          RuntimeError: the process exited, or did not answer in `timeout_s` seconds.
        """
        deadline = time.monotonic() + timeout_s
        with SliceClient(self.slice_index, self.address, TOKEN) as client:
            while time.monotonic() < deadline:
                if self.popen.poll() is not None:
                    raise RuntimeError(f"worker exited with {self.popen.returncode}: {self.log_tail()}")
                try:
                    info = client.ping(timeout_s=1.0)
                except SliceDownError:
                    time.sleep(0.05)
                    continue
                if info["pid"] == self.pid:  # not a previous incarnation still stopping
                    return info
        raise RuntimeError(f"worker {self.address} not serving after {timeout_s} s: {self.log_tail()}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send `sig` to the current process (it is not waited for)."""
        os.kill(self.pid, sig)

    def request_stop(self) -> None:
        """Send SIGTERM to the current process if it is running (does not wait)."""
        if self.popen.poll() is None:
            os.kill(self.pid, signal.SIGCONT)  # a SIGSTOPped process cannot handle SIGTERM
            os.kill(self.pid, signal.SIGTERM)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """End the current process by PID: SIGTERM, then SIGKILL; returns its exit code."""
        self.request_stop()
        if self.popen.poll() is None:
            try:
                self.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.popen.wait(timeout_s)
        return self.popen.returncode

    def restart(self) -> dict:
        """Stop the current process and start a new one at the same address; returns its Ping reply."""
        self.stop()
        self.spawn()
        return self.wait_ready()

    def log_tail(self, chars: int = 2000) -> str:
        """The end of the worker's log, for failure messages."""
        return self.log_path.read_text(errors="replace")[-chars:]


class WorkerFactory:
    """Starts workers for one test and stops all of them afterwards."""

    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self.workers: list[WorkerProcess] = []

    def __call__(self, slice_index: int = 0, host_devices: int = 1, extra_args: tuple[str, ...] = (),
                 env: dict[str, str] | None = None) -> WorkerProcess:
        """Start one worker (with more command-line arguments and environment) and wait until it answers Ping."""
        return self.start_many(1, host_devices=host_devices, first_slice_index=slice_index, extra_args=extra_args,
                               env=env)[0]

    def start_many(self, count: int, host_devices: int = 1, first_slice_index: int = 0,
                   extra_args: tuple[str, ...] = (), env: dict[str, str] | None = None) -> list[WorkerProcess]:
        """Start `count` workers (slices first_slice_index, ...) in parallel; wait for all."""
        started = [WorkerProcess(first_slice_index + i, host_devices, self.log_dir, extra_args, env)
                   for i in range(count)]
        for worker in started:
            self.workers.append(worker)
            worker.spawn()
        for worker in started:
            try:
                worker.wait_ready()
            except RuntimeError:
                # free_port() can lose a race with another test process for
                # the port; a fresh worker simply takes another one.
                if worker.popen.poll() != 1 or "cannot bind" not in worker.log_tail():
                    raise
                worker.move_to(free_port())
                worker.spawn()
                worker.wait_ready()
        return started

    def stop_all(self) -> None:
        """Stop every process ever started (restarts included) and check none is left."""
        for worker in self.workers:  # all at once: each takes a moment to shut down
            worker.request_stop()
        for worker in self.workers:
            worker.stop()
        alive = [pid for worker in self.workers for pid in worker.all_pids if pid_alive(pid)]
        assert not alive, f"worker processes still running: {alive}"


def pid_alive(pid: int) -> bool:
    """Whether `pid` names a process (a zombie counts: reap what you started first)."""
    # Every pid here was reaped by Popen.wait, so "exists" means a live
    # process (or an unrelated reuse of the pid, which is vanishingly rare
    # within a test).
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def worker_factory() -> Iterator[WorkerFactory]:
    """A `WorkerFactory`; all its processes are stopped when the test ends."""
    with tempfile.TemporaryDirectory(prefix="elastic-jax-workers-") as log_dir:
        factory = WorkerFactory(Path(log_dir))
        try:
            yield factory
        finally:
            factory.stop_all()
