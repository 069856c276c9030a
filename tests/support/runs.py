"""Helpers to run `elastic-jax run` as a user does: a real CLI process, its SUMMARY line, no leftovers."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil
import yaml

from elastic_jax.local.launcher import RUN_DIR_ENV

ROOT = Path(__file__).resolve().parents[2]
CLI = str(Path(sys.executable).parent / "elastic-jax")

# A model small enough that a step takes a few milliseconds on 2 cores.
TINY_TRAINER = {"seqLen": 32, "dModel": 32, "numLayers": 1, "numHeads": 2, "mlpDim": 64, "maxBytes": 200_000,
                "learningRate": 0.01, "warmupSteps": 5}


def job_manifest(name: str, tmp_path: Path, **spec) -> dict:
    """A cpu ElasticTrainingJob for tests; keyword arguments replace whole spec sections."""
    base = {
        "backend": "cpu",
        "slices": {"count": 2, "minSlices": 1},
        "controller": {"trainer": {"config": dict(TINY_TRAINER)}},
        "training": {"steps": 60, "globalBatchSize": 8, "logEverySteps": 5},
        "checkpoint": {"uri": str(tmp_path / "ckpt"), "intervalSteps": 20},
        "elasticity": {"stepDeadlineSeconds": 5, "firstStepDeadlineSeconds": 120},
    }
    base.update(spec)
    return {"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob", "metadata": {"name": name}, "spec": base}


@dataclass
class CliRun:
    """A finished `elastic-jax run`."""

    returncode: int
    stdout: str
    stderr: str
    workdir: Path

    @property
    def summary(self) -> dict:
        """The JSON of the last stdout line, which must start with `SUMMARY `."""
        last = self.stdout.strip().splitlines()[-1]
        assert last.startswith("SUMMARY "), f"last line is not SUMMARY: {last!r}\nstderr:\n{self.stderr[-3000:]}"
        return json.loads(last[len("SUMMARY "):])

    def controller_log(self) -> str:
        """The controller's structured log."""
        return (self.workdir / "controller.log").read_text()


def leftover_processes(marker: str) -> list[psutil.Process]:
    """Processes whose command line, or whose `ELASTIC_JAX_RUN_DIR` (set by the launcher
    on every child it starts), mentions `marker` (e.g. a test's tmp dir)."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if p.pid == os.getpid():
                continue
            if any(marker in part for part in (p.info["cmdline"] or [])) or marker in p.environ().get(RUN_DIR_ENV, ""):
                found.append(p)
        except psutil.Error:
            continue
    return found


def worker_pid(marker: str | Path, index: int) -> int:
    """The pid of the live worker process of slice `index` of the run whose processes name `marker` (the test's
    tmp folder).

    Raises:
      AssertionError: no such worker is running.
    """
    for p in leftover_processes(str(marker)):
        argv = p.cmdline()
        if any(a.endswith("elastic-jax-worker") for a in argv) and argv[argv.index("--slice-index") + 1] == str(index):
            return p.pid
    raise AssertionError(f"no worker process for slice {index}")


def run_cli(manifest: dict | str | Path, tmp_path: Path, *flags: str, timeout_s: float = 600, env: dict | None = None,
            address_space_bytes: int | None = None, cwd: Path | None = None) -> CliRun:
    """Runs `elastic-jax run` on a manifest in a fresh process group and waits for it.

    The CLI stops its own children; on a timeout the whole group is killed and
    the test fails. Afterwards no process mentioning `tmp_path` may remain.

    Args:
      address_space_bytes: RLIMIT_AS of the CLI and every process it starts
        (inherited), so an allocation beyond it fails at once instead of
        growing until the kernel's OOM killer picks a victim (this machine
        overcommits memory: vm.overcommit_memory=1).
      cwd: the CLI's working directory (default ``tmp_path``).
    """
    if isinstance(manifest, dict):
        path = tmp_path / "job.yaml"
        path.write_text(yaml.safe_dump(manifest))
    else:
        path = Path(manifest)
    workdir = tmp_path / "run"
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    def limit():
        if address_space_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (address_space_bytes, address_space_bytes))
    proc = subprocess.Popen([CLI, "run", str(path), "--workdir", str(workdir), *flags], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=full_env, cwd=cwd or tmp_path, start_new_session=True,
                            preexec_fn=limit if address_space_bytes else None)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"elastic-jax run timed out after {timeout_s} s\n{err[-3000:]}")
    finally:
        left = leftover_processes(str(tmp_path))
        for p in left:
            p.kill()
    assert not left, f"processes left running: {[p.pid for p in left]}"
    return CliRun(proc.returncode, out, err, workdir)


def fake_step(ckpt: Path, step: int, writer) -> Path:
    """A committed Orbax step directory as Orbax lays it out on disk: `<step>/_CHECKPOINT_METADATA`
    (and `commit_success.txt`, Orbax's commit marker, written last) naming its writer (an `identity` of `elastic_jax.api.identity`) in `custom_metadata`; the state itself
    is not needed to decide ownership. Returns the step's directory."""
    from elastic_jax.api import identity

    step_dir = ckpt / str(step)
    step_dir.mkdir(parents=True)
    (step_dir / "_CHECKPOINT_METADATA").write_text(json.dumps({"custom_metadata": identity.to_metadata(writer)}))
    (step_dir / "commit_success.txt").write_text("committed")
    return step_dir


def close_while_polled(rt, client):
    """Closes the library `Runtime` `rt` as its supervisor sees it: `client` (a `ControlClient` on its control API)
    reads `GET /v1/status` every 0.05 s until `rt.close()` returns. Returns the last status read: the final one.

    Why: a runtime whose status was read in the last 5 s keeps its control API up at `close` until a supervisor
    read the final status (`controller/final_status.py`), for up to 10 s; a test that read the status and then
    closed without reading again waited those 10 s. This read ends the wait as the operator's poll does."""
    import threading

    from elastic_jax.api.client import ControlApiError

    closer = threading.Thread(target=rt.close, daemon=True)
    closer.start()
    last = None
    while closer.is_alive():
        try:
            last = client.status()
        except ControlApiError:  # the control API stopped: the run has closed
            break
        closer.join(0.05)
    closer.join()
    return last


def interrupt_when(proc: subprocess.Popen, ready, marker: str, bound_s: float = 600) -> tuple[str, str]:
    """Waits until `ready()` (polled every 0.2 s) while `proc` (an `elastic-jax run` started with
    `start_new_session=True`) runs, then stops it as Ctrl-C does (SIGINT) and returns its (stdout, stderr).
    `bound_s` only ends a broken run: it is no timing assertion. Whatever happens, the run's process group is
    SIGKILLed if it is still there, and every process whose command line or environment names `marker` (the
    test's tmp folder) is killed.

    Raises:
      AssertionError: the run ended before `ready()`, or `ready()` did not hold within `bound_s`, or a process
        naming `marker` outlived the run's own stop (one Ctrl-C must stop every child).
    """
    import time

    try:
        deadline = time.monotonic() + bound_s
        while proc.poll() is None and not ready() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert proc.poll() is None, "the run ended before what the test waits for"
        assert ready(), f"not seen within {bound_s:.0f} s"
        proc.send_signal(signal.SIGINT)
        out = proc.communicate(timeout=600)
        left = leftover_processes(marker)
        assert not left, f"still running after the run stopped: pids {[p.pid for p in left]}"
        return out
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        for p in leftover_processes(marker):
            p.kill()
