"""Issue 31 FAIL 1 (c) / RISK 7: a manifest nested too deep is refused in one line naming the field, by the
model, the manifest reader and `elastic-jax validate` (exit 2), at any depth the API server accepts (10000),
never a RecursionError traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from pydantic import ValidationError

from elastic_jax.api import nesting
from elastic_jax.api.job import TrainerSpec
from elastic_jax.api.manifest import ManifestError, load_manifest, parse_manifest

WORDS = "spec.controller.trainer.config nests deeper than 64 levels"


def _nested(levels: int):
    """A config value `levels` deep: a mapping holding lists inside lists."""
    value: object = []
    for _ in range(levels - 2):
        value = [value]
    return {"x": value}


def _manifest(config) -> dict:
    return {"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob", "metadata": {"name": "deep"},
            "spec": {"slices": {"count": 1}, "training": {"steps": 1, "globalBatchSize": 1},
                     "checkpoint": {"uri": "/tmp/ck"},
                     "controller": {"trainer": {"entryPoint": "m:f", "config": config}}}}


def _json_text(levels: int) -> str:
    """The manifest as JSON text, built as text (json.dumps itself recurses)."""
    head = json.dumps(_manifest({"x": "HOLE"}))
    return head.replace('"HOLE"', "[" * (levels - 1) + "]" * (levels - 1))


def test_too_deep_counts_levels():
    assert not nesting.too_deep(1, 0)
    assert nesting.too_deep([], 0) and not nesting.too_deep([], 1)
    assert not nesting.too_deep(_nested(64), 64) and nesting.too_deep(_nested(65), 64)


def test_the_model_takes_64_levels_and_refuses_65_naming_the_field():
    assert TrainerSpec(entry_point="m:f", config=_nested(64)).config
    with pytest.raises(ValidationError, match=WORDS):
        TrainerSpec(entry_point="m:f", config=_nested(65))


@pytest.mark.parametrize("levels", [65, 400, 10_000])
def test_parse_manifest_refuses_a_deep_config_in_one_line(levels):
    with pytest.raises(ManifestError) as e:
        parse_manifest(_manifest(_nested(levels)), "")
    assert str(e.value) == WORDS


def test_a_deep_field_outside_the_config_is_refused_naming_it():
    data = _manifest({})
    data["metadata"]["labels"] = _nested(150)
    with pytest.raises(ManifestError, match="^metadata nests deeper than 100 levels$"):
        parse_manifest(data, "")


# (block style at 10,000 levels is ~100 MB of indentation: past the 3 MiB a manifest file may be, refused for
# its size first; 1,500 levels is ~2.3 MB)
@pytest.mark.parametrize("form, levels", [("json", 400), ("json", 10_000), ("yaml-block", 400), ("yaml-block", 1_500)])
def test_load_manifest_refuses_deep_yaml_or_json_in_one_line(tmp_path, levels, form):
    path = tmp_path / "deep.yaml"
    if form == "json":
        path.write_text(_json_text(levels))
    else:  # block style: one indented `- ` per level
        lines = ["apiVersion: elasticjax.dev/v1alpha1", "kind: ElasticTrainingJob", "metadata: {name: deep}",
                 "spec:", "  controller:", "    trainer:", "      entryPoint: m:f", "      config:", "        x:"]
        lines += ["  " * (5 + i) + "-" for i in range(levels)]
        path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ManifestError) as e:
        load_manifest(path)
    assert str(e.value).startswith(f"{path}: {WORDS} (line ")
    assert "\n" not in str(e.value)


def test_validate_prints_one_line_and_exits_2_on_a_config_400_deep(tmp_path):
    """RISK 7: a RecursionError traceback (exit 1) before."""
    path = tmp_path / "deep.json"
    path.write_text(_json_text(400))
    result = subprocess.run([sys.executable, "-m", "elastic_jax.cli", "validate", str(path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip() == f"error: {path}: {WORDS} (line 1)", result.stderr[-2000:]
