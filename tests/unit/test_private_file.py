"""The local token file is never readable by others, not even for a moment (issue 9, item 17)."""

from __future__ import annotations

import os
import stat

from elastic_jax.local import processes
from elastic_jax.local.processes import write_private_file


def test_token_file_is_created_0600_whatever_the_umask(tmp_path, monkeypatch):
    opened: list[tuple[str, int]] = []
    real_open = os.open

    def recording_open(path, flags, mode=0o777, *args, **kwargs):
        opened.append((str(path), mode))
        return real_open(path, flags, mode, *args, **kwargs)

    monkeypatch.setattr(processes.os, "open", recording_open)
    old_umask = os.umask(0)
    try:
        target = tmp_path / "token"
        target.write_text("old")
        target.chmod(0o644)  # a leftover with loose permissions is replaced, not reused
        write_private_file(target, "s3cret")
    finally:
        os.umask(old_umask)
    assert target.read_text() == "s3cret"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert opened and all(mode == 0o600 for _, mode in opened)  # created 0600, never chmodded into it
    assert [p.name for p in tmp_path.iterdir()] == ["token"]
