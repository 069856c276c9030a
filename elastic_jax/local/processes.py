"""Child processes of the local launcher: one controller, one worker per slice.

Each child gets its own process group so a stop reaches anything it spawned,
and its output goes to a log file (never an unread pipe, which would block it).
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _die_with_parent() -> None:
    """In the child, before exec: get SIGTERM when the launcher dies, even by SIGKILL.

    Without it a killed launcher leaves its controller and workers running
    (they are in their own sessions, so no terminal signal reaches them).
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on `host` a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_open(host: str, port: int, timeout_s: float = 0.2) -> bool:
    """True when something accepts TCP connections on host:port (a TCP readiness probe)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def venv_script(name: str) -> str:
    """Path of a console script installed beside the running interpreter."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def describe_exit(code: int | None) -> str:
    """How a process ended, in words a user reads: `killed by SIGKILL` (a negative code: the signal that
    killed it), `exit 143 (stopped by SIGTERM)` (128 + a signal: the convention of a process, such as the slice
    worker, that handles the signal and exits), `exit 1`; "still running" for None."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    if code > 128:
        try:
            return f"exit {code} (stopped by {signal.Signals(code - 128).name})"
        except ValueError:
            pass
    return f"exit {code}"


class Child:
    """One supervised child process.

    Args:
      name: for logs, e.g. "worker-1".
      argv: command line.
      log_path: stdout and stderr go here (appended: restarts keep history).
      env: extra environment variables.
      pass_fds: file descriptors the process inherits (the launcher's locks: held until it exits too).
    """

    def __init__(self, name: str, argv: list[str], log_path: Path, env: dict[str, str] | None = None,
                 pass_fds: tuple[int, ...] = ()):
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self.env = {**os.environ, **(env or {})}
        self.pass_fds = pass_fds
        self.popen: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        """Starts (or restarts) the process."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # (0600, never through a planted link: `open_private`)
        with os.fdopen(open_private(self.log_path, os.O_WRONLY | os.O_APPEND), "ab") as log:
            self.popen = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env,
                start_new_session=True, preexec_fn=_die_with_parent if sys.platform == "linux" else None,
                pass_fds=self.pass_fds,
            )
        self.starts += 1

    @property
    def pid(self) -> int | None:
        """PID of the current process (None before start)."""
        return None if self.popen is None else self.popen.pid

    def exit_code(self) -> int | None:
        """None while running; the exit code (negative: killed by that signal) once it ended."""
        return None if self.popen is None else self.popen.poll()

    def alive(self) -> bool:
        """Started and not yet exited."""
        return self.popen is not None and self.popen.poll() is None

    def stopped(self) -> bool:
        """Whether the process is stopped (SIGSTOP: state `T` in /proc); False when unknown or not running."""
        if not self.alive():
            return False
        try:
            stat = Path(f"/proc/{self.popen.pid}/stat").read_text()
        except OSError:
            return False
        return stat.rpartition(")")[2].split()[:1] in (["T"], ["t"])

    def signal(self, sig: int) -> None:
        """Sends `sig` to the process (not its group: a test kills exactly one process)."""
        if self.alive():
            os.kill(self.popen.pid, sig)

    def wait(self, timeout_s: float) -> int | None:
        """Waits up to `timeout_s` seconds for the process to exit; returns its exit code (None: still running)."""
        if self.popen is None:
            return None
        try:
            return self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, grace_s: float = 10.0) -> int | None:
        """SIGTERM to the process group, SIGKILL after `grace_s` seconds; returns the exit code."""
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGCONT)  # a SIGSTOPped child cannot handle SIGTERM
                os.killpg(self.popen.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.popen.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.popen.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.popen.wait(timeout=10)
        return self.popen.returncode

    def last_error_line(self) -> str:
        """The last line starting with `error:` in the log, else the last non-empty line."""
        try:
            lines = [ln for ln in self.log_path.read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return ""
        errors = [ln for ln in lines if ln.startswith("error:")]
        return (errors or lines or [""])[-1]


def wait_until(predicate, timeout_s: float, interval_s: float = 0.05) -> bool:
    """Polls `predicate()` until true or `timeout_s` seconds pass; returns the last result."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return bool(predicate())


class UnsafeDirectoryError(OSError):
    """A run folder (or one inside it) that another user could plant files or links in: a symbolic link, not a
    directory, owned by another user, or writable by group or others. The message is one line naming it."""


def private_dir(path: Path, what: str) -> Path:
    """Creates `path` (mode 0700, parents as needed), or checks an existing one is this user's alone.

    A folder others may write in lets them plant a symbolic link where the run writes a file (`launcher.lock`,
    a log, `metrics.prom`): the run would truncate or overwrite the file it points to. A world-writable
    compilation cache could hand the workers another user's executables.

    Args:
      path: the folder.
      what: its name in messages, e.g. "--workdir /tmp/run".

    Returns:
      `path`.

    Raises:
      UnsafeDirectoryError: `path` is a symbolic link, not a directory, another user's, or group/world-writable,
        or its parent folder is world-writable without the sticky bit (others could swap it for a link).
      OSError: it cannot be created (a missing parent that cannot be made, a parent that is a file).
    """
    import stat

    if not os.path.lexists(path):  # (a file or link there is judged below: mkdir said only "File exists")
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeDirectoryError(f"{what}: is a symbolic link; give a real folder (links are not followed)")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDirectoryError(f"{what}: is not a directory")
    parent = os.stat(path.absolute().parent)
    if parent.st_mode & 0o002 and not parent.st_mode & stat.S_ISVTX:
        # (/tmp is world-writable with the sticky bit: others may not rename what is yours there)
        raise UnsafeDirectoryError(f"{what}: its parent folder {path.absolute().parent} is writable by others "
                                   f"without the sticky bit (mode {stat.S_IMODE(parent.st_mode):04o}): they could "
                                   "replace the folder with a link; use a folder of your own")
    if st.st_uid != os.geteuid():
        raise UnsafeDirectoryError(f"{what}: belongs to another user (uid {st.st_uid}); use a folder of your own")
    if st.st_mode & 0o022:
        who = "others" if st.st_mode & 0o002 else "its group"
        raise UnsafeDirectoryError(f"{what}: is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o}): they could "
                                   "plant links in it; chmod go-w it, or use a folder of your own")
    return path


def open_private(path: Path, flags: int) -> int:
    """`os.open(path, flags | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0o600)`: a file of this run, never through a link.

    Raises:
      OSError: ELOOP when `path` is a symbolic link (planted: never followed), or any other open error.
    """
    return os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def write_private_file(path: Path, text: str) -> None:
    """Writes `text` to `path` readable by this user only (mode 0600), atomically.

    The file is created with mode 0600 by `os.open` (never world-readable, not
    even between a create and a chmod), in the same directory, then renamed
    over `path`: a reader sees the old file or the whole new one, and a
    pre-existing file with looser permissions is replaced, not reused.

    Raises:
      OSError: the directory is not writable.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
