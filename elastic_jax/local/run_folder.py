"""Which folders `elastic-jax run` may write its run into (`--workdir`), and the marker that claims one.

A run writes `token`, `summary.json`, `metrics.prom`, logs, `launcher.lock`, `history.jsonl`, `timeline.png`
and `xla-cache/` into its folder, replacing files of those names. So it takes a folder only when the folder is
new (created here), empty, or an earlier run's: one holding the marker `.elastic-jax-run` this module writes
when it claims a folder, or, from versions before the marker, a `launcher.lock`, `controller.log` or
`history.jsonl` as those runs left them (every earlier run wrote `controller.log` or `launcher.lock` first).
A folder holding anything else (`/etc`, a home folder, one with only a `token` or `summary.json` in it) is
refused before anything is written.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from elastic_jax.local.processes import write_private_file

MARKER = ".elastic-jax-run"
# What runs made before the marker existed left in their folder, each written by the run itself.
EARLIER_RUN_FILES = ("launcher.lock", "controller.log", "history.jsonl")
_MARKER_TEXT = ("This folder is an `elastic-jax run` folder (its --workdir): a later run of the job writes its "
                "logs, token, summary.json, metrics.prom, history and timeline here, replacing the old ones.\n")


class NotARunFolderError(ValueError):
    """An existing `--workdir` that is neither empty nor an earlier run's. The message is one line naming it."""


def _regular_file(path: Path) -> bool:
    """Whether `path` is a regular file (a symbolic link planted at the name is not one)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def is_run_folder(folder: Path) -> bool:
    """Whether the existing directory `folder` is empty or an earlier run's (the marker, or a file an earlier
    version's run wrote, as a regular file).

    Raises:
      OSError: `folder` cannot be listed.
    """
    names = os.listdir(folder)
    if not names:
        return True
    return any(_regular_file(folder / name) for name in (MARKER, *EARLIER_RUN_FILES))


def claim(folder: Path, what: str) -> None:
    """Marks the existing directory `folder` as a run folder, after checking `is_run_folder`.

    Call it on a folder of this user's alone (`processes.private_dir`), before the run writes anything else in it.

    Args:
      folder: the run folder (it exists).
      what: its name in messages, e.g. "--workdir /tmp/run".

    Raises:
      NotARunFolderError: `folder` holds files and is not an earlier run's folder.
      OSError: it cannot be listed, or the marker cannot be written.
    """
    if not is_run_folder(folder):
        shown = sorted(os.listdir(folder))
        listed = ", ".join(shown[:3]) + (f" and {len(shown) - 3} more" if len(shown) > 3 else "")
        raise NotARunFolderError(
            f"{what}: is not empty and not an earlier elastic-jax run's folder (it holds {listed}); a run would "
            "overwrite files there: give a new or empty folder, or leave --workdir out (runs/<job name>)")
    if not _regular_file(folder / MARKER):
        write_private_file(folder / MARKER, _MARKER_TEXT)  # (replaces a link planted at the name, never follows it)
