"""Pytest plugin: ``pytest --runslow`` runs in two lanes (pytest-xdist workers) instead of one process.

The whole suite is three long phases that each leave most of a 2-core machine
idle (issue 30: 0.75 of a core used on average, 73 min quiet). Two lanes:

- the **kind** lane: every test under ``e2e/kind/``, one group on one worker
  from the start, so its Docker engine and image builds (:mod:`e2e.kind.prewarm`)
  and the Go build begin at once and only that worker starts them;
- the **local** lane: every other test under ``e2e/`` (the local control plane,
  ``e2e/standin/``), one group on the other worker, from the start: one local
  cluster per session;
- everything else (``tests/integration``, ``tests/unit``, ``tests/tpu``,
  the Helm chart tests) goes, one test file at a time, to whichever worker is
  free: a file stays on one worker so its module fixtures are set up once.

``--runslow`` alone starts :data:`LANES` workers with this schedule; ``-n N``
(with or without ``--runslow``) uses it with N workers; ``-n 0`` runs the suite
in one process, in the serial order of before; an explicit ``--dist`` is xdist's
own. Plain ``pytest`` (the fast tier) stays one process. ``--pdb`` and
``--collect-only`` stay serial too.

Interrupts: Ctrl-C reaches every worker (one process group); a SIGTERM to the
pytest process is passed on to each worker by PID. Either way the session's end
waits (up to :data:`WORKER_TEARDOWN_S`) for the workers to tear their fixtures
down, clusters and engines included, before xdist's own end kills what is left
after 10 s.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections import OrderedDict

import pytest

from tests.support import tiers

LANES = 2
"""Workers ``--runslow`` starts: one per core on the 2-core CI machine, and one per e2e lane."""
KIND, LOCAL = "kind", "local"
LANE_ORDER = (KIND, LOCAL)
"""Lanes in the order workers take them: the first worker is the kind lane (the longest)."""
LANE_KEY = "elastic_jax_lane"
"""Key of ``workerinput`` that tells a worker its lane ("" for none)."""
WORKER_TEARDOWN_S = 300.0
"""After an interrupt, how long the session's end waits for the workers' own teardown (seconds)."""

_ENABLED = pytest.StashKey[bool]()


def lane_of_nodeid(nodeid: str) -> str | None:
    """The lane a test belongs to by its node ID (relative to the repository): ``kind``, ``local`` or None."""
    path = nodeid.split("::", 1)[0]
    if path.startswith("e2e/kind/"):
        return KIND
    if path.startswith("e2e/"):
        return LOCAL
    return None


def worker_lane(config: pytest.Config) -> str | None:
    """This process's lane: None in a serial run (it runs every lane), else its lane ("" for none)."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        return None
    return workerinput.get(LANE_KEY, "")


def runs_lane(config: pytest.Config, lane: str) -> bool:
    """Whether this process starts ``lane``'s background work (the kind prewarm): serial runs do, and
    under xdist only the worker holding that lane (the scheduler sends the lane's tests there)."""
    mine = worker_lane(config)
    return mine is None or mine == lane


def worker_id() -> str | None:
    """The xdist worker's ID (``gw0``...) or None in the controller or a serial run."""
    return os.environ.get("PYTEST_XDIST_WORKER")


def say(config: pytest.Config, message: str) -> None:
    """A progress line in the terminal, from the controller, a serial run or a worker.

    xdist workers have no terminal reporter; their stderr is the controller's, so a worker writes there,
    prefixed with its ID, with pytest's capture suspended (from a fixture, the line would otherwise go to
    the test's captured output, shown only if it fails).
    """
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    wid = worker_id()
    if reporter is not None and wid is None:
        reporter.write_line(message)
        return
    if wid is not None:
        capman = config.pluginmanager.get_plugin("capturemanager")
        with capman.global_and_fixture_disabled() if capman is not None else contextlib.nullcontext():
            os.write(2, f"[{wid}] {message}\n".encode())


def _xdist_present(config: pytest.Config) -> bool:
    return hasattr(config.option, "numprocesses") and hasattr(config.option, "dist")


@pytest.hookimpl(tryfirst=True)  # before xdist's own pytest_cmdline_main turns -n N into --dist load
def pytest_cmdline_main(config: pytest.Config) -> None:
    if not _xdist_present(config) or worker_lane(config) is not None:
        return
    option = config.option
    if option.dist != "no" or getattr(option, "distload", False):
        return  # an explicit --dist: xdist's own schedule
    if option.collectonly or config.getoption("usepdb", False):
        return
    if option.numprocesses is None and config.getoption(tiers.OPTION):
        option.numprocesses = LANES
    if option.numprocesses in (None, 0, "0"):
        return
    # --dist load here only makes xdist start its distributed session; pytest_xdist_make_scheduler
    # below returns the lane schedule instead of xdist's load schedule.
    config.stash[_ENABLED] = True


@pytest.hookimpl(trylast=True)  # after tests/support/sigterm.py's handler, which this one replaces
def pytest_configure(config: pytest.Config) -> None:
    if config.stash.get(_ENABLED, False) and worker_lane(config) is None:
        signal.signal(signal.SIGTERM, _pass_sigterm_on)
        lane_state.reset()


def pytest_report_header(config: pytest.Config) -> str | None:
    if config.stash.get(_ENABLED, False):
        return (f"lanes: {config.option.numprocesses} xdist workers: e2e/kind on one, the local control plane "
                "(e2e/) on another, the rest to whichever is free (-n 0: one process)")
    return None


class _LaneState:
    """Which worker holds which lane (controller side); a crashed worker's replacement takes its lane."""

    def __init__(self) -> None:
        self.holders: dict[str, object] = {}
        self.down: set[int] = set()

    def reset(self) -> None:
        self.holders.clear()
        self.down.clear()

    def take(self, node) -> str:
        for lane in LANE_ORDER:
            holder = self.holders.get(lane)
            if holder is None or id(holder) in self.down:
                self.holders[lane] = node
                return lane
        return ""


lane_state = _LaneState()


@pytest.hookimpl(optionalhook=True)  # an xdist hook: absent with -p no:xdist
def pytest_configure_node(node) -> None:
    if node.config.stash.get(_ENABLED, False):
        node.workerinput[LANE_KEY] = lane_state.take(node)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    if error is not None:
        lane_state.down.add(id(node))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if not config.stash.get(_ENABLED, False):
        return None
    return _make_scheduler(config, log)


def _make_scheduler(config: pytest.Config, log):
    from xdist.scheduler.loadscope import LoadScopeScheduling  # only where xdist runs

    class LaneScheduling(LoadScopeScheduling):
        """xdist's scope schedule with two pinned scopes: a lane's tests go to the worker holding that lane.

        Work units: ``lane:kind``, ``lane:local`` and one per other test file, in collection order (not
        xdist's largest-first: the collection puts the slow integration files before the many fast unit
        files, so the last units, the ones that decide when both lanes end, are short). A worker asks for
        its next unit when it has 2 tests or fewer left, so a lane's worker takes free files only near the
        end of its lane. A lane whose worker is gone (crashed, no replacement yet) goes to any worker.
        """

        def _split_scope(self, nodeid: str) -> str:
            lane = lane_of_nodeid(nodeid)
            return f"lane:{lane}" if lane else nodeid.split("::", 1)[0]

        def _lane_of_node(self, node) -> str:
            return node.workerinput.get(LANE_KEY, "")

        def _unit_for(self, node) -> str | None:
            held = {self._lane_of_node(n) for n in self.nodes}
            mine = f"lane:{self._lane_of_node(node)}"
            if mine in self.workqueue:
                return mine
            for scope in self.workqueue:
                if not scope.startswith("lane:") or scope[len("lane:"):] not in held:
                    return scope
            return None  # only other lanes' units are left: this worker is done

        def _assign_work_unit(self, node) -> None:
            scope = self._unit_for(node)
            if scope is None:
                return
            work_unit = self.workqueue.pop(scope)
            self.assigned_work.setdefault(node, {})[scope] = work_unit
            collection = self.registered_collections[node]
            node.send_runtest_some([collection.index(nodeid) for nodeid, done in work_unit.items() if not done])

        def _reschedule(self, node) -> None:
            if node.shutting_down:
                return
            if self._unit_for(node) is None:
                if not self._pending_of(self.assigned_work[node]):
                    node.shutdown()
                elif not self.workqueue:
                    node.shutdown()  # runs what it has, then ends
                return
            if self._pending_of(self.assigned_work[node]) > 2:
                return
            self._assign_work_unit(node)

        def schedule(self) -> None:
            assert self.collection_is_completed
            if self.collection is not None:
                for node in self.nodes:
                    self._reschedule(node)
                return
            if not self._check_nodes_have_same_collection():
                self.log("**Different tests collected, aborting run**")
                return
            self.collection = list(next(iter(self.registered_collections.values())))
            if not self.collection:
                return
            units: OrderedDict[str, dict[str, bool]] = OrderedDict()
            for nodeid in self.collection:
                units.setdefault(self._split_scope(nodeid), {})[nodeid] = False
            # The lanes first: each worker's first unit is its lane (they start their clusters at once).
            for lane in reversed(LANE_ORDER):
                if f"lane:{lane}" in units:
                    units.move_to_end(f"lane:{lane}", last=False)
            self.workqueue = units
            for node in self.nodes:
                self._reschedule(node)

    return LaneScheduling(config, log)


def _worker_pids() -> list[int]:
    """PIDs of the xdist workers: this process's children (the controller runs no test, starts nothing else)."""
    import psutil

    return [child.pid for child in psutil.Process().children(recursive=False)]


def _pass_sigterm_on(signum, frame):  # noqa: ARG001 - signal handler signature
    # A SIGTERM sent to this process alone (CI's timeout, `kill PID`) does not reach the workers, which
    # hold the clusters: pass it on by PID, so each tears its fixtures down (tests/support/sigterm.py),
    # then stop this session like Ctrl-C. Once: a second SIGTERM ends this process at once.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    for pid in _worker_pids():
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.hookimpl(tryfirst=True)  # before xdist's DSession ends the workers (it kills them 10 s later)
def pytest_sessionfinish(session: pytest.Session, exitstatus) -> None:
    if not session.config.stash.get(_ENABLED, False) or worker_lane(session.config) is not None:
        return
    if exitstatus != pytest.ExitCode.INTERRUPTED:
        return
    dsession = session.config.pluginmanager.getplugin("dsession")
    if dsession is not None:
        _wait_for_workers_teardown(session.config, dsession)


# Events of a worker whose session ended (its fixtures are torn down then).
_ENDED = ("workerfinished", "errordown")
# Events the interrupted controller still reports (a teardown error shows in the summary).
_REPORTED = ("logstart", "logfinish", "testreport", "runtest_protocol_complete", "warning_recorded",
             "collectreport")


def _wait_for_workers_teardown(config: pytest.Config, dsession) -> None:
    """Read the workers' events until each one's session ended, up to WORKER_TEARDOWN_S.

    After an interrupt xdist leaves its event loop at once and ends each worker's gateway: 5 s later the
    worker interrupts itself again (execnet sends it SIGINT), 10 s later it is killed, mid-teardown,
    leaving the clusters and the engine it started. The interrupted workers end their sessions themselves
    (they got Ctrl-C's SIGINT, or the SIGTERM passed on above); this waits for that.
    """
    from queue import Empty

    waiting = set(dsession._active_nodes)
    if not waiting:
        return
    say(config, f"lanes: waiting up to {WORKER_TEARDOWN_S:.0f}s for {len(waiting)} workers to tear "
                "their fixtures down")
    deadline = time.monotonic() + WORKER_TEARDOWN_S
    while waiting and time.monotonic() < deadline:
        try:
            name, kwargs = dsession.queue.get(timeout=1.0)
        except Empty:
            continue
        if name in _ENDED:
            waiting.discard(kwargs.get("node"))
        elif name in _REPORTED:
            try:
                getattr(dsession, f"worker_{name}")(**kwargs)
            except Exception as e:  # reporting is best effort here; the wait goes on
                say(config, f"lanes: could not report a worker's {name} event: {e!r}")
    if waiting:
        say(config, f"lanes: {[n.gateway.id for n in waiting]} still tearing down after "
                    f"{WORKER_TEARDOWN_S:.0f}s; xdist ends them now")
