"""What both kwok operator tests (`e2e/test_kwok_scale.py`, `e2e/test_kwok_pathways.py`) set up and check: kwok
and the operator on the local control plane around a namespace of the test's own (the `kwok_operator`
fixture; a test module imports it with `ejob_crd` and `operator_kubeconfig`), and a worker failed the way a
kubelet reports it, heard by its controller only.

Skips, saying why, when kwok is not built (it is not part of e2e/build.sh).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from e2e.helpers import wait_for
from e2e.kwok import KwokProcess, binary
from e2e.kwok import fleet
# (the fixtures `kwok_operator` needs, re-exported: a test module imports them with it)
from e2e.operator_fixtures import OperatorProcess, ejob_crd, operator_kubeconfig  # noqa: F401

from elastic_jax.api.client import ControlClient
from elastic_jax.local.processes import free_port


def require_kwok() -> None:
    """Skips the test, saying why, when the kwok binary is not built."""
    if not binary().exists():
        pytest.skip(f"{binary()} not built: run e2e/build_kwok.sh")


@contextlib.contextmanager
def kwok_and_operator(cluster, operator_kubeconfig: Path, tmp_path: Path, namespace: str, *,
                      nodes_ready: Callable[[], bool], what: str, timeout_s: float,
                      after_ready: Callable[[], None] = lambda: None) -> Iterator[tuple[KwokProcess, OperatorProcess]]:
    """Starts kwok, waits (up to `timeout_s` seconds) until `nodes_ready()` (`what` names it in a timeout), runs
    `after_ready`, creates `namespace`, starts the operator; yields `(kwok, operator)`. On the way out stops
    the operator, deletes the namespace without waiting (the controller pods' grace; its name is this run's
    own) and stops kwok; the nodes are the caller's to remove.

    Raises:
      TimeoutError (from `wait_for`): the nodes did not turn Ready; kwok's log is in the message.
    """
    kwok = KwokProcess(cluster.kubeconfig, tmp_path / "kwok.log", free_port())
    kwok.start()
    op = OperatorProcess(operator_kubeconfig, tmp_path / "operator.log", free_port())
    try:
        wait_for(nodes_ready, timeout_s=timeout_s, what=what, explain=kwok.log)
        after_ready()
        fleet.create_namespace(cluster, namespace)
        op.start()
        yield kwok, op
    finally:
        op.stop()
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        kwok.stop()


@pytest.fixture
def kwok_operator(cluster, ejob_crd, operator_kubeconfig, tmp_path):  # noqa: F811
    """Skips when kwok is not built; else a function `start(namespace, cleanup, **kwargs)` that runs
    `kwok_and_operator(cluster, operator_kubeconfig, tmp_path, namespace, **kwargs)` until the test ends and
    returns `(kwok, operator)`; `cleanup` (removing the test's nodes) runs after both stopped, and also when
    the start fails."""
    require_kwok()
    with contextlib.ExitStack() as stack:
        def start(namespace: str, cleanup: Callable[[], None], **kwargs) -> tuple[KwokProcess, OperatorProcess]:
            stack.callback(cleanup)
            return stack.enter_context(kwok_and_operator(cluster, operator_kubeconfig, tmp_path, namespace, **kwargs))
        yield start


def wait_all_running(cluster, namespace: str, jobs: list[str], slices: int, timeout_s: float,
                     kwok: KwokProcess, op: OperatorProcess) -> None:
    """Waits until every job of `jobs` is active on all its `slices` (the operator's and kwok's logs on a
    timeout)."""
    wait_for(lambda: fleet.all_running(cluster, namespace, jobs, slices), timeout_s=timeout_s, interval_s=1.0,
             what="both jobs active on both slices",
             explain=lambda: f"{fleet.job_statuses(cluster, namespace)}\n{op.log()[-3000:]}\n{kwok.log()[-2000:]}")


def client_of(cluster, namespace: str, job: str, controller_pod: dict) -> ControlClient:
    """A control API client of `job`'s controller pod, with the job's token (the caller closes it)."""
    return ControlClient(f"http://{controller_pod['status']['podIP']}:8080", fleet.token(cluster, namespace, job))


def assert_both_slices_active(client: ControlClient) -> None:
    """The controller behind `client` has slices 0 and 1 Active and the job Running."""
    assert fleet.slice_states(client) == {0: "Active", 1: "Active"}
    assert client.status().phase == "Running"


def fail_slice_1_worker(cluster, namespace: str, by_job: dict, job: str) -> tuple[dict, dict]:
    """Fails a running worker of `job`'s slice 1 as a kubelet reports it, and waits (60 s) until its
    controller applied the operator's `Down`; returns `(controller pod, the failed pod)`."""
    ctrl = by_job[job]["controller"][0]
    victim = fleet.running_worker(by_job[job]["workers"], 1)
    sent = fleet.fail_pod(cluster, namespace, victim)
    applied = fleet.wait_down_applied(cluster, namespace, ctrl, 1, sent, timeout_s=60)
    assert applied >= sent
    return ctrl, victim


def assert_slice_1_back(client: ControlClient) -> None:
    """Waits (60 s) until the controller behind `client` has slice 1 Active again, its one failure counted."""
    wait_for(lambda: fleet.slice_states(client) == {0: "Active", 1: "Active"}, timeout_s=60,
             what="slice 1 Active again", explain=lambda: str(client.status()))
    assert next(s for s in client.status().slices if s.index == 1).failures == 1


def assert_not_heard_by(cluster, namespace: str, by_job: dict, job: str) -> None:
    """`job`'s controller never applied a `Down` of slice 1 (the failure was another job's)."""
    other = by_job[job]["controller"][0]
    assert fleet.down_applied_at(cluster, namespace, other, 1, 0.0) is None
