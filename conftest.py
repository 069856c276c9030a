"""Root pytest configuration: shared fixtures live in tests/support/ as plugins; the
background Go build for e2e/ in e2e/harness/background_build.py; which tests plain
``pytest`` runs (the fast tier) and ``--runslow`` adds, in tests/support/tiers.py; how ``--runslow``
runs in two lanes (pytest-xdist workers), in tests/support/lanes.py."""

import pytest

# Shared scenario checks (tests/tpu/ and their CPU twin): plain asserts with pytest's introspection.
pytest.register_assert_rewrite("tests.support.pathways_scenarios")

# tiers and lanes first: the plugins after them import them (registered before that, pytest rewrites
# their asserts and warns of nothing).
pytest_plugins = [
    "tests.support.tiers",
    "tests.support.lanes",
    "e2e.harness.background_build",
    "tests.support.gcs_emulator",
    "tests.support.sigterm",
    "tests.support.workers",
]
