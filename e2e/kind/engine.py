"""A private Docker engine for the kind tier: install, start, guard, stop.

The kind tests need a Docker engine. This module starts one of its own, from
Debian's packages (``docker.io``, ``containerd``, ``runc``), with its sockets
and run state in a fresh temp dir and its image store (the layer cache that
makes a second run fast) in ``~/.cache/elastic-jax/docker`` (``E2E_DOCKER_DATA_ROOT``
moves it). It never touches a system engine: ``DOCKER_HOST`` points at our own
socket and the engine is stopped by PID when the tests end.

Three facts of the machine it was built on shape it (each measured there):

- The capability bounding set lacks ``CAP_SYS_RESOURCE``, so ``--privileged``
  containers (kind's nodes) fail in runc ("unable to apply caps"). The engine's
  default OCI runtime is a small wrapper (:data:`RUNTIME_WRAPPER`) that removes
  from the container's capability sets every capability this machine's
  bounding set lacks, then runs runc.
- No packet from a container network may leave the machine. The engine runs
  with ``--iptables=false --ip-forward=false`` (no masquerading, no forwarding
  turned on), and :func:`Engine.start` refuses to run when the host forwards
  IPv4 or IPv6 already, unless an ``iptables``/``ip6tables`` rule drops what a
  bridge would forward off itself (added here, removed at stop).
- No registry is reachable: images are built here (``e2e/kind/images.py``).

Command line, for a person running ``e2e/kind/run.sh`` by hand::

    python -m e2e.kind.engine start   # prints: export DOCKER_HOST=unix://...
    python -m e2e.kind.engine stop
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from e2e.harness import paths
from e2e.harness.apt import apt_get

DEBIAN_PACKAGES = ("docker.io", "containerd", "runc", "iptables", "mmdebstrap")
"""What the kind tier installs from Debian when missing (``apt-get``)."""

RUNTIME_NAME = "capdrop-runc"
"""The engine's default OCI runtime: :data:`RUNTIME_WRAPPER` in front of runc."""

STATE_FILE = Path(os.environ.get("E2E_DOCKER_STATE") or paths.build_dir() / "docker-engine.json")
"""Where ``python -m e2e.kind.engine start`` (and ``run.sh`` with ``KEEP_CLUSTER=1``) records the engine it
started: in this clone's build folder, so a printed ``stop`` acts on this clone's engine (one file in ``/tmp``
for every clone let another clone's stop command stop it, found by a new-user trial)."""

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 60.0

TEMP_DATA_ROOT_PREFIX = "ejx-docker-data-"
"""Name prefix of the temp image stores made when another engine holds the cache (in ``tempfile.gettempdir()``)."""

STALE_TEMP_ROOT_AGE_S = 300.0
"""A temp image store whose lock nobody holds is deleted at the next start once it is this old (seconds):
younger, it may be one being made right now, between its ``mkdtemp`` and its lock."""

# Runs for every container start and exec: stdlib only, no project import.
RUNTIME_WRAPPER = r'''#!/usr/bin/python3
"""OCI runtime wrapper (elastic-jax e2e): drop capabilities the host cannot grant, then exec runc.

runc applies a container's capability sets with capset(2), which fails for any
capability outside the calling process's bounding set. On machines whose
bounding set lacks some (CAP_SYS_RESOURCE here), every --privileged container
fails to start. This removes exactly those from the bundle's config.json
(create/run) or the --process file (exec) and passes everything else through.
"""
import json, os, sys

RUNC = "/usr/bin/runc"
NAMES = ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID",
         "CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE",
         "CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW",
         "CAP_IPC_LOCK", "CAP_IPC_OWNER", "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT",
         "CAP_SYS_PTRACE", "CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE",
         "CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE",
         "CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE",
         "CAP_MAC_ADMIN", "CAP_SYSLOG", "CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ",
         "CAP_PERFMON", "CAP_BPF", "CAP_CHECKPOINT_RESTORE"]


def missing():
    with open("/proc/self/status") as f:
        bnd = next(int(line.split()[1], 16) for line in f if line.startswith("CapBnd:"))
    return {name for bit, name in enumerate(NAMES) if not bnd >> bit & 1}


def strip(path, key_path):
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return
    caps = doc
    for key in key_path:
        caps = caps.get(key) if isinstance(caps, dict) else None
    if not isinstance(caps, dict):
        return
    drop = missing()
    changed = False
    for kind, names in caps.items():
        if isinstance(names, list) and drop.intersection(names):
            caps[kind] = [n for n in names if n not in drop]
            changed = True
    if changed:
        with open(path, "w") as f:
            json.dump(doc, f)


def option(args, name):
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


args = sys.argv[1:]
verb = next((a for a in args if not a.startswith("-") and a not in (option(args, "--root"),
             option(args, "--log"), option(args, "--log-format"))), None)
if verb in ("create", "run"):
    bundle = option(args, "--bundle") or option(args, "-b") or os.getcwd()
    strip(os.path.join(bundle, "config.json"), ("process", "capabilities"))
elif verb == "exec":
    process = option(args, "--process") or option(args, "-p")
    if process:
        strip(process, ("capabilities",))
os.execv(RUNC, [RUNC] + args)
'''


class EngineUnavailable(RuntimeError):
    """This machine cannot run the private engine (not root, no Debian packages); the message says why."""


def _cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "elastic-jax"


def default_data_root() -> Path:
    """The engine's image store: ``E2E_DOCKER_DATA_ROOT``, else ``~/.cache/elastic-jax/docker``."""
    return Path(os.environ.get("E2E_DOCKER_DATA_ROOT", _cache_root() / "docker"))


def why_unavailable() -> str | None:
    """None when :func:`ensure_packages` can work here, else the reason (for a pytest skip)."""
    if sys.platform != "linux":
        return "the kind tier needs Linux"
    if os.geteuid() != 0:
        return "the kind tier starts its own Docker engine, which needs root"
    if not all(shutil.which(t) for t in ("dockerd", "containerd", "runc", "mmdebstrap", "iptables")) \
            and shutil.which("apt-get") is None:
        return "dockerd/containerd/runc/mmdebstrap/iptables are missing and there is no apt-get to install them"
    return None


def ensure_packages(log=print) -> None:
    """Install :data:`DEBIAN_PACKAGES` with apt-get when any tool of theirs is missing.

    Raises:
        EngineUnavailable: not root, or no apt-get.
        subprocess.CalledProcessError: apt-get failed.
    """
    reason = why_unavailable()
    if reason:
        raise EngineUnavailable(reason)
    if all(shutil.which(t) for t in ("dockerd", "containerd", "runc", "mmdebstrap", "iptables")) \
            and Path("/usr/bin/docker").exists():
        return
    log(f"engine: installing {' '.join(DEBIAN_PACKAGES)} from Debian")
    # One apt-get at a time: another lane of the suite may be installing Prometheus (e2e/harness/apt.py).
    apt_get("update", "-qq", check=True, stdout=subprocess.DEVNULL)
    apt_get("install", "-y", "-qq", "--no-install-recommends", *DEBIAN_PACKAGES, check=True, stdout=subprocess.DEVNULL)


def docker_client() -> str:
    """The Docker CLI that matches the engine: Debian's ``/usr/bin/docker``.

    A newer CLI elsewhere on PATH (Docker 23+) sends ``docker build`` to the
    buildx plugin, which Debian bookworm does not package; Debian's 20.10 CLI
    has BuildKit built in (``DOCKER_BUILDKIT=1``).
    """
    return "/usr/bin/docker" if Path("/usr/bin/docker").exists() else (shutil.which("docker") or "docker")


@dataclass
class Engine:
    """One running private engine.

    Attributes:
      pid: dockerd's PID.
      run_dir: temp dir with the socket, exec root, PID file and log.
      data_root: the image store (layer cache).
      forward_rules: iptables/ip6tables rules this engine added (removed at stop).
      lock_fd: the data root's lock, held while the engine runs.
      temporary_data_root: the data root is a temp store (the cache was in use): deleted at stop.
    """

    pid: int
    run_dir: Path
    data_root: Path
    forward_rules: list[list[str]] = field(default_factory=list)
    lock_fd: int | None = None
    temporary_data_root: bool = False

    @property
    def socket(self) -> Path:
        return self.run_dir / "docker.sock"

    @property
    def host(self) -> str:
        """The ``DOCKER_HOST`` value."""
        return f"unix://{self.socket}"

    @property
    def log(self) -> Path:
        return self.run_dir / "dockerd.log"

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """An environment whose ``docker`` (first on PATH) talks to this engine with BuildKit."""
        env = dict(os.environ if base is None else base)
        bin_dir = self.run_dir / "bin"
        env["PATH"] = f"{bin_dir}:{env.get('PATH', '')}"
        env["DOCKER_HOST"] = self.host
        env["DOCKER_BUILDKIT"] = "1"
        env.pop("DOCKER_CONTEXT", None)
        return env

    def docker(self, *args: str, check: bool = True, capture: bool = True,
               timeout: float | None = None, input: bytes | None = None) -> subprocess.CompletedProcess:
        """Run the Docker CLI against this engine.

        Raises:
            subprocess.CalledProcessError: ``check`` and a non-zero exit (stderr in the message).
        """
        proc = subprocess.run([docker_client(), *args], env=self.env(), capture_output=capture,
                              timeout=timeout, input=input)
        if check and proc.returncode != 0:
            raise subprocess.CalledProcessError(proc.returncode, ["docker", *args], proc.stdout, proc.stderr)
        return proc

    def to_json(self) -> str:
        return json.dumps({"pid": self.pid, "run_dir": str(self.run_dir), "data_root": str(self.data_root),
                           "forward_rules": self.forward_rules,
                           "temporary_data_root": self.temporary_data_root})

    @classmethod
    def from_json(cls, text: str) -> "Engine":
        d = json.loads(text)
        return cls(pid=d["pid"], run_dir=Path(d["run_dir"]), data_root=Path(d["data_root"]),
                   forward_rules=d.get("forward_rules", []), temporary_data_root=d.get("temporary_data_root", False))


def _sysctl(name: str) -> str:
    try:
        return Path("/proc/sys", *name.split(".")).read_text().strip()
    except OSError:
        return "0"


def _guard_forwarding() -> list[list[str]]:
    """Rules that drop anything a container bridge would forward off itself.

    With forwarding off in the host (``net.ipv4.ip_forward=0``, IPv6 likewise)
    nothing can leave, and no rule is needed. Otherwise one rule per family.

    Raises:
        EngineUnavailable: forwarding is on and the rule cannot be added.
    """
    rules = []
    for tool, key in (("iptables", "net.ipv4.ip_forward"), ("ip6tables", "net.ipv6.conf.all.forwarding")):
        if _sysctl(key) == "0":
            continue
        rule = ["FORWARD", "-i", "br-+", "!", "-o", "br-+", "-j", "DROP"]
        proc = subprocess.run([tool, "-w", "-I", *rule], capture_output=True, text=True)
        if proc.returncode != 0:
            raise EngineUnavailable(f"{key}=1 and `{tool} -I {' '.join(rule)}` failed ({proc.stderr.strip()}): "
                                    "refusing to start containers whose traffic could leave this machine")
        rules.append([tool, *rule])
    return rules


def _mounts_at(root: Path) -> list[str]:
    """``root`` itself when it is a mount point (dockerd bind-mounts its data root onto itself)."""
    target = str(root.resolve())
    with open("/proc/self/mountinfo") as f:
        return [target for line in f if line.split()[4].replace("\\040", " ") == target]


def _mounts_under(*roots: Path) -> list[str]:
    prefixes = tuple(str(r.resolve()) + "/" for r in roots)
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mount_point = line.split()[4].replace("\\040", " ")
            if mount_point.startswith(prefixes):
                found.append(mount_point)
    return found


def _write_wrapper(bin_dir: Path) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    wrapper = bin_dir / RUNTIME_NAME
    wrapper.write_text(RUNTIME_WRAPPER)
    wrapper.chmod(0o755)
    # kind and our scripts call `docker`: make it the engine's own CLI.
    client = bin_dir / "docker"
    if not client.exists():
        client.symlink_to(docker_client())
    return wrapper


def _lock_data_root(data_root: Path, log=print) -> tuple[Path, int, bool]:
    """Take the data root's lock; when another engine holds it, use a fresh temp data root.

    Returns:
      (data root, the open lock file's fd, whether the root is a temp one to delete at stop).
    """
    data_root.mkdir(parents=True, exist_ok=True)
    fd = os.open(data_root.parent / f".{data_root.name}.lock", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return data_root, fd, False
    except BlockingIOError:
        os.close(fd)
    sweep_stale_temp_roots(Path(tempfile.gettempdir()), log)
    fresh = Path(tempfile.mkdtemp(prefix=TEMP_DATA_ROOT_PREFIX))
    fd = os.open(fresh / ".lock", os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a dir just made: nobody else can hold it
    return fresh, fd, True


def _remove_data_root(root: Path) -> None:
    """Detach every mount at or under ``root`` (overlays, the engine's bind mount of it), then delete it."""
    for mount_point in sorted(_mounts_under(root) + _mounts_at(root), key=len, reverse=True):
        subprocess.run(["umount", "-l", mount_point], capture_output=True)
    shutil.rmtree(root, ignore_errors=True)


def sweep_stale_temp_roots(tmp_dir: Path, log=print, now: float | None = None) -> list[Path]:
    """Delete temp image stores (``TEMP_DATA_ROOT_PREFIX*`` in ``tmp_dir``) that no engine uses any more.

    An engine stopped normally deletes its own; these are what a killed session
    left (each is a full image store, ~19 GB on the kind tier, so two left
    behind filled this machine's disk). In use means its ``.lock`` is held
    (dockerd inherits the lock: held exactly while the engine runs); a store
    younger than :data:`STALE_TEMP_ROOT_AGE_S` is kept too.

    Returns:
      the stores deleted.
    """
    now = time.time() if now is None else now
    removed = []
    for root in sorted(tmp_dir.glob(TEMP_DATA_ROOT_PREFIX + "*")):
        try:
            if not root.is_dir() or now - root.stat().st_mtime < STALE_TEMP_ROOT_AGE_S:
                continue
            fd = os.open(root / ".lock", os.O_CREAT | os.O_RDWR, 0o600)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # an engine runs on it
        finally:
            os.close(fd)
        log(f"engine: deleting {root}, an image store no engine uses (left by a session that was killed)")
        _remove_data_root(root)
        removed.append(root)
    return removed


def start(data_root: Path | None = None, log=print, on_spawn: Callable[[Engine], None] | None = None) -> Engine:
    """Install what is missing, then start a private dockerd; return once it answers.

    Args:
      data_root: image store; default :func:`default_data_root`. If another
        engine holds it, a fresh temp store is used (slower: no layer cache), deleted at
        :func:`stop`; stores a killed session left are deleted first (:func:`sweep_stale_temp_roots`).
      log: progress printer.
      on_spawn: called with the :class:`Engine` as soon as dockerd is spawned, before it answers: a
        caller in another thread (the prewarm) then knows its PID and can stop it if the session is
        interrupted meanwhile. What it raises is raised here (it must stop the engine itself).

    Raises:
        EngineUnavailable: see :func:`why_unavailable`, or forwarding cannot be guarded.
        RuntimeError: dockerd exited or did not answer within :data:`START_TIMEOUT_S` (its log tail in the message).
    """
    ensure_packages(log)
    data_root, lock_fd, temporary = _lock_data_root(data_root or default_data_root(), log)
    # Short path: containerd's sockets live under the exec root (sun_path is 108 bytes).
    run_dir = Path(tempfile.mkdtemp(prefix="ejd-", dir="/tmp"))
    wrapper = _write_wrapper(run_dir / "bin")
    rules = _guard_forwarding()
    argv = ["dockerd", "--iptables=false", "--ip6tables=false", "--ip-forward=false", "--ip-masq=false",
            "--bridge=none", "--storage-driver=overlay2",
            f"--data-root={data_root}", f"--exec-root={run_dir / 'exec'}", f"--pidfile={run_dir / 'docker.pid'}",
            f"--host=unix://{run_dir / 'docker.sock'}",
            f"--add-runtime={RUNTIME_NAME}={wrapper}", f"--default-runtime={RUNTIME_NAME}"]
    t0 = time.monotonic()
    with open(run_dir / "dockerd.log", "ab") as out:
        # dockerd inherits the data root's lock: it is held exactly as long as the engine runs.
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, pass_fds=(lock_fd,))
    engine = Engine(pid=proc.pid, run_dir=run_dir, data_root=data_root, forward_rules=rules, lock_fd=lock_fd,
                    temporary_data_root=temporary)
    proc.returncode = 0  # reaped by stop() through os.waitpid; no ResourceWarning
    if on_spawn is not None:
        on_spawn(engine)
    deadline = t0 + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if engine.socket.exists() and engine.docker("version", check=False, timeout=20).returncode == 0:
            log(f"engine: dockerd {engine.pid} up in {time.monotonic() - t0:.1f}s at {engine.host} "
                f"(images in {data_root})")
            return engine
        if _reap(engine.pid):
            break
        time.sleep(0.5)
    tail = engine.log.read_text(errors="replace")[-3000:]
    stop(engine)
    raise RuntimeError(f"dockerd did not come up (log {engine.log}):\n{tail}")


def shared() -> Engine:
    """The engine ``python -m e2e.kind.engine start`` recorded in :data:`STATE_FILE`, for sessions that share it.

    Several test sessions (each with its own ``E2E_KIND_CLUSTER``) can use one
    engine and its image store this way; none of them stops it.

    Raises:
        RuntimeError: no such engine is running.
    """
    if STATE_FILE.exists():
        engine = Engine.from_json(STATE_FILE.read_text())
        if not _reap(engine.pid) and engine.docker("version", check=False, timeout=20).returncode == 0:
            return engine
    raise RuntimeError(f"E2E_KIND_SHARED_ENGINE=1 but no engine answers (none recorded in {STATE_FILE}): "
                       "start one with `python -m e2e.kind.engine start`")


def _reap(pid: int) -> bool:
    """True when ``pid`` (our child) has exited."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == pid
    except ChildProcessError:
        try:
            os.kill(pid, 0)
            return False
        except ProcessLookupError:
            return True


_STOP_LOCK = threading.Lock()  # the prewarm's thread and the session's end may stop one engine at once


def stop(engine: Engine, log=print) -> None:
    """Stop the engine and everything it ran: containers, its containerd, mounts, forwarding rules.

    Containers are removed first (``docker rm -f``) so nothing outlives the
    engine; then dockerd gets SIGTERM, and SIGKILL after :data:`STOP_TIMEOUT_S`.
    Leftover mounts under the run dir and data root are detached; a temp data
    root (the cache was in use when it started) is deleted. Safe to call
    again, and from two threads (serialized): a stopped engine is left as it is.
    """
    with _STOP_LOCK:
        _stop(engine, log)


def _stop(engine: Engine, log) -> None:
    if not _reap(engine.pid):
        ids = engine.docker("ps", "-aq", check=False, timeout=60).stdout.split()
        if ids:
            engine.docker("rm", "-f", "-v", *[i.decode() for i in ids], check=False, timeout=300)
        try:
            os.kill(engine.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while time.monotonic() < deadline and not _reap(engine.pid):
            time.sleep(0.2)
        if not _reap(engine.pid):
            log(f"engine: dockerd {engine.pid} ignored SIGTERM for {STOP_TIMEOUT_S:.0f}s; SIGKILL")
            try:
                os.killpg(engine.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            _reap(engine.pid)
    # Anything still holding the exec root (a containerd or shim left by a crash) goes too.
    for pid in _pids_using(engine.run_dir):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    # (with the data root's bind mount onto itself: a dockerd killed before its own exit leaves it, one per
    # engine start, seen as "Device or resource busy" when pytest deleted an old test's folder)
    for mount_point in sorted(_mounts_under(engine.run_dir, engine.data_root) + _mounts_at(engine.data_root),
                              key=len, reverse=True):
        subprocess.run(["umount", "-l", mount_point], capture_output=True)
    for rule in engine.forward_rules:
        subprocess.run([rule[0], "-w", "-D", *rule[1:]], capture_output=True)
    shutil.rmtree(engine.run_dir, ignore_errors=True)
    if engine.temporary_data_root:
        _remove_data_root(engine.data_root)  # a whole image store: not left for the disk to fill
    if engine.lock_fd is not None:
        os.close(engine.lock_fd)
        engine.lock_fd = None
    log(f"engine: dockerd {engine.pid} stopped")


def _pids_using(path: Path) -> list[int]:
    """PIDs whose command line names ``path`` (containerd, shims started for this engine)."""
    needle = str(path).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def main(argv: list[str]) -> int:
    """``start`` | ``stop`` | ``env``: a long-lived engine for work by hand (state in :data:`STATE_FILE`)."""
    if argv[:1] == ["start"]:
        if STATE_FILE.exists():
            engine = Engine.from_json(STATE_FILE.read_text())
            if not _reap(engine.pid):
                print(f"export DOCKER_HOST={engine.host} PATH={engine.run_dir / 'bin'}:$PATH DOCKER_BUILDKIT=1")
                return 0
        engine = start(log=lambda m: print(m, file=sys.stderr))
        STATE_FILE.parent.mkdir(parents=True, exist_ok=True)
        STATE_FILE.write_text(engine.to_json())
        os.close(engine.lock_fd)  # dockerd holds its own copy of the lock
        print(f"export DOCKER_HOST={engine.host} PATH={engine.run_dir / 'bin'}:$PATH DOCKER_BUILDKIT=1")
        return 0
    if argv[:1] == ["stop"]:
        if not STATE_FILE.exists():
            print("engine: none started by `python -m e2e.kind.engine start`", file=sys.stderr)
            return 0
        stop(Engine.from_json(STATE_FILE.read_text()), log=lambda m: print(m, file=sys.stderr))
        STATE_FILE.unlink()
        return 0
    if argv[:1] == ["env"] and STATE_FILE.exists():
        engine = Engine.from_json(STATE_FILE.read_text())
        print(f"export DOCKER_HOST={engine.host} PATH={engine.run_dir / 'bin'}:$PATH DOCKER_BUILDKIT=1")
        return 0
    print("usage: python -m e2e.kind.engine start|stop|env", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
