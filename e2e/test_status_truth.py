"""Issues 11 and 12 (status that tells the truth), on the local control plane: one job's life, read as it goes.

The real operator (least-privilege process) and real controller and worker processes (the CPU example's
images, run by the node agent). One job that never finishes goes through, in this order, and each step is
checked as the test that once had a job of its own for it checked it (session 27 merged seven such tests;
docs/testing.md, old -> new; nine, with steps 0, 7 and 8):

1. **a frozen controller** (SIGSTOP, was `test_a_frozen_controllers_seconds_are_booked_recovering_not_productive`):
   it reads ControllerUnresponsive; once SIGCONTed its own ledger holds the frozen seconds as training (its clock
   ran on) and the operator's `status.goodput` books them `recovering` (`counterBase.frozenSeconds`), once;
2. **a worker SIGKILLed under a real Prometheus** (was `test_dashboard_operator.py`): every query of the chart's
   Grafana dashboard returns data, scraped from the operator and the job's controller pod (with the job's
   token, `job` = the job's name, as the PodMonitor of docs/observability.md labels it); the counters
   (`recoveries`, `sliceReplacements`, slice 0's `restarts`) grow and the goodput ledger books the recovery
   (was the first kill of `test_operator_counters.py`);
3. **a suspend and a resume, each on a watch** (was `test_status_truth.py`'s suspend test and the counters
   test's suspend): `Suspending` (naming the controller pod) until the controller stopped, every `Suspended`
   version at the step the controller's own `finished` record stopped at, five operator passes leave the
   suspended object's resourceVersion alone, the counts and the ledger are kept; then the new controller pod's
   stages in order, never back (no answer, starting, first step, Running), STEP the step it resumed from;
4. **a worker killed again** (the counters grow over the new controller's base);
5. **the controller SIGKILLed, on a watch** (was `test_a_killed_controller_reads_recovering_...` and the
   counters test's controller-pod deletion): every version from the restart's start until the replacement
   trained reads Recovering, `stepsLost` counts the steps it did not resume, no counter or ledger total is lower;
6. **the operator SIGKILLed, a worker SIGKILLed while it is down, the operator started again** (was
   `test_slice_truth.py` and `test_token_record.py`): exactly one `SliceDown` Event for that loss, the
   replacement reads `warming` on the watch until it joins, and the restarted operator still takes the job's
   token Secret for its own (`status.tokenSecret`, no `TokenSecretConflict`) after the controller pods the job
   had: it trains on.

7. **the manifest ConfigMap edited, then the controller pod deleted** (was `test_tenancy.py`'s edited-ConfigMap
   test): the next controller refuses it and the job fails with the reason, not the edited spec;
8. **the job deleted**: its NetworkPolicies go with it. Before step 1 (was `test_network_policies.py`'s first
   test; the operator is given `--control-api-from` as the chart gives it): the job's own NetworkPolicies, owned
   by it, selecting its pods by role and nothing of the job beside it.

Beside it, from step 1 until before step 6, **a second job whose workers can never be scheduled** stays
Pending: no version of it differs from the one before only in the goodput ledger's clock (before: one each
status long poll, ~26 s) over at least two long polls and 20 operator passes (was
`test_a_quiet_pending_job_is_not_rewritten_for_its_goodput_clock_alone`, a 55-s window of its own).

All read every version of a job the API server sends on a watch where the order matters (no polling that could
miss one); nothing is timed.
"""

from __future__ import annotations

import json
import math
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import yaml

from e2e.helpers import is_ready, pods, wait_for
from e2e.operator_fixtures import (  # noqa: F401  (fixtures)
    OperatorProcess, apply_job, ejob_crd, example_manifest, get_job, job_events, operator_kubeconfig, run_operator,
    wait_phase,
)
from e2e.test_network_policies import OPERATOR_PEER, PROMETHEUS, _policies, _selects
from elastic_jax.api import labels
from elastic_jax.k8s_operator.controller_link import MIN_POLL_INTERVAL_S, WATCH_WAIT_S
from elastic_jax.k8s_operator.job_pass import SUSPENDED_SLICE_REASON
from elastic_jax.k8s_operator.slice_warming import WARMING_TO_JOIN
from elastic_jax.local.processes import write_private_file
from tests.support import dashboard as dash
from tests.support.prometheus import Prometheus, ensure_prometheus

# One job through six incidents: about 4 min on a quiet machine, three times that at load 15.
pytestmark = pytest.mark.timeout(1800)

GROUP, VERSION, PLURAL = "elasticjax.dev", "v1alpha1", "elastictrainingjobs"


@pytest.fixture
def operator(operator_kubeconfig, tmp_path):  # noqa: F811
    """The operator (least-privilege identity) given the control API's peers as the chart gives them
    (`--control-api-from`: the operator's pods, then the admin's), so each job also gets its NetworkPolicies;
    stopped by PID afterwards."""
    yield from run_operator(operator_kubeconfig, tmp_path / "operator.log",
                            ("--control-api-from", json.dumps([OPERATOR_PEER, PROMETHEUS])))


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
        from kubernetes.client import ApiException
        seen = self.rv  # the newest version of the object itself seen (self.rv may be a collection's, below)
        while not self._stop.is_set():
            w = watch.Watch()
            try:
                for event in w.stream(self.api.list_namespaced_custom_object, GROUP, VERSION, self.namespace,
                                      PLURAL, field_selector=f"metadata.name={self.name}",
                                      resource_version=self.rv, timeout_seconds=5, allow_watch_bookmarks=False):
                    obj = event["object"]
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self.objects.append(obj)
                        self.rv = seen = obj["metadata"]["resourceVersion"]
                    if self._stop.is_set():
                        break
            except ApiException as e:
                # 410 Gone: the version to resume from left the API server's window, which other objects'
                # writes move on (a quiet job's own version stays old; seen under load in CI). Nothing was
                # missed when the object is still at the version last seen: go on from the list's version.
                # Anything else, or a changed object, would hide versions: the test fails on it.
                if e.status == 410:
                    listed = self.api.list_namespaced_custom_object(
                        GROUP, VERSION, self.namespace, PLURAL, field_selector=f"metadata.name={self.name}")
                    if [o["metadata"]["resourceVersion"] for o in listed["items"]] == [seen]:
                        self.rv = listed["metadata"]["resourceVersion"]
                        continue
                self.errors.append(f"ApiException {e.status} {e.reason}: {str(e.body)[:300]}")
                return
            except Exception as e:
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


# --- what the steps read ---------------------------------------------------------------------------------------

def _reconciles(operator) -> float:
    """Reconcile passes the operator made so far (its `elasticjax_operator_reconciles_total{result="ok"}`)."""
    for line in operator.metrics().splitlines():
        if line.startswith('elasticjax_operator_reconciles_total{result="ok"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _more_passes(operator, n: int, explain) -> None:
    """Waits until the operator made `n` more reconcile passes (anything it still writes is then written)."""
    passes = _reconciles(operator)
    wait_for(lambda: _reconciles(operator) >= passes + n, timeout_s=120, what=f"{n} more operator passes",
             explain=explain)


def _differences(a: object, b: object, path: str = "") -> str:
    """Where two objects differ, one `path: a -> b` line each."""
    if isinstance(a, dict) and isinstance(b, dict):
        return "".join(_differences(a.get(k), b.get(k), f"{path}.{k}") for k in sorted(set(a) | set(b)))
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return "".join(_differences(x, y, f"{path}[{i}]") for i, (x, y) in enumerate(zip(a, b)))
    return "" if a == b else f"{path}: {json.dumps(a)[:300]} -> {json.dumps(b)[:300]}\n"


def _counts(status: dict) -> tuple[int, int, int]:
    """(recoveries, sliceReplacements, slice 0's restarts)."""
    slice0 = next((s for s in status.get("slices") or [] if s.get("index") == 0), {})
    return int(status.get("recoveries") or 0), int(status.get("sliceReplacements") or 0), int(slice0.get("restarts") or 0)


def _finished_event(log: str) -> dict:
    """The controller's `finished` log record (JSON lines): its last step and last committed checkpoint step."""
    records = [json.loads(line) for line in log.splitlines() if line.startswith("{") and '"finished"' in line]
    (finished,) = [r for r in records if r.get("event") == "finished"]
    return finished


def _goodput_seconds(status: dict) -> dict[str, float]:
    return dict((status.get("goodput") or {}).get("seconds") or {})


def _not_lower(now: dict[str, float], before: dict[str, float]) -> str:
    """The goodput categories that went down (`name: before -> now`), "" when none did."""
    return ", ".join(f"{k}: {v} -> {now.get(k, 0.0)}" for k, v in before.items() if now.get(k, 0.0) < v)


def _restarted_from_zero(now: dict, before: dict) -> str:
    """What is wrong with status `now` as the status `before` a new controller pod that resumed from step 0
    ("" when nothing): `before`'s steps all lost, its productive and reduced seconds all re-booked
    `recovering`, no other category lower (one hundredth of a second of rounding allowed)."""
    b, n = _goodput_seconds(before), _goodput_seconds(now)
    moving = ("productive", "reduced", "recovering")
    wrong = [_not_lower(n, {k: v for k, v in b.items() if k not in moving})]
    moved = b.get("productive", 0.0) + b.get("reduced", 0.0) + b.get("recovering", 0.0)
    if n.get("recovering", 0.0) < moved - 0.01:
        wrong.append(f"recovering {n.get('recovering')} < {moved} (earlier productive + reduced + recovering)")
    if int(now.get("stepsLost") or 0) < int(before.get("stepsLost") or 0) + int(before.get("step") or 0):
        wrong.append(f"stepsLost {now.get('stepsLost')} < {before.get('stepsLost') or 0} + step {before.get('step')}")
    return "; ".join(w for w in wrong if w)


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


def _condition(status: dict, type_: str) -> dict:
    return next((c for c in status.get("conditions") or [] if c["type"] == type_), {})


def _restart_reason(obj: dict) -> str:
    """The reason of a job version's ControllerRestarted condition ("" when it has none)."""
    return _condition(obj.get("status") or {}, "ControllerRestarted").get("reason", "")


def _controller_account(cluster, namespace: str, pod: str) -> str:
    """The controller's log lines about slice 1 and its elastic events (why it marked a slice Down)."""
    try:
        log = cluster.container_log(namespace, pod, "controller")
    except FileNotFoundError as e:
        return f"no controller log: {e}"
    keys = ("slice 1", "slices [1", "elastic", "health check", "stalled", "deadline")
    return "\n".join(line[:400] for line in log.splitlines() if any(k in line for k in keys))[-6000:]


@dataclass
class _Job:
    """The job under test and what its steps need: its status (a callable reading it now) and the failure text."""

    cluster: object
    kube: object
    namespace: str
    name: str
    operator: OperatorProcess
    status: Callable[[], dict]
    explain: Callable[[], str]

    def wait(self, pred: Callable[[dict], bool], what: str, timeout_s: float = 300, interval_s: float = 0.5) -> dict:
        """The status once `pred(status)` holds (TimeoutError with the status and the operator's log if not)."""
        return wait_for(lambda: (lambda s: s if pred(s) else None)(self.status()), timeout_s=timeout_s, what=what,
                        interval_s=interval_s, explain=self.explain)

    def watch(self) -> JobWatch:
        return JobWatch(self.kube, self.namespace, self.name,
                        get_job(self.cluster, self.namespace, self.name)["metadata"]["resourceVersion"])

    def worker(self, index: int = 0) -> dict:
        """A Running, Ready worker pod of slice `index` (not being deleted)."""
        return next(p for p in pods(self.cluster, self.namespace,
                                    f"{labels.JOB_NAME}={self.name},{labels.SLICE_INDEX}={index}")
                    if p["status"].get("phase") == "Running" and is_ready(p)
                    and not p["metadata"].get("deletionTimestamp"))

    def kill_worker(self, victim: dict | None = None) -> dict:
        """SIGKILLs the worker process of `victim` (default: slice 0's); returns that pod."""
        victim = victim or self.worker(0)
        os.kill(self.cluster.container_pid(self.namespace, victim["metadata"]["name"], "worker",
                                           victim["metadata"]["uid"]), signal.SIGKILL)
        return victim

    def training(self, after_controller_uid: str = "") -> dict:
        """Status once a controller other than `after_controller_uid` answers and trains on both slices."""
        def ok(s):
            uid = (s.get("counterBase") or {}).get("controllerUid") or ""
            return bool(uid and uid != after_controller_uid and s.get("phase") == "Running"
                        and s.get("activeSlices") == 2 and s.get("step", 0) >= 5)
        return self.wait(ok, "a new controller training on both slices")

    def grown_past(self, before: tuple[int, int, int]) -> tuple[int, int, int]:
        """The counts once each is above `before` and both slices train again."""
        s = self.wait(lambda s: all(n > b for n, b in zip(_counts(s), before)) and s.get("activeSlices") == 2,
                      f"counters above {before}, both slices back")
        return _counts(s)


# --- the quiet Pending job beside it ---------------------------------------------------------------------------

class _QuietPending:
    """A second job whose workers can never be scheduled (no node has their pool): its controller waits for its
    slices, booking `starting` seconds, and answers each status long poll; the job stays Pending with
    PodsNotStarting saying why. Its every version is read on a watch from `start()` to `check()`."""

    def __init__(self, cluster, kube, namespace: str, operator: OperatorProcess):
        manifest = example_manifest()
        manifest["metadata"]["name"] = self.name = "quiet-pending"
        manifest["spec"]["worker"] = {"nodeSelector": {"cloud.google.com/gke-nodepool": "no-such-pool"}}
        manifest["spec"]["checkpoint"]["uri"] = f"/tmp/elastic-jax/e2e-status-truth/{namespace}/quiet/checkpoints"
        self.cluster, self.kube, self.namespace, self.operator = cluster, kube, namespace, operator
        self.status, self.explain = apply_job(cluster, namespace, manifest, operator)

    def start(self) -> None:
        """Waits until its controller answers (goodput seconds, PodsNotStarting True), then starts the watch."""
        def waiting():
            s = self.status()
            return s if (s.get("phase") == "Pending" and (s.get("goodput") or {}).get("seconds")
                         and _condition(s, "PodsNotStarting").get("status") == "True") else None
        wait_for(waiting, timeout_s=300, what="a Pending job whose controller answers, PodsNotStarting",
                 interval_s=0.5, explain=self.explain)
        self.job = get_job(self.cluster, self.namespace, self.name)
        self.watch = JobWatch(self.kube, self.namespace, self.name, self.job["metadata"]["resourceVersion"])
        self.started, self.passes = time.monotonic(), _reconciles(self.operator)

    def check(self) -> None:
        """Ends the watch after two status long-poll answers at least and 20 operator passes; asserts no version
        differed from the one before it only in the ledger's clock, and the ledger never went down."""
        try:
            # One answer comes at most WATCH_WAIT_S + MIN_POLL_INTERVAL_S after the last (55 s with 25 + 1 and a
            # 3-s margin); the steps of the job beside it took longer than that, so this wait is over at once.
            # The passes: the operator kept reconciling meanwhile (a stalled one would write nothing, and this
            # check could not fail).
            window_s = 2 * (WATCH_WAIT_S + MIN_POLL_INTERVAL_S) + 3
            wait_for(lambda: time.monotonic() - self.started >= window_s
                     and _reconciles(self.operator) >= self.passes + 20,
                     timeout_s=600, what=f"{window_s:.0f} s and 20 operator passes", interval_s=1,
                     explain=self.explain)
        finally:
            seen = self.watch.stop()
        before = self.job
        clock_only = []
        for obj in seen:
            if _without_clock(obj) == _without_clock(before):
                clock_only.append(_differences(before, obj))
            before = obj
        assert not clock_only, "".join(clock_only)
        last = seen[-1] if seen else self.job
        assert last["status"]["phase"] == "Pending", last["status"]
        for category, seconds in self.job["status"]["goodput"]["seconds"].items():
            assert last["status"]["goodput"]["seconds"][category] >= seconds, (category, self.job["status"],
                                                                               last["status"])


# --- the steps -------------------------------------------------------------------------------------------------

def _freeze(job: _Job, running: dict) -> None:
    """Step 1: the controller SIGSTOPped while it trains (alive, making no step) reads ControllerUnresponsive;
    once SIGCONTed its own ledger holds the frozen seconds in `productive` (its clock ran on) and the operator's
    `status.goodput` books them `recovering` (`counterBase.frozenSeconds`), as `elastic-jax run` does. The
    freeze's length is the wait for the condition, not an assertion."""
    controller, uid = running["controllerPod"], running["counterBase"]["controllerUid"]
    pid = job.cluster.container_pid(job.namespace, controller, "controller", uid)
    before = running["goodput"]["seconds"]
    stopped_at = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    try:
        frozen_at = job.wait(lambda s: _condition(s, "ControllerUnresponsive").get("status") == "True",
                             "ControllerUnresponsive True", timeout_s=180)
    finally:
        os.kill(pid, signal.SIGCONT)
        stop_s = time.monotonic() - stopped_at
    after = job.wait(lambda s: _condition(s, "ControllerUnresponsive").get("status") == "False"
                     and s.get("step", 0) > frozen_at["step"], "the controller answering and training again",
                     timeout_s=180)
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
    later = job.wait(lambda s: s["goodput"]["seconds"]["productive"] - before["productive"] >= 5,
                     "5 s of productive training after the freeze", timeout_s=180, interval_s=1)["goodput"]
    not_training = sum(v - before.get(k, 0) for k, v in later["seconds"].items() if k not in ("productive", "reduced"))
    assert not_training <= stop_s + margin_s, (before, later, stop_s)  # the freeze once, not twice


def _worker_loss_on_the_dashboard(job: _Job, tmp_path) -> tuple[int, int, int]:
    """Step 2: a worker SIGKILLed while a real Prometheus (Debian's package, on loopback) scrapes the operator and
    the controller pod: every dashboard query returns data (`tests/integration/test_dashboard_prometheus.py`
    checks the same against `elastic-jax run`); the counters grow, the ledger books the recovery. Returns the
    counts after it."""
    binary = ensure_prometheus()
    s = job.status()
    assert _counts(s) == (0, 0, 0), s
    controller = next(p for p in pods(job.cluster, job.namespace,
                                      f"{labels.JOB_NAME}={job.name},{labels.ROLE}={labels.ROLE_CONTROLLER}")
                      if p["metadata"]["name"] == s["controllerPod"])
    from elastic_jax.k8s_operator import tokens

    token = tokens.derive_token(tokens.load_key(str(job.operator.log_path.with_name("operator-key"))),
                                get_job(job.cluster, job.namespace, job.name)["metadata"]["uid"])
    token_file = tmp_path / "job-token"
    write_private_file(token_file, token)
    scrape = [
        {"job_name": job.name, "static_configs": [{"targets": [f"{controller['status']['podIP']}:8080"],
                                                   "labels": {"namespace": job.namespace}}],
         "authorization": {"type": "Bearer", "credentials_file": str(token_file)}},
        {"job_name": "elastic-jax-operator",
         "static_configs": [{"targets": [f"127.0.0.1:{job.operator.metrics_port}"]}]},
    ]
    with Prometheus(binary, tmp_path / "prom", scrape) as prom:
        sel = f'{{namespace="{job.namespace}", job="{job.name}"}}'
        # Both targets scraped before the loss: a rate() over the operator's histogram needs a sample from
        # before the notification (a series first scraped after it reads rate 0 -> histogram_quantile NaN).
        wait_for(lambda: prom.query(f"elastic_jax_step{sel} > 0")
                 and prom.query("elasticjax_operator_failure_notify_seconds_count"),
                 timeout_s=120, what="the controller and the operator scraped", explain=prom.log_tail)
        job.kill_worker()
        wait_for(lambda: prom.query("rate(elasticjax_operator_failure_notify_seconds_count[10m]) > 0")
                 and prom.query("elasticjax_operator_slice_replacements_total >= 1")
                 and prom.query(f"elastic_jax_recovery_seconds_count{sel} >= 1")
                 and prom.query(f"elastic_jax_active_slices{sel} == 2")
                 and prom.query(f"elastic_jax_checkpoint_committed_timestamp_seconds{sel} > 0"),
                 timeout_s=300, what="the loss, its notification and its recovery in Prometheus", interval_s=0.5,
                 explain=lambda: job.explain() + prom.log_tail())
        assert prom.targets_up() == {job.name: "up", "elastic-jax-operator": "up"}, prom.log_tail()
        empty, nan = [], []
        for title, expr in dash.queries(dash.load()):
            query = dash.substituted(expr, job.namespace, job.name, rate_interval="10m")
            if title.startswith("$"):
                continue  # (the variables: label_values(), Grafana's own function; the integration test runs them)
            result = prom.query(query)
            if not result:
                empty.append((title, query))
            elif any(math.isnan(float(r["value"][1])) for r in result):
                nan.append((title, query, result))
        assert empty == [], f"queries with no data: {empty}"
        assert nan == [], f"queries answering NaN: {nan}"
    counts = job.grown_past((0, 0, 0))
    g = job.status()["goodput"]
    assert g["seconds"]["productive"] > 0 and g["seconds"]["recovering"] > 0 and g["seconds"]["starting"] > 0, g
    assert 0 < g["fraction"] < 1 and g["percent"].endswith("%"), g
    return counts


def _suspend(job: _Job, counts: tuple[int, int, int]) -> dict:
    """Step 3a: `suspend: true`, every version on a watch: `Suspending` (condition Suspended False, naming the
    controller pod) until the controller stopped, then `Suspended` for good, each at the step the controller's
    own `finished` record stopped at (before: `Suspended` at steps 65, 81, 85 while it still trained); the slices
    say so, the counts and the ledger stay, and five operator passes leave the object alone. Returns the
    suspended status."""
    s = job.status()
    controller, controller_uid = s["controllerPod"], s["counterBase"]["controllerUid"]
    goodput_before = _goodput_seconds(s)
    watch = job.watch()
    try:
        job.cluster.kubectl("patch", "ejob", job.name, "-n", job.namespace, "--type=merge",
                            "-p", '{"spec":{"suspend":true}}')
        wait_phase(job.cluster, job.namespace, job.name, ("Suspended",), timeout_s=180, explain=job.explain)
        wait_for(lambda: not pods(job.cluster, job.namespace, f"{labels.JOB_NAME}={job.name}"), timeout_s=180,
                 what="the job's pods gone", explain=job.explain)
        # the teardown's last news written: every slice stopped by the suspend, no controller
        job.wait(lambda s: s.get("controllerPod") == "" and s.get("slices") and all(
            sl["reason"] == SUSPENDED_SLICE_REASON and sl["state"] == "Down" and not sl["pods"]
            for sl in s["slices"]), "the suspend's teardown in status", timeout_s=60)
        # nothing changes while suspended, so no pass rewrites the object (`kubectl get ejob -w` printed an
        # identical line every second): five more operator passes leave its resourceVersion as it was; and
        # anything the operator still writes after the teardown is on the watch too
        settled = get_job(job.cluster, job.namespace, job.name)
        _more_passes(job.operator, 5, job.explain)
        now = get_job(job.cluster, job.namespace, job.name)
        assert now["metadata"]["resourceVersion"] == settled["metadata"]["resourceVersion"], \
            _differences(settled, now)
    finally:
        seen = watch.stop()
    suspended = now["status"]
    assert _counts(suspended) == counts, suspended
    # what the controller itself says it reached: the step its SIGTERM stop checkpointed, its last one
    finished = _finished_event(job.cluster.container_log(job.namespace, controller, "controller", controller_uid))
    assert finished["stop"] == "signal" and finished["last_committed_checkpoint_step"] == finished["steps"], finished
    # (its checkpoint folder is local: the stop's checkpoint went with the pod's emptyDir, so no step is claimed)
    assert suspended["step"] == finished["steps"] and "lastCheckpointStep" not in suspended, (suspended, finished)
    assert suspended["activeSlices"] == 0 and suspended["spareSlices"] == [], suspended
    assert not _not_lower(_goodput_seconds(suspended), goodput_before), \
        _not_lower(_goodput_seconds(suspended), goodput_before)
    steps = _steps(seen)
    phases = [p for _, p, _ in steps]
    assert "Suspending" in phases, steps
    first = phases.index("Suspended")
    assert "Suspending" in phases[:first], steps  # (never Suspended before it said Suspending)
    assert all(p == "Suspended" for p in phases[first:]), steps  # (and it stays so)
    # No Suspended while the controller's step still moves: every Suspended version has its last step.
    assert {s for _, p, s in steps if p == "Suspended"} == {finished["steps"]}, (steps, finished)
    cond = _condition(seen[first]["status"], "Suspended")
    assert cond["status"] == "True", cond
    stopping = next(o["status"] for o in seen if o["status"].get("phase") == "Suspending")
    cond = _condition(stopping, "Suspended")
    assert (cond["status"], cond["reason"]) == ("False", "Suspending") and controller in cond["message"], cond
    return suspended


def _resume(job: _Job, suspended: dict, counts: tuple[int, int, int], first_uid: str) -> dict:
    """Step 3b: `suspend: false` on a watch of its own (session 12's trial: STEP and ACTIVE "lagged the new
    controller" by 8-10 s). Each Pending version names the new pod's stage; they go forward (no answer,
    starting, first step, Running), never back; STEP is the step the new controller starts from (0 here: the
    local checkpoint folder went with the suspended pod), and a first-step version shows both slices. The new
    controller's ledger adds to the job's: the suspended pod's steps are lost, their seconds `recovering`, the
    counts kept. Returns the status training again."""
    watch = job.watch()
    try:
        job.cluster.kubectl("patch", "ejob", job.name, "-n", job.namespace, "--type=merge",
                            "-p", '{"spec":{"suspend":false}}')
        trained = job.wait(lambda s: s.get("phase") == "Running" and s.get("step", 0) >= 1
                           and s.get("controllerPod"), "the resumed job training", timeout_s=400)
    finally:
        seen = watch.stop()
    pod = trained["controllerPod"]
    stages = [(s, o["status"].get("step"), o["status"].get("activeSlices")) for o in seen if (s := _stage(o, pod))]
    order = [STAGES.index(s) for s, _, _ in stages]
    assert order == sorted(order), stages  # forward only
    assert "starting" in [s for s, _, _ in stages], stages  # (the controller answers before it builds its trainer)
    assert stages[-1][0] == "Running", stages
    resumed = [o["status"] for o in seen if (o.get("status") or {}).get("phase") not in ("Suspended", None)]
    assert resumed and all(s["step"] == 0 for s in resumed if s.get("phase") == "Pending"), \
        ([(s["phase"], s["step"]) for s in resumed], suspended["step"])
    assert all(act == 2 for s, _, act in stages if s == "first step"), stages
    # the steps lost still count from the step reached
    assert job.status()["stepsLost"] == suspended["step"] + (suspended.get("stepsLost") or 0), job.status()
    s = job.training(after_controller_uid=first_uid)
    assert all(n >= b for n, b in zip(_counts(s), counts)), (s, counts)
    assert s["counterBase"]["goodput"]["seconds"] == suspended["goodput"]["seconds"], s["counterBase"]
    assert not _restarted_from_zero(s, suspended), _restarted_from_zero(s, suspended)
    return s


def _controller_killed(job: _Job, counts: tuple[int, int, int], goodput_before_suspend: dict) -> dict:
    """Step 5: the controller process SIGKILLed (session 9/10 trials: the job kept `Running` with the old step and
    slice count until the new controller answered, then Pending while it restored). Every version from the
    restart's start until the replacement trained reads Recovering (reason ControllerRestarting, 0 active at
    first), then Running, never Pending; `stepsLost` is the step reached minus the step the new one resumed; the
    new pod counts from 0, the job's counts and ledger do not go down. Returns the status training again."""
    s = job.status()
    controller, uid = s["controllerPod"], s["counterBase"]["controllerUid"]
    before_loss = s
    watch = job.watch()
    try:
        os.kill(job.cluster.container_pid(job.namespace, controller, "controller", uid), signal.SIGKILL)
        after = job.wait(lambda s: s.get("controllerRestarts") == 1 and s.get("phase") == "Running"
                         and _restart_reason({"status": s}) == "ControllerPodLost",
                         "the replacement controller training")
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
    assert after["stepsLost"] - (before_loss.get("stepsLost") or 0) == max(0, reached - resumed), \
        (reached, resumed, before_loss.get("stepsLost"), after)
    # once the replacement reported where it resumed, the step is that one, not the lost controller's
    moved = [s["step"] for s in during if s["step"] != reached]
    assert not moved or moved[0] == resumed, (moved, resumed, _steps(seen))

    # its successor counts from 0; the job's counts and ledger do not
    s = job.training(after_controller_uid=uid)
    assert not _restarted_from_zero(s, before_loss), _restarted_from_zero(s, before_loss)
    assert all(n >= b for n, b in zip(_counts(s), counts)), (s, counts)
    base = s["counterBase"]
    assert base["controllerUid"] and base["recoveries"] >= 2, base
    # three controller pods' ledgers: the base holds the first two (their productive seconds re-booked
    # recovering: each new pod started again from step 0), the total keeps growing past it
    assert base["goodput"]["seconds"]["recovering"] > goodput_before_suspend["productive"], base
    # (the third pod started again from step 0 too: the base's training seconds are all recovering in the total,
    # its productive seconds are the live pod's own)
    assert not _restarted_from_zero(s, {"goodput": base["goodput"], "step": 0}), \
        _restarted_from_zero(s, {"goodput": base["goodput"], "step": 0})
    assert s["goodput"]["seconds"]["productive"] > 0, s["goodput"]
    assert s["goodput"]["seconds"]["recovering"] > goodput_before_suspend["recovering"], s["goodput"]
    return s


def _new_events(job: _Job, before: dict[str, int]) -> list[tuple[dict, int]]:
    """The job's Events posted since `before` ({uid: count} then): (event, how many times since)."""
    out = []
    for e in job_events(job.cluster, job.namespace, job.name):
        n = (e.get("count") or 1) - before.get(e["metadata"]["uid"], 0)
        if n > 0:
            out.append((e, n))
    return out


def _loss_while_the_operator_is_down(job: _Job, counts: tuple[int, int, int], secret: str) -> None:
    """Step 6 (session 10's trials): the operator SIGKILLed, slice 0's worker SIGKILLed while it is down and its
    JobSet replacing the slice, the operator started again. The loss was counted but got no `SliceDown` Event:
    the new operator posts exactly one, and no more on its later passes; the replacement, Ready, compiles before
    the controller lets it join, and read `Ready` with no reason meanwhile: now `warming`. And the token record
    (the chaos benchmark's full-restart arm found a job stuck for good: after its controller pods had been
    recreated, a restarted operator found `status.tokenSecret` empty and took the job's own Secret for someone
    else's, `CreateFailed`/`TokenSecretConflict`): the restarted operator keeps using the job's Secret."""
    before_events = {e["metadata"]["uid"]: e.get("count") or 1
                     for e in job_events(job.cluster, job.namespace, job.name)}
    selector = f"{labels.JOB_NAME}={job.name},{labels.SLICE_INDEX}=0"
    replacements = int(job.status().get("sliceReplacements") or 0)
    victim = job.worker(0)
    job.operator.kill()  # an operator crash: no pass sees what follows
    job.kill_worker(victim)

    def replaced():
        fresh = [p for p in pods(job.cluster, job.namespace, selector)
                 if p["metadata"]["uid"] != victim["metadata"]["uid"] and p["status"].get("phase") == "Running"
                 and is_ready(p)]
        gone = all(p["metadata"]["uid"] != victim["metadata"]["uid"] for p in pods(job.cluster, job.namespace, selector))
        return fresh if fresh and gone else None
    wait_for(replaced, timeout_s=300, what="slice 0's worker replaced by its JobSet (no operator running)",
             interval_s=0.5, explain=job.explain)
    watch = job.watch()
    try:
        job.operator.start()
        job.operator.wait_up()
        step_at_restart = int(job.status().get("step") or 0)
        # (its first pass, before the controller answered it, keeps the old operator's Running on 2 slices)
        job.wait(lambda s: s.get("sliceReplacements") == replacements + 1 and s.get("phase") == "Degraded",
                 "the replacement counted, the controller training on slice 1")
        # the replacement compiles (tens of seconds on a loaded machine) before it joins
        job.wait(lambda s: s.get("phase") == "Running" and s.get("activeSlices") == 2
                 and int(s.get("step") or 0) > step_at_restart, "the replacement back in the mesh", timeout_s=600)
        _more_passes(job.operator, 10, job.explain)
    finally:
        seen = watch.stop()
    new = _new_events(job, before_events)
    # The surviving slice 1 is never lost. In 2 of 5 runs of session 12 (loaded machine) it was, once the
    # replacement joined: its own SliceDown, "force-deleted (grace 0)", i.e. the controller marked it Down
    # and the operator replaced its worker. Not reproduced in 7 runs of session 13; the one check at a join
    # without the step path's stall excuse, the 5 s health-check ping of every Ready slice, now has it
    # (tests/integration/test_faults.py::test_a_health_check_that_expired_while_the_controller_was_frozen_blames_no_slice).
    # Should it happen again, the failure shows the controller's own account of slice 1.
    lost = [e for e, _ in new if e.get("reason") in ("SliceDown", "WorkerReplaced")
            and e.get("message", "").startswith(("slice 1 ", "controller saw slice 1 "))]
    assert not lost, (lost, _controller_account(job.cluster, job.namespace, job.status().get("controllerPod") or ""))
    # Slice 0's loss (the one while no operator ran): exactly one Event.
    downs = [(e, n) for e, n in new if e.get("reason") == "SliceDown" and e.get("message", "").startswith("slice 0 ")]
    assert len(downs) == 1 and downs[0][1] == 1, downs
    assert "slice 0 was replaced 1 time(s) while the operator was not running" in downs[0][0]["message"], downs
    assert downs[0][0]["type"] == "Warning", downs
    # the replacement, Ready to the operator, warmed before it joined: some version says so
    slice0 = [next(s for s in o["status"]["slices"] if s["index"] == 0) for o in seen
              if (o.get("status") or {}).get("slices")]
    assert any(s["state"] == "Ready" and s["reason"] == WARMING_TO_JOIN for s in slice0), slice0
    assert seen[-1]["status"]["slices"][0]["reason"] == "", seen[-1]["status"]["slices"]
    # the restarted operator took the job's Secret for the job's own: it trains on, nothing refused
    s = job.status()
    assert _condition(s, "CreateFailed").get("status") != "True", json.dumps(_condition(s, "CreateFailed"))
    assert s.get("tokenSecret") == secret and s["controllerRestarts"] == 1, s
    assert all(n > b for n, b in zip(_counts(s), counts)), (s, counts)


def _network_policies(job: _Job, other: str) -> None:
    """Step 0 (issue 31 RISK 8, was `test_network_policies.py`'s first test): the job's own NetworkPolicies,
    stored by the real API server, owned by the job, their selectors selecting the job's live pods by role and
    nothing of the job `other` beside it in the namespace. No CNI here enforces them (pods share the host's
    network): that part is the cluster's CNI (docs/security.md)."""
    uid = get_job(job.cluster, job.namespace, job.name)["metadata"]["uid"]
    want = {f"{job.name}-controller-ingress", f"{job.name}-worker-ingress"}
    policies = wait_for(lambda: (p := _policies(job.cluster, job.namespace)) and want <= set(p) and p,
                        timeout_s=120, what="the job's NetworkPolicies", interval_s=0.5, explain=job.explain)
    for name in want:
        (ref,) = policies[name]["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["name"], ref["uid"], ref.get("controller")) == (
            "ElasticTrainingJob", job.name, uid, True), ref
    controller, worker = policies[f"{job.name}-controller-ingress"], policies[f"{job.name}-worker-ingress"]
    assert controller["spec"]["ingress"] == [{"from": [OPERATOR_PEER, PROMETHEUS],
                                              "ports": [{"protocol": "TCP", "port": 8080}]}]
    assert worker["spec"]["ingress"] == [{"from": [{"podSelector": {"matchLabels": {
        labels.JOB_NAME: job.name, labels.JOB_UID: uid, labels.ROLE: labels.ROLE_CONTROLLER}}}],
        "ports": [{"protocol": "TCP", "port": 8471}]}]
    found = pods(job.cluster, job.namespace, "")
    mine = [p for p in found if p["metadata"]["labels"].get(labels.JOB_NAME) == job.name]
    assert {p["metadata"]["labels"].get(labels.ROLE) for p in mine} >= {labels.ROLE_CONTROLLER, labels.ROLE_WORKER}
    assert any(p["metadata"]["labels"].get(labels.JOB_NAME) == other for p in found), found
    mine_names = {p["metadata"]["name"] for p in mine}
    for pod in found:
        role = pod["metadata"]["labels"].get(labels.ROLE) if pod["metadata"]["name"] in mine_names else None
        assert _selects(controller, pod) == (role == labels.ROLE_CONTROLLER), pod["metadata"]["name"]
        assert _selects(worker, pod) == (role == labels.ROLE_WORKER), pod["metadata"]["name"]


def _edited_manifest_fails_the_next_controller(job: _Job, recorded: str) -> None:
    """Step 7 (issue 9, was `test_tenancy.py`'s edited-ConfigMap test): someone who may edit ConfigMaps in the
    namespace, but not the job, changes what trains in the job's manifest ConfigMap; at the next controller
    incarnation (the controller pod deleted) the controller refuses it and the job fails with the reason, not the
    edited spec; `status.manifestSha256` stays the digest recorded at the job's creation."""
    cm = json.loads(job.cluster.kubectl("get", "configmap", f"{job.name}-manifest", "-n", job.namespace,
                                        "-o", "json").stdout)
    text = yaml.safe_load(cm["data"]["job.yaml"])
    text["spec"]["training"]["steps"] = 77
    cm["data"]["job.yaml"] = yaml.safe_dump(text)
    job.cluster.kubectl("replace", "-f", "-", input=json.dumps(cm))
    job.cluster.kubectl("delete", "pod", job.status()["controllerPod"], "-n", job.namespace, "--wait=false")
    st = wait_phase(job.cluster, job.namespace, job.name, ("Failed", "Succeeded"), timeout_s=300,
                    explain=job.explain)["status"]
    assert st["phase"] == "Failed", st
    assert "the controller refused its input" in st["failureReason"], st
    assert "manifest ConfigMap was changed after the job was created" in st["failureReason"], st
    assert st["manifestSha256"] == recorded, (st["manifestSha256"], recorded)
    (cond,) = [c for c in st["conditions"] if c["type"] == "Failed" and c["status"] == "True"]
    assert "manifest ConfigMap was changed" in cond["message"], cond
    assert [e for e in job_events(job.cluster, job.namespace, job.name)
            if e["reason"] == "JobFailed" and "manifest ConfigMap was changed" in e["message"]]


def _policies_go_with_the_job(job: _Job, other: str) -> None:
    """Step 8: the job deleted: its NetworkPolicies go with it (their ownerReference, by the garbage collector;
    the operator cannot delete them), the job beside it keeps its own."""
    job.cluster.kubectl("delete", "elastictrainingjob", "-n", job.namespace, job.name, "--wait=false")
    mine = {f"{job.name}-controller-ingress", f"{job.name}-worker-ingress"}
    wait_for(lambda: not (mine & set(_policies(job.cluster, job.namespace))), timeout_s=120,
             what="the NetworkPolicies deleted with the job", interval_s=0.5,
             explain=lambda: json.dumps(sorted(_policies(job.cluster, job.namespace))))
    assert {f"{other}-controller-ingress", f"{other}-worker-ingress"} <= set(_policies(job.cluster, job.namespace))


def test_one_jobs_status_tells_the_truth_through_a_freeze_losses_a_suspend_and_restarts(
        cluster, kube, namespace, operator, tmp_path):
    manifest = example_manifest()
    name = manifest["metadata"]["name"]
    manifest["spec"]["training"]["steps"] = 200000  # never finishes during the test (the namespace goes with it)
    manifest["spec"]["checkpoint"]["uri"] = f"/tmp/elastic-jax/e2e-status-truth/{namespace}/checkpoints"
    manifest["spec"]["elasticity"].update({"maxRestarts": 30, "maxRestartsPerSlice": 25})
    status, explain = apply_job(cluster, namespace, manifest, operator)
    job = _Job(cluster, kube, namespace, name, operator, status, explain)
    quiet = _QuietPending(cluster, kube, namespace, operator)
    running = job.wait(lambda s: s.get("phase") == "Running" and s.get("activeSlices") == 2
                       and s.get("step", 0) >= 5, "the job training on both slices")
    secret = f"{name}-token"
    assert running.get("tokenSecret") == secret, running
    first_uid = running["counterBase"]["controllerUid"]
    recorded = running["manifestSha256"]
    assert len(recorded) == 64, recorded
    quiet.start()
    _network_policies(job, quiet.name)

    _freeze(job, running)
    counts = _worker_loss_on_the_dashboard(job, tmp_path)
    goodput_before_suspend = _goodput_seconds(job.status())
    suspended = _suspend(job, counts)
    s = _resume(job, suspended, counts, first_uid)
    assert s.get("tokenSecret") == secret, s
    resumed = _counts(s)
    job.kill_worker()
    counts = job.grown_past(resumed)
    s = _controller_killed(job, counts, goodput_before_suspend)
    assert s.get("tokenSecret") == secret, s
    quiet.check()  # before the operator restart, whose first pass may rewrite it for good reason
    _loss_while_the_operator_is_down(job, _counts(s), secret)
    _edited_manifest_fails_the_next_controller(job, recorded)
    _policies_go_with_the_job(job, quiet.name)
