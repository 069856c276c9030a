"""CPU slice workers as real processes: exported steps, real signals, error classes.

Each test starts its own `elastic-jax-worker` processes through the
`worker_factory` fixture (tests/support/workers.py), which stops them by PID.
"""

from __future__ import annotations

import json
import signal
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from elastic_jax import contract
from elastic_jax.controller.elastic.errors import SliceDownError, SliceExecutionError, is_slice_down
from elastic_jax.controller.slice_client import SliceClient, StepProgram, export_program, program_from_exported
from tests.support.workers import TOKEN, free_port

pytestmark = pytest.mark.timeout(120)

# A fresh worker compiles on the first call; keep deadlines of ordinary steps
# generous so a busy 2-core machine does not turn compilation into a "hang".
STEP_TIMEOUT_S = 60.0


def mlp_loss(params, batch):
    hidden = jnp.tanh(batch["x"] @ params["w1"] + params["b1"])
    prediction = hidden @ params["w2"] + params["b2"]
    return jnp.mean((prediction - batch["y"]) ** 2)


def make_params(seed=0):
    rng = np.random.default_rng(seed)
    return {
        "w1": rng.normal(size=(16, 32)).astype(np.float32),
        "b1": np.zeros(32, np.float32),
        "w2": rng.normal(size=(32, 4)).astype(np.float32),
        "b2": np.zeros(4, np.float32),
    }


def make_batch(seed, rows=8):
    rng = np.random.default_rng(seed)
    return {"x": rng.normal(size=(rows, 16)).astype(np.float32), "y": rng.normal(size=(rows, 4)).astype(np.float32)}


def flat(*trees):
    return jax.tree.leaves(trees)


def assert_matches(outputs, expected_tree):
    expected = [np.asarray(leaf) for leaf in jax.tree.leaves(expected_tree)]
    assert len(outputs) == len(expected)
    for got, want in zip(outputs, expected):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def grad_step():
    """The jitted MLP step `(params, batch) -> (loss, grads)` and its exported program."""
    step = jax.jit(jax.value_and_grad(mlp_loss))
    return step, export_program(step, make_params(), make_batch(0))


@pytest.fixture(scope="module")
def spin_program():
    """A step that runs as long as its `iterations` input says: a step still in flight on demand."""

    def spin(x, iterations):
        return jax.lax.fori_loop(0, iterations, lambda _, a: jnp.tanh(a @ a), x)

    x = np.eye(256, dtype=np.float32)
    return export_program(jax.jit(spin), x, np.int32(1)), x


def test_steps_on_two_workers_match_in_process(worker_factory, grad_step):
    step, program = grad_step
    workers = worker_factory.start_many(2)
    params = make_params()
    clients = [SliceClient(w.slice_index, w.address, TOKEN) for w in workers]
    try:
        for client in clients:
            client.load_program(program, timeout_s=STEP_TIMEOUT_S)
            client.load_program(program, timeout_s=STEP_TIMEOUT_S)  # idempotent
        for step_index in range(3):
            batches = [make_batch(10 * step_index + i) for i in range(2)]
            futures = [c.step_async(program, flat(params, b), STEP_TIMEOUT_S) for c, b in zip(clients, batches)]
            for future, batch in zip(futures, batches):
                assert_matches(future.result(), step(params, batch))
        for client, worker in zip(clients, workers):
            info = client.ping(timeout_s=5)
            assert info == {
                "slice_index": worker.slice_index,
                "pid": worker.pid,
                "device_count": 1,
                "program_hashes": [program.hash],
                "compiled_hashes": [program.hash],
            }
    finally:
        for client in clients:
            client.close()


def _compiles(worker) -> list[str]:
    """The `trigger` of each "program compiled" line in a worker's log (load: warmed ahead; step: on a step)."""
    lines = [json.loads(x) for x in worker.log_path.read_text().splitlines() if x.startswith("{")]
    return [x["trigger"] for x in lines if x.get("msg") == "program compiled"]


def test_load_with_compile_warms_the_worker_so_its_first_step_does_not_compile(worker_factory, grad_step):
    """Warm spares: a Load with compile=True compiles before answering; the first step then runs the executable."""
    step, program = grad_step
    cold, warm = worker_factory.start_many(2)
    params, batch = make_params(), make_batch(3)
    with SliceClient(cold.slice_index, cold.address, TOKEN) as c, SliceClient(warm.slice_index, warm.address, TOKEN) as w:
        c.load_program(program, timeout_s=STEP_TIMEOUT_S)
        w.load_program(program, timeout_s=STEP_TIMEOUT_S, compile=True)
        assert c.ping()["compiled_hashes"] == [] and w.ping()["compiled_hashes"] == [program.hash]
        w.load_program(program, timeout_s=STEP_TIMEOUT_S, compile=True)  # idempotent: compiled once
        for client in (c, w):
            assert_matches(client.step_async(program, flat(params, batch), STEP_TIMEOUT_S).result(), step(params, batch))
        assert c.ping()["compiled_hashes"] == [program.hash]
    assert _compiles(cold) == ["step"]
    assert _compiles(warm) == ["load"]


def test_connection_refused_is_slice_down_within_a_second():
    with SliceClient(3, f"127.0.0.1:{free_port()}", TOKEN) as client:
        program = StepProgram(hash="0" * 64, blob=b"", input_count=0)
        started = time.monotonic()
        with pytest.raises(SliceDownError) as caught:
            client.step_async(program, [], timeout_s=30).result()
        assert time.monotonic() - started < 1.0
        assert caught.value.cause == "slice_down" and caught.value.slice_indices == (3,)
        assert is_slice_down(caught.value)
        with pytest.raises(SliceDownError):
            client.ping(timeout_s=30)


def test_sigkill_mid_step_fails_the_step_fast(worker_factory, spin_program):
    program, x = spin_program
    worker = worker_factory()
    with SliceClient(worker.slice_index, worker.address, TOKEN) as client:
        client.step_async(program, [x, np.int32(1)], STEP_TIMEOUT_S).result()  # compiled now
        future = client.step_async(program, [x, np.int32(10_000_000)], STEP_TIMEOUT_S)
        time.sleep(0.5)
        assert not future.done(), "the step should still be running"
        killed_at = time.monotonic()
        worker.kill(signal.SIGKILL)
        with pytest.raises(SliceDownError) as caught:
            future.result(timeout=10)
        fail_s = time.monotonic() - killed_at
        assert caught.value.cause == "slice_down"
        assert fail_s < 1.0, f"SIGKILL took {fail_s:.3f} s to surface"
        # Later calls on the same client fail fast as well, without the deadline.
        started = time.monotonic()
        with pytest.raises(SliceDownError):
            client.step_async(program, [x, np.int32(1)], STEP_TIMEOUT_S).result()
        assert time.monotonic() - started < 1.0


def test_sigstopped_worker_misses_the_step_deadline(worker_factory, grad_step):
    _, program = grad_step
    worker = worker_factory()
    params = make_params()
    with SliceClient(worker.slice_index, worker.address, TOKEN) as client:
        client.step_async(program, flat(params, make_batch(1)), STEP_TIMEOUT_S).result()
        worker.kill(signal.SIGSTOP)  # teardown sends SIGCONT before SIGTERM
        started = time.monotonic()
        with pytest.raises(SliceDownError) as caught:
            client.step_async(program, flat(params, make_batch(2)), timeout_s=1.5).result(timeout=10)
        elapsed_s = time.monotonic() - started
        assert caught.value.cause == "step_deadline"
        assert 1.4 < elapsed_s < 3.0


def test_program_errors_on_the_worker_are_execution_errors(worker_factory, grad_step):
    _, good = grad_step
    # Lowered for TPU only: exporting works here, running fails on the CPU worker.
    tpu_program = program_from_exported(
        jax.export.export(jax.jit(jnp.sin), platforms=("tpu",))(np.ones(3, np.float32))
    )
    # Exported for a 2-device slice; this worker has 1 device.
    two_devices = export_program(
        jax.jit(jnp.sin, in_shardings=NamedSharding(AbstractMesh((2,), ("data",)), P("data"))),
        jax.ShapeDtypeStruct((4,), np.float32),
    )
    worker = worker_factory()
    with SliceClient(worker.slice_index, worker.address, TOKEN) as client:
        with pytest.raises(SliceExecutionError, match="tpu") as caught:
            client.step_async(tpu_program, [np.ones(3, np.float32)], STEP_TIMEOUT_S).result()
        assert caught.value.slice_index == worker.slice_index
        assert not is_slice_down(caught.value)

        with pytest.raises(SliceExecutionError, match="exported for 2 devices"):
            client.load_program(two_devices, timeout_s=STEP_TIMEOUT_S)
        with pytest.raises(SliceExecutionError, match="exported for 2 devices"):
            client.step_async(two_devices, [np.ones(4, np.float32)], STEP_TIMEOUT_S).result()

        wrong_shape = flat(make_params(), make_batch(0, rows=5))
        with pytest.raises(SliceExecutionError, match=r"expected float32\[8, 16\]"):
            client.step_async(good, wrong_shape, STEP_TIMEOUT_S).result()

        tampered = StepProgram("f" * 64, good.blob, good.input_count)
        with pytest.raises(SliceExecutionError, match="hash mismatch"):
            client.load_program(tampered, timeout_s=STEP_TIMEOUT_S)

        assert client.ping(timeout_s=5)["program_hashes"] == [tpu_program.hash, good.hash]


def test_restarted_worker_gets_the_program_again_transparently(worker_factory, grad_step):
    step, program = grad_step
    worker = worker_factory()
    params, batch = make_params(), make_batch(5)
    with SliceClient(worker.slice_index, worker.address, TOKEN) as client:
        assert_matches(client.step_async(program, flat(params, batch), STEP_TIMEOUT_S).result(), step(params, batch))
        old_pid = worker.pid
        info = worker.restart()
        assert info["pid"] != old_pid and info["program_hashes"] == []
        # NOT_FOUND on the new process -> Load -> Step, inside one future.
        assert_matches(client.step_async(program, flat(params, batch), STEP_TIMEOUT_S).result(), step(params, batch))
        assert client.ping(timeout_s=5)["program_hashes"] == [program.hash]


def test_two_host_devices_run_a_batch_sharded_export(worker_factory):
    # The controller has one device; an abstract mesh describes the slice's two.
    mesh = AbstractMesh((2,), ("data",), axis_types=(AxisType.Explicit,))
    replicated, by_rows = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    params, batch = make_params(), make_batch(7)
    sharded_step = jax.jit(
        jax.value_and_grad(mlp_loss),
        in_shardings=(jax.tree.map(lambda _: replicated, params), jax.tree.map(lambda _: by_rows, batch)),
    )
    spec = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), (params, batch))
    program = export_program(sharded_step, *spec)
    worker = worker_factory(host_devices=2)
    with SliceClient(worker.slice_index, worker.address, TOKEN) as client:
        assert client.ping(timeout_s=5)["device_count"] == 2
        outputs = client.step_async(program, flat(params, batch), STEP_TIMEOUT_S).result()
    assert_matches(outputs, jax.jit(jax.value_and_grad(mlp_loss))(params, batch))
    # SIGTERM is a graceful stop, and the structured log says so; the exit code is 143, never 0,
    # so a gracefully deleted worker pod fails its Job and the JobSet replaces the slice.
    assert worker.stop() == 143
    log_lines = [json.loads(line) for line in worker.log_path.read_text().splitlines() if line.startswith("{")]
    messages = [line["msg"] for line in log_lines]
    assert messages[0] == "serving" and messages[-1] == "stopped"
    assert log_lines[0]["address"] == worker.address and log_lines[0]["device_count"] == 2


# -- security (issue 9, item 14) -------------------------------------------------------------


def test_calls_without_the_token_are_refused(worker_factory, grad_step):
    import grpc

    from elastic_jax import wire

    worker = worker_factory()
    _, program = grad_step
    with grpc.insecure_channel(worker.address) as channel:
        for metadata in (None, wire.auth_metadata("wrong"), (("authorization", TOKEN),)):
            for method, request in ((wire.PING, b""), (wire.LOAD, wire.pack_load_request(program.hash, program.blob)),
                                    (wire.STEP, wire.pack_step_request(program.hash, []))):
                with pytest.raises(grpc.RpcError) as e:
                    channel.unary_unary(wire.method_path(method))(request, metadata=metadata, timeout=10)
                assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED, (method, metadata)
                assert program.hash not in (e.value.details() or "")
    with SliceClient(worker.slice_index, worker.address, "wrong") as client:
        with pytest.raises(SliceDownError, match="UNAUTHENTICATED"):
            client.ping()
    with SliceClient(worker.slice_index, worker.address, TOKEN) as client:
        assert client.ping()["program_hashes"] == []  # nothing was loaded by the refused calls


def test_a_worker_without_a_token_does_not_start(tmp_path):
    import subprocess

    from tests.support.workers import WORKER_COMMAND

    env = {k: v for k, v in __import__("os").environ.items() if k != contract.ENV_TOKEN_FILE}
    proc = subprocess.run([*WORKER_COMMAND, "--port", "0"], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2 and "no token" in proc.stderr


def test_a_worker_told_text_logs_human_lines(worker_factory):
    """`ELASTIC_JAX_LOG_FORMAT` (a user setting of `spec.worker.env`) reaches the worker too: `text` gives the
    same human lines as the controller and the operator; before, the worker wrote JSON whatever it said."""
    worker = worker_factory(env={**__import__("os").environ, contract.ENV_LOG_FORMAT: "text"})
    deadline = time.monotonic() + 30  # (the line follows the server's start, which a Ping may beat)
    while "elastic_jax.worker: serving" not in worker.log_tail() and time.monotonic() < deadline:
        time.sleep(0.1)
    lines = [line for line in worker.log_tail().splitlines() if line.strip()]
    assert any(" INFO    elastic_jax.worker: serving" in line for line in lines), lines
    assert not any(line.lstrip().startswith("{") for line in lines), lines


def test_a_program_calling_a_custom_call_outside_the_allow_list_is_refused(worker_factory):
    # jnp.linalg.inv on CPU lowers to LAPACK custom calls: native code the worker would run.
    program = export_program(jax.jit(jnp.linalg.inv), np.eye(3, dtype=np.float32))
    worker = worker_factory()
    with SliceClient(worker.slice_index, worker.address, TOKEN) as client:
        with pytest.raises(SliceExecutionError, match=r"custom-call target\(s\) \['lapack_"):
            client.load_program(program)
        assert client.ping()["program_hashes"] == []
    # A job that needs them says so on its workers.
    allowed = worker_factory(slice_index=1, env={contract.ENV_ALLOWED_CUSTOM_CALLS: "lapack_sgetrf_ffi,lapack_strsm_ffi"})
    with SliceClient(allowed.slice_index, allowed.address, TOKEN) as client:
        client.load_program(program)
        (inverse,) = client.step_async(program, [2 * np.eye(3, dtype=np.float32)], STEP_TIMEOUT_S).result()
        np.testing.assert_allclose(inverse, 0.5 * np.eye(3))


def test_our_built_in_step_needs_no_custom_call():
    # The allow list's premise: the runtime's own step (the built-in trainer) contains none.
    from elastic_jax.controller.backend_cpu import make_slice_step
    from elastic_jax.controller.builtin_lm import make_trainer
    from elastic_jax.controller.data import global_batches
    from elastic_jax.worker.program_cache import DEFAULT_ALLOWED_CUSTOM_CALLS, custom_call_targets

    trainer = make_trainer({"maxBytes": 100_000, "seqLen": 8, "dModel": 16, "numLayers": 1, "numHeads": 2, "mlpDim": 32})
    params = trainer.init_params(jax.random.key(0))
    batch = global_batches(trainer.dataset, 2, seed=0)[0]
    exported = jax.export.export(jax.jit(make_slice_step(trainer)))(params, batch)
    assert custom_call_targets(exported) <= DEFAULT_ALLOWED_CUSTOM_CALLS


def test_program_cache_is_bounded_by_bytes_least_recently_used_first(worker_factory):
    programs = [export_program(jax.jit(lambda x, k=k: x * k + jnp.sum(x)), np.ones(4, np.float32)) for k in range(3)]
    biggest = max(len(p.blob) for p in programs)
    worker = worker_factory(extra_args=("--cache-bytes", str(2 * biggest + 1)))
    with SliceClient(worker.slice_index, worker.address, TOKEN) as client:
        client.load_program(programs[0])
        client.load_program(programs[1])
        client.step_async(programs[0], [np.ones(4, np.float32)], STEP_TIMEOUT_S).result()  # 0 is now the most recent
        client.load_program(programs[2])  # evicts 1, the least recently used
        assert client.ping()["program_hashes"] == [programs[0].hash, programs[2].hash]
        # An evicted program is reloaded transparently by the next step.
        (out,) = client.step_async(programs[1], [np.ones(4, np.float32)], STEP_TIMEOUT_S).result()
        np.testing.assert_allclose(out, np.ones(4) * 1 + 4)
        assert len(client.ping()["program_hashes"]) == 2


def test_messages_over_the_cap_fail_with_a_clear_error(worker_factory, grad_step, monkeypatch):
    from elastic_jax import wire

    _, program = grad_step
    worker = worker_factory()
    monkeypatch.setenv(wire.MAX_MESSAGE_BYTES_ENV, "1024")
    with SliceClient(worker.slice_index, worker.address, TOKEN) as client:
        with pytest.raises(wire.MessageTooLargeError, match=contract.ENV_MAX_MESSAGE_BYTES):
            client.step_async(program, flat(make_params(), make_batch(0)), STEP_TIMEOUT_S)


def test_a_spare_reads_warming_from_the_first_step_until_it_compiled(worker_factory):
    """Session 12's trial: a hot spare read plain `Spare` (the job's status: plain Ready, no warming reason)
    from the start until after the first step, though it had compiled nothing: the first program exists only
    once the first step exports it, and the spare was warmed (and said `Warming`) only at the next step
    boundary. The cpu backend warms the Ready slices outside the mesh as soon as it exports a program."""
    from elastic_jax.api.control import SliceReport
    from elastic_jax.controller.backend_cpu import CpuBackend
    from elastic_jax.controller.elastic.slice_set import SliceSet

    active, spare = worker_factory.start_many(2)
    slices = SliceSet(1, spares=1)
    for w in (active, spare):
        slices.apply_report(w.slice_index, SliceReport(state="Ready", generation=time.time_ns(), addresses=[w.address]))
    slices.set_active({active.slice_index})
    backend = CpuBackend(slices, token=TOKEN, first_step_deadline_s=STEP_TIMEOUT_S)

    def sum_step(params, chunk):
        return {"loss": jnp.sum((chunk["x"] @ params["w"]) ** 2)}

    params, batch = {"w": np.ones((2, 1), np.float32)}, {"x": np.ones((4, 2), np.float32)}
    out = backend.map_sum(sum_step, params, batch, [active.slice_index])
    assert float(out["loss"]) == 16.0
    # said at once (the manager's next step boundary then finds it warm: `Spare` again)
    assert [s.state for s in slices.statuses()] == ["Active", "Warming"]
    deadline = time.monotonic() + STEP_TIMEOUT_S
    while time.monotonic() < deadline and not backend.prepare({spare.slice_index}):
        time.sleep(0.1)
    assert backend.prepare({spare.slice_index}) == {spare.slice_index}
    assert _compiles(spare) == ["load"]  # compiled ahead, never inside a step
