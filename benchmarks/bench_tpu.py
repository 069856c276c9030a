"""TPU benchmark (issue 29 item 2): the pathways backend's own loop on a chip, beside a fused `jax.jit` step.

One command, four child processes run one after another (one program at a
time holds a TPU chip; this parent never opens it):

* start, cold: process start → first completed step of a `TrainingRun` (real
  `PathwaysBackend`, the built-in LM), with an empty JAX persistent
  compilation cache (`JAX_COMPILATION_CACHE_DIR`, min compile time 0 s, as the
  operator renders it);
* start, warm: the same in a new process over the cache the cold one filled;
* main, in one process, side by side:
  - fused: one `jax.jit` of loss + gradient + the trainer's optax update on
    the same global batches (host batches fed each step, state donated,
    dispatched without a sync per step), mean seconds per step;
  - runtime: the `TrainingRun` (its fused step program, launched one step
    ahead: gradients and the optax update in one program per mesh; `hostSnapshotIntervalSteps` = 10 as by
    default: a host snapshot every step while its copy, beside the training, fits in a step, and at least
    every 10), mean seconds per step over
    the same number of steps (from one step's launch to the next); ratio runtime / fused (target <= 1.03x);
  - then a slice loss (the error Pathways raises, `JaxRuntimeError("DATA_LOSS:
    ...")`, inside the backend's program call; the slice reported Down, then
    Ready at once, so no wait for the slice is included): seconds from the
    error to the next completed step on the mesh seen before (target <= 2 s),
    and the steps lost (target 0). The run's own recovery record is reported
    beside it.
* main again with `hostSnapshotIntervalSteps` = 1 (no fused step): a snapshot every
  step whatever its copy costs (a due step waits for the previous copy). On one slice (a single chip) no
  replica survives the slice's loss, so 0 steps lost needs a snapshot of the last step; its step time is
  reported against the same fused step.

`--platform tpu` (default) pins `JAX_PLATFORMS=tpu` in the children: without a
TPU they fail and the benchmark exits 2; a result whose devices are not TPUs is
refused. `--platform cpu` runs a tiny smoke configuration on 2 CPU host
devices as one slice, labelled as a CPU smoke run, never as a TPU result.

Usage (on the TPU machine: benchmarks/tpu_session.sh):
  python benchmarks/bench_tpu.py --out bench_tpu.json
  python benchmarks/bench_tpu.py --platform cpu --out /tmp/bench_tpu_cpu.json

Prints a table and one `BENCH {...}` JSON line; writes the same JSON to `--out`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.pathways_scenarios import Layout, ScriptedBackend, child_env, manifest, require_empty  # noqa: E402

CHILD_PREFIX = "CHILD "
TARGETS = {"ratio": 1.03, "recovery_s": 2.0, "steps_lost": 0}
# examples/02-tpu-v5e-pathways.yaml's model and batch (25.5M parameters; compile ~22 s per program on a v5e chip).
TPU_TRAINER = {"seqLen": 256, "dModel": 512, "numLayers": 8, "numHeads": 8, "mlpDim": 2048, "maxBytes": 4_000_000,
               "learningRate": 0.001, "warmupSteps": 200, "decaySteps": 5000}
CPU_TRAINER = {"seqLen": 32, "dModel": 32, "numLayers": 1, "numHeads": 2, "mlpDim": 64, "maxBytes": 200_000,
               "learningRate": 0.01, "warmupSteps": 5}
SIZES = {  # global batch, warm-up steps (compile), timed steps
    "tpu": {"trainer": TPU_TRAINER, "global_batch": 256, "warmup": 3, "timed": 20},
    "cpu": {"trainer": CPU_TRAINER, "global_batch": 8, "warmup": 1, "timed": 3},
}
# The CPU smoke run's host devices: one slice of 2, the chip's shape (one slice, lost and back).
CPU_SMOKE_DEVICES = 2
CHILD_TIMEOUT_S = 300.0


# -- children -----------------------------------------------------------------------------------------------


def _run(layout: Layout, workdir: Path, steps: int, size: dict, lose_at_call: int | None = None,
         snapshot_every: int = 10) -> tuple[Any, ScriptedBackend, Any]:
    """A `TrainingRun` of the benchmark job (checkpoint only at the end, a host snapshot every `snapshot_every`
    steps); returns (summary, backend, trainer).

    Raises:
      SystemExit: `workdir` holds files already (`require_empty`).
    """
    require_empty(workdir)
    from elastic_jax.api.control import SliceReport
    from elastic_jax.controller.builtin_lm import make_trainer
    from elastic_jax.controller.checkpointing import Checkpointer
    from elastic_jax.controller.elastic.slice_set import SliceSet
    from elastic_jax.controller.loop import TrainingRun
    from elastic_jax.controller.metrics import ControllerMetrics

    job = manifest(layout, workdir, steps, name="bench-tpu", trainer=size["trainer"],
                   global_batch=size["global_batch"], checkpoint_interval=steps, host_snapshot_every=snapshot_every)
    slice_set = SliceSet(layout.count)
    for i in range(layout.count):
        slice_set.apply_report(i, SliceReport(state="Ready", generation=1, addresses=[f"slice-{i}-worker-0:8471"]))
    backend = ScriptedBackend(layout.backend(slice_set), slice_set, lose_at_call=lose_at_call,
                              lost_slice=layout.count - 1)
    trainer = make_trainer(job.spec.controller.trainer.config)
    checkpointer = Checkpointer(job.spec.checkpoint.uri, steps, 1)
    try:
        summary = TrainingRun(job, trainer, backend, slice_set, checkpointer, ControllerMetrics()).run()
    finally:
        checkpointer.close()
    if not summary.succeeded:
        raise SystemExit(f"the benchmark run failed: {summary.failure_reason}")
    return summary, backend, trainer


def _fused_step_s(layout: Layout, trainer: Any, size: dict, backend: Any) -> tuple[float, float]:
    """Mean seconds per step of one fused `jax.jit` (loss, gradient, optax update) on the runtime's mesh and
    batches: dispatched without a sync per step, and with the loss read after each step."""
    import jax
    import optax
    from jax.sharding import NamedSharding, PartitionSpec

    from elastic_jax.controller.backend_pathways import batch_spec, mesh_for
    from elastic_jax.controller.data import global_batches

    mesh = mesh_for(backend.slices, sorted(backend.slices))
    replicated = NamedSharding(mesh, PartitionSpec())
    batches = global_batches(trainer.dataset, size["global_batch"], 0)

    def step(state, batch):
        params, opt_state = state
        (loss_sum, weight), grads = jax.value_and_grad(trainer.loss_fn, has_aux=True)(params, batch)
        grads = jax.tree_util.tree_map(lambda g: g / weight, grads)
        updates, opt_state = trainer.optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), loss_sum / weight

    @jax.jit
    def init(key):
        params = trainer.init_params(key)
        return params, trainer.optimizer.init(params)

    state = jax.device_put(init(jax.random.key(0)), replicated)
    fused = jax.jit(step, in_shardings=(replicated, NamedSharding(mesh, batch_spec(size["global_batch"], mesh))),
                    out_shardings=(replicated, replicated), donate_argnums=0)
    for i in range(size["warmup"]):
        state, loss = fused(state, batches[i])
    jax.block_until_ready(loss)
    started = time.perf_counter()
    for i in range(size["warmup"], size["warmup"] + size["timed"]):
        state, loss = fused(state, batches[i])
    jax.block_until_ready((state, loss))
    pipelined = (time.perf_counter() - started) / size["timed"]
    # The same, reading each step's loss before the next is dispatched (as the runtime does): what a
    # synchronous step costs by itself.
    started = time.perf_counter()
    for i in range(size["warmup"] + size["timed"], size["warmup"] + 2 * size["timed"]):
        state, loss = fused(state, batches[i])
        float(loss)
    return pipelined, (time.perf_counter() - started) / size["timed"]


def child_main(platform: str, workdir: Path, snapshot_every: int = 10, fused: bool = True) -> dict[str, Any]:
    """Runtime step, slice loss → next completed step, steps lost, and (`fused`) the fused step: one process.

    `snapshot_every`: the run's host snapshot interval (steps); 1 is what 0 steps lost costs on one slice
    (no replica survives the loss of the only slice).
    """
    layout = Layout(platform, one_slice_without_index=True)
    size = SIZES[platform]
    warmup, timed = size["warmup"], size["timed"]
    # Calls (launches) 1..warmup compile; the timed window runs from launch warmup+1 to launch warmup+timed+1,
    # one step apart each (the loop launches step n+1 before it reads step n); a later launch loses a slice.
    lose_at = warmup + timed + 2
    summary, backend, trainer = _run(layout, workdir / f"main-{snapshot_every}", lose_at + 3, size,
                                     lose_at_call=lose_at, snapshot_every=snapshot_every)
    starts = backend.call_starts
    runtime_steps = [b - a for a, b in zip(starts[warmup:warmup + timed], starts[warmup + 1:warmup + timed + 1])]
    # The retried step completed when its outputs were ready (the first `wait` to return after the loss).
    retried = min(t for t in backend.call_ends if t > backend.loss_raised_at)
    out = layout.describe()
    out.update(
        runtime_step_s=statistics.mean(runtime_steps), runtime_step_median_s=statistics.median(runtime_steps),
        recovery_s=retried - backend.loss_raised_at,
        recovery_record_s=summary.recoveries[0]["seconds"] if summary.recoveries else None,
        recovery_slices=summary.recoveries[0]["slices"] if summary.recoveries else None,
        steps_lost=summary.steps_lost, lost_at_step=lose_at - 1,
        params=int(sum(x.size for x in _leaves(trainer))), host_snapshot_every=snapshot_every,
    )
    if fused:
        out["fused_step_s"], out["fused_synced_step_s"] = _fused_step_s(layout, trainer, size, backend)
        out["ratio"] = out["runtime_step_s"] / out["fused_step_s"]
    return out


def _leaves(trainer: Any) -> list[Any]:
    """The parameter leaves' shapes (`jax.ShapeDtypeStruct`s), without computing them."""
    import jax

    return jax.tree_util.tree_leaves(jax.eval_shape(trainer.init_params, jax.random.key(0)))


def child_start(platform: str, workdir: Path) -> dict[str, Any]:
    """Trains 2 steps; reports when the first completed (unix seconds) and how many cache entries exist."""
    layout = Layout(platform, one_slice_without_index=True)
    _, backend, _ = _run(layout, workdir, 2, SIZES[platform])
    # Step 1 completed when its outputs were ready (the first `wait` returned).
    first_step_unix = time.time() - (time.perf_counter() - backend.call_ends[0])
    out = layout.describe()
    out["first_step_unix"] = first_step_unix
    return out


# -- parent ---------------------------------------------------------------------------------------------------


def _child(kind: str, platform: str, workdir: Path, cache_dir: Path | None) -> tuple[dict[str, Any], float]:
    """Runs one child; returns (its result, unix seconds just before it was started).

    Raises:
      SystemExit(2): the child failed (its stderr's last lines are printed).
    """
    env = child_env(platform, cpu_devices=CPU_SMOKE_DEVICES)
    if cache_dir is not None:
        env.update(JAX_COMPILATION_CACHE_DIR=str(cache_dir), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    started = time.time()
    proc = subprocess.run([sys.executable, __file__, "--child", kind, "--platform", platform, "--workdir", str(workdir)],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(CHILD_PREFIX)]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stderr[-4000:])
        hint = "; is a TPU attached? (--platform cpu: the CPU smoke run)" if platform == "tpu" else ""
        raise _fail(f"the {kind} child exited {proc.returncode} on platform {platform}{hint}")
    part = json.loads(lines[-1][len(CHILD_PREFIX):])
    # Each child's figures as they come: a session cut short still reports what it measured.
    print(f"{kind} child ({time.time() - started:.0f} s): {json.dumps(part)}", flush=True)
    return part, started


def _fail(message: str) -> SystemExit:
    print(f"bench_tpu: {message}", file=sys.stderr)
    return SystemExit(2)


def measure(platform: str, workdir: Path) -> dict[str, Any]:
    """The four children, in order: start cold, start warm (same cache), main, main with a snapshot every step."""
    cache = workdir / "jax-cache"
    cache.mkdir(parents=True, exist_ok=True)
    cold, cold_t0 = _child("start", platform, workdir / "cold", cache)
    cache_entries = sum(1 for p in cache.rglob("*") if p.is_file())
    warm, warm_t0 = _child("start", platform, workdir / "warm", cache)
    main, _ = _child("main", platform, workdir, None)
    every_step, _ = _child("main1", platform, workdir, None)
    for part in (cold, warm, main, every_step):
        if part["platform"] != platform:
            raise _fail(f"asked for {platform} but a child ran on {part['platform']} ({part['device_kind']})")
    result = dict(main)
    result.update(start_to_first_step_cold_s=cold["first_step_unix"] - cold_t0,
                  start_to_first_step_warm_s=warm["first_step_unix"] - warm_t0,
                  cache_entries_after_cold=cache_entries)
    every_step["ratio"] = every_step["runtime_step_s"] / main["fused_step_s"]
    result["snapshot_every_step"] = every_step
    return result


def report(result: dict[str, Any], platform: str, command: str) -> dict[str, Any]:
    """Labels the result (a CPU run is never a TPU result), adds targets and verdicts, prints the table."""
    is_tpu = platform == "tpu" and result["platform"] == "tpu"
    result.update(
        label=f"TPU ({result['device_kind']})" if is_tpu else "CPU smoke run: NOT a TPU result",
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), command=command,
        size=dict(SIZES[platform]), targets=TARGETS,
        met={"ratio": result["ratio"] <= TARGETS["ratio"], "recovery_s": result["recovery_s"] <= TARGETS["recovery_s"],
             "steps_lost": result["steps_lost"] == TARGETS["steps_lost"]} if is_tpu else None,
    )
    one = result["snapshot_every_step"]
    rows = [
        ("fused jit step", f"{result['fused_step_s']:.4f} s", ""),
        ("fused jit step, loss read each step", f"{result['fused_synced_step_s']:.4f} s", ""),
        ("runtime step (mean; median)", f"{result['runtime_step_s']:.4f} s; {result['runtime_step_median_s']:.4f} s", ""),
        ("runtime / fused", f"{result['ratio']:.3f}x", f"<= {TARGETS['ratio']}x"),
        ("slice loss -> next completed step", f"{result['recovery_s']:.2f} s (run's record: "
         f"{result['recovery_record_s'] if result['recovery_record_s'] is None else round(result['recovery_record_s'], 2)} s)",
         f"<= {TARGETS['recovery_s']} s"),
        ("steps lost", f"{result['steps_lost']} (hostSnapshotIntervalSteps {result['host_snapshot_every']})",
         str(TARGETS["steps_lost"])),
        ("with hostSnapshotIntervalSteps 1:", "", ""),
        ("  runtime step (mean; median)", f"{one['runtime_step_s']:.4f} s; {one['runtime_step_median_s']:.4f} s", ""),
        ("  runtime / fused", f"{one['ratio']:.3f}x", f"<= {TARGETS['ratio']}x"),
        ("  slice loss -> next completed step", f"{one['recovery_s']:.2f} s", f"<= {TARGETS['recovery_s']} s"),
        ("  steps lost", str(one["steps_lost"]), str(TARGETS["steps_lost"])),
        ("start -> first step, cold cache", f"{result['start_to_first_step_cold_s']:.1f} s", ""),
        ("start -> first step, warm cache", f"{result['start_to_first_step_warm_s']:.1f} s "
         f"({result['cache_entries_after_cold']} cache files)", ""),
    ]
    print(f"{result['label']}: {result['devices']} device(s), {result['slices']} slice(s), "
          f"{result['params']:,} parameters, global batch {SIZES[platform]['global_batch']}")
    for name, value, target in rows:
        print(f"{name:36s}{value:44s}{target}")
    return result


def main(argv: list[str] | None = None) -> None:
    """The command line (see the module docstring); `--child` runs one child's part and prints its line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--platform", choices=("tpu", "cpu"), default="tpu",
                        help="tpu (default; refuses to run without one) or cpu (tiny smoke run, labelled CPU)")
    parser.add_argument("--out", type=Path, help="where to write the JSON result (required)")
    parser.add_argument("--workdir", type=Path, default=None, help="scratch folder (default: a temporary one)")
    parser.add_argument("--child", choices=("start", "main", "main1"), default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        if args.child == "start":
            part = child_start(args.platform, args.workdir)
        else:
            part = child_main(args.platform, args.workdir, *((1, False) if args.child == "main1" else ()))
        print(CHILD_PREFIX + json.dumps(part), flush=True)
        return
    if args.out is None:
        parser.error("--out is required")
    command = "python benchmarks/bench_tpu.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    with tempfile.TemporaryDirectory(prefix="bench-tpu-") as tmp:
        result = report(measure(args.platform, args.workdir or Path(tmp)), args.platform, command)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print("BENCH " + json.dumps(result))


if __name__ == "__main__":
    main()
