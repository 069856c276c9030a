"""Observed children → the changes to make: the operator's decisions as a pure function.

`decide(job, observed)` never calls the API; the kopf timer applies the
returned `Plan`. Every decision is idempotent: applying a plan twice, or
after an operator restart, converges to the same children.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import re
from typing import Any, Mapping

from elastic_jax.api import labels
from elastic_jax.api.cluster import checkpoints_go_with_pod, local_checkpoint_loss
from elastic_jax.api.job import ElasticTrainingJob
from elastic_jax.api.status import (COND_CONTROLLER_RESTARTED, COND_IMAGE_PULL_FAILED, COND_SUSPENDED,
                                    EVENT_WORKERS_RESTARTED, REASON_CONTROLLER_BACK_OFF, ElasticTrainingJobStatus)
from elastic_jax.exit_codes import ControllerExit, signal_exit
from elastic_jax.k8s_operator import counters, finished, names
from elastic_jax.k8s_operator.conditions import get_condition
from elastic_jax.k8s_operator.backends import pathways as pathways_backend
from elastic_jax.k8s_operator.nodes import NodeLoss, NodeLostPod, pods_on_lost_nodes
from elastic_jax.k8s_operator.pod_faults import image_pull_failed, pod_faults
from elastic_jax.k8s_operator.slices import JobSetView, PodView
from elastic_jax.supervision import backoff, budgets


@dataclasses.dataclass
class Observed:
    """What the operator knows of one job's world.

    Attributes:
      status: the job's current `.status` as read (camelCase dict, possibly empty); the decisions read it typed
        (`job_status`).
      controller_pods: the job's controller pods (any incarnation).
      jobsets: worker JobSets by slice index.
      controller_failure_reason: the controller's last reported failure reason, if any.
      controller_phase: the controller's last reported phase (`GET /v1/status`), None before any.
      worker_pods: the job's worker pods (for images that cannot be pulled).
      now: RFC 3339 time of this pass ("": time-based decisions are skipped).
      expected_pod_age_s: seconds since this operator process created the pod
        `status.controllerPod` names (None: not created by this process, e.g.
        before an operator restart; kopf fills indexes before handlers run, so
        such a pod missing from the index is gone).
      lost_nodes: nodes not Ready for longer than the operator's bound (`nodes.lost_nodes`), by name.
    """

    status: dict[str, Any]
    controller_pods: list[PodView]
    jobsets: dict[int, JobSetView]
    controller_failure_reason: str | None = None
    worker_pods: list[PodView] = dataclasses.field(default_factory=list)
    now: str = ""
    expected_pod_age_s: float | None = None
    lost_nodes: Mapping[str, NodeLoss] = dataclasses.field(default_factory=dict)
    controller_phase: str | None = None

    @functools.cached_property
    def job_status(self) -> ElasticTrainingJobStatus:
        """`status` as the typed model (`ElasticTrainingJobStatus.from_kube`), parsed once per pass.

        Raises:
          ValueError: a known field holds a value the model refuses (`.status` edited by hand).
        """
        return ElasticTrainingJobStatus.from_kube(self.status)


@dataclasses.dataclass
class Plan:
    """Changes to apply, in order: deletions, creations, then status.

    Attributes:
      create_controller: incarnation number of a controller pod to create.
      delete_pods: controller pods to delete (gracefully).
      force_delete: the job's pods on lost nodes, to delete with grace 0 (the kubelet that
        would confirm a graceful delete is gone), workers and controller alike.
      create_jobsets: slice indices whose JobSet to create.
      delete_jobsets: JobSet names to delete.
      finish: ("Succeeded" | "Failed", reason) when the job ends now.
      controller_restarted: the new controller pod replaces one that died.
      events: (type, reason, message) Kubernetes Events to post.
      pathways_head: backend pathways: the head incarnation (`backends.pathways.head_incarnation`)
        the JobSets created now register with; the handler records it on each.
      replace_after_stop: the controller pod someone else deletes gracefully (`kubectl delete pod`, a drain):
        its replacement is created once its container has stopped (`_holds_workers`), not before: on SIGTERM
        it checkpoints its last step, which the replacement must be able to restore ("" when none).
      suspend_waits_for: spec.suspend: the controller pods whose container still runs (`_holds_workers`):
        the job is Suspending, not Suspended, until they have stopped.
      losses_in_a_row: the lost controller's loss counted with those before it since a controller last
        trained a step (`supervision.backoff.losses_after`), set when this pass finds it lost: what
        `status.controllerLossesInARow` becomes once its replacement is created. None: no loss now.
      backoff: the lost controller's replacement waits (a crash loop: `supervision.backoff`); nothing is
        created this pass. None: no wait.
      wake_in_s: seconds from `Observed.now` after which a pass is due though nothing else may change (the
        end of `backoff`); None: none.
    """

    create_controller: int | None = None
    delete_pods: list[str] = dataclasses.field(default_factory=list)
    force_delete: list[NodeLostPod] = dataclasses.field(default_factory=list)
    create_jobsets: list[int] = dataclasses.field(default_factory=list)
    delete_jobsets: list[str] = dataclasses.field(default_factory=list)
    finish: tuple[str, str] | None = None
    controller_restarted: bool = False
    replace_after_stop: str = ""
    events: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)
    pathways_head: str = ""
    suspend_waits_for: list[str] = dataclasses.field(default_factory=list)
    losses_in_a_row: int | None = None
    backoff: "ControllerBackOff | None" = None
    wake_in_s: float | None = None

    def losses_in_a_row_written(self, replaced: bool) -> int | None:
        """`status.controllerLossesInARow` of this pass: the count with the lost pod's loss once its replacement
        was created (`replaced`) or while that replacement waits (the back-off's message says the same count);
        None: left as written."""
        return self.losses_in_a_row if replaced or self.backoff is not None else None


@dataclasses.dataclass(frozen=True)
class ControllerBackOff:
    """A lost controller pod whose replacement waits (`supervision.backoff.restart_delay_s`).

    Attributes:
      pod: the lost pod's name.
      why: how it ended (`_loss_reason`: exit code and its last word).
      losses_in_a_row: this loss included.
      delay_s: the whole wait, counted from `since`.
      since: the pod's container `finishedAt` (its creation time when the kubelet gave none), RFC 3339.
      until: when the wait ends (`since` + `delay_s`), RFC 3339.
      left_s: seconds of the wait left at `Observed.now`.
      replacement: the name its replacement will have.
    """

    pod: str
    why: str
    losses_in_a_row: int
    delay_s: float
    since: str
    until: str
    left_s: float
    replacement: str


# How long a controller pod this operator created may be missing from the pod index before
# it counts as vanished (the watch normally delivers it within a second).
INDEX_LAG_S = 30.0


def attempt_of(pod_name: str) -> int | None:
    """The incarnation number in a controller pod name (`<job>-controller-<n>`), or None."""
    head, _, tail = pod_name.rpartition("-controller-")
    return int(tail) if head and tail.isdigit() else None


def next_attempt(status: ElasticTrainingJobStatus, *attempts: int | None) -> int:
    """The incarnation number of the job's next controller pod: above every one it had, 0 for its first.

    `status.controllerAttempt` (the newest this operator created, kept through a suspend) counts
    with `attempts` (the pods seen, the one `status.controllerPod` names): a resume's pod gets a
    name of its own instead of `-0` again, so `kubectl logs`, Events and the pod's log folder never
    mix two incarnations. A status an older operator wrote has no `controllerAttempt`: then only the
    pods seen count, as before.
    """
    known = [a for a in (status.controller_attempt, *attempts) if a is not None]
    return max(known) + 1 if known else 0


# Event reason: a suspend's controller outlived its grace period, so its workers go while it may still run.
SUSPEND_CONTROLLER_NOT_STOPPED = "SuspendControllerNotStopped"


def _holds_workers(pod: PodView, observed: Observed) -> bool:
    """A suspend keeps the workers for this controller pod: its process may still run a step.

    True until the pod has really stopped (its container terminated, the pod terminal or gone from
    `observed`), for a pod that runs (phase Running; a Pending pod never started a step) on a node
    that is not lost (`plan.force_delete` takes those; nothing there stops gracefully) and was not
    force-deleted. Readiness does not count: the kubelet marks a terminating pod not Ready at once,
    while the controller still ends its step and checkpoints (the kind suspend race).
    """
    return (pod.phase == "Running" and not dead(pod) and pod.node not in observed.lost_nodes
            and pod.deletion_grace_s != 0)


def _grace_expired(pod: PodView, now: str) -> bool:
    """The pod's deletion deadline (its delete's time plus its terminationGracePeriodSeconds) has passed."""
    if not pod.deleting or not pod.deletion_deadline:
        return False
    left = _seconds_between(now, pod.deletion_deadline)
    return left is not None and left <= 0


def _teardown(observed: Observed, plan: Plan, keep_finished_controller: bool, workers_last: bool = False) -> Plan:
    """Deletes the job's children.

    With `workers_last` (suspend), the JobSets go only once no controller
    process may still run (`_holds_workers`): the controller checkpoints on
    SIGTERM at its next step boundary, and a worker vanishing first would turn
    that step into a slice loss (with `minSlices` = count, a wait until
    SIGKILL, losing the checkpoint). The wait is bounded by the controller
    pod's own grace period (its `metadata.deletionTimestamp`, the kubelet's
    SIGKILL time): past it the workers go anyway, with a Warning Event
    (`SUSPEND_CONTROLLER_NOT_STOPPED`). Without `observed.now` the bound is
    not checked (the wait lasts until the pod stops).
    """
    # A finished job keeps the controller pod that ended it (its logs, `kubectl logs`): `dead`, not only a
    # terminal phase, which may lag the container's exit the job was decided on.
    plan.delete_pods = [p.name for p in observed.controller_pods
                        if not p.deleting and not (keep_finished_controller and dead(p))]
    overdue: list[PodView] = []
    if workers_last:
        holding = [p for p in observed.controller_pods if _holds_workers(p, observed)]
        overdue = [p for p in holding if _grace_expired(p, observed.now)]
        if len(overdue) < len(holding):
            return plan
    plan.delete_jobsets = [js.name for js in observed.jobsets.values() if not js.deleting]
    if overdue and plan.delete_jobsets:
        plan.events.append(("Warning", SUSPEND_CONTROLLER_NOT_STOPPED,
                            f"suspend: controller pod {', '.join(p.name for p in overdue)} still runs past its "
                            f"grace period (deadline {overdue[0].deletion_deadline}); deleting the worker JobSets "
                            "anyway: a step it still runs loses its slices and its last checkpoint may be missing"))
    return plan


def dead(pod: PodView) -> bool:
    """The controller pod will not run again: terminal, or its container terminated (restartPolicy Never).

    The kubelet may report a terminated container before the pod's phase
    follows (or, with sidecars, the phase may lag): either way nothing restarts it.
    """
    return pod.terminal or pod.exit_code is not None


_RFC3339 = "%Y-%m-%dT%H:%M:%SZ"


def _seconds_between(since: str, now: str) -> float | None:
    try:
        parse = lambda t: dt.datetime.strptime(t, _RFC3339)  # noqa: E731
        return (parse(now) - parse(since)).total_seconds()
    except (TypeError, ValueError):
        return None


def _worker_failed_unpulled(observed: Observed) -> tuple[str, str] | None:
    """("Failed", reason) when a worker pod *failed* because its image could not be pulled.

    A kubelet keeps such a pod Pending and retries the pull (see `pod_faults`);
    a runtime that fails the pod instead leaves only the JobSet's restarts to
    retry it, each counted against the budgets and ending in "N slice
    replacements exceed ..." without the image. Fail once, naming it.
    """
    pod = next((p for p in observed.worker_pods if p.terminal and image_pull_failed(p)), None)
    if pod is None:
        return None
    return "Failed", (f"slice {pod.slice_index} worker pod {pod.name}: image {pod.waiting_image or '(unknown)'} cannot "
                      f"be pulled ({pod.waiting_reason}): {pod.waiting_message}; the pod failed, so nothing retries the pull")


def _image_pull_timed_out(job: ElasticTrainingJob, observed: Observed) -> tuple[str, str] | None:
    """("Failed", reason) once an image stayed unpullable `elasticity.imagePullTimeoutSeconds` (0: never)."""
    timeout = job.spec.elasticity.image_pull_timeout_seconds
    fault = pod_faults(observed.controller_pods + observed.worker_pods).get(COND_IMAGE_PULL_FAILED)
    if not timeout or fault is None or not observed.now:
        return None
    cond = get_condition(observed.job_status.conditions, COND_IMAGE_PULL_FAILED)
    since = cond.last_transition_time if cond is not None and cond.status == "True" else ""
    waited = _seconds_between(since, observed.now)
    if waited is None or waited < timeout:
        return None
    return "Failed", f"{fault.message.removesuffix('; the kubelet retries with back-off')}; not pulled within " \
                     f"elasticity.imagePullTimeoutSeconds={timeout}"


def _controller_exit(job: ElasticTrainingJob, pod: PodView, observed: Observed) -> tuple[str, str] | None:
    """("Succeeded"|"Failed", reason) when the controller pod's exit ends the job; None for a loss to recover.

    Only `ControllerExit.SUCCEEDED`, `FAILED` and `BAD_INPUT` end the job.
    `RESTART` (the controller was signalled by its node: graceful shutdown,
    preemption; it checkpointed and asks to be restarted), `STOPPED` while the
    spec still wants the job running, a signal's 128+n and any other code are
    controller losses: recreated and counted.
    """
    namespace = f" -n {job.metadata.namespace}" if job.metadata.namespace else ""
    if pod.phase == "Succeeded" or pod.exit_code == ControllerExit.SUCCEEDED:
        if job.spec.controller.library_mode and observed.controller_phase is None \
                and not observed.job_status.step:
            # Never answered and no step known: a program that never served the control API (no connect()).
            # Its exit 0 is no "trained N steps" (a trial saw that for `python -c 'print(1)'`); `elastic-jax
            # run` refuses the same program before it is ready. (A program on the runtime is read at least
            # once before it exits: the final status handoff.)
            return "Failed", ("the program exited 0 without ever answering the control API: it never called "
                              "elastic_jax.connect() (a module that does not: python -m elastic_jax.run_module "
                              f"MODULE ...); see kubectl logs {pod.name}{namespace} -c controller")
        if job.spec.controller.library_mode and observed.controller_phase == "Failed":
            # The library's books (its final status, read before the program exits): the program closed its
            # runtime short of spec.training.steps without an exit code saying it succeeded; exit 0 then
            # is not "trained N steps" (`elastic-jax run` reads the same books: failed).
            return "Failed", (f"the program exited 0 but "
                              f"{observed.controller_failure_reason or 'its runtime ended Failed'}")
        return "Succeeded", f"trained {job.spec.training.steps} steps"
    detail = termination_reason(pod.termination_message).removeprefix("error: ")
    # Nothing said why: which log says it (a finished job keeps its controller pod).
    log_hint = f"no reason given; see kubectl logs {pod.name}{namespace} -c controller"
    if pod.exit_code == ControllerExit.FAILED:
        return "Failed", f"training failed: {observed.controller_failure_reason or detail or log_hint}"
    if pod.exit_code == ControllerExit.BAD_INPUT:
        return "Failed", f"the controller refused its input: {detail or log_hint}"
    if (pod.exit_code in EXEC_FAILED_CODES or any(f"({r})" in pod.reason for r in START_ERROR_REASONS)) \
            and observed.job_status.controller_losses_in_a_row >= 1:
        # Its command could not be run (missing, not executable), again, with no step trained since the
        # last loss: every replacement fails the same way at once (a trial: 21 controller pods in 25 s, the
        # restart budget spent). The first time is a loss like any other: a container setup failure can be
        # a transient (CI under load: a manifest mount not there yet, exit 126, failed a healthy job).
        what = "spec.controller.command" if job.spec.controller.library_mode else "spec.controller.image"
        return "Failed", (f"controller pod {pod.name}: its command cannot be run ({pod.reason}"
                          f"{': ' + detail if detail else ''}); check {what}")
    return None


# Exit codes of a command that could not be run: 126 found but not executable, 127 not found (POSIX sh; the
# stand-in kubelet's exec); the container runtimes' reasons for a container whose process never started
# (containerd: StartError, Docker: ContainerCannotRun; the kubelet puts them in `terminated.reason`).
EXEC_FAILED_CODES = (126, 127)
START_ERROR_REASONS = ("StartError", "ContainerCannotRun")


# Event reasons of a suspend/resume of a job whose checkpoints cannot outlive its controller pod.
SUSPEND_DROPS_CHECKPOINTS = "SuspendDropsCheckpoints"
RESUMED_FROM_STEP_ZERO = "ResumedFromStepZero"


def _was_suspended(status: ElasticTrainingJobStatus) -> bool:
    """The job's last status said it was suspended (the Suspended condition, or the phase)."""
    suspended = get_condition(status.conditions, COND_SUSPENDED)
    return status.phase in ("Suspending", "Suspended") or (suspended is not None and suspended.status == "True")


def _resume_warning(job: ElasticTrainingJob, status: ElasticTrainingJobStatus, plan: "Plan") -> None:
    """Adds the `RESUMED_FROM_STEP_ZERO` Warning to `plan` when a resume's new controller cannot restore a step
    the job had reached. None at step 0: starting again from step 0 then loses nothing (a suspend while a
    restart's replacement was still at step 0 posted "resumed from step 0, not step 0")."""
    why = local_checkpoint_loss(job)
    step = status.step
    if why and step > 0:
        plan.events.append(("Warning", RESUMED_FROM_STEP_ZERO,
                            f"resumed from step 0, not step {step}: {why}; the suspended controller pod took them"))


def resume_text(job: ElasticTrainingJob) -> str:
    """What a new controller pod resumes from: the latest checkpoint, or nothing when spec.checkpoint.uri is local
    (an emptyDir of the lost pod: its checkpoints went with it)."""
    if not checkpoints_go_with_pod(job):
        return "which resumes from the latest checkpoint"
    return (f"which starts again from step 0: spec.checkpoint.uri {job.spec.checkpoint.uri} is local to the lost "
            "pod, so its checkpoints went with it (use gs:// to keep them)")


# A JSON string field of the controller's log naming why it failed, found even in a cut line.
_REASON_FIELD = re.compile(r'"failure_reason": ("(?:[^"\\]|\\.)*")')


def termination_reason(message: str) -> str:
    """The one line saying why the controller ended, from its container's termination message.

    The controller writes that line (`error: <reason>`) to its termination
    message file when it fails. Without it (an older image, a crash, a kill)
    FallbackToLogsOnError gives the kubelet's last 2048 bytes of the log, whose
    first (often only) line is cut mid-JSON. In order of preference: the last
    `error: ` line (a JSON log line counts by its `msg`); the last
    `failure_reason` field of the log (its summary), even in a cut line; the last
    line that is not a cut JSON fragment. "" when none.
    """
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    texts = [_log_text(ln) for ln in lines]
    errors = [t for t in texts if t.startswith("error: ")]
    if errors:
        return errors[-1]
    for line in reversed(lines):
        for match in reversed(_REASON_FIELD.findall(line)):
            try:
                reason = json.loads(match)
            except ValueError:
                continue
            if reason:
                return reason
    whole = [t for ln, t in zip(lines, texts) if not _json_fragment(ln, t)]
    return whole[-1] if whole else ""


def _json_fragment(line: str, text: str) -> bool:
    """The line is a piece of a JSON log line (cut by the log tail), not a readable message."""
    if text is not line:  # a whole JSON line, read as its msg
        return False
    return line.startswith("{") or line.endswith("}") or '": ' in line


def _loss_reason(pod: PodView | None, lost_nodes: Mapping[str, NodeLoss] | None = None,
                 status: ElasticTrainingJobStatus | None = None) -> str:
    """Why a controller pod is gone, for the Event and a budget failure: exit code/reason and the log's last line.

    A signal's exit (128+n) without the controller's own `error: ` line names the signal instead of
    a log line: that line predates the kill and says nothing about it. A pod gone after the status said it
    was being deleted (`Plan.replace_after_stop`) was deleted, not vanished (session 16's trial read
    "pod vanished" for a `kubectl delete pod` whose controller had checkpointed on SIGTERM)."""
    if pod is None:
        expected = status.controller_pod if status is not None else ""
        stopping = f"controller pod {expected} is being deleted"
        restarted = get_condition(status.conditions, COND_CONTROLLER_RESTARTED) if status is not None else None
        if expected and restarted is not None and stopping in restarted.message:
            return "deleted by someone else; it stopped after its SIGTERM checkpoint"
        return "pod vanished"
    loss = (lost_nodes or {}).get(pod.node) if not dead(pod) else None
    if loss is not None:
        return f"node {loss.node} lost, not Ready for {loss.seconds:.0f} s: {loss.why}"
    why = pod.reason or ("deleted" if pod.deleting else pod.phase or "unknown")
    # the controller's own `error: ` line (e.g. the no-progress watchdog's) beats whatever followed it
    detail = termination_reason(pod.termination_message)
    killed_by = signal_exit(pod.exit_code)
    if killed_by and not detail.startswith("error: "):
        # A signal ended it before it could say why: the log's last line (the kubelet's fallback
        # tail) is whatever it logged earlier, e.g. a slice loss it recovered from a minute before,
        # so it is named as that, never as the cause.
        last = f"; its last log line, from before the signal: {detail[:300]}" if detail else ""
        return f"{why}: {killed_by}{last}"
    return f"{why}: {detail[:300]}" if detail else why


def _log_text(line: str) -> str:
    """A log line's message: the `msg` of a JSON log line (the controller's structured log), else the line."""
    if line.startswith("{"):
        try:
            msg = json.loads(line).get("msg")
        except (ValueError, AttributeError):
            return line
        return msg if isinstance(msg, str) else line
    return line


def _restart_detached_workers(job: ElasticTrainingJob, observed: Observed, plan: Plan, head: PodView | None) -> None:
    """Backend pathways: the start order and what a new head does to the worker JobSets.

    Workers register with one resource manager; they are created only once the
    current head's resource manager listens (`plan.pathways_head` set), and a
    JobSet created for another head incarnation (the controller pod was
    recreated, or its resource-manager sidecar restarted) is deleted, so it is
    created again for this one. Cost: every slice's pods restart (minutes on
    TPU: image start, TPU init, registration); the node pools stay (exclusive
    placement keeps them), and a recreated JobSet is not a slice failure: no
    budget is spent. A JobSet without the annotation (an older operator) is left.
    """
    if plan.create_controller is not None:
        current = pathways_backend.head_incarnation(names.controller_pod(job.metadata.name, plan.create_controller), 0)
    elif head is not None:
        current = pathways_backend.head_incarnation(head.name, head.rm_restarts)
        if head.rm_started:
            plan.pathways_head = current
    else:
        return  # the head is on its way (just created, not yet in the index): decide next pass
    stale = sorted(i for i, js in observed.jobsets.items() if js.head and js.head != current and not js.deleting)
    if not stale:
        return
    plan.delete_jobsets.extend(observed.jobsets[i].name for i in stale)
    plan.events.append(("Warning", EVENT_WORKERS_RESTARTED,
                        f"slices {stale}: their workers registered with Pathways head {observed.jobsets[stale[0]].head}, "
                        f"which is gone; restarting their JobSets to register with {current}"))


def decide(job: ElasticTrainingJob, observed: Observed) -> Plan:
    """The changes that move one job's children towards its spec.

    Args:
      job: the validated job.
      observed: its current status and children.

    Returns:
      A `Plan`. Worker failures never touch the controller pod: a slice's
      JobSet replaces its own pods; only the controller's own death (a pod
      that exited with a code that does not end the job (see `_controller_exit`), vanished, or is being deleted
      by someone else) recreates the controller, counted in status; a controller that exited again before any
      controller trained a step since the last loss waits first (`supervision.backoff`: `Plan.backoff`,
      `Plan.wake_in_s`). Backend pathways: a slice's JobSet is
      created only once the head's resource manager listens, and JobSets of an earlier head are restarted
      (`_restart_detached_workers`).
    """
    plan = Plan()
    status = observed.job_status
    if finished.finished_phase(status) is not None:
        return _teardown(observed, plan, keep_finished_controller=True)
    foreign = finished.foreign_finish_message(status)
    if foreign:  # (written over by this pass's status: said once)
        plan.events.append(("Warning", finished.REASON_FOREIGN_PHASE_IGNORED, foreign))
    # Whatever else happens, the job's pods on a lost node go now (grace 0): a suspend's graceful
    # delete would never finish there, and a slice's JobSet replaces only a pod that has ended.
    plan.force_delete = pods_on_lost_nodes(observed.controller_pods + observed.worker_pods, observed.lost_nodes)
    if job.spec.suspend:
        plan.suspend_waits_for = [p.name for p in observed.controller_pods if _holds_workers(p, observed)]
        if status.controller_pod:
            # Release first, delete next pass: this pass writes status.controllerPod "" and the
            # pod is deleted only once that write is back. So whatever the timing (a resume a
            # second later, a pass on an older object, an operator restart in between), a
            # controller pod the suspend deleted is never in status as the job's controller,
            # and its end is never read as a loss (`released` below).
            return plan
        _teardown(observed, plan, keep_finished_controller=False, workers_last=True)
        why = local_checkpoint_loss(job)
        step = status.step
        # said when the pod goes (a toggle before that loses nothing), not at resume; not at step 0, where the
        # resume's start from step 0 loses nothing
        if why and plan.delete_pods and step > 0:
            plan.events.append(("Warning", SUSPEND_DROPS_CHECKPOINTS,
                                f"suspend: deleting {', '.join(plan.delete_pods)} (step {step} when last reported; "
                                f"it checkpoints the step it stops at): {why}; the resume will start again from "
                                "step 0"))
        return plan

    name = job.metadata.name
    elasticity = job.spec.elasticity
    restarts = status.controller_restarts
    expected = status.controller_pod
    expected_attempt = attempt_of(expected)
    newest = max(observed.controller_pods, key=lambda p: p.attempt, default=None)

    # status.controllerPod names a newer pod than any in the index: the watch has not delivered the
    # pod we just created (wait), or it was deleted before the index saw it (a loss, not a silent wait).
    # The index may hold no controller pod at all: the one replaced was force-deleted (grace 0, gone
    # at once: a lost node) before the watch delivered its successor.
    lagging = expected_attempt is not None and (newest is None or newest.attempt < expected_attempt)
    in_flight = lagging and observed.expected_pod_age_s is not None and observed.expected_pod_age_s < INDEX_LAG_S
    if lagging and not in_flight:
        newest = None
    # A controller on a lost node is a loss like any other (replaced, counted, resumes from its
    # checkpoint); its pod is in plan.force_delete.
    stranded = newest is not None and not dead(newest) and newest.node in observed.lost_nodes
    # Status names no controller while one exists: the suspend released it (it is being deleted
    # and checkpoints on SIGTERM, or has stopped). Its end is no loss: wait for it to stop (two
    # controllers must not train at once), then start the next incarnation, uncounted.
    released = expected_attempt is None and newest is not None
    if in_flight:
        pass
    elif newest is None or dead(newest) or newest.deleting or stranded:
        ended = _controller_exit(job, newest, observed) if newest is not None and dead(newest) else None
        if ended:
            plan.finish = ended
        elif newest is not None and image_pull_failed(newest) and not newest.deleting:
            # The pod ended while its image could not be pulled: a new pod would fail the same
            # way, one per pass. Not a controller loss, not counted: the job fails naming the image.
            plan.finish = ("Failed", f"controller pod {newest.name}: image {newest.waiting_image or '(unknown)'} "
                                     f"cannot be pulled ({newest.waiting_reason}): {newest.waiting_message}")
        elif newest is None and expected_attempt is None:
            plan.create_controller = next_attempt(status)  # first start (or resume after suspend)
            # A resume whose released pod was already gone: the status written since the resume no
            # longer says Suspended, but the steps it shows were trained by a pod that is gone.
            if _was_suspended(status) or status.step > 0:
                _resume_warning(job, status, plan)
        elif released:
            if not (newest.deleting and not dead(newest) and not stranded):
                plan.create_controller = next_attempt(status, newest.attempt)  # resume after suspend: not a restart
                _resume_warning(job, status, plan)
        elif not budgets.controller_restart_allowed(restarts, elasticity.max_restarts):
            why = _loss_reason(newest, observed.lost_nodes, status)
            plan.finish = ("Failed", f"controller pod lost {restarts + 1} times (elasticity.maxRestarts={elasticity.max_restarts}); last: {why}")
        elif newest is not None and newest.deleting and not stranded and _holds_workers(newest, observed):
            # A graceful delete: on SIGTERM the controller ends its step and checkpoints it. A replacement
            # created now would restore before that commit (an older step; two controllers at once on one
            # checkpoint directory and one set of workers). Counted, announced and created once it stopped.
            plan.replace_after_stop = newest.name
        else:
            last = newest.attempt if newest is not None else expected_attempt
            in_a_row = status.controller_losses_in_a_row
            # (a wait already announced for this pod counted its loss in the status written then: the field
            # and the message say the same count during the wait, session 16's trial saw 3 beside "4 losses")
            counted = newest is not None and _backoff_announced(status, newest.name)
            plan.losses_in_a_row = in_a_row if counted else backoff.losses_after(in_a_row, _ran_s(newest))
            wait = _backoff(job, newest, observed, plan.losses_in_a_row, next_attempt(status, last, expected_attempt))
            if wait is not None:
                # A crash loop: the dead pod stays (its logs) and the replacement waits; the daemon's next
                # pass is due when the wait ends (`wake_in_s`).
                plan.backoff, plan.wake_in_s = wait, wait.left_s
                if not _backoff_announced(status, wait.pod):
                    plan.events.append(("Warning", REASON_CONTROLLER_BACK_OFF, backoff_message(wait)))
            else:
                plan.create_controller = next_attempt(status, last, expected_attempt)
                plan.controller_restarted = True
                why = _loss_reason(newest, observed.lost_nodes, status)
                plan.events.append(("Warning", COND_CONTROLLER_RESTARTED,
                                    f"controller pod {newest.name if newest else expected} lost ({why}); "
                                    f"creating {names.controller_pod(name, plan.create_controller)}, "
                                    f"{resume_text(job)}"))
                if newest is not None and not newest.deleting and not stranded:
                    plan.delete_pods.append(newest.name)

    pathways = job.spec.backend == "pathways"
    if pathways:
        live = newest if plan.create_controller is None and not in_flight and newest is not None \
            and not dead(newest) and not newest.deleting and not stranded else None
        _restart_detached_workers(job, observed, plan, live)
    # The budgets are the job's: restarts of JobSets deleted earlier (suspend, a new Pathways head) count.
    carried, _ = counters.carry_slices(status, job.spec.slices.total, observed.jobsets)
    for i in range(job.spec.slices.total):  # spares are JobSets like the others
        js = observed.jobsets.get(i)
        if js is None:
            if not pathways or plan.pathways_head:
                plan.create_jobsets.append(i)
            continue
        if js.failed and plan.finish is None:
            plan.finish = ("Failed", f"slice {i} exhausted its restart budget "
                                     f"(elasticity.maxRestartsPerSlice={elasticity.max_restarts_per_slice}): {js.message}")
    # (a JobSet created again after a resume has its own full budget: the job's is spent, so the carried
    # restarts count, over its JobSets)
    over = budgets.slice_budget_failure(carried, elasticity.max_restarts, elasticity.max_restarts_per_slice)
    if plan.finish is None and over is not None:
        plan.finish = ("Failed", over)
    if plan.finish is None:
        plan.finish = _worker_failed_unpulled(observed) or _image_pull_timed_out(job, observed)
    if plan.finish is not None:
        plan.create_controller = None
        plan.create_jobsets = []
        plan.controller_restarted = False
        plan.replace_after_stop = ""
        plan.backoff = plan.wake_in_s = plan.losses_in_a_row = None
    return plan


def _ran_s(pod: PodView | None) -> float | None:
    """Seconds the pod ran: its creation to its container's finish (None: not known)."""
    if pod is None or not pod.created or not pod.finished_at:
        return None
    return _seconds_between(pod.created, pod.finished_at)


def _backoff(job: ElasticTrainingJob, pod: PodView | None, observed: Observed, losses_in_a_row: int,
             replacement: int) -> ControllerBackOff | None:
    """The wait before `pod`'s replacement is created, None when it is created now.

    Only a controller whose process ended (`dead`) waits: a crash loop. A pod that vanished, was deleted
    by someone else or stranded on a lost node is replaced at once. The wait counts from the container's
    `finishedAt` (the kubelet's CrashLoopBackOff does the same), else from the pod's creation. Without
    `observed.now` no wait is decided (time-based decisions are skipped).
    """
    if pod is None or not dead(pod) or pod.deleting or not observed.now:
        return None
    delay = backoff.restart_delay_s(losses_in_a_row)
    since = pod.finished_at or pod.created
    elapsed = _seconds_between(since, observed.now) if since else None
    if delay <= 0 or elapsed is None or elapsed >= delay:
        return None
    until = (dt.datetime.strptime(since, _RFC3339) + dt.timedelta(seconds=delay)).strftime(_RFC3339)
    return ControllerBackOff(pod=pod.name, why=_loss_reason(pod, observed.lost_nodes), losses_in_a_row=losses_in_a_row,
                             delay_s=delay, since=since, until=until, left_s=delay - max(0.0, elapsed),
                             replacement=names.controller_pod(job.metadata.name, replacement))


def _backoff_announced(status: ElasticTrainingJobStatus, pod: str) -> bool:
    """The job's status already says `pod`'s replacement waits (its Event was posted with that condition)."""
    c = get_condition(status.conditions, COND_CONTROLLER_RESTARTED)
    return c is not None and c.reason == REASON_CONTROLLER_BACK_OFF and c.message.startswith(backoff_lead(pod))


def backoff_lead(pod: str) -> str:
    """How the back-off's condition message and Event begin, naming the lost pod."""
    return f"controller pod {pod} lost"


def backoff_message(wait: ControllerBackOff) -> str:
    """The back-off's Event and condition message: which pod, how it ended, how long its replacement waits, why.

    The same on every pass of one wait (no "seconds left"), so the condition is written once."""
    return (f"{backoff_lead(wait.pod)} ({wait.why}), {wait.losses_in_a_row} losses in a row with no step trained "
            f"between them: back-off {wait.delay_s:.0f} s, {wait.replacement} is created at {wait.until}, "
            f"{wait.delay_s:.0f} s after it ended (the wait doubles per loss from {backoff.INITIAL_DELAY_S:.0f} s "
            f"to {backoff.MAX_DELAY_S:.0f} s, as the kubelet's CrashLoopBackOff, until a controller trains a step)")
