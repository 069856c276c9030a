"""Root pytest configuration: shared fixtures live in tests/support/ as plugins; the
background Go build for e2e/ in e2e/harness/background_build.py; which tests plain
``pytest`` runs (the fast tier) and ``--runslow`` adds, in tests/support/tiers.py."""

import pytest

# Shared scenario checks (tests/tpu/ and their CPU twin): plain asserts with pytest's introspection.
pytest.register_assert_rewrite("tests.support.pathways_scenarios")

pytest_plugins = [
    "e2e.harness.background_build",
    "tests.support.gcs_emulator",
    "tests.support.sigterm",
    "tests.support.workers",
    "tests.support.tiers",
]
