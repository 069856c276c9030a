"""The kopf handlers are registered on the functions meant (a decorator above the wrong `def` is silent:
kopf then calls that function with its keyword arguments on every event, and the real handler never runs).
"""

import kopf

from elastic_jax.k8s_operator import handlers, wake


def _names(registry) -> list[str]:
    return sorted(h.fn.__name__ for h in registry.get_all_handlers())


def test_each_kopf_decorator_sits_on_its_handler():
    reg = kopf.get_default_registry()
    # the latency path (a worker pod changed), and the wake-ups of the jobs' reconcile daemons
    assert _names(reg._watching) == ["job_event", "job_jobset_event", "job_pod_event", "worker_pod_event"]
    assert _names(reg._spawning) == ["reconcile_job"]
    assert all(isinstance(h, kopf._core.intents.handlers.DaemonHandler) for h in reg._spawning.get_all_handlers())
    assert {"job_event", "job_pod_event", "job_jobset_event"} <= set(wake.WAKE_HANDLERS)  # (their log lines dropped)
    assert _names(reg._changing) == ["job_created", "job_deleted"]
    assert {"job_pods", "job_jobsets"} <= set(_names(reg._indexing))
    assert handlers.worker_pod_event.__name__ == "worker_pod_event"
