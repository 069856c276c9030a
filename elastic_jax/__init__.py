"""elastic-jax: keep multi-slice JAX training running through hardware failure.

Subpackages (each lives in its design-card folder):
  elastic_jax.api           shared models: the ElasticTrainingJob CRD, control-API messages
  elastic_jax.controller    controller_image/controller: the training loop and elastic manager
  elastic_jax.worker        worker_image/worker: the CPU slice worker
  elastic_jax.k8s_operator  operator/k8s_operator: the kopf operator
"""

__version__ = "0.1.0"
