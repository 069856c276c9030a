"""constraints.txt pins the whole dependency closure and agrees with pyproject.toml."""

import re
import tomllib
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Extras the dev install includes (dev carries tpu's pathwaysutils, for the adapter's tests).
DEV_CLOSURE = ("controller", "worker", "operator", "plot", "dev")


def _norm(name: str) -> str:
    """PEP 503 normalized project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _constraints() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep, f"constraints.txt: {line!r} is not an exact pin"
            pins[_norm(name)] = version
    return pins


def _direct_pins() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in DEV_CLOSURE:
        reqs += project["optional-dependencies"][extra]
    pins = {}
    for req in reqs:
        name, sep, version = req.partition("==")
        if name.startswith("elastic-jax"):
            continue  # a self-reference to other extras
        assert sep, f"pyproject.toml: {req!r} is not pinned with =="
        pins[_norm(re.sub(r"\[.*\]", "", name))] = version
    return pins


def test_every_direct_pin_is_in_constraints_at_the_same_version():
    constraints = _constraints()
    wrong = {n: (v, constraints.get(n)) for n, v in _direct_pins().items() if constraints.get(n) != v}
    assert not wrong, f"pyproject.toml vs constraints.txt (regenerate it, see its header): {wrong}"


def test_installed_packages_are_the_constrained_versions():
    constraints = _constraints()
    installed = {_norm(d.metadata["Name"]): d.version for d in metadata.distributions()}
    wrong = {n: (v, installed[n]) for n, v in constraints.items() if n in installed and installed[n] != v}
    assert not wrong, f"constraints.txt vs this environment (install with -c constraints.txt): {wrong}"
