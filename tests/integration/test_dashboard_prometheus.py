"""Every query of the chart's Grafana dashboard returns data from a real Prometheus (Debian's package, on
loopback) scraping a real `elastic-jax run`'s controller (with the job's bearer token) and the operator's metrics
exporter, during a run with one worker SIGKILLed.

The operator side is the operator's own exporter (`prometheus_client.start_http_server` over its real registry,
`elastic_jax.k8s_operator.metrics`, as `elastic-jax-operator --metrics-port` serves it) started as a process: no
operator reconciles here (that needs a Kubernetes API server), so its series are the ones it exports from the
start (counters at 0, the failure-notify histogram empty: its quantile is NaN, which Prometheus still returns).

At the end the dashboard is drawn from the same Prometheus (tools/dashboard_picture.py), into the test's folder, or
where DASHBOARD_PICTURE names: that is how docs/images/dashboard-local-cpu.png is made.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import yaml

from elastic_jax.local.launcher import RUN_DIR_ENV
from elastic_jax.local.processes import free_port
from tests.support import dashboard as dash
from tests.support.prometheus import Prometheus, ensure_prometheus
from tests.support.runs import CLI, ROOT, job_manifest, leftover_processes
from tools import dashboard_picture

JOB, NAMESPACE = "dash-job", "local"
# The same controller scraped again as a Prometheus on the user's machine would: no namespace label.
LOCAL_JOB = "dash-job-unlabelled"
DEADLINE_S = 300  # (a bound that only ends a broken test; every wait is on a condition)
NOTE = ("a local `elastic-jax run` (3 CPU slices) with a worker SIGKILLed at step 30; the operator row is its "
        "metrics exporter alone, with no cluster to reconcile: 0, and no failure-notify quantile")
PICTURE_ENV = "DASHBOARD_PICTURE"  # a test knob (so not in elastic_jax.contract): the PNG to draw; unset: tmp_path

OPERATOR_EXPORTER = """
import signal, sys
from prometheus_client import start_http_server
from elastic_jax.k8s_operator import metrics  # noqa: F401 - the operator's registry (prometheus_client.REGISTRY)
start_http_server(int(sys.argv[1]), addr="127.0.0.1")
signal.pause()
"""


def _wait_for(predicate, what: str):
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _controller_port(workdir: Path) -> int | None:
    """The `--port` of the live controller process of the run in `workdir`."""
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmd = p.info["cmdline"] or []
            if (any(part.endswith("elastic-jax-controller") for part in cmd) and "--port" in cmd
                    and p.environ().get(RUN_DIR_ENV) == str(workdir.resolve())):
                return int(cmd[cmd.index("--port") + 1])
        except (psutil.Error, IndexError, ValueError):
            continue
    return None


def _as_promql(title: str, expr: str) -> str:
    """A query variable's `label_values(selector, label)` as the PromQL Grafana runs for it; a panel's as is."""
    m = re.fullmatch(r"label_values\((.*), *(\w+)\)", expr)
    return f"count by ({m.group(2)}) ({m.group(1)})" if title.startswith("$") and m else expr


def _check_the_picture(prom: Prometheus, dashboard: dict, started: float, out: Path) -> None:
    """The dashboard drawn from `prom` since `started` (epoch seconds), as a user's default view (namespace All):
    one axes per panel, and data in every panel whose queries the test found answering (the failure-notify
    quantiles answer NaN without a failure: a series, no number)."""
    drawn = dashboard_picture.picture(prom.url, out, {"namespace": dash.all_value(dashboard, "namespace"),
                                                      "job": JOB}, started, time.time(), scrape_interval_s=1, note=NOTE)
    assert out.stat().st_size > 10_000
    assert sorted(drawn) == sorted(p["title"] for p in dashboard["panels"] if p["type"] != "row")
    nan_only = {p["title"] for p in dashboard_picture.panels(dashboard)
                if all("elasticjax_operator_failure_notify" in t["expr"] for t in p["targets"])}
    assert [t for t, (series, finite) in drawn.items() if not series or not (finite or t in nan_only)] == []


def test_every_dashboard_query_returns_data_from_a_real_prometheus_during_a_run_with_a_killed_worker(tmp_path):
    binary = ensure_prometheus()
    workdir = tmp_path / "run"
    targets = tmp_path / "prom" / "controller-targets.json"
    targets.parent.mkdir()
    targets.write_text("[]")
    unlabelled = tmp_path / "prom" / "controller-targets-unlabelled.json"
    unlabelled.write_text("[]")
    operator_port = free_port()
    scrape = [
        # job = the ElasticTrainingJob's name, as docs/observability.md asks of a cluster's PodMonitor
        {"job_name": JOB, "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "1s"}],
         "authorization": {"type": "Bearer", "credentials_file": str(workdir / "token")}},
        {"job_name": LOCAL_JOB, "file_sd_configs": [{"files": [str(unlabelled)], "refresh_interval": "1s"}],
         "authorization": {"type": "Bearer", "credentials_file": str(workdir / "token")}},
        {"job_name": "elastic-jax-operator", "static_configs": [{"targets": [f"127.0.0.1:{operator_port}"]}]},
    ]
    manifest = job_manifest(JOB, tmp_path, slices={"count": 3, "minSlices": 2},
                            training={"steps": 100_000, "globalBatchSize": 12, "logEverySteps": 10},
                            checkpoint={"uri": str(tmp_path / "ckpt"), "intervalSteps": 20})
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(manifest))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    exporter = subprocess.Popen([sys.executable, "-c", OPERATOR_EXPORTER, str(operator_port)], env=env)
    cli = None
    try:
        with Prometheus(binary, tmp_path / "prom", scrape) as prom:
            started = time.time()
            cli = subprocess.Popen([CLI, "run", str(tmp_path / "job.yaml"), "--workdir", str(workdir),
                                    "--kill-at-step", "30"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, cwd=tmp_path, env=env, start_new_session=True)
            port = _wait_for(lambda: _controller_port(workdir) or cli.poll() is not None, "the controller's port")
            assert cli.poll() is None, cli.communicate()[1][-3000:]
            targets.write_text(json.dumps([{"targets": [f"127.0.0.1:{port}"], "labels": {"namespace": NAMESPACE}}]))
            unlabelled.write_text(json.dumps([{"targets": [f"127.0.0.1:{port}"]}]))
            sel = f'{{namespace="{NAMESPACE}", job="{JOB}"}}'
            # The kill's recovery finished (its seconds observed) and the replaced slice rejoined; a checkpoint
            # committed after it.
            _wait_for(lambda: prom.query(f"elastic_jax_recovery_seconds_count{sel} >= 1")
                      and prom.query(f'elastic_jax_recoveries_total{{job="{JOB}", cause="scale_up"}}')
                      and prom.query(f"elastic_jax_active_slices{sel} == 3")
                      and prom.query(f"elastic_jax_checkpoint_committed_step{sel} > 40")
                      or cli.poll() is not None, "the recovery and a checkpoint after it, in Prometheus")
            assert cli.poll() is None, cli.communicate()[1][-3000:]
            _wait_for(lambda: prom.query(f'elastic_jax_checkpoint_committed_step{{job="{LOCAL_JOB}"}} > 40')
                      or cli.poll() is not None, "the unlabelled scrape")
            assert prom.targets_up() == {JOB: "up", LOCAL_JOB: "up", "elastic-jax-operator": "up"}, prom.log_tail()

            empty, nan = [], []
            dashboard = dash.load()
            # As Grafana runs them: one namespace chosen; and namespace All (the default) over the scrape
            # without a namespace label (trial finding C4: a local Prometheus showed nothing).
            runs = [(q, dash.substituted(q[1], NAMESPACE, JOB)) for q in dash.queries(dashboard)]
            runs += [(q, dash.substituted(q[1], dash.all_value(dashboard, "namespace"), LOCAL_JOB))
                     for q in dash.queries(dashboard)]
            for (title, _), expr in runs:
                query = _as_promql(title, expr)
                result = prom.query(query)
                if not result:
                    empty.append((title, query))
                elif "elasticjax_operator_failure_notify" not in query \
                        and any(math.isnan(float(r["value"][1])) for r in result):
                    nan.append((title, query, result))
            assert empty == [], f"queries with no data: {empty}"
            assert nan == [], f"job queries answering NaN: {nan}"
            # What the panels show is what happened: the slice lost and rejoined, training, no spare.
            causes = prom.query(f"sum by (cause) (elastic_jax_recoveries_total{sel}) > 0")
            assert sorted(r["metric"]["cause"] for r in causes) == ["scale_up", "slice_down"]
            assert [r["metric"]["phase"] for r in prom.query(
                f"max by (phase) (elastic_jax_phase{sel}) > 0")] in (["Running"], ["Recovering"])
            assert prom.query(f'elastic_jax_slices{{job="{JOB}", state="Spare"}}')[0]["value"][1] == "0"
            if os.environ.get(PICTURE_ENV):  # the docs' picture: trains on until training outweighs the start-up
                _wait_for(lambda: prom.query(f"elastic_jax_goodput_ratio{sel} > 0.5") or cli.poll() is not None,
                          "goodput above 50%")
            _check_the_picture(prom, dashboard, started, Path(os.environ.get(PICTURE_ENV) or tmp_path / "dash.png"))
            cli.send_signal(signal.SIGINT)  # Ctrl-C: the run checkpoints and stops every process
            _, err = cli.communicate(timeout=DEADLINE_S)
            assert cli.returncode == 130, err[-3000:]
    finally:
        if cli is not None and cli.poll() is None:
            os.killpg(cli.pid, signal.SIGKILL)
            cli.communicate()
        exporter.terminate()
        exporter.wait(30)
        left = leftover_processes(str(tmp_path))
        for p in left:
            p.kill()
    assert not left, f"processes left running: {[p.pid for p in left]}"
