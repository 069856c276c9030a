"""Layers point one way: import-linter's contracts (`[tool.importlinter]` in pyproject.toml) hold.

The contracts are checked by the real tool (`lint-imports`), not by our own
import walk. import-linter finds a package's modules by walking its folder,
and three subpackages of `elastic_jax` live in other folders (pyproject's
`package-dir`), which an editable install maps only at import time; so
`_lay_out` first lays the package out as a wheel installs it (a tree of
symlinks, `package-dir` read from pyproject.toml) and the tool reads that.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = REPO / "pyproject.toml"
ROOT = "elastic_jax"
# The tool's command line (`lint-imports`), run by this interpreter: a venv need not have the script.
LINT_IMPORTS = [sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()"]


def _folder(package: str) -> Path:
    """The folder of `package` in this repository (pyproject's `package-dir`, else its parent's folder)."""
    folders = tomllib.loads(PYPROJECT.read_text())["tool"]["setuptools"]["package-dir"]
    if package in folders:
        return REPO / folders[package]
    parent, _, name = package.rpartition(".")
    return _folder(parent) / name


def _source(module: str) -> Path:
    """The file of `module` (dotted name) in this repository."""
    package, _, name = module.rpartition(".")
    return _folder(package) / f"{name}.py"


def _lay_out(dest: Path, replace: dict[str, str] | None = None) -> Path:
    """Lays the `elastic_jax` package out under `dest` as a wheel installs it (one folder per package of
    pyproject's list, its .py files symlinked), with `replace` (dotted module name -> text) written instead.

    Returns:
      The folder to put on PYTHONPATH.
    """
    replace = dict(replace or {})
    for package in tomllib.loads(PYPROJECT.read_text())["tool"]["setuptools"]["packages"]:
        folder = dest.joinpath(*package.split("."))
        folder.mkdir(parents=True, exist_ok=True)
        for source in _folder(package).glob("*.py"):
            text = replace.pop(f"{package}.{source.stem}", None)
            if text is None:
                (folder / source.name).symlink_to(source)
            else:
                (folder / source.name).write_text(text)
    assert not replace, f"no such module to replace: {sorted(replace)}"
    return dest


def _lint(path: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports` with pyproject.toml's contracts over the package laid out at `path` (no cache written)."""
    if importlib.util.find_spec("importlinter") is None:
        pytest.fail("import-linter is not installed: pip install -c constraints.txt -e '.[dev]' (pyproject's dev extra)")
    env = {**os.environ, "PYTHONPATH": str(path), "COLUMNS": "400"}  # (one line per contract: rich wraps at 80)
    return subprocess.run([*LINT_IMPORTS, "--no-cache", "--no-logo", str(PYPROJECT)], cwd=path, env=env,
                          capture_output=True, text=True, timeout=300)


def _contract_count() -> int:
    return len(tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]["contracts"])


def test_every_import_contract_is_kept(tmp_path):
    result = _lint(_lay_out(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"Contracts: {_contract_count()} kept, 0 broken." in result.stdout, result.stdout


@pytest.mark.parametrize("module, line, contract, found", [
    # the api and the CLI importing the operator (as cli.py and api/crd.py did before issue 30)
    ("elastic_jax.cli", "from elastic_jax.k8s_operator.reconcile import termination_reason",
     "The api and the CLI import nothing of the operator", "elastic_jax.cli -> elastic_jax.k8s_operator.reconcile"),
    ("elastic_jax.api.crd", "from elastic_jax.k8s_operator.backends import pathways",
     "The api and the CLI import nothing of the operator",
     "elastic_jax.api.crd -> elastic_jax.k8s_operator.backends.pathways"),
    # a lower layer importing a higher one
    ("elastic_jax.api.job", "from elastic_jax import cli", "Layers point one way",
     "elastic_jax.api.job -> elastic_jax.cli"),
    # one image's component importing another's
    ("elastic_jax.worker.main", "from elastic_jax.controller import loop", "The operator, the controller and the worker",
     "elastic_jax.worker.main -> elastic_jax.controller.loop"),
    ("elastic_jax.k8s_operator.handlers", "from elastic_jax.controller import settings",
     "The operator, the controller and the worker", "elastic_jax.k8s_operator.handlers -> elastic_jax.controller.settings"),
    # a file circle (reconcile <-> counters before issue 30)
    ("elastic_jax.k8s_operator.counters", "from elastic_jax.k8s_operator.reconcile import dead",
     "No import cycles", "No cycles are allowed in elastic_jax.k8s_operator"),
])
def test_a_broken_contract_fails_the_lint_naming_the_import(tmp_path, module, line, contract, found):
    """One forbidden import added to one module breaks the contract, and the tool names the import: so the
    laid-out package holds every component (the operator's folder included) and the contracts can fail."""
    broken = _source(module).read_text() + f"\n{line}  # broken on purpose by {__name__}\n"
    result = _lint(_lay_out(tmp_path, {module: broken}))
    assert result.returncode == 1, result.stdout + result.stderr
    assert re.search(rf"^{re.escape(contract)}.* BROKEN\b", result.stdout, re.MULTILINE), result.stdout
    assert found in result.stdout, result.stdout
