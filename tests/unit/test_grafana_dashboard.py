"""The chart's Grafana dashboard names only metrics the product exports (the controller's and the operator's
registries), and covers what issue 32 asks of it."""

from __future__ import annotations

import copy

import pytest

from tests.support import dashboard as dash


@pytest.fixture(scope="module")
def exported() -> set[str]:
    from elastic_jax.controller.goodput import GoodputLedger
    from elastic_jax.controller.metrics import ControllerMetrics
    from elastic_jax.k8s_operator import metrics as operator_metrics  # noqa: F401 - registers into REGISTRY
    from prometheus_client import REGISTRY

    controller = ControllerMetrics()
    controller.bind_ledger(GoodputLedger())
    controller.bind_status(lambda: ("Running", ["Active", "Spare"]))
    return dash.exported_names([controller.registry, REGISTRY])


def _unexported(dashboard: dict, exported: set[str]) -> list[tuple[str, str]]:
    return [(title, name) for title, expr in dash.queries(dashboard) for name in dash.metric_names(expr)
            if name not in exported]


def test_every_metric_a_panel_names_is_exported(exported):
    dashboard = dash.load()
    assert len(dash.queries(dashboard)) >= 20
    assert _unexported(dashboard, exported) == []


def test_a_panel_naming_a_metric_the_product_no_longer_exports_is_caught(exported):
    renamed = copy.deepcopy(dash.load())
    loss = next(p for p in renamed["panels"] if p["title"] == "Loss")
    loss["targets"][0]["expr"] = loss["targets"][0]["expr"].replace("elastic_jax_loss", "elastic_jax_training_loss")
    assert _unexported(renamed, exported) == [("Loss", "elastic_jax_training_loss")]
    assert dash.metric_names('x{state="elastic_jax_not_a_name"}') == set()  # (a label value is no metric)


def test_the_panels_the_issue_asks_for_are_there():
    dashboard = dash.load()
    names = set().union(*(dash.metric_names(e) for _, e in dash.queries(dashboard)))
    for wanted in ["elastic_jax_phase", "elastic_jax_step", "elastic_jax_tokens_per_second", "elastic_jax_loss",
                   "elastic_jax_active_slices", "elastic_jax_desired_slices", "elastic_jax_slices",
                   "elastic_jax_recoveries_total", "elastic_jax_recovery_seconds_sum", "elastic_jax_steps_lost_total",
                   "elastic_jax_goodput_ratio", "elastic_jax_goodput_seconds", "elastic_jax_checkpoint_committed_step",
                   "elastic_jax_checkpoint_committed_timestamp_seconds",
                   "elasticjax_operator_failure_notify_seconds_bucket", "elasticjax_operator_reconciles_total",
                   "elasticjax_operator_slice_replacements_total", "elasticjax_operator_controller_restarts_total"]:
        assert wanted in names, wanted
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"namespace", "job", "datasource"} <= variables
    for title, expr in dash.queries(dashboard):  # every job panel is one job's
        if "elastic_jax_" in expr and not title.startswith("$namespace"):
            assert 'job="$job"' in expr or title == "$job", (title, expr)


def test_namespace_all_is_the_default_and_matches_a_series_without_the_label():
    """Trial finding C4: every query filtered `namespace="$namespace"`, a label a Prometheus scraping a local
    `elastic-jax run` does not add: such a dashboard showed nothing. The namespace variable defaults to All, whose
    value matches a series without the label (Prometheus matches an absent label as ""), and every query selects
    namespaces by regex, so All means any namespace or none; one chosen namespace still selects only its own."""
    import re

    dashboard = dash.load()
    var = next(v for v in dashboard["templating"]["list"] if v["name"] == "namespace")
    assert var.get("current", {}).get("value") == "$__all", var
    everything = dash.all_value(dashboard, "namespace")
    for title, expr in dash.queries(dashboard):
        if "$namespace" not in expr:
            continue
        matchers = re.findall(r'namespace(=~|=|!=|!~)"([^"]*)"', expr)
        assert matchers and set(matchers) == {("=~", "$namespace")}, (title, expr)
        for value, matches in ((everything, ["", "team-a", "team-b"]), ("team-a", ["team-a"])):
            pattern = "$namespace".replace("$namespace", value)
            assert [ns for ns in ("", "team-a", "team-b") if re.fullmatch(pattern, ns)] == matches, (title, value)
