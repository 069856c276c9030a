"""A crash-looping controller under the operator, on the local control plane: the restart back-off.

A new-user trial: a library-mode program that exits 3 at once (`sys.exit(3)`: by the contract a loss to
recover, not the job's end) was recreated on every reconcile pass, 21 controller pods in 25 s. Now the
first replacement comes at once and each later one waits 10 s, then 20 s (kubelet CrashLoopBackOff,
`elastic_jax/supervision/backoff.py`) from the dead container's finish, with one Warning Event
`ControllerBackOff` per wait naming the exit code, and the job's daemon wakes when the wait ends (not at
its 30 s quiet resync). `elasticity.maxRestarts` still ends it.
"""

from __future__ import annotations

import datetime as dt
import json
import time

import yaml

from elastic_jax.api import labels

from e2e.helpers import wait_for
from e2e.operator_fixtures import (  # noqa: F401  (fixtures)
    REPO_ROOT, ejob_crd, example_manifest, get_job, job_events, operator, operator_kubeconfig,
)

EXAMPLE = REPO_ROOT / "examples" / "04-own-loop.yaml"


def _t(stamp: str) -> dt.datetime:
    return dt.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")


def test_a_controller_exiting_3_each_time_is_recreated_with_growing_gaps_and_says_why(cluster, namespace, operator):
    name = "crashloop"
    manifest = example_manifest(EXAMPLE)
    manifest["metadata"]["name"] = name
    spec = manifest["spec"]
    spec["slices"] = {"count": 1, "minSlices": 1}
    spec["controller"]["command"] = ["python", "-c", "import sys; sys.exit(3)"]
    spec["checkpoint"]["uri"] = f"/tmp/elastic-jax/e2e-crashloop/{namespace}/{name}"
    spec["elasticity"]["maxRestarts"] = 3
    result = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest), check=False)
    assert result.returncode == 0, result.stderr

    pods: dict[str, dict] = {}  # controller pod -> {created, finished}
    during_wait: list[dict] = []  # job statuses read while a dead pod waited for its replacement

    def explain() -> str:
        return (json.dumps(pods, indent=1) + "\n" + json.dumps(get_job(cluster, namespace, name).get("status"),
                                                               indent=1)[:3000] + "\n" + operator.log()[-3000:])

    def observe():
        items = cluster.api().get(f"/api/v1/namespaces/{namespace}/pods",
                                  labelSelector=f"{labels.ROLE}={labels.ROLE_CONTROLLER}")["items"]
        waiting = False
        for p in items:
            seen = pods.setdefault(p["metadata"]["name"], {"created": p["metadata"]["creationTimestamp"]})
            for cs in (p.get("status") or {}).get("containerStatuses") or []:
                term = (cs.get("state") or {}).get("terminated")
                if cs["name"] == "controller" and term:
                    seen["finished"], seen["exit"] = term.get("finishedAt"), term.get("exitCode")
                    waiting = waiting or not p["metadata"].get("deletionTimestamp")
        status = get_job(cluster, namespace, name).get("status") or {}
        if waiting and len(pods) >= 2 and status.get("phase") not in ("Succeeded", "Failed"):
            during_wait.append(status)
        return status if status.get("phase") == "Failed" else None

    started = time.monotonic()
    status = wait_for(observe, timeout_s=420, what="the crash-looping job Failed on elasticity.maxRestarts=3",
                      interval_s=0.5, explain=explain)
    assert "controller pod lost 4 times" in status.get("failureReason", "") and "exit code 3" in status["failureReason"]
    assert status["controllerRestarts"] == 3, status
    assert time.monotonic() - started >= 30, "no back-off: 4 controller pods in under 30 s"

    # The pods the operator created, from its own log: the first replacement comes at once, so the first
    # pod can be gone between two of this test's polls (CI under load saw only -1..-3).
    created = [r["msg"].rsplit("/", 1)[1] for r in operator.log_records()
               if str(r.get("msg", "")).startswith(f"created Pod {namespace}/{name}-controller-")]
    assert created == [f"{name}-controller-{i}" for i in range(4)], explain()
    order = sorted(pods, key=lambda n: int(n.rsplit("-", 1)[1]))
    assert order[-3:] == created[1:], explain()  # each waiting pod lived at least 10 s: polled
    # The gap from a dead pod's finish to its replacement's creation: the 2nd and 3rd losses in a row (no
    # step trained between) wait 10 s and 20 s; the daemon wakes for it, not at its 30 s quiet resync.
    # Named from the operator's log, not from what the polls saw: pod -0 may never have been seen.
    for before, after, wait in ((created[1], created[2], 10), (created[2], created[3], 20)):
        assert "finished" in pods[before], explain()
        gap = (_t(pods[after]["created"]) - _t(pods[before]["finished"])).total_seconds()
        assert wait <= gap < wait + 9, (before, after, gap, explain())
        assert pods[before]["exit"] == 3
    backoffs = [e for e in job_events(cluster, namespace, name) if e.get("reason") == "ControllerBackOff"]
    assert [e.get("type") for e in backoffs] == ["Warning", "Warning"], backoffs
    assert sum(e.get("count") or 1 for e in backoffs) == 2, backoffs  # one per wait, not one per pass
    assert "exit code 3" in backoffs[0]["message"] and "back-off 10 s" in backoffs[0]["message"], backoffs
    assert "back-off 20 s" in backoffs[1]["message"], backoffs
    # What the job said while a replacement waited
    assert during_wait, explain()
    for s in during_wait[len(during_wait) // 2:]:  # (past the pass that found the pod dead)
        conds = {c["type"]: c for c in s.get("conditions") or []}
        if conds.get("ControllerRestarted", {}).get("reason") == "ControllerBackOff":
            assert "exit code 3" in conds["ControllerRestarted"]["message"]
            assert not s.get("activeSlices"), s
            break
    else:
        raise AssertionError(f"no status said ControllerBackOff during a wait: {during_wait[-3:]}")
