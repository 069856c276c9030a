"""Which folders `elastic-jax run` may write its run into (`--workdir`), and the marker that claims one.

A run writes `token`, `summary.json`, `metrics.prom`, logs, `launcher.lock`, `history.jsonl`, `timeline.png`
and `xla-cache/` into its folder, replacing files of those names. So it takes a folder only when the folder is
new (created here), empty, or an earlier run's: one holding the marker `.elastic-jax-run` (a regular file)
this module writes when it claims a folder. The marker is the only proof: a folder of a user's files that
also holds a regular file named `launcher.lock` or `controller.log` is not a run's (those names were taken as
proof before, for runs of versions without the marker; such a folder now needs the marker added by hand, or
a new --workdir). A folder holding anything else (`/etc`, a home folder, one with only a `token` or
`summary.json` in it) is refused before anything is written.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from elastic_jax.contract import RUN_FOLDER_MARKER
from elastic_jax.local.processes import write_private_file

MARKER = RUN_FOLDER_MARKER
# What runs made before the marker existed left in their folder: no proof (a user's folder may hold files of
# these names), named in the refusal of such a folder so its owner knows what to do.
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
    """Whether the existing directory `folder` is empty or an earlier run's (it holds the marker as a regular
    file: the only proof; `EARLIER_RUN_FILES` are not).

    Raises:
      OSError: `folder` cannot be listed.
    """
    names = os.listdir(folder)
    if not names:
        return True
    return _regular_file(folder / MARKER)


_JOB_LINE = "job: "


def _marked_job(marker: Path) -> str | None:
    """The job name an earlier run wrote into `marker` (its `job: <name>` line), None when none (an older
    marker, an empty one a user added) or unreadable; never read through a link."""
    try:
        fd = os.open(marker, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            text = f.read(64 * 1024).decode("utf-8", errors="replace")
    except OSError:
        return None
    return next((ln[len(_JOB_LINE):].strip() for ln in text.splitlines() if ln.startswith(_JOB_LINE)), None)


def check(folder: Path, what: str) -> str | None:
    """Refuses the existing directory `folder` as a run folder unless `is_run_folder`; returns the job its
    marker records (None: no marker, or one without a job).

    Call it on a folder of this user's alone (`processes.private_dir`), before the run writes anything in it.

    Args:
      folder: the run folder (it exists).
      what: its name in messages, e.g. "--workdir /tmp/run".

    Raises:
      NotARunFolderError: `folder` holds files and is not an earlier run's folder.
      OSError: it cannot be listed.
    """
    if not is_run_folder(folder):
        shown = sorted(os.listdir(folder))
        listed = ", ".join(shown[:3]) + (f" and {len(shown) - 3} more" if len(shown) > 3 else "")
        older = ("; if an elastic-jax older than its marker ran there, add an empty file " + MARKER + " to reuse it"
                 if any(_regular_file(folder / name) for name in EARLIER_RUN_FILES) else "")
        raise NotARunFolderError(
            f"{what}: is not empty and not an earlier elastic-jax run's folder (it holds {listed}; no {MARKER}); "
            "a run would overwrite files there: give a new or empty folder, or leave --workdir out "
            f"(runs/<job name>){older}")
    return _marked_job(folder / MARKER) if _regular_file(folder / MARKER) else None


def mark(folder: Path, job: str = "") -> str | None:
    """Marks `folder` (passed by `check`) as a run folder of `job`: call it once the run holds the folder.

    Args:
      folder: the run folder.
      job: the job's metadata.name, recorded in the marker ("": none recorded).

    Returns:
      The name of the other job whose run the folder held (recorded by its marker), when it is not `job`:
      this run replaces that run's files (a new user's trial found that silent); else None.

    Raises:
      OSError: the marker cannot be written.
    """
    earlier = _marked_job(folder / MARKER) if _regular_file(folder / MARKER) else None
    text = _MARKER_TEXT + (f"{_JOB_LINE}{job}\n" if job else "")
    if job or not _regular_file(folder / MARKER):
        write_private_file(folder / MARKER, text)  # (replaces a link planted at the name, never follows it)
    return earlier if earlier and job and earlier != job else None
