"""The runtime contract: what the operator, the controller, the worker, the launcher and the tests agree on.

Each name, port, path and API group is spelled here once and imported
everywhere else (renderers, entry points, e2e, tests), so the two ends of a
contract cannot drift. Standard library only: the worker image imports it.

The other two parts of the contract have a module of their own, each also the
one spelling: the controller's exit codes (`elastic_jax.exit_codes.ControllerExit`,
an `IntEnum`) and the label and annotation keys (`elastic_jax.api.labels`).
Which environment variables a user may set in `spec.*.env` is a policy on top
of these names (`elastic_jax.api.runtime_env`).
"""

from __future__ import annotations

# -- the ElasticTrainingJob API -----------------------------------------------------------

GROUP = "elasticjax.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "ElasticTrainingJob"
PLURAL = "elastictrainingjobs"

# -- JobSet (sigs.k8s.io/jobset v1alpha2): one per slice ----------------------------------

JOBSET_GROUP = "jobset.x-k8s.io"
JOBSET_VERSION = "v1alpha2"
JOBSET_PLURAL = "jobsets"
JOBSET_KIND = "JobSet"
JOBSET_API_VERSION = f"{JOBSET_GROUP}/{JOBSET_VERSION}"


def jobsets_path(namespace: str) -> str:
    """The REST path of the JobSets of `namespace` (no trailing slash)."""
    return f"/apis/{JOBSET_API_VERSION}/namespaces/{namespace}/{JOBSET_PLURAL}"


# -- ports ---------------------------------------------------------------------------------

# The controller's control API (HTTP) inside its pod.
CONTROLLER_PORT = 8080
# A cpu slice worker's gRPC server inside its pod (each pod has its own IP).
WORKER_PORT = 8471
# The operator's Prometheus endpoint.
OPERATOR_METRICS_PORT = 9090

# -- paths inside the pods the operator renders ---------------------------------------------

# The job's manifest ConfigMap, the token Secret, and the writable scratch folder (read-only root).
MANIFEST_DIR = "/etc/elastic-jax/manifest"
TOKEN_DIR = "/etc/elastic-jax/token"
SCRATCH_DIR = "/tmp/elastic-jax-scratch"
# The images' working directory (their user's home): the controller image keeps the examples there, and a
# user's own image its program (`spec.controller.command: [python, train.py]`). Checked against images/Dockerfile.
IMAGE_WORKDIR = "/home/elastic"
# Where the kubelet reads a container's termination message (the pod's terminationMessagePath).
TERMINATION_MESSAGE_PATH = "/dev/termination-log"

# -- environment variables -----------------------------------------------------------------

# Set by the operator in the controller container (cpu and pathways).
ENV_HOST = "ELASTIC_JAX_HOST"  # control API bind address
ENV_PORT = "ELASTIC_JAX_PORT"  # control API port
ENV_MANIFEST = "ELASTIC_JAX_MANIFEST"  # path of the job's manifest
ENV_MANIFEST_SHA256 = "ELASTIC_JAX_MANIFEST_SHA256"  # sha256 the mounted manifest must have (operator-set)
ENV_TOKEN_FILE = "ELASTIC_JAX_TOKEN_FILE"  # path of the bearer token (controller and cpu workers)
# The job that writes the checkpoints (`elastic_jax.api.identity`).
ENV_JOB_NAMESPACE = "ELASTIC_JAX_JOB_NAMESPACE"
ENV_JOB_NAME = "ELASTIC_JAX_JOB_NAME"
ENV_JOB_UID = "ELASTIC_JAX_JOB_UID"
# Where the controller writes the one-line reason of a non-zero exit (default TERMINATION_MESSAGE_PATH).
ENV_TERMINATION_MESSAGE_PATH = "ELASTIC_JAX_TERMINATION_MESSAGE_PATH"

# User settings the runtime reads and the operator never sets (docs/security.md).
ENV_MAX_MESSAGE_BYTES = "ELASTIC_JAX_MAX_MESSAGE_BYTES"  # controller and workers: gRPC message cap
ENV_ALLOWED_CUSTOM_CALLS = "ELASTIC_JAX_ALLOWED_CUSTOM_CALLS"  # cpu workers: custom-call targets allowed
ENV_LOG_FORMAT = "ELASTIC_JAX_LOG_FORMAT"  # controller, worker and operator: json | text

# The controller outside a pod (the local launcher sets them).
ENV_TOKEN = "ELASTIC_JAX_TOKEN"  # the token itself, when there is no token file
ENV_SUMMARY_FILE = "ELASTIC_JAX_SUMMARY_FILE"  # where the controller writes its JSON summary
ENV_RUN_DIR = "ELASTIC_JAX_RUN_DIR"  # the launcher's run folder, for the controllers it starts
# In the launcher's run folder: each controller appends a line per step and elastic event (controller/run_history.py);
# elastic_jax/timeline.py draws them.
RUN_HISTORY_FILE = "history.jsonl"
# The file that marks a folder as an `elastic-jax run` folder (its --workdir): the only proof a later run or
# `elastic-jax report` accepts (`elastic_jax.local.run_folder`).
RUN_FOLDER_MARKER = ".elastic-jax-run"
# JAX's own variables (not ours: no ELASTIC_JAX_ prefix) the local launcher gives its cpu workers (one persistent
# compilation cache per run) and the operator renders from spec.compilationCache (cpu workers, the pathways
# controller): a restarted worker reads its step program's executable instead of compiling it again (every
# compile cached: JAX_ENV_CACHE_MIN_COMPILE_TIME_SECS 0).
JAX_ENV_COMPILATION_CACHE_DIR = "JAX_COMPILATION_CACHE_DIR"
JAX_ENV_CACHE_MIN_COMPILE_TIME_SECS = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"
# Where a pod mounts spec.compilationCache.persistentVolumeClaim (the operator renders it; the root file system
# stays read-only).
COMPILATION_CACHE_DIR = "/var/cache/elastic-jax/xla"

# The operator's own settings (the chart sets them; each is also a command-line flag).
ENV_OPERATOR_KEY_FILE = "ELASTIC_JAX_OPERATOR_KEY_FILE"
ENV_OPERATOR_IDENTITY = "ELASTIC_JAX_OPERATOR_IDENTITY"
ENV_POD_LISTEN_ADDRESS = "ELASTIC_JAX_POD_LISTEN_ADDRESS"
ENV_METRICS_PORT = "ELASTIC_JAX_METRICS_PORT"
ENV_METRICS_HOST = "ELASTIC_JAX_METRICS_HOST"
ENV_PEERING = "ELASTIC_JAX_PEERING"
ENV_LIVENESS = "ELASTIC_JAX_LIVENESS"
ENV_NODE_LOST_SECONDS = "ELASTIC_JAX_NODE_LOST_SECONDS"
ENV_ALLOWED_SERVICE_ACCOUNTS = "ELASTIC_JAX_ALLOWED_SERVICE_ACCOUNTS"
ENV_ALLOWED_TOKEN_SERVICE_ACCOUNTS = "ELASTIC_JAX_ALLOWED_TOKEN_SERVICE_ACCOUNTS"
ENV_ALLOWED_PRIORITY_CLASSES = "ELASTIC_JAX_ALLOWED_PRIORITY_CLASSES"
ENV_ALLOWED_TOLERATION_KEYS = "ELASTIC_JAX_ALLOWED_TOLERATION_KEYS"
ENV_ALLOWED_IMAGE_PULL_SECRETS = "ELASTIC_JAX_ALLOWED_IMAGE_PULL_SECRETS"
ENV_ALLOWED_COMPILATION_CACHE_CLAIMS = "ELASTIC_JAX_ALLOWED_COMPILATION_CACHE_CLAIMS"
ENV_STOP_DEADLINE_SECONDS = "ELASTIC_JAX_STOP_DEADLINE_SECONDS"
ENV_DENIED_NAMESPACES = "ELASTIC_JAX_DENIED_NAMESPACES"
ENV_CHECKPOINT_PREFIXES = "ELASTIC_JAX_CHECKPOINT_PREFIXES"
ENV_CONTROL_API_FROM = "ELASTIC_JAX_CONTROL_API_FROM"

# Every runtime variable starts with this (`runtime_env.reserved_problem`).
ENV_PREFIX = "ELASTIC_JAX_"
