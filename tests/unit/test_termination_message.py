"""The controller's one-line reason reaches the pod's termination message (and so status.failureReason)."""

from __future__ import annotations

import os

from elastic_jax.controller import main as controller_main
from elastic_jax.exit_codes import ControllerExit


def test_bad_input_writes_its_error_line_to_the_termination_message_file(tmp_path, monkeypatch):
    log = tmp_path / "termination-log"
    log.write_text("")  # the kubelet creates it; the controller only writes it
    monkeypatch.setenv(controller_main.TERMINATION_MESSAGE_ENV, str(log))
    code = controller_main.main(["--manifest", str(tmp_path / "missing.yaml")])
    assert code == ControllerExit.BAD_INPUT
    text = log.read_text()
    assert text.startswith("error: ") and "missing.yaml" in text and text.count("\n") == 1


def test_termination_message_is_one_line_and_never_created(tmp_path, monkeypatch):
    log = tmp_path / "termination-log"
    log.write_text("old")
    monkeypatch.setenv(controller_main.TERMINATION_MESSAGE_ENV, str(log))
    controller_main.write_termination_message("error: restart budget exhausted:\n2 slice failures")
    assert log.read_text() == "error: restart budget exhausted: 2 slice failures\n"
    absent = tmp_path / "absent"
    monkeypatch.setenv(controller_main.TERMINATION_MESSAGE_ENV, str(absent))
    controller_main.write_termination_message("error: x")  # no file (a local run): nothing, no error
    assert not absent.exists()
    monkeypatch.setenv(controller_main.TERMINATION_MESSAGE_ENV, str(tmp_path))  # unwritable: ignored
    controller_main.write_termination_message("error: x")
    assert os.path.isdir(tmp_path)
