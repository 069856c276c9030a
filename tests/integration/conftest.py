"""The integration tier's processes share one persistent XLA compilation cache (tests/support/compilation_cache.py)."""

from __future__ import annotations

import os

import pytest

from tests.support import compilation_cache


def _set(values: dict[str, str | None]) -> dict[str, str | None]:
    """Sets (a str) or removes (None) each variable of `values` in os.environ; returns what they were."""
    before = {name: os.environ.get(name) for name in values}
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    return before


@pytest.fixture(scope="package", autouse=True)
def shared_compilation_cache(tmp_path_factory):
    """`JAX_COMPILATION_CACHE_DIR` (and every compile cached) in this process's environment while the tier's
    tests run, so every `elastic-jax run` and JAX child they start inherits it; put back as it was after.
    (Package scope: set before any module fixture starts a run, and gone before a test outside the tier.)"""
    folder = compilation_cache.shared_folder(tmp_path_factory.getbasetemp())
    before = _set({compilation_cache.NAMES[0]: str(folder), compilation_cache.NAMES[1]: "0"})
    yield folder
    _set(before)


@pytest.fixture(scope="module")
def without_shared_compilation_cache():
    """For a module that tests the compilation cache itself: the shared cache's variables unset while it runs
    (`pytestmark = pytest.mark.usefixtures("without_shared_compilation_cache")`)."""
    before = _set(dict.fromkeys(compilation_cache.NAMES))
    yield
    _set(before)
