"""The runtime contract: environment variables the operator sets in a job's pods, or the runtime reads.

One list, so the renderers, the manifest model and the docs agree. A user's
`spec.controller.env` / `spec.worker.env` entry naming one of these would
either override the operator's value (a controller told to bind elsewhere,
read another token file, record another job's identity) or be overridden by
it without a word; both are refused by the model, naming the field and the
variable (`reserved_problem`). `tests/unit/test_operator_render.py` checks that
every variable the renderers set is listed here.

User settings that the runtime reads and the operator never sets stay open
(`USER_SETTINGS`).
"""

from __future__ import annotations

from elastic_jax import contract
from elastic_jax.api import identity

PREFIX = contract.ENV_PREFIX

# Read by the runtime, set by nobody but the user (spec.*.env); docs/security.md says what each does.
USER_SETTINGS = frozenset({
    contract.ENV_MAX_MESSAGE_BYTES,      # controller and workers: gRPC message cap (elastic_jax.wire)
    contract.ENV_ALLOWED_CUSTOM_CALLS,   # cpu workers: custom-call targets a program may use
    contract.ENV_LOG_FORMAT,             # controller and workers: json | text
})

# Set by the cpu renderer in every controller and worker container (backends/cpu.py).
POD_IP = "POD_IP"
SCRATCH = ("HOME", "TMPDIR", "XDG_CACHE_HOME")
CONTROLLER_HOST = contract.ENV_HOST
CONTROLLER_PORT = contract.ENV_PORT
MANIFEST = contract.ENV_MANIFEST
MANIFEST_DIGEST = contract.ENV_MANIFEST_SHA256  # elastic_jax.api.manifest_digest.DIGEST_ENV
TOKEN_FILE = contract.ENV_TOKEN_FILE
IDENTITY = (identity.JOB_NAMESPACE_ENV, identity.JOB_NAME_ENV, identity.JOB_UID_ENV)

# Set by the pathways renderer (backends/pathways.py): JAX pointed at the Pathways proxy in the
# controller; the Megascale/Pathways settings of each TPU worker.
PATHWAYS_CONTROLLER = ("JAX_PLATFORMS", "JAX_BACKEND_TARGET", "XCLOUD_ENVIRONMENT", "ENABLE_PATHWAYS_PERSISTENCE")
PATHWAYS_WORKER = ("POD_NAMESPACE", "PATHWAYS_HEAD", "TPU_MIN_LOG_LEVEL", "TF_CPP_MIN_LOG_LEVEL",
                   "XCLOUD_ENVIRONMENT", "MEGASCALE_GRPC_ENABLE_XOR_TRACER", "MEGASCALE_NUM_SLICES",
                   "MEGASCALE_SLICE_ID", "MEGASCALE_COORDINATOR_ADDRESS", "JOBSET_NAME", "REPLICATED_JOB_NAME")
# The cpu worker's entry point sets JAX_PLATFORMS=cpu itself (worker_image/worker/main.py).
CPU_WORKER = ("JAX_PLATFORMS",)
# JAX's persistent compilation cache, rendered from spec.compilationCache in the containers that compile
# (cpu workers, the pathways controller): one way to say where it is, so a user value cannot point a job's
# pods at another cache behind the operator's back (backends/cpu.py `compilation_cache`).
COMPILATION_CACHE = (contract.JAX_ENV_COMPILATION_CACHE_DIR, contract.JAX_ENV_CACHE_MIN_COMPILE_TIME_SECS)


def operator_set(role: str, backend: str) -> frozenset[str]:
    """Names the operator (or the image's entry point) sets in a `role` container of `backend`.

    Args:
      role: "controller" or "worker".
      backend: "cpu" or "pathways".

    Raises:
      ValueError: an unknown role.
    """
    if role == "controller":
        names = {POD_IP, *SCRATCH, CONTROLLER_HOST, CONTROLLER_PORT, MANIFEST, MANIFEST_DIGEST, TOKEN_FILE,
                 *IDENTITY}
        if backend == "pathways":
            names |= {*PATHWAYS_CONTROLLER, *COMPILATION_CACHE}
        return frozenset(names)
    if role == "worker":
        if backend == "pathways":
            return frozenset(PATHWAYS_WORKER)
        return frozenset({POD_IP, *SCRATCH, TOKEN_FILE, *CPU_WORKER, *COMPILATION_CACHE})
    raise ValueError(f"unknown role {role!r}")


def reserved_problem(name: str, role: str, backend: str) -> str | None:
    """Why a user may not set `name` in a `role` container, or None when they may.

    Every `ELASTIC_JAX_*` name is the runtime's except `USER_SETTINGS`; beyond that
    prefix, the names the operator sets for `backend` (`operator_set`).

    Returns:
      A phrase for an error message (the caller names the field), or None.
    """
    if name in USER_SETTINGS:
        return None
    if name.startswith(PREFIX):
        return (f"{name} is set by elastic-jax itself (the runtime contract, elastic_jax/api/runtime_env.py); "
                f"user settings with that prefix: {', '.join(sorted(USER_SETTINGS))}")
    if name in operator_set(role, backend):
        return f"{name} is set by the operator in the {backend} {role} container and cannot be overridden"
    return None


def _cel_list(names) -> str:
    return "[" + ", ".join(f"'{n}'" for n in sorted(names)) + "]"


def cel_rules() -> list[dict[str, str]]:
    """CEL rules for the CRD's spec: the API server refuses what `reserved_problem` refuses, naming the field.

    One rule per role; the operator-set names depend on `spec.backend`, so each rule picks
    the list of its backend. Generated from the lists above, never written by hand.
    """
    rules = []
    for role in ("controller", "worker"):
        by_backend = {b: operator_set(role, b) for b in ("cpu", "pathways")}
        ok = (f"e.name in {_cel_list(USER_SETTINGS)} || (!e.name.startsWith('{PREFIX}') && "
              f"(self.backend == 'pathways' ? !(e.name in {_cel_list(by_backend['pathways'])}) "
              f": !(e.name in {_cel_list(by_backend['cpu'])})))")
        # The API server names where a rule sits, `spec.<role>.env` (a fieldPath takes no list index).
        # A messageExpression naming the entry (filter + indexOf over the list) is refused by the API
        # server as over its CEL cost budget (measured: "exceeds budget by factor of more than 100x"),
        # so the entry is named by `validate` and the operator, the list by the API server.
        rules.append({
            "rule": f"!has(self.{role}) || !has(self.{role}.env) || self.{role}.env.all(e, {ok})",
            "message": (f"spec.{role}.env names a variable the operator sets (or {PREFIX}* other than "
                        f"{', '.join(sorted(USER_SETTINGS))}), which cannot be overridden; backend cpu: "
                        f"{', '.join(sorted(n for n in by_backend['cpu'] if not n.startswith(PREFIX)))}; backend "
                        f"pathways: {', '.join(sorted(n for n in by_backend['pathways'] if not n.startswith(PREFIX)))}"),
            "fieldPath": f".{role}.env",
        })
    return rules
