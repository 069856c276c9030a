"""Backend pathways: the WaitingForResourceManager condition of a job whose Pathways head is starting (pure).

The operator creates a slice's JobSet only once the head's resource manager
(the `pathways-rm` sidecar of the controller pod) has passed its startupProbe,
and the kubelet starts the proxy and the controller container only then too
(`backends.pathways`). Until then the job would read as a plain Pending: this
condition says what it waits for, in which pod, and for how long at most.
"""

from __future__ import annotations

from elastic_jax.api import status as st
from elastic_jax.k8s_operator.conditions import get_condition, set_condition
from elastic_jax.k8s_operator.slices import RM_CONTAINER, PodView

# (the reasons live with the others in `elastic_jax.api.status`)
REASON_STARTING = st.REASON_RM_STARTING
REASON_RESTARTING = st.REASON_RM_RESTARTING
REASON_LISTENING = st.REASON_RM_LISTENING


def waiting_message(head: PodView, rm_port: int, startup_limit_s: int) -> str:
    """What the job waits for while `head`'s resource manager does not listen.

    Args:
      head: the live controller pod (the Pathways head).
      rm_port: the resource manager's port (its startupProbe's).
      startup_limit_s: seconds the startupProbe allows before the kubelet restarts the sidecar.
    """
    restarted = f", restarted {head.rm_restarts} time(s)" if head.rm_restarts else ""
    after = "until it does, no slice JobSet is created and the controller container does not start"
    if not head.node or (head.phase == "Pending" and not head.pod_ip):
        return (f"controller pod {head.name} (the Pathways head) is not running yet (phase {head.phase or 'Pending'}), "
                f"so its resource manager does not listen on port {rm_port}; {after}")
    return (f"controller pod {head.name}: its Pathways resource manager (container {RM_CONTAINER}) does not listen "
            f"on port {rm_port} yet (startupProbe not passed{restarted}; the kubelet restarts it after "
            f"{startup_limit_s} s); {after}")


def with_resource_manager(conditions: list[st.Condition], head: PodView | None, rm_port: int,
                          startup_limit_s: int, generation: int,
                          now: str) -> tuple[list[st.Condition], list[tuple[str, str, str]]]:
    """`conditions` with WaitingForResourceManager set from the live head pod, and the Events due.

    Args:
      conditions: the new status's conditions.
      head: the live controller pod of a pathways job (None: none yet, or being replaced;
        the condition keeps its last value, as a pod on its way says nothing new).
      rm_port, startup_limit_s: as for `waiting_message`.
      generation, now: as for `set_condition`.

    Returns:
      (conditions, events): True (reason ResourceManagerStarting, or ResourceManagerRestarting
      once that sidecar restarted) while the resource manager has not started, with a Normal
      Event when it turns True or its reason changes; False (reason ResourceManagerListening)
      once it listens, with a Normal Event when it clears.
    """
    if head is None:
        return conditions, []
    previous = get_condition(conditions, st.COND_WAITING_FOR_RESOURCE_MANAGER)
    was_true = previous is not None and previous.status == "True"
    if head.rm_started:
        message = f"controller pod {head.name}: the Pathways resource manager listens on port {rm_port}"
        events = [("Normal", REASON_LISTENING, message)] if was_true else []
        return (set_condition(conditions, st.COND_WAITING_FOR_RESOURCE_MANAGER, "False", REASON_LISTENING,
                              message, generation, now), events)
    reason = REASON_RESTARTING if head.rm_restarts else REASON_STARTING
    message = waiting_message(head, rm_port, startup_limit_s)
    events = [] if was_true and previous.reason == reason else [("Normal", reason, message)]
    return (set_condition(conditions, st.COND_WAITING_FOR_RESOURCE_MANAGER, "True", reason, message, generation,
                          now), events)
