"""The suite's lanes (tests/support/lanes.py): `--runslow` runs on two pytest-xdist workers, e2e/kind on one,
the local control plane's e2e tests on the other, every other test file on whichever is free; `-n 0` and plain
pytest stay one process. Real pytest sessions with real xdist workers, on a small tree of their own."""

from __future__ import annotations

import collections
import os
from pathlib import Path

import pytest

from tests.support import lanes

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[2]

CONFTEST = '''
import os, pytest

pytest_plugins = ["tests.support.lanes", "tests.support.tiers"]


@pytest.fixture(autouse=True)
def record(request):
    from tests.support import lanes
    with open(os.environ["LANES_RECORD"], "a") as f:
        f.write(f"{lanes.worker_id()} {lanes.worker_lane(request.config)} {request.node.nodeid}\\n")
'''
TREE = {
    "conftest.py": CONFTEST,
    "tests/unit/test_fast.py": "def test_a(): pass\n\ndef test_b(): pass\n",
    "tests/unit/test_more.py": "def test_c(): pass\n",
    "tests/integration/test_procs.py": ("import pytest\n\n@pytest.fixture(scope='module')\ndef once(): return 1\n\n"
                                        + "".join(f"def test_p{n}(once): pass\n\n" for n in range(4))),
    "tests/integration/test_other.py": "def test_o(): pass\n",
    "e2e/kind/test_kind_a.py": "def test_k1(): pass\n\ndef test_k2(): pass\n",
    "e2e/kind/test_kind_b.py": ("import pytest\n\n@pytest.fixture\ndef engine(request):\n"
                                "    from tests.support import lanes\n"
                                "    lanes.say(request.config, 'kind: engine ready')\n\n"
                                "def test_k3(engine): pass\n"),
    "e2e/standin/test_standin.py": "def test_s(): pass\n",
    "e2e/test_local.py": "def test_l1(): pass\n\ndef test_l2(): pass\n",
}


@pytest.fixture
def tree(pytester: pytest.Pytester, monkeypatch) -> pytest.Pytester:
    pytester.makefile(".toml", pyproject='[tool.pytest.ini_options]\ntestpaths = ["tests", "e2e"]\n')
    for path, text in TREE.items():
        (pytester.path / path).parent.mkdir(parents=True, exist_ok=True)
        (pytester.path / path).write_text(text)
    monkeypatch.setenv("LANES_RECORD", str(pytester.path / "record.txt"))
    # (this test may itself run on an xdist worker: its inner pytest must not inherit that worker's identity)
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    return pytester


def _runs(tree: pytest.Pytester, *args: str) -> tuple[pytest.RunResult, list[tuple[str, str, str]]]:
    result = tree.runpytest_subprocess("-p", "no:cacheprovider", *args)
    lines = (tree.path / "record.txt").read_text().splitlines() if (tree.path / "record.txt").exists() else []
    return result, [tuple(line.split(" ", 2)) for line in lines]


def test_runslow_runs_each_lane_on_its_own_worker_and_each_other_file_on_one(tree):
    result, runs = _runs(tree, "--runslow")
    result.assert_outcomes(passed=14)
    result.stdout.fnmatch_lines(["lanes: 2 xdist workers*"])
    by_file = collections.defaultdict(set)
    for worker, _, nodeid in runs:
        by_file[nodeid.split("::")[0]].add(worker)
    kind = set().union(*(w for f, w in by_file.items() if f.startswith("e2e/kind/")))
    local = by_file["e2e/standin/test_standin.py"] | by_file["e2e/test_local.py"]
    assert len(kind) == 1 and len(local) == 1 and kind != local, dict(by_file)
    assert all(len(workers) == 1 for workers in by_file.values()), dict(by_file)  # a file stays on one worker
    lane_of = {worker: lane for worker, lane, _ in runs}
    kind_worker = kind.pop()
    assert lane_of[kind_worker] == lanes.KIND and lane_of[local.pop()] == lanes.LOCAL
    # A worker's progress line from inside a fixture reaches the terminal, not the test's captured output.
    assert f"[{kind_worker}] kind: engine ready" in result.stderr.str()


@pytest.mark.parametrize("args", [("--runslow", "-n", "0"), ("tests/unit",)], ids=["runslow -n 0", "plain"])
def test_n0_and_the_fast_tier_run_in_one_process(tree, args):
    result, runs = _runs(tree, *args)
    assert result.ret == 0
    assert "workers" not in result.stdout.str()
    assert {worker for worker, _, _ in runs} == {"None"}  # no xdist worker ID: this process ran them


def test_lane_of_nodeid():
    assert lanes.lane_of_nodeid("e2e/kind/test_spares.py::test_x") == lanes.KIND
    assert lanes.lane_of_nodeid("e2e/standin/test_gc.py::test_x") == lanes.LOCAL
    assert lanes.lane_of_nodeid("e2e/test_tenancy.py::test_x[a::b]") == lanes.LOCAL
    assert lanes.lane_of_nodeid("tests/unit/test_helm_chart.py::test_x") is None
