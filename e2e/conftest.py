"""Fixtures for the e2e suite: one local cluster per test run.

- ``cluster`` (session): a :class:`~e2e.harness.cluster.LocalCluster`. Reuses
  a cluster already running in the same folder; one started by hand
  (``python -m e2e.harness up``) is left running, any other (this session's,
  or one leaked by a killed session) is stopped at the end: every process by
  PID, then the run fails if any process of the cluster is still alive.
- ``namespace`` (function): a fresh namespace, deleted afterwards.
- ``kube`` (session): a ``kubernetes.client.ApiClient`` with the admin kubeconfig.

Two sessions on one cluster folder run one after the other (see
:mod:`e2e.harness.sessionlock`); use ``E2E_CLUSTER_DIR`` and ``E2E_PORT_BASE``
to run side by side.

``E2E_KEEP_CLUSTER=1`` keeps a cluster this run started.

The Go build (``e2e/build.sh``) runs in the background from the end of
collection, beside the tests that need no binary, and the first e2e test waits
for it outside its timeout (:mod:`e2e.harness.background_build`).
"""

from __future__ import annotations

import os
import uuid

import pytest

from e2e.harness import sessionlock
from e2e.harness.cluster import LocalCluster
from e2e.harness.paths import E2E_DIR, cluster_dir
from e2e.helpers import create_namespace


def pytest_collection_finish(session):
    # The kind tier (e2e/kind/) has its own `cluster` fixture: a kind cluster, not this one.
    kind_dir = E2E_DIR / "kind"
    needs_cluster = any(E2E_DIR in item.path.parents and kind_dir not in item.path.parents
                        and "cluster" in getattr(item, "fixturenames", ()) for item in session.items)
    if session.config.option.collectonly or not needs_cluster:
        return
    if os.geteuid() != 0:
        raise pytest.UsageError("the e2e suite needs root: the node agent runs each container "
                                "in its own mount namespace (unshare --mount)")
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    # Held until this process exits; waiting here is outside any test's timeout.
    session.config._e2e_lock_fd = sessionlock.acquire(
        cluster_dir(), on_wait=reporter.write_line if reporter else None)


@pytest.fixture(scope="session")
def cluster():
    c = LocalCluster()
    if not c.is_running():
        c.start()
    yield c
    # A cluster started by hand stays; one a session started (this one, or an
    # earlier session that was killed before its teardown) is stopped.
    if c.started_by_hand() or os.environ.get("E2E_KEEP_CLUSTER"):
        return
    c.stop(check=True)  # raises ClusterError naming anything still alive


@pytest.fixture(scope="session")
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
