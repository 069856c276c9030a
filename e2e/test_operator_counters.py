"""Issue 11 (status truth): the job's counters keep growing across its incarnations.

On the local control plane with the operator as a least-privilege process
and the CPU example's images run by the node agent: a worker process
SIGKILLed, then the job suspended and resumed (a new controller pod and new
JobSets, each counting from 0), a worker killed again, then the controller
pod deleted (a new one, counting from 0). After each step `status.recoveries`,
`status.sliceReplacements` and slice 0's `restarts` are never lower than
before, and each kill raises them. (No kill after the new pod: that a kill
raises the counts over a new controller's base is the kill after the resume;
`counters.carry` takes a new controller UID alike for either cause.)

The same for the goodput ledger (issue 12 item 3): `status.goodput` books
the recovery of each kill and its seconds never go down across the
suspend/resume and the new controller pod, except that the steps a new pod
does not resume (here all of them: the local checkpoint folder goes with the
pod) are counted in `status.stepsLost` and their productive seconds move to
`recovering` (issue 11, `steps_lost`). And the suspended status has the step
the stop reached (not the last one polled before it), and no `lastCheckpointStep`:
the checkpoint that stop saved went with the pod's emptyDir.
"""

from __future__ import annotations

import json
import os
import signal

from e2e.helpers import is_ready, pods, wait_for
from e2e.operator_fixtures import (  # noqa: F401  (fixtures)
    apply_job, ejob_crd, example_manifest, get_job, operator, operator_kubeconfig, wait_phase,
)
from elastic_jax.k8s_operator.job_pass import SUSPENDED_SLICE_REASON


def _reconciles(operator) -> float:
    """Reconcile passes the operator made so far (its `elasticjax_operator_reconciles_total{result="ok"}`)."""
    for line in operator.metrics().splitlines():
        if line.startswith('elasticjax_operator_reconciles_total{result="ok"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _differences(a: object, b: object, path: str = "") -> str:
    """Where two objects differ, one `path: a -> b` line each."""
    if isinstance(a, dict) and isinstance(b, dict):
        return "".join(_differences(a.get(k), b.get(k), f"{path}.{k}") for k in sorted(set(a) | set(b)))
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return "".join(_differences(x, y, f"{path}[{i}]") for i, (x, y) in enumerate(zip(a, b)))
    return "" if a == b else f"{path}: {json.dumps(a)[:300]} -> {json.dumps(b)[:300]}\n"


def _counts(status: dict) -> tuple[int, int, int]:
    slice0 = next((s for s in status.get("slices") or [] if s.get("index") == 0), {})
    return int(status.get("recoveries") or 0), int(status.get("sliceReplacements") or 0), int(slice0.get("restarts") or 0)


def _finished_event(log: str) -> dict:
    """The controller's `finished` log record (JSON lines): its last step and last committed checkpoint step."""
    records = [json.loads(line) for line in log.splitlines() if line.startswith("{") and '"finished"' in line]
    (finished,) = [r for r in records if r.get("event") == "finished"]
    return finished


def _goodput_seconds(status: dict) -> dict[str, float]:
    return dict((status.get("goodput") or {}).get("seconds") or {})


def _not_lower(now: dict[str, float], before: dict[str, float]) -> str:
    """The goodput categories that went down (`name: before -> now`), "" when none did."""
    return ", ".join(f"{k}: {v} -> {now.get(k, 0.0)}" for k, v in before.items() if now.get(k, 0.0) < v)


def _restarted_from_zero(now: dict, before: dict) -> str:
    """What is wrong with status `now` as the status `before` a new controller pod that resumed from step 0
    ("" when nothing): `before`'s steps all lost, its productive and reduced seconds all re-booked
    `recovering`, no other category lower (one hundredth of a second of rounding allowed)."""
    b, n = _goodput_seconds(before), _goodput_seconds(now)
    moving = ("productive", "reduced", "recovering")
    wrong = [_not_lower(n, {k: v for k, v in b.items() if k not in moving})]
    moved = b.get("productive", 0.0) + b.get("reduced", 0.0) + b.get("recovering", 0.0)
    if n.get("recovering", 0.0) < moved - 0.01:
        wrong.append(f"recovering {n.get('recovering')} < {moved} (earlier productive + reduced + recovering)")
    if int(now.get("stepsLost") or 0) < int(before.get("stepsLost") or 0) + int(before.get("step") or 0):
        wrong.append(f"stepsLost {now.get('stepsLost')} < {before.get('stepsLost') or 0} + step {before.get('step')}")
    return "; ".join(w for w in wrong if w)


def test_counters_keep_growing_across_suspend_resume_and_a_new_controller_pod(cluster, namespace, operator):
    manifest = example_manifest()
    name = manifest["metadata"]["name"]
    # Long enough never to finish during the test (the namespace goes with it); its own checkpoint folder.
    manifest["spec"]["training"]["steps"] = 200000
    manifest["spec"]["checkpoint"]["uri"] = f"/tmp/elastic-jax/e2e-counters/{namespace}/checkpoints"
    manifest["spec"]["elasticity"].update({"maxRestarts": 30, "maxRestartsPerSlice": 25})
    status, explain = apply_job(cluster, namespace, manifest, operator)

    def training(after_controller_uid: str = "") -> dict:
        """Status once a controller other than `after_controller_uid` answers, trains on both slices."""
        def check():
            s = status()
            uid = (s.get("counterBase") or {}).get("controllerUid") or ""
            ok = (uid and uid != after_controller_uid and s.get("phase") == "Running" and s.get("activeSlices") == 2
                  and s.get("step", 0) >= 5)
            return s if ok else None
        return wait_for(check, timeout_s=300, what="a new controller training on both slices", interval_s=0.5,
                        explain=explain)

    def kill_slice0_worker() -> None:
        victim = next(p for p in pods(cluster, namespace, f"elasticjax.dev/job-name={name},elasticjax.dev/slice-index=0")
                      if p["status"].get("phase") == "Running" and is_ready(p) and not p["metadata"].get("deletionTimestamp"))
        os.kill(cluster.container_pid(namespace, victim["metadata"]["name"], "worker", victim["metadata"]["uid"]),
                signal.SIGKILL)

    def grown_past(before: tuple[int, int, int]) -> tuple[int, int, int]:
        def check():
            s = status()
            now = _counts(s)
            return now if all(n > b for n, b in zip(now, before)) and s.get("activeSlices") == 2 else None
        return wait_for(check, timeout_s=300, what=f"counters above {before}, both slices back", interval_s=0.5,
                        explain=explain)

    s = training()
    first_uid = s["counterBase"]["controllerUid"]
    before = _counts(s)
    assert before == (0, 0, 0), s
    kill_slice0_worker()
    after_first_loss = grown_past(before)
    s = status()
    g = s["goodput"]
    assert g["seconds"]["productive"] > 0 and g["seconds"]["recovering"] > 0 and g["seconds"]["starting"] > 0, g
    assert 0 < g["fraction"] < 1 and g["percent"].endswith("%"), g
    goodput_before_suspend = _goodput_seconds(s)
    suspended_controller = (s["controllerPod"], s["counterBase"]["controllerUid"])

    # suspend: the controller pod and the JobSets go; the counts stay
    cluster.kubectl("patch", "ejob", name, "-n", namespace, "--type=merge", "-p", '{"spec":{"suspend":true}}')
    s = wait_phase(cluster, namespace, name, ("Suspended",), timeout_s=180, explain=explain)

    def torn_down():
        return not pods(cluster, namespace, f"elasticjax.dev/job-name={name}")
    wait_for(torn_down, timeout_s=180, what="the job's pods gone", explain=explain)
    assert _counts(status()) == after_first_loss, status()
    # nothing changes while suspended, so no pass rewrites the object (`kubectl get ejob -w` printed an
    # identical line every second): five more operator passes leave its resourceVersion as it was
    def settled():  # the teardown's last news written: every slice stopped by the suspend, no controller
        s = status()
        return s if (s.get("controllerPod") == "" and s.get("slices")
                     and all(sl["reason"] == SUSPENDED_SLICE_REASON and sl["state"] == "Down" and not sl["pods"]
                             for sl in s["slices"])) else None
    wait_for(settled, timeout_s=60, what="the suspend's teardown in status", explain=explain)
    suspended = status()
    # the step the stop checkpointed, read from the stopping controller (it had gone on past the last poll):
    # what its own log's last word says
    finished = _finished_event(cluster.container_log(namespace, *suspended_controller[:1], "controller",
                                                     suspended_controller[1]))
    assert finished["stop"] == "signal" and finished["last_committed_checkpoint_step"] == finished["steps"], finished
    # (its checkpoint folder is local: the stop's checkpoint went with the pod's emptyDir, so no step is claimed)
    assert suspended["step"] == finished["steps"] and "lastCheckpointStep" not in suspended, (suspended, finished)
    assert suspended["activeSlices"] == 0 and suspended["spareSlices"] == [], suspended
    assert not _not_lower(_goodput_seconds(suspended), goodput_before_suspend), \
        _not_lower(_goodput_seconds(suspended), goodput_before_suspend)
    before_passes = get_job(cluster, namespace, name)
    passes = _reconciles(operator)
    wait_for(lambda: _reconciles(operator) >= passes + 5, timeout_s=120, what="five more operator passes",
             explain=explain)
    job = get_job(cluster, namespace, name)
    assert job["metadata"]["resourceVersion"] == before_passes["metadata"]["resourceVersion"], \
        _differences(before_passes, job)
    # resume: a new controller pod and new JobSets, each counting from 0; the job's counts do not
    cluster.kubectl("patch", "ejob", name, "-n", namespace, "--type=merge", "-p", '{"spec":{"suspend":false}}')
    s = training(after_controller_uid=first_uid)
    assert all(n >= b for n, b in zip(_counts(s), after_first_loss)), (s, after_first_loss)
    # the new controller's ledger adds to the job's (the resume itself starts at step 0 here: a local
    # checkpoint folder is the pod's emptyDir, gone with it: those steps are lost, their seconds recovering)
    assert s["counterBase"]["goodput"]["seconds"] == suspended["goodput"]["seconds"], s["counterBase"]
    assert not _restarted_from_zero(s, suspended), _restarted_from_zero(s, suspended)
    resumed = _counts(s)
    kill_slice0_worker()
    after_resume_loss = grown_past(resumed)

    # the controller pod deleted (a controller loss): its successor counts from 0; the job's counts do not
    s = status()
    old_controller, old_uid = s["controllerPod"], s["counterBase"]["controllerUid"]
    cluster.kubectl("delete", "pod", old_controller, "-n", namespace, "--wait=false")
    before_loss = s
    s = training(after_controller_uid=old_uid)
    assert s["controllerRestarts"] >= 1, s
    assert not _restarted_from_zero(s, before_loss), _restarted_from_zero(s, before_loss)
    assert all(n >= b for n, b in zip(_counts(s), after_resume_loss)), (s, after_resume_loss)
    base = s["counterBase"]
    assert base["controllerUid"] and base["recoveries"] >= 2, base
    # three controller pods' ledgers: the base holds the first two (their productive seconds re-booked
    # recovering: each new pod started again from step 0), the total keeps growing past it
    assert base["goodput"]["seconds"]["recovering"] > goodput_before_suspend["productive"], base
    # (the third pod started again from step 0 too: the base's training seconds are all recovering in the total,
    # its productive seconds are the live pod's own)
    assert not _restarted_from_zero(s, {"goodput": base["goodput"], "step": 0}), \
        _restarted_from_zero(s, {"goodput": base["goodput"], "step": 0})
    assert s["goodput"]["seconds"]["productive"] > 0, s["goodput"]
    assert s["goodput"]["seconds"]["recovering"] > goodput_before_suspend["recovering"], s["goodput"]
