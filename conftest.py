"""Root pytest configuration: shared fixtures live in tests/support/ as plugins."""

pytest_plugins = [
    "tests.support.gcs_emulator",
    "tests.support.workers",
]
