"""The operator's Prometheus metrics (served by `elastic-jax-operator --metrics-port`)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

RECONCILES = Counter("elasticjax_operator_reconciles_total",
                     "Timer passes per job: ok, error, or quiet (skipped: nothing it reads moved).", ["result"])
for _result in ("ok", "error", "quiet"):  # every result exported from the start (at 0): a dashboard's error rate reads 0, not "no data"
    RECONCILES.labels(_result)
SLICE_REPLACEMENTS = Counter("elasticjax_operator_slice_replacements_total", "Slices that went Down and were replaced.")
CONTROLLER_RESTARTS = Counter("elasticjax_operator_controller_restarts_total", "Controller pods recreated.")
NODE_LOST_PODS = Counter(
    "elasticjax_operator_node_lost_pods_total",
    "Pods force-deleted (grace 0) because their node was not Ready for longer than --node-lost-seconds.", ["role"])
JOBS_CLAIMED_ELSEWHERE = Gauge(
    "elasticjax_operator_jobs_claimed_elsewhere",
    "Jobs this operator sees but leaves alone: another operator (another release) claimed them.")
NOTIFICATIONS = Counter(
    "elasticjax_operator_notifications_total",
    "Slice reports sent to controllers; result ok, error, or starting (connection refused before this "
    "controller incarnation first answered: it is still starting, retried at the next pass).",
    ["state", "result"])
NOTIFY_SECONDS = Histogram(
    "elasticjax_operator_failure_notify_seconds",
    "Seconds from the pod event of a worker pod failure (as kopf hands it to the operator, before any "
    "handler thread) to the controller acknowledging Down.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
)
GOODPUT_SECONDS = Counter(
    "elasticjax_operator_goodput_seconds_total",
    "Wall seconds the jobs' controllers booked, by goodput category, each second once in the category it was "
    "first booked in (status.goodput.seconds as it grows; carried across controller pods and operator restarts). "
    "The categories add up to status.goodput.wallSeconds. A counter cannot go down: steps a new controller pod "
    "did not resume stay productive/reduced here while status.goodput re-books them as recovering: "
    "elasticjax_operator_goodput_rebooked_seconds_total counts that move.", ["category"])
GOODPUT_REBOOKED_SECONDS = Counter(
    "elasticjax_operator_goodput_rebooked_seconds_total",
    "Seconds status.goodput moved out of `category` (productive or reduced) into recovering after they were "
    "counted in elasticjax_operator_goodput_seconds_total: the training seconds of steps a new controller pod "
    "did not resume (status.stepsLost). So status.goodput's productive is goodput_seconds_total{category="
    "\"productive\"} minus this {category=\"productive\"}, and its recovering is goodput_seconds_total"
    "{category=\"recovering\"} plus this summed over categories.", ["category"])
STEPS_LOST = Counter(
    "elasticjax_operator_steps_lost_total",
    "Steps the jobs trained and then lost (status.stepsLost): a new controller pod resumed from an older step, "
    "or a controller redid steps after restoring lost state. Counted once per loss, as status.stepsLost grows "
    "over the status written before (so an operator restart does not count a loss again).")
