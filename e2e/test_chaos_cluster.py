"""The chaos benchmark's cluster arms at their smallest (`e2e/chaos.py`, `benchmarks/bench_chaos.py --arms cluster`).

Two runs of the same job through the operator on the local control plane:
no failure, then a worker SIGKILLed, the operator SIGKILLed and restarted,
and a worker's node lost and restored, at fixed steps (not seconds, so the
machine's speed does not decide whether they happen). Both succeed; the
chaos run lost no step and ends with the no-failure run's loss. Keeps the
benchmark's cluster path from rotting; it times nothing.
"""

from __future__ import annotations

import math
import random

import pytest

from e2e.chaos import Plan, chaos_nodes, run_arm
from e2e.operator_fixtures import ejob_crd, operator_kubeconfig  # noqa: F401  (fixtures)

pytestmark = pytest.mark.timeout(900)

STEPS = 60


def test_chaos_arm_loses_no_step_and_matches_the_no_failure_loss(cluster, ejob_crd, operator_kubeconfig,  # noqa: F811
                                                                 tmp_path):
    with chaos_nodes(cluster):
        (tmp_path / "none").mkdir()
        (tmp_path / "chaos").mkdir()
        base = run_arm(cluster, operator_kubeconfig, tmp_path / "none", STEPS, Plan(), random.Random(0))
        plan = Plan(every=10, unit="step", node_loss_tick=1, operator_kill_tick=0, max_ticks=2, node_down_s=5,
                    operator_down_s=2)
        chaos = run_arm(cluster, operator_kubeconfig, tmp_path / "chaos", STEPS, plan, random.Random(0))
    assert base.phase == "Succeeded" and base.failures == [], base
    assert chaos.phase == "Succeeded", chaos
    kinds = [kind for _, kind, _ in chaos.failures]
    assert kinds[0] == "pod" and "node" in kinds and "operator" in kinds, chaos.failures
    assert int(chaos.status.get("recoveries") or 0) >= 1, chaos.status
    assert int(chaos.status.get("controllerRestarts") or 0) == 0, chaos.status
    assert base.finished["steps"] == chaos.finished["steps"] == STEPS, (base.finished, chaos.finished)
    assert chaos.finished["steps_lost"] == 0, chaos.finished
    assert math.isclose(chaos.finished["final_loss"], base.finished["final_loss"], rel_tol=1e-5), \
        (chaos.finished["final_loss"], base.finished["final_loss"])
