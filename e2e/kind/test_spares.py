"""Hot spare slices under the operator (`spec.slices.spares`), on a real kubelet.

The example with one spare and pause-and-resume (`minSlices` = `count`):
the operator makes three worker JobSets; the controller trains on two and
keeps the third Ready out of the mesh. The worker process of an active slice
is SIGKILLed inside its container: the controller's next attempt trains on
the survivor and the spare at once, instead of pausing until the killed
slice's pod is replaced; the replaced slice comes back as the new spare (no
scale-up), the controller pod keeps its UID and restartCount 0, and the job
Succeeds with 3 JobSets.
"""

from __future__ import annotations

import re
import signal

import pytest
import yaml

from e2e.helpers import is_ready, pods, summary, wait_for
from e2e.operator_fixtures import example_manifest, get_job, wait_phase

pytestmark = pytest.mark.timeout(3600)

JOB = "spare-job"
ATTEMPT = re.compile(r"elastic attempt (\d+) on slices \[([0-9, ]*)\]")


def _attempts(cluster, namespace) -> list[tuple[int, list[int]]]:
    """(attempt, slices) from the controller's log, in order."""
    text = cluster.kubectl("logs", "-n", namespace, f"{JOB}-controller-0", check=False).stdout
    return [(int(n), [int(x) for x in s.split(", ") if x]) for n, s in ATTEMPT.findall(text)]


def _worker(cluster, namespace, index):
    live = [p for p in pods(cluster, namespace, f"elasticjax.dev/job-name={JOB},elasticjax.dev/slice-index={index}")
            if p["status"].get("phase") == "Running" and is_ready(p) and not p["metadata"].get("deletionTimestamp")]
    return live[0] if live else None


def test_spare_replaces_a_killed_slice_without_a_pause(cluster, namespace, operator):
    manifest = example_manifest()
    manifest["metadata"]["name"] = JOB
    manifest["spec"]["slices"] = {"count": 2, "minSlices": 2, "spares": 1}
    manifest["spec"]["training"]["steps"] = 3000
    manifest["spec"]["checkpoint"]["uri"] = f"/tmp/elastic-jax/{JOB}/checkpoints"
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest))
    explain = lambda: summary(pods(cluster, namespace)) + "\n" + operator.log()[-3000:]  # noqa: E731
    step = lambda: (get_job(cluster, namespace, JOB).get("status") or {}).get("step", 0)  # noqa: E731
    wait_for(lambda: step() >= 20 and all(_worker(cluster, namespace, i) for i in range(3)), timeout_s=300,
             what="training started with all three slices up", explain=explain)
    jobsets = cluster.kubectl("get", "jobsets", "-n", namespace, "-o", "name").stdout.split()
    assert sorted(jobsets) == [f"jobset.jobset.x-k8s.io/{JOB}-slice-{i}" for i in range(3)], jobsets
    (ctrl,) = pods(cluster, namespace, f"elasticjax.dev/job-name={JOB},elasticjax.dev/role=controller")
    (_, first), *_ = _attempts(cluster, namespace)
    assert len(first) == 2, first  # two train, one is the spare
    spare = ({0, 1, 2} - set(first)).pop()
    victim_index = first[0]
    victim = _worker(cluster, namespace, victim_index)
    cluster.signal_container(namespace, victim["metadata"]["name"], "worker", signal.SIGKILL)

    expected = sorted((set(first) - {victim_index}) | {spare})
    wait_for(lambda: len(_attempts(cluster, namespace)) >= 2, timeout_s=120, what="the controller's next attempt",
             explain=explain)
    assert _attempts(cluster, namespace)[1] == (2, expected), _attempts(cluster, namespace)
    wait_for(lambda: (w := _worker(cluster, namespace, victim_index)) and w["metadata"]["uid"] !=
             victim["metadata"]["uid"], timeout_s=120, what="the killed slice's pod replaced", explain=explain)

    job = wait_phase(cluster, namespace, JOB, ("Succeeded", "Failed"), timeout_s=900)
    status = job["status"]
    assert status["phase"] == "Succeeded", status
    # the replaced slice came back as the spare: no scale-up attempt after the swap
    assert [n for n, _ in _attempts(cluster, namespace)] == [1, 2], _attempts(cluster, namespace)
    (after,) = pods(cluster, namespace, f"elasticjax.dev/job-name={JOB},elasticjax.dev/role=controller")
    assert after["metadata"]["uid"] == ctrl["metadata"]["uid"]
    assert after["status"]["containerStatuses"][0]["restartCount"] == 0
    assert status["controllerRestarts"] == 0
