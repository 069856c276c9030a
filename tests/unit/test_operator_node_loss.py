"""A node that stops without the out-of-service taint (issue 9 item 5): the decisions, pure, and the
kopf shell applying them (a recording stand-in for the API client; the real cluster is
e2e/kind/test_node_failure.py)."""

from __future__ import annotations

import dataclasses
import datetime as dt

import kopf
import pytest

from elastic_jax.api import labels as lbl
from elastic_jax.api.manifest import parse_manifest
from elastic_jax.k8s_operator import job_pass, operator_state
from elastic_jax.k8s_operator.nodes import NodeLoss, NodeView, lost_nodes, node_view, pods_on_lost_nodes
from elastic_jax.k8s_operator.reconcile import Observed, decide
from elastic_jax.k8s_operator.slices import JobSetView, jobset_view
from elastic_jax.k8s_operator.slices import observe_slice, pod_view
from elastic_jax.k8s_operator.status_builder import with_node_loss
from elastic_jax.k8s_operator.tracker import JobTracker
from tests.support.pod_views import controller_view, worker_view

NOW = "2026-01-01T00:01:00Z"


def _ago(seconds: int) -> str:
    t = dt.datetime(2026, 1, 1, 0, 1, 0) - dt.timedelta(seconds=seconds)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _node_body(name, status, since, reason="NodeStatusUnknown", message="Kubelet stopped posting node status."):
    return {"metadata": {"name": name}, "status": {"conditions": [
        {"type": "MemoryPressure", "status": "Unknown"},
        {"type": "Ready", "status": status, "lastTransitionTime": since, "reason": reason, "message": message}]}}


def _worker(name, slice_index=0, node="n1", phase="Running", ready=True, deleting=False, grace=None, attempt=0):
    return worker_view(name, slice_index, attempt=attempt, phase=phase, ready=ready, ip="10.0.0.5", deleting=deleting,
                       deletion_grace_s=grace, node=node)


def _ctrl(attempt=0, node="n0", phase="Running", ready=True):
    return controller_view(attempt, uid=f"c{attempt}", phase=phase, ready=ready, ip="10.0.0.2", node=node)


LOSS = NodeLoss("n1", 45, "Ready=Unknown (NodeStatusUnknown: Kubelet stopped posting node status.)")


# -- which nodes are lost ----------------------------------------------------------------------


def test_node_view_reads_the_ready_condition():
    v = node_view(_node_body("n1", "Unknown", _ago(40)))
    assert (v.name, v.ready, v.since, v.reason) == ("n1", "Unknown", _ago(40), "NodeStatusUnknown")
    assert node_view({"metadata": {"name": "new"}, "status": {}}).ready == "Unknown"  # no condition yet


@pytest.mark.parametrize("status, seconds_ago, bound, lost", [
    ("Unknown", 31, 30, True),   # past the bound after the node controller marked it
    ("False", 31, 30, True),     # kubelet alive but not Ready (runtime down): same bound
    ("Unknown", 30, 30, False),  # at the bound, not over it
    ("Unknown", 5, 30, False),   # a blip: a kubelet restart re-posts within seconds
    ("True", 3600, 30, False),   # Ready since an hour: lastTransitionTime says nothing bad
    ("Unknown", 3600, 0, False),  # 0 turns node-loss handling off
])
def test_lost_only_after_the_bound(status, seconds_ago, bound, lost):
    views = [node_view(_node_body("n1", status, _ago(seconds_ago)))]
    assert ("n1" in lost_nodes(views, NOW, bound)) == lost


def test_lost_node_says_how_long_and_why():
    (loss,) = lost_nodes([node_view(_node_body("n1", "Unknown", _ago(45)))], NOW, 30).values()
    assert loss == LOSS


def test_a_node_without_a_transition_time_is_never_lost():
    assert lost_nodes([NodeView("n1", "Unknown", since="")], NOW, 30) == {}


# -- which pods go ---------------------------------------------------------------------------


def test_only_unfinished_pods_on_the_lost_node_are_force_deleted():
    pods = [
        _worker("on-lost", 0, "n1"),
        _worker("elsewhere", 1, "n2"),
        _worker("finished", 0, "n1", phase="Failed", ready=False, attempt=0),
        _worker("terminating", 1, "n1", deleting=True, grace=5),     # graceful: never ends on a dead node
        _worker("already-forced", 1, "n1", deleting=True, grace=0),  # only its finalizers left
        _worker("pending-there", 1, "n1", phase="Pending", ready=False),  # scheduled before the taint
        _worker("unscheduled", 1, "", phase="Pending", ready=False),
        _ctrl(node="n1"),
    ]
    got = pods_on_lost_nodes(pods, {"n1": LOSS})
    assert sorted(p.pod for p in got) == ["demo-controller-0", "on-lost", "pending-there", "terminating"]
    assert pods_on_lost_nodes(pods, {}) == []


def test_message_names_node_bound_pod_and_what_follows():
    (w,) = pods_on_lost_nodes([_worker("w-0", 1, "n1")], {"n1": LOSS})
    assert w.message(30) == (
        "node n1 not Ready for 45 s (over the operator's --node-lost-seconds=30): Ready=Unknown "
        "(NodeStatusUnknown: Kubelet stopped posting node status.); force-deleting slice 1 worker pod w-0 (grace 0), "
        "its JobSet replaces it on a healthy node")
    (c,) = pods_on_lost_nodes([_ctrl(node="n1")], {"n1": LOSS})
    assert "controller pod demo-controller-0" in c.message(30) and "a new controller pod replaces it" in c.message(30)


def test_pod_view_reads_the_node():
    assert pod_view({"metadata": {"name": "p"}, "spec": {"nodeName": "kind-worker2"}, "status": {}}).node == "kind-worker2"


# -- the slice -----------------------------------------------------------------------------------


def test_slice_with_a_pod_on_a_lost_node_is_failed_naming_the_node():
    obs = observe_slice([_worker("w-0", 0, "n1")], 1, lost_nodes={"n1": LOSS.why})
    assert obs.kind == "Failed" and obs.node == "n1"
    assert obs.reason == f"pod w-0: node n1 lost: {LOSS.why}"
    assert observe_slice([_worker("w-0", 0, "n2")], 1, lost_nodes={"n1": LOSS.why}).kind == "Ready"


def test_a_slice_already_down_takes_the_nodes_reason_and_the_controller_hears_down_once():
    reports = []

    class Client:
        def report_slice(self, index, state, generation, addresses, reason, retries, backoff_s):
            reports.append((index, state))

        def close(self):
            pass

    t = JobTracker("ns", "j", 1, 1, client_factory=lambda url, token: Client())
    t.token = "tok"
    t.set_controller(_ctrl())
    events = []
    t.sync([_worker("w-0")], lambda *e: events.append(e))
    # the node controller marks the pod not ready first: Down, "0/1 hosts ready"
    t.sync([_worker("w-0", ready=False)], lambda *e: events.append(e))
    assert t.slices[0].state == "Down" and "0/1 hosts ready" in t.slices[0].reason
    # past the bound: same state, the reason now names the node; no second Down report
    t.sync([_worker("w-0", ready=False)], lambda *e: events.append(e), lost_nodes={"n1": LOSS.why})
    assert t.slices[0].reason == f"pod w-0: node n1 lost: {LOSS.why}"
    assert reports == [(0, "Ready"), (0, "Down")]


# -- decide ------------------------------------------------------------------------------------


def _job(**spec):
    base = {"slices": {"count": 2}, "training": {"steps": 10, "globalBatchSize": 4}, "checkpoint": {"uri": "/tmp/ck"},
            "elasticity": {"maxRestarts": 3, "maxRestartsPerSlice": 2}}
    base.update(spec)
    return parse_manifest({"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob",
                           "metadata": {"name": "demo"}, "spec": base})


def _jobsets():
    return {i: JobSetView(f"demo-slice-{i}", i) for i in range(2)}


def test_worker_on_a_lost_node_is_force_deleted_and_the_controller_kept():
    observed = Observed({"controllerPod": "demo-controller-0"}, [_ctrl(node="n0")], _jobsets(),
                        worker_pods=[_worker("w0", 0, "n0"), _worker("w1", 1, "n1")], lost_nodes={"n1": LOSS})
    plan = decide(_job(), observed)
    assert [p.pod for p in plan.force_delete] == ["w1"]
    assert plan.create_controller is None and not plan.controller_restarted and plan.delete_pods == []


def test_nothing_happens_before_the_bound():
    observed = Observed({"controllerPod": "demo-controller-0"}, [_ctrl(node="n1", ready=False)], _jobsets(),
                        worker_pods=[_worker("w1", 1, "n1", ready=False)], lost_nodes={})
    plan = decide(_job(), observed)
    assert plan.force_delete == [] and plan.create_controller is None and plan.delete_pods == []


def test_controller_on_a_lost_node_is_replaced_counted_and_named():
    observed = Observed({"controllerPod": "demo-controller-0", "controllerRestarts": 0}, [_ctrl(node="n1")],
                        _jobsets(), worker_pods=[_worker("w0", 0, "n0")], lost_nodes={"n1": LOSS})
    plan = decide(_job(), observed)
    assert plan.create_controller == 1 and plan.controller_restarted
    assert [p.pod for p in plan.force_delete] == ["demo-controller-0"]
    assert plan.delete_pods == []  # a graceful delete would hang on the dead node
    (event,) = plan.events
    assert event[1] == "ControllerRestarted" and "node n1 lost, not Ready for 45 s" in event[2]


def test_force_deleted_controller_gone_from_the_index_is_not_replaced_twice():
    # the pass after: the old pod vanished at once (grace 0), the new one is not in the index yet
    observed = Observed({"controllerPod": "demo-controller-1", "controllerRestarts": 1}, [], _jobsets(),
                        expected_pod_age_s=1.0, lost_nodes={"n1": LOSS})
    plan = decide(_job(), observed)
    assert plan.create_controller is None and not plan.controller_restarted


def test_controller_lost_after_the_budget_fails_the_job_naming_the_node():
    observed = Observed({"controllerPod": "demo-controller-3", "controllerRestarts": 3}, [_ctrl(3, node="n1")],
                        _jobsets(), lost_nodes={"n1": LOSS})
    plan = decide(_job(), observed)
    assert plan.finish[0] == "Failed" and "node n1 lost" in plan.finish[1]


def test_suspended_job_force_deletes_finished_job_does_not():
    pods = dict(controller_pods=[_ctrl(node="n1")], jobsets=_jobsets(), worker_pods=[_worker("w1", 1, "n1")],
                lost_nodes={"n1": LOSS})
    suspended = decide(_job(suspend=True), Observed({"controllerPod": "demo-controller-0"}, **pods))
    assert sorted(p.pod for p in suspended.force_delete) == ["demo-controller-0", "w1"]
    finished = decide(_job(), Observed({"phase": "Succeeded", "completionTime": "2026-12-04T10:00:00Z"}, **pods))
    assert finished.force_delete == []


# -- the condition -------------------------------------------------------------------------------


def test_condition_true_from_the_loss_until_the_job_is_whole_again():
    conds, events = with_node_loss([], ["node n1 ... pod w1"], recovered=False, generation=1, now=NOW)
    (c,) = conds
    assert (c.status, c.reason, c.message) == ("True", "NodeLost", "node n1 ... pod w1") and events == []
    # pods gone, replacement not Ready yet: unchanged
    assert with_node_loss(conds, [], recovered=False, generation=1, now=NOW) == (conds, [])
    conds2, events = with_node_loss(conds, [], recovered=True, generation=1, now=NOW)
    (c,) = conds2
    assert (c.status, c.reason) == ("False", "NodeLossRecovered") and "node n1" in c.message
    assert [e[1] for e in events] == ["NodeLossRecovered"]
    assert with_node_loss([], [], recovered=True, generation=1, now=NOW) == ([], [])  # never lost: no condition


# -- the kopf shell --------------------------------------------------------------------------------


class _Kube:
    def claim(self, namespace, name, resource_version, annotation, identity):
        return True

    def job_uid_if_owned(self, namespace, name, jobset_uid):
        return None

    def warning_events(self, namespace, kind, name, uid=""):
        return []

    def __init__(self):
        self.created, self.deleted = [], []

    def create(self, namespace, body):
        self.created.append(body["metadata"]["name"])
        return True

    def delete_pod(self, namespace, name, grace_s=None):
        self.deleted.append((namespace, name, grace_s))

    def delete_jobset(self, namespace, name):
        self.deleted.append((namespace, name, "jobset"))

    def read_manifest(self, namespace, name, owner_uid):
        return None

    def owners(self, namespace, kind, name):
        return []

    def owned_by(self, namespace, kind, name, owner_uid):
        return True

    def delete_job(self, namespace, name):
        pass


class _Patch:
    def __init__(self):
        self.status: dict = {}


def _pod_body(name, job, node, role, slice_index=None, ready=True, ip="10.0.0.9"):
    labels = {lbl.ROLE: role, lbl.JOB_NAME: job}
    if role == lbl.ROLE_CONTROLLER:
        labels[lbl.CONTROLLER_ATTEMPT] = "0"
    else:
        labels[lbl.SLICE_INDEX] = str(slice_index)
    return {"metadata": {"name": name, "uid": f"uid-{name}", "labels": labels}, "spec": {"nodeName": node},
            "status": {"phase": "Running", "podIP": ip,
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def test_reconcile_force_deletes_this_jobs_pod_on_the_lost_node_only_and_says_so(monkeypatch):
    events = []
    monkeypatch.setattr(kopf, "event", lambda ref, type, reason, message: events.append((type, reason, message)))
    spec = {"slices": {"count": 2}, "training": {"steps": 10, "globalBatchSize": 2}, "checkpoint": {"uri": "/tmp/ck"}}
    meta = {"name": "j", "namespace": "ns", "uid": "u1", "generation": 1}
    body = {"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob", "metadata": meta, "spec": spec}
    state = operator_state.OperatorState(kube=_Kube(), key=b"k" * 32, node_lost_s=30)
    # no pod IP: the tracker opens no connection to a controller (nothing leaves the test)
    ctrl = pod_view(_pod_body("j-controller-0", "j", "good", lbl.ROLE_CONTROLLER, ip=""))
    w0 = pod_view(_pod_body("j-slice-0-w", "j", "good", lbl.ROLE_WORKER, 0))
    w1 = pod_view(_pod_body("j-slice-1-w", "j", "dead", lbl.ROLE_WORKER, 1, ready=False))
    other = pod_view(_pod_body("other-slice-0-w", "other", "dead", lbl.ROLE_WORKER, 0, ready=False))
    jobsets = [jobset_view({"metadata": {"name": f"j-slice-{i}"}}, i) for i in range(2)]
    status = {"phase": "Running", "controllerPod": "j-controller-0", "tokenSecret": "j-token"}

    def reconcile(pods, node_since):
        nonlocal status
        now = dt.datetime.now(dt.timezone.utc)
        unready = {} if node_since is None else {"dead": [node_view(_node_body(
            "dead", "Unknown", (now - dt.timedelta(seconds=node_since)).strftime("%Y-%m-%dT%H:%M:%SZ")))]}
        patch = _Patch()
        job_pass.reconcile_pass(body=body, spec=spec, status=status, meta=meta, namespace="ns", name="j", patch=patch,
                               memo={"elasticjax": state},
                               job_pods={("ns", "j", "u1"): pods, ("ns", "other", "u2"): [other]},
                               job_jobsets={("ns", "j", "u1"): jobsets}, unready_nodes=unready)
        status = {**status, **patch.status}

    reconcile([ctrl, w0, w1], node_since=10)  # NotReady, within the bound: nothing
    assert state.kube.deleted == [] and not any(e[1] == "NodeLost" for e in events)
    for _ in range(3):  # past the bound, and the pod still listed for a few passes
        reconcile([ctrl, w0, w1], node_since=40)
    assert state.kube.deleted == [("ns", "j-slice-1-w", 0)] * 3  # grace 0; never the other job's pod
    (lost_event,) = [e for e in events if e[1] == "NodeLost"]
    assert lost_event[0] == "Warning" and "node dead not Ready" in lost_event[2] and "j-slice-1-w" in lost_event[2]
    (cond,) = [c for c in status["conditions"] if c["type"] == "NodeLost"]
    assert cond["status"] == "True" and "node dead" in cond["message"]
    (slice1,) = [s for s in status["slices"] if s["index"] == 1]
    assert slice1["state"] == "Down" and "node dead lost" in slice1["reason"]
    assert status["controllerRestarts"] == 0 and not any(n.startswith("j-controller-") for n in state.kube.created)

    # the pod is gone, its replacement Ready on a healthy node: the condition clears, keeping the node's name
    w1_new = dataclasses.replace(pod_view(_pod_body("j-slice-1-w2", "j", "good", lbl.ROLE_WORKER, 1)), attempt=1)
    reconcile([ctrl, w0], node_since=50)
    reconcile([ctrl, w0, w1_new], node_since=60)
    (cond,) = [c for c in status["conditions"] if c["type"] == "NodeLost"]
    assert cond["status"] == "False" and cond["reason"] == "NodeLossRecovered" and "node dead" in cond["message"]
    assert len(state.kube.deleted) == 3
