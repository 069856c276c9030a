"""The operator's kopf registrations, and nothing else: what kopf watches and what it calls.

- indexes of the jobs' pods and JobSets (label selectors, no full lists), and of
  the nodes that are not Ready (node loss, issue 9 item 5);
- a pod event handler that notifies the controller the moment a worker pod
  changes (the latency path: `job_pass.worker_pod_changed`);
- one daemon per job (`reconcile_job`) that runs the job's pass (`job_pass`:
  observe, decide, status, apply) and writes its status; it sleeps until
  something its pass reads may have changed (`wake`: the job, its pods and
  JobSets, the not-Ready nodes, its controller link's news, a resync: 30 s,
  backing off to 4 min), and a woken pass that would find nothing new is
  skipped on the event loop (`job_pass.pass_inputs`);
- create validates the spec: a bad one ends `Failed` with a condition naming
  the field (`kopf.PermanentError`, never a retry loop).

What every handler shares is the `operator_state.OperatorState` in kopf's memo.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging

import kopf

from elastic_jax import contract
from elastic_jax.api import job as job_api
from elastic_jax.api import labels as lbl
from elastic_jax.api.manifest import ManifestError
from elastic_jax.k8s_operator import incarnation, job_pass, metrics, operator_state, wake
from elastic_jax.k8s_operator.backends import UnsupportedBackend
from elastic_jax.k8s_operator.nodes import node_view
from elastic_jax.k8s_operator.slices import jobset_view, pod_view

_logger = logging.getLogger(__name__)
JOBS = (job_api.GROUP, job_api.VERSION, job_api.PLURAL)
_HAS_JOB = {lbl.JOB_NAME: kopf.PRESENT}


@kopf.index("v1", "pods", labels=_HAS_JOB)
def job_pods(namespace, labels: dict, body, **_):
    """(namespace, job, job UID) → PodView of each of the job's pods (controller and workers); read with
    `incarnation.own`."""
    return {incarnation.index_key(namespace, labels): pod_view(body)}


@kopf.index(contract.JOBSET_GROUP, contract.JOBSET_VERSION, contract.JOBSET_PLURAL, labels=_HAS_JOB)
def job_jobsets(namespace, labels: dict, body, **_):
    """(namespace, job, job UID) → JobSetView of each of the job's worker JobSets; read with `incarnation.own`."""
    try:
        index = int(labels.get(lbl.SLICE_INDEX, "-1"))
    except ValueError:
        return None
    return {incarnation.index_key(namespace, labels): jobset_view(body, index)}


def unready_nodes(name, body, **_):
    """node name → NodeView of each node whose Ready condition is not True (cluster-scoped, read only).

    Ready nodes return an empty mapping, which drops the node from the index
    (None would keep its last entry), so the index stays as small as the
    cluster's trouble. Registered by `register_node_index`.
    """
    view = node_view(body)
    return {} if view.ready == "True" else {name: view}


def register_node_index() -> None:
    """Registers the Node index, so handlers get `unready_nodes`, and `node_event` (it wakes the jobs).

    Only when node-loss handling is on (`--node-lost-seconds` > 0): watching
    Nodes needs cluster-wide read access, which an operator that never acts on
    nodes should not need (and an install without that rule keeps working).
    """
    kopf.index("v1", "nodes", id="unready_nodes")(unready_nodes)
    kopf.on.event("v1", "nodes", id="node_event")(node_event)


@kopf.on.event("v1", "pods", labels={lbl.JOB_NAME: kopf.PRESENT, lbl.ROLE: lbl.ROLE_WORKER})
async def worker_pod_event(namespace, labels: dict, job_pods, memo, unready_nodes=None, job_jobsets=None, **_):
    """Recomputes the pod's slice and tells the controller at once (the timer catches up otherwise).

    Async, so it starts the moment kopf dispatches the event instead of waiting for one of kopf's
    handler threads (the timers' passes hold those): the notify metric starts here (`seen_at`).
    Its work is in memory (the indexes, the tracker); it runs on the loop's own small executor,
    never on the event loop itself (the tracker's lock may be held by a timer pass a moment), and
    the report runs on the job's `ControllerLink` thread.
    """
    seen_at = operator_state.state_of(memo).clock.monotonic()
    await asyncio.to_thread(job_pass.worker_pod_changed, namespace, labels, job_pods, memo, unready_nodes, job_jobsets,
                            seen_at)


@kopf.on.event(*JOBS)
async def job_event(namespace, name, uid, memo, **_):
    """The job object changed (spec, status, annotations, deletion): its pass runs (`reconcile_job`)."""
    operator_state.state_of(memo).jobs.wake((namespace, name), uid)


@kopf.on.event("v1", "pods", labels=_HAS_JOB)
async def job_pod_event(namespace, labels: dict, memo, **_):
    """One of a job's pods (controller or worker) changed: the job's pass runs."""
    job_pass.wake_owner(operator_state.state_of(memo), namespace, labels)


@kopf.on.event(contract.JOBSET_GROUP, contract.JOBSET_VERSION, contract.JOBSET_PLURAL, labels=_HAS_JOB)
async def job_jobset_event(namespace, labels: dict, memo, **_):
    """One of a job's worker JobSets changed: the job's pass runs."""
    job_pass.wake_owner(operator_state.state_of(memo), namespace, labels)


async def node_event(memo, unready_nodes=None, **_):
    """A node changed: when the set of nodes that are not Ready changed, every job's pass runs (a pass reads
    them: `_lost_nodes`). Registered with the Node index (`register_node_index`)."""
    state = operator_state.state_of(memo)
    unready = frozenset(unready_nodes or {})
    if unready != state.unready_seen:
        state.unready_seen = unready
        for job in state.jobs:
            job.wake()


@kopf.on.create(*JOBS)
def job_created(body, spec, status, meta, patch, memo, **_):
    """Validates the spec (and the admin's policies, `OperatorState.policies`); a bad one ends the job Failed with
    the field named (no retries)."""
    state = operator_state.state_of(memo)
    try:
        job_pass.parse_job(body, state.policies)
    except (ManifestError, UnsupportedBackend) as e:
        message = str(e)
        job_pass.fail_spec(patch, status, meta.get("generation", 0), message, body, clock=state.clock)
        raise kopf.PermanentError(message)
    job_pass.patch_status(patch, phase=status.get("phase") or "Pending")


@kopf.on.delete(*JOBS, optional=True)
def job_deleted(namespace, name, uid, memo, **_):
    """Forgets the job; its children go with it through owner references."""
    state = operator_state.state_of(memo)
    if uid in state.claimed_elsewhere:
        state.claimed_elsewhere.discard(uid)
        metrics.JOBS_CLAIMED_ELSEWHERE.set(len(state.claimed_elsewhere))
    state.jobs.forget((namespace, name), uid)  # (never a newer job's of the same name)


@kopf.daemon(*JOBS, id="reconcile_job")
async def reconcile_job(body, namespace, name, memo, stopped, resource, logger, **kwargs):
    """The job's reconcile daemon: a pass (`reconcile_once`) whenever something it reads may have changed.

    It sleeps until its `JobState.waker` is woken (the job object, its pods or JobSets, the not-Ready
    nodes, its controller link's news: `wake`), or PASS_INTERVAL_S after a pass that was not quiet, or
    the end of a quiet pass's window (`tracker.resync_window_s`); a woken pass still skips itself when its inputs did
    not move. Each pass fills a patch of its own, which the daemon writes itself (`job_pass.write_status`), also after a
    pass that raised; kopf's `patch` kwarg stays empty, so kopf writes nothing when the daemon returns. After a
    pass that raised it waits kopf's `execution.default_backoff`, as kopf's timer did. It ends when kopf stops
    it (the job deleted, the operator stopping), after the pass in progress.
    """
    state = operator_state.state_of(memo)
    if state.kopf_settings is None:
        raise RuntimeError("OperatorState.kopf_settings is unset: the operator's startup sets it (main)")
    kwargs.pop("patch", None)  # (kopf's: see above)
    key, uid = (namespace, name), body["metadata"].get("uid")
    last_end: float | None = None
    while not stopped:
        js = state.jobs.get(key)
        js = js if js is not None and js.uid == uid else None
        delay = wake.next_pass_delay(state.clock.monotonic(), last_end,
                                     js.tracker.quiet_until() if js is not None else None)
        if js is None:  # no pass made its state yet (or a newer job holds the name): nothing to wake it
            if delay > 0:
                await stopped.wait(delay)
        elif await js.waker.wait(delay, stopped.wait()):
            gap = wake.woken_pass_delay(state.clock.monotonic(), last_end)
            if gap > 0:
                await stopped.wait(gap)
        if stopped:
            break
        error: Exception | None = None
        patch = kopf.Patch()
        try:
            await reconcile_once(body=body, namespace=namespace, name=name, memo=memo, patch=patch, logger=logger,
                                 **kwargs)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - as kopf's timer did: logged (and posted), tried again later
            error = e
        if patch:  # (also after a pass that raised, as kopf's timer did: what it put in the patch is written)
            try:
                await asyncio.get_running_loop().run_in_executor(
                    state.pass_executor, job_pass.write_status, state, namespace, name, dict(patch))
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - no answer or a 5xx must not end the daemon: the next pass writes
                error = error or e
        if error is not None:
            backoff = state.kopf_settings.execution.default_backoff
            logger.error(f"reconcile pass failed with an exception and will try again in {backoff} seconds: "
                         f"{str(error) or repr(error)}", exc_info=error)
            await stopped.wait(backoff)
        last_end = state.clock.monotonic()


async def reconcile_once(body, namespace, name, memo, job_pods, job_jobsets, unready_nodes=None, **kwargs):
    """One wake of the job: a pass (`reconcile_pass`) on the operator's pass threads, unless it would do nothing.

    A pass is skipped, on the event loop, when nothing it reads moved since a pass that found the job
    whole and changed nothing (`job_pass.pass_inputs`, `JobTracker.quiet`; at most `tracker.resync_window_s` apart), so a
    healthy job woken with no news costs no thread, no render and no status build.
    """
    state = operator_state.state_of(memo)
    js = state.jobs.get((namespace, name))
    inputs = None
    if js is not None and js.uid == body["metadata"].get("uid"):
        inputs = job_pass.pass_inputs(body, js, job_pods, job_jobsets, unready_nodes)
        if js.tracker.quiet(inputs, state.clock.monotonic()):
            metrics.RECONCILES.labels("quiet").inc()
            return
    run = functools.partial(contextvars.copy_context().run, job_pass.reconcile_pass, body=body, namespace=namespace,
                            name=name, memo=memo, job_pods=job_pods, job_jobsets=job_jobsets,
                            unready_nodes=unready_nodes, inputs=inputs, **kwargs)
    future = asyncio.get_running_loop().run_in_executor(state.pass_executor, run)
    # As kopf runs a sync handler: a cancelled daemon (the job deleted, the operator stopping) still waits
    # for its pass in progress, which may be deleting the job (TTL), so no pass outlives its daemon.
    cancelled: asyncio.CancelledError | None = None
    while not future.done():
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError as e:
            cancelled = e
    if cancelled is not None:
        raise cancelled
    future.result()
