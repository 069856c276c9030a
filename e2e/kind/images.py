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
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from e2e.harness.paths import build_dir
from e2e.kind.engine import Engine
from e2e.kind.rootfs import debian_tar
from elastic_jax.api.images import MAXTEXT_IMAGE, PROJECT_IMAGES, ProjectImage

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
    build_dir().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ejx-base-", dir=build_dir()) as tmp:
        tar = Path(tmp) / "rootfs.tar"
        debian_tar(BASE_SUITE, tar, "minbase", BASE_PACKAGES, log=log)
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


def _build_target(engine: Engine, image: ProjectImage, base: str, log) -> Built:
    """Build one target of ``images/Dockerfile`` on the base ``base`` (``PYTHON_IMAGE``).

    Raises:
        subprocess.CalledProcessError: the build failed (BuildKit's output in ``stderr``).
    """
    ca = pip_ca_bundle()
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
    built = Built(image.name, image_size(engine, image.name), seconds)
    log(f"images: {image.name} {built.size_bytes / 2**20:.0f} MiB in {seconds:.0f}s")
    _prune(engine, log)
    return built


PRUNE_BUILD_CACHE_AFTER = "12h"
"""BuildKit cache unused for this long is deleted after each build (docker's ``until`` filter)."""


def _prune(engine: Engine, log) -> None:
    """Deletes the image a build's tag moved off (dangling: ~5.5 GB per commit over the four images) and
    build cache unused for ``PRUNE_BUILD_CACHE_AFTER``: the shared store once grew to 57 GB and filled
    the disk mid-run (session 25). Best effort: a failed prune is logged, never fails the build."""
    # (the build cache first: it holds the old images' layers, which `image prune` alone then frees nothing of)
    for args in (("builder", "prune", "-f", "--filter", f"until={PRUNE_BUILD_CACHE_AFTER}"), ("image", "prune", "-f")):
        try:
            proc = engine.docker(*args, check=False, timeout=600)
        except subprocess.TimeoutExpired:
            log(f"images: docker {' '.join(args)} took over 600 s; left")
            continue
        if proc.returncode != 0:
            log(f"images: docker {' '.join(args)} failed ({proc.returncode}): "
                f"{proc.stderr.decode(errors='replace').strip()[-300:]}")


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
    return [_build_target(engine, image, base, log) for image in PROJECT_IMAGES.values()]


# -- the MaxText controller: the same Dockerfile on a Python 3.12 base --------------------------------

PYTHON312_PACKAGES = ("ca-certificates", "passwd", "libffi8", "libssl3", "libsqlite3-0", "libncursesw6",
                      "libuuid1", "libnsl2", "libbz2-1.0", "liblzma5", "zlib1g", "libreadline8")
"""Debian packages the copied CPython's extension modules link against (``ldd`` of its lib-dynload,
less Tk), plus what the Dockerfile's stages use (``passwd`` for build.sh's ``useradd``)."""

PYTHON312_REPOSITORY = "elastic-jax/python312-base"


def find_python312() -> Path | None:
    """The installation prefix of a CPython 3.12 on this machine, or None.

    Debian bookworm ships Python 3.11 only and no registry is reachable for
    ``python:3.12-slim`` (:data:`elastic_jax.api.images.MAXTEXT_PYTHON_IMAGE`),
    so the MaxText base copies one built for this Debian: ``E2E_PYTHON312``
    (a ``python3.12`` executable), else ``python3.12`` on PATH, else pyenv's
    ``~/.pyenv/versions/3.12.*`` (these machines have 3.12.1 there).
    """
    candidates = [os.environ.get("E2E_PYTHON312", ""), shutil.which("python3.12") or ""]
    candidates += [str(p / "bin" / "python3.12") for p in sorted(Path.home().glob(".pyenv/versions/3.12.*"))]
    for exe in filter(None, candidates):
        try:
            out = subprocess.run([exe, "-c", "import sys; print(sys.version_info[:2] == (3, 12), sys.base_prefix)"],
                                 capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            continue
        ok, _, prefix = out.stdout.strip().partition(" ")
        if out.returncode == 0 and ok == "True":
            return Path(prefix)
    return None


def python312_base(engine: Engine, prefix: Path, log=print) -> Built:
    """A Debian bookworm base with the CPython 3.12 at ``prefix`` copied to ``/usr/local``.

    The stand-in, built here, for ``python:3.12-slim-bookworm`` (which has its
    CPython in ``/usr/local`` too): same Debian, so the copy's C extensions
    find their libraries (:data:`PYTHON312_PACKAGES`); ``ldconfig`` makes a
    shared ``libpython3.12.so`` found from ``/usr/local/lib`` whatever RUNPATH
    the build recorded. Tagged by recipe and by the interpreter's version and
    binary, so another CPython makes another base.

    Raises:
        subprocess.CalledProcessError: mmdebstrap, the copy or ``docker import`` failed.
    """
    binary = prefix / "bin" / "python3.12"
    recipe = json.dumps({"suite": BASE_SUITE, "packages": PYTHON312_PACKAGES, "binary":
                         hashlib.sha256(binary.read_bytes()).hexdigest()})
    tag = f"{PYTHON312_REPOSITORY}:{BASE_SUITE}-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}"
    if image_exists(engine, tag):
        return Built(tag, image_size(engine, tag), 0.0)
    log(f"images: making {tag} with mmdebstrap and the CPython 3.12 of {prefix}")
    t0 = time.monotonic()
    # Tests, Tk and IDLE are not needed by any image and are a third of the copy.
    copy = (f'tar -C {shlex.quote(str(prefix))} --exclude=python3.12/test --exclude=python3.12/idlelib '
            f'--exclude=python3.12/tkinter --exclude=__pycache__ -cf - . | tar -C "$1/usr/local" -xf - '
            '&& chroot "$1" ldconfig && chroot "$1" /usr/local/bin/python3.12 -c "import ssl, sqlite3, venv"'
            ' && ln -sf python3.12 "$1/usr/local/bin/python3"')
    build_dir().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ejx-base312-", dir=build_dir()) as tmp:
        tar = Path(tmp) / "rootfs.tar"
        debian_tar(BASE_SUITE, tar, "minbase", PYTHON312_PACKAGES, [f"--customize-hook={copy}"], log)
        with open(tar, "rb") as f:
            proc = subprocess.run(["/usr/bin/docker", "import", "--change", 'CMD ["python3"]', "-", tag],
                                  stdin=f, env=engine.env(), capture_output=True)
        if proc.returncode != 0:
            raise subprocess.CalledProcessError(proc.returncode, proc.args, proc.stdout, proc.stderr)
    return Built(tag, image_size(engine, tag), time.monotonic() - t0)


def build_maxtext_image(engine: Engine, prefix: Path, log=print) -> Built:
    """The ``controller-maxtext`` target (MaxText 0.2.5 and its pinned closure) on :func:`python312_base`.

    About 7 minutes and 3 GiB the first time (pip downloads; BuildKit's pip
    cache keeps them for the next build), seconds once cached.

    Raises:
        subprocess.CalledProcessError: the base or the build failed.
    """
    return _build_target(engine, MAXTEXT_IMAGE, python312_base(engine, prefix, log).name, log)


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
