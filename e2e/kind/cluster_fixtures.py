"""The ``kind_cluster`` fixture: one kind cluster per test session (package-scoped: deleted after the last kind test) (:mod:`e2e.kind.cluster`).

Built and created on first use (the node image is cached in the engine's image
store, so later sessions only pay for ``kind create cluster``), deleted at the
end by name: its containers, their volumes, its network and its state folder.
``E2E_KIND_KEEP=1`` keeps it (the kubeconfig path is printed) and reuses one
an earlier such session kept;
``E2E_KIND_CLUSTER`` names it (default ``elastic-jax``).

The Go build (``e2e/build.sh``: about half an hour on a fresh machine) runs in
the background from the end of collection; the first test here waits for it
outside its timeout (:mod:`e2e.harness.background_build`).
"""

from __future__ import annotations

import os

import pytest

from e2e.kind import cluster as kind
from e2e.kind import engine as engine_mod
from e2e.kind.nodeimage import build as nodeimage


def _say(config, message: str) -> None:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter:
        reporter.write_line(message)


@pytest.fixture(scope="package")  # e2e/kind: torn down after its last test (conftest.py)
def kind_cluster(request, docker_engine, product_images) -> kind.KindCluster:
    name = os.environ.get("E2E_KIND_CLUSTER", kind.DEFAULT_NAME)
    # A cluster an earlier E2E_KIND_KEEP=1 session left is reused by the next one that keeps it.
    cluster = kind.attach(docker_engine, name) if os.environ.get("E2E_KIND_KEEP") else None
    if cluster is not None:
        _say(request.config, f"kind: E2E_KIND_KEEP=1: reusing running cluster {name}")
    else:
        # The product images go into the workers while the cluster is made and its first tests run
        # (the chart's install then finds them there): kind.ImagePreload.
        cluster = kind.create(docker_engine, name, log=lambda m: _say(request.config, m),
                              preload=list(product_images))
    yield cluster
    if cluster.preload is not None:  # no test loaded the images: stop the copy before the cluster goes
        cluster.preload.cancel()
    if os.environ.get("E2E_KIND_KEEP"):
        _say(request.config, f"kind: E2E_KIND_KEEP=1: cluster {name} left running: "
                             f"export KUBECONFIG={cluster.kubeconfig}")
        return
    cluster.delete(log=lambda m: _say(request.config, m))
