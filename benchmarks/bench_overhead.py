"""Runtime overhead benchmark: the 2-slice cpu runtime vs the same step in one process.

Side by side in one run, on the same global batch:

* one process: `jax.jit` of (value_and_grad of the loss on the whole global
  batch + the optax update), the best a single JAX process does on this machine;
* the runtime: the controller's path for one step with 2 CPU slice worker
  processes — the global batch cut in 2 chunks, each worker computes loss
  and gradients of its chunk (exported program over gRPC), the controller adds
  them and applies the same optax update (`CpuBackend.map_sum` of the trainer's per-slice step + the loop's
  jitted update).

Blocks of `--steps` steps alternate between the two `--repeats` times; the
median step time of each is compared. Target (issue 2): runtime within 1.5x.

Usage:
  .venv/bin/python benchmarks/bench_overhead.py [--global-batch 32] [--steps 30] [--repeats 3]

Prints a table, then one `BENCH {...}` JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np
import optax

from elastic_jax.api.control import SliceReport
from elastic_jax.controller.backend_cpu import CpuBackend, make_slice_step
from elastic_jax.controller.builtin_lm import make_trainer
from elastic_jax.controller.data import global_batches
from elastic_jax.controller.elastic.slice_set import SliceSet
from elastic_jax.local.processes import free_port, port_open, wait_until, write_private_file


TOKEN = secrets.token_urlsafe(24)


def start_workers(count: int, token_file: Path) -> list[tuple[subprocess.Popen, int]]:
    """Starts `count` worker processes on free loopback ports and waits until they listen."""
    workers = []
    for i in range(count):
        port = free_port()
        proc = subprocess.Popen([str(Path(sys.executable).parent / "elastic-jax-worker"), "--host", "127.0.0.1",
                                 "--port", str(port), "--slice-index", str(i), "--token-file", str(token_file)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        workers.append((proc, port))
    for proc, port in workers:
        if not wait_until(lambda: port_open("127.0.0.1", port), 60):
            raise RuntimeError("worker did not start")
    return workers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--global-batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--config", default="{}", help="built-in trainer config as JSON (default: its defaults)")
    args = parser.parse_args()

    trainer = make_trainer(json.loads(args.config))
    batches = global_batches(trainer.dataset, args.global_batch, seed=0)
    params = jax.jit(trainer.init_params)(jax.random.key(0))
    opt_state = jax.jit(trainer.optimizer.init)(params)

    @jax.jit
    def full_step(params, opt_state, batch):
        (loss_sum, weight), grads = jax.value_and_grad(trainer.loss_fn, has_aux=True)(params, batch)
        grads = jax.tree_util.tree_map(lambda g: g / weight, grads)
        updates, opt_state = trainer.optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss_sum / weight

    @jax.jit
    def apply_update(params, opt_state, grads_sum, weight):
        grads = jax.tree_util.tree_map(lambda g: g / weight, grads_sum)
        updates, opt_state = trainer.optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    token_dir = tempfile.TemporaryDirectory(prefix="bench-overhead-")
    token_file = Path(token_dir.name) / "token"
    write_private_file(token_file, TOKEN)
    workers = start_workers(2, token_file)
    try:
        slice_set = SliceSet(2)
        for i, (_, port) in enumerate(workers):
            slice_set.apply_report(i, SliceReport(state="Ready", generation=1, addresses=[f"127.0.0.1:{port}"]))
        slice_set.set_active({0, 1})
        backend = CpuBackend(slice_set, token=TOKEN)
        slice_step = make_slice_step(trainer)

        def one_process(p, o, step):
            p, o, loss = full_step(p, o, batches[step])
            jax.block_until_ready(p)
            return p, o, float(loss)

        def runtime(p, o, step):
            loss_sum, weight, grads = backend.map_sum(slice_step, p, batches[step], [0, 1])
            p, o = apply_update(p, o, grads, np.float32(weight))
            jax.block_until_ready(p)
            return p, o, loss_sum / weight

        # Warm up both (compiles, program export and load on the workers).
        losses = {}
        for name, fn in (("one_process", one_process), ("runtime", runtime)):
            p, o, losses[name] = fn(params, opt_state, 0)
        assert abs(losses["one_process"] - losses["runtime"]) < 1e-3 * abs(losses["one_process"]), losses
        times: dict[str, list[float]] = {"one_process": [], "runtime": []}
        for _ in range(args.repeats):
            for name, fn in (("one_process", one_process), ("runtime", runtime)):
                p, o = params, opt_state
                for step in range(args.steps):
                    t0 = time.perf_counter()
                    p, o, _ = fn(p, o, step)
                    times[name].append(time.perf_counter() - t0)
        backend.close()
    finally:
        for proc, _ in workers:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
    one = statistics.median(times["one_process"])
    rt = statistics.median(times["runtime"])
    n_params = sum(x.size for x in jax.tree_util.tree_leaves(params))
    print(f"model {n_params:,} params, global batch {args.global_batch}, {args.steps} steps x {args.repeats} blocks each")
    print(f"{'':28s}{'median step s':>14s}")
    print(f"{'one process (jit)':28s}{one:14.4f}")
    print(f"{'2-slice cpu runtime':28s}{rt:14.4f}")
    print(f"ratio runtime / one process: {rt / one:.2f}x (target <= 1.5x)")
    print("BENCH " + json.dumps({"one_process_median_s": one, "runtime_median_s": rt, "ratio": rt / one,
                                 "params": int(n_params), "global_batch": args.global_batch}))


if __name__ == "__main__":
    main()
