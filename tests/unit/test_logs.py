"""The JSON log format: extra fields are top-level keys a log query can filter on."""

import json
import logging
import re

from elastic_jax.logs import JsonFormatter


def _format(formatter: JsonFormatter, *args, **kwargs) -> dict:
    record = logging.getLogger("t").makeRecord("t", logging.INFO, __file__, 1, *args, **kwargs)
    return json.loads(formatter.format(record))


def test_event_fields_are_top_level_next_to_a_readable_message():
    line = _format(JsonFormatter({"slice_index": 2}), "step %d loss %.4f", (100, 2.104), None,
                   extra={"event": "step", "step": 100, "loss": 2.104})
    assert line["msg"] == "step 100 loss 2.1040"
    assert (line["event"], line["step"], line["loss"], line["slice_index"]) == ("step", 100, 2.104, 2)
    assert line["level"] == "info" and line["logger"] == "t" and isinstance(line["ts"], float)


def test_exception_goes_to_exc_and_odd_values_are_stringified():
    try:
        raise ValueError("boom")
    except ValueError:
        import sys
        line = _format(JsonFormatter(), "failed", (), sys.exc_info(), extra={"path": __import__("pathlib").Path("/x")})
    assert "ValueError: boom" in line["exc"] and line["path"] == "/x"


def _kopf_record(kind: str, name: str, msg: str, **extra) -> logging.LogRecord:
    """A record as kopf's per-object logger makes it (its adapter's `extra`)."""
    import kopf
    from kopf._core.actions.loggers import ObjectLogger

    body = {"apiVersion": "elasticjax.dev/v1alpha1", "kind": kind,
            "metadata": {"name": name, "namespace": "demo", "uid": "u-1"}}
    adapter = ObjectLogger(body=body, settings=kopf.OperatorSettings())
    captured = []

    class Catch(logging.Handler):
        def emit(self, record):
            captured.append(record)

    handler = Catch()
    adapter.logger.addHandler(handler)
    try:
        adapter.warning(msg, extra=extra)
    finally:
        adapter.logger.removeHandler(handler)
    return captured[0]


def test_operator_and_controller_lines_share_one_schema():
    """The same keys for the same things (time, level, message, job) from kopf's object logger and from
    the controller after `bind`: one log query serves both processes."""
    from elastic_jax.logs import BASE_KEYS, bind

    operator_line = json.loads(JsonFormatter().format(_kopf_record("ElasticTrainingJob", "cpu-job", "slice 0 Down")))
    bind(namespace="demo", job="cpu-job")
    try:
        controller_line = _format(JsonFormatter(), "step %d", (3,), None, extra={"event": "step"})
    finally:
        bind(namespace=None, job=None)
    for line in (operator_line, controller_line):
        assert list(line)[:4] == list(BASE_KEYS), line
        assert (line["namespace"], line["job"]) == ("demo", "cpu-job"), line
    assert operator_line["level"] == "warning" and operator_line["msg"] == "slice 0 Down"
    # kopf's own field names and plumbing never leak in
    for key in ("message", "severity", "timestamp", "object", "k8s_ref", "k8s_skip", "settings"):
        assert key not in operator_line, (key, operator_line)
    # unbound again: later lines carry no stale job
    assert "job" not in _format(JsonFormatter(), "x", (), None)


def test_a_kopf_line_about_another_object_names_it_without_claiming_a_job():
    line = json.loads(JsonFormatter().format(_kopf_record("Pod", "w-0", "pod changed")))
    assert line["object"] == "Pod/w-0" and line["namespace"] == "demo" and "job" not in line


def test_operator_main_puts_the_product_formatter_on_kopfs_handler():
    import kopf
    from elastic_jax.k8s_operator import main as op_main

    root = logging.getLogger()
    before = list(root.handlers)
    try:
        kopf.configure(log_format=kopf.LogFormat.JSON)
        op_main._use_product_log_schema("json")
        added = [h for h in root.handlers if h not in before]
        assert added and all(isinstance(h.formatter, JsonFormatter) for h in added)
    finally:
        for h in list(root.handlers):
            if h not in before:
                root.removeHandler(h)


def test_operator_text_lines_have_the_time_and_the_job_and_no_timer_successes():
    """Issue 11 (status truth): the plain operator log had no timestamps or job names, and half of it
    was kopf's "Timer 'reconcile_job' succeeded." every second per job."""
    import kopf
    from elastic_jax.k8s_operator import main as op_main
    from elastic_jax.logs import TextFormatter

    root = logging.getLogger()
    before = list(root.handlers)
    try:
        kopf.configure(log_format=kopf.LogFormat.PLAIN)
        op_main._use_product_log_schema("text")
        [handler] = [h for h in root.handlers if h not in before]
        assert isinstance(handler.formatter, TextFormatter)
        line = handler.format(_kopf_record("ElasticTrainingJob", "cpu-job", "slice 0 Ready -> Down"))
        assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z WARNING kopf", line), line
        assert "[demo/cpu-job]" in line and line.endswith("slice 0 Ready -> Down"), line
        assert not handler.filter(_kopf_record("ElasticTrainingJob", "cpu-job", "Timer 'reconcile_job' succeeded."))
        assert handler.filter(_kopf_record("ElasticTrainingJob", "cpu-job", "Timer 'reconcile_job' failed: boom"))
        assert handler.filter(_kopf_record("ElasticTrainingJob", "cpu-job", "Handler 'job_created' succeeded."))
        # the wake-ups of the reconcile daemons: one line per watch event
        assert not handler.filter(_kopf_record("ElasticTrainingJob", "cpu-job", "Handler 'job_event' succeeded."))
        assert not handler.filter(_kopf_record("Pod", "cpu-job-w0", "Handler 'job_pod_event' succeeded."))
        assert handler.filter(_kopf_record("Pod", "cpu-job-w0", "Handler 'job_pod_event' failed: boom"))
    finally:
        for h in list(root.handlers):
            if h not in before:
                root.removeHandler(h)


def test_operator_events_name_the_operator_not_kopf():
    import argparse
    import kopf
    from elastic_jax.k8s_operator import main as op_main

    settings = kopf.OperatorSettings()
    op_main._configure(settings, argparse.Namespace(workers=2))
    assert settings.posting.reporting_component == "elastic-jax-operator"
    assert settings.posting.reporting_instance and settings.posting.reporting_instance != "dev"
