"""Issue 31 RISK 6: `elastic-jax run` and what others can plant in its `--workdir`.

It followed symbolic links planted at `launcher.lock`, `metrics.prom` and
`summary.json` (three other files truncated or overwritten), reused a
world-writable `xla-cache`, and wrote logs, `summary.json`, `metrics.prom` and
checkpoints 0644. Now the run folder and its cache must be this user's alone
(not a link, not group/world-writable), its files are opened without following
links (or replaced atomically), and everything the run creates is 0600/0700.
Real runs of the CLI.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from elastic_jax import contract
from elastic_jax.local import run_folder
from tests.support.runs import ROOT, job_manifest, leftover_processes

CLI = str(Path(sys.executable).parent / "elastic-jax")
# These runs test the run folder's own cache (`xla-cache`): not the tier's shared one.
pytestmark = pytest.mark.usefixtures("without_shared_compilation_cache")


def _run(tmp_path: Path, manifest: dict, workdir: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    proc = subprocess.run([CLI, "run", str(path), "--workdir", str(workdir), "--no-failure"], capture_output=True,
                          text=True, timeout=600, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    assert not leftover_processes(str(tmp_path))
    return proc


def _refused(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]


def _manifest(tmp_path: Path) -> dict:
    return job_manifest("safe", tmp_path, slices={"count": 1}, training={"steps": 6, "globalBatchSize": 8,
                                                                        "logEverySteps": 2},
                        checkpoint={"uri": str(tmp_path / "ckpt"), "intervalSteps": 3})


def test_links_planted_in_the_workdir_are_never_followed_and_everything_is_private(tmp_path):
    workdir = tmp_path / "run"
    workdir.mkdir(mode=0o700)
    (workdir / run_folder.MARKER).write_text("")  # (an earlier run's folder: one that is not is refused outright)
    victims = {name: tmp_path / f"victim-{name}" for name in ("launcher.lock", "metrics.prom", "summary.json",
                                                                "controller.log")}
    for name, victim in victims.items():
        victim.write_text(f"precious {name}\n")
        (workdir / name).symlink_to(victim)
    _refused(_run(tmp_path, _manifest(tmp_path), workdir), "launcher.lock is a symbolic link")

    (workdir / "launcher.lock").unlink()
    done = _run(tmp_path, _manifest(tmp_path), workdir)
    assert done.returncode == 0, done.stderr[-3000:]
    for name, victim in victims.items():
        assert victim.read_text() == f"precious {name}\n", name  # never truncated, never written through
    written = [workdir / n for n in ("launcher.lock", "metrics.prom", "summary.json", "controller.log",
                                     "worker-0.log")]
    written += [p for p in (tmp_path / "ckpt").rglob("*")]
    for path in written:
        st = os.lstat(path)
        assert not stat.S_ISLNK(st.st_mode), path
        assert stat.S_IMODE(st.st_mode) & 0o077 == 0, (path, oct(st.st_mode))  # this user's alone
    assert stat.S_IMODE(os.lstat(workdir / "xla-cache").st_mode) == 0o700


def test_a_world_writable_cache_or_workdir_or_a_linked_workdir_is_refused(tmp_path):
    workdir = tmp_path / "run"
    workdir.mkdir(mode=0o700)
    (workdir / run_folder.MARKER).write_text("")
    (workdir / "xla-cache").mkdir()
    os.chmod(workdir / "xla-cache", 0o777)
    _refused(_run(tmp_path, _manifest(tmp_path), workdir), "xla-cache", "writable by others")

    # The cache a user names in JAX_COMPILATION_CACHE_DIR (the workers' instead of `xla-cache`): the same
    # checks, refused naming the variable before any process starts.
    theirs = tmp_path / "their-cache"
    theirs.mkdir()
    os.chmod(theirs, 0o777)
    os.chmod(workdir / "xla-cache", 0o700)
    env = {contract.JAX_ENV_COMPILATION_CACHE_DIR: str(theirs)}
    _refused(_run(tmp_path, _manifest(tmp_path), workdir, env),
             f"{contract.JAX_ENV_COMPILATION_CACHE_DIR}={theirs}: is writable by others")
    assert not (workdir / "controller.log").exists() and not any(theirs.iterdir())

    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    _refused(_run(tmp_path, _manifest(tmp_path), shared), f"--workdir {shared}", "writable by others")

    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "linked").symlink_to(real)
    _refused(_run(tmp_path, _manifest(tmp_path), tmp_path / "linked"), "is a symbolic link")
    assert not any(real.iterdir())
