"""Which job wrote a checkpoint: the writer identity stored with every committed step.

The operator passes the job's namespace, name and UID to the controller pod
in the environment (`JOB_NAMESPACE_ENV`, `JOB_NAME_ENV`, `JOB_UID_ENV`); the
local launcher passes the same three, with namespace `local` and a UID that is
stable for one job name and one checkpoint directory (`local_uid`), so running
the same local job again resumes it while another job pointed at the same
directory does not. The controller saves the identity as Orbax custom metadata
of each step (committed atomically with it) and refuses, on resume, a step
another job wrote unless `spec.checkpoint.resumeFrom` is `Any`.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from elastic_jax import contract

JOB_NAMESPACE_ENV = contract.ENV_JOB_NAMESPACE
JOB_NAME_ENV = contract.ENV_JOB_NAME
JOB_UID_ENV = contract.ENV_JOB_UID
LOCAL_NAMESPACE = "local"
"""The namespace of jobs that `elastic-jax run` starts."""
# Key of the identity in each step's Orbax custom metadata.
METADATA_KEY = "elasticJaxWriter"
# uuid5 namespace of local UIDs (a fixed random UUID: local UIDs never collide with other uuid5 users).
_LOCAL_UID_NAMESPACE = uuid.UUID("6c1f0a8e-5d0b-4a57-9a39-2b8f6f0f6d41")


class JobIdentity(BaseModel):
    """One job incarnation: what a Kubernetes object reference names (namespace, name, uid)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    namespace: str = Field(description="The job's namespace (`local` for `elastic-jax run`).")
    name: str = Field(description="The job's metadata.name.")
    uid: str = Field(description="metadata.uid of the job (a deleted and re-applied job gets a new one).")

    def describe(self) -> str:
        """`<namespace>/<name> (uid <uid>)`, as Events and errors print it."""
        return f"{self.namespace}/{self.name} (uid {self.uid})"


def local_uid(name: str, checkpoint_uri: str) -> str:
    """The UID of a local job: stable for one job name and one checkpoint location.

    Args:
      name: the job's metadata.name.
      checkpoint_uri: `spec.checkpoint.uri`; a local path is made absolute first.
    """
    where = checkpoint_uri if "://" in checkpoint_uri else os.path.abspath(os.path.expanduser(checkpoint_uri))
    return str(uuid.uuid5(_LOCAL_UID_NAMESPACE, f"{name}\n{where}"))


def local_identity(name: str, checkpoint_uri: str) -> JobIdentity:
    """The identity `elastic-jax run` gives a job: namespace `local`, UID `local_uid(name, checkpoint_uri)`."""
    return JobIdentity(namespace=LOCAL_NAMESPACE, name=name, uid=local_uid(name, checkpoint_uri))


def identity_env(identity: JobIdentity) -> dict[str, str]:
    """The environment that tells the controller who it is."""
    return {JOB_NAMESPACE_ENV: identity.namespace, JOB_NAME_ENV: identity.name, JOB_UID_ENV: identity.uid}


def identity_from_env(environ: Mapping[str, str], name: str, checkpoint_uri: str) -> JobIdentity:
    """The controller's identity from its environment; without a UID there, a local one.

    Args:
      environ: `os.environ`.
      name, checkpoint_uri: from the manifest, for the local fallback
        (a controller started by hand, as the tests' fixtures do).
    """
    uid = environ.get(JOB_UID_ENV)
    if uid:
        return JobIdentity(namespace=environ.get(JOB_NAMESPACE_ENV) or "default",
                           name=environ.get(JOB_NAME_ENV) or name, uid=uid)
    return local_identity(name, checkpoint_uri)


def to_metadata(identity: JobIdentity) -> dict[str, Any]:
    """The custom metadata saved with each checkpoint step."""
    return {METADATA_KEY: identity.model_dump(by_alias=True)}


def from_metadata(custom_metadata: Mapping[str, Any] | None) -> JobIdentity | None:
    """The writer stored in a step's custom metadata; None for steps saved without one (by an older elastic-jax)."""
    raw = (custom_metadata or {}).get(METADATA_KEY)
    if not isinstance(raw, Mapping):
        return None
    try:
        return JobIdentity.model_validate(raw)
    except ValueError:
        return None
