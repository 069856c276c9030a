"""The local control plane's node-monitor grace: 8 s unless `E2E_NODE_MONITOR_GRACE_S` moves it (e2e/harness).

The operator-at-scale benchmark's kwok nodes renew their leases every quarter of it, so a cluster for
1600 of them is started with a longer one; a value that is not a whole number of seconds is refused
before any process starts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e.harness import controlplane
from e2e.harness.ports import Ports


def _grace_flag(tmp_path: Path) -> str:
    argv = controlplane.controller_manager_argv(tmp_path / "bin", tmp_path / "state", Ports.from_base(21000))
    (flag,) = [a for a in argv if a.startswith("--node-monitor-grace-period=")]
    return flag


def test_the_grace_is_8_s_unless_the_environment_moves_it(monkeypatch, tmp_path):
    monkeypatch.delenv(controlplane.NODE_MONITOR_GRACE_ENV, raising=False)
    assert controlplane.node_monitor_grace_s() == 8
    assert _grace_flag(tmp_path) == "--node-monitor-grace-period=8s"
    monkeypatch.setenv(controlplane.NODE_MONITOR_GRACE_ENV, "120")
    assert controlplane.node_monitor_grace_s() == 120
    assert _grace_flag(tmp_path) == "--node-monitor-grace-period=120s"


@pytest.mark.parametrize("raw", ["0", "-5", "1.5", "2m"])
def test_a_grace_that_is_not_whole_seconds_is_refused(monkeypatch, raw):
    monkeypatch.setenv(controlplane.NODE_MONITOR_GRACE_ENV, raw)
    with pytest.raises(ValueError, match=controlplane.NODE_MONITOR_GRACE_ENV):
        controlplane.node_monitor_grace_s()
