"""Pytest plugin: plain ``pytest`` runs the fast tier; ``pytest --runslow`` the whole suite.

The tier of a test follows from where it is and how it is marked, so a new test
lands in its tier without being listed anywhere:

- **slow**: every test under ``tests/integration/`` (real controller, worker
  and launcher processes) and ``e2e/`` (a Go build, a local control plane, a
  kind cluster); any test marked ``slow`` (a long training run, say) or
  ``go_binaries`` (it needs ``e2e/build.sh``'s Go binaries).
- **fast**: everything else: unit tests and in-process CLI checks.

Without ``--runslow`` the slow tier is deselected, so neither the Go build
(:mod:`e2e.harness.background_build`) nor a cluster starts. What the command
line names runs whatever its tier: a test file, a node ID, or a folder inside
``tests/integration/`` or ``e2e/`` (``pytest tests/integration/test_faults.py``,
``pytest e2e/standin``, or plain ``pytest`` run in such a folder). A folder that holds both tiers (the repository,
``tests/``, ``tests/unit/``) runs its fast tier unless ``--runslow`` is given.
This is pytest's documented ``--runslow`` pattern, deselecting rather than
skipping: a skipped e2e test would still start the Go build.
"""

from __future__ import annotations

from pathlib import Path

import pytest

SLOW_FOLDERS = ("tests/integration", "e2e")
"""Every test under these folders (relative to the repository, pytest's rootdir) is of the slow tier."""
SLOW_MARKERS = ("slow", "go_binaries")
"""A test with one of these markers is of the slow tier, wherever it is."""
OPTION = "--runslow"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(OPTION, action="store_true", default=False,
                     help="run the whole suite: also the slow tier (tests/integration, e2e, tests marked slow or "
                          "go_binaries); plain pytest runs the fast tier only")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: of the slow tier (runs with --runslow): a test that takes "
                                       "seconds of CPU to prove what no faster test proves")


def _slow_folders(config: pytest.Config) -> list[Path]:
    return [config.rootpath.resolve() / folder for folder in SLOW_FOLDERS]


def _inside(path: Path, folders: list[Path]) -> bool:
    return any(folder == path or folder in path.parents for folder in folders)


def is_slow(item: pytest.Item) -> bool:
    """Whether ``item`` is of the slow tier: under a slow folder, or marked ``slow`` or ``go_binaries``."""
    if _inside(Path(item.path).resolve(), _slow_folders(item.config)):
        return True
    return any(item.get_closest_marker(name) is not None for name in SLOW_MARKERS)


def _named(config: pytest.Config) -> list[Path]:
    """The paths the command line names (node IDs without their ``::`` part), or the folder ``pytest`` ran
    in when that is not the repository's root; [] for plain ``pytest`` there (its ``testpaths``)."""
    if config.args_source == pytest.Config.ArgsSource.TESTPATHS:
        return []
    base = config.invocation_params.dir
    return [(base / arg.split("::", 1)[0]).resolve() for arg in config.args]


def _asked_for(path: Path, named: list[Path], slow_folders: list[Path]) -> bool:
    """Whether a test in file ``path`` was named: its file, or a folder inside a slow folder holding it."""
    return any(target == path or (target in path.parents and _inside(target, slow_folders)) for target in named)


@pytest.hookimpl(tryfirst=True)  # (before the background Go build looks at the items)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption(OPTION):
        return
    named, folders = _named(config), _slow_folders(config)
    keep, slow = [], []
    for item in items:
        (slow if is_slow(item) and not _asked_for(Path(item.path).resolve(), named, folders) else keep).append(item)
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = keep


def pytest_report_header(config: pytest.Config) -> str | None:
    if config.getoption(OPTION):
        return "tiers: the whole suite (--runslow)"
    return "tiers: the fast tier (tests/integration, e2e and tests marked slow or go_binaries run with --runslow)"
