"""The shared checkpoint-location rules (elastic_jax.api.checkpoints): pure parts."""

from elastic_jax.api import checkpoints
from elastic_jax.api.identity import JobIdentity

A = JobIdentity(namespace="local", name="a", uid="uid-a")
B = JobIdentity(namespace="local", name="b", uid="uid-b")


def test_the_commit_marker_name_is_orbaxs():
    from orbax.checkpoint._src.path import atomicity_types

    assert checkpoints.COMMIT_SUCCESS_FILE == atomicity_types.COMMIT_SUCCESS_FILE


def test_writer_problem_names_the_field_the_step_and_the_way_out():
    assert checkpoints.writer_problem(10, A, A, "SameJob", "/c") is None
    assert checkpoints.writer_problem(10, B, A, "Any", "/c") is None
    assert checkpoints.writer_problem(10, None, A, "Any", "/c") is None
    foreign = checkpoints.writer_problem(10, B, A, "SameJob", "/c")
    assert foreign.startswith("spec.checkpoint.uri '/c': checkpoint step 10 was written by another job, local/b (uid uid-b)")
    assert "spec.checkpoint.resumeFrom: Any" in foreign
    # a local job of the same name through another path (a link, a moved folder): said so (a new user's trial)
    moved = JobIdentity(namespace="local", name=A.name, uid="uid-elsewhere")
    other_path = checkpoints.writer_problem(10, moved, A, "SameJob", "/c")
    assert "written by a job of this name through another checkpoint path" in other_path, other_path
    assert "a symbolic link or a moved folder is another path" in other_path
    assert "spec.checkpoint.resumeFrom: Any" in other_path
    unknown = checkpoints.writer_problem(10, None, A, "SameJob", "/c")
    assert "has no writer identity" in unknown and "spec.checkpoint.resumeFrom: Any" in unknown


def test_beyond_steps_problem():
    assert checkpoints.beyond_steps_problem(None, 10, "/c") is None
    assert checkpoints.beyond_steps_problem(10, 10, "/c") is None
    assert "holds checkpoint step 11, beyond spec.training.steps (10)" in checkpoints.beyond_steps_problem(11, 10, "/c")


def test_short_reason_drops_object_reprs_and_is_bounded():
    """A TensorStore read error as the controller met it: its repr (cut short by the message itself) is junk
    to a user; the fallback reason keeps the type and the first line, bounded."""
    from elastic_jax.api.checkpoints import short_reason

    error = Exception("Encountered error while reading array index: (slice(0, 32, 1),). See full TensorStore "
                      "details: <bound method pybind11_detail_function_record_v1_system_libstdcpp_gxx_abi_1xxx.spec "
                      "of TensorStore({'driver': 'zarr', 'kvstore': {'path': 'w/'}})>\nsecond line")
    assert short_reason(error) == "Exception: Encountered error while reading array index: (slice(0, 32, 1),)."
    cut = Exception("reading failed. See full TensorStore details: <bound method pybind11_detail_function_rec...")
    assert short_reason(cut) == "Exception: reading failed."
    assert len(short_reason(ValueError("x" * 1000), 100)) == 100
    assert short_reason(OSError()) == "OSError"


def test_a_local_step_without_its_commit_marker_is_uncommitted_even_when_it_names_this_job(tmp_path):
    """A new user's trial: `cp -a 30 40 && rm 40/commit_success.txt` in a job's own local folder was resumed
    from (Orbax lists a local step folder by its name). Only on GCS is this job's own cut-short save excused."""
    from tests.support.runs import fake_step

    for step in (10, 20):
        fake_step(tmp_path, step, A)
    (fake_step(tmp_path, 30, A) / "commit_success.txt").unlink()
    (fake_step(tmp_path, 40, B) / "commit_success.txt").unlink()
    assert checkpoints.uncommitted_steps(tmp_path, A) == [30, 40]
    assert checkpoints.uncommitted_steps(tmp_path, None) == [30, 40]
