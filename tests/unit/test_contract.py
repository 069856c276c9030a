"""Issue 11 item 2: the runtime contract is spelled once (`elastic_jax/contract.py`).

Every environment variable name and the JobSet group/version appear as a
string literal only there; everything else imports them. (Prose in comments
and docstrings may name them.)
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

from elastic_jax import contract

REPO = Path(__file__).resolve().parents[2]
FOLDERS = ("operator", "controller_image", "worker_image", "elastic_jax", "e2e", "tests", "benchmarks")
# Copied into a ConfigMap and run by a bare `python` in a stand-in container: standard library only.
STANDALONE = {REPO / "e2e" / "kind" / "pathways_standin.py"}


def _contract_strings() -> dict[str, str]:
    values = {getattr(contract, n): n for n in dir(contract) if n.startswith("ENV_") and n != "ENV_PREFIX"}
    values.update({contract.JOBSET_GROUP: "JOBSET_GROUP", contract.JOBSET_API_VERSION: "JOBSET_API_VERSION"})
    return values


def _string_literals(path: Path):
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    previous = None
    for tok in tokens:
        if tok.type == tokenize.STRING:
            body = tok.string.lstrip("rbuRBUfF")
            # a docstring is a statement of its own: an expression after a NEWLINE/INDENT
            docstring = previous is not None and previous.type in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                                                                   tokenize.NL)
            if not docstring and len(body) >= 2:
                yield tok.start[0], body.strip("'\"")
        if tok.type not in (tokenize.COMMENT,):
            previous = tok


def test_contract_names_are_spelled_only_in_the_contract_module():
    values = _contract_strings()
    found = []
    for folder in FOLDERS:
        for path in (REPO / folder).rglob("*.py"):
            if ".build" in path.parts or path in STANDALONE or path == REPO / "elastic_jax" / "contract.py":
                continue
            if path.resolve() == (REPO / "elastic_jax" / "contract.py").resolve():
                continue
            for line, text in _string_literals(path):
                if text in values:
                    found.append(f"{path.relative_to(REPO)}:{line}: {text!r} (contract.{values[text]})")
    assert not found, "spell these through elastic_jax.contract:\n" + "\n".join(found)


# Code that ships (the tests may name the kinds they assert on).
PRODUCT_FOLDERS = ("operator", "controller_image", "worker_image", "elastic_jax")
ENV_NAME = re.compile(r"^ELASTIC_JAX_[A-Z0-9_]+$")


def test_no_runtime_variable_or_kind_is_spelled_outside_the_contract_module():
    """A variable the contract does not know yet is spelled nowhere else either (the operator read
    `ELASTIC_JAX_ALLOWED_COMPILATION_CACHE_CLAIMS` as a literal of its own), and the product names the
    JobSet kind and our own apiVersion/kind through the contract (the renderer wrote "JobSet" itself)."""
    kinds = {contract.JOBSET_KIND: "JOBSET_KIND", contract.KIND: "KIND", contract.API_VERSION: "API_VERSION",
             contract.PLURAL: "PLURAL"}
    found = []
    for folder in FOLDERS:
        for path in (REPO / folder).rglob("*.py"):
            if ".build" in path.parts or path in STANDALONE or path == REPO / "elastic_jax" / "contract.py":
                continue
            for line, text in _string_literals(path):
                if ENV_NAME.match(text):
                    found.append(f"{path.relative_to(REPO)}:{line}: {text!r} (add it to elastic_jax.contract)")
                elif folder in PRODUCT_FOLDERS and text in kinds:
                    found.append(f"{path.relative_to(REPO)}:{line}: {text!r} (contract.{kinds[text]})")
    assert not found, "spell these through elastic_jax.contract:\n" + "\n".join(found)


def test_the_contract_names_are_distinct_and_prefixed():
    envs = {n: getattr(contract, n) for n in dir(contract) if n.startswith("ENV_") and n != "ENV_PREFIX"}
    assert len(set(envs.values())) == len(envs), envs
    assert all(v.startswith(contract.ENV_PREFIX) for v in envs.values()), envs
    assert contract.jobsets_path("ns") == "/apis/jobset.x-k8s.io/v1alpha2/namespaces/ns/jobsets"
