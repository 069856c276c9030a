"""Fixtures of the kind tier: a private Docker engine, the images built here, a kind cluster, the chart.

- ``docker_engine`` (session): :func:`e2e.kind.engine.start`, stopped at the
  end by PID. Skips, saying why, only where the engine cannot run (not root,
  no Debian packages): in CI (root, Debian) these tests always run.
- ``product_images`` (session): the controller, worker and operator images,
  built from their Dockerfiles on the offline Debian base (:mod:`e2e.kind.images`).
- ``kind_cluster`` (session, from :mod:`e2e.kind.cluster_fixtures`): a real kind
  cluster from a node image built here.
- ``elastic_jax`` (session): the chart installed in ``elastic-jax-system``
  with the operator image built here, the images loaded into every node.

``E2E_KIND_SHARED_ENGINE=1`` uses the engine ``python -m e2e.kind.engine start``
started (and leaves it running): sessions side by side share its image store,
each with its own ``E2E_KIND_CLUSTER`` name.

``E2E_KIND_KEEP=1`` keeps the cluster and engine for a look afterwards
(``python -m e2e.kind.engine env`` is not enough then: the engine's socket is
printed in the test log).
"""

from __future__ import annotations

import os

import pytest

from e2e.kind import engine as engine_mod
from e2e.kind import images

# Fixtures and the post-collection Go build of e2e/kind/cluster_fixtures.py (pytest
# allows `pytest_plugins` in the root conftest only).
from e2e.kind.cluster_fixtures import kind_cluster, pytest_collection_finish  # noqa: E402,F401


def _say(request, message: str) -> None:
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter:
        reporter.write_line(message)


@pytest.fixture(scope="session")
def docker_engine(request):
    reason = engine_mod.why_unavailable()
    if reason:
        pytest.skip(reason)
    if os.environ.get("E2E_KIND_SHARED_ENGINE"):
        yield engine_mod.shared()  # started by hand; it stays
        return
    engine = engine_mod.start(log=lambda m: _say(request, m))
    yield engine
    if os.environ.get("E2E_KIND_KEEP"):
        _say(request, f"kind: E2E_KIND_KEEP=1: engine left running: export DOCKER_HOST={engine.host}")
        return
    engine_mod.stop(engine, log=lambda m: _say(request, m))


@pytest.fixture(scope="session")
def product_images(request, docker_engine):
    base = images.python_base(docker_engine, log=lambda m: _say(request, m))
    built = images.build_project_images(docker_engine, base.name, log=lambda m: _say(request, m))
    return {b.name: b for b in built}


@pytest.fixture(scope="session")
def elastic_jax(request, kind_cluster, product_images):
    """The chart, installed with the operator image built here (never pulled: pullPolicy Never)."""
    from e2e.kind import demo
    demo.install_chart(kind_cluster, list(product_images), log=lambda m: _say(request, m))
    return kind_cluster
