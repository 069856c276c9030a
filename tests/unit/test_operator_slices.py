"""Pods → slice states."""

from __future__ import annotations

import dataclasses

import pytest

from elastic_jax.api import labels
from elastic_jax.k8s_operator.slices import SliceObservation, group_by_slice, next_slice_state, observe_slice, pod_view
from tests.support.pod_views import controller_view, worker_view


def _pod(name="w", attempt=0, phase="Running", ready=True, ip="127.0.10.5", deleting=False, exit_code=None, host=0, slice_index=0):
    return worker_view(name, slice_index, attempt=attempt, host=host, phase=phase, ready=ready, ip=ip,
                       deleting=deleting, exit_code=exit_code)


def test_pod_view_reads_labels_and_termination():
    body = {"metadata": {"name": "p", "uid": "u", "creationTimestamp": "2025-01-01T00:00:00Z",
                         "labels": {labels.ROLE: "worker", labels.SLICE_INDEX: "2", labels.JOBSET_RESTART_ATTEMPT: "3",
                                    labels.JOB_COMPLETION_INDEX: "1"}},
            "status": {"phase": "Failed", "podIP": "127.0.10.9",
                       "containerStatuses": [{"state": {"terminated": {"exitCode": 137, "reason": "Error"}}}]}}
    v = pod_view(body)
    assert (v.slice_index, v.attempt, v.host_index, v.exit_code, v.reason) == (2, 3, 1, 137, "exit code 137")
    assert v.terminal and not v.ready


def test_ready_when_every_host_runs_and_is_ready():
    obs = observe_slice([_pod("a", host=1, ip="127.0.10.6"), _pod("b", host=0)], hosts_per_slice=2, port=9)
    assert obs.kind == "Ready"
    assert obs.addresses == ("127.0.10.5:9", "127.0.10.6:9")  # by host index


@pytest.mark.parametrize("pods, kind", [
    ([], "NotReady"),
    ([_pod(ready=False)], "NotReady"),
    ([_pod(phase="Pending", ip="")], "NotReady"),
    ([_pod(phase="Failed", exit_code=137)], "Failed"),
    ([_pod(phase="Running", exit_code=1)], "Failed"),  # container ended, phase not updated yet
    ([dataclasses.replace(_pod(deleting=True), deletion_grace_s=30)], "Draining"),
    ([_pod(deleting=True)], "Failed"),  # no grace period: no time to act
    # an older attempt's failed pod is a leftover; the new attempt is what counts
    ([_pod("old", attempt=0, phase="Failed", exit_code=137), _pod("new", attempt=1)], "Ready"),
    ([_pod("old", attempt=0, phase="Failed", exit_code=137), _pod("new", attempt=1, phase="Pending", ip="")], "NotReady"),
])
def test_observation(pods, kind):
    assert observe_slice(pods, 1).kind == kind


def test_a_failed_pod_the_job_replaced_in_place_counts_until_its_replacement_is_ready():
    # backend pathways: an evicted host's pod stays listed (phase Failed) in the same attempt; the Job runs a new
    # pod of that completion index beside it
    evicted = dataclasses.replace(_pod("w-1-old", phase="Failed", exit_code=137, host=1), reason="Evicted")
    host_0 = _pod("w-0", host=0, ip="10.200.1.1")
    starting = _pod("w-1-new", host=1, phase="Pending", ip="")
    assert observe_slice([host_0, evicted], 2).kind == "Failed"
    obs = observe_slice([host_0, evicted, starting], 2)
    assert obs.kind == "Failed" and "w-1-old" in obs.reason  # the loss holds until the host is back
    ready = _pod("w-1-new", host=1, ip="10.200.2.1")
    obs = observe_slice([host_0, evicted, ready], 2, port=9)
    assert obs.kind == "Ready" and obs.addresses == ("10.200.1.1:9", "10.200.2.1:9")
    assert "w-1-old" not in obs.pods
    # a finished pod of a host with no Ready pod, or of another host, is still a loss
    assert observe_slice([host_0, evicted, dataclasses.replace(ready, host_index=0)], 2).kind == "Failed"
    assert observe_slice([dataclasses.replace(ready, deleting=True, deletion_grace_s=30), evicted, host_0],
                         2).kind == "Failed"


def test_failure_reason_names_the_pod():
    obs = observe_slice([_pod("w-0", phase="Failed", exit_code=137)], 1)
    assert obs.reason == "pod w-0: exit code 137"


@pytest.mark.parametrize("prev, kind, new", [
    (None, "NotReady", "Provisioning"),
    ("Provisioning", "NotReady", "Provisioning"),
    ("Provisioning", "Ready", "Ready"),
    ("Ready", "Failed", "Down"),
    ("Ready", "NotReady", "Down"),  # a pod vanished (kubectl delete --force)
    ("Ready", "Draining", "Draining"),
    ("Draining", "NotReady", "Down"),
    ("Down", "NotReady", "Down"),  # replacement still starting
    ("Down", "Draining", "Down"),  # an old pod being cleaned up is no drain
    ("Down", "Ready", "Ready"),
    ("Provisioning", "Failed", "Down"),
])
def test_transitions(prev, kind, new):
    assert next_slice_state(prev, SliceObservation(kind)) == new


def test_group_by_slice_ignores_other_indices_and_the_controller():
    ctrl = controller_view(name="c", uid="c", ip="x")
    grouped = group_by_slice([_pod("a", slice_index=0), _pod("b", slice_index=1), _pod("z", slice_index=7), ctrl], 2)
    assert {i: [p.name for p in ps] for i, ps in grouped.items()} == {0: ["a"], 1: ["b"]}


# -- issue 9 item 8: a force delete is a loss, not a drain ----------------------------------


def _deleting(grace, **kw):
    return dataclasses.replace(_pod("w-0", **kw), deleting=True, deletion_grace_s=grace)


def test_pod_view_reads_the_deletion_grace_period():
    meta = {"name": "p", "uid": "u", "deletionTimestamp": "2025-01-01T00:00:00Z", "labels": {labels.ROLE: "worker"}}
    assert pod_view({"metadata": {**meta, "deletionGracePeriodSeconds": 0}}).deletion_grace_s == 0
    assert pod_view({"metadata": {**meta, "deletionGracePeriodSeconds": 30}}).deletion_grace_s == 30
    assert pod_view({"metadata": {"name": "q", "labels": {labels.ROLE: "worker"}}}).deletion_grace_s is None


def test_graceful_delete_of_a_running_pod_is_a_drain():
    obs = observe_slice([_deleting(30)], 1)
    assert obs.kind == "Draining" and "grace 30 s" in obs.reason
    assert next_slice_state("Ready", obs) == "Draining"


@pytest.mark.parametrize("grace", [0, None])
def test_force_delete_is_a_loss_not_a_drain(grace):
    obs = observe_slice([_deleting(grace)], 1)
    assert obs.kind == "Failed" and "killed" in obs.reason
    assert next_slice_state("Ready", obs) == "Down"
    if grace == 0:
        assert "force-deleted (grace 0)" in obs.reason


def test_deleting_pod_whose_container_already_exited_is_a_loss():
    obs = observe_slice([_deleting(30, exit_code=137)], 1)
    assert obs.kind == "Failed"


def test_ready_pod_vanishing_without_notice_is_deleted_not_draining():
    obs = observe_slice([], 1, known=("w-0",))
    assert obs.kind == "Failed" and "w-0 deleted" in obs.reason
    assert next_slice_state("Ready", obs) == "Down"
    # the JobSet's replacement appears before the slice was seen again: still the loss of w-0
    obs = observe_slice([_pod("w-0b", attempt=1, phase="Pending", ip="", ready=False)], 1, known=("w-0",))
    assert obs.kind == "Failed" and "w-0 deleted" in obs.reason
    # a replacement that is Ready is just Ready
    assert observe_slice([_pod("w-0b", attempt=1)], 1, known=("w-0",)).kind == "Ready"


def test_tracker_reports_a_force_deleted_worker_down_to_the_controller():
    from elastic_jax.k8s_operator.tracker import JobTracker

    sent = []

    class Client:
        def report_slice(self, index, state, generation, addresses, reason, **_):
            sent.append((index, state, reason))

        def close(self):
            pass

    t = JobTracker("ns", "j", 1, 1, client_factory=lambda url, token: Client())
    t.token = "t"
    controller = controller_view(name="j-controller-0", uid="c", ip="127.0.0.9")
    t.set_controller(controller)
    events = []
    t.sync([_pod("w-0")], lambda *e: events.append(e))
    t.sync([_deleting(0)], lambda *e: events.append(e))
    assert [s for _, s, _ in sent] == ["Ready", "Down"]
    assert not any(e[1] == "SliceDraining" for e in events)
    assert any(e[1] == "SliceDown" and "force-deleted" in e[2] for e in events)


@pytest.mark.parametrize("teardown", ["finished", "suspended"])
def test_a_finished_or_suspended_jobs_teardown_is_no_replacement_and_no_warning(teardown):
    """Issue 11 (status truth): slice_replacements_total read 8 after 2 losses (job-end stops counted),
    and suspend posted Warning SliceDraining/SliceDown. Only a loss while the job runs counts."""
    from elastic_jax.k8s_operator import metrics
    from elastic_jax.k8s_operator.tracker import JobTracker

    t = JobTracker("ns", "j", 2, 1)
    events = []
    t.sync([_pod("w-0", slice_index=0), _pod("w-1", slice_index=1)], lambda *e: events.append(e))
    before = metrics.SLICE_REPLACEMENTS._value.get()
    t.sync([_pod("w-1", slice_index=1)], lambda *e: events.append(e))  # slice 0 lost while running
    assert metrics.SLICE_REPLACEMENTS._value.get() == before + 1
    assert [e[1] for e in events if e[0] == "Warning"] == ["SliceDown"]
    setattr(t, teardown, True)
    t.sync([_deleting(30, slice_index=1)], lambda *e: events.append(e))  # the operator removes the rest
    t.sync([], lambda *e: events.append(e))
    assert metrics.SLICE_REPLACEMENTS._value.get() == before + 1
    assert [e[1] for e in events if e[0] == "Warning"] == ["SliceDown"]
    assert all(s.state in ("Down", "Draining") for s in t.slices)  # status still tells where the slices are


def test_a_suspended_or_finished_jobs_slices_say_so_not_exit_code_143():
    """Issue 11 (status truth): after a suspend, and at the end of a job, every slice read `Down, exit code
    143` (the SIGTERM the operator's own teardown sent), as if the workers had failed."""
    from elastic_jax.k8s_operator import job_pass
    from elastic_jax.k8s_operator.tracker import JobTracker

    t = JobTracker("ns", "j", 1, 1)
    t.sync([_pod("w-0")], lambda *e: None)
    t.suspended = True
    t.sync([_pod("w-0", phase="Failed", exit_code=143)], lambda *e: None)
    [entry] = job_pass.slice_status(t, [2], [], "2030-01-01T00:00:00Z")
    assert (entry.state, entry.reason, entry.restarts) == ("Down", job_pass.SUSPENDED_SLICE_REASON, 2)
    t.suspended = False  # a loss while the job runs keeps the pod's reason
    assert job_pass.slice_status(t, [2], [], "2030-01-01T00:00:00Z")[0].reason == "pod w-0: exit code 143"
    # ... and at the end of the job, when the operator stops the workers, every slice read the same
    t.finished = True
    [entry] = job_pass.slice_status(t, [2], [], "2030-01-01T00:00:00Z")
    assert (entry.state, entry.reason) == ("Down", job_pass.FINISHED_SLICE_REASON)


def test_a_report_refused_while_the_controller_starts_is_not_an_error():
    """Issue 11 (status truth): notifications_total{result="error"} rose at every job start, because the
    first Ready report reaches the controller pod before its control API listens."""
    from elastic_jax.api.client import ControlApiError
    from elastic_jax.k8s_operator import metrics
    from elastic_jax.k8s_operator.tracker import JobTracker

    listening = {"yes": False}

    class Client:
        def report_slice(self, *a, **k):
            if not listening["yes"]:
                raise ControlApiError("connection refused")
            if listening["yes"] == "broken":
                raise ControlApiError("connection reset")

        def status(self, after=None, wait_s=0.0):
            if not listening["yes"]:
                raise ControlApiError("connection refused")
            return object()

        def close(self):
            pass

    def count(result):
        return metrics.NOTIFICATIONS.labels("Ready", result)._value.get()

    t = JobTracker("ns", "j", 1, 1, client_factory=lambda url, token: Client())
    t.token = "t"
    t.set_controller(controller_view(name="j-controller-0", uid="c", ready=False, ip="127.0.0.9"))
    starting, errors, ok = count("starting"), count("error"), count("ok")
    assert t.poll_status() is None
    t.sync([_pod("w-0")], lambda *e: None)
    assert (count("starting"), count("error"), count("ok")) == (starting + 1, errors, ok)
    listening["yes"] = True
    assert t.poll_status() is not None
    t.sync([_pod("w-0")], lambda *e: None)
    assert count("ok") == ok + 1
    # once the controller answered, an unreachable controller is an error again
    t.slices[0].acked = None
    listening["yes"] = "broken"
    t.sync([_pod("w-0")], lambda *e: None)
    assert count("error") == errors + 1


def test_a_controller_refusing_the_operators_token_is_recorded_for_a_condition():
    """Trial (kind): a job handed over to another Helm release got 401 on every report, silently Pending:
    the other release's operator key derives another token than the job's Secret holds."""
    from elastic_jax.api.client import ControlApiError
    from elastic_jax.k8s_operator.status_builder import token_refused
    from elastic_jax.k8s_operator.tracker import JobTracker

    accept = {"yes": False}

    class Client:
        def report_slice(self, *a, **k):
            if not accept["yes"]:
                raise ControlApiError("PUT /v1/slices/0: 401 missing or invalid bearer token", 401)

        def status(self, after=None, wait_s=0.0):
            return object()

        def close(self):
            pass

    t = JobTracker("ns", "j", 1, 1, client_factory=lambda url, token: Client())
    t.token = "t"
    t.set_controller(controller_view(name="j-controller-0", uid="c", ip="127.0.0.9"))
    t.poll_status()
    t.sync([_pod("w-0")], lambda *e: None)
    assert "401" in t.token_refused
    reason, message = token_refused(t.token_refused)
    assert reason == "ControllerRefusesToken" and "operatorKey.existingSecret" in message and "401" in message
    assert "restarted without its key file (--operator-key-file" in message  # the likely cause, named
    accept["yes"] = True
    t.slices[0].acked = None
    t.sync([_pod("w-0")], lambda *e: None)
    assert t.token_refused is None


def test_building_slice_status_is_a_pure_read_of_the_tracker():
    """`slice_status` wrote the time it chose into the tracker (`SliceTrack.since`) while building status:
    a status that is built and then not written (a pass that ends early, a failed patch) changed the
    operator's state anyway. The time of a slice the tracker never saw change comes from the previous
    status, which the next pass reads."""
    import dataclasses

    from elastic_jax.k8s_operator import job_pass
    from elastic_jax.k8s_operator.tracker import JobTracker

    t = JobTracker("ns", "j", 2, 1)
    before = [dataclasses.replace(s) for s in t.slices]
    first = job_pass.slice_status(t, [0, 0], [], "2030-01-01T00:00:00Z")
    assert t.slices == before  # nothing written into the tracker
    assert [e.last_transition_time for e in first] == ["2030-01-01T00:00:00Z"] * 2
    # the next pass reads what the first wrote: the same time, not its own `now`
    again = job_pass.slice_status(t, [0, 0], first, "2030-01-01T00:05:00Z")
    assert [e.last_transition_time for e in again] == ["2030-01-01T00:00:00Z"] * 2
    # a state the tracker saw change has its own time, whatever the previous status says
    t.sync([_pod("w-0")], lambda *e: None)
    changed = job_pass.slice_status(t, [0, 0], first, "2030-01-01T00:05:00Z")
    assert changed[0].state == "Ready" and changed[0].last_transition_time == t.slices[0].since != ""
    assert changed[1].last_transition_time == "2030-01-01T00:00:00Z"
