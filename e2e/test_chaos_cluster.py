"""The chaos benchmark's cluster arms at their smallest (`e2e/chaos.py`, `benchmarks/bench_chaos.py --arms cluster,...`).

Runs of the same job through the operator on the local control plane, each
failing arm (full restart, elastic) with the same plan: a worker SIGKILLed,
the operator SIGKILLed and restarted, and a worker's node lost and restored,
at fixed steps (not seconds, so the machine's speed does not decide whether
they happen). Both succeed and end with one loss: the two recover in unlike
ways (a restore from `gs://`, replica resize with no step lost), so no
recovery changed what was learned (a no-failure arm of its own, the third
job, was dropped in session 27 for this comparison); the elastic arm lost no
step and kept its controller. The restart arm has one failure, the node loss
at step 10, which takes the whole job down (the operator SIGKILLed at step 15
as in the other arm): the controller was recreated (the failure waiting for a
committed checkpoint: `Plan.after_commit`) and resumed from the newest step its
predecessor committed, in `gs://`, not from step 0; and the workers started
after the failure loaded their step
program from the shared compilation cache claim (`spec.compilationCache`: the
admin's hostPath PersistentVolume, a claim bound to it and the operator's
`--allowed-compilation-cache-claims`, as `e2e/chaos.py` `cache_claim` makes
them), which the first workers filled: `JAX_LOG_COMPILES=1` makes JAX log
each persistent-cache hit (was `test_compilation_cache_operator.py`, a job of
its own; the restart arm is where a replacement must load before the job
trains on, so the hit cannot be raced by the job's end). Keeps the
benchmark's cluster path from rotting; it times nothing.

The benchmark's `cluster-spare` arm is not run here: what it adds (a hot spare swapped in under the
operator, the controller kept, 0 steps lost, the same loss) is e2e/kind/test_spares.py's (a real
kubelet) and tests/integration/test_elastic_runtime.py's hot-spare tests'; `run_arm(spares=...)` is one
field of the same manifest.
"""

from __future__ import annotations

import dataclasses
import math
import random
import re

import pytest

from e2e.chaos import Plan, chaos_nodes, committed_steps, gcs_checkpoints, run_arm
from e2e.operator_fixtures import ejob_crd, operator_kubeconfig  # noqa: F401  (fixtures)
from elastic_jax.logs import read_events

pytestmark = pytest.mark.timeout(900)

STEPS = 60
# Every failing arm: a failure at steps 10 (a worker) and 20 (its node), the operator killed at step 15.
PLAN = Plan(every=10, unit="step", node_loss_tick=1, operator_kill_tick=0, max_ticks=2, node_down_s=5,
            operator_down_s=2)
RESTORED = re.compile(r"restored checkpoint step (\d+)")
# What JAX logs (at WARNING with jax_log_compiles) when it loads an executable from the persistent cache.
HIT = re.compile(r"Persistent compilation cache hit for '[^']+' with key '([^']+)'")


@pytest.fixture(scope="module")
def pool(cluster):
    with chaos_nodes(cluster):
        yield cluster


@pytest.fixture(scope="module")
def restart(pool, ejob_crd, operator_kubeconfig, tmp_path_factory):  # noqa: F811
    """The full-restart arm, once for the module: its own checks are its test's, and its final loss is the one the
    elastic arm must end with (a no-failure arm of its own cost 45-65 s: two arms that recover in unlike ways,
    replica resize and a restore from `gs://`, ending with one loss is what a lossless recovery shows).

    Returns:
      (the run, its workdir: the compilation cache folder is `workdir/xla-cache`).
    """
    workdir = tmp_path_factory.mktemp("restart")
    # after_commit: the failure waits for a checkpoint committed by the first controller. One whole-job failure,
    # the node loss (session 27: it had two, a worker's loss then its node's, each recreating the controller; a
    # restore from a step a resumed controller saved is tests/integration/test_faults.py::test_reruns_...'s
    # `restored_from_step == 40`, a recreated controller resuming from gs:// on a real kubelet is
    # e2e/kind/test_operator_lifecycle.py's).
    plan = dataclasses.replace(PLAN, whole_job=True, after_commit=True, node_loss_tick=0, max_ticks=1)
    with gcs_checkpoints(workdir / "gcs") as checkpoints:
        # A checkpoint every 5 steps: the failure at step 10 (or once a commit is logged) finds one.
        run = run_arm(pool, operator_kubeconfig, workdir, STEPS, plan, random.Random(0), ckpt_interval=5,
                      checkpoints=checkpoints, worker_env=[{"name": "JAX_LOG_COMPILES", "value": "1"}])
        assert checkpoints.emulator.metadata_connections == 0  # the controller's GCS clients stayed on the emulator
    return run, workdir


def _trained_through_the_plan(run, first: str, kinds: set[str]) -> None:
    """Succeeded at the last step, after failures of each of `kinds`, the first of kind `first`."""
    assert run.phase == "Succeeded", run
    assert run.finished["steps"] == STEPS, run.finished
    seen = [kind for _, kind, _ in run.failures]
    assert seen and seen[0] == first and set(seen) == kinds, run.failures


def test_elastic_arm_loses_no_step_and_matches_the_restart_arms_loss(pool, operator_kubeconfig, restart,  # noqa: F811
                                                                     tmp_path):
    chaos = run_arm(pool, operator_kubeconfig, tmp_path, STEPS, PLAN, random.Random(0))
    _trained_through_the_plan(chaos, "pod", {"pod", "operator", "node"})
    base = restart[0].finished
    assert math.isclose(chaos.finished["final_loss"], base["final_loss"], rel_tol=1e-5), \
        (chaos.finished["final_loss"], base["final_loss"])
    # The controller's own count: on an idle machine the job can end while the operator is down, and what a
    # controller counted after the operator's last pass is not in status.recoveries (operator/counters.py).
    assert len(chaos.finished["recoveries"]) >= 1, chaos.finished
    assert int(chaos.status.get("controllerRestarts") or 0) == 0, chaos.status
    assert len(chaos.controller_logs) == 1, chaos.controller_logs
    assert chaos.finished["steps_lost"] == 0, chaos.finished


def test_restart_arm_recreates_the_controller_from_its_gcs_checkpoint_and_loads_the_shared_cache(restart):
    run, workdir = restart
    _trained_through_the_plan(run, "node", {"node", "operator"})
    assert int(run.status.get("controllerRestarts") or 0) == 1, run.status
    assert len(run.controller_logs) == 2, run.controller_logs
    for killed, recreated in zip(run.controller_logs, run.controller_logs[1:]):
        # The recreated controller resumed from the newest step its killed predecessor logged as committed or,
        # where a later save committed in the instant between storage and its log line (then the SIGKILL), from
        # that later step: never an older one, never step 0, never past the last step trained.
        committed, trained = committed_steps(killed), [
            e["step"] for e in read_events(killed.read_text(errors="replace")) if e["event"] == "step"]
        restored = RESTORED.search(recreated.read_text(errors="replace"))
        what = (killed.name, committed, trained[-1:], recreated.name, restored and restored.group(0))
        assert committed and restored is not None, what
        assert 0 < max(committed) <= int(restored.group(1)) <= trained[-1], what

    # The shared compilation cache: the first workers compiled (the arm's cache folder was new: at least one of
    # them found nothing to load) and filled it; a worker started after a failure loaded its step program from it.
    hits = {uid: HIT.findall(log.read_text(errors="replace")) for uid, log in run.worker_logs.items()}
    first = [h for uid, h in hits.items() if uid in run.first_workers]
    later = [h for uid, h in hits.items() if uid not in run.first_workers]
    assert first and not all(first), ("a first worker found a cache it could not have", hits, run.first_workers)
    assert any(later), ("no worker started after a failure loaded from the cache", hits, run.first_workers)
    assert {p.name for p in (workdir / "xla-cache").iterdir() if p.name.endswith("-cache")}, \
        sorted(p.name for p in (workdir / "xla-cache").iterdir())
