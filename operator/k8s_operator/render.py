"""`elastic-jax-operator render MANIFEST`: the objects the operator would create for a job, without a cluster.

What `helm template` is to a chart: a YAML stream of the job's children (token Secret, manifest ConfigMap,
Services, NetworkPolicies, the controller Pod, one JobSet per slice, spares included) as the operator
renders them at the job's first pass, so a user can read the pods a job gets (images, TPU node selectors,
resources, the Pathways head's containers) before applying it. Bad input is refused as the API server and
the operator would refuse it: one `error:` line per problem, exit 2, nothing printed to stdout.

Known only on a cluster, so written as placeholders: the job's UID (labels, ownerReferences), the token in
the Secret (an HMAC of the operator's key and that UID, `tokens.derive_token`), and what an admin set on the
operator besides `--control-api-from` (its allow lists, `--allowed-*`, are not applied here: on a cluster
they may refuse the job).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import yaml

from elastic_jax import contract
from elastic_jax.api.cluster import UnsupportedBackend
from elastic_jax.api.job import namespace_problem
from elastic_jax.api.manifest import ManifestError, load_manifest
from elastic_jax.api.size_limits import manifest_size_problem
from elastic_jax.k8s_operator import backends, children, network_policies

PLACEHOLDER_UID = "00000000-0000-0000-0000-000000000000"
"""The job's UID in the rendering (the API server assigns the real one at apply)."""
PLACEHOLDER_TOKEN = "set-by-the-operator-at-apply"
"""The Secret's token in the rendering (derived from the operator's key and the job's UID)."""
EXIT_USAGE = 2


def render(manifest: str, control_api_from: str = "", namespace: str | None = None) -> list[dict[str, Any]]:
    """The job's children, namespaced and owned by the job, in the order the operator creates them; none for a
    job with `spec.suspend: true` (the operator creates nothing until it is false).

    Args:
      manifest: path of one ElasticTrainingJob YAML file.
      namespace: where the job is applied (`kubectl apply -n`); default: the file's metadata.namespace, else
        `default`, as kubectl applies it.
      control_api_from: the operator's `--control-api-from` (a JSON list of NetworkPolicyPeers; empty: no
        NetworkPolicies, as an operator without it renders none).

    Raises:
      ManifestError: the file is unreadable or the job invalid (`problems`: one line each).
      ValueError: `control_api_from` is not a list of peers (`network_policies.parse_peers`).
    """
    peers = network_policies.parse_peers(control_api_from)
    job = load_manifest(manifest)
    problems = [p for p in (manifest_size_problem(job),) if p]
    try:
        job = backends.resolve(job)
    except UnsupportedBackend as e:
        problems.append(str(e))
    if problems:
        raise ManifestError("; ".join(problems), problems=[f"{manifest}: {p}" for p in problems])
    if job.spec.suspend:
        return []
    namespace = namespace or job.metadata.namespace or "default"
    job = job.model_copy(update={"metadata": job.metadata.model_copy(
        update={"namespace": namespace, "uid": PLACEHOLDER_UID})})
    owner = {"apiVersion": job.api_version, "kind": job.kind, "name": job.metadata.name, "uid": PLACEHOLDER_UID,
             "controller": True, "blockOwnerDeletion": True}  # (what kopf.adopt sets)
    out = children.render_children(job, PLACEHOLDER_TOKEN, job_uid=PLACEHOLDER_UID, control_api_from=peers)
    for child in out:
        meta = child.setdefault("metadata", {})
        meta["namespace"] = namespace
        meta["ownerReferences"] = [dict(owner)]
    return out


def main(argv: list[str]) -> int:
    """`elastic-jax-operator render` (argv: what follows `render`). Returns the exit code: 0, or 2 for bad input."""
    parser = argparse.ArgumentParser(
        prog="elastic-jax-operator render",
        description="Print the objects the operator would create for a job (a YAML stream), without a cluster.")
    parser.add_argument("manifest", metavar="MANIFEST", help="ElasticTrainingJob YAML file")
    parser.add_argument("--control-api-from", default=os.environ.get(contract.ENV_CONTROL_API_FROM, ""),
                        help="the operator's --control-api-from (JSON list of NetworkPolicyPeers), so the job's "
                             "NetworkPolicies are rendered as that operator renders them; default: none")
    parser.add_argument("--namespace", "-n", default=None,
                        help="the namespace the job is applied in (as kubectl apply -n); default: the file's "
                             "metadata.namespace, else default")
    args = parser.parse_args(argv)
    if args.namespace is not None and namespace_problem(args.namespace):
        parser.error(f"--namespace {namespace_problem(args.namespace)}")  # (a trial: Bad_NS rendered, exit 0)
    try:
        objects = render(args.manifest, args.control_api_from, args.namespace)
    except ManifestError as e:
        for problem in e.problems:
            print(f"error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    except ValueError as e:
        parser.error(f"--control-api-from: {e}")
    if not objects:
        print(f"# {args.manifest}: spec.suspend is true: the operator creates nothing for this job until it is "
              f"false")
        return 0
    print(f"# rendered by elastic-jax-operator render {args.manifest}: the job's uid ({PLACEHOLDER_UID}) and "
          f"the Secret's token are placeholders the cluster fills in")
    print(yaml.safe_dump_all(objects, sort_keys=False), end="")
    return 0
