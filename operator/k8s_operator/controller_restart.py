"""A controller pod's replacement as the job's status tells it (pure).

From the pass that finds the controller pod lost (it exited, vanished, or is
being deleted by someone else: `reconcile.Plan.controller_restarted`) until
its replacement has completed a training step, no controller trains. Before
this module the status kept the last phase, step and slice count of the lost
controller (`Running`, its step, 2/2 active) until the new one answered, then
read `Pending` while it restored (a flap). Now:

- phase `Recovering` (for a job that was training: a job still `Pending`
  stays `Pending`), `activeSlices` 0 while no answer of the replacement says
  otherwise;
- condition `ControllerRestarted` True with reason `ControllerRestarting`
  (and `Degraded` True with that reason), which is also what keeps the state
  from one pass to the next (and across an operator restart): it lasts until
  the replacement pod's own answer shows a step completed beyond the one it
  resumed from (or the job stops: suspended, finished);
- `step`: the lost controller's last one until the replacement has reported
  where it resumed, then that step (`status_builder`: a controller still
  `Starting` does not reset it).

After that the condition stays True with reason `ControllerPodLost` ("the pod
was recreated N times"), naming the pod that runs now, or saying that none
does (a suspended or finished job: there is no pod to name).
"""

from __future__ import annotations

from elastic_jax.api import status as st
from elastic_jax.api.control import ENDED_PHASES, ControllerStatus
from elastic_jax.k8s_operator.conditions import get_condition
from elastic_jax.k8s_operator.steps_lost import resumed_step

def restarting(previous: st.ElasticTrainingJobStatus, controller_lost: bool, controller: ControllerStatus | None,
               from_current: bool, stopped: bool) -> bool:
    """Whether the job's controller is being replaced after this pass.

    Args:
      previous: the job's `.status` before this pass (its ControllerRestarted condition carries the state).
      controller_lost: this pass found the controller pod lost (`Plan.controller_restarted`, whether or not
        the replacement could be created yet, or `Plan.replace_after_stop`: waiting for it to stop first).
      controller: this pass's controller answer (None: none).
      from_current: `controller` is the current controller pod's (not the lost one's parting word).
      stopped: the job is suspended or finished: nothing is being replaced.
    """
    if stopped:
        return False
    if controller_lost:
        return True
    before = get_condition(previous.conditions, st.COND_CONTROLLER_RESTARTED)
    if before is None or before.status != "True" or before.reason not in (st.REASON_CONTROLLER_RESTARTING,
                                                                          st.REASON_CONTROLLER_BACK_OFF):
        return False
    if controller is None or not from_current:
        return True
    if controller.phase in ENDED_PHASES:
        return False
    resumed = resumed_step(controller)
    return resumed is None or controller.step <= resumed


def restarted_condition(restarts: int, controller_pod: str, restarting_now: bool, resumed_from: int | None,
                        suspended: bool, finished: str | None, stopping: str = "",
                        local_uri: str = "", backoff: str = "") -> tuple[str, str] | None:
    """(reason, message) of the ControllerRestarted condition (True), None while the pod was never recreated.

    Args:
      restarts: `status.controllerRestarts` after this pass.
      controller_pod: `status.controllerPod` after this pass ("" when none: suspended, or not yet created).
      restarting_now: `restarting`.
      resumed_from: the step the current controller pod resumed from (None: not reported yet).
      suspended, finished: spec.suspend; the finished phase, if any.
      stopping: the lost controller pod whose container still stops (`Plan.replace_after_stop`), "" when none.
      local_uri: spec.checkpoint.uri when it is local to the controller pod (an emptyDir: its checkpoints,
        the one a SIGTERM saves too, go with the pod, so a replacement starts again from step 0); "" for
        shared storage (gs://), whose latest committed checkpoint the replacement restores.
      backoff: the lost controller's replacement waits (a crash loop): the wait's message
        (`reconcile.backoff_message`); "" when none.
    """
    if not restarts and not restarting_now:
        return None
    times = f"controller pod recreated {restarts} time(s)" if restarts else "controller pod lost"
    # What the replacement starts from depends on where the checkpoints live: a promise of the latest (or the
    # SIGTERM's) checkpoint is false for a local uri, whose emptyDir goes with the pod (the trial's Event
    # said step 0 while this condition said "the latest committed checkpoint").
    local = f"spec.checkpoint.uri {local_uri} is local to the controller pod" if local_uri else ""
    if restarting_now and backoff:
        return st.REASON_CONTROLLER_BACK_OFF, f"{backoff}; {times}"
    if restarting_now and stopping:
        saves = (f"on SIGTERM it checkpoints the step it reached, but {local}: that checkpoint goes with the pod "
                 "and the replacement starts again from step 0" if local
                 else "on SIGTERM it checkpoints the step it reached, which the replacement resumes")
        return st.REASON_CONTROLLER_RESTARTING, (
            f"{times}; controller pod {stopping} is being deleted: its replacement is created once its container "
            f"has stopped ({saves})")
    if restarting_now:
        who = f"its replacement {controller_pod}" if controller_pod else "its replacement"
        start = (f"has started again from step 0 ({local}: the lost pod's checkpoints went with it)" if local
                 else "has resumed from the latest committed checkpoint")
        return st.REASON_CONTROLLER_RESTARTING, f"{times}; no controller trains until {who} {start} and completed a step"
    if finished:
        now = f"the job {finished}; its last controller pod was {controller_pod or 'deleted'}"
    elif controller_pod and not suspended:
        now = f"now {controller_pod}" + (f", resumed from step {resumed_from}" if resumed_from is not None else "")
    else:
        now = "no controller pod runs now (spec.suspend)" if suspended else "no controller pod runs now"
    return st.REASON_CONTROLLER_POD_LOST, f"{times}; {now}"
