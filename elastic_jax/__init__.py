"""elastic-jax: keep multi-slice JAX training running through hardware failure.

Subpackages (each lives in its component folder; `pyproject.toml` maps them):
  elastic_jax.api           shared models: the ElasticTrainingJob CRD, control-API messages
  elastic_jax.controller    controller_image/controller: the training loop and elastic manager
  elastic_jax.worker        worker_image/worker: the CPU slice worker
  elastic_jax.k8s_operator  operator/k8s_operator: the kopf operator
  elastic_jax.controller.runtime  library mode: `elastic_jax.connect()` in the user's own training program
"""

__version__ = "0.1.0"

# Library mode (docs/bring-your-own-loop.md): `elastic_jax.connect()` in the user's own program.
# Loaded on first use, so `import elastic_jax` (the CLI, the operator) does not load JAX.
_LIBRARY = {"connect": "elastic_jax.controller.runtime", "Runtime": "elastic_jax.controller.runtime",
            "RuntimeConfigError": "elastic_jax.controller.runtime",
            "ScaleUpSignalError": "elastic_jax.controller.elastic.errors",
            "SliceDownError": "elastic_jax.controller.elastic.errors",
            "UserCodeError": "elastic_jax.controller.elastic.errors",
            "ElasticRuntimeError": "elastic_jax.controller.elastic.errors",
            "StopRequested": "elastic_jax.controller.elastic.errors",
            # checkpoints through the library (Runtime.restore / Runtime.save)
            "Restored": "elastic_jax.controller.runtime",
            "CheckpointUriError": "elastic_jax.api.checkpoints",
            "CheckpointMismatchError": "elastic_jax.api.checkpoints",
            "CheckpointForeignError": "elastic_jax.api.checkpoints",
            "CheckpointSaveError": "elastic_jax.controller.checkpointing",
            # pathways-utils' Manager on the operator's slice reports (needs pathwaysutils installed)
            "SliceReportManager": "elastic_jax.controller.elastic.pathways_utils",
            "SliceReportHealthChecker": "elastic_jax.controller.elastic.pathways_utils"}
__all__ = ["__version__", *_LIBRARY]


def __getattr__(name: str):
    if name in _LIBRARY:
        import importlib

        return getattr(importlib.import_module(_LIBRARY[name]), name)
    raise AttributeError(f"module 'elastic_jax' has no attribute {name!r}")
