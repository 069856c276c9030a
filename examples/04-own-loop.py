"""04: your own training loop on elastic-jax (library mode; docs/bring-your-own-loop.md).

Plain JAX + optax: a linear model learns y = x.w + 0.5 from synthetic data. The
global batch of step i is a pure function of i, so any slice may compute any
chunk of it; `map_sum` runs the per-slice function on the active slices and
adds what they return, and `elastic_retry` resumes at the last completed step
after a slice is lost, in this same process; `rt.save`/`rt.restore` (Orbax) resume
a restarted controller pod. Started by examples/04-own-loop.yaml.
"""
import logging
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax

import elastic_jax

DIM = 8


def slice_step(params, chunk):
    """Per slice: summed squared error, example count and summed gradients (sums add up over slices)."""
    def loss_sum(p):
        return jnp.sum((chunk["x"] @ p["w"] + p["b"] - chunk["y"]) ** 2)
    loss, grads = jax.value_and_grad(loss_sum)(params)
    return {"loss": loss, "count": jnp.float32(chunk["x"].shape[0]), "grads": grads}


def global_batch(step, size):
    rng = np.random.default_rng(step)
    x = rng.normal(size=(size, DIM)).astype(np.float32)
    return {"x": x, "y": (x @ np.linspace(-1, 1, DIM, dtype=np.float32) + 0.5).astype(np.float32)}


def main():
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")  # elastic events
    rt = elastic_jax.connect()  # serves the control API; the operator's slice reports arrive here
    rt.install_signal_handlers()
    steps, batch_size = rt.job.spec.training.steps, rt.job.spec.training.global_batch_size
    opt = optax.adam(0.05)
    params = {"w": jnp.zeros(DIM), "b": jnp.zeros(())}
    saved, step, _ = rt.restore({"params": params, "opt": opt.init(params)})  # (target, 0, {}) when none
    state = {"step": step, **saved}
    apply = jax.jit(lambda p, o, g: (lambda u, o2: (optax.apply_updates(p, u), o2))(*opt.update(g, o, p)))

    def save(force=False):  # every spec.checkpoint.intervalSteps; force: now, and wait for the commit
        rt.save(state["step"], {"params": state["params"], "opt": state["opt"]}, force=force)

    @rt.elastic_retry()  # waits for slices; retries from state["step"] after a slice loss or scale-up
    def train():
        while state["step"] < steps:
            if rt.stop_requested.is_set():
                raise elastic_jax.StopRequested("stop requested")
            rt.check_scale_up()  # a slice came back: the next attempt trains on it
            out = rt.map_sum(slice_step, state["params"], global_batch(state["step"], batch_size))
            grads = jax.tree.map(lambda g: g / out["count"], out["grads"])
            state["params"], state["opt"] = apply(state["params"], state["opt"], grads)
            state["step"] += 1
            rt.report_step(state["step"], float(out["loss"] / out["count"]))
            save()

    with rt:
        try:
            train()
        except elastic_jax.StopRequested:
            save(force=True)
            return rt.stop_exit_code or 75
        save(force=True)  # exit 0 only once the last step is committed
    print(f"done: step {state['step']} loss {rt.loss:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
