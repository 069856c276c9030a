"""The project's container images: names, their targets of one Dockerfile, and what each one runs.

One table for three readers: the targets of ``images/Dockerfile`` (one per image), the Helm
chart's default operator image, and the local control plane's image table
(``e2e/nodeagent/images.py``, where an image stands for a local command).
``tests/unit/test_images.py`` fails when any of them drifts from this table.

Standard library only: the e2e node agent imports it and stays small.
"""

from __future__ import annotations

from dataclasses import dataclass

from elastic_jax import __version__

REGISTRY = "ghcr.io/elastic-jax"
"""Where release images are pushed; the tag is the package version."""

CONTROLLER_IMAGE = f"{REGISTRY}/controller:{__version__}"
WORKER_IMAGE = f"{REGISTRY}/worker:{__version__}"
OPERATOR_IMAGE = f"{REGISTRY}/operator:{__version__}"
MAXTEXT_CONTROLLER_IMAGE = f"{REGISTRY}/controller-maxtext:{__version__}"

DOCKERFILE = "images/Dockerfile"
"""The one Dockerfile every image is a target of, relative to the repository root (the build context)."""

MAXTEXT_PYTHON_IMAGE = (
    "python:3.12.12-slim-bookworm@sha256:593bd06efe90efa80dc4eee3948be7c0fde4134606dd40d8dd8dbcade98e669c")
"""The ``PYTHON_IMAGE`` build argument of the ``controller-maxtext`` target: MaxText 0.2.5 needs Python >= 3.12,
the Dockerfile's default base is 3.11 (exact tag and digest, like that default)."""


@dataclass(frozen=True)
class ProjectImage:
    """One image the repository builds.

    Attributes:
      name: default reference, ``repository:tag``.
      target: its stage in :data:`DOCKERFILE` (``docker build --target``).
      extra: the ``pyproject.toml`` optional-dependency group the image installs.
      entrypoint: its ``ENTRYPOINT``: a console script from ``[project.scripts]``.
      dockerfile: the Dockerfile, relative to the repository root (the build context).
    """

    name: str
    target: str
    extra: str
    entrypoint: tuple[str, ...]
    dockerfile: str = DOCKERFILE

    @property
    def repository(self) -> str:
        """``name`` without its tag."""
        return self.name.rsplit(":", 1)[0]

    @property
    def tag(self) -> str:
        """The tag part of ``name``."""
        return self.name.rsplit(":", 1)[1]


PROJECT_IMAGES: dict[str, ProjectImage] = {
    image.name: image
    for image in (
        ProjectImage(CONTROLLER_IMAGE, "controller", "controller", ("elastic-jax-controller",)),
        ProjectImage(WORKER_IMAGE, "worker", "worker", ("elastic-jax-worker",)),
        ProjectImage(OPERATOR_IMAGE, "operator", "operator", ("elastic-jax-operator",)),
    )
}
"""The images CI builds and the kind tier runs."""

MAXTEXT_IMAGE = ProjectImage(MAXTEXT_CONTROLLER_IMAGE, "controller-maxtext", "maxtext", ("elastic-jax-controller",))
"""The controller's MaxText variant, built on :data:`MAXTEXT_PYTHON_IMAGE` (CI builds it on a Python 3.12 base made
here, ``e2e/kind/images.py``, and runs MaxText's trainer in it: ``e2e/kind/test_maxtext_image.py``)."""


# -- Pathways (backend pathways): Google's images, pinned to the jax the controller runs --

PATHWAYS_REPOSITORY = "us-docker.pkg.dev/cloud-tpu-v2-images/pathways"
"""Google's Pathways images: ``server`` (resource manager and TPU workers) and ``proxy_server``."""

PINNED_JAX = "0.10.2"
"""The jax/jaxlib version ``constraints.txt`` pins, so the controller image's IFRT proxy client
(``tests/unit/test_images.py`` fails when the two drift)."""

PATHWAYS_RELEASES: dict[str, str] = {
    # jax version -> the Pathways release tag built against it. Google tags each
    # release of server and proxy_server together as ``jax-<version>``; the proxy
    # client in jaxlib and the proxy server speak one IFRT proxy protocol version,
    # so a release is paired with exactly one jax. Add a row when the pin moves.
    "0.10.2": "jax-0.10.2",
}


def pathways_image(component: str, jax_version: str = PINNED_JAX) -> str:
    """The Pathways image of `component` ("server" or "proxy_server") for `jax_version`.

    Raises:
      KeyError: no Pathways release is known for that jax version (add it to `PATHWAYS_RELEASES`).
    """
    if component not in ("server", "proxy_server"):
        raise ValueError(f"unknown Pathways component {component!r} (server, proxy_server)")
    return f"{PATHWAYS_REPOSITORY}/{component}:{PATHWAYS_RELEASES[jax_version]}"
