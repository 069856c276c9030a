"""Manifests that the API server refuses (at `kubectl apply`, or later when the operator creates a pod from
them), each with the field both `elastic-jax validate` and the API server must name (issue 9: one rule for
bad input).

Read by `tests/unit/test_invalid_spec.py` (validate, the operator's parse) and by
`e2e/test_bad_manifests.py` (the same list through a real API server with the generated CRD).
"""

from __future__ import annotations

import copy
from typing import Any, Callable

from elastic_jax import contract


def cpu_job(name: str = "bad") -> dict[str, Any]:
    """A valid cpu job (absolute checkpoint folder, so it passes `validate --cluster`)."""
    return {"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob",
            "metadata": {"name": name},
            "spec": {"slices": {"count": 1}, "training": {"steps": 10, "globalBatchSize": 1},
                     "checkpoint": {"uri": "/data/ck"}}}


def pathways_job(name: str = "bad") -> dict[str, Any]:
    """A valid pathways job (v5e 2x2)."""
    job = cpu_job(name)
    job["spec"].update(backend="pathways", checkpoint={"uri": "gs://bucket/ck"},
                       slices={"count": 1, "accelerator": "tpu-v5-lite-podslice", "topology": "2x2"})
    job["spec"]["training"]["globalBatchSize"] = 4  # (one example per chip: the operator refuses fewer)
    return job


def _set(base: Callable[[], dict], path: str, value: Any) -> Callable[[], dict]:
    def make() -> dict:
        job = copy.deepcopy(base())
        node = job
        keys = path.split(".")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
        return job
    return make


# (id, manifest factory, the field both refusals must name)
CASES: list[tuple[str, Callable[[], dict], str]] = [
    # a DNS subdomain (the API server's own rule for a custom resource's name) but not a DNS-1035 label (ours)
    ("name-not-a-dns-label", _set(cpu_job, "metadata.name", "a.b"), "metadata.name"),
    ("library-mode-args-without-command",
     _set(cpu_job, "spec.controller.args", ["x"]), "spec.controller.args"),
    ("library-mode-command-with-a-trainer",
     _set(_set(cpu_job, "spec.controller.command", ["python"]), "spec.controller.trainer", {"entryPoint": "a:b"}),
     "spec.controller.trainer"),
    # CEL cannot see into the free-form config: any config with a command is refused, `{}` too
    ("library-mode-command-with-an-empty-trainer-config",
     _set(_set(cpu_job, "spec.controller.command", ["python"]), "spec.controller.trainer", {"config": {}}),
     "spec.controller.trainer"),
    ("worker-cpu-request-above-limit",
     _set(cpu_job, "spec.worker.resources", {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}),
     "spec.worker.resources"),
    ("controller-memory-request-above-limit",
     _set(cpu_job, "spec.controller.resources", {"requests": {"memory": "2Gi"}, "limits": {"memory": 1073741824}}),
     "spec.controller.resources"),
    ("worker-ephemeral-storage-request-above-limit",
     _set(cpu_job, "spec.worker.resources", {"requests": {"ephemeral-storage": "2G"},
                                             "limits": {"ephemeral-storage": "1Gi"}}),
     "spec.worker.resources"),
    ("resource-name-without-domain",
     _set(cpu_job, "spec.worker.resources", {"limits": {"gpu": 1}}), "spec.worker.resources"),
    ("extended-resource-request-without-limit",
     _set(cpu_job, "spec.worker.resources", {"requests": {"example.com/gpu": 1}}), "spec.worker.resources"),
    ("extended-resource-request-not-limit",
     _set(cpu_job, "spec.worker.resources", {"requests": {"example.com/gpu": 1}, "limits": {"example.com/gpu": 2}}),
     "spec.worker.resources"),
    ("extended-resource-fraction",
     _set(cpu_job, "spec.controller.resources", {"limits": {"example.com/gpu": "1500m"}}),
     "spec.controller.resources"),
    ("negative-quantity",
     _set(cpu_job, "spec.worker.resources", {"limits": {"cpu": "-1"}}), "spec.worker.resources"),
    ("hugepages-request-without-limit",
     _set(cpu_job, "spec.worker.resources", {"requests": {"hugepages-2Mi": "4Mi"}}), "spec.worker.resources"),
    ("toleration-key-not-a-label-key",
     _set(cpu_job, "spec.worker.tolerations", [{"key": "bad key!", "operator": "Exists"}]),
     "spec.worker.tolerations[0]"),
    ("toleration-value-not-a-label-value",
     _set(cpu_job, "spec.controller.tolerations", [{"key": "k", "value": "a b"}]),
     "spec.controller.tolerations[0]"),
    ("image-with-whitespace", _set(cpu_job, "spec.worker.image", " elastic-jax-worker:1"), "spec.worker.image"),
    ("steps-beyond-int64", _set(cpu_job, "spec.training.steps", 2**70), "spec.training.steps"),
    ("service-account-with-slash",
     _set(cpu_job, "spec.controller.serviceAccountName", "f/trainer"), "spec.controller.serviceAccountName"),
    ("priority-class-uppercase", _set(cpu_job, "spec.priorityClassName", "High_Priority"), "spec.priorityClassName"),
    ("controller-env-operator-sets",
     _set(cpu_job, "spec.controller.env", [{"name": "POD_IP", "value": "1.2.3.4"}]),
     "spec.controller.env"),
    ("worker-env-runtime-prefix",
     _set(cpu_job, "spec.worker.env", [{"name": "A", "value": "1"}, {"name": contract.ENV_TOKEN_FILE, "value": "/x"}]),
     "spec.worker.env"),
    ("pathways-controller-env",
     _set(pathways_job, "spec.controller.env", [{"name": "JAX_BACKEND_TARGET", "value": "grpc://evil:1"}]),
     "spec.controller.env"),
    ("checkpoint-in-the-image-workdir", _set(cpu_job, "spec.checkpoint.uri", contract.IMAGE_WORKDIR + "/ckpt"),
     "spec.checkpoint.uri"),
    # the uri's form (`checkpoints.URI_RULES`, CEL on spec.checkpoint): white space, GCS bucket names
    ("checkpoint-uri-trailing-space", _set(cpu_job, "spec.checkpoint.uri", "/data/ck "), "spec.checkpoint.uri"),
    ("checkpoint-bucket-too-short", _set(pathways_job, "spec.checkpoint.uri", "gs://b/ck"), "spec.checkpoint.uri"),
    ("checkpoint-bucket-uppercase", _set(pathways_job, "spec.checkpoint.uri", "gs://UPPER_bad/ck"),
     "spec.checkpoint.uri"),
    ("checkpoint-bucket-goog-prefix", _set(pathways_job, "spec.checkpoint.uri", "gs://goog-ck/ck"),
     "spec.checkpoint.uri"),
    ("checkpoint-uri-empty-segment", _set(pathways_job, "spec.checkpoint.uri", "gs://bucket//ck"),
     "spec.checkpoint.uri"),
    ("checkpoint-bucket-dot-dot", _set(pathways_job, "spec.checkpoint.uri", "gs://a..b/ck"), "spec.checkpoint.uri"),
    ("automount-token-without-service-account",
     _set(cpu_job, "spec.controller.automountServiceAccountToken", True),
     "spec.controller.automountServiceAccountToken"),
    ("env-name-twice",
     _set(cpu_job, "spec.worker.env", [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]), "spec.worker.env[1]"),
    ("unknown-tpu-accelerator", _set(pathways_job, "spec.slices.accelerator", "tpu-v9-slice"), "spec.slices.accelerator"),
    ("tpu-topology-dimensions", _set(pathways_job, "spec.slices.topology", "2x2x2"), "spec.slices.topology"),
    ("tpu-topology-partial-host", _set(pathways_job, "spec.slices.topology", "1x2"), "spec.slices.topology"),
    ("pathways-worker-selects-the-tpu-label",
     _set(pathways_job, "spec.worker.nodeSelector", {"cloud.google.com/gke-tpu-topology": "4x4"}),
     "spec.worker.nodeSelector"),
    ("node-selector-key", _set(cpu_job, "spec.controller.nodeSelector", {"bad key": "v"}),
     "spec.controller.nodeSelector"),
    ("node-selector-value", _set(cpu_job, "spec.worker.nodeSelector", {"pool": "a b"}), "spec.worker.nodeSelector"),
    # spec.compilationCache: one source; gs:// only where a GCS client runs (pathways); no other volume kind
    ("compilation-cache-gs-on-cpu", _set(cpu_job, "spec.compilationCache", {"uri": "gs://test-bucket/xla"}),
     "spec.compilationCache.uri"),
    ("compilation-cache-two-sources",
     _set(pathways_job, "spec.compilationCache", {"uri": "gs://test-bucket/xla", "persistentVolumeClaim": {"claimName": "c"}}),
     "spec.compilationCache"),
    ("compilation-cache-no-source", _set(pathways_job, "spec.compilationCache", {}), "spec.compilationCache"),
    ("compilation-cache-local-uri", _set(pathways_job, "spec.compilationCache", {"uri": "/var/cache/x"}),
     "spec.compilationCache.uri"),
    ("compilation-cache-bucket-uppercase", _set(pathways_job, "spec.compilationCache", {"uri": "gs://UPPER_bad/xla"}),
     "spec.compilationCache.uri"),
    ("compilation-cache-empty-segment", _set(pathways_job, "spec.compilationCache", {"uri": "gs://test-bucket//xla"}),
     "spec.compilationCache.uri"),
    ("compilation-cache-claim-name", _set(cpu_job, "spec.compilationCache", {"persistentVolumeClaim": {"claimName": "A_b"}}),
     "spec.compilationCache.persistentVolumeClaim.claimName"),
    ("compilation-cache-host-path", _set(cpu_job, "spec.compilationCache", {"hostPath": {"path": "/"}}),
     "spec.compilationCache"),
    ("slices-plus-spares-above-64",
     _set(_set(cpu_job, "spec.slices", {"count": 60, "spares": 8}), "spec.training.globalBatchSize", 120),
     "spec.slices.spares"),
    # tolerations: the API server's cross-field rules (ValidateTolerations)
    ("toleration-exists-with-a-value",
     _set(cpu_job, "spec.worker.tolerations", [{"key": "k", "operator": "Exists", "value": "v"}]),
     "spec.worker.tolerations[0]"),
    ("toleration-equal-without-a-key",
     _set(cpu_job, "spec.controller.tolerations", [{"operator": "Equal", "value": "v"}]),
     "spec.controller.tolerations[0]"),
    ("toleration-default-operator-without-a-key",
     _set(cpu_job, "spec.worker.tolerations", [{"operator": "Exists"}, {"effect": "NoSchedule"}]),
     "spec.worker.tolerations[1]"),
    ("toleration-seconds-without-noexecute",
     _set(cpu_job, "spec.worker.tolerations", [{"key": "k", "operator": "Exists", "effect": "NoSchedule",
                                                "tolerationSeconds": 30}]),
     "spec.worker.tolerations[0]"),
    ("toleration-seconds-without-effect",
     _set(cpu_job, "spec.controller.tolerations", [{"key": "k", "operator": "Exists", "tolerationSeconds": 30}]),
     "spec.controller.tolerations[0]"),
    # cross-field: a progress timeout no longer than a step deadline can never be met
    ("progress-timeout-below-step-deadline",
     _set(cpu_job, "spec.elasticity", {"stepDeadlineSeconds": 600, "progressTimeoutSeconds": 300}),
     "spec.elasticity.progressTimeoutSeconds"),
    ("progress-timeout-below-the-default-first-step-deadline",
     _set(cpu_job, "spec.elasticity", {"progressTimeoutSeconds": 100}), "spec.elasticity.progressTimeoutSeconds"),
    ("step-deadline-above-the-default-progress-timeout",
     _set(cpu_job, "spec.elasticity", {"stepDeadlineSeconds": 3600}), "spec.elasticity.progressTimeoutSeconds"),
    # integers: a fraction is no integer (a whole-number float such as 10.0 is one, for both: ACCEPTED)
    ("steps-a-fraction", _set(cpu_job, "spec.training.steps", 10.5), "spec.training.steps"),
    ("spares-a-fraction", _set(cpu_job, "spec.slices.spares", 0.5), "spec.slices.spares"),
    ("termination-grace-a-fraction", _set(cpu_job, "spec.worker.terminationGracePeriodSeconds", 2.5),
     "spec.worker.terminationGracePeriodSeconds"),
    # a quantity is int-or-string: the API server refuses a JSON float, a whole one too (kubectl would send
    # YAML's 2.0 as 2, a JSON client sends 2.0), so validate refuses it, whoever sends it
    ("cpu-quantity-a-whole-float", _set(cpu_job, "spec.worker.resources", {"limits": {"cpu": 2.0}}),
     "spec.worker.resources"),
    ("min-slices-beyond-int64", _set(cpu_job, "spec.slices.minSlices", 2**70), "spec.slices.minSlices"),
    # bounds on what the controller allocates or waits by
    ("global-batch-size-2-to-the-40", _set(cpu_job, "spec.training.globalBatchSize", 2**40),
     "spec.training.globalBatchSize"),
    ("step-deadline-beyond-30-days", _set(cpu_job, "spec.elasticity",
                                          {"stepDeadlineSeconds": 1e9, "progressTimeoutSeconds": 0}),
     "spec.elasticity.stepDeadlineSeconds"),
    ("slice-wait-timeout-beyond-30-days", _set(cpu_job, "spec.elasticity.sliceWaitTimeoutSeconds", 1e12),
     "spec.elasticity.sliceWaitTimeoutSeconds"),
    # a trailing newline (a YAML block scalar `|`): Python's `$` matches before it, Go's (the API server's) does not
    ("env-name-trailing-newline", _set(cpu_job, "spec.worker.env", [{"name": "A\n", "value": "1"}]),
     "spec.worker.env[0].name"),
    ("quantity-trailing-newline", _set(cpu_job, "spec.worker.resources", {"limits": {"cpu": "2\n"}}),
     "spec.worker.resources"),
    ("service-account-trailing-newline", _set(cpu_job, "spec.controller.serviceAccountName", "sa\n"),
     "spec.controller.serviceAccountName"),
    ("pull-secret-trailing-newline", _set(cpu_job, "spec.imagePullSecrets", [{"name": "s\n"}]),
     "spec.imagePullSecrets[0]"),
    ("toleration-key-trailing-newline", _set(cpu_job, "spec.worker.tolerations", [{"key": "k\n", "operator": "Exists"}]),
     "spec.worker.tolerations[0]"),
    ("node-selector-value-trailing-newline", _set(cpu_job, "spec.worker.nodeSelector", {"k": "v\n"}),
     "spec.worker.nodeSelector"),
    ("entry-point-trailing-newline", _set(cpu_job, "spec.controller.trainer", {"entryPoint": "a:b\n"}),
     "spec.controller.trainer.entryPoint"),
    ("tpu-topology-trailing-newline", _set(pathways_job, "spec.slices.topology", "2x2\n"), "spec.slices.topology"),
    ("label-key-trailing-newline", _set(cpu_job, "metadata.labels", {"team\n": "a"}), "metadata.labels"),
    ("label-value-trailing-newline", _set(cpu_job, "metadata.labels", {"team": "a\n"}), "metadata.labels"),
    # metadata the API server checks before any CRD rule
    ("label-value-with-a-space", _set(cpu_job, "metadata.labels", {"team": "a b"}), "metadata.labels"),
    ("label-value-too-long", _set(cpu_job, "metadata.labels", {"team": "a" * 64}), "metadata.labels"),
    ("label-key-not-a-label-key", _set(cpu_job, "metadata.labels", {"bad key": "v"}), "metadata.labels"),
    ("annotation-key-not-a-key", _set(cpu_job, "metadata.annotations", {"a b/c": "v"}), "metadata.annotations"),
    # a backend cpu job stays off TPU nodes (issue 31, RISK 8): every field that could put it there
    ("cpu-worker-tolerates-the-tpu-taint",
     _set(cpu_job, "spec.worker.tolerations", [{"key": "google.com/tpu", "operator": "Exists",
                                                "effect": "NoSchedule"}]), "spec.worker.tolerations"),
    ("cpu-controller-tolerates-the-tpu-taint",
     _set(cpu_job, "spec.controller.tolerations", [{"key": "google.com/tpu", "value": "present"}]),
     "spec.controller.tolerations"),
    ("cpu-worker-tolerates-every-taint", _set(cpu_job, "spec.worker.tolerations", [{"operator": "Exists"}]),
     "spec.worker.tolerations"),
    ("cpu-controller-tolerates-every-noschedule-taint",
     _set(cpu_job, "spec.controller.tolerations", [{"operator": "Exists", "effect": "NoSchedule"}]),
     "spec.controller.tolerations"),
    ("cpu-worker-selects-a-tpu-accelerator",
     _set(cpu_job, "spec.worker.nodeSelector", {"cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice"}),
     "spec.worker.nodeSelector"),
    ("cpu-controller-selects-a-tpu-topology",
     _set(cpu_job, "spec.controller.nodeSelector", {"cloud.google.com/gke-tpu-topology": "2x2"}),
     "spec.controller.nodeSelector"),
    ("cpu-worker-limits-tpu-chips",
     _set(cpu_job, "spec.worker.resources", {"requests": {"google.com/tpu": 4}, "limits": {"google.com/tpu": 4}}),
     "spec.worker.resources"),
    ("cpu-controller-limits-tpu-chips",
     _set(cpu_job, "spec.controller.resources", {"limits": {"google.com/tpu": "1"}}), "spec.controller.resources"),
    ("cpu-worker-limits-legacy-cloud-tpus",
     _set(cpu_job, "spec.worker.resources", {"limits": {"cloud-tpus.google.com/v3": 8}}), "spec.worker.resources"),
    # the built-in loop gives every slice (cpu: every device of a slice) an equal share of the global batch
    ("global-batch-not-a-multiple-of-the-slices",
     _set(_set(cpu_job, "spec.slices", {"count": 3}), "spec.training.globalBatchSize", 25),
     "spec.training.globalBatchSize"),
    ("global-batch-not-a-multiple-of-the-devices",
     _set(_set(cpu_job, "spec.slices", {"count": 2, "devicesPerHost": 4}), "spec.training.globalBatchSize", 12),
     "spec.training.globalBatchSize"),
    # the TPU slice shape is read by backend pathways only: a cpu job naming one was written for TPUs
    ("cpu-slices-with-a-tpu-accelerator",
     _set(cpu_job, "spec.slices.accelerator", "tpu-v5-lite-podslice"), "spec.slices.accelerator"),
    ("cpu-slices-with-a-tpu-topology", _set(cpu_job, "spec.slices.topology", "2x4"), "spec.slices.topology"),
]

# (id, manifest factory): edge cases that both `validate --cluster` and the API server accept.
ACCEPTED: list[tuple[str, Callable[[], dict]]] = [
    # library mode: your program cuts its own batches (the equal-shares rule is the built-in loop's)
    ("library-mode-global-batch-not-a-multiple-of-the-slices",
     _set(_set(_set(cpu_job, "spec.controller.command", ["python", "train.py"]), "spec.slices", {"count": 3}),
          "spec.training.globalBatchSize", 25)),
    # library mode with the trainer's default entry point written out (what the API server's defaulting does)
    ("library-mode-command-with-the-default-trainer",
     _set(_set(cpu_job, "spec.controller.command", ["python", "train.py"]), "spec.controller.trainer",
          {"entryPoint": "elastic_jax.controller.builtin_lm:make_trainer"})),
    ("steps-a-whole-float", _set(cpu_job, "spec.training.steps", 10.0)),
    ("steps-a-whole-float-1e3", _set(cpu_job, "spec.training.steps", 1e3)),
    # a null is an absent field for the API server (pruned, or replaced by the field's default)
    ("library-mode-command-with-a-null-trainer",
     _set(_set(cpu_job, "spec.controller.command", ["python", "train.py"]), "spec.controller.trainer", None)),
    ("null-image-suspend-and-node-selector-value",
     _set(_set(_set(cpu_job, "spec.controller.image", None), "spec.suspend", None),
          "spec.worker.nodeSelector", {"pool": None})),
    ("toleration-exists-without-a-key", _set(pathways_job, "spec.worker.tolerations", [{"operator": "Exists"}])),
    # a cpu job may tolerate every NoExecute taint (node not ready, unreachable): the TPU taint is NoSchedule
    ("cpu-toleration-exists-without-a-key-noexecute",
     _set(cpu_job, "spec.worker.tolerations", [{"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}])),
    ("pathways-controller-and-worker-tolerate-the-tpu-taint",
     _set(_set(pathways_job, "spec.worker.tolerations", [{"key": "google.com/tpu", "operator": "Exists"}]),
          "spec.controller.tolerations", [{"key": "google.com/tpu", "operator": "Exists"}])),
    ("cpu-node-selector-on-another-gke-label",
     _set(cpu_job, "spec.worker.nodeSelector", {"cloud.google.com/gke-nodepool": "cpu-pool"})),
    ("toleration-seconds-with-noexecute",
     _set(cpu_job, "spec.worker.tolerations", [{"key": "k", "operator": "Exists", "effect": "NoExecute",
                                                "tolerationSeconds": 30}])),
    ("progress-timeout-off-with-a-long-step-deadline",
     _set(cpu_job, "spec.elasticity", {"stepDeadlineSeconds": 7200, "progressTimeoutSeconds": 0})),
    ("global-batch-size-at-the-bound", _set(cpu_job, "spec.training.globalBatchSize", 2**20)),
    ("labels-and-annotations", _set(cpu_job, "metadata.labels", {"example.com/team": "ml-1", "empty": ""})),
    ("compilation-cache-claim-on-cpu",
     _set(cpu_job, "spec.compilationCache", {"persistentVolumeClaim": {"claimName": "xla-cache"}})),
    ("compilation-cache-gs-on-pathways", _set(pathways_job, "spec.compilationCache", {"uri": "gs://test-bucket/xla/"})),
    ("checkpoint-bucket-with-dots-and-underscores",
     _set(pathways_job, "spec.checkpoint.uri", "gs://ml_ckpt.example.com/ck")),
]

# YAML text as a user writes it, read as kubectl reads it (go-yaml: `1e3` is a number, `y` a boolean, `1:30` a
# string) before either side sees it: (id, text of the manifest's spec lines, the field refused or None).
_SPEC = """apiVersion: elasticjax.dev/v1alpha1
kind: ElasticTrainingJob
metadata:
  name: text
spec:
  slices: {{count: 1}}
  checkpoint: {{uri: /data/ck}}
{}
"""
YAML_TEXT: list[tuple[str, str, str | None]] = [
    ("steps-1e3", _SPEC.format("  training: {steps: 1e3, globalBatchSize: 1}"), None),
    ("steps-1.0e3-and-a-batch-of-1e0", _SPEC.format("  training: {steps: 1.0e3, globalBatchSize: 1e0}"), None),
    ("steps-sexagesimal-is-a-string", _SPEC.format("  training: {steps: 1:30, globalBatchSize: 1}"),
     "spec.training.steps"),
    ("env-value-y-is-a-boolean", _SPEC.format("  training: {steps: 10, globalBatchSize: 1}\n"
                                              "  worker: {env: [{name: DEBUG, value: y}]}"),
     "spec.worker.env[0].value"),
    ("env-value-1e3-is-a-number", _SPEC.format("  training: {steps: 10, globalBatchSize: 1}\n"
                                               "  controller: {env: [{name: N, value: 1e3}]}"),
     "spec.controller.env[0].value"),
    ("quoted-y-is-a-string", _SPEC.format("  training: {steps: 10, globalBatchSize: 1}\n"
                                          "  worker: {env: [{name: DEBUG, value: 'y'}]}"), None),
]

# Namespaced: the API server refuses the namespace itself (the CRD cannot constrain it).
BAD_NAMESPACE = "Bad NS"
