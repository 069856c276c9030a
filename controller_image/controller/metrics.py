"""Prometheus metrics of the controller (served at `GET /metrics`).

Names follow Prometheus conventions: base units (seconds, bytes), `_total`
for counters. One registry per controller, so tests can run several.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

PREFIX = "elastic_jax"
RECOVERY_CAUSES = ("slice_down", "step_deadline", "draining", "scale_up")
"""Every cause an elastic event can have: `elastic.errors.SliceDownError.cause`, and `scale_up` (a rejoin)."""


class ControllerMetrics:
    """All controller metrics in one registry.

    Attributes (Prometheus name in brackets):
      step: completed optimizer steps [elastic_jax_step].
      step_seconds: wall seconds per completed step [elastic_jax_step_seconds].
      tokens_per_second: throughput of the last logged window [elastic_jax_tokens_per_second].
      loss: loss of the last completed step [elastic_jax_loss]; NaN before this controller's first step.
      active_slices / desired_slices: slice counts [elastic_jax_active_slices, elastic_jax_desired_slices].
      recoveries: recoveries by cause [elastic_jax_recoveries_total{cause}].
      recovery_seconds: failure to next completed step [elastic_jax_recovery_seconds].
      steps_lost: steps redone or lost to recoveries [elastic_jax_steps_lost_total].
      checkpoint_save_seconds / checkpoint_restore_seconds: Orbax timings.
      checkpoint_committed_step: last committed checkpoint step.
      checkpoint_committed_time: when it committed, Unix seconds [elastic_jax_checkpoint_committed_timestamp_seconds]
        (`time() - it` is the checkpoint's age: what a failure now would cost).
      goodput: the goodput ledger's ratio [elastic_jax_goodput_ratio] (controller/goodput.py).
      goodput seconds per category [elastic_jax_goodput_seconds{category}], read from the ledger at
        scrape time once `bind_ledger` was called. A gauge, not a counter: seconds of steps later lost
        move from productive to recovering, so a category can shrink.
      phase and slices, read from the runtime at scrape time once `bind_status` was called:
        [elastic_jax_phase{phase}] 1 for the phase `GET /v1/status` shows, 0 for every other `ControllerPhase`;
        [elastic_jax_slices{state}] slices per `SliceView` state (Active, Ready, Warming, Spare, Down, ...;
        every state listed, 0 when none).
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.step = Gauge(f"{PREFIX}_step", "Completed optimizer steps.", registry=r)
        self.step_seconds = Histogram(
            f"{PREFIX}_step_seconds",
            "Wall seconds per completed training step.",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        self.tokens_per_second = Gauge(f"{PREFIX}_tokens_per_second", "Training throughput in tokens per second.", registry=r)
        self.loss = Gauge(f"{PREFIX}_loss", "Loss of the last completed step (NaN before this controller's first).",
                          registry=r)
        self.loss.set(float("nan"))  # (no step, no loss: 0 drew a flat line into the curve; a trial read it as one)
        self.active_slices = Gauge(f"{PREFIX}_active_slices", "Slices in the training mesh.", registry=r)
        self.desired_slices = Gauge(f"{PREFIX}_desired_slices", "Slices the job wants.", registry=r)
        self.recoveries = Counter(f"{PREFIX}_recoveries", "Elastic recoveries by cause.", ["cause"], registry=r)
        for cause in RECOVERY_CAUSES:  # each series from the start, at 0: a healthy job's panel reads 0, not "No data"
            self.recoveries.labels(cause=cause)
        self.recovery_seconds = Histogram(
            f"{PREFIX}_recovery_seconds",
            "Seconds from a slice failure (or scale-up signal) to the next completed step.",
            buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120),
            registry=r,
        )
        self.steps_lost = Counter(f"{PREFIX}_steps_lost", "Training steps lost to failures.", registry=r)
        self.checkpoint_save_seconds = Histogram(
            f"{PREFIX}_checkpoint_save_seconds", "Seconds the training loop was blocked by a checkpoint save.", registry=r
        )
        self.checkpoint_restore_seconds = Histogram(
            f"{PREFIX}_checkpoint_restore_seconds", "Seconds to restore a checkpoint.", registry=r
        )
        self.checkpoint_committed_step = Gauge(
            f"{PREFIX}_checkpoint_committed_step", "Step of the newest committed checkpoint.", registry=r
        )
        self.checkpoint_committed_time = Gauge(
            f"{PREFIX}_checkpoint_committed_timestamp_seconds", "Unix time the newest committed checkpoint committed.",
            registry=r)
        self.goodput = Gauge(f"{PREFIX}_goodput_ratio", "(productive + reduced x active/desired) seconds / wall "
                             "seconds of this controller (goodput ledger).", registry=r)

    def bind_ledger(self, ledger) -> None:
        """Exposes `ledger.seconds()` as `elastic_jax_goodput_seconds{category}` (a `goodput.GoodputLedger`)."""

        class _LedgerCollector:
            def collect(self):
                family = GaugeMetricFamily(f"{PREFIX}_goodput_seconds", "Wall seconds of this controller by goodput "
                                           "category (starting, restoring, productive, reduced, recovering, "
                                           "waiting, checkpointing).", labels=["category"])
                for category, seconds in ledger.seconds().items():
                    family.add_metric([category], seconds)
                yield family

        self.registry.register(_LedgerCollector())

    def bind_status(self, phase_and_slices) -> None:
        """Exposes `elastic_jax_phase{phase}` and `elastic_jax_slices{state}` from `phase_and_slices()`, called at
        each scrape: `(phase, states)`, the live `ControllerPhase` and the `SliceView` state of every slice."""
        from typing import get_args

        from elastic_jax.api.control import ControllerPhase, SliceView

        class _StatusCollector:
            def collect(self):
                phase, states = phase_and_slices()
                phases = GaugeMetricFamily(f"{PREFIX}_phase", "1 for the controller's phase (GET /v1/status), 0 for "
                                           "the others.", labels=["phase"])
                for name in get_args(ControllerPhase):
                    phases.add_metric([name], 1.0 if name == phase else 0.0)
                yield phases
                slices = GaugeMetricFamily(f"{PREFIX}_slices", "Slices by state (Active: in the mesh; Spare: hot "
                                           "spares; Ready/Warming: joining; Down, Draining).", labels=["state"])
                for state in get_args(SliceView):
                    slices.add_metric([state], float(sum(1 for s in states if s == state)))
                yield slices

        self.registry.register(_StatusCollector())

    def exposition(self) -> bytes:
        """The registry in Prometheus text format."""
        return generate_latest(self.registry)
