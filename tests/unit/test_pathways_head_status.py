"""Issue 10: a pathways job whose head's resource manager does not listen yet says so (WaitingForResourceManager),
and a job with slices whose TPU pools are missing names every waiting slice (PodsNotStarting)."""

from __future__ import annotations

import dataclasses

from elastic_jax.api import status as st
from elastic_jax.k8s_operator.head_status import with_resource_manager
from elastic_jax.k8s_operator.pod_faults import pod_faults
from elastic_jax.k8s_operator.slices import pod_view
from elastic_jax.k8s_operator.status_builder import with_pod_faults
from tests.unit.test_operator_pod_faults import _worker
from tests.unit.test_operator_reconcile import _ctrl

NOW = "2026-01-01T00:00:00Z"


def _head(**kw):
    return dataclasses.replace(_ctrl(), node="cpu-pool-0", **kw)


def _cond(conds):
    return next(c for c in conds if c.type == st.COND_WAITING_FOR_RESOURCE_MANAGER)


def test_resource_manager_not_listening_is_a_condition_and_an_event():
    conds, events = with_resource_manager([], _head(rm_started=False), 29001, 600, 3, NOW)
    c = _cond(conds)
    assert (c.status, c.reason, c.observed_generation) == ("True", "ResourceManagerStarting", 3)
    assert "demo-controller-0" in c.message and "29001" in c.message and "no slice JobSet" in c.message
    assert [e[1] for e in events] == ["ResourceManagerStarting"]
    # the next pass, same state: no second Event
    conds, events = with_resource_manager(conds, _head(rm_started=False), 29001, 600, 3, NOW)
    assert events == [] and _cond(conds).status == "True"


def test_condition_clears_with_an_event_once_the_resource_manager_listens():
    conds, _ = with_resource_manager([], _head(rm_started=False), 29001, 600, 1, NOW)
    conds, events = with_resource_manager(conds, _head(rm_started=True), 29001, 600, 1, "2026-01-01T00:01:00Z")
    c = _cond(conds)
    assert (c.status, c.reason, c.last_transition_time) == ("False", "ResourceManagerListening",
                                                                   "2026-01-01T00:01:00Z")
    assert [e[:2] for e in events] == [("Normal", "ResourceManagerListening")]
    conds, events = with_resource_manager(conds, _head(rm_started=True), 29001, 600, 1, NOW)
    assert events == []


def test_a_restarted_resource_manager_is_its_own_reason():
    conds, _ = with_resource_manager([], _head(rm_started=True), 29001, 600, 1, NOW)
    conds, events = with_resource_manager(conds, _head(rm_started=False, rm_restarts=1), 29001, 600, 1, NOW)
    c = _cond(conds)
    assert (c.status, c.reason) == ("True", "ResourceManagerRestarting") and "restarted 1 time" in c.message
    assert [e[1] for e in events] == ["ResourceManagerRestarting"]


def test_a_head_not_yet_running_is_named_as_such():
    conds, _ = with_resource_manager([], dataclasses.replace(_ctrl(phase="Pending"), pod_ip="", node=""),
                                     29001, 600, 1, NOW)
    assert "is not running yet (phase Pending)" in _cond(conds).message


def test_no_head_keeps_the_condition_as_it_was():
    conds, _ = with_resource_manager([], _head(rm_started=False), 29001, 600, 1, NOW)
    assert with_resource_manager(conds, None, 29001, 600, 1, NOW) == (conds, [])


def test_pod_view_reads_the_sidecar_started_only_after_its_startup_probe():
    def body(started):
        return {"metadata": {"name": "demo-controller-0", "uid": "u", "labels": {"elasticjax.dev/role": "controller"}},
                "spec": {"nodeName": "cpu-pool-0"},
                "status": {"phase": "Pending", "podIP": "10.0.0.2", "initContainerStatuses": [
                    {"name": "pathways-rm", "started": started, "restartCount": 0,
                     "state": {"running": {"startedAt": NOW}}}]}}
    assert not pod_view(body(False)).rm_started
    assert pod_view(body(True)).rm_started


# -- slices waiting for their TPU node pools ---------------------------------------------------

SCHED = "Unschedulable: 0/7 nodes are available: 7 node(s) didn't match Pod's node affinity/selector."


def _waiting(i):
    return _worker(i, phase="Pending", unschedulable=SCHED)


def test_pods_not_starting_names_every_waiting_slice():
    faults = pod_faults([_ctrl(), _worker(0), _waiting(1), _waiting(2)])
    fault = faults[st.COND_PODS_NOT_STARTING]
    assert fault.reason == "Unschedulable"
    assert "slice 1 worker pod demo-slice-1-w-0 cannot be scheduled" in fault.message
    assert "slice 2 worker pod demo-slice-2-w-0 cannot be scheduled" in fault.message
    assert "didn't match Pod's node affinity/selector" in fault.message
    assert fault.message.endswith("[slices waiting: 1, 2]")


def test_a_controller_alone_waiting_names_no_slice():
    fault = pod_faults([dataclasses.replace(_ctrl(), phase="Pending", unschedulable=SCHED)])
    assert "slices waiting" not in fault[st.COND_PODS_NOT_STARTING].message


def test_a_second_slice_waiting_is_a_new_event():
    conds, events = with_pod_faults([], pod_faults([_waiting(1)]), 1, NOW)
    assert len(events) == 1 and events[0][2].endswith("[slices waiting: 1]")
    conds, events = with_pod_faults(conds, pod_faults([_waiting(1)]), 1, NOW)
    assert events == []
    conds, events = with_pod_faults(conds, pod_faults([_waiting(1), _waiting(2)]), 1, NOW)
    assert len(events) == 1 and events[0][2].endswith("[slices waiting: 1, 2]")
    conds, events = with_pod_faults(conds, pod_faults([_worker(1), _worker(2)]), 1, NOW)
    assert [e[1] for e in events] == ["PodsStarted"]
