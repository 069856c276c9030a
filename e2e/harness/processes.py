"""Start long-running processes with a log and a PID file, and stop them by PID.

Every process the harness starts carries the environment variable
``E2E_LOCALCLUSTER=<cluster dir>``; pod processes inherit it from their node
agent. :func:`leftovers` finds any such process still alive by reading
``/proc/*/environ``, which is how the suite proves that nothing it started is
left running.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

MARKER_ENV = "E2E_LOCALCLUSTER"


@dataclass(frozen=True)
class Started:
    """A process we started: its name, PID and log file."""

    name: str
    pid: int
    log: Path


def start(name: str, argv: list[str], *, state_dir: Path, env: dict[str, str] | None = None,
          cwd: Path | None = None) -> Started:
    """Start ``argv`` in its own session, output to ``<state_dir>/logs/<name>.log``.

    The PID is written to ``<state_dir>/pids/<name>.pid`` so a later session
    (``python -m e2e.harness down``) can stop a cluster it did not start.

    Raises:
        FileNotFoundError: ``argv[0]`` does not exist.
    """
    logs = state_dir / "logs"
    pids = state_dir / "pids"
    logs.mkdir(parents=True, exist_ok=True)
    pids.mkdir(parents=True, exist_ok=True)
    log = logs / f"{name}.log"
    full_env = dict(os.environ if env is None else env)
    full_env[MARKER_ENV] = str(state_dir)
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=full_env, cwd=cwd, start_new_session=True)
    (pids / f"{name}.pid").write_text(str(proc.pid))
    # Popen objects reap their child when collected; keep the child reapable by
    # us through os.waitpid instead, so stop() works from any code path.
    proc.returncode = 0  # prevents the ResourceWarning on garbage collection
    return Started(name=name, pid=proc.pid, log=log)


def alive(pid: int) -> bool:
    """True when ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    if state == "Z":
        _reap(pid)
        return False
    return True


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def stop(pid: int, *, grace_s: float = 10.0, group: bool = True) -> None:
    """Stop ``pid`` (and its process group when ``group``): SIGTERM, then SIGKILL after ``grace_s``."""
    if not alive(pid):
        return
    kill = os.killpg if group else os.kill
    try:
        kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        _reap(pid)
        if not alive(pid):
            break
        time.sleep(0.1)
    try:
        kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + 5
    while alive(pid) and time.monotonic() < deadline:
        _reap(pid)
        time.sleep(0.05)


def read_pid(state_dir: Path, name: str) -> int | None:
    """PID recorded for ``name`` under ``state_dir``, or None."""
    try:
        return int((state_dir / "pids" / f"{name}.pid").read_text())
    except (FileNotFoundError, ValueError):
        return None


def forget(state_dir: Path, name: str) -> None:
    """Remove the PID file of a stopped process."""
    (state_dir / "pids" / f"{name}.pid").unlink(missing_ok=True)


def belongs(state_dir: Path, pid: int) -> bool:
    """True when process ``pid`` carries ``state_dir``'s marker environment (False: gone, or someone else's)."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    return f"{MARKER_ENV}={state_dir}".encode() in env.split(b"\0")


def leftovers(state_dir: Path) -> list[tuple[int, str]]:
    """Live processes whose environment says they belong to ``state_dir``: (pid, command line)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        if not belongs(state_dir, pid):
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if alive(pid):
            found.append((pid, cmd))
    return found


class LoggedProcess:
    """A child process a test starts itself (`self.proc`), its output appended to `log_path`; stopped by PID.

    Subclasses start it (`subprocess.Popen` into `self.proc`, output to `log_path`).

    Args:
      log_path: its stdout and stderr.
    """

    def __init__(self, log_path: Path):
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    def alive(self) -> bool:
        """Started and not exited."""
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM by PID, SIGKILL after `grace_s` seconds; `self.proc.returncode` is then its real exit status.

        Waits through `self.proc` (not `stop()`'s bare waitpid): a child reaped elsewhere reads as exit
        code 0 to Popen, so a SIGKILLed process looked like a clean exit.
        """
        if not self.alive():
            return
        try:
            os.kill(self.proc.pid, signal.SIGTERM)
            self.proc.wait(grace_s)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            pass
        try:
            os.kill(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(30)

    def log(self) -> str:
        """Its output so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
