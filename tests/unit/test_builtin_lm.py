"""Built-in byte-level LM: config validation, the slice-splitting property, export, learning."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from elastic_jax.controller.builtin_lm import make_trainer
from elastic_jax.controller.data import global_batches
from elastic_jax.controller.trainer import TrainerConfigError

# Small enough to compile and step in well under a second on a loaded 2-core machine.
# Compilation dominates these tests, so every test shares one config and one jitted step.
TINY = {
    "maxBytes": 300_000, "seqLen": 16, "dModel": 32, "numLayers": 1, "numHeads": 2, "mlpDim": 64,
    "learningRate": 1e-2, "warmupSteps": 5, "decaySteps": 100,
}


@pytest.fixture(scope="module")
def trainer():
    return make_trainer(TINY)


@pytest.fixture(scope="module")
def params(trainer):
    return trainer.init_params(jax.random.key(0))


@pytest.fixture(scope="module")
def batch(trainer):
    return global_batches(trainer.dataset, 24, seed=0)[0]


@pytest.fixture(scope="module")
def slice_step(trainer):
    """The per-slice computation the runtime ships: ((loss_sum, weight), grads)."""
    return jax.jit(jax.value_and_grad(trainer.loss_fn, has_aux=True))


def test_init_and_loss_are_finite(trainer, params, batch):
    assert batch["tokens"].shape == (24, 17) and trainer.tokens_per_example == 16
    loss_sum, weight = jax.jit(trainer.loss_fn)(params, batch)
    assert loss_sum.dtype == weight.dtype == jnp.float32 and loss_sum.shape == weight.shape == ()
    assert float(weight) == 24 * 16
    # An untrained byte model is near uniform: about ln(256) = 5.55 nats per byte.
    assert np.isfinite(float(loss_sum)) and 4.5 < float(loss_sum / weight) < 7.0


@pytest.mark.parametrize("sizes", [(8, 8, 8), (9, 8, 7)])
def test_summed_slices_equal_the_full_batch(slice_step, params, batch, sizes):
    step = slice_step
    (full_loss, full_weight), full_grads = step(params, batch)
    bounds = np.cumsum((0,) + sizes)
    parts = [step(params, {k: v[lo:hi] for k, v in batch.items()}) for lo, hi in zip(bounds[:-1], bounds[1:])]
    loss = sum(p[0][0] for p in parts)
    weight = sum(p[0][1] for p in parts)
    grads = jax.tree.map(lambda *g: sum(g), *(p[1] for p in parts))
    assert float(weight) == float(full_weight)
    np.testing.assert_allclose(loss, full_loss, rtol=1e-5)
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(full_grads)):
        np.testing.assert_allclose(got / weight, want / full_weight, rtol=1e-4, atol=1e-7)


def test_slice_step_exports_serializes_and_matches(slice_step, params, batch):
    part = {k: v[:8] for k, v in batch.items()}
    step = slice_step
    exported = jax.export.export(step)(params, part)
    restored = jax.export.deserialize(exported.serialize())
    (loss, weight), grads = restored.call(params, part)
    (want_loss, want_weight), want_grads = step(params, part)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
    assert float(weight) == float(want_weight)
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_a_few_optimizer_steps_lower_the_loss(trainer, params):
    batches = global_batches(trainer.dataset, 24, seed=0)
    opt_state = trainer.optimizer.init(params)

    @jax.jit
    def train_step(params, opt_state, batch):
        (loss_sum, weight), grads = jax.value_and_grad(trainer.loss_fn, has_aux=True)(params, batch)
        grads = jax.tree.map(lambda g: g / weight, grads)
        updates, opt_state = trainer.optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss_sum / weight

    losses = []
    for i in range(40):
        params, opt_state, loss = train_step(params, opt_state, batches[i])
        losses.append(float(loss))
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 1.0, losses


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"dropout": 0.1}, r"^spec\.controller\.trainer\.config\.dropout: Extra inputs are not permitted$"),
        ({"seqLen": 0}, r"^spec\.controller\.trainer\.config\.seqLen: Input should be greater than 0 \(got 0\)$"),
        ({"learningRate": "fast"}, r"^spec\.controller\.trainer\.config\.learningRate: Input should be a valid number"),
        ({"seqLen": "32"}, r"^spec\.controller\.trainer\.config\.seqLen: Input should be a valid integer \(got '32'\)$"),
        ({"dModel": 30, "numHeads": 4}, r"^spec\.controller\.trainer\.config\.numHeads: must divide dModel \(30\)"),
        ({"warmupSteps": 100, "decaySteps": 50}, r"^spec\.controller\.trainer\.config\.decaySteps: .*warmupSteps"),
        ({"data": "/nonexistent-dir/**/*.txt"}, r"^spec\.controller\.trainer\.config\.data: no files match"),
    ],
)
def test_bad_config_names_the_field(config, message):
    with pytest.raises(TrainerConfigError, match=message) as info:
        make_trainer(config)
    assert "\n" not in str(info.value)


def test_every_config_problem_is_reported_not_the_first():
    """A new-user trial: `validate --trainer` named one config mistake per run. Every key's error is one of
    `problems` now (each naming its key), and the data source is opened too when only other keys failed."""
    with pytest.raises(TrainerConfigError) as info:
        make_trainer({"dModle": 64, "numLayers": 0, "learningRate": "fast", "data": "/nonexistent-dir/*.txt"})
    problems = info.value.problems
    assert [p.split(":")[0] for p in problems] == [
        "spec.controller.trainer.config.numLayers", "spec.controller.trainer.config.learningRate",
        "spec.controller.trainer.config.dModle", "spec.controller.trainer.config.data"], problems
    assert "no files match" in problems[-1]
    assert str(info.value) == "; ".join(problems) and "\n" not in str(info.value)  # (the controller's one line)
    # A data key that failed itself: its own error, the data source is not opened with it.
    with pytest.raises(TrainerConfigError) as info:
        make_trainer({"seqLen": 0, "numLayers": 0, "data": "/nonexistent-dir/*.txt"})
    assert [p.split(":")[0] for p in info.value.problems] == [
        "spec.controller.trainer.config.seqLen", "spec.controller.trainer.config.numLayers"], info.value.problems


@pytest.mark.parametrize("config", [TINY, {"seqLen": 48, "dModel": 24, "numLayers": 3, "numHeads": 3, "mlpDim": 40}])
def test_the_counted_parameters_are_the_models(config):
    from elastic_jax.controller.builtin_lm import make_model, param_count, parse_config

    cfg = parse_config({k: v for k, v in config.items() if k in ("seqLen", "dModel", "numLayers", "numHeads", "mlpDim")})
    shapes = jax.eval_shape(lambda k: make_model(cfg).init(k, jnp.zeros((1, cfg.seq_len), jnp.int32)),
                            jax.random.key(0))
    assert param_count(cfg) == sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(shapes))


@pytest.mark.parametrize("config, words", [
    # the new user's trial: it sat at step 0, tracing a billion blocks, with no word
    ({"numLayers": 1_000_000_000}, "spec.controller.trainer.config.numLayers: Input should be less than or equal "
                                   "to 256 (got 1000000000)"),
    ({"dModel": 1_048_576}, "spec.controller.trainer.config: the model is too large for this host: numLayers 2, "
                            "dModel 1048576"),
    ({"mlpDim": 1 << 40}, "spec.controller.trainer.config: the model is too large for this host"),
    ({"seqLen": 1 << 24}, "spec.controller.trainer.config: the model is too large for this host"),
])
def test_an_absurd_model_size_is_refused_naming_the_config(config, words):
    with pytest.raises(TrainerConfigError) as info:
        make_trainer({**config, "maxBytes": 1000})
    assert any(p.startswith(words) for p in info.value.problems), info.value.problems
    assert all("\n" not in p for p in info.value.problems)


def test_the_size_rule_compares_with_the_memory_it_is_given():
    from elastic_jax.controller.builtin_lm import STATE_BYTES_PER_PARAM, parse_config, param_count, size_problem

    cfg = parse_config({})
    assert size_problem(cfg, limit_bytes=2**40) is None
    problem = size_problem(cfg, limit_bytes=param_count(cfg) * STATE_BYTES_PER_PARAM)
    assert problem and "more than the 0.0 GiB of memory here" in problem
