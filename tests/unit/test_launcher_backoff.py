"""The local launcher's worker restart delay (its own logic; stand-in children and no controller)."""

from pathlib import Path

from elastic_jax.api.manifest import parse_manifest
from elastic_jax.local.launcher import LaunchOptions, LocalLauncher, _Slice


class _Child:
    """A worker process that is alive until `die()`."""

    def __init__(self):
        self.up = True

    def alive(self):
        return self.up

    def exit_code(self):
        return None if self.up else -9

    def die(self):
        self.up = False


def _launcher(tmp_path: Path) -> tuple[LocalLauncher, _Slice, list]:
    job = parse_manifest({"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob",
                          "metadata": {"name": "b"},
                          "spec": {"slices": {"count": 1}, "training": {"steps": 10, "globalBatchSize": 1},
                                   "checkpoint": {"uri": str(tmp_path / "ck")}}})
    launcher = LocalLauncher(job, tmp_path / "job.yaml", LaunchOptions(workdir=tmp_path / "run"))
    s = _Slice(0, _Child())
    launcher.slices = [s]
    reports = []
    launcher._report = lambda sl, state, reason=None: reports.append(state)
    starts = []

    def start(sl):
        starts.append(sl.index)
        sl.child = _Child()
        sl.state = "Starting"
        sl.restart_at = None

    launcher._start_worker = start
    return launcher, s, reports


def test_a_worker_lost_after_ready_restarts_after_the_first_delay_every_time(tmp_path, monkeypatch):
    launcher, s, reports = _launcher(tmp_path)
    monkeypatch.setattr("elastic_jax.local.launcher.port_open", lambda host, port: True)
    now = 0.0
    for _ in range(6):  # killed every 15 s, each time after it was Ready: never a growing wait
        launcher._supervise_workers(now)  # Starting -> Ready
        assert s.state == "Ready"
        s.child.die()
        launcher._supervise_workers(now)
        assert s.state == "Down" and s.restart_at == now + 1.0
        launcher._supervise_workers(now + 1.0)  # restarted
        now += 15.0
    assert reports.count("Down") == 6


def test_a_worker_that_dies_before_ready_backs_off(tmp_path, monkeypatch):
    launcher, s, _ = _launcher(tmp_path)
    monkeypatch.setattr("elastic_jax.local.launcher.port_open", lambda host, port: False)
    s.state = "Starting"
    delays = []
    now = 0.0
    for _ in range(7):  # a crash loop: it never listens
        s.child.die()
        launcher._supervise_workers(now)
        delays.append(s.restart_at - now)
        now = s.restart_at
        launcher._supervise_workers(now)
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
