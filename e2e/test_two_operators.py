"""Two operator processes of one release at once (issue 31 item 14, kopf#247): exactly one is active.

The chart runs one replica, but a `kubectl scale --replicas=2` or an upgrade whose new pod starts beside the
old one puts two operators on one peering object. With the chart's old fixed priority both paused and a job
stayed `Pending` with no Event. With `--priority auto` (the default) each process's priority is its own start
time, so the newest is active and the older one pauses until it is gone.

Here, on the real API server (least-privilege identity, kopf's peering CRDs from the chart), two real
`elastic-jax-operator` processes share one `ClusterKopfPeering`: the older pauses when the newer starts, a job
applied then is served by the newer alone, and when the newer stops (SIGTERM, as a rollout does) the older
resumes and serves the next job. Suspended jobs suffice: their whole pass (claim, status, Events) runs and no
pod starts. A fixed `--priority` that a live peer already holds (kopf would pause both: no job served, no
Event) is refused at start, naming the peer, while the one running keeps serving; two started in the same
moment with one fixed priority (both pass that check) end with one active: the one whose identity sorts last
steps aside (exit 2, saying why) and the other resumes and serves.
"""

from __future__ import annotations

import datetime
import json
import uuid

import yaml

from e2e.harness.paths import REPO_ROOT
from e2e.helpers import wait_for
from e2e.operator_fixtures import (  # noqa: F401  (fixtures)
    OperatorProcess, ejob_crd, example_manifest, operator_kubeconfig, wait_phase,
)
from elastic_jax.local.processes import free_port

PEERING_CRDS = REPO_ROOT / "helm" / "elastic-jax" / "crds" / "kopf-peerings.yaml"
PAUSED = "Pausing operations in favour of"  # kopf's log line (kopf/_core/engines/peering.py)
RESUMED = "Resuming operations after the pause"


def _messages(op: OperatorProcess, since: int = 0) -> list[str]:
    return [str(r.get("msg", "")) for r in op.log_records()[since:]]


def _names_job(op: OperatorProcess, name: str) -> bool:
    """Whether any of the operator's log records is about the job `name` (kopf's object fields or ours)."""
    return any(name in json.dumps(r) for r in op.log_records())


def _error_line(op: OperatorProcess) -> str:
    """The operator's one `error:` line (a refusal at start is its last line; kopf logs its stop after a step-aside)."""
    (line,) = [line for line in op.log().splitlines() if line.startswith("error: ")]
    return line


def _served(cluster, namespace: str, name: str, *ops: OperatorProcess) -> None:
    """Applies a suspended job `name` and waits until an operator made it `Suspended` (its whole pass ran)."""
    manifest = example_manifest()
    manifest["metadata"]["name"] = name
    manifest["spec"]["suspend"] = True
    result = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest), check=False)
    assert result.returncode == 0, result.stderr
    wait_phase(cluster, namespace, name, ("Suspended",), timeout_s=120,
               explain=lambda: "\n".join(op.log()[-2000:] for op in ops))


def _pair(kubeconfig, tmp_path, names: tuple[str, str], args: tuple[str, ...]) -> list[OperatorProcess]:
    """Two operator processes (not started) with the same arguments, each logging to `<name>.log`."""
    return [OperatorProcess(kubeconfig, tmp_path / f"{n}.log", free_port(), args) for n in names]


def _peering(cluster) -> str:
    """kopf's peering CRDs (the chart's) and a new `ClusterKopfPeering`; returns its name."""
    cluster.kubectl("apply", "-f", str(PEERING_CRDS))
    for crd in ("clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"):
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=60s")
    peering = f"elastic-jax-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(
        {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": peering}}))
    return peering


def _stop_all(cluster, peering: str, *ops: OperatorProcess) -> None:
    for op in ops:
        op.stop()
        for proc in op.procs:  # each process this test started, by PID
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    cluster.kubectl("delete", "clusterkopfpeering", peering, "--wait=false", check=False)


def test_of_two_operators_on_one_peering_the_newest_serves_and_the_older_takes_over_when_it_stops(
        cluster, namespace, ejob_crd, operator_kubeconfig, tmp_path):
    peering = _peering(cluster)
    args = ("--peering", peering)  # --priority: the default, auto
    older, newer = _pair(operator_kubeconfig, tmp_path, ("older", "newer"), args)
    try:
        older.start()
        older.wait_up()
        _served(cluster, namespace, "first", older)

        newer.start()
        newer.wait_up()
        wait_for(lambda: any(PAUSED in m for m in _messages(older)), timeout_s=120,
                 what="the older operator pausing for the newer", explain=lambda: older.log()[-3000:])
        assert not any(PAUSED in m for m in _messages(newer)), newer.log()[-3000:]
        _served(cluster, namespace, "second", newer, older)
        assert _names_job(newer, "second"), newer.log()[-3000:]
        assert not _names_job(older, "second"), f"the paused operator acted on the job:\n{older.log()[-3000:]}"

        # A rollout's SIGTERM: kopf removes the newer's peering entry on its way out, the older resumes.
        seen = len(older.log_records())
        newer.stop()
        wait_for(lambda: any(RESUMED in m for m in _messages(older, seen)), timeout_s=120,
                 what="the older operator resuming", explain=lambda: older.log()[-3000:])
        _served(cluster, namespace, "third", older)
        assert _names_job(older, "third"), older.log()[-3000:]
    finally:
        _stop_all(cluster, peering, newer, older)


def test_a_fixed_priority_a_live_peer_already_holds_is_refused_at_start_and_the_peer_keeps_serving(
        cluster, namespace, ejob_crd, operator_kubeconfig, tmp_path):
    peering = _peering(cluster)
    args = ("--peering", peering, "--priority", "5")
    first, second = _pair(operator_kubeconfig, tmp_path, ("first", "second"), args)
    try:
        first.start()
        first.wait_up()
        _served(cluster, namespace, "served", first)
        wait_for(lambda: (cluster.api().get(f"/apis/kopf.dev/v1/clusterkopfpeerings/{peering}").get("status") or None),
                 timeout_s=60, what="the first operator's peering entry")
        second.start()
        assert second.proc.wait(120) == 2, second.log()[-3000:]
        last = second.log().strip().splitlines()[-1]
        assert last.startswith("error: --priority 5: ") and "already run(s) on ClusterKopfPeering" in last, last
        assert "--priority auto" in last, last
        assert not any("Pausing" in m for m in _messages(first)), first.log()[-3000:]
        _served(cluster, namespace, "still-served", first)
    finally:
        _stop_all(cluster, peering, second, first)


def test_two_started_in_the_same_moment_with_one_fixed_priority_end_with_one_serving(
        cluster, namespace, ejob_crd, operator_kubeconfig, tmp_path):
    # Both read the empty peering object before either's kopf writes its entry, so both pass the check at
    # start; before the peering watch, kopf then paused both and a job waited Pending with no Event.
    peering = _peering(cluster)
    args = ("--peering", peering, "--priority", "7")
    ops = _pair(operator_kubeconfig, tmp_path, ("a", "b"), args)
    try:
        for op in ops:
            op.start()

        def one_left():
            ended = [op for op in ops if op.proc.poll() is not None]
            return ended if len(ended) == 1 else None

        wait_for(one_left, timeout_s=120, what="one of the two operators stepping aside",
                 explain=lambda: "\n".join(op.log()[-2000:] for op in ops))
        (gone,) = [op for op in ops if op.proc.poll() is not None]
        (kept,) = [op for op in ops if op is not gone]
        assert gone.proc.returncode == 2, gone.log()[-3000:]
        last = _error_line(gone)
        # (at start if the other's entry was written by then; else by the peering watch)
        assert last.startswith("error: --priority 7: ") and "--priority auto" in last, last
        _served(cluster, namespace, "after-the-collision", kept)
        assert _names_job(kept, "after-the-collision"), kept.log()[-3000:]
        assert kept.proc.poll() is None, kept.log()[-3000:]

        # Which of the two checks ended the other depends on the start-up's timing. The peering watch itself:
        # an equal peer that sorts first appears beside the running one (the entry kopf would write for it).
        now = datetime.datetime.now(datetime.UTC).isoformat()
        cluster.kubectl("patch", "clusterkopfpeering", peering, "--type", "merge", "-p", json.dumps(
            {"status": {"0-started-in-the-same-moment": {"priority": 7, "lifetime": 60, "lastseen": now}}}))
        assert kept.proc.wait(60) == 2, kept.log()[-3000:]
        last = _error_line(kept)
        assert last.startswith("error: --priority 7: 0-started-in-the-same-moment run(s) on ClusterKopfPeering"), last
        assert "steps aside for the first by identity" in last and "--priority auto" in last, last
        # it stopped as for a rollout: kopf removed its own entry on the way out
        entries = cluster.api().get(f"/apis/kopf.dev/v1/clusterkopfpeerings/{peering}").get("status") or {}
        assert list(entries) == ["0-started-in-the-same-moment"], entries
    finally:
        _stop_all(cluster, peering, *ops)
