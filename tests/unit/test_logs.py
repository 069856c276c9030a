"""The JSON log format: extra fields are top-level keys a log query can filter on."""

import json
import logging

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
