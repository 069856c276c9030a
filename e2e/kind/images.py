"""Build the project's three images here, offline from any registry.

No container registry is reachable on these machines, so the ``python:slim``
base images/Dockerfile pins by digest cannot be pulled. :func:`python_base`
makes a Debian bookworm base with ``mmdebstrap`` (Python 3.11 from Debian,
``python3-venv`` for the venv stages, ``passwd`` for the ``useradd`` of build.sh)
and ``docker import``s it; :func:`build_project_images` builds the three
targets of ``images/Dockerfile`` on it with ``--build-arg PYTHON_IMAGE=...``. pip inside the build
reaches PyPI through ``--network host`` and trusts the CA bundle pip is
configured with on the host, handed in as the build secret ``pip-ca`` (it
reaches the builder stage only, never a layer).

Both steps are cached: the base by a tag derived from its recipe, the images by
BuildKit's layer cache in the engine's data root (``e2e/kind/engine.py``), so a
second run with unchanged sources takes seconds.

Command line (with an engine from ``python -m e2e.kind.engine start``)::

    python -m e2e.kind.images        # prints each image's name, size and build time
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from e2e.kind.engine import Engine
from elastic_jax.api.images import PROJECT_IMAGES

REPO_ROOT = Path(__file__).resolve().parents[2]

BASE_SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates", "passwd")
"""Debian packages of the offline base: what the Dockerfile's builder and runtime stages use."""

BASE_REPOSITORY = "elastic-jax/python-base"


@dataclass(frozen=True)
class Built:
    """One image this module built: its reference, size in bytes and build seconds (0 when cached)."""

    name: str
    size_bytes: int
    build_s: float


def _base_tag() -> str:
    recipe = json.dumps({"suite": BASE_SUITE, "variant": "minbase", "packages": BASE_PACKAGES})
    return f"{BASE_REPOSITORY}:{BASE_SUITE}-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}"


def image_exists(engine: Engine, name: str) -> bool:
    """True when the engine's store has ``name``."""
    return engine.docker("image", "inspect", name, check=False).returncode == 0


def image_size(engine: Engine, name: str) -> int:
    """The image's size in bytes, as ``docker image inspect`` reports it."""
    return int(engine.docker("image", "inspect", "--format", "{{.Size}}", name).stdout)


def python_base(engine: Engine, log=print) -> Built:
    """The offline Debian/Python base image, made with mmdebstrap unless the engine has it.

    Takes about 90 s the first time (Debian packages from the mirror), 0 after.

    Raises:
        subprocess.CalledProcessError: mmdebstrap or ``docker import`` failed.
    """
    tag = _base_tag()
    if image_exists(engine, tag):
        return Built(tag, image_size(engine, tag), 0.0)
    log(f"images: making {tag} with mmdebstrap ({BASE_SUITE}, {', '.join(BASE_PACKAGES)})")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ejx-base-") as tmp:
        tar = Path(tmp) / "rootfs.tar"
        subprocess.run(["mmdebstrap", "--quiet", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}",
                        BASE_SUITE, str(tar)], check=True, capture_output=True)
        with open(tar, "rb") as f:
            proc = subprocess.run(["/usr/bin/docker", "import", "--change", 'CMD ["python3"]', "-", tag],
                                  stdin=f, env=engine.env(), capture_output=True)
        if proc.returncode != 0:
            raise subprocess.CalledProcessError(proc.returncode, proc.args, proc.stdout, proc.stderr)
    return Built(tag, image_size(engine, tag), time.monotonic() - t0)


def pip_ca_bundle() -> Path | None:
    """The CA bundle pip trusts on this host (``PIP_CERT``, pip's config, else the system bundle), if any."""
    candidates = [os.environ.get("PIP_CERT", "")]
    try:
        out = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.cert"],
                             capture_output=True, text=True, timeout=60)
        candidates.append(out.stdout.strip() if out.returncode == 0 else "")
    except (OSError, subprocess.TimeoutExpired):
        pass
    candidates.append("/etc/ssl/certs/ca-certificates.crt")
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def build_project_images(engine: Engine, base: str | None = None, log=print) -> list[Built]:
    """Build the controller, worker and operator images: their targets of ``images/Dockerfile``.

    Args:
      engine: the engine to build with.
      base: ``PYTHON_IMAGE`` build argument; default :func:`python_base`.
      log: progress printer.

    Returns:
      One :class:`Built` per image, in ``PROJECT_IMAGES`` order.

    Raises:
        subprocess.CalledProcessError: a build failed (BuildKit's output in ``stderr``).
    """
    base = base or python_base(engine, log).name
    ca = pip_ca_bundle()
    built = []
    for image in PROJECT_IMAGES.values():
        args = ["build", "--network", "host", "--build-arg", f"PYTHON_IMAGE={base}",
                "-f", str(REPO_ROOT / image.dockerfile), "--target", image.target, "-t", image.name]
        if ca:
            args += ["--secret", f"id=pip-ca,src={ca}"]
        t0 = time.monotonic()
        proc = engine.docker(*args, str(REPO_ROOT), check=False, timeout=1800)
        seconds = time.monotonic() - t0
        if proc.returncode != 0:
            raise subprocess.CalledProcessError(proc.returncode, ["docker", *args], proc.stdout,
                                                proc.stderr[-6000:])
        built.append(Built(image.name, image_size(engine, image.name), seconds))
        log(f"images: {image.name} {built[-1].size_bytes / 2**20:.0f} MiB in {seconds:.0f}s")
    return built


def main() -> int:
    from e2e.kind import engine as engine_mod
    state = engine_mod.STATE_FILE
    if not state.exists():
        print("images: start an engine first: python -m e2e.kind.engine start", file=sys.stderr)
        return 2
    engine = Engine.from_json(state.read_text())
    base = python_base(engine)
    print(f"{base.name}\t{base.size_bytes / 2**20:.0f} MiB\t{base.build_s:.0f}s")
    for b in build_project_images(engine, base.name):
        print(f"{b.name}\t{b.size_bytes / 2**20:.0f} MiB\t{b.build_s:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
