"""A worker node dies without the out-of-service taint (issue 9 item 5), on a real kind cluster.

``docker pause`` freezes a kind node's container: its kubelet, containerd and
every container on it stop at once, as a node that loses power or hangs would.
Nothing taints it out-of-service; the node controller marks it ``Ready=Unknown``
after its grace period (15 s here, :data:`e2e.kind.cluster.NODE_MONITOR_GRACE_PERIOD`)
and the pods there stay ``Running`` in the API. The operator must force-delete the
job's pod there ``--node-lost-seconds`` (the chart's 30 s) later, so the slice's
JobSet replaces it on the other worker, while training goes on with the surviving
slice and the controller pod is never touched. The user sees a NodeLost Event
and condition naming the node, and the slice's SliceDown and SliceReady Events.

Placement is made deterministic, since the scheduler decides where pods go:
the victim node is the worker that does not host the operator; the JobSet
controller is moved off it (both must outlive the node); the job starts with
the victim cordoned (controller and both slices on the other worker), then slice
1's worker process is SIGKILLed with the other worker cordoned, so its
replacement lands on the victim. Only then is the victim paused.
"""

from __future__ import annotations

import json
import time

import pytest
import yaml

from e2e.kind import cluster as kind
from e2e.kind import demo, target

# The first test of a session also pays for what its fixtures build (images, node image, cluster, chart).
pytestmark = pytest.mark.timeout(3600)

JOB = "node-loss"
# Never reached here: the job must outlive the test whatever the machine's speed (a fixed 3000 steps
# ended before the replacement was seen when the cores were idle, 26 steps/s); the namespace goes at the end.
STEPS = 1_000_000
NODE_LOST_S = 30  # the chart's operator.nodeLostSeconds default
GRACE_S = int(kind.NODE_MONITOR_GRACE_PERIOD.rstrip("s"))
MARGIN_S = 45  # the JobSet's restart, the scheduler, the container's start and the readiness probe, on 2 loaded cores


def _node_of(cluster, namespace: str, selector: str) -> list[str]:
    return [p["spec"].get("nodeName", "") for p in demo.pods(cluster, namespace, selector)
            if not p["metadata"].get("deletionTimestamp")]


def _node_ready(cluster, node: str) -> str:
    conds = demo.get(cluster, "node", node)["status"]["conditions"]
    return next(c["status"] for c in conds if c["type"] == "Ready")


def _move_off(cluster, namespace: str, selector: str, node: str, why) -> None:
    """Deletes the pods matching ``selector`` that run on ``node`` (cordoned) and waits for their replacements elsewhere."""
    if node not in _node_of(cluster, namespace, selector):
        return
    cluster.kubectl("delete", "pod", "-n", namespace, "-l", selector, "--wait=true", "--timeout=120s")
    demo.wait_for(lambda: (nodes := _node_of(cluster, namespace, selector)) and node not in nodes and all(
        demo.is_ready(p) for p in demo.pods(cluster, namespace, selector)), 180, f"{selector} off {node}", why)


def _docker_retrying(cluster, verb: str, node: str) -> None:
    target.docker_retrying(cluster.engine, verb, node)


def _events(cluster, namespace: str, reason: str) -> list[dict]:
    items = json.loads(cluster.kubectl("get", "events", "-n", namespace, "--field-selector",
                                       f"involvedObject.name={JOB},reason={reason}", "-o", "json").stdout)["items"]
    return items


def test_dead_node_without_taint_slice_replaced_elsewhere_controller_kept(elastic_jax, operator, request):
    cluster = elastic_jax
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    log = reporter.write_line if reporter else print  # the measured times, shown without -s
    ns = demo.restricted_namespace(cluster, "node")
    why = demo.explain(cluster, ns)
    workers = cluster.workers()
    assert len(workers) == 2, workers
    # the operator must outlive the node: the victim is the other worker
    (keep,) = _node_of(cluster, demo.SYSTEM_NS, "app.kubernetes.io/name=elastic-jax")
    (victim,) = [w for w in workers if w != keep]
    paused = False
    try:
        # -- placement: everything on `keep` but slice 1 -------------------------------------
        cluster.kubectl("cordon", victim)
        _move_off(cluster, "jobset-system", "control-plane=controller-manager", victim, why)
        manifest = yaml.safe_load(demo.EXAMPLE.read_text())
        manifest["metadata"]["name"] = JOB
        manifest["spec"]["training"]["steps"] = STEPS
        manifest["spec"]["checkpoint"]["uri"] = f"/tmp/elastic-jax/{JOB}/checkpoints"
        # Longer than node-monitor grace + the bound: the controller must not give up on the frozen
        # worker by its own step deadline first (that path deletes the pod too, and would hide this one).
        manifest["spec"]["elasticity"]["stepDeadlineSeconds"] = 180
        manifest["spec"]["elasticity"]["firstStepDeadlineSeconds"] = 180
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(manifest))
        job = lambda: demo.get(cluster, "-n", ns, "ejob", JOB)  # noqa: E731
        step = lambda: (job().get("status") or {}).get("step", 0)  # noqa: E731
        demo.wait_for(lambda: step() >= 5, 600, "training reached step 5", why)
        (controller,) = demo.pods(cluster, ns, f"elasticjax.dev/job-name={JOB},elasticjax.dev/role=controller")
        assert controller["spec"]["nodeName"] == keep, controller["spec"]["nodeName"]

        cluster.kubectl("uncordon", victim)
        cluster.kubectl("cordon", keep)
        first = demo.wait_for(lambda: demo.live_worker(cluster, ns, JOB, 1), 120, "a ready worker of slice 1", why)
        demo.kill_container_process(cluster, first, "worker")
        moved = demo.wait_for(lambda: (w := demo.live_worker(cluster, ns, JOB, 1)) and w["metadata"]["uid"] !=
                              first["metadata"]["uid"] and w, 300, "slice 1 replaced on the victim node", why)
        cluster.kubectl("uncordon", keep)
        assert moved["spec"]["nodeName"] == victim, moved["spec"]["nodeName"]
        assert demo.live_worker(cluster, ns, JOB, 0)["spec"]["nodeName"] == keep
        demo.wait_for(lambda: (job().get("status") or {}).get("activeSlices") == 2, 120, "both slices active", why)
        ctrl_uid = controller["metadata"]["uid"]
        ctrl_restarts = controller["status"]["containerStatuses"][0]["restartCount"]
        step_at_pause = step()
        # The move above posted a SliceDown and a SliceReady of its own: only later ones are the node loss's.
        before = {e["metadata"]["uid"] for r in ("SliceDown", "SliceReady") for e in _events(cluster, ns, r)}

        # -- the node dies: no taint, no drain -----------------------------------------------
        paused = True  # (set first: a pause that fails half-way is undone in finally)
        _docker_retrying(cluster, "pause", victim)
        t0 = time.monotonic()
        log(f"node-loss: paused {victim} (slice 1's worker {moved['metadata']['name']}) at step {step_at_pause}")
        demo.wait_for(lambda: _node_ready(cluster, victim) != "True", GRACE_S + 60, f"{victim} not Ready", why)
        t_unready = time.monotonic()
        log(f"node-loss: {victim} not Ready after {t_unready - t0:.1f}s")
        # The stale pod stays until the bound: nothing acts on a node that may come back.
        time.sleep(max(0.0, NODE_LOST_S - 10))
        assert any(p["metadata"]["uid"] == moved["metadata"]["uid"]
                   for p in demo.pods(cluster, ns, f"elasticjax.dev/job-name={JOB},elasticjax.dev/slice-index=1")), \
            "the pod was deleted before --node-lost-seconds passed"

        def replaced():
            w = demo.live_worker(cluster, ns, JOB, 1)
            return w if w and w["metadata"]["uid"] != moved["metadata"]["uid"] else None
        # bound: --node-lost-seconds after the node controller's mark, plus the replacement's start
        new = demo.wait_for(replaced, t_unready + NODE_LOST_S + MARGIN_S - time.monotonic(),
                            f"slice 1 replaced on a healthy node within {NODE_LOST_S}+{MARGIN_S}s of {victim} "
                            "going not Ready", why, interval_s=0.5)
        t_replaced = time.monotonic()
        log(f"node-loss: slice 1 Ready again on {new['spec']['nodeName']} {t_replaced - t0:.1f}s after the pause, "
            f"{t_replaced - t_unready:.1f}s after {victim} went not Ready")
        assert new["spec"]["nodeName"] == keep
        # The stale pod is gone from the API while its node is still frozen: force-deleted, not left Terminating.
        assert not any(p["metadata"]["uid"] == moved["metadata"]["uid"] for p in demo.pods(
            cluster, ns, f"elasticjax.dev/job-name={JOB},elasticjax.dev/slice-index=1"))
        # Training went on with slice 0 while slice 1 was gone.
        assert step() > step_at_pause

        # -- what the user sees ---------------------------------------------------------------
        (lost_event, *_) = demo.wait_for(lambda: _events(cluster, ns, "NodeLost"), 30, "a NodeLost Event", why)
        assert lost_event["type"] == "Warning" and victim in lost_event["message"], lost_event
        assert moved["metadata"]["name"] in lost_event["message"], lost_event
        status = job()["status"]
        (cond,) = [c for c in status["conditions"] if c["type"] == "NodeLost"]
        assert victim in cond["message"], cond
        assert status["controllerRestarts"] == 0, status
        # The slice's loss and return as Events, posted after the pause: SliceDown for slice 1, then
        # SliceReady naming the replacement's address.
        def slice_events(reason: str) -> list[dict]:
            return [e for e in _events(cluster, ns, reason)
                    if e["metadata"]["uid"] not in before and e["message"].startswith("slice 1 ")]
        (down, *_) = demo.wait_for(lambda: slice_events("SliceDown"), 30, "a SliceDown Event for slice 1", why)
        assert down["type"] == "Warning", down
        address = f"{new['status']['podIP']}:8471"
        demo.wait_for(lambda: [e for e in slice_events("SliceReady") if address in e["message"]], 60,
                      f"a SliceReady Event naming {address}", why)

        # -- the node comes back; training goes on on both slices, with the same controller ---
        _docker_retrying(cluster, "unpause", victim)
        paused = False
        demo.wait_for(lambda: _node_ready(cluster, victim) == "True", GRACE_S + 120, f"{victim} Ready again", why)
        demo.wait_for(lambda: (job().get("status") or {}).get("activeSlices") == 2, 300, "both slices active", why)
        back_at = step()
        demo.wait_for(lambda: step() >= back_at + 20, 600, "training going on after the node came back", why)
        status = job()["status"]
        assert status["phase"] == "Running", f"{status.get('failureReason')}\n{why()}"
        (cond,) = [c for c in status["conditions"] if c["type"] == "NodeLost"]
        assert victim in cond["message"], cond  # (False once whole again, still naming the node)
        (after,) = demo.pods(cluster, ns, f"elasticjax.dev/job-name={JOB},elasticjax.dev/role=controller")
        assert after["metadata"]["uid"] == ctrl_uid, "the controller pod was replaced"
        assert after["status"]["containerStatuses"][0]["restartCount"] == ctrl_restarts
        assert status["controllerRestarts"] == 0
        log(f"node-loss: OK: Running at step {status.get('step')}, recoveries {status.get('recoveries')}, "
            f"slice replacements {status.get('sliceReplacements')}, NodeLost condition {cond['status']} "
            f"({cond['reason']}): {cond['message'][:200]}")
    finally:
        if paused:
            try:
                _docker_retrying(cluster, "unpause", victim)
            except RuntimeError as e:
                log(f"node-loss: {e}")
        for node in workers:
            cluster.kubectl("uncordon", node, check=False)
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
