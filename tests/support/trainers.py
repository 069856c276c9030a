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
