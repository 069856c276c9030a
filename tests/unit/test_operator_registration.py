"""The kopf handlers are registered on the functions meant (a decorator above the wrong `def` is silent:
kopf then calls that function with its keyword arguments on every event, and the real handler never runs).
"""

import kopf

from elastic_jax.k8s_operator import handlers


def _names(registry) -> list[str]:
    return sorted(h.fn.__name__ for h in registry.get_all_handlers())


def test_each_kopf_decorator_sits_on_its_handler():
    reg = kopf.get_default_registry()
    assert _names(reg._watching) == ["worker_pod_event"]  # the latency path: a worker pod changed
    assert _names(reg._spawning) == ["reconcile_job"]
    assert _names(reg._changing) == ["job_created", "job_deleted"]
    assert {"job_pods", "job_jobsets"} <= set(_names(reg._indexing))
    assert handlers.worker_pod_event.__name__ == "worker_pod_event"
