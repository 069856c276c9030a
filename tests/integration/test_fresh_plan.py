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
