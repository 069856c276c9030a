"""Every query of the chart's Grafana dashboard returns data from a real Prometheus (Debian's package, on
loopback) scraping a real operator (`elastic-jax-operator --metrics-port`, least-privilege identity, on the local
control plane) and the job's real controller pod (its `/metrics`, with the job's token, `job` = the job's name, as
the PodMonitor of docs/observability.md labels it), after one worker process SIGKILLed: the operator's panels
(failure -> notified seconds, reconciles, replacements) read what it observed, the job's what the controller did.

`tests/integration/test_dashboard_prometheus.py` checks the same against `elastic-jax run` without a cluster.
"""

from __future__ import annotations

import math
import os
import signal

from e2e.helpers import is_ready, pods, wait_for
from e2e.operator_fixtures import (  # noqa: F401  (fixtures)
    apply_job, ejob_crd, example_manifest, get_job, operator, operator_kubeconfig,
)
from elastic_jax.api import labels
from tests.support import dashboard as dash
from tests.support.prometheus import Prometheus, ensure_prometheus
from elastic_jax.local.processes import write_private_file


def test_every_dashboard_query_returns_data_from_a_real_operator_and_controller_pod(cluster, namespace, operator,
                                                                                     tmp_path):
    binary = ensure_prometheus()
    manifest = example_manifest()
    name = manifest["metadata"]["name"]
    manifest["spec"]["training"]["steps"] = 200000  # never finishes during the test
    manifest["spec"]["checkpoint"]["uri"] = f"/tmp/elastic-jax/e2e-dashboard/{namespace}/checkpoints"
    status, explain = apply_job(cluster, namespace, manifest, operator)
    wait_for(lambda: (lambda s: s if s.get("phase") == "Running" and s.get("activeSlices") == 2
                      and s.get("step", 0) >= 5 else None)(status()),
             timeout_s=300, what="the job training on both slices", interval_s=0.5, explain=explain)
    controller = next(p for p in pods(cluster, namespace, f"{labels.JOB_NAME}={name},{labels.ROLE}={labels.ROLE_CONTROLLER}")
                      if p["metadata"]["name"] == status()["controllerPod"])
    from elastic_jax.k8s_operator import tokens

    token = tokens.derive_token(tokens.load_key(str(operator.log_path.with_name("operator-key"))),
                                get_job(cluster, namespace, name)["metadata"]["uid"])
    token_file = tmp_path / "job-token"
    write_private_file(token_file, token)
    scrape = [
        {"job_name": name, "static_configs": [{"targets": [f"{controller['status']['podIP']}:8080"],
                                               "labels": {"namespace": namespace}}],
         "authorization": {"type": "Bearer", "credentials_file": str(token_file)}},
        {"job_name": "elastic-jax-operator", "static_configs": [{"targets": [f"127.0.0.1:{operator.metrics_port}"]}]},
    ]
    with Prometheus(binary, tmp_path / "prom", scrape) as prom:
        sel = f'{{namespace="{namespace}", job="{name}"}}'
        # Both targets scraped before the loss: a rate() over the operator's histogram needs a sample from
        # before the notification (a series first scraped after it reads rate 0 -> histogram_quantile NaN).
        wait_for(lambda: prom.query(f"elastic_jax_step{sel} > 0")
                 and prom.query("elasticjax_operator_failure_notify_seconds_count"),
                 timeout_s=120, what="the controller and the operator scraped", explain=prom.log_tail)
        victim = next(p for p in pods(cluster, namespace, f"{labels.JOB_NAME}={name},{labels.SLICE_INDEX}=0")
                      if p["status"].get("phase") == "Running" and is_ready(p) and not p["metadata"].get("deletionTimestamp"))
        os.kill(cluster.container_pid(namespace, victim["metadata"]["name"], "worker", victim["metadata"]["uid"]),
                signal.SIGKILL)
        wait_for(lambda: prom.query("rate(elasticjax_operator_failure_notify_seconds_count[10m]) > 0")
                 and prom.query("elasticjax_operator_slice_replacements_total >= 1")
                 and prom.query(f"elastic_jax_recovery_seconds_count{sel} >= 1")
                 and prom.query(f"elastic_jax_active_slices{sel} == 2")
                 and prom.query(f"elastic_jax_checkpoint_committed_timestamp_seconds{sel} > 0"),
                 timeout_s=300, what="the loss, its notification and its recovery in Prometheus", interval_s=0.5,
                 explain=lambda: explain() + prom.log_tail())
        assert prom.targets_up() == {name: "up", "elastic-jax-operator": "up"}, prom.log_tail()
        empty, nan = [], []
        for title, expr in dash.queries(dash.load()):
            query = dash.substituted(expr, namespace, name, rate_interval="10m")
            if title.startswith("$"):
                continue  # (the variables: label_values(), Grafana's own function; the integration test runs them)
            result = prom.query(query)
            if not result:
                empty.append((title, query))
            elif any(math.isnan(float(r["value"][1])) for r in result):
                nan.append((title, query, result))
        assert empty == [], f"queries with no data: {empty}"
        assert nan == [], f"queries answering NaN: {nan}"
