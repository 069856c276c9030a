"""Fixtures for the e2e suite: one local cluster per test run.

- ``cluster`` (package ``e2e``: like session, but stopped once the last e2e
  test of this process ends, not at the very end, while the free tests of the
  lanes of :mod:`tests.support.lanes` run): a :class:`~e2e.harness.cluster.LocalCluster`. Reuses
  a cluster already running in the same folder; one started by hand
  (``python -m e2e.harness up``) is left running, any other (this session's,
  or one leaked by a killed session) is stopped at the end: every process by
  PID, then the run fails if any process of the cluster is still alive.
- ``namespace`` (function): a fresh namespace, deleted afterwards.
- ``kube`` (package ``e2e``, as ``cluster``): a ``kubernetes.client.ApiClient`` with the admin kubeconfig.

Two sessions on one cluster folder run one after the other (see
:mod:`e2e.harness.sessionlock`); use ``E2E_CLUSTER_DIR`` and ``E2E_PORT_BASE``
to run side by side. The folder's lock is taken just before the first test that
uses this cluster (outside its timeout), not at collection: under the suite's
lanes (:mod:`tests.support.lanes`) every worker collects every test, and only
the one running the local control-plane lane may take it.

``E2E_KEEP_CLUSTER=1`` keeps a cluster this run started.

The Go build (``e2e/build.sh``) runs in the background from the end of
collection, beside the tests that need no binary, and the first e2e test waits
for it outside its timeout (:mod:`e2e.harness.background_build`).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from e2e.harness import sessionlock
from e2e.harness.cluster import LocalCluster
from e2e.harness.paths import E2E_DIR, cluster_dir
from e2e.helpers import create_namespace
from tests.support.lanes import say


def _uses_local_cluster(item) -> bool:
    # The kind tier (e2e/kind/) has its own `cluster` fixture: a kind cluster, not this one.
    path = Path(item.path)
    return (E2E_DIR in path.parents and E2E_DIR / "kind" not in path.parents
            and "cluster" in getattr(item, "fixturenames", ()))


def pytest_collection_finish(session):
    if session.config.option.collectonly or not any(_uses_local_cluster(i) for i in session.items):
        return
    if os.geteuid() != 0:
        raise pytest.UsageError("the e2e suite needs root: the node agent runs each container "
                                "in its own mount namespace (unshare --mount)")


def _hold_session_lock(config) -> None:
    """Take the cluster folder's lock for the rest of this process (once; released when it exits)."""
    if getattr(config, "_e2e_lock_fd", None) is None:
        config._e2e_lock_fd = sessionlock.acquire(cluster_dir(), on_wait=lambda m: say(config, m))


@pytest.hookimpl(hookwrapper=True, tryfirst=True)  # outside pytest-timeout's timer, which this wraps
def pytest_runtest_protocol(item, nextitem):
    if _uses_local_cluster(item):
        _hold_session_lock(item.config)  # waiting for another session here is outside any test's timeout
    yield


@pytest.fixture(scope="package")
def cluster(request):
    _hold_session_lock(request.config)  # already held when the protocol hook above took it
    c = LocalCluster()
    if not c.is_running():
        c.start()
    yield c
    # A cluster started by hand stays; one a session started (this one, or an
    # earlier session that was killed before its teardown) is stopped.
    if c.started_by_hand() or os.environ.get("E2E_KEEP_CLUSTER"):
        return
    c.stop(check=True)  # raises ClusterError naming anything still alive


@pytest.fixture(scope="package")
def kube(cluster):
    from kubernetes import config
    client = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    yield client
    client.close()


@pytest.fixture
def namespace(cluster):
    name = create_namespace(cluster, f"e2e-{uuid.uuid4().hex[:8]}")
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
