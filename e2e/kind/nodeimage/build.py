"""Build the kind node image and the images it preloads, offline and cached by content.

Four steps, each skipped when its inputs are unchanged (a second run takes
seconds):

1. Binaries: ``e2e/build.sh`` (the multi-call ``localcluster`` with kubelet,
   kubeadm, kube-proxy, CoreDNS and pause beside the control plane; the JobSet
   controller; kind; crictl).
2. Two Debian bookworm root file systems made with ``mmdebstrap`` and ``docker
   import``ed: the node's (:data:`NODE_PACKAGES`) and a small base for the
   component images (:data:`COMPONENT_PACKAGES`). Tagged by a hash of their
   recipe.
3. The component images from ``component.Dockerfile``, tagged as ``kubeadm
   config images list`` names them (:func:`component_tags`), plus the tools
   image the bridge CNI runs and the JobSet controller image.
4. The node image from ``Dockerfile``: the node root file system, our files,
   the binaries, and ``docker save`` of every image in step 3 in
   ``/kind/images/preload.tar``, imported into containerd at boot
   (``preload-images.service``, ordered before the kubelet).

Images built here carry the label :data:`INPUTS_LABEL` (a hash of what went
in); a build is skipped when the label matches.

Command line (with an engine from ``python -m e2e.kind.engine start``)::

    python -m e2e.kind.nodeimage.build     # prints each step's seconds and the image size
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from e2e.harness.build import ensure_built
from e2e.harness.paths import E2E_DIR, bin_dir, build_dir
from e2e.kind.engine import Engine
from e2e.kind.rootfs import debian_tar

HERE = Path(__file__).resolve().parent
SUITE = "bookworm"

NODE_PACKAGES = (
    "systemd", "systemd-sysv", "dbus",            # PID 1 and the units kind expects
    "containerd", "runc", "containernetworking-plugins",  # CRI runtime and CNI plugins (/usr/lib/cni)
    "iptables", "iproute2", "conntrack", "ethtool", "socat", "kmod",  # kubelet, CNI portmap, kube-proxy host side
    "mount", "util-linux", "procps", "ca-certificates", "libseccomp2",
)
"""Debian packages of the node root file system (variant minbase)."""

COMPONENT_PACKAGES = ("iptables", "iproute2", "conntrack", "ca-certificates", "busybox")
"""Debian packages of the component images' base (variant essential: no apt)."""

NODE_REPOSITORY = "localhost/elastic-jax/kind-node"
ROOTFS_REPOSITORY = "localhost/elastic-jax/kind-rootfs"
TOOLS_REPOSITORY = "localhost/elastic-jax/kind-tools"
JOBSET_REPOSITORY = "localhost/elastic-jax/jobset"

INPUTS_LABEL = "dev.elastic-jax.inputs"
"""Image label holding the hash of a build's inputs."""

NODE_BINARIES = ("localcluster", "crictl")
REQUIRED_BINARIES = ("localcluster", "kubelet", "kubeadm", "kube-proxy", "coredns", "pause", "kubectl",
                     "jobset-controller", "kind", "crictl")

_DPKG_EXCLUDES = ("/usr/share/man/*", "/usr/share/doc/*", "/usr/share/locale/*", "/usr/share/info/*")


@dataclass
class NodeImage:
    """The result of :func:`node_image`.

    Attributes:
      name: the node image reference (``kind create cluster --image``).
      size_bytes: its size as ``docker image inspect`` reports it.
      preloaded: the image references in its ``/kind/images/preload.tar``.
      tools_image: the tools image (busybox, kubectl, ip) preloaded in every node.
      jobset_image: the JobSet controller image preloaded in every node.
      step_s: seconds per step (``binaries``, ``rootfs``, ``components``, ``node``); 0-ish when cached.
    """

    name: str
    size_bytes: int
    preloaded: list[str]
    tools_image: str
    jobset_image: str
    step_s: dict[str, float] = field(default_factory=dict)


def kubernetes_version() -> str:
    """The k8s.io/kubernetes release pinned in ``e2e/localcluster/go.mod`` (``v1.35.4``)."""
    return _go_mod_version("k8s.io/kubernetes")


def jobset_version() -> str:
    """The sigs.k8s.io/jobset release pinned in ``e2e/localcluster/go.mod``."""
    return _go_mod_version("sigs.k8s.io/jobset")


def _go_mod_version(module: str) -> str:
    text = (E2E_DIR / "localcluster" / "go.mod").read_text()
    m = re.search(rf"^\s*{re.escape(module)} (v\S+)", text, re.M)
    if not m:
        raise RuntimeError(f"e2e/localcluster/go.mod does not require {module}")
    return m.group(1)


def component_tags() -> dict[str, list[str]]:
    """``component.Dockerfile`` target -> the tags it gets, as kubeadm names the images.

    Asks the kubeadm we built (``kubeadm config images list``), so the tags
    follow the pinned release: kube-apiserver, kube-controller-manager,
    kube-scheduler, kube-proxy, etcd (target ``component``), CoreDNS and pause.
    The tools and JobSet images are ours (``localhost/elastic-jax/...``).

    The tag is kubeadm's, the content is the pinned module's: etcd is the
    ``go.etcd.io/etcd/server/v3`` of ``e2e/localcluster/go.mod`` (v3.6.5 under
    kubeadm's ``etcd:3.6.6-0``), CoreDNS is v1.13.1 as tagged.
    """
    out = subprocess.run([str(bin_dir() / "kubeadm"), "config", "images", "list",
                          f"--kubernetes-version={kubernetes_version()}"],
                         check=True, capture_output=True, text=True).stdout.split()
    tags: dict[str, list[str]] = {"component": [], "coredns": [], "pause": [], "jobset": []}
    for ref in out:
        name = ref.rsplit(":", 1)[0].rsplit("/", 1)[-1]
        tags[name if name in ("coredns", "pause") else "component"].append(ref)
    tags["component"].append(tools_image())
    tags["jobset"].append(f"{JOBSET_REPOSITORY}:{jobset_version()}")
    return tags


def tools_image() -> str:
    """The tools image (busybox, kubectl, iproute2): the bridge CNI's DaemonSet and test pods run it."""
    return f"{TOOLS_REPOSITORY}:{kubernetes_version()}"


def _sha256_file(path: Path, h=None):
    h = h or hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h


def _sha256_tree(root: Path, h=None):
    """Hash of every file's relative path, mode and content (symlinks by target) under ``root``."""
    h = h or hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if not p.is_dir() or p.is_symlink()):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            h.update(f"L {rel} {os.readlink(path)}\n".encode())
        else:
            h.update(f"F {rel} {path.stat().st_mode & 0o777:o}\n".encode())
            _sha256_file(path, h)
    return h


def _label(engine: Engine, ref: str) -> str | None:
    proc = engine.docker("image", "inspect", "--format", f'{{{{index .Config.Labels "{INPUTS_LABEL}"}}}}',
                         ref, check=False)
    return proc.stdout.decode().strip() if proc.returncode == 0 else None


def image_size(engine: Engine, ref: str) -> int:
    """The image's size in bytes, as ``docker image inspect`` reports it."""
    return int(engine.docker("image", "inspect", "--format", "{{.Size}}", ref).stdout)


def ensure_binaries(log=print) -> float:
    """Run ``e2e/build.sh`` (fast when up to date) and check that every binary the node needs exists.

    Returns:
      Seconds taken.

    Raises:
        RuntimeError: the build failed or left a binary out.
    """
    seconds = ensure_built()
    missing = [b for b in REQUIRED_BINARIES if not (bin_dir() / b).exists()]
    if missing:
        raise RuntimeError(f"e2e/build.sh left no {missing} in {bin_dir()}")
    log(f"nodeimage: binaries ready in {seconds:.0f}s")
    return seconds


def rootfs_image(engine: Engine, name: str, variant: str, packages: tuple[str, ...], log=print) -> tuple[str, float]:
    """A Debian root file system as an image: mmdebstrap, then ``docker import``; cached by recipe.

    Args:
      engine: the engine to import into.
      name: a short name for the tag (``node``, ``component``).
      variant: mmdebstrap's ``--variant``.
      packages: ``--include`` packages.
      log: progress printer.

    Returns:
      The image reference and the seconds taken (about 0 when cached).

    Raises:
        subprocess.CalledProcessError: mmdebstrap or ``docker import`` failed.
    """
    recipe = json.dumps({"suite": SUITE, "variant": variant, "packages": packages, "excludes": _DPKG_EXCLUDES})
    ref = f"{ROOTFS_REPOSITORY}:{name}-{SUITE}-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}"
    if engine.docker("image", "inspect", ref, check=False).returncode == 0:
        return ref, 0.0
    log(f"nodeimage: making {ref} with mmdebstrap ({variant}: {', '.join(packages)})")
    t0 = time.monotonic()
    build_dir().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ejx-rootfs-", dir=build_dir()) as tmp:
        tar = Path(tmp) / "rootfs.tar"
        debian_tar(SUITE, tar, variant, packages, [f"--dpkgopt=path-exclude={p}" for p in _DPKG_EXCLUDES], log)
        with open(tar, "rb") as f:
            proc = subprocess.run(["/usr/bin/docker", "import", "-", ref], stdin=f, env=engine.env(),
                                  capture_output=True)
        if proc.returncode != 0:
            raise subprocess.CalledProcessError(proc.returncode, proc.args, proc.stdout, proc.stderr)
    seconds = time.monotonic() - t0
    log(f"nodeimage: {ref} in {seconds:.0f}s")
    return ref, seconds


def _image_id(engine: Engine, ref: str) -> str | None:
    proc = engine.docker("image", "inspect", "--format", "{{.Id}}", ref, check=False)
    return proc.stdout.decode().strip() if proc.returncode == 0 else None


def _build(engine: Engine, context: Path, dockerfile: Path, tags: list[str], inputs: str,
           build_args: dict[str, str], target: str | None = None) -> None:
    """``docker build --network none`` with the inputs label; the images it untags are removed."""
    before = {_image_id(engine, t) for t in tags} - {None}
    args = ["build", "--network", "none", "-f", str(dockerfile), "--label", f"{INPUTS_LABEL}={inputs}"]
    for key, value in build_args.items():
        args += ["--build-arg", f"{key}={value}"]
    if target:
        args += ["--target", target]
    for tag in tags:
        args += ["-t", tag]
    proc = engine.docker(*args, str(context), check=False, timeout=1800)
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, ["docker", *args], proc.stdout, proc.stderr[-6000:])
    for old in before - {_image_id(engine, t) for t in tags}:
        engine.docker("image", "rm", old, check=False)  # refused while another tag or a container uses it


def _stage(context: Path, files: dict[str, Path]) -> None:
    """Fill ``context`` with ``files`` (relative name -> source), hard-linked when possible."""
    shutil.rmtree(context, ignore_errors=True)
    context.mkdir(parents=True)
    for rel, src in files.items():
        dest = context / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dest, symlinks=True)
            continue
        try:
            os.link(src.resolve(), dest)
        except OSError:
            shutil.copy2(src.resolve(), dest)


def component_images(engine: Engine, base: str, log=print) -> tuple[dict[str, list[str]], float]:
    """Build ``component.Dockerfile``'s targets with their tags; skipped when the inputs are unchanged.

    Returns:
      Target -> tags (see :func:`component_tags`), and the seconds taken.

    Raises:
        subprocess.CalledProcessError: a build failed.
    """
    tags = component_tags()
    h = hashlib.sha256(f"{base}\n{json.dumps(tags, sort_keys=True)}\n".encode())
    _sha256_file(HERE / "component.Dockerfile", h)
    for binary in ("localcluster", "jobset-controller"):
        _sha256_file(bin_dir() / binary, h)
    inputs = h.hexdigest()
    if all(_label(engine, t) == inputs for refs in tags.values() for t in refs):
        return tags, 0.0
    t0 = time.monotonic()
    context = build_dir() / "kind" / "component-context"
    _stage(context, {"localcluster": bin_dir() / "localcluster",
                     "jobset-controller": bin_dir() / "jobset-controller"})
    for target, refs in tags.items():
        _build(engine, context, HERE / "component.Dockerfile", refs, inputs, {"BASE_IMAGE": base}, target)
    shutil.rmtree(context, ignore_errors=True)
    seconds = time.monotonic() - t0
    log(f"nodeimage: {sum(len(r) for r in tags.values())} component images in {seconds:.0f}s")
    return tags, seconds


def node_image(engine: Engine, log=print) -> NodeImage:
    """Build (or find up to date) the node image and everything it needs.

    Args:
      engine: the private engine (:mod:`e2e.kind.engine`).
      log: progress printer.

    Returns:
      The :class:`NodeImage`, with each step's seconds.

    Raises:
        RuntimeError: the Go build failed.
        subprocess.CalledProcessError: mmdebstrap, ``docker build``/``save``/``import`` failed.
    """
    steps: dict[str, float] = {"binaries": ensure_binaries(log)}
    t0 = time.monotonic()
    node_rootfs, s1 = rootfs_image(engine, "node", "minbase", NODE_PACKAGES, log)
    component_base, s2 = rootfs_image(engine, "component", "essential", COMPONENT_PACKAGES, log)
    steps["rootfs"] = time.monotonic() - t0 if (s1 or s2) else 0.0
    tags, steps["components"] = component_images(engine, component_base, log)
    preloaded = [t for refs in tags.values() for t in refs]
    version = kubernetes_version()
    ref = f"{NODE_REPOSITORY}:{version}"

    h = hashlib.sha256(f"{node_rootfs}\n{version}\n{tools_image()}\n".encode())
    _sha256_file(HERE / "Dockerfile", h)
    _sha256_tree(HERE / "files", h)
    for binary in NODE_BINARIES:
        _sha256_file(bin_dir() / binary, h)
    for t in preloaded:  # image IDs: a rebuilt component changes the node
        h.update(f"{_image_id(engine, t)}\n".encode())
    inputs = h.hexdigest()
    if _label(engine, ref) == inputs:
        steps["node"] = 0.0
    else:
        t0 = time.monotonic()
        context = build_dir() / "kind" / "node-context"
        _stage(context, {"files": HERE / "files", **{f"bin/{b}": bin_dir() / b for b in NODE_BINARIES}})
        (context / "images").mkdir()
        engine.docker("save", "-o", str(context / "images" / "preload.tar"), *preloaded, timeout=900)
        _build(engine, context, HERE / "Dockerfile", [ref], inputs,
               {"ROOTFS_IMAGE": node_rootfs, "K8S_VERSION": version, "TOOLS_IMAGE": tools_image()})
        shutil.rmtree(context, ignore_errors=True)
        steps["node"] = time.monotonic() - t0
        log(f"nodeimage: {ref} in {steps['node']:.0f}s")
    return NodeImage(name=ref, size_bytes=image_size(engine, ref), preloaded=preloaded,
                     tools_image=tools_image(), jobset_image=tags["jobset"][0], step_s=steps)


def main() -> int:
    """Build with the engine of ``python -m e2e.kind.engine start``; print the steps and the size."""
    from e2e.kind import engine as engine_mod
    if not engine_mod.STATE_FILE.exists():
        print("nodeimage: start an engine first: python -m e2e.kind.engine start", file=sys.stderr)
        return 2
    image = node_image(Engine.from_json(engine_mod.STATE_FILE.read_text()))
    steps = ", ".join(f"{k} {v:.0f}s" for k, v in image.step_s.items())
    print(f"{image.name}\t{image.size_bytes / 2**20:.0f} MiB\t{steps}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
