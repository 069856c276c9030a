"""`RunLock`: one launcher per run directory; a gone launcher's processes still holding it are waited for."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading

import pytest

from elastic_jax.local import run_folder
from elastic_jax.local.launcher import LaunchError, RunLock


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _hold(path, pid: int) -> int:
    """Another open file of the lock holding its flock (as a controller that inherited it does)."""
    (path.parent / run_folder.MARKER).write_text("")  # (the run that took the folder marked it)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.ftruncate(fd, 0)
    os.write(fd, str(pid).encode())
    return fd


def test_a_live_launcher_holding_the_lock_is_refused_at_once(tmp_path):
    with RunLock(tmp_path) as held:
        assert held.fd is not None
        with pytest.raises(LaunchError, match=rf"already running from {tmp_path} \(launcher pid {os.getpid()}\)"):
            RunLock(tmp_path, wait_s=30).acquire()
    assert held.fd is None


def test_a_gone_launchers_holder_is_waited_for_and_named_when_it_does_not_stop(tmp_path):
    gone = _dead_pid()
    fd = _hold(tmp_path / "launcher.lock", gone)
    said: list[str] = []
    try:
        with pytest.raises(LaunchError, match=rf"launcher pid {gone}, gone\) still has a process holding .*fuser"):
            RunLock(tmp_path, wait_s=0.3, on_wait=said.append).acquire()
        assert len(said) == 1 and f"launcher pid {gone}) is gone" in said[0] and "waiting up to" in said[0]
        # it stops while the next run waits: that run takes the lock and writes its own pid
        threading.Timer(0.3, os.close, (fd,)).start()
        fd = None
        with RunLock(tmp_path, wait_s=30, on_wait=said.append):
            assert (tmp_path / "launcher.lock").read_text() == str(os.getpid())
    finally:
        if fd is not None:
            os.close(fd)


def test_a_checkpoint_folder_is_locked_once_and_free_again_after_release(tmp_path):
    """`CheckpointLock` shares `RunLock`'s holding and release (`_HeldFlock`): a second run on the same local
    checkpoints is refused while the first holds them; gs:// is not locked."""
    from elastic_jax.local.launcher import CheckpointLock

    uri = str(tmp_path / "ckpt")
    with CheckpointLock(uri) as held:
        assert held.fd is not None
        with pytest.raises(LaunchError, match="is in use by another elastic-jax run"):
            CheckpointLock(uri).acquire()
    assert held.fd is None
    with CheckpointLock(uri) as again:
        assert again.fd is not None
    with CheckpointLock("gs://bucket/prefix") as remote:
        assert remote.fd is None


@pytest.mark.parametrize("earlier", [None, run_folder.MARKER])
def test_a_new_empty_or_earlier_runs_folder_is_taken_and_marked(tmp_path, earlier):
    """Folders a run made (`runs/<job>`: the marker) keep working, and so does a second run of a folder a run
    marked."""
    folder = tmp_path / "run"
    if earlier is not None:
        folder.mkdir(mode=0o700)
        (folder / earlier).write_text("")
        (folder / "token").write_text("old token")  # (an earlier run's: replaced by the next one)
    for _ in range(2):
        with RunLock(folder):
            assert (folder / run_folder.MARKER).is_file()


@pytest.mark.parametrize("name", run_folder.EARLIER_RUN_FILES)
def test_a_users_regular_file_named_like_a_run_file_is_no_proof(tmp_path, name):
    """New-user trial: a folder of a user's files holding a regular `launcher.lock` or `controller.log` was taken as
    an earlier run's and its files of the run's names replaced. Only the marker proves a run folder."""
    folder = tmp_path / "mine"
    folder.mkdir(mode=0o700)
    (folder / name).write_text("my own notes")
    (folder / "token").write_text("my token")
    with pytest.raises(LaunchError) as refused:
        RunLock(folder).acquire()
    line = str(refused.value)
    assert "\n" not in line and line.startswith(f"--workdir {folder}: is not empty and not an earlier elastic-jax run's")
    assert f"no {run_folder.MARKER}" in line and f"add an empty file {run_folder.MARKER}" in line
    assert sorted(p.name for p in folder.iterdir()) == sorted([name, "token"])
    assert (folder / name).read_text() == "my own notes" and (folder / "token").read_text() == "my token"


def test_a_folder_with_other_files_or_a_planted_link_at_a_run_name_is_refused_untouched(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    for name, plant in (("token", lambda p: p.write_text("mine")), ("controller.log", lambda p: p.symlink_to(victim)),
                        (run_folder.MARKER, lambda p: p.symlink_to(victim))):
        folder = tmp_path / f"not-a-run-{name}"
        folder.mkdir(mode=0o700)
        plant(folder / name)
        with pytest.raises(LaunchError, match=rf"--workdir {folder}: is not empty and not an earlier elastic-jax run's"):
            RunLock(folder).acquire()
        assert [p.name for p in folder.iterdir()] == [name]
    assert victim.read_text() == "precious"


def test_a_run_of_another_job_in_an_earlier_runs_folder_says_so(tmp_path):
    """A new user's trial: `elastic-jax run other.yaml --workdir wd1`, where wd1 held job shortjob's run, replaced
    its logs and summary without a word. The marker records the job; another job's run says whose it replaces."""
    folder, said = tmp_path / "wd1", []
    with RunLock(folder, job="shortjob", on_note=said.append):
        pass
    with RunLock(folder, job="shortjob", on_note=said.append):  # (the same job again: nothing to say)
        pass
    assert said == []
    with RunLock(folder, job="other", on_note=said.append):
        pass
    assert said == [f"--workdir {folder} held a run of job 'shortjob'; this run of job 'other' replaces its logs, "
                    "summary, metrics and timeline"]
    # a marker from before it recorded the job (or an empty one a user added) says nothing, and is a run folder
    (folder / run_folder.MARKER).write_text("")
    with RunLock(folder, job="third", on_note=said.append):
        pass
    assert len(said) == 1 and "job: third" in (folder / run_folder.MARKER).read_text()


def test_a_run_refused_because_another_job_runs_there_leaves_its_marker_and_names_it(tmp_path):
    """Review: the marker was rewritten (and 'replaces its logs' said) before the lock was tried, so a run
    refused for a running job left the folder marked with a job that never ran there."""
    said = []
    with RunLock(tmp_path, job="a"):
        with pytest.raises(LaunchError, match=rf"^job 'a' is already running from {tmp_path} \(launcher pid"):
            RunLock(tmp_path, job="b", on_note=said.append).acquire()
        assert "job: a" in (tmp_path / run_folder.MARKER).read_text() and said == []


def test_a_run_refused_after_taking_its_new_folder_leaves_no_folder_behind(tmp_path):
    """A new user's trial: a second run on the same checkpoints, with a new --workdir, was refused ('in use by
    another elastic-jax run') but left the new folder (its marker and lock file). An exception out of the
    `with` removes the folders the lock created while they hold only those two files; a folder that existed,
    one the run wrote in, and a run that ended normally keep theirs."""
    new = tmp_path / "runs" / "job"
    with pytest.raises(LaunchError):
        with RunLock(new, job="job"):
            assert (new / run_folder.MARKER).is_file() and (new / "launcher.lock").is_file()
            raise LaunchError("refused once the folder was held")
    assert not (tmp_path / "runs").exists()

    written = tmp_path / "written"
    with pytest.raises(KeyboardInterrupt):
        with RunLock(written, job="job"):
            (written / "controller.log").write_text("started\n")
            raise KeyboardInterrupt
    assert (written / "controller.log").is_file() and (written / run_folder.MARKER).is_file()

    existing = tmp_path / "existing"
    existing.mkdir(mode=0o700)
    with pytest.raises(LaunchError):
        with RunLock(existing, job="job"):
            raise LaunchError("refused")
    assert existing.is_dir()

    with RunLock(tmp_path / "ok", job="job"):
        pass
    assert (tmp_path / "ok" / run_folder.MARKER).is_file()


def test_whether_checkpoints_are_held_is_read_without_taking_or_creating_anything(tmp_path):
    """`run` checks its checkpoints before taking their lock only while nobody holds them (a trial saw
    "uncommitted steps" while another run's --fresh was deleting them); held, it checks them once the lock is
    its own, so a SIGKILLed launcher's controller is still waited for (`RunLock`), not refused."""
    from elastic_jax.local.launcher import CheckpointLock

    uri = str(tmp_path / "ckpt")
    assert CheckpointLock(uri).is_free() and not (tmp_path / "ckpt").exists()  # missing: free, still missing
    with CheckpointLock(uri):
        assert not CheckpointLock(uri).is_free()
    assert CheckpointLock(uri).is_free()
    with CheckpointLock(uri) as again:  # (the check kept nothing)
        assert again.fd is not None
    assert CheckpointLock("gs://bucket/prefix").is_free()
