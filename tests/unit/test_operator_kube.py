"""`kube.unless_absent`: the one rule for a read or delete of an object that may be gone."""

from __future__ import annotations

import pytest
from kubernetes.client.rest import ApiException

from elastic_jax.k8s_operator.kube import unless_absent


def _refuse(status: int):
    def call():
        raise ApiException(status=status, reason="refused")
    return call


def test_an_absent_object_reads_as_none_and_its_delete_is_done():
    assert unless_absent(_refuse(404)) is None
    assert unless_absent(lambda: {"metadata": {}}) == {"metadata": {}}


@pytest.mark.parametrize("status", [403, 409, 500])
def test_any_other_refusal_raises(status):
    with pytest.raises(ApiException) as e:
        unless_absent(_refuse(status))
    assert e.value.status == status


def test_kubes_reads_and_deletes_of_a_gone_object_find_nothing_and_raise_nothing():
    """Every read and delete of `Kube` goes through it (they had six copies of the 404 branch)."""
    from elastic_jax.k8s_operator.kube import Kube

    class Gone:
        def __getattr__(self, name):
            return lambda *a, **k: _refuse(404)()

    kube = Kube.__new__(Kube)
    kube.core = kube.custom = kube.batch = kube.networking = Gone()
    assert kube.read_manifest("ns", "j-manifest", "uid") is None
    assert kube.owners("ns", "JobSet", "j-slice-0") is None and kube.owners("ns", "Pod", "j-controller-0") is None
    assert kube.owners("ns", "NetworkPolicy", "j-controller-ingress") is None
    assert kube.job_uid_if_owned("ns", "j-slice-0-worker-0", "js-uid") is None
    kube.delete_pod("ns", "p"), kube.delete_jobset("ns", "j-slice-0"), kube.delete_job("ns", "j")
