"""`elastic_jax_phase{phase}` and `elastic_jax_slices{state}`, read from the runtime at each scrape (the dashboard's
phase and spares panels)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from elastic_jax.controller.metrics import ControllerMetrics


def _samples(metrics: ControllerMetrics, name: str) -> dict[str, float]:
    (family,) = [f for f in text_string_to_metric_families(metrics.exposition().decode()) if f.name == name]
    return {next(iter(s.labels.values())): s.value for s in family.samples}


def test_phase_and_slices_are_read_at_each_scrape():
    now = {"phase": "Running", "states": ["Active", "Active", "Spare"]}
    metrics = ControllerMetrics()
    metrics.bind_status(lambda: (now["phase"], now["states"]))
    phases = _samples(metrics, "elastic_jax_phase")
    assert phases["Running"] == 1 and sum(phases.values()) == 1 and "Interrupted" in phases
    assert _samples(metrics, "elastic_jax_slices") == {"Active": 2, "Ready": 0, "Warming": 0, "Spare": 1, "Down": 0,
                                                       "Draining": 0, "Unknown": 0}
    now.update(phase="Recovering", states=["Active", "Down", "Spare"])
    assert _samples(metrics, "elastic_jax_phase")["Recovering"] == 1
    assert _samples(metrics, "elastic_jax_slices")["Down"] == 1


def test_every_recovery_cause_has_a_series_at_zero_before_the_first_recovery():
    """A new user's trial: `elastic_jax_recoveries_total` had no series until the first recovery, so the
    dashboard's "recoveries by cause" read "No data" on a healthy job."""
    metrics = ControllerMetrics()
    samples = {s.labels["cause"]: s.value
               for f in text_string_to_metric_families(metrics.exposition().decode()) if f.name == "elastic_jax_recoveries"
               for s in f.samples if s.name == "elastic_jax_recoveries_total"}
    assert samples == {"slice_down": 0, "step_deadline": 0, "draining": 0, "scale_up": 0}


def test_the_loss_is_nan_until_a_step_sets_it():
    """A trial: the dashboard's Loss panel drew 0 for the ~25 s before the first step (the gauge's start value),
    a flat line into the curve. No step, no loss: NaN, which Prometheus keeps and Grafana leaves as a gap."""
    import math

    metrics = ControllerMetrics()
    (family,) = [f for f in text_string_to_metric_families(metrics.exposition().decode()) if f.name == "elastic_jax_loss"]
    assert math.isnan(family.samples[0].value)
    metrics.loss.set(2.5)
    (family,) = [f for f in text_string_to_metric_families(metrics.exposition().decode()) if f.name == "elastic_jax_loss"]
    assert family.samples[0].value == 2.5
