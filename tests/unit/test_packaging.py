"""Packaging: every package folder is listed in pyproject.toml, and no import package is named `operator`."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_folder_is_listed():
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapping = tool["package-dir"]
    listed = set(tool["packages"])
    found = set()
    for name, folder in mapping.items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base)
            sub = ".".join((name, *rel.parts)) if rel.parts else name
            found.add(sub)
    found = {f for f in found if "__pycache__" not in f}
    missing = found - listed
    assert not missing, f"add to [tool.setuptools] packages: {sorted(missing)}"
    assert all(p.split(".")[-1] != "operator" for p in listed)


def test_console_scripts_resolve():
    import importlib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    for name, target in scripts.items():
        module, _, func = target.partition(":")
        assert callable(getattr(importlib.import_module(module), func)), name
