"""elastic_jax/requirements.py: the dependency layer of images/Dockerfile."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from elastic_jax.requirements import requirements

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_an_extra_adds_its_group_to_the_base_dependencies():
    reqs = requirements(PYPROJECT, ["worker"])
    assert reqs[:len(PYPROJECT["project"]["dependencies"])] == PYPROJECT["project"]["dependencies"]
    assert set(PYPROJECT["project"]["optional-dependencies"]["worker"]) <= set(reqs)
    assert not any(r.startswith("kopf") for r in reqs)


def test_self_references_expand_and_nothing_repeats():
    reqs = requirements(PYPROJECT, ["tpu"])
    assert not any(r.startswith("elastic-jax") for r in reqs)
    assert set(PYPROJECT["project"]["optional-dependencies"]["controller"]) <= set(reqs)
    assert len(reqs) == len(set(reqs))


def test_unknown_extra_is_named():
    with pytest.raises(KeyError, match="'gpu'"):
        requirements(PYPROJECT, ["gpu"])


def test_runs_as_a_script_with_the_standard_library_only(tmp_path):
    # The Dockerfile runs it from a folder that holds nothing of the project.
    script = tmp_path / "requirements.py"
    script.write_text((ROOT / "elastic_jax" / "requirements.py").read_text())
    out = subprocess.run([sys.executable, "-I", str(script), str(ROOT / "pyproject.toml"), "operator"],
                         capture_output=True, text=True, check=True, cwd=tmp_path).stdout.split()
    assert out == requirements(PYPROJECT, ["operator"])
