"""Checkpoint benchmark: Orbax save throughput vs a plain write, and async-save blocking.

Two measurements, side by side in one run on the same disk:

1. Save throughput. A state of `--state-mb` MiB (random float32 arrays) is
   saved by `Checkpointer` (async save, waited until committed) and written
   plainly (`np.save` per array + fsync of each file and of the directory).
   Runs alternate so both see the same disk and page-cache conditions; the
   median of `--repeats` runs is reported. Every run of both writes new files
   and nothing is deleted until the end: on this VM's disk, rewriting freed
   blocks is 3-5x faster than writing new ones, so deleting one side's
   previous output would favour it. Target: Orbax >= 0.5x plain.
2. Async-save blocking. A matmul-heavy jitted train step (MLP + adam, about
   100-300 ms on 2 CPU cores) runs `--steps` times with a save every
   `--save-every` steps; the seconds `maybe_save` blocks the training thread
   are compared with the step time (medians). Target: blocking < 5% of a step.
   Steps that overlap a background write are timed separately: on a
   2-core machine the write competes with the step for CPU.

Usage:
  .venv/bin/python benchmarks/bench_checkpoint.py [--dir /path/on/the/disk]

Prints a table, then one line of JSON (`BENCH {...}`) for scripts.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from elastic_jax.controller.checkpointing import Checkpointer

MIB = 1024 * 1024


def _random_state(total_mb: int, n_arrays: int = 8) -> dict[str, jax.Array]:
    rows = total_mb * MIB // 4 // n_arrays // 1024
    keys = jax.random.split(jax.random.key(0), n_arrays)
    # Random values: nothing for a compressor to win.
    return {f"a{i}": jax.random.normal(k, (rows, 1024), jnp.float32) for i, k in enumerate(keys)}


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _plain_write(arrays: dict[str, np.ndarray], directory: Path) -> float:
    """Writes each array with np.save into a new directory and fsyncs; returns seconds."""
    directory.mkdir(parents=True)
    started = time.perf_counter()
    for name, array in arrays.items():
        with open(directory / f"{name}.npy", "wb") as f:
            np.save(f, array)
            f.flush()
            os.fsync(f.fileno())
    _fsync_dir(directory)
    return time.perf_counter() - started


def _orbax_save(ckpt: Checkpointer, step: int, state: dict) -> float:
    """Async save waited until committed; returns seconds from call to commit."""
    started = time.perf_counter()
    assert ckpt.maybe_save(step, state, {"next_batch_index": step}, force=True)
    ckpt.wait_until_finished()
    return time.perf_counter() - started


def bench_throughput(base: Path, state_mb: int, repeats: int) -> dict:
    state = _random_state(state_mb)
    jax.block_until_ready(state)
    host = {k: np.asarray(v) for k, v in state.items()}
    nbytes = sum(a.nbytes for a in host.values())
    plain_s, orbax_s = [], []
    # max_to_keep covers every run, so no step is deleted (see the module docstring).
    with Checkpointer(str(base / "orbax"), interval_steps=1, max_to_keep=repeats + 2) as ckpt:
        _orbax_save(ckpt, 0, state)  # warm-up: first save sets up Orbax's machinery
        _plain_write(host, base / "plain" / "warm-up")
        for i in range(repeats):
            plain_s.append(_plain_write(host, base / "plain" / str(i)))
            orbax_s.append(_orbax_save(ckpt, i + 1, state))
    shutil.rmtree(base / "plain")
    plain, orbax = statistics.median(plain_s), statistics.median(orbax_s)
    return {
        "state_bytes": nbytes,
        "plain_write_s": plain,
        "orbax_save_s": orbax,
        "plain_write_mb_s": nbytes / MIB / plain,
        "orbax_save_mb_s": nbytes / MIB / orbax,
        "throughput_ratio": plain / orbax,
        # Best runs: what the disk and Orbax can do when nothing else competes.
        "throughput_ratio_best": min(plain_s) / min(orbax_s),
        "plain_runs_s": plain_s,
        "orbax_runs_s": orbax_s,
    }


def _make_train_step(width: int, depth: int, batch: int):
    opt = optax.adam(1e-4)

    def init(key):
        keys = jax.random.split(key, depth)
        params = {f"w{i}": jax.random.normal(k, (width, width), jnp.float32) / np.sqrt(width) for i, k in enumerate(keys)}
        return {"params": params, "opt_state": opt.init(params), "step": jnp.zeros((), jnp.int32)}

    def loss_fn(params, x):
        for i in range(depth):
            x = jnp.tanh(x @ params[f"w{i}"])
        return jnp.mean(x * x)

    @jax.jit
    def step(state, x):
        grads = jax.grad(loss_fn)(state["params"], x)
        updates, opt_state = opt.update(grads, state["opt_state"], state["params"])
        return {"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state, "step": state["step"] + 1}

    x = jax.random.normal(jax.random.key(1), (batch, width), jnp.float32)
    return init, step, x


def bench_blocking(base: Path, steps: int, save_every: int, width: int, depth: int, batch: int) -> dict:
    init, step_fn, x = _make_train_step(width, depth, batch)
    state = init(jax.random.key(0))
    state = jax.block_until_ready(step_fn(state, x))  # compile
    state_bytes = sum(a.nbytes for a in jax.tree.leaves(state))
    step_s, blocking_s, overlapped_step_s, quiet_step_s = [], [], [], []
    with Checkpointer(str(base / "blocking"), interval_steps=save_every, max_to_keep=2) as ckpt:
        # Warm-up save, excluded: the first one sets up Orbax's threads and directories.
        ckpt.maybe_save(0, state, {"next_batch_index": 0}, force=True)
        ckpt.wait_until_finished()
        last_started = 0
        for i in range(1, steps + 1):
            # A step that runs while a background write is in flight competes with it for CPU.
            saving = (ckpt.last_committed_step or 0) < last_started
            t0 = time.perf_counter()
            state = jax.block_until_ready(step_fn(state, x))
            dt = time.perf_counter() - t0
            step_s.append(dt)
            (overlapped_step_s if saving else quiet_step_s).append(dt)
            t0 = time.perf_counter()
            if ckpt.maybe_save(i, state, {"next_batch_index": i}):
                blocking_s.append(time.perf_counter() - t0)
                last_started = i
        ckpt.wait_until_finished()
    # Medians: on a shared machine a single descheduled thread skews a mean.
    median_step = statistics.median(quiet_step_s or step_s)
    median_block = statistics.median(blocking_s)
    return {
        "train_state_bytes": state_bytes,
        "steps": steps,
        "save_every": save_every,
        "saves": len(blocking_s),
        "step_s": median_step,
        "step_during_save_s": statistics.median(overlapped_step_s) if overlapped_step_s else None,
        "blocking_s_median": median_block,
        "blocking_s_max": max(blocking_s),
        "blocking_fraction_of_step": median_block / median_step,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=None, help="directory on the disk to measure (default: a temp dir)")
    parser.add_argument("--state-mb", type=int, default=256, help="throughput state size in MiB")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--width", type=int, default=1024, help="MLP width of the blocking-benchmark step")
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--batch", type=int, default=256)
    args = parser.parse_args()

    base = Path(tempfile.mkdtemp(prefix="bench-ckpt-", dir=args.dir))
    try:
        tp = bench_throughput(base, args.state_mb, args.repeats)
        bl = bench_blocking(base, args.steps, args.save_every, args.width, args.depth, args.batch)
    finally:
        shutil.rmtree(base, ignore_errors=True)

    rows = [
        ("state size (MiB)", f"{tp['state_bytes'] / MIB:.0f}", ""),
        ("plain write + fsync (MiB/s)", f"{tp['plain_write_mb_s']:.0f}", f"median of {args.repeats}: {tp['plain_write_s']:.3f} s"),
        ("Orbax async save to commit (MiB/s)", f"{tp['orbax_save_mb_s']:.0f}", f"median of {args.repeats}: {tp['orbax_save_s']:.3f} s"),
        ("save throughput / plain write", f"{tp['throughput_ratio']:.2f}", f"target >= 0.5 (best runs: {tp['throughput_ratio_best']:.2f})"),
        ("train state (MiB)", f"{bl['train_state_bytes'] / MIB:.0f}", "params + adam mu/nu"),
        ("step time, median (s)", f"{bl['step_s']:.3f}", f"{bl['steps']} steps; steps overlapping a save: "
         + (f"{bl['step_during_save_s']:.3f} s" if bl["step_during_save_s"] else "none")),
        ("save blocking, median / max (s)", f"{bl['blocking_s_median']:.4f} / {bl['blocking_s_max']:.4f}", f"{bl['saves']} saves, every {bl['save_every']} steps"),
        ("blocking / step time", f"{bl['blocking_fraction_of_step']:.1%}", "target < 5%"),
    ]
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    print(f"{'metric':<{w0}}  {'value':>{w1}}  note")
    for name, value, note in rows:
        print(f"{name:<{w0}}  {value:>{w1}}  {note}")
    result = {
        "state_mib": tp["state_bytes"] / MIB,
        "plain_write_mib_s": round(tp["plain_write_mb_s"], 1),
        "orbax_save_mib_s": round(tp["orbax_save_mb_s"], 1),
        "save_throughput_ratio": round(tp["throughput_ratio"], 3),
        "save_throughput_ratio_best": round(tp["throughput_ratio_best"], 3),
        "step_s": round(bl["step_s"], 4),
        "step_during_save_s": None if bl["step_during_save_s"] is None else round(bl["step_during_save_s"], 4),
        "save_blocking_s": round(bl["blocking_s_median"], 4),
        "save_blocking_fraction": round(bl["blocking_fraction_of_step"], 4),
        "jax_devices": len(jax.devices()),
        "cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    print("BENCH " + json.dumps(result))


if __name__ == "__main__":
    main()
