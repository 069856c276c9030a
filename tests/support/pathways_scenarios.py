"""The pathways backend's scenarios of issue 29 item 1, on a TPU chip or on CPU host devices.

One scenario per child process, run as
`python -m tests.support.pathways_scenarios SCENARIO DIR --platform tpu|cpu`; it
prints one `RESULT {json}` line. The same code runs on both platforms; only the
devices and the device → slice mapping differ:

* `tpu`: `jax.devices()` of the attached chip(s) with `JAX_PLATFORMS=tpu` (a
  missing TPU is an error, never a silent CPU run) and the backend's own
  `default_slice_of` (`device.slice_index`), so one slice per single-host TPU VM;
* `cpu`: 4 host devices (`--xla_force_host_platform_device_count`) as 2 slices
  of 2 chips, `device.id // 2` (CPU devices have no `slice_index`).

Each scenario runs the real `PathwaysBackend` and the loop's `TrainingRun` on the
built-in LM, with real Orbax checkpoints on local disk:

* `train`: loss falls over the run;
* `restore`: a committed step restored by a second `TrainingRun`, recording the
  arrays Orbax returned (their shardings) and what Orbax's Pathways array handler
  (`CloudPathwaysArrayHandler`, registered the way pathwaysutils registers it)
  says of the same restore target;
* `slice_loss`: the last slice lost mid-run (`ScriptedBackend`: reported Down, the
  step raises `JaxRuntimeError("DATA_LOSS: ...")` inside the backend's own
  program call, then reported Ready), trained to the end, counting the programs
  compiled on the training thread from the loss to the next completed step;
* `lone_slice_loss`: the same with every device one slice (a single TPU chip's
  case: no replica survives, the state comes from a host snapshot of every step);
* `resume_first` / `resume_second`: a run stopped cleanly mid-way (its final save
  commits), then a second process resuming from the committed step.

Why processes: one program at a time holds a TPU chip (a second gets the libtpu
lockfile error), so the pytest process never opens it and the scenarios run one
after another; each exits cleanly (a SIGKILLed holder keeps the chip for ~12 s).
On CPU, the host device count must be set before JAX starts.

`run_scenario` is the parent side, used by `tests/tpu/` and
`tests/integration/test_pathways_scenarios.py`; `ScriptedBackend` is also used by
`benchmarks/bench_tpu.py`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULT_PREFIX = "RESULT "
SCENARIOS = ("train", "restore", "slice_loss", "lone_slice_loss", "resume_first", "resume_second")
PLATFORMS = ("tpu", "cpu")
CPU_DEVICES = 4
CPU_DEVICES_PER_SLICE = 2
# Smaller than examples/02 (dModel 512, 8 layers, seqLen 256, batch 256: 22 s per compile on a v5e chip):
# the tier checks behaviour, not speed, and must fit a short session on the chip.
TRAINER = {
    "tpu": {"seqLen": 128, "dModel": 256, "numLayers": 2, "numHeads": 4, "mlpDim": 1024, "maxBytes": 2_000_000,
            "learningRate": 0.003, "warmupSteps": 5},
    "cpu": {"seqLen": 32, "dModel": 32, "numLayers": 1, "numHeads": 2, "mlpDim": 64, "maxBytes": 200_000,
            "learningRate": 0.01, "warmupSteps": 5},
}
GLOBAL_BATCH = {"tpu": 32, "cpu": 8}
TRAIN_STEPS = 24
RESTORE_STEP = 10  # the step run #1 of `restore` commits (a multiple of the checkpoint interval, 10)
# 15 steps done (the loop launches step n+1 before it reads step n), 5 past the newest host snapshot and
# checkpoint (step 10; both every 10 steps): a recovery from either loses 5 steps, one from the surviving
# replicas none.
LOSE_AT_CALL = 17
# The message convention of the error Pathways raises for a lost slice (errors.SLICE_DOWN_PREFIXES).
INJECTED_LOSS = "DATA_LOSS: slice {index} lost (injected)"
# What Orbax's Pathways array handler raises for a restore target that is not a NamedSharding.
NOT_NAMED_SHARDING = "Pathways only supports jax.sharding.NamedSharding"


# -- parent side ---------------------------------------------------------------------------------------


def child_env(platform: str, environ: dict[str, str] | None = None, cpu_devices: int = CPU_DEVICES) -> dict[str, str]:
    """The environment of a scenario child: the caller's (the TPU machine's `PYTHONPATH` keeps libtpu first),
    with the platform pinned so a missing TPU fails instead of running on CPU.

    Args:
      platform: "tpu" or "cpu".
      environ: the environment to start from (default `os.environ`).
      cpu_devices: CPU host devices (`CPU_DEVICES_PER_SLICE` per slice) when `platform` is "cpu".

    Raises:
      ValueError: `platform` is not one of `PLATFORMS`.
    """
    if platform not in PLATFORMS:
        raise ValueError(f"platform must be one of {PLATFORMS}, got {platform!r}")
    env = dict(os.environ if environ is None else environ)
    env["JAX_PLATFORMS"] = platform
    if platform == "cpu":
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={cpu_devices}"
    return env


def run_scenario(name: str, workdir: Path, platform: str, timeout_s: float = 600.0) -> dict[str, Any]:
    """Runs one scenario in a child process and returns its result dict.

    Args:
      name: one of `SCENARIOS`.
      workdir: the scenario's folder (checkpoints under `workdir/ckpt`); `resume_second` reads what
        `resume_first` committed there.
      platform: "tpu" or "cpu".
      timeout_s: wall seconds before the child is killed (`subprocess.TimeoutExpired`).

    Raises:
      AssertionError: the child failed or printed no result (with its stderr's tail).
    """
    proc = subprocess.run([sys.executable, "-m", "tests.support.pathways_scenarios", name, str(workdir),
                           "--platform", platform], cwd=ROOT, env=child_env(platform), capture_output=True,
                          text=True, timeout=timeout_s)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    # A partial result printed before the child died is shown with its error.
    assert proc.returncode == 0 and lines, (f"scenario {name} exited {proc.returncode}; last result: "
                                            f"{lines[-1] if lines else None}\n{proc.stderr[-6000:]}")
    return json.loads(lines[-1][len(RESULT_PREFIX):])


# -- child side ----------------------------------------------------------------------------------------


class ScriptedBackend:
    """A `PathwaysBackend` with a slice loss or a stop at a given step; everything else is the backend's own.

    The loss is injected where Pathways raises it: the real `map_sum` or `step` runs a step
    function that raises `JaxRuntimeError("DATA_LOSS: ...")` inside the backend's
    program call (while it is traced), so the backend's own handling (health check,
    mark down, `SliceDownError`) runs. Around it the operator's reports are applied
    as the control API applies them: the slice Down before, Ready again after (at
    once, so a measured recovery holds no wait for the slice).

    Args:
      backend: the `PathwaysBackend`.
      slice_set: the `SliceSet` the reports are applied to.
      lose_at_call: the `map_sum` or `launch` call (1-based; call n runs step n when nothing was
        redone) that loses `lost_slice`; None: no loss.
      lost_slice: the slice lost.
      stop_at_call: the `map_sum` or `launch` call at whose start `on_stop` is called (None: never).

    Attributes:
      call_starts: `time.perf_counter()` at the start of every `map_sum` or `launch` call (seconds).
      call_ends: `time.perf_counter()` when each `map_sum` call that completed returned, or a
        `wait` returned a launched step's outputs (seconds).
      loss_raised_at: `time.perf_counter()` when the injected error was raised, or None.
      on_stop: called once at `stop_at_call` (set it to the run's `request_stop`).
    """

    def __init__(self, backend: Any, slice_set: Any, lose_at_call: int | None = None, lost_slice: int = 0,
                 stop_at_call: int | None = None):
        self._backend = backend
        self._slice_set = slice_set
        self._lose_at_call = lose_at_call
        self._lost_slice = lost_slice
        self._stop_at_call = stop_at_call
        self.on_stop = lambda: None
        self.call_starts: list[float] = []
        self.call_ends: list[float] = []
        self.loss_raised_at: float | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def map_sum(self, fn: Any, params: Any, batch: Any, active: Any) -> Any:
        """The backend's `map_sum`, but the scripted call loses `lost_slice` (raises `SliceDownError`)."""
        return self._call(self._backend.map_sum, fn, params, batch, active)

    def launch(self, fn: Any, state: Any, batch: Any, active: Any) -> Any:
        """The backend's `launch` (the built-in loop's step), scripted as `map_sum` is: a call is a launch."""
        return self._call(self._backend.launch, fn, state, batch, active, wait=False)

    def wait(self, launched: Any) -> Any:
        """The backend's `wait`; records when the launched step's outputs were ready (`call_ends`)."""
        out = self._backend.wait(launched)
        self.call_ends.append(time.perf_counter())
        return out

    def _call(self, run: Any, fn: Any, state: Any, batch: Any, active: Any, wait: bool = True) -> Any:
        self.call_starts.append(time.perf_counter())
        call = len(self.call_starts)
        if call == self._stop_at_call:
            self.on_stop()
        if call == self._lose_at_call:
            self._lose(run, state, batch, active)
        out = run(fn, state, batch, active)
        if wait:
            self.call_ends.append(time.perf_counter())
        return out

    def _report(self, state: str) -> None:
        from elastic_jax.api.control import SliceReport

        index = self._lost_slice
        generation = self._slice_set.record(index).generation + 1
        addresses = [f"slice-{index}-worker-0:8471"] if state == "Ready" else []
        self._slice_set.apply_report(index, SliceReport(state=state, generation=generation, addresses=addresses))

    def _lose(self, run: Any, state: Any, batch: Any, active: Any) -> None:
        import jax

        message = INJECTED_LOSS.format(index=self._lost_slice)

        def lost_step(state: Any, batch: Any) -> Any:
            raise jax.errors.JaxRuntimeError(message)

        self._report("Down")
        self.loss_raised_at = time.perf_counter()
        try:
            run(lost_step, state, batch, active)
        finally:
            self._report("Ready")
        raise AssertionError(f"the backend's {run.__name__} did not raise for {message!r}")


class Layout:
    """The devices a scenario runs on and how they map to slices (see the module docstring).

    Attributes:
      platform: "tpu" or "cpu".
      devices: `jax.devices()`.
      slice_of: the device → slice mapping given to `PathwaysBackend` (None: the backend's default).
      count: `spec.slices.count`.
      device_kind: `devices[0].device_kind`, e.g. "TPU v5 lite".
      slice_mapping: the mapping in words.

    Args:
      platform: "tpu" or "cpu".
      one_slice_without_index: on TPU, when a device has no `slice_index` (a single-host TPU VM:
        `None`), map every device to slice 0 instead of the backend's default (which may refuse them);
        for a benchmark that must measure what it can. The tests keep the product's default.
      one_slice: every device is slice 0, on any platform (the `lone_slice_loss` scenario).

    Raises:
      SystemExit: JAX runs on another platform than `platform`.
    """

    def __init__(self, platform: str, one_slice_without_index: bool = False, one_slice: bool = False):
        import jax

        self.platform = platform
        self.devices = jax.devices()
        self.device_kind = self.devices[0].device_kind
        if self.devices[0].platform != platform:
            raise SystemExit(f"asked for platform {platform} but JAX runs on {self.devices[0].platform}")
        indices = {getattr(d, "slice_index", None) for d in self.devices}
        if one_slice:
            self.slice_of, self.count = (lambda d: 0), 1
            self.slice_mapping = "every device one slice"
        elif platform == "cpu":
            self.slice_of = lambda d: d.id // CPU_DEVICES_PER_SLICE
            self.count = len(self.devices) // CPU_DEVICES_PER_SLICE
            self.slice_mapping = f"device.id // {CPU_DEVICES_PER_SLICE}"
        elif one_slice_without_index and None in indices:
            self.slice_of, self.count = (lambda d: 0), 1
            self.slice_mapping = "one slice (device.slice_index is None)"
        else:
            self.slice_of = None  # the product's own rule (device.slice_index): what a TPU VM gets
            self.count = len(indices)
            self.slice_mapping = "device.slice_index (the backend's default)"

    def backend(self, slice_set: Any) -> Any:
        """A `PathwaysBackend` over these devices."""
        from elastic_jax.controller.backend_pathways import PathwaysBackend

        if self.slice_of is None:
            return PathwaysBackend(slice_set, devices=self.devices)
        return PathwaysBackend(slice_set, devices=self.devices, slice_of=self.slice_of)

    def describe(self) -> dict[str, Any]:
        """What the result says about where it ran."""
        return {"platform": self.platform, "device_kind": self.device_kind, "devices": len(self.devices),
                "slices": self.count, "slice_mapping": self.slice_mapping}


def require_empty(workdir: Path) -> None:
    """Refuses a benchmark's scratch folder that holds files already.

    Raises:
      SystemExit: `workdir` is not empty: a run there resumes from its checkpoints instead of measuring
        (a second `tpu_session.sh ratio` in one device call once did: no step after the slice loss).
    """
    if workdir.exists() and any(workdir.iterdir()):
        raise SystemExit(f"--workdir: {workdir} is not empty (a run there resumes from its checkpoints instead "
                         "of measuring): give a new or empty folder")


def manifest(layout: Layout, workdir: Path, steps: int, name: str = "tier", trainer: dict | None = None,
             global_batch: int | None = None, checkpoint_interval: int = 10, host_snapshot_every: int = 10) -> Any:
    """The scenario's `ElasticTrainingJob`: pathways backend, every slice of `layout`, replica resize down to 1.

    Args:
      trainer: the built-in LM's config (default `TRAINER[platform]`).
      global_batch: examples per step (default `GLOBAL_BATCH[platform]`).
      checkpoint_interval: steps between checkpoints (`spec.checkpoint.intervalSteps`).
      host_snapshot_every: steps between host snapshots (`spec.elasticity.hostSnapshotIntervalSteps`).
    """
    from elastic_jax.api.manifest import parse_manifest

    accelerator, topology = ("tpu-v5-lite-podslice", "1x1") if layout.platform == "tpu" else ("cpu", "1x2")
    return parse_manifest({
        "apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob", "metadata": {"name": name},
        "spec": {"backend": "pathways",
                 "slices": {"count": layout.count, "minSlices": 1, "accelerator": accelerator, "topology": topology},
                 "controller": {"trainer": {"config": dict(trainer or TRAINER[layout.platform])}},
                 "training": {"steps": steps, "globalBatchSize": global_batch or GLOBAL_BATCH[layout.platform],
                              "logEverySteps": 10},
                 "elasticity": {"hostSnapshotIntervalSteps": host_snapshot_every},
                 "checkpoint": {"uri": str(workdir / "ckpt"), "intervalSteps": checkpoint_interval, "maxToKeep": 2}}})


def recording_checkpointer(job: Any) -> Any:
    """The job's real Orbax `Checkpointer` (as `run_checkpoints.job_checkpointer` opens it), keeping each
    restore's target and the state Orbax returned in `restores` as `(target, state, step)`."""
    from elastic_jax.api.identity import local_identity
    from elastic_jax.controller.checkpointing import Checkpointer

    class RecordingCheckpointer(Checkpointer):
        def __init__(self, *args: Any, **kwargs: Any):
            super().__init__(*args, **kwargs)
            self.restores: list[tuple[Any, Any, int]] = []

        def restore(self, target: Any, step: int | None = None) -> tuple[Any, dict[str, Any], int]:
            state, data_state, step = super().restore(target, step)
            self.restores.append((target, state, step))
            return state, data_state, step

    ckpt = job.spec.checkpoint
    checkpointer = RecordingCheckpointer(ckpt.uri, ckpt.interval_steps, ckpt.max_to_keep,
                                         writer=local_identity(job.metadata.name, ckpt.uri))
    return checkpointer


def train(layout: Layout, job: Any, lose_at_call: int | None = None, stop_at_call: int | None = None,
          ) -> tuple[Any, Any, ScriptedBackend]:
    """One `TrainingRun` of `job` on a fresh slice set (every slice Ready) and backend.

    Returns:
      `(summary, checkpointer, scripted backend)`; the checkpointer is closed.
    """
    from elastic_jax.api.control import SliceReport
    from elastic_jax.controller.builtin_lm import make_trainer
    from elastic_jax.controller.elastic.slice_set import SliceSet
    from elastic_jax.controller.loop import TrainingRun
    from elastic_jax.controller.metrics import ControllerMetrics

    slice_set = SliceSet(layout.count)
    for i in range(layout.count):
        slice_set.apply_report(i, SliceReport(state="Ready", generation=1, addresses=[f"slice-{i}-worker-0:8471"]))
    backend = ScriptedBackend(layout.backend(slice_set), slice_set, lose_at_call=lose_at_call,
                              lost_slice=layout.count - 1, stop_at_call=stop_at_call)
    checkpointer = recording_checkpointer(job)
    run = TrainingRun(job, make_trainer(job.spec.controller.trainer.config), backend, slice_set, checkpointer,
                      ControllerMetrics())
    backend.on_stop = lambda: run.request_stop("test: a clean controller stop", requested=False)
    try:
        summary = run.run()
    finally:
        checkpointer.close()
    return summary, checkpointer, backend


def summary_fields(summary: Any) -> dict[str, Any]:
    """The run summary's fields the tests read."""
    return {"succeeded": summary.succeeded, "steps": summary.steps, "total_steps": summary.total_steps,
            "initial_loss": summary.initial_loss, "final_loss": summary.final_loss,
            "steps_lost": summary.steps_lost, "restored_from_step": summary.restored_from_step,
            "last_committed": summary.last_committed_checkpoint_step, "failure": summary.failure_reason,
            "stop": summary.stop, "causes": [r["cause"] for r in summary.recoveries],
            "recovery_slices": [r["slices"] for r in summary.recoveries],
            "recovery_seconds": [r["seconds"] for r in summary.recoveries]}


def shardings_of(state: Any, layout: Layout) -> dict[str, Any]:
    """How the leaves of a restored state are placed: all `NamedSharding`, all over every device."""
    import jax

    leaves = [x for x in jax.tree_util.tree_leaves(state) if isinstance(x, jax.Array)]
    ids = {d.id for d in layout.devices}
    return {"leaves": len(leaves),
            "kinds": sorted({type(x.sharding).__name__ for x in leaves}),
            "all_named": all(isinstance(x.sharding, jax.sharding.NamedSharding) for x in leaves),
            "all_on_every_device": all({d.id for d in x.sharding.device_set} == ids for x in leaves)}


def pathways_handler_verdict(checkpointer: Any, target: Any, step: int) -> str:
    """What Orbax's Pathways array handler says of restoring `step` onto `target`: "" if it restored, else the
    first line of its error. The global registry is restored afterwards.

    pathwaysutils 0.1.13 (`_initialize.py`) registers `CloudPathwaysArrayHandler(timeout=1 h,
    array_metadata_store=Store())` for `jax.Array` only under `JAX_PLATFORMS=proxy` with persistence on;
    it is registered here the same way. Off Pathways (CPU, and a TPU VM without the proxy) it cannot read:
    after its own checks (every target a `NamedSharding`, else `NOT_NAMED_SHARDING`) it compiles an IFRT
    plugin program that only the Pathways proxy runs (on CPU: `INVALID_ARGUMENT: PjRtCompiler requires
    an HloProgram`). So the verdict shows whether the restore got past the handler's checks.
    """
    import jax
    from orbax.checkpoint import type_handlers
    from orbax.checkpoint._src.metadata import array_metadata_store
    from orbax.checkpoint._src.serialization import cloud_pathways_array_handler

    previous = type_handlers.get_type_handler(jax.Array)
    type_handlers.register_type_handler(
        jax.Array,
        cloud_pathways_array_handler.CloudPathwaysArrayHandler(
            timeout=datetime.timedelta(hours=1), array_metadata_store=array_metadata_store.Store()),
        override=True)
    try:
        checkpointer.restore(target, step)
    except Exception as e:  # noqa: BLE001 - the error is the verdict
        return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
    finally:
        type_handlers.register_type_handler(jax.Array, previous, override=True)
    return ""


def _training_thread_compiles() -> list[float]:
    """Starts recording when XLA compiles a program on this (the training) thread: `time.perf_counter()`s."""
    import threading

    import jax

    main, times = threading.current_thread(), []

    def on_event(event: str, seconds: float, **kwargs: Any) -> None:
        if event.endswith("backend_compile_duration") and threading.current_thread() is main:
            times.append(time.perf_counter())

    jax.monitoring.register_event_duration_secs_listener(on_event)
    return times


def _recovery_compiles(backend: ScriptedBackend, compiles: list[float]) -> int | None:
    """Programs compiled on the training thread from the injected loss to the next completed step."""
    if backend.loss_raised_at is None:
        return None
    done = min((t for t in backend.call_ends if t > backend.loss_raised_at), default=float("inf"))
    return sum(1 for t in compiles if backend.loss_raised_at <= t <= done)


def scenario(name: str, workdir: Path, platform: str) -> dict[str, Any]:
    """Runs scenario `name` in this process (see the module docstring); returns its result dict."""
    layout = Layout(platform, one_slice=name == "lone_slice_loss")
    out: dict[str, Any] = layout.describe()
    if name == "train":
        summary, _, backend = train(layout, manifest(layout, workdir, TRAIN_STEPS))
        starts, ends = backend.call_starts, backend.call_ends
        # Each step but the last launched before the previous step's outputs were read (one step ahead).
        out.update(summary_fields(summary), launches=len(starts), waits=len(ends),
                   launched_ahead=[starts[i + 1] < ends[i] for i in range(len(ends) - 1)])
    elif name == "restore":
        first, _, _ = train(layout, manifest(layout, workdir, RESTORE_STEP))
        summary, checkpointer, _ = train(layout, manifest(layout, workdir, RESTORE_STEP + 4))
        out.update(summary_fields(summary), first_committed=first.last_committed_checkpoint_step,
                   restores=len(checkpointer.restores))
        if checkpointer.restores:
            target, state, step = checkpointer.restores[0]
            out.update(restored_step=step, restored=shardings_of(state, layout), target=shardings_of(target, layout))
            # Printed first: the handler's plugin program is compiled by the device's own client next.
            print(RESULT_PREFIX + json.dumps(out), flush=True)
            # A closed checkpointer cannot restore again: a fresh one over the same folder.
            again = recording_checkpointer(manifest(layout, workdir, RESTORE_STEP + 4))
            try:
                out["pathways_handler"] = pathways_handler_verdict(again, target, step)
            finally:
                again.close()
    elif name in ("slice_loss", "lone_slice_loss"):
        # One slice (a single TPU chip): no replica survives its loss, so 0 steps lost needs a host snapshot
        # of every step; with several, the survivors' replicas are the source and the default interval stays.
        every = 1 if layout.count == 1 else 10
        compiles = _training_thread_compiles()
        summary, _, backend = train(layout, manifest(layout, workdir, TRAIN_STEPS, host_snapshot_every=every),
                                    lose_at_call=LOSE_AT_CALL)
        out.update(summary_fields(summary), lost_slice=layout.count - 1, injected=backend.loss_raised_at is not None,
                   host_snapshot_every=every, recovery_compiles=_recovery_compiles(backend, compiles))
    elif name == "resume_first":
        summary, _, _ = train(layout, manifest(layout, workdir, TRAIN_STEPS), stop_at_call=TRAIN_STEPS // 2)
        out.update(summary_fields(summary))
    elif name == "resume_second":
        summary, _, _ = train(layout, manifest(layout, workdir, TRAIN_STEPS))
        out.update(summary_fields(summary))
    else:
        raise SystemExit(f"unknown scenario {name!r}; one of {SCENARIOS}")
    return out


# -- what each scenario must show (issue 29 item 1), the same on the chip and on CPU devices ---------------


def check_train(r: dict[str, Any]) -> None:
    """(a) The run trains every step, each launched before the previous one's outputs were read, and the loss
    falls."""
    assert r["succeeded"], r["failure"]
    assert r["launches"] == r["waits"] == TRAIN_STEPS and all(r["launched_ahead"]), r
    assert r["steps"] == r["total_steps"] == TRAIN_STEPS, r
    assert r["final_loss"] < 0.8 * r["initial_loss"], r


def check_restore(r: dict[str, Any]) -> None:
    """(b) The committed step is restored into the mesh's `NamedSharding` arrays, which Orbax's Pathways array
    handler accepts (it refuses any other sharding), and training goes on from it."""
    assert r["succeeded"], r["failure"]
    assert r["first_committed"] == r["restored_from_step"] == r["restored_step"] == RESTORE_STEP, r
    assert r["restored"]["leaves"] > 0 and r["restored"]["all_named"], r["restored"]
    assert r["restored"]["all_on_every_device"], r["restored"]
    assert NOT_NAMED_SHARDING not in r["pathways_handler"], r["pathways_handler"]


def check_slice_loss(r: dict[str, Any]) -> None:
    """(c) The injected slice loss is recovered with 0 steps lost, nothing compiled on the training thread (the
    programs are kept per mesh or compiled ahead), and the run trains to the end."""
    assert r["injected"], r
    assert r["recovery_compiles"] == 0, r
    assert r["succeeded"], r["failure"]
    assert r["steps"] == r["total_steps"] == TRAIN_STEPS, r
    assert r["causes"][:1] == ["slice_down"] and r["lost_slice"] in r["recovery_slices"][0], r
    assert r["steps_lost"] == 0, r
    assert r["final_loss"] < 0.8 * r["initial_loss"], r


def check_resume(first: dict[str, Any], second: dict[str, Any]) -> None:
    """(d) A run stopped cleanly mid-way commits the step it reached; a second process resumes from it."""
    assert first["stop"] == "signal" and not first["succeeded"], first
    assert 0 < first["steps"] < TRAIN_STEPS and first["last_committed"] == first["steps"], first
    assert second["succeeded"], second["failure"]
    assert second["restored_from_step"] == first["last_committed"], (first, second)
    assert second["steps"] == TRAIN_STEPS, second


def main(argv: list[str] | None = None) -> None:
    """The child's entry point: runs one scenario and prints its `RESULT {json}` line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", choices=SCENARIOS)
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--platform", choices=PLATFORMS, required=True)
    args = parser.parse_args(argv)
    # Run by hand: pin the platform (and the CPU devices) before JAX starts; it is imported lazily.
    for key, value in child_env(args.platform, {}).items():
        os.environ.setdefault(key, value)
    result = scenario(args.scenario, args.workdir, args.platform)
    print(RESULT_PREFIX + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
