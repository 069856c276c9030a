"""The pathways backend: the Pathways head beside the user's controller, one TPU worker JobSet per slice.

Pod shapes follow the public references, pathways-utils
`pathwaysutils/experimental/gke/jobset.py` and google/pathways-job
`internal/controller/pathwaysjob_controller.go` (images, ports, flags, worker
env, `google.com/tpu` limits, node selectors, exclusive node-pool placement,
host networking for workers, restart in place). Where this operator differs,
it is because their head and workers are one JobSet and ours are not
(docs/pathways.md has the whole list, field by field):

- The head is the controller Pod (recreated per attempt, new name each
  time), so workers reach the resource manager through a headless Service of
  their own (`head_service`, `publishNotReadyAddresses`), where the
  references use the JobSet coordinator's pod DNS name (a headless Service
  JobSet creates with the same flag). Not the controller's ClusterIP
  Service: that routes only to a Ready pod, and the controller is Ready only
  once `jax.devices()` returned, which needs the workers registered: a
  deadlock. The proxy reaches the resource manager on 127.0.0.1.
- Start order: the references' JobSet `startupPolicy: InOrder` creates the
  workers once the head runs. Here the resource manager has a startupProbe on
  its port, and the operator creates a slice's JobSet only once that sidecar
  has started (`reconcile.decide`). Each JobSet carries the head incarnation
  it registered with (`labels.PATHWAYS_HEAD`); a new head (controller pod
  recreated, resource manager restarted) restarts every slice's JobSet, as
  the references' `restartStrategy: Recreate` restarts the whole JobSet.
- Each slice is its own JobSet, so `MEGASCALE_SLICE_ID` and
  `MEGASCALE_NUM_SLICES` are the slice index and `spec.slices.total`, not the
  JobSet job-index and replica labels (always 0 and 1 here).
- Hot spares (`spec.slices.spares`) are slices like the others: their
  JobSets, node pools and workers registered with the resource manager
  (`--instance_count` and the proxy's `--num_elastic_slices` are
  `count + spares`); the controller keeps them out of its mesh until one
  replaces a lost slice.
- Resource manager and proxy are native sidecars (init containers with
  restartPolicy Always, as pathways-job injects them into a user pod): the
  pod ends when the controller container ends, which the operator reads as
  the job's outcome.
- Restart rule (pathways-utils): a worker container that exits is restarted
  in place by the kubelet (restartPolicy OnFailure: same pod, node and TPU
  chips; it re-registers with the resource manager); a worker pod that is
  gone (deleted, evicted, node lost) is replaced by its Job; after
  `hostsPerSlice x elasticity.maxRestartsPerSlice` such failures (the Job's
  backoffLimit, the references' formula) the Job fails and the JobSet
  recreates the whole slice, counted against `maxRestartsPerSlice` and
  `maxRestarts`.
"""

from __future__ import annotations

import copy

from typing import Any

from elastic_jax.api import images
from elastic_jax.api import labels
from elastic_jax.api.job import ElasticTrainingJob
from elastic_jax.api.backend_rules import (PATHWAYS_SERVER_IMAGE, TPU_ACCELERATOR_LABEL, TPU_TOPOLOGY_LABEL,
                                           pathways_server_image, resolve_pathways)
from elastic_jax.api.tpu_shapes import SliceShape, slice_shape
from elastic_jax.k8s_operator import names, slices
from elastic_jax.k8s_operator.backends import cpu
from elastic_jax.k8s_operator.backends.cpu import CpuRenderer

# Images: pathways-utils' repositories, pinned to the release of the controller's jax
# (`images.PATHWAYS_RELEASES`), never `latest` (the references' default): the proxy client
# in jaxlib and the proxy server must speak one protocol version. Ports: pathways-utils.
PATHWAYS_REPOSITORY = images.PATHWAYS_REPOSITORY
SERVER_IMAGE = PATHWAYS_SERVER_IMAGE  # resource manager and workers
PROXY_IMAGE = images.pathways_image("proxy_server")
PROXY_PORT = 29000
RM_PORT = 29001
WORKER_PORT = 29005
# Further ports the references open without naming them (resource manager; worker: DCN, TPU runtime, metrics).
# Google's Pathways server's own ports, not ours: 8471 and 8080 only happen to equal contract.WORKER_PORT and
# contract.CONTROLLER_PORT (the cpu worker and our control API), so they are spelled here.
_RM_EXTRA_PORTS = (29002,)
_WORKER_EXTRA_PORTS = (29006, 8471, 8080)
# Sized as both references size them (limits only: requests default to limits).
_RM_RESOURCES = {"limits": {"cpu": "8", "memory": "32G"}}
# The resource manager's startupProbe: its port accepts connections. Until then the
# controller container does not start (native sidecar order) and the operator creates
# no worker JobSet. Generous: an image of several GB is pulled only once, but a cold
# node may take minutes; 600 x 1 s, then the kubelet restarts the sidecar.
RM_STARTUP_PERIOD_S = 1
RM_STARTUP_FAILURES = 600
RM_CONTAINER = slices.RM_CONTAINER
# TPU workers save nothing themselves, but the slice drains while the controller
# checkpoints through them (Draining): the Kubernetes default, which pathways-utils
# keeps unless told; spec.worker.terminationGracePeriodSeconds overrides it.
WORKER_GRACE_S = 30
_PROXY_RESOURCES = {"limits": {"cpu": "16", "memory": "100G"}}

SCRATCH_SUBDIR = "pathways-scratch"
# spec.compilationCache's default: JAX's persistent cache of the controller (the JAX client that compiles
# every program Pathways runs), kept across controller restarts and slice replacements.
COMPILATION_CACHE_SUBDIR = "compilation-cache"
TPU_RESOURCE = "google.com/tpu"
NODE_POOL_LABEL = "cloud.google.com/gke-nodepool"

_NAMESPACE_ENV = {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _head_env(job: ElasticTrainingJob) -> list[dict[str, Any]]:
    """POD_NAMESPACE and PATHWAYS_HEAD: the resource manager's DNS name (the head's headless Service)."""
    return [_NAMESPACE_ENV,
            {"name": "PATHWAYS_HEAD", "value": f"{names.pathways_head(job.metadata.name)}.$(POD_NAMESPACE).svc"}]


@cpu.fresh
def head_service(job: ElasticTrainingJob) -> dict[str, Any]:
    """The headless Service through which TPU workers reach the resource manager.

    `publishNotReadyAddresses`: its DNS name resolves to the controller pod's IP
    as soon as the pod has one, Ready or not; the pod's readiness waits for the
    workers, so the workers' route must not wait for it. Headless (no ClusterIP,
    no kube-proxy rule): DNS gives the pod IP itself, as the references' JobSet
    coordinator name does, and a worker connects to the current head, not
    through a load balancer. Only the resource manager's ports: the proxy and
    the control API stay inside the pod and behind the controller Service.
    """
    name = job.metadata.name
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": names.pathways_head(name), "labels": labels.job_selector(name, job.metadata.uid)},
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            # With the UID: publishNotReadyAddresses lists terminating pods too, so without it a job
            # re-applied under the same name would send its workers to the old job's head.
            "selector": {**labels.job_selector(name, job.metadata.uid), labels.ROLE: labels.ROLE_CONTROLLER},
            "ports": [{"name": "pathways-rm", "port": RM_PORT, "targetPort": RM_PORT, "protocol": "TCP"},
                      *({"name": f"pathways-rm-{p}", "port": p, "targetPort": p, "protocol": "TCP"}
                        for p in _RM_EXTRA_PORTS)],
        },
    }


def head_incarnation(pod_name: str, rm_restarts: int) -> str:
    """The resource manager instance the workers register with: the controller pod and its RM restart count.

    A worker JobSet created for one incarnation is attached to that resource
    manager only; any other value means the head restarted under it.
    """
    return f"{pod_name}.rm-{rm_restarts}"


def _under_checkpoint(job: ElasticTrainingJob, subdir: str) -> str:
    """A folder under the checkpoint URI (always gs:// here; Orbax skips non-step folders)."""
    return f"{job.spec.checkpoint.uri.rstrip('/')}/{subdir}"


def scratch_location(job: ElasticTrainingJob) -> str:
    """Pathways' `--gcs_scratch_location`: a folder under the checkpoint URI."""
    return _under_checkpoint(job, SCRATCH_SUBDIR)


def compilation_cache_location(job: ElasticTrainingJob) -> str:
    """The default of `spec.compilationCache` for pathways: a folder under the checkpoint URI, which every
    pod of the job may already write (`<uri>/compilation-cache`)."""
    return _under_checkpoint(job, COMPILATION_CACHE_SUBDIR)


server_image = pathways_server_image  # (in the api layer: `elastic-jax validate` prints it too)


def proxy_image(job: ElasticTrainingJob) -> str:
    """The proxy image, at the server image's tag when that is a Pathways release (the two must match),
    else the pinned release (`images.PATHWAYS_RELEASES`)."""
    server = server_image(job)
    prefix = f"{PATHWAYS_REPOSITORY}/server:"
    if server.startswith(prefix):
        return f"{PATHWAYS_REPOSITORY}/proxy_server:{server[len(prefix):]}"
    return PROXY_IMAGE


# Google's Pathways images (resource manager, proxy, TPU workers) run as their
# image's own user, which is root, and are untested here as any other uid or on a
# read-only root file system; so they get what holds for any container (no
# privilege escalation, seccomp RuntimeDefault from the pod) but not runAsNonRoot
# or readOnlyRootFilesystem. The head's two servers need no capability at all (they
# bind ports above 1024 and talk gRPC/GCS). TPU workers on GKE need no privileged
# mode (GKE >= 1.28 exposes the TPU devices through its device plugin) and keep the
# runtime's default capabilities, as both public references run them.
_PATHWAYS_HEAD_SECURITY_CONTEXT = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
_PATHWAYS_WORKER_SECURITY_CONTEXT = {"allowPrivilegeEscalation": False}
# Pod-level: the seccomp profile and fsGroup (the controller reads the 0440 token);
# the user settings move to the controller container, the one built from our image.
_PATHWAYS_POD_SECURITY_CONTEXT = {"fsGroup": cpu.NONROOT_ID, "seccompProfile": {"type": "RuntimeDefault"}}


def _ports(*numbers: int) -> list[dict[str, Any]]:
    return [{"containerPort": n, "protocol": "TCP"} for n in numbers]


def _sidecars(job: ElasticTrainingJob, shape: SliceShape) -> list[dict[str, Any]]:
    """Resource manager and proxy as native sidecars of the controller pod."""
    scratch = scratch_location(job)
    count = job.spec.slices.total  # spares register with the resource manager too
    rm = {
        "name": RM_CONTAINER,
        "image": server_image(job),
        "restartPolicy": "Always",
        "startupProbe": {"tcpSocket": {"port": RM_PORT}, "periodSeconds": RM_STARTUP_PERIOD_S,
                         "failureThreshold": RM_STARTUP_FAILURES},
        "args": [f"--server_port={RM_PORT}", f"--gcs_scratch_location={scratch}", "--node_type=resource_manager",
                 f"--instance_count={count}", f"--instance_type={shape.instance_type}"],
        "env": [*_head_env(job), {"name": "HOST_ADDRESS", "value": "$(PATHWAYS_HEAD)"},
                {"name": "TPU_SKIP_MDS_QUERY", "value": "true"}],
        "ports": _ports(RM_PORT, *_RM_EXTRA_PORTS),
        "resources": _RM_RESOURCES,
        "securityContext": copy.deepcopy(_PATHWAYS_HEAD_SECURITY_CONTEXT),
    }
    proxy = {
        "name": "pathways-proxy",
        "image": proxy_image(job),
        "restartPolicy": "Always",
        # Every slice may be missing: whether training waits or continues is the
        # controller's decision (spec.slices.minSlices), not the proxy's.
        "args": [f"--server_port={PROXY_PORT}", f"--resource_manager_address=127.0.0.1:{RM_PORT}",
                 f"--gcs_scratch_location={scratch}", f"--num_elastic_slices={count}"],
        "ports": _ports(PROXY_PORT),
        "resources": _PROXY_RESOURCES,
        "securityContext": copy.deepcopy(_PATHWAYS_HEAD_SECURITY_CONTEXT),
    }
    return [rm, proxy]


def _worker_container(job: ElasticTrainingJob, shape: SliceShape, index: int) -> dict[str, Any]:
    w = job.spec.worker
    return {
        "name": "pathways-worker",
        "image": server_image(job),
        "args": [f"--server_port={WORKER_PORT}", f"--resource_manager_address=$(PATHWAYS_HEAD):{RM_PORT}",
                 f"--gcs_scratch_location={scratch_location(job)}"],
        "env": [
            *_head_env(job),
            {"name": "TPU_MIN_LOG_LEVEL", "value": "0"},
            {"name": "TF_CPP_MIN_LOG_LEVEL", "value": "0"},
            {"name": "XCLOUD_ENVIRONMENT", "value": "GCP"},
            {"name": "MEGASCALE_GRPC_ENABLE_XOR_TRACER", "value": "false"},
            {"name": "MEGASCALE_NUM_SLICES", "value": str(job.spec.slices.total)},
            {"name": "MEGASCALE_SLICE_ID", "value": str(index)},
            {"name": "MEGASCALE_COORDINATOR_ADDRESS", "value": "$(PATHWAYS_HEAD)"},
            _field_env("JOBSET_NAME", f"metadata.annotations['{labels.JOBSET_NAME}']"),
            _field_env("REPLICATED_JOB_NAME", "metadata.annotations['jobset.sigs.k8s.io/replicatedjob-name']"),
            *({"name": e.name, "value": e.value} for e in w.env),
        ],
        "ports": _ports(WORKER_PORT, *_WORKER_EXTRA_PORTS),
        "resources": {
            **({"requests": dict(w.resources.requests)} if w.resources.requests else {}),
            "limits": {**w.resources.limits, TPU_RESOURCE: str(shape.chips_per_host)},
        },
        "securityContext": copy.deepcopy(_PATHWAYS_WORKER_SECURITY_CONTEXT),
    }


class PathwaysRenderer:
    """Renders the pathways backend's controller pod (with the Pathways head) and TPU worker JobSets."""

    @cpu.fresh
    def controller_pod(self, job: ElasticTrainingJob, attempt: int, job_uid: str = "") -> dict[str, Any]:
        """The cpu backend's controller pod, plus the Pathways head and the env pointing JAX at its proxy.

        Raises:
          UnsupportedBackend: see `backend_rules.resolve_pathways`.
        """
        job = resolve_pathways(job)
        shape = slice_shape(job.spec.slices.accelerator, job.spec.slices.topology)
        pod = CpuRenderer().controller_pod(job, attempt, job_uid)
        spec = pod["spec"]
        controller = spec["containers"][0]
        # The JAX client compiles every program Pathways runs: its persistent cache (MaxText: pass
        # jax_cache_dir=$(JAX_COMPILATION_CACHE_DIR), as examples/03 does, else its own default wins).
        cache_env, cache_volumes, cache_mounts = cpu.compilation_cache(job, compilation_cache_location(job))
        # A user's env may not name these (elastic_jax.api.runtime_env.PATHWAYS_CONTROLLER, COMPILATION_CACHE).
        controller["env"] = [
            {"name": "JAX_PLATFORMS", "value": "proxy"},
            {"name": "JAX_BACKEND_TARGET", "value": f"grpc://127.0.0.1:{PROXY_PORT}"},
            {"name": "XCLOUD_ENVIRONMENT", "value": "GCP"},
            # Orbax saves and restores arrays on the TPU workers, straight to and from GCS, instead of
            # pulling every array through the proxy into this pod's memory (pathwaysutils registers
            # its persistence handlers in initialize() when this is 1).
            {"name": "ENABLE_PATHWAYS_PERSISTENCE", "value": "1"},
            *cache_env,
            *controller["env"],
        ]
        controller["volumeMounts"].extend(cache_mounts)
        spec["volumes"].extend(cache_volumes)
        spec["initContainers"] = _sidecars(job, shape)
        user = {k: spec["securityContext"].pop(k) for k in ("runAsNonRoot", "runAsUser", "runAsGroup")}
        spec["securityContext"] = copy.deepcopy(_PATHWAYS_POD_SECURITY_CONTEXT)
        controller["securityContext"] = {**controller["securityContext"], **user}
        # The CPU pool: GKE taints TPU nodes, and this says it outright for pools without the taint.
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": TPU_ACCELERATOR_LABEL, "operator": "DoesNotExist"}]}],
        }}}
        return pod

    @cpu.fresh
    def worker_jobset(self, job: ElasticTrainingJob, index: int) -> dict[str, Any]:
        """The JobSet of slice `index`: hosts-per-slice Pathways workers on one TPU node pool.

        Raises:
          UnsupportedBackend: see `backend_rules.resolve_pathways`.
        """
        job = resolve_pathways(job)
        shape = slice_shape(job.spec.slices.accelerator, job.spec.slices.topology)
        js = CpuRenderer().worker_jobset(job, index)
        exclusive = {labels.JOBSET_EXCLUSIVE_TOPOLOGY: NODE_POOL_LABEL}
        js["metadata"]["annotations"] = dict(exclusive)
        job_template = js["spec"]["replicatedJobs"][0]["template"]
        job_template["metadata"]["annotations"] = dict(exclusive)
        # Restart in place (see the module docstring): the Job replaces a lost pod up to
        # hosts x maxRestartsPerSlice times (container restarts count too) before the slice goes.
        job_template["spec"]["backoffLimit"] = shape.hosts * job.spec.elasticity.max_restarts_per_slice
        pod = job_template["spec"]["template"]["spec"]
        pod["restartPolicy"] = "OnFailure"
        pod["terminationGracePeriodSeconds"] = cpu.worker_grace_s(job, WORKER_GRACE_S)
        pod["containers"] = [_worker_container(job, shape, index)]
        # Pathways workers talk to the resource manager, not to our controller: no token, no scratch.
        pod.pop("volumes", None)
        pod["securityContext"] = {"seccompProfile": {"type": "RuntimeDefault"}}
        # The user's selectors (spec.worker.nodeSelector) plus the TPU ones; `backend_rules.check_node_selectors`
        # refused a user key that would replace a TPU one.
        pod["nodeSelector"] = {**job.spec.worker.node_selector,
                               TPU_ACCELERATOR_LABEL: shape.accelerator, TPU_TOPOLOGY_LABEL: shape.topology}
        # Host networking as google/pathways-job ("for performance"; DCN traffic between slices). It is
        # the one PodSecurity "baseline" rule these pods break: a TPU node pool runs only this
        # job's worker (exclusive placement), so the host network it shares is its own.
        pod["hostNetwork"] = True
        pod["dnsPolicy"] = "ClusterFirstWithHostNet"
        return js
