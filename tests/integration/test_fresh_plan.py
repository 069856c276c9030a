"""Issue 31 FAIL 2: `--fresh` deletes only what Orbax wrote for this job, whatever else is named like it.

Real Orbax on disk: a `Checkpointer` saves this job's steps; beside them a user's folders named
`metadata/`, `notes.orbax-checkpoint-tmp/`, `backup.orbax-checkpoint-tmp-5/`, `2024/`, a file, and a link
named like a step. Before the fix `metadata/` and both `*.orbax-checkpoint-tmp*` folders were deleted
("deleted 2 checkpoint(s)"): a name is not proof.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from elastic_jax.api import checkpoints
from elastic_jax.api.identity import JobIdentity

A = JobIdentity(namespace="local", name="job-a", uid="uid-a")
B = JobIdentity(namespace="local", name="job-b", uid="uid-b")
DATA = {"next_batch_index": 0, "global_batch_size": 8, "seed": 0}


def _save(uri: str, writer: JobIdentity, *steps: int) -> None:
    import jax.numpy as jnp

    from elastic_jax.controller.checkpointing import Checkpointer

    with Checkpointer(uri, interval_steps=10, max_to_keep=5, writer=writer) as ckpt:
        for step in steps:
            assert ckpt.maybe_save(step, {"w": jnp.ones(4) * step}, DATA)
        ckpt.wait_until_finished()


def _user_folders(root: Path, elsewhere: Path) -> dict[str, str]:
    """A user's entries named like Orbax's; returns {relative file: content} to check afterwards."""
    files = {"metadata/keep.txt": "mine", "notes.orbax-checkpoint-tmp/a.txt": "notes",
             "backup.orbax-checkpoint-tmp-5/b.txt": "backup", "README": "readme",
             "7.orbax-checkpoint-tmp-99/_CHECKPOINT_METADATA": json.dumps({"custom_metadata": {}})}
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (elsewhere / "_CHECKPOINT_METADATA").write_text(json.dumps({"custom_metadata": {}}))
    (root / "latest").symlink_to(elsewhere, target_is_directory=True)  # a link to a user's folder
    return files


def test_fresh_deletes_this_jobs_orbax_steps_and_temporaries_and_keeps_everything_else(tmp_path):
    root = tmp_path / "ck"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _save(str(root), A, 10, 20)
    # This job's save cut short, as Orbax leaves it (a step directory under Orbax's temporary name).
    shutil.copytree(root / "20", root / "30.orbax-checkpoint-tmp-1234")
    files = _user_folders(root, elsewhere)

    plan = checkpoints.clear_local_checkpoints(str(root), A)

    assert plan.delete == ["10", "20", "30.orbax-checkpoint-tmp-1234"]
    assert plan.keep == sorted(["7.orbax-checkpoint-tmp-99", "README", "backup.orbax-checkpoint-tmp-5", "latest",
                                "metadata", "notes.orbax-checkpoint-tmp"])
    line = plan.kept_line()
    assert "\n" not in line and line.startswith("kept 6 entries that are not this job's checkpoints: ")
    for rel, text in files.items():
        assert (root / rel).read_text() == text, rel
    assert (elsewhere / "_CHECKPOINT_METADATA").is_file() and (root / "latest").is_symlink()
    assert not any((root / name).exists() for name in plan.delete)


def test_a_save_cut_short_without_metadata_goes_only_beside_this_jobs_steps(tmp_path):
    root = tmp_path / "ck"
    root.mkdir()
    (root / "10.orbax-checkpoint-tmp-1").mkdir()
    assert checkpoints.clear_local_checkpoints(str(root), A) == checkpoints.FreshPlan([], ["10.orbax-checkpoint-tmp-1"])
    _save(str(root), A, 20)
    (root / "30.orbax-checkpoint-tmp-2").mkdir()
    plan = checkpoints.clear_local_checkpoints(str(root), A)
    assert plan.delete == ["10.orbax-checkpoint-tmp-1", "20", "30.orbax-checkpoint-tmp-2"] and plan.keep == []


def test_another_jobs_steps_still_refuse_and_nothing_is_deleted(tmp_path):
    root = tmp_path / "ck"
    _save(str(root), B, 10)
    (root / "metadata").mkdir()
    with pytest.raises(checkpoints.CheckpointUriError, match="step 10 .*written by local/job-b"):
        checkpoints.clear_local_checkpoints(str(root), A)
    assert (root / "10").is_dir() and (root / "metadata").is_dir()


def test_the_issues_case_a_users_metadata_and_tmp_named_folders_survive(tmp_path):
    """The review's reproduction: this job's step beside a user's `metadata/` and `x.orbax-checkpoint-tmp/`."""
    root = tmp_path / "ck"
    _save(str(root), A, 10)
    for rel in ("metadata/notes.txt", "x.orbax-checkpoint-tmp/notes.txt"):
        (root / rel).parent.mkdir()
        (root / rel).write_text("keep")
    checkpoints.clear_local_checkpoints(str(root), A)
    assert not (root / "10").exists()
    assert (root / "metadata/notes.txt").read_text() == "keep"
    assert (root / "x.orbax-checkpoint-tmp/notes.txt").read_text() == "keep"


@pytest.mark.parametrize("kind", ["folder", "link"])
def test_a_user_entry_named_like_a_step_refuses_and_nothing_is_deleted(tmp_path, kind):
    """Orbax would list `2024/` (or a link named `40`) as a step of the fresh run: refused, all kept."""
    root = tmp_path / "ck"
    _save(str(root), A, 10)
    if kind == "folder":
        (root / "2024").mkdir()
    else:
        (tmp_path / "elsewhere").mkdir()
        (tmp_path / "elsewhere" / "_CHECKPOINT_METADATA").write_text(json.dumps({"custom_metadata": {}}))
        (root / "2024").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(checkpoints.CheckpointUriError, match="--fresh deletes checkpoints only, and 2024 is named"):
        checkpoints.clear_local_checkpoints(str(root), A)
    assert (root / "10").is_dir() and (root / "2024").exists()


def _plant(root: Path, where: str) -> Path:
    """A user's file planted where `--fresh` would delete it; returns it."""
    if where == "the issue's 5/ with garbage step metadata":
        (root / "5").mkdir()
        (root / "5" / "_CHECKPOINT_METADATA").write_text("garbage {")
        planted = root / "5" / "thesis.tex"
    elif where == "this job's committed step":
        planted = root / "10" / "thesis.tex"
    elif where == "this job's save cut short":
        shutil.copytree(root / "20", root / "30.orbax-checkpoint-tmp-1234")
        planted = root / "30.orbax-checkpoint-tmp-1234" / "thesis.tex"
    else:  # a folder named like an item's temporary of another item, i.e. not Orbax's
        planted = root / "20" / "notes.orbax-checkpoint-tmp" / "thesis.tex"
        planted.parent.mkdir()
    planted.write_text("\\documentclass{article}")
    return planted


@pytest.mark.parametrize("where", ["the issue's 5/ with garbage step metadata", "this job's committed step",
                                   "this job's save cut short", "a folder Orbax would not write in a step"])
def test_a_step_folder_holding_anything_orbax_does_not_write_refuses_and_nothing_is_deleted(tmp_path, where):
    """New-user trial (issue 31 FAIL 2's kind): `5/` with a garbage `_CHECKPOINT_METADATA` and the user's
    `thesis.tex`, beside this job's real Orbax steps, was deleted whole by --fresh (as a corrupt step of this
    job). A step folder is deleted only when all in it is Orbax's; else one line names it, nothing goes."""
    root = tmp_path / "ck"
    _save(str(root), A, 10, 20)
    planted = _plant(root, where)
    before = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    folder = planted.relative_to(root).parts[0]
    with pytest.raises(checkpoints.CheckpointUriError) as refused:
        checkpoints.clear_local_checkpoints(str(root), A)
    line = str(refused.value)
    entry = planted.relative_to(root / folder).parts[0]
    assert "\n" not in line and f"step folder {folder} holds {entry}, which Orbax does not write" in line, line
    assert line.endswith("nothing was deleted"), line
    assert planted.read_text() == "\\documentclass{article}"
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == before  # not one file gone


@pytest.mark.parametrize("inside", ["state/notes.txt", "data/notes.txt", "state/d/my-results.csv",
                                    "state/ocdbt.process_0/extra/x", "state.orbax-checkpoint-tmp-17/notes.txt"])
def test_a_users_file_inside_a_steps_item_folder_refuses_and_nothing_is_deleted(tmp_path, inside):
    """New-user trial: a file of the user's inside a step's `state/` folder went with the step (the item folders'
    contents were taken as Orbax's unseen). Only what Orbax writes in an item passes; else one line names it."""
    root = tmp_path / "ck"
    _save(str(root), A, 10, 20)
    if inside.startswith("state.orbax"):
        shutil.copytree(root / "20" / "state", root / "20" / "state.orbax-checkpoint-tmp-17")
    planted = root / "20" / inside
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.write_text("mine")
    before = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    with pytest.raises(checkpoints.CheckpointUriError) as refused:
        checkpoints.clear_local_checkpoints(str(root), A)
    line = str(refused.value)
    shown = inside if "extra" not in inside else "state/ocdbt.process_0/extra"
    assert "\n" not in line and f"step folder 20 holds {shown}, which Orbax does not write" in line, line
    assert planted.read_text() == "mine"
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == before


def test_everything_orbax_writes_in_a_step_passes_the_check(tmp_path):
    """The check knows Orbax's real step layout: steps the Checkpointer saved (and its item temporaries) pass."""
    root = tmp_path / "ck"
    _save(str(root), A, 10)
    assert checkpoints.unexpected_step_entry(root / "10") is None
    shutil.copytree(root / "10" / "state", root / "10" / "state.orbax-checkpoint-tmp-17")
    assert checkpoints.unexpected_step_entry(root / "10") is None
    (root / "10" / "metrics").symlink_to(root / "10" / "data", target_is_directory=True)
    assert checkpoints.unexpected_step_entry(root / "10") == "metrics"  # a link is never Orbax's
