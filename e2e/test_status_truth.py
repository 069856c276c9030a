"""Issue 11 (status that tells the truth), two findings of session 9's new-user trial, on the local control plane
with the real operator (least-privilege process) and real controller and worker processes:

- after `suspend: true` the phase read `Suspended` ~2 s while the stopping controller still made steps: the job
  is now `Suspending` until the controller container has terminated, and no watch event shows `Suspended` with a
  step other than the one the controller's own log says it stopped at; after `suspend: false` STEP and ACTIVE
  lagged the new controller by 8-10 s: each Pending version now names the new controller's stage (no answer,
  starting, first step), in order, never back, with STEP the step it resumed from;
- a quiet Pending job's status was rewritten every ~26 s (each status long poll) with only `goodput.seconds` /
  `wallSeconds` changed, so `kubectl get ejob -w` printed an identical line: over two long polls (55 s) no watch
  event of that job differs from the one before it only in the goodput ledger's clock (`goodput.QUIET_WRITE_S`).

- after the controller process was SIGKILLed the job kept `Running` with the old step and slice count until the
  new controller answered: every version from the restart's start until the replacement trained is now
  `Recovering` (reason `ControllerRestarting`), and `stepsLost` counts the steps it did not resume.

All read every version of the job the API server sends on a watch (no polling that could miss one); nothing is
timed.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

from e2e.helpers import pods, wait_for
from e2e.operator_fixtures import (  # noqa: F401  (fixtures)
    apply_job, ejob_crd, example_manifest, get_job, operator, operator_kubeconfig, start_training_job, wait_phase,
)
from e2e.test_operator_counters import _differences, _finished_event, _reconciles
from elastic_jax.k8s_operator.controller_link import MIN_POLL_INTERVAL_S, WATCH_WAIT_S

GROUP, VERSION, PLURAL = "elasticjax.dev", "v1alpha1", "elastictrainingjobs"


class JobWatch:
    """Every version of one job the API server sends on a watch from `resource_version`, on a thread.

    Stop it with `stop()` (the watch requests end within 5 s each, so the thread does too).
    """

    def __init__(self, kube, namespace: str, name: str, resource_version: str):
        from kubernetes import client
        self.api = client.CustomObjectsApi(kube)
        self.namespace, self.name, self.rv = namespace, name, resource_version
        self.objects: list[dict] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"watch-{name}")
        self._thread.start()

    def _run(self) -> None:
        from kubernetes import watch
        while not self._stop.is_set():
            w = watch.Watch()
            try:
                for event in w.stream(self.api.list_namespaced_custom_object, GROUP, VERSION, self.namespace,
                                      PLURAL, field_selector=f"metadata.name={self.name}",
                                      resource_version=self.rv, timeout_seconds=5, allow_watch_bookmarks=False):
                    obj = event["object"]
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self.objects.append(obj)
                        self.rv = obj["metadata"]["resourceVersion"]
                    if self._stop.is_set():
                        break
            except Exception as e:  # (an expired resourceVersion would hide versions: the test fails on it)
                self.errors.append(repr(e)[:500])
                return
            finally:
                w.stop()

    def stop(self) -> list[dict]:
        """Ends the watch; returns the versions seen, oldest first."""
        self._stop.set()
        self._thread.join(30)
        assert not self._thread.is_alive(), "the watch thread did not end"
        assert not self.errors, self.errors
        return self.objects


def _steps(objects: list[dict]) -> list[tuple[str, str, int]]:
    """(resourceVersion, phase, step) of each version."""
    return [(o["metadata"]["resourceVersion"], (o.get("status") or {}).get("phase", ""),
             int((o.get("status") or {}).get("step") or 0)) for o in objects]


# The stages a resumed job's new controller pod goes through, in order (`status_builder.pending_stage`).
STAGES = ("no answer", "starting", "first step", "Running")


def _stage(obj: dict, pod: str) -> str:
    """Which stage of controller pod `pod` a job version stands on ("" for a version about something else)."""
    status = obj.get("status") or {}
    if status.get("controllerPod") != pod:
        return ""
    if status.get("phase") == "Running":
        return "Running"
    cond = next((c for c in status.get("conditions") or [] if c["type"] == "Running"), {})
    message = cond.get("message", "")
    if status.get("phase") != "Pending":
        return ""
    if f"controller pod {pod} is starting" in message:
        return "starting"
    if f"controller pod {pod} compiles and runs its first step" in message:
        return "first step"
    return "no answer" if message == "phase Pending" else ""


def test_a_suspend_reads_suspending_until_the_controller_stopped_and_suspended_never_moves(
        cluster, kube, namespace, operator):
    """Then the job is resumed (session 12's trial: after `spec.suspend: false` STEP and ACTIVE "lagged the new
    controller" by 8-10 s, docs/limitations.md "STEP and active slices lag a resume"). Those seconds are the new
    controller's own work, so each Pending version says which stage it stands on; a second watch reads every
    version from the resume on and checks their order: the new pod's stages go forward (no answer, starting,
    first step, Running), never back, and a first-step version shows the mesh at the step the controller
    resumed from."""
    manifest, status, explain, running = start_training_job(cluster, namespace, operator, "e2e-status-truth")
    name = manifest["metadata"]["name"]
    controller = running["controllerPod"]
    controller_uid = running["counterBase"]["controllerUid"]
    job = get_job(cluster, namespace, name)
    watch = JobWatch(kube, namespace, name, job["metadata"]["resourceVersion"])
    try:
        cluster.kubectl("patch", "ejob", name, "-n", namespace, "--type=merge", "-p", '{"spec":{"suspend":true}}')
        wait_phase(cluster, namespace, name, ("Suspended",), timeout_s=180, explain=explain)
        wait_for(lambda: not pods(cluster, namespace, f"elasticjax.dev/job-name={name}"), timeout_s=180,
                 what="the job's pods gone", explain=explain)
        # a few more passes: anything the operator still writes after the teardown is on the watch too
        passes = _reconciles(operator)
        wait_for(lambda: _reconciles(operator) >= passes + 5, timeout_s=120, what="five more operator passes",
                 explain=explain)
    finally:
        seen = watch.stop()
    # what the controller itself says it reached: the step its SIGTERM stop checkpointed, its last one
    finished = _finished_event(cluster.container_log(namespace, controller, "controller", controller_uid))
    assert finished["stop"] == "signal" and finished["last_committed_checkpoint_step"] == finished["steps"], finished
    steps = _steps(seen)
    phases = [p for _, p, _ in steps]
    assert "Suspending" in phases, steps
    first = phases.index("Suspended")
    assert "Suspending" in phases[:first], steps  # (never Suspended before it said Suspending)
    assert all(p == "Suspended" for p in phases[first:]), steps  # (and it stays so)
    # No Suspended while the controller's step still moves: every Suspended version has its last step.
    assert {s for _, p, s in steps if p == "Suspended"} == {finished["steps"]}, (steps, finished)
    suspended = seen[first]["status"]
    cond = next(c for c in suspended["conditions"] if c["type"] == "Suspended")
    assert cond["status"] == "True", cond
    stopping = next(o["status"] for o in seen if o["status"].get("phase") == "Suspending")
    cond = next(c for c in stopping["conditions"] if c["type"] == "Suspended")
    assert (cond["status"], cond["reason"]) == ("False", "Suspending") and controller in cond["message"], cond

    # The resume, on a watch of its own from the suspended job's version.
    job = get_job(cluster, namespace, name)
    suspended = job["status"]
    watch = JobWatch(kube, namespace, name, job["metadata"]["resourceVersion"])
    try:
        cluster.kubectl("patch", "ejob", name, "-n", namespace, "--type=merge", "-p", '{"spec":{"suspend":false}}')
        trained = wait_for(lambda: (lambda s: s if s.get("phase") == "Running" and s.get("step", 0) >= 1
                                    and s.get("controllerPod") else None)(status()),
                           timeout_s=400, what="the resumed job training", interval_s=0.5, explain=explain)
    finally:
        seen = watch.stop()
    pod = trained["controllerPod"]
    stages = [(s, o["status"].get("step"), o["status"].get("activeSlices")) for o in seen if (s := _stage(o, pod))]
    order = [STAGES.index(s) for s, _, _ in stages]
    assert order == sorted(order), stages  # forward only
    assert "starting" in [s for s, _, _ in stages], stages  # (the controller answers before it builds its trainer)
    assert stages[-1][0] == "Running", stages
    # issue 11: from the resume on, STEP is the step the new controller starts from (0 here: the local checkpoint
    # folder went with the suspended pod), never the step reached before the suspend (the trial read it ~2 s);
    # first step: the controller's own resume step and its mesh
    resumed = [o["status"] for o in seen if (o.get("status") or {}).get("phase") not in ("Suspended", None)]
    assert resumed and all(s["step"] == 0 for s in resumed if s.get("phase") == "Pending"), \
        ([(s["phase"], s["step"]) for s in resumed], suspended["step"])
    assert all(act == 2 for s, _, act in stages if s == "first step"), stages
    # the steps lost still count from the step reached
    assert status()["stepsLost"] == suspended["step"] + (suspended.get("stepsLost") or 0), status()


def _without_clock(obj: dict) -> dict:
    """The job without what any write changes (resourceVersion, managedFields) and without the goodput ledger's
    time counters (its seconds, wallSeconds, reducedEquivalentSeconds, fraction); the GOODPUT column
    (`percent`) stays."""
    out = json.loads(json.dumps(obj))
    for key in ("resourceVersion", "managedFields"):
        out["metadata"].pop(key, None)
    goodput = (out.get("status") or {}).get("goodput")
    if goodput:
        for key in ("seconds", "wallSeconds", "reducedEquivalentSeconds", "fraction"):
            goodput.pop(key, None)
    return out


def test_a_quiet_pending_job_is_not_rewritten_for_its_goodput_clock_alone(cluster, kube, namespace, operator):
    manifest = example_manifest()
    name = manifest["metadata"]["name"]
    # The workers can never be scheduled (no node has this pool): the controller waits for its slices at start,
    # booking `starting` seconds, and the job stays Pending with PodsNotStarting saying why.
    manifest["spec"]["worker"] = {"nodeSelector": {"cloud.google.com/gke-nodepool": "no-such-pool"}}
    manifest["spec"]["checkpoint"]["uri"] = f"/tmp/elastic-jax/e2e-status-truth/{namespace}/checkpoints"
    status, explain = apply_job(cluster, namespace, manifest, operator)

    def waiting():
        s = status()
        cond = next((c for c in s.get("conditions") or [] if c["type"] == "PodsNotStarting"), {})
        return s if (s.get("phase") == "Pending" and (s.get("goodput") or {}).get("seconds")
                     and cond.get("status") == "True") else None
    wait_for(waiting, timeout_s=300, what="a Pending job whose controller answers, PodsNotStarting", interval_s=0.5,
             explain=explain)
    job = get_job(cluster, namespace, name)
    watch = JobWatch(kube, namespace, name, job["metadata"]["resourceVersion"])
    started, passes = time.monotonic(), _reconciles(operator)
    try:
        # Two status long-poll answers at least, each of which rewrote the job before: one answer comes at
        # most WATCH_WAIT_S + MIN_POLL_INTERVAL_S after the last (55 s with 25 + 1 and a 3-s margin). The
        # passes: the operator kept reconciling the job meanwhile (a stalled one would write nothing, and the
        # test could not fail).
        window_s = 2 * (WATCH_WAIT_S + MIN_POLL_INTERVAL_S) + 3
        wait_for(lambda: time.monotonic() - started >= window_s and _reconciles(operator) >= passes + 20,
                 timeout_s=600, what=f"{window_s:.0f} s and 20 operator passes", interval_s=1, explain=explain)
    finally:
        seen = watch.stop()
    before = job
    clock_only = []
    for obj in seen:
        if _without_clock(obj) == _without_clock(before):
            clock_only.append(_differences(before, obj))
        before = obj
    assert not clock_only, "".join(clock_only)
    last = seen[-1] if seen else job
    assert last["status"]["phase"] == "Pending", last["status"]
    # the ledger written is never lower than before the window
    for category, seconds in job["status"]["goodput"]["seconds"].items():
        assert last["status"]["goodput"]["seconds"][category] >= seconds, (category, job["status"], last["status"])


def _restart_reason(obj: dict) -> str:
    """The reason of a job version's ControllerRestarted condition ("" when it has none)."""
    conds = (obj.get("status") or {}).get("conditions") or []
    return next((c.get("reason", "") for c in conds if c["type"] == "ControllerRestarted"), "")


def test_a_killed_controller_reads_recovering_until_its_replacement_trains_and_counts_the_steps_lost(
        cluster, kube, namespace, operator):
    """Session 9/10 trials: after the controller process was SIGKILLed, `kubectl get ejob` kept `Running` with the
    old step and slice count until the new controller answered (then Pending while it restored). Now every version
    from the restart's start until the replacement trained reads Recovering (reason ControllerRestarting, 0 active
    at first), then Running, never Pending; and `stepsLost` is the step reached minus the step the new one resumed."""
    manifest, status, explain, running = start_training_job(cluster, namespace, operator, "e2e-status-truth-restart")
    name = manifest["metadata"]["name"]
    controller, uid = running["controllerPod"], running["counterBase"]["controllerUid"]
    job = get_job(cluster, namespace, name)
    watch = JobWatch(kube, namespace, name, job["metadata"]["resourceVersion"])
    try:
        os.kill(cluster.container_pid(namespace, controller, "controller", uid), signal.SIGKILL)

        def trained_again():
            s = status()
            return s if (s.get("controllerRestarts") == 1 and s.get("phase") == "Running"
                         and _restart_reason({"status": s}) == "ControllerPodLost") else None
        after = wait_for(trained_again, timeout_s=300, what="the replacement controller training", interval_s=0.5,
                         explain=explain)
    finally:
        seen = watch.stop()
    reasons = [_restart_reason(o) for o in seen]
    assert "ControllerRestarting" in reasons, _steps(seen)
    first = reasons.index("ControllerRestarting")
    end = reasons.index("ControllerPodLost", first)
    during = [o["status"] for o in seen[first:end]]
    # no flap: Recovering from the restart's first version until the replacement trained, then Running
    assert all(s["phase"] == "Recovering" for s in during), _steps(seen)
    assert seen[end]["status"]["phase"] in ("Running", "Degraded"), _steps(seen)  # (its first step may be on one)
    assert not [o for o in seen[end:] if o["status"]["phase"] == "Pending"], _steps(seen)
    assert during[0]["activeSlices"] == 0, during[0]
    # the steps lost: the step the job had reached (kept while the replacement restores) minus where it resumed
    reached = during[0]["step"]
    resumed = (after.get("resumedFrom") or {}).get("step", 0) \
        if (after.get("resumedFrom") or {}).get("controllerPod") == after["controllerPod"] else 0
    assert after["stepsLost"] == max(0, reached - resumed), (reached, resumed, after)
    # once the replacement reported where it resumed, the step is that one, not the lost controller's
    moved = [s["step"] for s in during if s["step"] != reached]
    assert not moved or moved[0] == resumed, (moved, resumed, _steps(seen))


def _condition(status: dict, type_: str) -> dict:
    return next((c for c in status.get("conditions") or [] if c["type"] == type_), {})


def test_a_frozen_controllers_seconds_are_booked_recovering_not_productive(cluster, kube, namespace, operator):
    """Issue 11: the controller process SIGSTOPped while it trains (alive, making no step) reads Degraded with
    ControllerUnresponsive; once SIGCONTed its own ledger holds the frozen seconds in `productive` (its clock ran
    on), and the operator's `status.goodput` books them `recovering` (`counterBase.frozenSeconds`), as
    `elastic-jax run` does. The freeze's length is the test's wait for the condition, not an assertion."""
    manifest, status, explain, running = start_training_job(cluster, namespace, operator, "e2e-status-truth-freeze")
    name = manifest["metadata"]["name"]
    controller, uid = running["controllerPod"], running["counterBase"]["controllerUid"]
    pid = cluster.container_pid(namespace, controller, "controller", uid)
    before = running["goodput"]["seconds"]
    stopped_at = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_for(lambda: _condition(status(), "ControllerUnresponsive").get("status") == "True", timeout_s=180,
                 what="ControllerUnresponsive True", interval_s=0.5, explain=explain)
        frozen_at = status()
    finally:
        os.kill(pid, signal.SIGCONT)
        stop_s = time.monotonic() - stopped_at
    after = wait_for(lambda: (lambda s: s if _condition(s, "ControllerUnresponsive").get("status") == "False"
                              and s.get("step", 0) > frozen_at["step"] else None)(status()),
                     timeout_s=180, what="the controller answering and training again", interval_s=0.5,
                     explain=explain)
    assert after["controllerPod"] == controller and after["controllerRestarts"] == 0, after  # (the same process)
    # the freeze lasted at least the grace the condition waits for (20 s) without an answer
    assert stop_s >= 20, stop_s
    seconds = after["goodput"]["seconds"]
    # Its own ledger booked the frozen seconds `stalled` (its stall notice) or as training, which the operator
    # re-books `recovering` (`counterBase.frozenSeconds`: only what the ledger booked as training, never more:
    # a CI run re-booked the whole freeze from the training after it as well). Either way none is productive.
    # The operator sees a freeze only between answers: from its last answer before SIGSTOP to its first after
    # SIGCONT, each up to one poll (MIN_POLL_INTERVAL_S, 1 s) plus a request's time away from the signal, and
    # the ledger's training seconds grow across that span too: hence 4 s (a loaded CI run measured 1.4 s).
    margin_s = 2 * MIN_POLL_INTERVAL_S + 2
    frozen = after["counterBase"].get("frozenSeconds", 0)
    assert frozen <= stop_s + margin_s, (after["counterBase"], stop_s)
    not_training = sum(seconds.get(k, 0) - before.get(k, 0) for k in seconds if k not in ("productive", "reduced"))
    assert not_training >= stop_s - 2, (before, seconds, stop_s)  # (2 s: the answers' timing around the signals)
    booked = after["goodput"]["wallSeconds"] - running["goodput"]["wallSeconds"]
    assert seconds["productive"] - before["productive"] <= booked - stop_s + 2, (before, seconds, stop_s, booked)
    # and the training after the freeze is booked productive, not `recovering` in the freeze's place: before,
    # the freeze was booked `stalled` by the ledger and the next seconds of training `recovering` as well
    later = wait_for(lambda: (lambda s: s if s["goodput"]["seconds"]["productive"] - before["productive"] >= 5
                              else None)(status()),
                     timeout_s=180, what="5 s of productive training after the freeze", interval_s=1,
                     explain=explain)["goodput"]
    not_training = sum(v - before.get(k, 0) for k, v in later["seconds"].items() if k not in ("productive", "reduced"))
    assert not_training <= stop_s + margin_s, (before, later, stop_s)  # the freeze once, not twice
