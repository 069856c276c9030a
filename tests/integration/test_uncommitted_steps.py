"""Issue 31 item 10 (orbax#394): step directories that exist without Orbax's commit marker.

A checkpoint copied without `commit_success.txt` (Orbax writes it last; on GCS
it is the commit itself) used to be invisible on GCS: the job started from
step 0 and its saves overwrote, then deleted, the copied steps. On local disk
Orbax lists any directory named by a number as committed. Such steps are
neither data to resume from nor space to save over: the location is refused
(exit 2) naming the steps and the uri, and nothing is touched. A step this
job's own save left uncommitted (its controller killed mid-save) is not
refused: Orbax saves it again.

Real Orbax writes every step, on disk and on the GCS emulator; the copies are
made the way a user makes them (every file but the marker).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import pytest
import yaml

from elastic_jax.api import identity
from elastic_jax.api.checkpoints import CheckpointUncommittedError
from elastic_jax.controller.checkpointing import Checkpointer
from tests.support.runs import ROOT, job_manifest

CLI = str(Path(sys.executable).parent / "elastic-jax")
ORIGINAL = identity.JobIdentity(namespace="team-a", name="pretrain", uid="uid-original")
NEW_JOB = identity.JobIdentity(namespace="team-b", name="finetune", uid="uid-new")


def _save_steps(uri: str, writer, steps=(10, 20)) -> None:
    with Checkpointer(uri, interval_steps=10, max_to_keep=5, writer=writer) as ckpt:
        for step in steps:
            assert ckpt.maybe_save(step, {"w": jnp.full((4,), float(step))}, {"next_batch_index": step})
            ckpt.wait_until_finished()


def _copy_local_without_markers(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("commit_success.txt"))


def _copy_gcs_without_markers(bucket: str, src: str, dst: str) -> list[str]:
    from google.cloud import storage

    b = storage.Client().bucket(bucket)
    copied = []
    for blob in storage.Client().list_blobs(bucket, prefix=src + "/"):
        if blob.name.endswith("/commit_success.txt"):
            continue
        b.copy_blob(blob, b, dst + blob.name.removeprefix(src))
        copied.append(dst + blob.name.removeprefix(src))
    return copied


def _names(bucket: str, prefix: str) -> set[str]:
    from google.cloud import storage

    return {b.name for b in storage.Client().list_blobs(bucket, prefix=prefix + "/")}


def test_gcs_steps_copied_without_commit_markers_refuse_the_job_and_stay(gcs_emulator):
    gcs_emulator.make_bucket("ej-copied")
    _save_steps("gs://ej-copied/orig", ORIGINAL)
    copied = _copy_gcs_without_markers("ej-copied", "orig", "copy")
    assert any(n.startswith("copy/20/") for n in copied)
    before = _names("ej-copied", "copy")
    with pytest.raises(CheckpointUncommittedError) as e:
        Checkpointer("gs://ej-copied/copy", interval_steps=10, max_to_keep=1, writer=NEW_JOB)
    message = str(e.value)
    assert "spec.checkpoint.uri 'gs://ej-copied/copy'" in message and "step(s) 10, 20" in message, message
    assert "never committed" in message and "\n" not in message
    assert _names("ej-copied", "copy") == before  # nothing saved over, nothing deleted


def test_a_gcs_save_of_this_job_cut_short_is_saved_again_not_refused(gcs_emulator):
    """A controller killed mid-save on GCS leaves its step without the marker: that is the job's own, not a copy."""
    from google.cloud import storage

    gcs_emulator.make_bucket("ej-own")
    _save_steps("gs://ej-own/job", ORIGINAL)
    storage.Client().bucket("ej-own").blob("job/20/commit_success.txt").delete()
    with Checkpointer("gs://ej-own/job", interval_steps=10, max_to_keep=5, writer=ORIGINAL) as ckpt:
        assert ckpt.latest_committed_step() == 10
        assert ckpt.maybe_save(20, {"w": jnp.full((4,), 2.0)}, {"next_batch_index": 20})
        ckpt.wait_until_finished()
        assert ckpt.latest_committed_step() == 20


def test_a_gcs_save_cut_short_before_its_metadata_is_saved_again_not_refused(gcs_emulator):
    """A controller killed before its save wrote the step's metadata leaves neither marker nor writer (the chaos
    cluster test's restart arm: the recreated controller refused step 20 and the job Failed)."""
    from google.cloud import storage

    gcs_emulator.make_bucket("ej-early")
    _save_steps("gs://ej-early/job", ORIGINAL)
    bucket = storage.Client().bucket("ej-early")
    for name in ("commit_success.txt", "_CHECKPOINT_METADATA"):
        bucket.blob(f"job/20/{name}").delete()
    with Checkpointer("gs://ej-early/job", interval_steps=10, max_to_keep=5, writer=ORIGINAL) as ckpt:
        assert ckpt.latest_committed_step() == 10


def test_local_steps_copied_without_commit_markers_refuse_the_job(tmp_path):
    _save_steps(str(tmp_path / "orig"), ORIGINAL)
    _copy_local_without_markers(tmp_path / "orig", tmp_path / "copy")
    with pytest.raises(CheckpointUncommittedError) as e:
        Checkpointer(str(tmp_path / "copy"), interval_steps=10, max_to_keep=1, writer=NEW_JOB)
    assert "step(s) 10, 20" in str(e.value) and str(tmp_path / "copy") in str(e.value)
    assert sorted(p.name for p in (tmp_path / "copy").iterdir() if p.name.isdigit()) == ["10", "20"]


def _validate(tmp_path: Path, manifest: dict, *flags: str, env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return subprocess.run([CLI, "validate", *flags, str(path)], capture_output=True, text=True, timeout=180,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def _one_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]


def test_validate_refuses_a_local_copy_without_markers_even_with_resume_from_any(tmp_path):
    """`resumeFrom: Any` takes another job's committed steps; it does not make uncommitted ones committed."""
    _save_steps(str(tmp_path / "orig"), ORIGINAL)
    _copy_local_without_markers(tmp_path / "orig", tmp_path / "ckpt")
    m = job_manifest("copied", tmp_path, checkpoint={"uri": str(tmp_path / "ckpt"), "intervalSteps": 10,
                                                     "resumeFrom": "Any"})
    _one_error(_validate(tmp_path, m), "step(s) 10, 20", "never committed")
    _one_error(_validate(tmp_path, m, "--trainer"), "step(s) 10, 20", "never committed")


def test_validate_trainer_refuses_a_gcs_copy_without_markers(tmp_path, gcs_emulator):
    gcs_emulator.make_bucket("ej-validate")
    _save_steps("gs://ej-validate/orig", ORIGINAL)
    _copy_gcs_without_markers("ej-validate", "orig", "copy")
    m = job_manifest("copied", tmp_path, checkpoint={"uri": "gs://ej-validate/copy", "intervalSteps": 10,
                                                     "resumeFrom": "Any"})
    _one_error(_validate(tmp_path, m, "--trainer", env=gcs_emulator.env),
               "spec.checkpoint.uri 'gs://ej-validate/copy'", "step(s) 10, 20")
