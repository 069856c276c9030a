"""Both controller backends implement the whole `Backend` protocol, and the table covers every spec.backend."""

import typing

import pytest

from elastic_jax.api.job import ElasticTrainingJobSpec
from elastic_jax.controller import backend
from elastic_jax.controller.backend_cpu import CpuBackend
from elastic_jax.controller.backend_pathways import PathwaysBackend

MEMBERS = [n for n in dir(backend.Backend) if not n.startswith("_")] + ["keeps_state_on_slice_loss"]


@pytest.mark.parametrize("cls", [CpuBackend, PathwaysBackend])
def test_backend_implements_every_member(cls):
    missing = [m for m in MEMBERS if not hasattr(cls, m)]
    assert not missing, f"{cls.__name__} lacks {missing}"
    assert isinstance(cls.keeps_state_on_slice_loss, bool)


def test_every_spec_backend_has_a_factory():
    names = set(typing.get_args(ElasticTrainingJobSpec.model_fields["backend"].annotation))
    assert names == set(backend.BACKENDS)
