"""The largest built-in LM the pathways backend trains on the attached devices (issue 29 item 4).

A ladder of model sizes, smallest first, one child process per rung (one
program at a time holds a TPU chip; this parent never opens it). Each child
lays the initial state out as the backend does (`PathwaysBackend.place_state`:
FSDP within a slice, replicated across slices), trains `STEPS` steps with the
loop's own fused step program (`TrainingRun`'s, through `PathwaysBackend.launch`
and `wait`), and reports the parameters, the state's bytes in all and on the
fullest device, and the last step's seconds. The ladder stops at the first rung
that runs out of device memory (`RESOURCE_EXHAUSTED`); any other failure is an
error. No checkpoint is written (a few GB per rung would time the disk).

On one v5e chip a slice is one device, so nothing is split: the figure is the
largest state that fits one chip at this batch. On CPU (`--platform cpu`: 2
host devices as one slice, a tiny ladder) per-device bytes are half the total:
the FSDP split itself, labelled as a CPU smoke run.

Usage (on the TPU machine: `bash benchmarks/tpu_session.sh largest`):
  python benchmarks/bench_tpu_largest.py --out largest.json
  python benchmarks/bench_tpu_largest.py --platform cpu --out /tmp/largest_cpu.json

Prints one line per rung and one `LARGEST {...}` JSON line; writes the JSON to `--out`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.pathways_scenarios import Layout, child_env, manifest, require_empty  # noqa: E402

CHILD_PREFIX = "RUNG "
STEPS = 3
# Parameters ~ 12 x numLayers x dModel^2 (attention 4 d^2, MLP 2 x d x 4d); the state adds Adam's two
# moments: ~3 x 4 bytes per parameter. From ~2.4 GB (rung 0) to ~17 GB (the last, over a v5e's 15.7 GiB).
LADDER = {
    "tpu": [{"dModel": 1024, "numLayers": 16, "numHeads": 16, "mlpDim": 4096},
            {"dModel": 1536, "numLayers": 16, "numHeads": 16, "mlpDim": 6144},
            {"dModel": 1536, "numLayers": 24, "numHeads": 16, "mlpDim": 6144},
            {"dModel": 2048, "numLayers": 18, "numHeads": 16, "mlpDim": 8192},
            {"dModel": 2048, "numLayers": 24, "numHeads": 16, "mlpDim": 8192},
            {"dModel": 2048, "numLayers": 28, "numHeads": 16, "mlpDim": 8192}],
    "cpu": [{"dModel": 32, "numLayers": 1, "numHeads": 2, "mlpDim": 64},
            {"dModel": 64, "numLayers": 2, "numHeads": 2, "mlpDim": 128}],
}
COMMON = {"tpu": {"seqLen": 256, "maxBytes": 4_000_000}, "cpu": {"seqLen": 32, "maxBytes": 200_000}}
GLOBAL_BATCH = {"tpu": 8, "cpu": 4}
CPU_DEVICES = 2  # one slice of 2 host devices
CHILD_TIMEOUT_S = 600.0
OUT_OF_MEMORY = ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory")


def child(platform: str, workdir: Path, rung: int) -> dict[str, Any]:
    """Trains `STEPS` steps of rung `rung`'s model; returns its sizes and step time.

    Raises:
      SystemExit: `workdir` holds files already (`require_empty`).
    """
    require_empty(workdir)
    import jax
    import numpy as np

    from elastic_jax.api.control import SliceReport
    from elastic_jax.controller.builtin_lm import make_trainer
    from elastic_jax.controller.checkpointing import Checkpointer
    from elastic_jax.controller.elastic.slice_set import SliceSet
    from elastic_jax.controller.loop import TrainingRun
    from elastic_jax.controller.metrics import ControllerMetrics

    layout = Layout(platform, one_slice=True)
    config = dict(COMMON[platform], **LADDER[platform][rung])
    job = manifest(layout, workdir, STEPS, name="largest", trainer=config, global_batch=GLOBAL_BATCH[platform])
    slice_set = SliceSet(layout.count)
    slice_set.apply_report(0, SliceReport(state="Ready", generation=1, addresses=["slice-0-worker-0:8471"]))
    backend = layout.backend(slice_set)
    checkpointer = Checkpointer(job.spec.checkpoint.uri, 10**6, 1)  # opened as the run opens it; never saves
    try:
        # The run's own initial state and fused step program, driven step by step here without its
        # checkpoints and snapshots.
        run = TrainingRun(job, make_trainer(config), backend, slice_set, checkpointer, ControllerMetrics())
        state = backend.place_state(run.initial_state(), [0])
        seconds = []
        for step in range(STEPS):
            started = time.perf_counter()
            state, outputs = backend.wait(backend.launch(run.train_step, state, run.batches[step], [0]))
            loss_sum, weight, finite = jax.device_get(outputs)
            seconds.append(time.perf_counter() - started)
        leaves = jax.tree_util.tree_leaves(state)
        per_device: dict[int, int] = {}
        for leaf in leaves:
            for shard in leaf.addressable_shards:
                per_device[shard.device.id] = per_device.get(shard.device.id, 0) + shard.data.nbytes
        params = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(state["params"]))
        # What one host snapshot of this state costs (the copy `HostSnapshotter` makes beside the training):
        # against the step time it says how often snapshots can be taken for free.
        started = time.perf_counter()
        jax.device_get(state)
        host_copy_s = time.perf_counter() - started
    finally:
        backend.close()
        checkpointer.close()
    out = layout.describe()
    out.update(rung=rung, config=config, params=params, state_bytes=sum(x.nbytes for x in leaves),
               max_device_state_bytes=max(per_device.values()), devices_holding_state=len(per_device),
               last_step_s=seconds[-1], host_copy_s=host_copy_s, loss=float(loss_sum / weight), finite=bool(finite))
    return out


def ladder(platform: str, workdir: Path) -> dict[str, Any]:
    """Runs the rungs in order until one runs out of device memory.

    Raises:
      SystemExit(2): a rung failed for another reason (its stderr's tail is printed).
    """
    rungs, stopped_by = [], None
    for rung in range(len(LADDER[platform])):
        proc = subprocess.run([sys.executable, __file__, "--child", str(rung), "--platform", platform,
                               "--workdir", str(workdir / f"rung-{rung}")],
                              env=child_env(platform, cpu_devices=CPU_DEVICES), cwd=ROOT, capture_output=True,
                              text=True, timeout=CHILD_TIMEOUT_S)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(CHILD_PREFIX)]
        if proc.returncode == 0 and lines:
            result = json.loads(lines[-1][len(CHILD_PREFIX):])
            rungs.append(result)
            print(f"rung {rung}: {result['params']:,} parameters, state {result['state_bytes'] / 2**30:.2f} GiB "
                  f"({result['max_device_state_bytes'] / 2**30:.2f} GiB on the fullest of "
                  f"{result['devices_holding_state']} device(s)), step {result['last_step_s']:.3f} s, "
                  f"host copy {result['host_copy_s']:.2f} s", flush=True)
            continue
        tail = proc.stderr[-4000:]
        if any(marker in tail for marker in OUT_OF_MEMORY):
            stopped_by = {"rung": rung, "config": LADDER[platform][rung],
                          "error": next(ln for ln in tail.splitlines()[::-1] if any(m in ln for m in OUT_OF_MEMORY))}
            print(f"rung {rung}: out of device memory ({stopped_by['error'][:200]})", flush=True)
            break
        sys.stderr.write(tail)
        print(f"bench_tpu_largest: rung {rung} exited {proc.returncode} (not out of memory)", file=sys.stderr)
        raise SystemExit(2)
    if not rungs:
        print("bench_tpu_largest: not even the smallest rung trained", file=sys.stderr)
        raise SystemExit(2)
    largest = rungs[-1]
    is_tpu = platform == "tpu" and largest["platform"] == "tpu"
    return {"label": f"TPU ({largest['device_kind']})" if is_tpu else "CPU smoke run: NOT a TPU result",
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "global_batch": GLOBAL_BATCH[platform], "steps": STEPS, "largest": largest, "rungs": rungs,
            "stopped_by": stopped_by}


def main(argv: list[str] | None = None) -> None:
    """The command line (see the module docstring); `--child N` runs rung N and prints its line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--platform", choices=("tpu", "cpu"), default="tpu",
                        help="tpu (default; fails without one) or cpu (tiny ladder on 2 host devices, labelled CPU)")
    parser.add_argument("--out", type=Path, help="where to write the JSON result (required)")
    parser.add_argument("--workdir", type=Path, default=None, help="scratch folder (default: a temporary one)")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        print(CHILD_PREFIX + json.dumps(child(args.platform, args.workdir, args.child)), flush=True)
        return
    if args.out is None:
        parser.error("--out is required")
    with tempfile.TemporaryDirectory(prefix="bench-tpu-largest-") as tmp:
        result = ladder(args.platform, args.workdir or Path(tmp))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print("LARGEST " + json.dumps(result))


if __name__ == "__main__":
    main()
