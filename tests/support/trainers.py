"""Trainers for tests: the built-in LM with a loss that is broken on purpose.

Each is a real `module:function` entry point the controller process imports
(the tests put the repo root on PYTHONPATH).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from elastic_jax.controller.builtin_lm import make_trainer
from elastic_jax.controller.trainer import Trainer


def trace_error_trainer(config: dict) -> Trainer:
    """The loss raises a Python error whenever it is traced (it is user code that can never run)."""
    base = make_trainer(config)

    def loss_fn(params, batch):
        raise ValueError("loss_fn: labels and logits disagree (deliberate test failure)")

    return dataclasses.replace(base, loss_fn=loss_fn, name="trace-error")


def oom_trainer(config: dict) -> Trainer:
    """The loss traces and exports fine but fails on every slice at run time (out of memory).

    It sorts a 256 GiB array derived from the parameters, which no worker can
    allocate: the same RESOURCE_EXHAUSTED error on every slice, a user-code
    failure that must not be retried.
    """
    base = make_trainer(config)

    def loss_fn(params, batch):
        loss_sum, weight = base.loss_fn(params, batch)
        first = jax.tree_util.tree_leaves(params)[0]
        huge = jnp.sort(first.sum() * jnp.arange(2**36, dtype=jnp.float32))
        return loss_sum + 0.0 * huge[-1], weight

    return dataclasses.replace(base, loss_fn=loss_fn, name="oom")


CALLBACK_FAILS_AT_UPDATE = 5  # the 6th optimizer update (step 6) raises in its host callback
NAN_AT_UPDATE = 24  # the 25th optimizer update (step 25) makes the parameters NaN


def _with_extra_transform(config: dict, transform, name: str) -> Trainer:
    import optax

    base = make_trainer(config)
    return dataclasses.replace(base, optimizer=optax.chain(base.optimizer, transform), name=name)


def callback_error_trainer(config: dict) -> Trainer:
    """The optimizer has a host callback (Python inside the jitted update) that raises
    `KeyError` from its 6th update on, as an optax transform looking up a schedule in a
    dict would. XLA reports it as `INTERNAL: CpuCallback error ...`: the user's bug,
    not a lost slice."""
    import numpy as np
    import optax

    table = {i: 1.0 for i in range(CALLBACK_FAILS_AT_UPDATE)}

    def scale_for(count):
        return np.float32(table[int(count)])  # KeyError once count reaches CALLBACK_FAILS_AT_UPDATE

    def init(params):
        return {"count": jnp.zeros((), jnp.int32)}

    def update(updates, state, params=None):
        scale = jax.pure_callback(scale_for, jax.ShapeDtypeStruct((), jnp.float32), state["count"])
        return jax.tree_util.tree_map(lambda u: u * scale, updates), {"count": state["count"] + 1}

    return _with_extra_transform(config, optax.GradientTransformation(init, update), "callback-error")


def nan_update_trainer(config: dict) -> Trainer:
    """The optimizer's 25th update turns every parameter into NaN (a diverging run); the loss
    of that step was still finite, so only a check of the state itself can catch it."""
    import optax

    def init(params):
        return {"count": jnp.zeros((), jnp.int32)}

    def update(updates, state, params=None):
        poison = jnp.where(state["count"] == NAN_AT_UPDATE, jnp.float32(jnp.nan), jnp.float32(0.0))
        return jax.tree_util.tree_map(lambda u: u + poison, updates), {"count": state["count"] + 1}

    return _with_extra_transform(config, optax.GradientTransformation(init, update), "nan-update")


# Examples the blocking trainer's dataset serves before its read blocks for good.
BLOCK_AFTER_EXAMPLES = 80


def blocking_data_trainer(config: dict) -> Trainer:
    """The built-in LM whose data read blocks forever after `BLOCK_AFTER_EXAMPLES` examples
    (a stuck network filesystem or a dead data service): the controller stops making steps
    while every process, thread and port stays up."""
    import itertools
    import threading

    base = make_trainer(config)
    served = itertools.count()
    never = threading.Event()

    def read(example):
        if next(served) >= BLOCK_AFTER_EXAMPLES:
            never.wait()  # blocks the training thread, as a hung read() would
        return example

    return dataclasses.replace(base, dataset=base.dataset.map(read), name="blocking-data")


# Examples the exiting trainer's dataset serves before it calls sys.exit(0).
EXIT_AFTER_EXAMPLES = 40


def sys_exit_trainer(config: dict) -> Trainer:
    """The built-in LM whose data pipeline calls `sys.exit(0)` after `EXIT_AFTER_EXAMPLES`
    examples (a library "quitting cleanly" at the end of its data): exit code 0 must not
    pass for a finished job."""
    import itertools
    import sys

    base = make_trainer(config)
    served = itertools.count()

    def read(example):
        if next(served) >= EXIT_AFTER_EXAMPLES:
            sys.exit(0)
        return example

    return dataclasses.replace(base, dataset=base.dataset.map(read), name="sys-exit")
