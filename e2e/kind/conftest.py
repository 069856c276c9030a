"""Fixtures of the kind tier: a private Docker engine, the images built here, a kind cluster, the chart.

They are package-scoped (this folder): set up once, like session fixtures, and torn down as soon as the
last kind test ends, so neither the cluster nor the engine keeps taking CPU and memory while the rest of the
suite runs (the local control-plane tier after it in one process; the free tests on the kind lane's worker,
:mod:`tests.support.lanes`). "(session)" below means that scope.

- ``docker_engine`` (session): :func:`e2e.kind.engine.start`, stopped at the
  end by PID; started in the background from the end of collection with the
  Go-free image builds (:mod:`e2e.kind.prewarm`), so a fresh machine pays for
  them beside ``tests/`` and the Go build. Under the suite's lanes
  (:mod:`tests.support.lanes`) only the worker of the kind lane starts them;
  the fixture takes the engine before the MaxText image is built, which
  ``maxtext_image`` waits for. Skips, saying why, only where the engine cannot run (not root,
  no Debian packages): in CI (root, Debian) these tests always run.
- ``product_images`` (session): the controller, worker and operator images,
  built from their targets of images/Dockerfile on the offline Debian base (:mod:`e2e.kind.images`).
- ``maxtext_image`` (session): the ``controller-maxtext`` target on a Python 3.12 base made here
  from this machine's CPython 3.12 (:func:`e2e.kind.images.python312_base`); skips, saying why, where none is.
- ``kind_cluster`` (session, from :mod:`e2e.kind.cluster_fixtures`): a real kind
  cluster from a node image built here.
- ``elastic_jax`` (session): the chart installed in ``elastic-jax-system``
  with the operator image built here, the images loaded into every node.
- ``cluster`` (session): the kind cluster as the operator tests drive it
  (:class:`e2e.kind.target.KindTarget`; overrides the local control plane's
  fixture of the same name for the tests in this folder).
- ``namespace`` (function): a fresh namespace enforcing PodSecurity
  ``restricted``, deleted afterwards.
- ``operator`` (function): the chart's operator
  (:class:`e2e.kind.target.ChartOperator`), installed again if a test
  uninstalled it (``test_helm_install.py`` does; it runs last in this folder,
  see ``pytest_collection_modifyitems``, so that nothing after it pays for
  that), Ready before the test starts. Every test that needs the session's
  operator asks for it; ``module_operator`` is the same for module- and class-scoped fixtures.
- ``gcs`` (function): a GCS emulator in the test's namespace (:mod:`e2e.kind.gcs`).

``E2E_KIND_SHARED_ENGINE=1`` uses the engine ``python -m e2e.kind.engine start``
started (and leaves it running): sessions side by side share its image store,
each with its own ``E2E_KIND_CLUSTER`` name. They must test the same source
tree: the product images are tagged by version (``ghcr.io/elastic-jax/*:0.1.0``),
so the last session to build them sets what every session loads.

``E2E_KIND_KEEP=1`` keeps the cluster and engine for a look afterwards
(``python -m e2e.kind.engine env`` is not enough then: the engine's socket is
printed in the test log).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from e2e.helpers import wait_for
from e2e.kind import demo
from e2e.kind import engine as engine_mod
from e2e.kind import gcs as gcs_mod
from e2e.kind import images, target
from e2e.kind import prewarm as prewarm_mod
from tests.support import lanes

# The cluster fixture of e2e/kind/cluster_fixtures.py (pytest allows `pytest_plugins`
# in the root conftest only).
from e2e.kind.cluster_fixtures import kind_cluster  # noqa: E402,F401


def _say(request, message: str) -> None:
    _say_config(request.config, message)


_prewarm: prewarm_mod.Prewarm | None = None


def pytest_collection_finish(session):
    """Start the engine and the Go-free image builds in the background (:mod:`e2e.kind.prewarm`)."""
    global _prewarm
    kind_dir = Path(__file__).parent
    if (session.config.option.collectonly or os.environ.get("E2E_KIND_SHARED_ENGINE")
            or not lanes.runs_lane(session.config, lanes.KIND)  # another worker runs the kind tests
            or not any(kind_dir in Path(i.path).parents for i in session.items)
            or engine_mod.why_unavailable()):
        return
    _prewarm = prewarm_mod.Prewarm(Path(__file__).parents[1] / ".build" / "kind" / "prewarm.log")
    _say_config(session.config, f"kind: engine and images start in the background (log {_prewarm.log_path})")


def pytest_collection_modifyitems(session, config, items):
    """Reorders this folder's tests only. The tests of the MaxText image run after the others: the prewarm
    builds that image after the cluster's images (:mod:`e2e.kind.prewarm`), so the cluster's tests need not
    wait for it. ``test_helm_install.py`` runs last of all: it uninstalls the session's release (one
    operator acting), and every later test's ``operator`` fixture would install it again (image load,
    helm --wait)."""
    kind_dir = Path(__file__).parent
    slots = [n for n, item in enumerate(items) if kind_dir in Path(item.path).parents]
    kind = [items[n] for n in slots]
    helm = [item for item in kind if Path(item.path).name == "test_helm_install.py"]
    waits = [item for item in kind if item not in helm and "maxtext_image" in getattr(item, "fixturenames", ())]
    ordered = [item for item in kind if item not in helm and item not in waits] + waits + helm
    # Only this folder's places are reordered: every other item keeps its own.
    for n, item in zip(slots, ordered):
        items[n] = item


def pytest_sessionfinish(session, exitstatus):
    if _prewarm is not None:
        # Interrupted (Ctrl-C, SIGTERM): stop its engine by PID now, not after the builds.
        _prewarm.close(interrupted=exitstatus == pytest.ExitCode.INTERRUPTED)


def _say_config(config, message: str) -> None:
    lanes.say(config, message)


@pytest.fixture(scope="package")
def docker_engine(request):
    reason = engine_mod.why_unavailable()
    if reason:
        pytest.skip(reason)
    if os.environ.get("E2E_KIND_SHARED_ENGINE"):
        yield engine_mod.shared()  # started by hand; it stays
        return
    if _prewarm is not None:
        engine = _prewarm.take()
        _say(request, f"kind: engine {engine.pid} and images from the background start "
                      f"(ready for the cluster {_prewarm.handover_seconds:.0f}s after its start; the MaxText image "
                      f"goes on; log {_prewarm.log_path})")
    else:
        engine = engine_mod.start(log=lambda m: _say(request, m))
    yield engine
    if _prewarm is not None:
        _prewarm.cancel()  # no step after this; one in flight (MaxText, if no test waited for it) ends with the engine
    if os.environ.get("E2E_KIND_KEEP"):
        _say(request, f"kind: E2E_KIND_KEEP=1: engine left running: export DOCKER_HOST={engine.host}")
        return
    engine_mod.stop(engine, log=lambda m: _say(request, m))
    if _prewarm is not None:
        _prewarm.wait_done(prewarm_mod.JOIN_AFTER_STOP_S)


@pytest.fixture(scope="package")
def product_images(request, docker_engine):
    base = images.python_base(docker_engine, log=lambda m: _say(request, m))
    built = images.build_project_images(docker_engine, base.name, log=lambda m: _say(request, m))
    return {b.name: b for b in built}


@pytest.fixture(scope="package")
def maxtext_image(request, docker_engine) -> str:
    """The ``controller-maxtext`` image (Python 3.12, MaxText), built here on a copy of this machine's CPython 3.12."""
    if _prewarm is not None:
        _prewarm.wait_done()  # the prewarm's last step builds this image: the call below then finds it cached
    prefix = images.find_python312()
    if prefix is None:
        pytest.skip("no CPython 3.12 on this machine for the MaxText image's base (set E2E_PYTHON312 to a "
                    "python3.12 executable built for Debian bookworm)")
    return images.build_maxtext_image(docker_engine, prefix, log=lambda m: _say(request, m)).name


@pytest.fixture(scope="package")
def elastic_jax(request, kind_cluster, product_images):
    """The chart, installed with the operator image built here (never pulled: pullPolicy Never)."""
    demo.install_chart(kind_cluster, list(product_images), log=lambda m: _say(request, m))
    return kind_cluster


@pytest.fixture(scope="package")
def cluster(elastic_jax) -> target.KindTarget:
    return target.KindTarget(elastic_jax)


@pytest.fixture
def namespace(cluster):
    name = demo.restricted_namespace(cluster.kind, "e2e")
    # The ServiceAccount controller creates "default" shortly after; pods need it.
    wait_for(lambda: cluster.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode == 0,
             timeout_s=60, what=f"default ServiceAccount in {name}")
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def _chart_operator(request, cluster, product_images) -> target.ChartOperator:
    op = target.ChartOperator(cluster)
    if not op.pods():  # a test before this one uninstalled the release
        demo.install_chart(cluster.kind, list(product_images), log=lambda m: _say(request, m))
    target.wait_operator_ready(op)
    return op


@pytest.fixture
def operator(request, cluster, product_images) -> target.ChartOperator:
    return _chart_operator(request, cluster, product_images)


@pytest.fixture(scope="module")
def module_operator(request, cluster, product_images) -> target.ChartOperator:
    """``operator`` for a module- or class-scoped fixture (one job that several tests read)."""
    return _chart_operator(request, cluster, product_images)


@pytest.fixture
def ejob_crd(elastic_jax):
    """The CRD, as the chart installed it."""
    return demo.REPO_ROOT / "crds" / "elastictrainingjobs.yaml"


@pytest.fixture(scope="package")
def gcs_image(docker_engine, product_images) -> str:
    return gcs_mod.image(docker_engine, images.python_base(docker_engine).name)


@pytest.fixture
def gcs(cluster, namespace, gcs_image) -> gcs_mod.InClusterGcs:
    cluster.kind.load_images([gcs_image], nodes=cluster.kind.workers())
    return gcs_mod.deploy(cluster, namespace, gcs_image)
