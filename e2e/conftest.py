"""Fixtures for the e2e suite: one local cluster per test run.

- ``cluster`` (session): a :class:`~e2e.harness.cluster.LocalCluster`. Reuses
  a cluster already running in the same folder (started with ``python -m
  e2e.harness up``) and then leaves it running; otherwise builds if needed,
  starts one, and at the end stops every process it started by PID and fails
  the run if any process of the cluster is still alive.
- ``namespace`` (function): a fresh namespace, deleted afterwards.
- ``kube`` (session): a ``kubernetes.client.ApiClient`` with the admin kubeconfig.

``E2E_KEEP_CLUSTER=1`` keeps a cluster this run started.
"""

from __future__ import annotations

import os
import time
import uuid

import pytest

from e2e.harness.cluster import LocalCluster


@pytest.fixture(scope="session")
def cluster():
    c = LocalCluster()
    reused = c.is_running()
    if not reused:
        c.start()
    yield c
    if reused or os.environ.get("E2E_KEEP_CLUSTER"):
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
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    # The ServiceAccount controller creates "default" shortly after; pods need it.
    deadline = time.monotonic() + 30
    while cluster.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode != 0:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no default ServiceAccount in {name}")
        time.sleep(0.2)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
