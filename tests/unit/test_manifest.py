"""Manifest validation: every mistake is one line naming the field."""

from pathlib import Path

import pytest

from elastic_jax.api.manifest import ManifestError, load_manifest, parse_manifest

ROOT = Path(__file__).resolve().parents[2]


def _job(**spec_overrides):
    spec = {
        "slices": {"count": 2},
        "training": {"steps": 10, "globalBatchSize": 4},
        "checkpoint": {"uri": "/tmp/ckpt"},
    }
    spec.update(spec_overrides)
    return {"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob", "metadata": {"name": "t"}, "spec": spec}


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*cpu*.yaml")))
def test_examples_parse(path):
    job = load_manifest(path)
    assert job.spec.backend == "cpu"


def test_defaults_min_slices_is_count():
    job = parse_manifest(_job())
    assert job.spec.slices.minimum == 2
    assert job.spec.elasticity.max_restarts == 20


@pytest.mark.parametrize(
    "override, expected",
    [
        ({"slices": {"count": 0}}, "spec.slices.count: Input should be greater than or equal to 1"),
        ({"slices": {"count": 2, "minSlices": 3}}, "spec.slices.minSlices (3) must not exceed spec.slices.count (2)"),
        ({"bogus": 1}, "spec.bogus: unknown field"),
        ({"slices": {"count": 2, "cuont": 1}}, "spec.slices.cuont: unknown field"),
        ({"backend": "gpu"}, "spec.backend: Input should be 'cpu' or 'pathways'"),
        ({"slices": {"count": 5}}, "spec.training.globalBatchSize (4) must be at least spec.slices.count (5)"),
        ({"backend": "pathways"}, "backend pathways needs spec.slices.accelerator and spec.slices.topology"),
        ({"controller": {"trainer": {"entryPoint": "nocolon"}}}, "spec.controller.trainer.entryPoint 'nocolon' must look like"),
    ],
)
def test_invalid_spec_names_field(override, expected):
    with pytest.raises(ManifestError) as info:
        parse_manifest(_job(**override), "job.yaml")
    message = str(info.value)
    assert expected in message
    assert "\n" not in message
    assert message.startswith("job.yaml: ")


def test_bad_name_and_kind():
    data = _job()
    data["metadata"]["name"] = "Bad_Name"
    data["kind"] = "Job"
    message = str(pytest.raises(ManifestError, parse_manifest, data).value)
    assert "kind: Input should be 'ElasticTrainingJob'" in message
    assert "metadata.name 'Bad_Name' must be a DNS-1123 label" in message


def test_malformed_yaml(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("spec:\n  slices: [1,\n")
    message = str(pytest.raises(ManifestError, load_manifest, p).value)
    assert "malformed YAML" in message and "\n" not in message


def test_missing_file_and_multiple_documents(tmp_path):
    assert "cannot read manifest" in str(pytest.raises(ManifestError, load_manifest, tmp_path / "nope.yaml").value)
    p = tmp_path / "two.yaml"
    p.write_text("a: 1\n---\nb: 2\n")
    assert "exactly one YAML document, found 2" in str(pytest.raises(ManifestError, load_manifest, p).value)


def test_binary_file(tmp_path):
    p = tmp_path / "b.yaml"
    p.write_bytes(bytes(range(256)) * 4)
    message = str(pytest.raises(ManifestError, load_manifest, p).value)
    assert "not a text file" in message
