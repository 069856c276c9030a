"""Child process for tests/integration/test_checkpointing.py (run with the venv python).

Modes:
  save-and-hang DIR MB: commits step 1 (small), starts an async save of step 2
    holding about MB megabytes, prints `SAVING 2`, then sleeps until killed.
  reshard DIR: needs 2 CPU devices (XLA_FLAGS). Restores the newest step,
    saved by a 1-device process, onto a state sharded over both devices,
    checks it, saves it 2-way sharded as step+1, prints one JSON line.
"""

from __future__ import annotations

import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from elastic_jax.controller.checkpointing import Checkpointer


def save_and_hang(directory: str, megabytes: int) -> None:
    ckpt = Checkpointer(directory, interval_steps=1, max_to_keep=3)
    ckpt.maybe_save(1, {"w": jnp.full((4,), 1.0)}, {"next_batch_index": 10})
    ckpt.wait_until_finished()
    rows = megabytes * 1024 * 1024 // 4 // 1024
    # Random values, so the write cannot be made cheap by compression.
    big = jax.random.normal(jax.random.key(0), (rows, 1024), jnp.float32)
    ckpt.maybe_save(2, {"w": jnp.full((4,), 2.0), "big": big}, {"next_batch_index": 20}, force=True)
    print("SAVING 2", flush=True)
    time.sleep(600)  # the parent SIGKILLs us while the background write runs


def reshard(directory: str) -> None:
    devices = jax.devices()
    assert len(devices) == 2, devices
    mesh = jax.sharding.Mesh(np.array(devices), ("data",))
    sharded = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    ckpt = Checkpointer(directory, interval_steps=1, max_to_keep=5)
    target = {"w": jax.ShapeDtypeStruct((8, 4), jnp.float32, sharding=sharded)}
    state, data, step = ckpt.restore(target)
    w = state["w"]
    out = {
        "step": step,
        "data": data,
        "restored_devices": sorted(d.id for d in w.sharding.device_set),
        "restored_shard_shapes": [list(s.data.shape) for s in w.addressable_shards],
        "restored_sum": float(jnp.sum(w)),
    }
    ckpt.maybe_save(step + 1, {"w": w * 2}, {**data, "next_batch_index": data["next_batch_index"] + 1}, force=True)
    ckpt.close()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    mode, *args = sys.argv[1:]
    if mode == "save-and-hang":
        save_and_hang(args[0], int(args[1]))
    elif mode == "reshard":
        reshard(args[0])
    else:
        raise SystemExit(f"unknown mode {mode!r}")
