"""The cpu backend: a controller pod running `elastic-jax-controller`, one JAX CPU worker per slice.

The controller's control API binds `LISTEN_ADDRESS`: all addresses by default,
so `kubectl port-forward` (which connects to the pod's loopback) reaches its
`/metrics`; the bearer token guards it either way. The local control plane
has no network namespaces (pods share the host's), so there the operator
runs with `--pod-listen-address pod-ip`. Workers bind their pod IP
(downward API `status.podIP`): only their controller calls them.
"""

from __future__ import annotations

import copy
import functools
import posixpath

from typing import Any, Callable

from elastic_jax import contract
from elastic_jax.api import cluster, labels
from elastic_jax.api.identity import JobIdentity, identity_env
from elastic_jax.api.job import ElasticTrainingJob, EnvVar
from elastic_jax.api.manifest_digest import DIGEST_ENV, manifest_digest
from elastic_jax.k8s_operator import names

_POD_IP_ENV = {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
# Where the controller's control API listens (ELASTIC_JAX_HOST; `$(POD_IP)` is expanded by the
# kubelet). Set once by the operator's `--pod-listen-address` (all | pod-ip).
LISTEN_ADDRESSES = {"all": "0.0.0.0", "pod-ip": "$(POD_IP)"}
LISTEN_ADDRESS = LISTEN_ADDRESSES["all"]

# PodSecurity "restricted" (docs/security.md). The images run as uid/gid 65532;
# fsGroup makes the token Secret (mode 0440) readable by that group.
NONROOT_ID = 65532
POD_SECURITY_CONTEXT = {
    "runAsNonRoot": True, "runAsUser": NONROOT_ID, "runAsGroup": NONROOT_ID, "fsGroup": NONROOT_ID,
    "seccompProfile": {"type": "RuntimeDefault"},
}
# Owner and group read: the group is fsGroup, so uid 65532 reads it; nobody else.
TOKEN_FILE_MODE = 0o440


def fresh(render: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    """Makes a render function return an object of its own (a deep copy).

    The renderers build pods from module-level constants (security contexts, env entries, the Pathways
    head's resources); without this a caller's edit of what it got (kopf's adopt, a test fitting a pod to
    its nodes) would change what every later render in the process returns: an e2e test's edit of a
    rendered container once emptied the head's resource limits for the rest of its worker's tests.
    """
    @functools.wraps(render)
    def rendered(*args: Any, **kwargs: Any) -> dict[str, Any]:
        return copy.deepcopy(render(*args, **kwargs))
    return rendered


def container_security_context() -> dict[str, Any]:
    """A container's securityContext under PodSecurity "restricted" (readOnlyRootFilesystem beyond it)."""
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True, "runAsNonRoot": True}


# Where JAX, XLA, Orbax, gRPC and Python may write: the scratch emptyDir.
SCRATCH_ENV = [
    {"name": "HOME", "value": names.SCRATCH_DIR},
    {"name": "TMPDIR", "value": names.SCRATCH_DIR},
    {"name": "XDG_CACHE_HOME", "value": f"{names.SCRATCH_DIR}/.cache"},
]
SCRATCH_VOLUME = {"name": "scratch", "emptyDir": {}}
SCRATCH_MOUNT = {"name": "scratch", "mountPath": names.SCRATCH_DIR}


def token_volume(job: ElasticTrainingJob) -> dict[str, Any]:
    """The job's token Secret as a volume, readable by the pod's fsGroup only."""
    return {"name": "token", "secret": {"secretName": names.secret(job.metadata.name), "defaultMode": TOKEN_FILE_MODE}}


TOKEN_MOUNT = {"name": "token", "mountPath": names.TOKEN_DIR, "readOnly": True}
TOKEN_FILE = f"{names.TOKEN_DIR}/{labels.TOKEN_KEY}"


CHECKPOINT_VOLUME = "checkpoints"


def mount_path(uri: str) -> str:
    """The normalized absolute folder of a local `spec.checkpoint.uri` (`//a/../b/` is `/b`: POSIX keeps a
    leading `//`, which would slip past the overlap checks)."""
    return posixpath.normpath("/" + uri.lstrip("/"))


def checkpoint_volume(job: ElasticTrainingJob) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, volumeMounts) giving a local `spec.checkpoint.uri` a writable emptyDir; ([], []) for gs://.

    The root file system stays read-only; a local checkpoint lives as long as
    the controller pod (kind, a laptop). Checkpoints that outlive the pod need
    `gs://` (docs/security.md, docs/kubernetes.md "What the operator does with a job").
    """
    if not cluster.checkpoints_go_with_pod(job):  # (gs://: nothing to mount)
        return [], []
    return ([{"name": CHECKPOINT_VOLUME, "emptyDir": {}}],
            [{"name": CHECKPOINT_VOLUME, "mountPath": mount_path(job.spec.checkpoint.uri)}])


COMPILATION_CACHE_VOLUME = "compilation-cache"


def compilation_cache(job: ElasticTrainingJob, default_uri: str | None = None
                      ) -> tuple[list[dict[str, str]], list[dict[str, Any]], list[dict[str, Any]]]:
    """(env, volumes, volumeMounts) giving a container JAX's persistent compilation cache of `job`.

    `spec.compilationCache.uri`: JAX reads and writes it itself (env only).
    `spec.compilationCache.persistentVolumeClaim`: the claim mounted read-write at
    `contract.COMPILATION_CACHE_DIR`; the pod's fsGroup (65532) makes a volume that supports ownership
    management writable by the non-root user. Unset: `default_uri` (pathways: under the checkpoint URI),
    else no cache ([], [], []). Every compile is cached (minimum compile time 0 s), as the local launcher does.
    The claim is the admin's to allow (`pod_fields`): checked before anything is rendered.
    """
    cache = job.spec.compilation_cache
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    if cache is not None and cache.persistent_volume_claim is not None:
        location = contract.COMPILATION_CACHE_DIR
        volumes = [{"name": COMPILATION_CACHE_VOLUME,
                    "persistentVolumeClaim": {"claimName": cache.persistent_volume_claim.claim_name}}]
        mounts = [{"name": COMPILATION_CACHE_VOLUME, "mountPath": location}]
    elif cache is not None and cache.uri is not None:
        location = cache.uri
    elif default_uri is not None:
        location = default_uri
    else:
        return [], [], []
    env = [{"name": contract.JAX_ENV_COMPILATION_CACHE_DIR, "value": location},
           {"name": contract.JAX_ENV_CACHE_MIN_COMPILE_TIME_SECS, "value": "0"}]
    return env, volumes, mounts


def _env(extra: list[EnvVar]) -> list[dict[str, str]]:
    return [{"name": e.name, "value": e.value} for e in extra]


def scheduling(job: ElasticTrainingJob, role: str) -> dict[str, Any]:
    """Pod-spec fields from the job's scheduling and pull settings for a `role` pod ("controller" or "worker").

    imagePullSecrets and priorityClassName are the job's; nodeSelector and tolerations the role's.
    Fields left unset in the spec are left out of the pod.
    """
    part = job.spec.controller if role == "controller" else job.spec.worker
    fields: dict[str, Any] = {}
    if job.spec.image_pull_secrets:
        fields["imagePullSecrets"] = [{"name": s.name} for s in job.spec.image_pull_secrets]
    if job.spec.priority_class_name:
        fields["priorityClassName"] = job.spec.priority_class_name
    if part.node_selector:
        fields["nodeSelector"] = dict(part.node_selector)
    if part.tolerations:
        fields["tolerations"] = [t.to_pod() for t in part.tolerations]
    return fields


def controller_identity(job: ElasticTrainingJob) -> dict[str, Any]:
    """serviceAccountName and automountServiceAccountToken of the controller pod.

    No token unless the spec asks for one (the operator has already checked that the
    admin allowed this ServiceAccount, and its token, for the namespace: `service_accounts`).
    """
    c = job.spec.controller
    fields: dict[str, Any] = {"automountServiceAccountToken": bool(c.service_account_name and
                                                                    c.automount_service_account_token)}
    if c.service_account_name:
        fields["serviceAccountName"] = c.service_account_name
    return fields


def pod_labels(job: str, role: str, extra: dict[str, str] | None = None, job_uid: str | None = None) -> dict[str, str]:
    """Labels of a child pod: the job (and its UID when known), the role, and `extra`."""
    return {**labels.job_selector(job, job_uid), labels.ROLE: role, **(extra or {})}


# The controller's livenessProbe: /healthz turns 503 once no step completed for
# spec.elasticity.progressTimeoutSeconds (controller watchdog.py); six misses 10 s
# apart, each with a 10 s answer budget, before the kubelet kills the container: a
# controller whose HTTP thread is starved for a minute on a loaded node (a compile,
# a checkpoint restore) is not a stuck one. restartPolicy Never: the pod fails and
# the operator replaces it.
LIVENESS_PERIOD_S = 10
LIVENESS_FAILURES = 6
LIVENESS_TIMEOUT_S = 10
# Until /healthz first answers, the livenessProbe waits (a startupProbe on the same path): a controller
# still importing JAX on a loaded node is not a stuck one (kind under load: the liveness probe killed a
# starting controller, exit 137, a counted restart and a lost first attempt). Ten minutes to listen,
# then the kubelet kills it and the operator replaces it, counted, as any loss.
STARTUP_PERIOD_S = 10
STARTUP_FAILURES = 60
# The controller's readinessProbe routes the Service (users' control API, Pathways workers): Ready
# within a second of /readyz answering, but one late answer must not drop it from the endpoints.
# kind under load (CI with a benchmark beside it): a 1 s budget and one miss flipped a training
# controller NotReady and its Service refused connections.
READINESS_PERIOD_S = 1
READINESS_FAILURES = 5
READINESS_TIMEOUT_S = 5


def _liveness(job: ElasticTrainingJob) -> dict[str, Any]:
    """The controller container's livenessProbe and the startupProbe that holds it until the controller
    listens ({} when spec.elasticity.progressTimeoutSeconds is 0)."""
    if not job.spec.elasticity.progress_timeout_seconds:
        return {}
    return {"livenessProbe": {"httpGet": {"path": "/healthz", "port": names.CONTROLLER_PORT},
                              "periodSeconds": LIVENESS_PERIOD_S, "failureThreshold": LIVENESS_FAILURES,
                              "timeoutSeconds": LIVENESS_TIMEOUT_S},
            "startupProbe": {"httpGet": {"path": "/healthz", "port": names.CONTROLLER_PORT},
                             "periodSeconds": STARTUP_PERIOD_S, "failureThreshold": STARTUP_FAILURES,
                             "timeoutSeconds": LIVENESS_TIMEOUT_S}}


# cpu workers hold no training state (the controller does): 5 s to exit is plenty.
CPU_WORKER_GRACE_S = 5


def worker_grace_s(job: ElasticTrainingJob, default_s: int) -> int:
    """The worker pods' terminationGracePeriodSeconds: spec.worker.terminationGracePeriodSeconds, else `default_s`."""
    value = job.spec.worker.termination_grace_period_seconds
    return default_s if value is None else value


class CpuRenderer:
    """Renders the cpu backend's controller pod and worker JobSets."""

    @fresh
    def controller_pod(self, job: ElasticTrainingJob, attempt: int, job_uid: str = "") -> dict[str, Any]:
        """The controller Pod of incarnation `attempt`.

        restartPolicy Never: the operator, not the kubelet, recreates it and
        counts that in status, so a restart is always visible.

        Args:
          job: the job as applied.
          attempt: the controller incarnation (0 first).
          job_uid: the job's metadata.uid, passed to the controller with the
            namespace and name (`elastic_jax.api.identity`): it is stored with
            every checkpoint step, and a step another job wrote is refused.
        """
        name = job.metadata.name
        c = job.spec.controller
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": names.controller_pod(name, attempt),
                "labels": pod_labels(name, labels.ROLE_CONTROLLER, {labels.CONTROLLER_ATTEMPT: str(attempt)},
                                     job_uid or job.metadata.uid),
            },
            "spec": {
                "restartPolicy": "Never",
                # SIGTERM makes the controller write a checkpoint before exiting (suspend).
                "terminationGracePeriodSeconds": 60,
                # The controller never calls the Kubernetes API: no ServiceAccount token, unless an
                # admin-allowed spec.controller.serviceAccountName asks for it (docs/security.md).
                **controller_identity(job),
                **scheduling(job, "controller"),
                # No Docker-link env per Service: a Service named like ours (elastic-jax-*) would
                # inject ELASTIC_JAX_*_PORT=tcp://... over our own settings.
                "enableServiceLinks": False,
                "securityContext": copy.deepcopy(POD_SECURITY_CONTEXT),
                "containers": [{
                    "name": "controller",
                    "image": c.image,
                    # Library mode: the user's program replaces the image's entry point (the trainer host);
                    # it gets the same env, mounts and probes (elastic_jax serves them).
                    **({"command": list(c.command), "args": list(c.args)} if c.library_mode else {}),
                    "env": [
                        _POD_IP_ENV,
                        {"name": contract.ENV_HOST, "value": LISTEN_ADDRESS},
                        {"name": contract.ENV_PORT, "value": str(names.CONTROLLER_PORT)},
                        {"name": contract.ENV_MANIFEST, "value": f"{names.MANIFEST_DIR}/{labels.MANIFEST_KEY}"},
                        # The spec this pod is for: the controller refuses a manifest ConfigMap edited since.
                        {"name": DIGEST_ENV, "value": manifest_digest(job)},
                        {"name": contract.ENV_TOKEN_FILE, "value": TOKEN_FILE},
                        *({"name": k, "value": v} for k, v in identity_env(JobIdentity(
                            namespace=job.metadata.namespace or "default", name=name, uid=job_uid)).items()),
                        *SCRATCH_ENV,
                        *_env(c.env),
                    ],
                    "ports": [{"name": "control", "containerPort": names.CONTROLLER_PORT}],
                    "readinessProbe": {"httpGet": {"path": "/readyz", "port": names.CONTROLLER_PORT},
                                       "periodSeconds": READINESS_PERIOD_S, "failureThreshold": READINESS_FAILURES,
                                       "timeoutSeconds": READINESS_TIMEOUT_S},
                    **_liveness(job),
                    "resources": c.resources.effective("controller"),
                    "terminationMessagePolicy": "FallbackToLogsOnError",
                    "securityContext": container_security_context(),
                    "volumeMounts": [
                        {"name": "manifest", "mountPath": names.MANIFEST_DIR, "readOnly": True},
                        copy.deepcopy(TOKEN_MOUNT),
                        copy.deepcopy(SCRATCH_MOUNT),
                        *checkpoint_volume(job)[1],
                    ],
                }],
                "volumes": [
                    {"name": "manifest", "configMap": {"name": names.configmap(name)}},
                    token_volume(job),
                    copy.deepcopy(SCRATCH_VOLUME),
                    *checkpoint_volume(job)[0],
                ],
            },
        }

    @fresh
    def worker_jobset(self, job: ElasticTrainingJob, index: int) -> dict[str, Any]:
        """The JobSet of slice `index`: one Job of `hostsPerSlice` worker pods.

        A failed or deleted worker fails its Job at once (backoffLimit 0) and
        the JobSet controller recreates that slice only (each slice has its own
        JobSet), up to `elasticity.maxRestartsPerSlice` times; then the JobSet
        fails and the operator fails the job with the reason.
        """
        name = job.metadata.name
        s = job.spec.slices
        w = job.spec.worker
        # (the job's UID reaches the Jobs and pods the JobSet and Job controllers create from the templates)
        selector = pod_labels(name, labels.ROLE_WORKER, {labels.SLICE_INDEX: str(index)}, job.metadata.uid)
        # A replaced worker loads its step program from here instead of compiling it again.
        cache_env, cache_volumes, cache_mounts = compilation_cache(job)
        return {
            "apiVersion": contract.JOBSET_API_VERSION,
            "kind": contract.JOBSET_KIND,
            "metadata": {"name": names.slice_jobset(name, index), "labels": dict(selector)},
            "spec": {
                "failurePolicy": {"maxRestarts": job.spec.elasticity.max_restarts_per_slice},
                "replicatedJobs": [{
                    "name": names.WORKER_REPLICATED_JOB,
                    "replicas": 1,
                    "template": {
                        "metadata": {"labels": dict(selector)},
                        "spec": {
                            "parallelism": s.hosts_per_slice,
                            "completions": s.hosts_per_slice,
                            "completionMode": "Indexed",
                            "backoffLimit": 0,
                            "template": {
                                "metadata": {"labels": dict(selector)},
                                "spec": {
                                    "restartPolicy": "Never",
                                    "terminationGracePeriodSeconds": worker_grace_s(job, CPU_WORKER_GRACE_S),
                                    # Workers never call the Kubernetes API: no ServiceAccount token.
                                    "automountServiceAccountToken": False,
                                    "enableServiceLinks": False,
                                    **scheduling(job, "worker"),
                                    "securityContext": copy.deepcopy(POD_SECURITY_CONTEXT),
                                    "containers": [{
                                        "name": "worker",
                                        "image": w.image,
                                        "args": [
                                            "--host", "$(POD_IP)", "--port", str(names.WORKER_PORT),
                                            "--slice-index", str(index), "--host-devices", str(s.devices_per_host),
                                        ],
                                        # The job's token authenticates the controller's calls.
                                        "env": [_POD_IP_ENV, {"name": contract.ENV_TOKEN_FILE, "value": TOKEN_FILE},
                                                *SCRATCH_ENV, *cache_env, *_env(w.env)],
                                        "ports": [{"name": "grpc", "containerPort": names.WORKER_PORT}],
                                        "readinessProbe": {"tcpSocket": {"port": names.WORKER_PORT},
                                                           "periodSeconds": 1, "failureThreshold": 1},
                                        "resources": w.resources.effective("worker"),
                                        "securityContext": container_security_context(),
                                        "volumeMounts": [copy.deepcopy(TOKEN_MOUNT), copy.deepcopy(SCRATCH_MOUNT),
                                                         *cache_mounts],
                                    }],
                                    "volumes": [token_volume(job), copy.deepcopy(SCRATCH_VOLUME), *cache_volumes],
                                },
                            },
                        },
                    },
                }],
            },
        }
