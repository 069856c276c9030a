"""A fresh clone: the kind demo's first kind call (``kind get clusters``) builds the Go binaries first.

A new-user trial of ``e2e/kind/run.sh --air-gapped`` on a fresh clone died with
FileNotFoundError for ``e2e/.build/bin/kind``: the demo asks kind whether its
cluster is up before anything had run ``e2e/build.sh``.
"""

from __future__ import annotations

import os

from e2e.kind import cluster


class _Engine:
    def env(self):
        return dict(os.environ)


def test_the_first_kind_call_builds_the_binaries_when_kind_is_missing(tmp_path, monkeypatch):
    built = []

    def fake_build():  # stands in for e2e/build.sh (minutes of Go builds): leaves a kind CLI
        built.append(True)
        kind = tmp_path / "kind"
        kind.write_text("#!/bin/sh\necho elastic-jax other\n")
        kind.chmod(0o755)
        return 0.0

    monkeypatch.setattr(cluster, "bin_dir", lambda: tmp_path)
    monkeypatch.setattr(cluster, "ensure_built", fake_build)
    assert cluster.clusters(_Engine()) == ["elastic-jax", "other"]
    assert built == [True]
    assert cluster.clusters(_Engine()) == ["elastic-jax", "other"] and built == [True]  # built once
