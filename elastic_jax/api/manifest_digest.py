"""The digest that ties a controller to the job spec it was started for (the manifest ConfigMap trust boundary).

The controller reads its job from the `<job>-manifest` ConfigMap. Anyone who
may edit ConfigMaps in the namespace, but not the ElasticTrainingJob, could
change that copy (the trainer entry point, its config, the checkpoint URI)
and so what a later controller incarnation runs with the job's token. The
operator therefore puts the digest of the spec it rendered the pod from into
the controller's environment (`DIGEST_ENV`), and the controller refuses a
manifest whose digest differs (exit `BAD_INPUT`, which fails the job with the
reason). The operator also records the digest in `status.manifestSha256`
(status is the operator's; tenants cannot write it) and, after its own
restart, reads the ConfigMap back only if it still has that digest.

The digest covers the job's name, namespace and spec except `suspend` and
`ttlSecondsAfterFinished` (the two fields that may change on a running job),
as canonical JSON of the parsed model, so YAML formatting does not matter.
"""

from __future__ import annotations

import hashlib
import json

from elastic_jax import contract
from elastic_jax.api.job import ElasticTrainingJob

# Set by the operator in the controller container: the hex sha256 the manifest must have.
DIGEST_ENV = contract.ENV_MANIFEST_SHA256

# Spec fields a running job may change (the CRD's transition rules allow only these).
MUTABLE_SPEC_FIELDS = ("suspend", "ttlSecondsAfterFinished")


def manifest_digest(job: ElasticTrainingJob) -> str:
    """Hex sha256 of the job's name, namespace and spec without `MUTABLE_SPEC_FIELDS`."""
    spec = job.spec.to_manifest()
    for field in MUTABLE_SPEC_FIELDS:
        spec.pop(field, None)
    canonical = {"name": job.metadata.name, "namespace": job.metadata.namespace or "", "spec": spec}
    return hashlib.sha256(json.dumps(canonical, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class ManifestDigestMismatch(ValueError):
    """The manifest is not the one the operator started this controller for; `str()` says what to do."""


def check_digest(job: ElasticTrainingJob, expected: str | None, path: str) -> None:
    """Refuses a manifest whose digest is not `expected` (no check when `expected` is empty: a local run).

    Args:
      job: the manifest as the controller parsed it.
      expected: the hex digest from `DIGEST_ENV`.
      path: the manifest file, for the message.

    Raises:
      ManifestDigestMismatch: naming the file, both digests and the likely cause.
    """
    if not expected:
        return
    got = manifest_digest(job)
    if got != expected.strip().lower():
        raise ManifestDigestMismatch(
            f"the manifest {path} (sha256 {got[:16]}...) is not the spec the operator started this controller for "
            f"({DIGEST_ENV} {expected.strip()[:16]}...): the job's manifest ConfigMap was changed after the job was "
            "created. Nothing was run; delete and re-create the job, and restrict who may edit ConfigMaps in this "
            "namespace (docs/security.md)")
