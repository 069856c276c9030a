"""docs/crd-reference.md is generated from the pydantic models (through the CRD schema) and kept fresh."""

from __future__ import annotations

from elastic_jax.api import crd_reference
from elastic_jax.api.status import ElasticTrainingJobStatus
from elastic_jax.api.job import ElasticTrainingJobSpec


def test_reference_is_up_to_date():
    assert crd_reference.REFERENCE_PATH.read_text() == crd_reference.render(), \
        "docs/crd-reference.md is stale: run python -m elastic_jax.api.crd_reference"


def test_check_flags_a_stale_file(tmp_path):
    stale = tmp_path / "ref.md"
    stale.write_text("# old\n")
    assert crd_reference.main(["--check", "--output", str(stale)]) == 1
    assert crd_reference.main(["--output", str(stale)]) == 0
    assert crd_reference.main(["--check", "--output", str(stale)]) == 0


def test_every_spec_and_status_field_is_documented_with_its_description():
    text = crd_reference.render()
    for model in (ElasticTrainingJobSpec, ElasticTrainingJobStatus):
        for name, field in model.model_fields.items():
            alias = field.alias or name
            assert f"| `{alias}` |" in text, alias
            if field.description:
                assert field.description.split(".")[0].replace("|", "\\|")[:40] in text, alias
    assert "### `status.goodput.seconds`" in text and "### `spec.slices`" in text
    # the column list names the goodput breakdown and where it shows
    assert "| GOODPUT | `.status.goodput.percent` | always |" in text
    assert "| PRODUCTIVE | `.status.goodput.seconds.productive` | `-o wide` |" in text
