"""A measurement, not a test (pytest does not collect it: run `pytest e2e/measure_resume_lag.py -s`): the timeline
of a resume after suspend on the local control plane, for docs/limitations.md "STEP and active slices lag a resume".

It trains the CPU example, suspends and resumes it, and writes one JSON file (its path printed as `TIMELINE ...`)
with wall-clock seconds (time.time()) of: every version of the job on a watch (phase, step, activeSlices,
controllerPod), the new controller's `GET /v1/status` read every 0.25 s with the operator's token (phase, step,
active slices, seconds the answer took; an exception's repr when it failed), the controller's log and the
operator's log (`--verbose`: kopf's status patches). It asserts nothing; `e2e/test_status_truth.py`'s resume
step keeps the ordering it showed.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from e2e.helpers import pods, wait_for
from e2e.operator_fixtures import (  # noqa: F401  (fixtures)
    ejob_crd, get_job, operator_kubeconfig, run_operator, start_training_job, wait_phase,
)

GROUP, VERSION, PLURAL = "elasticjax.dev", "v1alpha1", "elastictrainingjobs"


def train_then_suspend(cluster, namespace: str, operator):
    """The CPU example trained 5 steps, then `spec.suspend: true` until Suspended with its pods gone.

    Returns:
      (name, status, explain, job): `start_training_job`'s two callables and the suspended job object.
    """
    manifest, status, explain, _ = start_training_job(cluster, namespace, operator, "e2e-resume-lag")
    name = manifest["metadata"]["name"]
    cluster.kubectl("patch", "ejob", name, "-n", namespace, "--type=merge", "-p", '{"spec":{"suspend":true}}')
    wait_phase(cluster, namespace, name, ("Suspended",), timeout_s=180, explain=explain)
    wait_for(lambda: not pods(cluster, namespace, f"elasticjax.dev/job-name={name}"), timeout_s=180,
             what="the job's pods gone", explain=explain)
    return name, status, explain, get_job(cluster, namespace, name)


@pytest.fixture
def verbose_operator(operator_kubeconfig, tmp_path):
    """The operator with `--verbose` (kopf logs each status patch it sends)."""
    yield from run_operator(operator_kubeconfig, tmp_path / "operator.log", ("--verbose",))


class TimedWatch:
    def __init__(self, kube, namespace, name, rv):
        from kubernetes import client
        self.api = client.CustomObjectsApi(kube)
        self.namespace, self.name, self.rv = namespace, name, rv
        self.seen: list[tuple[float, dict]] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        from kubernetes import watch
        while not self._stop.is_set():
            w = watch.Watch()
            try:
                for ev in w.stream(self.api.list_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL,
                                   field_selector=f"metadata.name={self.name}", resource_version=self.rv,
                                   timeout_seconds=5):
                    if ev["type"] in ("ADDED", "MODIFIED"):
                        self.seen.append((time.time(), ev["object"]))
                        self.rv = ev["object"]["metadata"]["resourceVersion"]
                    if self._stop.is_set():
                        break
            finally:
                w.stop()

    def stop(self):
        self._stop.set()
        self._t.join(30)
        return self.seen


def test_measure_resume(cluster, kube, namespace, verbose_operator):
    operator = verbose_operator
    name, status, explain, job = train_then_suspend(cluster, namespace, operator)
    watch = TimedWatch(kube, namespace, name, job["metadata"]["resourceVersion"])
    from elastic_jax.api.client import ControlClient
    from elastic_jax.k8s_operator import tokens
    token = tokens.derive_token(tokens.load_key(str(operator.log_path.with_name("operator-key"))),
                                job["metadata"]["uid"])
    polls: list = []
    stop_poll = threading.Event()

    def poll():
        client = None
        while not stop_poll.is_set():
            try:
                if client is None:
                    addr = (get_job(cluster, namespace, name).get("status") or {}).get("controllerPod")
                    pod = [p for p in pods(cluster, namespace, "elasticjax.dev/role=controller")
                           if p["metadata"]["name"] == addr and p["status"].get("podIP")]
                    if not pod:
                        time.sleep(0.2)
                        continue
                    client = ControlClient(f"http://{pod[0]['status']['podIP']}:8080", token, timeout_s=10)
                t = time.time()
                c = client.status()
                polls.append((t, time.time() - t, c.phase, c.step, list(c.active_slices)))
            except Exception as e:  # noqa: BLE001 - a refused connection while the pod starts is a data point
                polls.append((time.time(), None, repr(e)[:80], None, None))
            time.sleep(0.25)
    poller = threading.Thread(target=poll, daemon=True)
    t_resume = time.time()
    poller.start()
    cluster.kubectl("patch", "ejob", name, "-n", namespace, "--type=merge", "-p", '{"spec":{"suspend":false}}')
    try:
        s = wait_for(lambda: (lambda s: s if s.get("phase") == "Running" and s.get("step", 0) >= 10
                              and s.get("activeSlices") == 2 else None)(status()),
                     timeout_s=300, what="training again", interval_s=0.5, explain=explain)
        time.sleep(5)
    finally:
        seen = watch.stop()
        stop_poll.set()
        poller.join(30)
    s = status()
    ctrl = s["controllerPod"]
    uid = s["counterBase"]["controllerUid"]
    out = {"t_resume": t_resume,
           "watch": [(t, (o.get("status") or {}).get("phase"), (o.get("status") or {}).get("step"),
                      (o.get("status") or {}).get("activeSlices"), (o.get("status") or {}).get("controllerPod"),
                      o["metadata"]["resourceVersion"]) for t, o in seen],
           "controller_log": cluster.container_log(namespace, ctrl, "controller", uid),
           "operator_log": operator.log(), "polls": polls}
    path = f"/tmp/hA3/timeline-{int(t_resume)}.json"
    with open(path, "w") as f:
        json.dump(out, f)
    print("TIMELINE", path)
