"""NaN/inf checks of a training step, for both loops (the built-in trainer's and the library's).

A non-finite loss means the run trains on garbage; a non-finite parameter or
optimizer state, once checkpointed, is what every resume would start from.
Both loops stop at the first such step with the same `FloatingPointError`,
naming the step and the last committed checkpoint step, and never save it.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp


def all_finite(tree: Any) -> jax.Array:
    """A scalar bool array: every floating-point leaf of `tree` is finite (integer leaves are ignored).

    Jit-traceable, so a loop can compute it inside its jitted update.
    """
    checks = [jnp.all(jnp.isfinite(x)) for x in jax.tree_util.tree_leaves(tree)
              if jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact)]
    return jnp.all(jnp.stack(checks)) if checks else jnp.asarray(True)


def check_step_finite(step: int, loss: float | None, state_finite: bool | None,
                      last_committed_step: int | None) -> None:
    """Raises when step `step`'s loss or the state it produced holds NaN or inf.

    Args:
      step: the step just computed (1-based: the step count once it completes).
      loss: its loss, or None (not checked).
      state_finite: `bool(all_finite(new_state))`, or None (not checked).
      last_committed_step: the newest committed checkpoint step, for the message.

    Raises:
      FloatingPointError: the loss is NaN/inf, or `state_finite` is False.
    """
    if loss is not None and not math.isfinite(float(loss)):
        raise FloatingPointError(f"loss is {float(loss)} at step {step}; stopping instead of training on garbage "
                                 f"(last committed step: {last_committed_step})")
    if state_finite is False:
        # Never let non-finite state reach a checkpoint: every resume would start from it.
        raise FloatingPointError(
            f"the update of step {step} made the parameters or optimizer state non-finite (NaN/inf); "
            f"step {step} is not saved; last committed step: {last_committed_step}")
