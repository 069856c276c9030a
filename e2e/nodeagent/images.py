"""The only place that says which container images the node agent can "run".

There is no container runtime: an image stands for a local command. Each
entry gives the image's ENTRYPOINT and CMD (as its target of images/Dockerfile sets them) and extra
environment; the container's ``command`` replaces ENTRYPOINT and its ``args``
replace CMD, exactly as Kubernetes defines it. Bare names (``python``) are
looked up on the container's PATH, whose first entry is the bin folder of the
Python environment running the agent, so the project's console scripts and
the venv's ``python`` are found there.

Keys are ``repository:tag``; a tag of ``*`` accepts any tag (and no tag).
Anything else fails the pod with reason ``ErrImagePull``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from elastic_jax.api import images as project_images


@dataclass(frozen=True)
class Image:
    """What running an image means here."""

    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    files: tuple[tuple[str, Path], ...] = ()
    """(path in the container's working directory, the checkout's file): what the image's target COPYs to
    its WORKDIR, copied into the container's working directory before it starts."""


REPO_ROOT = Path(__file__).resolve().parents[2]
PATHWAYS_STANDIN = Path(__file__).resolve().parents[1] / "kind" / "pathways_standin.py"
PATHWAYS_STANDIN_CONTROLLER = "e2e.local/pathways-standin-controller:1"
"""A controller image for pathways jobs here: the stand-in's ``controller`` role (the control API the operator
drives), as ``spec.controller.image``; the real controller needs a Pathways proxy."""
SERVE_ONLY_CONTROLLER = "e2e.local/elastic-jax-controller-serve-only:1"
"""The product's controller with ``--serve-only`` (the control API and slice set, no training loop), as
``spec.controller.image``: many jobs on one machine for the operator at scale (e2e/kwok)."""
RM_HOLD_DIR = "/tmp/elastic-jax-e2e-rm-holds"
"""A file ``<namespace>.<pod>`` here keeps that pod's stand-in resource manager from listening (a slow start)."""
_STANDIN_ENV = {"PYTHONUNBUFFERED": "1"}

IMAGES: dict[str, Image] = {
    # The project's images (targets controller and worker of images/Dockerfile).
    # The controller image carries the library-mode example at its WORKDIR (images/Dockerfile), so
    # examples/04-own-loop.yaml's relative `python examples/04-own-loop.py` runs as is here too.
    "ghcr.io/elastic-jax/controller:0.1.0": Image(entrypoint=("elastic-jax-controller",), files=(
        ("examples/04-own-loop.py", REPO_ROOT / "examples" / "04-own-loop.py"),)),
    "ghcr.io/elastic-jax/worker:0.1.0": Image(entrypoint=("elastic-jax-worker",)),
    "ghcr.io/elastic-jax/operator:0.1.0": Image(entrypoint=("elastic-jax-operator",)),  # target operator
    # Generic images for the e2e suite's own pods: the command runs as given.
    "python:*": Image(cmd=("python3",), env={"PYTHONUNBUFFERED": "1"}),
    "busybox:*": Image(cmd=("sh",)),
    # Backend pathways: Google's pinned images (elastic_jax.api.images.PATHWAYS_RELEASES) are played by
    # stand-ins that listen on the rendered ports and make the rendered connections (no Pathways runs
    # off Google Cloud); a test's controller image plays the user's program against them. Nothing
    # else may run them: the operator renders them unchanged (e2e/test_pathways_operator.py).
    project_images.pathways_image("server"): Image(
        entrypoint=("python", str(PATHWAYS_STANDIN), "server"), env={**_STANDIN_ENV, "STANDIN_RM_HOLD_DIR": RM_HOLD_DIR}),
    project_images.pathways_image("proxy_server"): Image(
        entrypoint=("python", str(PATHWAYS_STANDIN), "proxy"), env=_STANDIN_ENV),
    SERVE_ONLY_CONTROLLER: Image(entrypoint=("elastic-jax-controller", "--serve-only")),
    PATHWAYS_STANDIN_CONTROLLER: Image(entrypoint=("python", str(PATHWAYS_STANDIN), "controller"), env=_STANDIN_ENV),
}


class UnknownImage(LookupError):
    """The image is not in :data:`IMAGES`."""


def _split(ref: str) -> tuple[str, str]:
    """``docker.io/library/python:3.11`` -> (``python``, ``3.11``); digests count as tags."""
    ref = ref.strip()
    for prefix in ("docker.io/library/", "index.docker.io/library/", "library/"):
        if ref.startswith(prefix):
            ref = ref[len(prefix):]
    if "@" in ref:
        repo, tag = ref.split("@", 1)
        return repo, tag
    last = ref.rsplit("/", 1)[-1]
    if ":" in last:
        repo, tag = ref.rsplit(":", 1)
        return repo, tag
    return ref, "latest"


def resolve(ref: str) -> Image:
    """The :class:`Image` for an image reference.

    Raises:
        UnknownImage: no entry matches; the message lists the known images.
    """
    repo, tag = _split(ref)
    image = IMAGES.get(f"{repo}:{tag}") or IMAGES.get(f"{repo}:*")
    if image is None:
        known = ", ".join(sorted(IMAGES))
        raise UnknownImage(f'image "{ref}" is not in the node agent\'s image table '
                           f"(e2e/nodeagent/images.py; known: {known})")
    return image


def argv(image: Image, command: list[str] | None, args: list[str] | None) -> list[str]:
    """The process argv: ``command`` replaces ENTRYPOINT, ``args`` replaces CMD.

    Raises:
        ValueError: the result is empty (no command, no args, no ENTRYPOINT/CMD).
    """
    head = list(command) if command else list(image.entrypoint)
    tail = list(args) if args else ([] if command else list(image.cmd))
    out = head + tail
    if not out:
        raise ValueError("container has no command and its image defines none")
    return out
