"""The test tiers (tests/support/tiers.py): plain pytest runs the fast tier, --runslow everything, and a
test lands in its tier by its folder and markers alone. Run on a small tree of its own by pytester."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

TREE = {
    "tests/unit/test_fast.py": "def test_fast(): pass\n",
    "tests/unit/test_marked.py": ("import pytest\n\n@pytest.mark.slow\ndef test_long_training(): pass\n\n"
                                  "@pytest.mark.go_binaries\ndef test_helm(): pass\n"),
    "tests/integration/test_processes.py": "def test_real_processes(): pass\n",
    "e2e/test_cluster.py": "def test_cluster(): pass\n",
    "e2e/standin/test_standin.py": "def test_standin(): pass\n",
}
EVERY = {"test_fast", "test_long_training", "test_helm", "test_real_processes", "test_cluster", "test_standin"}


@pytest.fixture
def tree(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makefile(".toml", pyproject='[tool.pytest.ini_options]\ntestpaths = ["tests", "e2e"]\n'
                                         'markers = ["go_binaries: needs Go"]\n')
    for path, text in TREE.items():
        (pytester.path / path).parent.mkdir(parents=True, exist_ok=True)
        (pytester.path / path).write_text(text)
    return pytester


def _ran(pytester: pytest.Pytester, *args: str) -> set[str]:
    result = pytester.runpytest("-p", "tests.support.tiers", "-v", *args)
    return {line.split("::")[-1].split(" ")[0] for line in result.outlines if " PASSED" in line}


@pytest.mark.parametrize("args, ran", [
    ((), {"test_fast"}),  # plain pytest: the fast tier
    (("--runslow",), EVERY),
    (("tests",), {"test_fast"}),  # a folder of both tiers: its fast tier
    (("tests/unit",), {"test_fast"}),
    (("tests/unit/test_marked.py",), {"test_long_training", "test_helm"}),  # a file named: whatever its tier
    (("tests/unit/test_marked.py::test_helm",), {"test_helm"}),
    (("tests/integration",), {"test_real_processes"}),  # a folder inside a slow folder: all of it
    (("e2e/standin",), {"test_standin"}),
    (("tests", "e2e/standin/test_standin.py"), {"test_fast", "test_standin"}),
], ids=["plain", "runslow", "tests", "tests-unit", "marked-file", "node-id", "integration-folder",
        "e2e-subfolder", "mixed"])
def test_the_tier_follows_from_folder_markers_and_what_the_command_line_names(tree, args, ran):
    assert _ran(tree, *args) == ran


def test_plain_pytest_in_a_slow_folder_runs_it(tree, monkeypatch):
    monkeypatch.chdir(tree.path / "tests" / "integration")
    assert _ran(tree) == {"test_real_processes"}


def test_plain_pytest_says_it_ran_the_fast_tier_and_how_many_it_left(tree):
    result = tree.runpytest("-p", "tests.support.tiers")
    result.assert_outcomes(passed=1, deselected=5)
    result.stdout.fnmatch_lines(["tiers: the fast tier*--runslow*"])


class _RecordedBuild:
    """Stands in for `e2e/build.sh` in the background (`BackgroundBuild`): records that it was started."""

    started: list = []

    def __init__(self, log_path, command=None):
        self.log_path, self.seconds = log_path, 0.0
        self.proc = type("Proc", (), {"pid": 0, "poll": lambda self: 0})()
        _RecordedBuild.started.append(log_path)

    def wait(self, timeout_s: float = 0.0) -> float:
        return 0.0

    def stop(self) -> None:
        pass


@pytest.mark.parametrize("args, builds", [((), 0), (("--runslow",), 1)], ids=["plain", "runslow"])
def test_the_fast_tier_starts_no_go_build(tree, monkeypatch, args, builds):
    """The background Go build (e2e/harness/background_build.py) starts when a selected test needs its
    binaries (here the `go_binaries` test): never in the fast tier, once with --runslow."""
    from e2e.harness import background_build

    monkeypatch.setattr(background_build, "BackgroundBuild", _RecordedBuild)
    monkeypatch.setattr(background_build, "_build", None)
    monkeypatch.setattr(_RecordedBuild, "started", [])
    result = tree.runpytest("-p", "tests.support.tiers", "-p", "e2e.harness.background_build", *args)
    assert result.ret == 0, result.outlines
    assert len(_RecordedBuild.started) == builds, result.outlines
