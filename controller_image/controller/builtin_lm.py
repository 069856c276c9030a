"""The built-in trainer: a small byte-level decoder-only transformer LM.

Entry point `elastic_jax.controller.builtin_lm:make_trainer`, the default of
`spec.controller.trainer.entryPoint`. It trains on real text (by default the
running interpreter's standard library, see `data.text_examples`). The
defaults (438k parameters) are sized for a 2-core machine: one jitted
forward+backward+AdamW step on a global batch of 32 took 64 ms at best and
117 ms median on a busy host (24 examples: 50 / 98 ms), and the loss fell from
6.0 nats per byte to 2.65 by step 50 and 1.96 by step 200.

The architecture is GPT-2's (Radford et al. 2019, "Language Models are
Unsupervised Multitask Learners"): pre-LayerNorm residual blocks of causal
multi-head self-attention and a GELU MLP, learned positions, a final
LayerNorm and an output layer tied to the token embedding; no dropout, so the
forward pass is a pure function of the parameters and exports with
`jax.export`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
import pydantic
from pydantic.alias_generators import to_camel

from elastic_jax.api.manifest import shown, type_problem
from elastic_jax.controller.data import text_examples
from elastic_jax.controller.trainer import Trainer, TrainerConfigError

CONFIG_FIELD = "spec.controller.trainer.config"
VOCAB_SIZE = 256  # one token per byte value


class BuiltinLMConfig(pydantic.BaseModel):
    """`spec.controller.trainer.config` of the built-in trainer (camelCase keys)."""

    model_config = pydantic.ConfigDict(extra="forbid", alias_generator=to_camel, frozen=True)

    data: str = pydantic.Field(
        "stdlib",
        min_length=1,
        description='"stdlib" (the interpreter\'s standard library .py files), a local glob, or gs://bucket/prefix.',
    )
    max_bytes: int = pydantic.Field(4_000_000, gt=0, description="Bytes of text read, at most.")
    seq_len: int = pydantic.Field(64, gt=0, description="Tokens (bytes) per example fed to the model.")
    d_model: int = pydantic.Field(128, gt=0, description="Width of the residual stream.")
    num_layers: int = pydantic.Field(
        2, gt=0, le=256,
        description="Transformer blocks, at most 256: each is traced into the step program, so compiling grows with it.")
    num_heads: int = pydantic.Field(4, gt=0, description="Attention heads; must divide dModel.")
    mlp_dim: int = pydantic.Field(512, gt=0, description="Hidden width of each block's MLP.")
    learning_rate: float = pydantic.Field(3e-3, gt=0, description="Peak AdamW learning rate.")
    warmup_steps: int = pydantic.Field(50, ge=0, description="Linear warmup from 0 to learningRate, in steps.")
    decay_steps: int = pydantic.Field(
        2000, gt=0, description="Step at which the cosine decay reaches 0.1 x learningRate (warmup included)."
    )
    weight_decay: float = pydantic.Field(0.1, ge=0, description="AdamW decoupled weight decay on matrices.")
    grad_clip_norm: float = pydantic.Field(1.0, gt=0, description="Global gradient norm clip.")

    @pydantic.field_validator("num_heads")
    @classmethod
    def _heads_divide_width(cls, num_heads: int, info: pydantic.ValidationInfo) -> int:
        d_model = info.data.get("d_model")
        if d_model is not None and d_model % num_heads:
            raise ValueError(f"must divide dModel ({d_model})")
        return num_heads

    @pydantic.field_validator("decay_steps")
    @classmethod
    def _decay_after_warmup(cls, decay_steps: int, info: pydantic.ValidationInfo) -> int:
        warmup_steps = info.data.get("warmup_steps")
        if warmup_steps is not None and decay_steps <= warmup_steps:
            raise ValueError(f"must be greater than warmupSteps ({warmup_steps})")
        return decay_steps


# Bytes of training state per parameter: the float32 parameter, its gradient and AdamW's two moments.
STATE_BYTES_PER_PARAM = 16
# The keys that size the model, in the order a message lists them.
_SIZE_KEYS = ("numLayers", "dModel", "mlpDim", "numHeads", "seqLen")


def param_count(cfg: BuiltinLMConfig) -> int:
    """Parameters of `make_model(cfg)`, counted from the config alone (no array is made; a test checks it
    against `jax.eval_shape` of the model's init).

    Returns:
      The count: the byte and position embeddings (the output layer is tied), per block two LayerNorms,
      attention's query/key/value/output projections with biases and the MLP's two layers with biases, and
      the final LayerNorm.
    """
    d, m = cfg.d_model, cfg.mlp_dim
    block = 2 * (2 * d) + 4 * (d * d + d) + (d * m + m) + (m * d + d)
    return VOCAB_SIZE * d + cfg.seq_len * d + cfg.num_layers * block + 2 * d


def activation_bytes_per_example(cfg: BuiltinLMConfig) -> int:
    """A lower bound of the float32 activations one example keeps for the backward pass: per block the
    attention weights (heads x seqLen x seqLen) and the residual and MLP widths per position; then the logits."""
    t = cfg.seq_len
    per_block = cfg.num_heads * t * t + t * (4 * cfg.d_model + cfg.mlp_dim)
    return 4 * (cfg.num_layers * per_block + t * VOCAB_SIZE)


def memory_limit_bytes() -> int | None:
    """The memory this process may use: the smaller of the host's RAM and its cgroup's limit (a pod's memory
    limit, cgroup v2 `memory.max` or v1 `memory.limit_in_bytes`); None when neither can be read."""
    limits = []
    try:
        limits.append(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError):
        pass
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            limits.append(int(text))
    return min(limits) if limits else None


def size_problem(cfg: BuiltinLMConfig, limit_bytes: int | None = None) -> str | None:
    """Why the model `cfg` describes cannot train here: its training state (`STATE_BYTES_PER_PARAM` per
    parameter) plus one example's activations exceed `limit_bytes` (default `memory_limit_bytes()`); None when
    it fits or the limit is unknown.

    Without it an absurd size (`numLayers: 1000000000`) passed and the controller sat at step 0, tracing,
    with no word (the local trial of session 21).
    """
    limit = memory_limit_bytes() if limit_bytes is None else limit_bytes
    if limit is None:
        return None
    params = param_count(cfg)
    need = params * STATE_BYTES_PER_PARAM + activation_bytes_per_example(cfg)
    if need <= limit:
        return None
    values = cfg.model_dump(by_alias=True)
    sizes = ", ".join(f"{k} {values[k]}" for k in _SIZE_KEYS)
    return (f"{CONFIG_FIELD}: the model is too large for this host: {sizes} make {params:,} parameters, whose "
            f"training state (parameters, gradients, AdamW moments: {STATE_BYTES_PER_PARAM} bytes each) and one "
            f"example's activations need at least {_gib(need)}, more than the {_gib(limit)} of memory here")


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB" if n < 2**60 else f"{n / 2**30:.3g} GiB"


def _problem(err: Any) -> str:
    """One pydantic error of the config as a line naming `spec.controller.trainer.config.<key>`."""
    key = ".".join(str(part) for part in err["loc"])
    field = f"{CONFIG_FIELD}.{key}" if key else CONFIG_FIELD
    value = err.get("input")
    if err["type"] == "int_type" and isinstance(value, float):  # (`1e30`, `64.0`: what the key needs, and why)
        return f"{field}: {type_problem('int_type', value)}"
    # (a number as the manifest wrote it: `1e30`, not the float's `1e+30`)
    got = "" if err["type"] == "extra_forbidden" else f" (got {shown(value)})"
    return f"{field}: {err['msg'].removeprefix('Value error, ')}{got}"  # (pydantic's prefix of a validator's words)


def parse_config(config: Mapping[str, Any] | None) -> BuiltinLMConfig:
    """Validates the manifest's trainer config.

    Raises:
      TrainerConfigError: unknown keys, wrong types or out-of-range values: every one of them
        (`problems`), each a one-line message naming `spec.controller.trainer.config.<key>`; or a model
        too large for this host's memory (`size_problem`).
    """
    try:
        # Strict, as the manifest is: seqLen: "64" is refused, not coerced.
        cfg = BuiltinLMConfig.model_validate(dict(config or {}), strict=True)
    except pydantic.ValidationError as e:
        raise TrainerConfigError(*[_problem(err) for err in e.errors()]) from None
    too_large = size_problem(cfg)
    if too_large:
        raise TrainerConfigError(too_large)
    return cfg


# The keys the data source is opened with (`text_examples`).
_DATA_KEYS = ("data", "maxBytes", "seqLen")


def _data_problems(config: Mapping[str, Any] | None) -> list[str]:
    """What opening the data source finds wrong, for a config that failed elsewhere: [] when one of the keys
    it reads (`_DATA_KEYS`) failed itself (its own error says so) or the data opens fine."""
    given = {k: v for k, v in dict(config or {}).items() if k in _DATA_KEYS}
    try:
        cfg = BuiltinLMConfig.model_validate(given, strict=True)
    except pydantic.ValidationError:
        return []
    try:
        text_examples(cfg.data, cfg.seq_len, cfg.max_bytes, field=f"{CONFIG_FIELD}.data")
    except TrainerConfigError as e:
        return list(e.problems)
    return []


class Block(nn.Module):
    """Pre-LayerNorm transformer block: `x + attn(ln(x))`, then `x + mlp(ln(x))`."""

    num_heads: int
    mlp_dim: int

    @nn.compact
    def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
        d_model = x.shape[-1]
        h = nn.LayerNorm()(x)
        x = x + nn.MultiHeadDotProductAttention(num_heads=self.num_heads, deterministic=True)(h, mask=mask)
        h = nn.LayerNorm()(x)
        h = nn.Dense(d_model)(nn.gelu(nn.Dense(self.mlp_dim)(h)))
        return x + h


class ByteLM(nn.Module):
    """Decoder-only byte-level transformer.

    Call: `tokens int32 [batch, t]` with `t <= max_len` -> `logits float32
    [batch, t, 256]`, position `p` predicting byte `p + 1`.
    """

    max_len: int
    d_model: int
    num_layers: int
    num_heads: int
    mlp_dim: int

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        embed = nn.Embed(VOCAB_SIZE, self.d_model)
        positions = nn.Embed(self.max_len, self.d_model, name="positions")
        x = embed(tokens) + positions(jnp.arange(tokens.shape[-1]))
        mask = nn.make_causal_mask(tokens)
        for _ in range(self.num_layers):
            x = Block(self.num_heads, self.mlp_dim)(x, mask)
        # Tied output layer (as GPT-2): logits are similarities to the byte embeddings.
        return embed.attend(nn.LayerNorm()(x))


def make_model(config: BuiltinLMConfig) -> ByteLM:
    """The `ByteLM` a validated config describes."""
    return ByteLM(
        max_len=config.seq_len,
        d_model=config.d_model,
        num_layers=config.num_layers,
        num_heads=config.num_heads,
        mlp_dim=config.mlp_dim,
    )


def make_optimizer(config: BuiltinLMConfig) -> optax.GradientTransformation:
    """Global-norm clipping, then AdamW with linear warmup and cosine decay.

    Weight decay applies to matrices only (ndim >= 2), not to biases and
    LayerNorm scales, as in GPT-2/nanoGPT practice.
    """
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=config.learning_rate,
        warmup_steps=config.warmup_steps,
        decay_steps=config.decay_steps,
        end_value=0.1 * config.learning_rate,
    )
    return optax.chain(
        optax.clip_by_global_norm(config.grad_clip_norm),
        optax.adamw(
            schedule,
            weight_decay=config.weight_decay,
            mask=lambda params: jax.tree.map(lambda p: p.ndim >= 2, params),
        ),
    )


def make_trainer(config: Mapping[str, Any] | None) -> Trainer:
    """Builds the built-in byte-level LM trainer from `spec.controller.trainer.config`.

    Args:
      config: camelCase keys of `BuiltinLMConfig`, all optional.

    Returns:
      A `Trainer` whose batches are `{"tokens": int32 [n, seqLen + 1]}`;
      `loss_fn` returns (sum of next-byte cross-entropy in nats over the
      `n * seqLen` predicted bytes, `n * seqLen`), both float32 scalars.

    Raises:
      TrainerConfigError: invalid config, or the data source holds no usable
        text: every problem found (`problems`, each naming its key; the data source is
        opened too when only other keys failed).
    """
    try:
        cfg = parse_config(config)
    except TrainerConfigError as e:  # the data source too, so one run names every problem
        raise TrainerConfigError(*e.problems, *_data_problems(config)) from None
    model = make_model(cfg)
    dataset = text_examples(cfg.data, cfg.seq_len, cfg.max_bytes, field=f"{CONFIG_FIELD}.data")

    # Jitted: one compilation instead of one per initializer op run eagerly.
    @jax.jit
    def init_params(key: jax.Array) -> dict:
        return model.init(key, jnp.zeros((1, cfg.seq_len), jnp.int32))["params"]

    def loss_fn(params: dict, batch: Mapping[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
        tokens = batch["tokens"]
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        logits = model.apply({"params": params}, inputs).astype(jnp.float32)
        loss_sum = optax.softmax_cross_entropy_with_integer_labels(logits, targets).sum()
        return loss_sum, jnp.asarray(targets.size, jnp.float32)

    return Trainer(
        init_params=init_params,
        loss_fn=loss_fn,
        optimizer=make_optimizer(cfg),
        dataset=dataset,
        tokens_per_example=cfg.seq_len,
        name="builtin-byte-lm",
    )
