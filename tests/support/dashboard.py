"""The chart's Grafana dashboard (helm/elastic-jax/dashboards/elastic-jax.json): its queries and the metric names
they read, for the tests that check them against the product's registries and a real Prometheus."""

from __future__ import annotations

import json
import re
from pathlib import Path

DASHBOARD = Path(__file__).resolve().parents[2] / "helm" / "elastic-jax" / "dashboards" / "elastic-jax.json"
# Our metrics: the controller's elastic_jax_*, the operator's elasticjax_operator_*.
METRIC_NAME = re.compile(r"\b(?:elastic_jax|elasticjax_operator)_[a-zA-Z0-9_]+\b")


def load(path: Path = DASHBOARD) -> dict:
    """The dashboard JSON."""
    return json.loads(path.read_text())


def queries(dashboard: dict) -> list[tuple[str, str]]:
    """`(panel title, expr)` of every panel target, then of every query variable (title `$name`)."""
    found = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            found.append((panel["title"], target["expr"]))
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            found.append((f"${var['name']}", var["definition"]))
    return found


def metric_names(expr: str) -> set[str]:
    """The names of our metrics `expr` reads (label values such as `state="Spare"` are not names)."""
    without_strings = re.sub(r'"[^"]*"', '""', expr)
    return set(METRIC_NAME.findall(without_strings))


def exported_names(registries) -> set[str]:
    """Every series name the `registries` (prometheus_client `CollectorRegistry`s) export: a gauge its name, a
    counter `_total`, a histogram `_bucket`, `_sum`, `_count` (read from the metric families, so a labelled metric
    with no child yet counts too)."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    names = set()
    for registry in registries:
        for family in registry.collect():
            names.update(family.name + s for s in suffixes.get(family.type, ("",)))
    return names


def substituted(expr: str, namespace: str, job: str, rate_interval: str = "1m") -> str:
    """`expr` with the dashboard's variables as Grafana substitutes them for one job."""
    return (expr.replace("$namespace", namespace).replace("$job", job)
            .replace("$__rate_interval", rate_interval).replace("$__range", rate_interval))


def all_value(dashboard: dict, name: str) -> str:
    """What Grafana substitutes for variable `name` when "All" is chosen (its `allValue`).

    Raises:
      KeyError: the variable has no "All" option with an explicit value.
    """
    var = next(v for v in dashboard["templating"]["list"] if v["name"] == name)
    if not var.get("includeAll"):
        raise KeyError(f"${name} has no All option")
    return var["allValue"]
