"""A hung API server fails each of the operator's API calls instead of holding the reconcile pass.

The server is a real loopback socket that accepts connections and never answers: the kernel completes
the TCP handshake and the client's request is read by no one, as with an API server stuck behind a
live connection. Without `_request_timeout` every call below waits until the connection breaks (the
test's own timeout ends it).
"""

from __future__ import annotations

import pytest
from kubernetes.client import ApiClient, Configuration
from urllib3.exceptions import MaxRetryError, ReadTimeoutError

from elastic_jax.k8s_operator import kube as kube_module
from elastic_jax.k8s_operator.kube import Kube
from tests.support.silent_server import SilentServer


@pytest.fixture
def hung_kube():
    server = SilentServer()
    client = ApiClient(Configuration(host=f"http://127.0.0.1:{server.port}"))
    try:
        yield Kube(client, request_timeout_s=0.2), server
    finally:
        client.close()
        server.stop()


POD = {"kind": "Pod", "metadata": {"name": "p"}}
JOBSET = {"kind": "JobSet", "metadata": {"name": "j-slice-0"}}
CALLS = {
    "create pod": lambda k: k.create("ns", POD),
    "create jobset": lambda k: k.create("ns", JOBSET),
    "delete_pod": lambda k: k.delete_pod("ns", "p"),
    "delete_jobset": lambda k: k.delete_jobset("ns", "j-slice-0"),
    "read_manifest": lambda k: k.read_manifest("ns", "j-manifest", "uid"),
    "owners configmap": lambda k: k.owners("ns", "ConfigMap", "j-manifest"),
    "owners jobset": lambda k: k.owners("ns", "JobSet", "j-slice-0"),
    "job_uid_if_owned": lambda k: k.job_uid_if_owned("ns", "j-slice-0-workers-0", "uid"),
    "warning_events": lambda k: k.warning_events("ns", "JobSet", "j-slice-0", "uid"),
    "claim": lambda k: k.claim("ns", "j", "1", "elasticjax.dev/operator", "me"),
    "delete_job": lambda k: k.delete_job("ns", "j"),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_hung_api_server_fails_the_call_instead_of_holding_it(hung_kube, call):
    kube, server = hung_kube
    with pytest.raises((ReadTimeoutError, MaxRetryError)) as raised:
        CALLS[call](kube)
    error = raised.value
    # a read timeout (a GET retried by the client ends as MaxRetryError wrapping it), not a refused connection
    assert isinstance(error, ReadTimeoutError) or isinstance(error.reason, ReadTimeoutError), repr(error)
    assert server.accepted, "the request never reached the silent server"


def test_the_default_timeout_is_one_bounded_constant():
    assert 0 < kube_module.REQUEST_TIMEOUT_S <= 30
    assert Kube._timeout == {"_request_timeout": kube_module.REQUEST_TIMEOUT_S}
