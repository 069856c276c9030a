"""The CRD's printer columns on a real API server (no operator): what `kubectl get ejob -o wide` prints for a
status the operator writes (`status_builder.build_status`)."""

from __future__ import annotations

from e2e.operator_fixtures import ejob_crd  # noqa: F401  (fixture)
from elastic_jax.api.status import ElasticTrainingJobStatus
from tests.support.bad_manifests import cpu_job


def _wide_row(cluster, namespace: str, name: str) -> dict[str, str]:
    """The row of `kubectl get ejob NAME -o wide` by column name (cells cut at the header's columns: an
    unset value prints as nothing)."""
    import re

    header, row = cluster.kubectl("get", "ejob", name, "-n", namespace, "-o", "wide").stdout.splitlines()[:2]
    starts = [m.start() for m in re.finditer(r"\S+", header)] + [None]
    return {header[a:b].strip(): row[a:b].strip() for a, b in zip(starts, starts[1:])}


def test_spares_column_is_a_count_zero_for_none(cluster, namespace, ejob_crd):  # noqa: F811
    """A new-user trial: `-o wide` printed `SPARES []` for a job without spares (a list column)."""
    path = f"/apis/elasticjax.dev/v1alpha1/namespaces/{namespace}/elastictrainingjobs"
    cluster.api().create(path, cpu_job("cols"))
    status = ElasticTrainingJobStatus(phase="Running", spare_slices=[], spare_count=0)
    cluster.api().merge_patch(f"{path}/cols/status", {"status": status.to_kube()})
    row = _wide_row(cluster, namespace, "cols")
    assert row["SPARES"] == "0" and row["PHASE"] == "Running", row
    status = ElasticTrainingJobStatus(phase="Running", spare_slices=[2, 3], spare_count=2)
    cluster.api().merge_patch(f"{path}/cols/status", {"status": status.to_kube()})
    assert _wide_row(cluster, namespace, "cols")["SPARES"] == "2"
    cluster.api().delete(f"{path}/cols")


def test_lost_column_counts_the_steps_lost_zero_for_none(cluster, namespace, ejob_crd):  # noqa: F811
    """Issue 11: `-o wide` shows `status.stepsLost` (steps a new controller pod did not resume) as LOST."""
    path = f"/apis/elasticjax.dev/v1alpha1/namespaces/{namespace}/elastictrainingjobs"
    cluster.api().create(path, cpu_job("lost"))
    status = ElasticTrainingJobStatus(phase="Running", steps_lost=0)
    cluster.api().merge_patch(f"{path}/lost/status", {"status": status.to_kube()})
    assert _wide_row(cluster, namespace, "lost")["LOST"] == "0"
    status = ElasticTrainingJobStatus(phase="Recovering", steps_lost=40)
    cluster.api().merge_patch(f"{path}/lost/status", {"status": status.to_kube()})
    row = _wide_row(cluster, namespace, "lost")
    assert row["LOST"] == "40" and row["PHASE"] == "Recovering", row
    cluster.api().delete(f"{path}/lost")
