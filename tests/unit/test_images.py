"""images/Dockerfile, one target per image: hadolint-clean, and in agreement with elastic_jax.api.images.

The kind tier (e2e/kind/) builds and runs the images for real; these checks
need no engine and fail in seconds: one Dockerfile whose targets share one
builder and one runtime stage, the linter, what each image runs and installs, that the build context holds every package folder setuptools maps,
that the final stage is non-root and carries nothing from the build, and that
the local control plane's image table runs the same entry points.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from elastic_jax import contract

from e2e.nodeagent import images as node_images
from elastic_jax.api import images
from elastic_jax.api import job as job_api

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
BIN = Path(sys.executable).parent
IMAGES = list(images.PROJECT_IMAGES.values())


@dataclass
class Stage:
    """One FROM ... block: its base, alias and instructions as (KEYWORD, rest)."""

    base: str
    alias: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [rest for kw, rest in self.instructions if kw == keyword]


@dataclass
class Dockerfile:
    """A parsed Dockerfile: global ARG defaults and the stages in order."""

    args: dict[str, str]
    stages: list[Stage]

    def expand(self, text: str) -> str:
        """Substitutes ${NAME} and $NAME from the global ARG defaults."""
        return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: self.args.get(m[1] or m[2], m[0]), text)


def parse(path: Path) -> Dockerfile:
    """Parses the subset of Dockerfile syntax the project uses (continuations, comments, stages)."""
    logical, buf = [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        logical.append(buf + line)
        buf = ""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        keyword, _, rest = line.partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        if keyword == "FROM":
            words = rest.split()
            stages.append(Stage(base=words[0], alias=words[2] if len(words) == 3 else None))
        elif stages:
            stages[-1].instructions.append((keyword, rest))
        elif keyword == "ARG":
            name, _, default = rest.partition("=")
            args[name] = default
    return Dockerfile(args=args, stages=stages)


def _arg_default(stage: Stage, name: str) -> str | None:
    for rest in stage.all("ARG"):
        key, _, default = rest.partition("=")
        if key == name:
            return default
    return None


DOCKERFILE = ROOT / images.DOCKERFILE
ALL_IMAGES = [*IMAGES, images.MAXTEXT_IMAGE]


def _image_id(image: images.ProjectImage) -> str:
    return image.target


def _stage(dockerfile: Dockerfile, alias: str) -> Stage:
    (stage,) = [s for s in dockerfile.stages if s.alias == alias] or [None]
    assert stage is not None, f"{images.DOCKERFILE} has no stage {alias!r}"
    return stage


def lineage(dockerfile: Dockerfile, alias: str) -> list[Stage]:
    """The stage ``alias`` and every stage it is built FROM, the first (FROM an image) first."""
    chain = [_stage(dockerfile, alias)]
    aliases = {s.alias for s in dockerfile.stages}
    while chain[0].base in aliases:
        chain.insert(0, _stage(dockerfile, chain[0].base))
    return chain


def flatten(dockerfile: Dockerfile, alias: str) -> Stage:
    """The stage ``alias`` with every instruction it inherits, in build order, as one stage."""
    chain = lineage(dockerfile, alias)
    return Stage(base=chain[0].base, alias=alias, instructions=[ins for stage in chain for ins in stage.instructions])


def _final(dockerfile: Dockerfile, image: images.ProjectImage) -> Stage:
    """The image's target, flattened: what ``docker build --target`` makes."""
    return flatten(dockerfile, image.target)


def _venv(dockerfile: Dockerfile, image: images.ProjectImage) -> Stage:
    """The builder stage the image copies its venv from (``<target>-venv``), flattened."""
    return flatten(dockerfile, f"{image.target}-venv")


def test_every_image_is_a_target_of_the_one_dockerfile():
    # Issue 11: the images share one builder/runtime skeleton, written once. A Dockerfile per
    # component folder had to copy it (a Dockerfile cannot include another on Debian's docker.io).
    assert {image.dockerfile for image in ALL_IMAGES} == {images.DOCKERFILE}
    strays = sorted(str(p.relative_to(ROOT)) for folder in ("operator", "controller_image", "worker_image", "images")
                    for p in (ROOT / folder).rglob("*Dockerfile*") if p != DOCKERFILE)
    assert not strays, f"a second product Dockerfile: {strays}"
    dockerfile = parse(DOCKERFILE)
    targets = [image.target for image in ALL_IMAGES]
    assert len(set(targets)) == len(targets)
    for image in ALL_IMAGES:
        # Each target is FROM the shared runtime stage, its venv stage FROM the shared builder.
        assert [s.alias for s in lineage(dockerfile, image.target)] == ["runtime", image.target]
        assert [s.alias for s in lineage(dockerfile, f"{image.target}-venv")] == ["builder", f"{image.target}-venv"]


def test_a_build_without_target_fails_naming_the_targets():
    # Without --target BuildKit builds the last stage: it must fail and say what to pass.
    last = parse(DOCKERFILE).stages[-1]
    assert last.alias == "usage"
    (run,) = last.all("RUN")
    assert run.rstrip().endswith("exit 2") and "--target" in run, run
    for image in ALL_IMAGES:
        assert image.target in run, f"the usage message does not name {image.target}"


def test_hadolint_clean():
    # Every rule at every severity: a finding of any level fails.
    proc = subprocess.run([str(BIN / "hadolint"), "--failure-threshold", "style", str(DOCKERFILE)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout + proc.stderr


def test_hadolint_reports_a_bad_dockerfile(tmp_path):
    # The linter really runs: an unpinned base and apt-get without cleanup are findings.
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN apt-get update && apt-get install -y curl\n")
    proc = subprocess.run([str(BIN / "hadolint"), str(bad)], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "DL3006" in proc.stdout and "DL3008" in proc.stdout, proc.stdout


@pytest.mark.parametrize("image", ALL_IMAGES, ids=_image_id)
def test_entrypoint_and_extra_match_the_images_module(image):
    dockerfile = parse(DOCKERFILE)
    (entrypoint,) = _final(dockerfile, image).all("ENTRYPOINT")
    # Exec form (JSON): the console script is PID 1 and gets SIGTERM from the kubelet.
    assert json.loads(entrypoint) == list(image.entrypoint)
    (script,) = image.entrypoint
    assert script in PYPROJECT["project"]["scripts"], f"{script} is not a console script in pyproject.toml"
    assert _arg_default(_venv(dockerfile, image), "EXTRAS") == image.extra
    assert image.extra in PYPROJECT["project"]["optional-dependencies"]
    assert f"--target {image.target} " in DOCKERFILE.read_text(), "the build comment names the target"
    assert f"-t {image.name} ." in DOCKERFILE.read_text(), "the build comment names the image"


@pytest.mark.parametrize("image", ALL_IMAGES, ids=_image_id)
def test_the_working_directory_is_the_contracts(image):
    """`spec.checkpoint.uri` may not cover it (elastic_jax.api.cluster): it must be the image's real one."""
    final = _final(parse(DOCKERFILE), image)
    assert final.all("WORKDIR")[-1] == contract.IMAGE_WORKDIR


def test_default_images_of_the_job_spec_are_project_images():
    assert job_api.DEFAULT_CONTROLLER_IMAGE == images.CONTROLLER_IMAGE
    assert job_api.DEFAULT_WORKER_IMAGE == images.WORKER_IMAGE


def test_node_agent_image_table_runs_the_same_entry_points():
    # e2e/nodeagent/images.py stands an image for a local command; it must run
    # what the Dockerfile's ENTRYPOINT runs, or the e2e tests test something else.
    for image in IMAGES:
        entry = node_images.resolve(image.name)
        assert entry.entrypoint == image.entrypoint, (image.name, entry)
        assert entry.cmd == (), f"{image.name}: the Dockerfile sets no CMD"
    ours = {key for key in node_images.IMAGES if key.startswith(images.REGISTRY + "/")}
    assert ours <= set(images.PROJECT_IMAGES), f"stale project images in the node agent's table: {ours}"


def _pinned(reference: str) -> bool:
    """python:3.11.14-slim-bookworm@sha256:... : an exact patch version and a digest."""
    return re.fullmatch(r"[\w./-]+:\d+\.\d+\.\d+[\w.-]*@sha256:[0-9a-f]{64}", reference) is not None


@pytest.mark.parametrize("image", IMAGES, ids=_image_id)
def test_base_is_pinned_and_final_stage_is_minimal_and_non_root(image):
    dockerfile = parse(DOCKERFILE)
    final, venv = _final(dockerfile, image), _venv(dockerfile, image)
    bases = {dockerfile.expand(stage.base) for stage in (final, venv)}
    assert len(bases) == 1, f"builder and final stage share one base (the venv's interpreter path): {bases}"
    (base,) = bases
    assert _pinned(base) and base.startswith("python:3.11."), base

    # Nothing is built or fetched in the final stage: only its own builder's venv is copied in.
    for rest in final.all("RUN"):
        assert not re.search(r"\b(pip|apt-get|apt|gcc|make|curl|wget)\b", rest), rest
    copies = [c for c in final.all("COPY") if c.startswith("--from=")]
    assert copies == [f"--from={image.target}-venv /opt/venv /opt/venv"], final.all("COPY")
    # No secret or cache reaches it: its one mount is images/build.sh, for the user step.
    assert [_mounts(rest) for rest in final.all("RUN")] == [["type=bind,source=images/build.sh,target=/build.sh"]]

    (user,) = final.all("USER")
    uid, _, gid = user.partition(":")
    # Numeric, so the kubelet can enforce runAsNonRoot without reading /etc/passwd.
    assert uid.isdigit() and int(uid) != 0 and (not gid or gid.isdigit()), user
    assert "PATH=/opt/venv/bin" in " ".join(final.all("ENV"))


def _mounts(run: str) -> list[str]:
    """The ``--mount=`` options of a RUN instruction, in order."""
    return [w.removeprefix("--mount=") for w in shlex.split(run) if w.startswith("--mount=")]


def _included() -> set[str]:
    """What .dockerignore re-includes after excluding everything (``**``): the build context."""
    lines = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    assert lines[0] == "**"
    return {ln[1:].rstrip("/") for ln in lines if ln.startswith("!")}


def _in_context(path: str, included: set[str]) -> bool:
    return any(path == i or path.startswith(i + "/") for i in included)


@pytest.mark.parametrize("image", ALL_IMAGES, ids=_image_id)
def test_build_context_holds_every_package_folder(image):
    # setuptools maps folders from several component folders into one
    # import root; the project step installs from the build context bind-mounted,
    # so a folder .dockerignore leaves out would only show when the image is built.
    dockerfile = parse(DOCKERFILE)
    builder = _venv(dockerfile, image)
    included = _included()
    sources: list[str] = []
    for stage in (builder, _final(dockerfile, image)):
        for rest in stage.all("COPY"):
            words = shlex.split(rest)
            if not words[0].startswith("--from"):
                sources += [w.rstrip("/") for w in words[:-1]]
    for source in sources:
        assert (ROOT / source).exists(), f"COPY {source}: no such path"
        assert _in_context(source, included), f"COPY {source}: not in the build context"
    assert "images/build.sh" in sources, "the builder runs the shared build steps"
    (project,) = [rest for rest in builder.all("RUN") if "build.sh project /ctx" in rest]
    assert "type=bind,target=/ctx,rw" in _mounts(project), project
    tool = PYPROJECT["tool"]["setuptools"]
    for folder in tool["package-dir"].values():
        assert _in_context(folder, included), f"{folder} is not in the build context"
        assert (ROOT / folder).is_dir(), folder
    assert _in_context(PYPROJECT["project"]["readme"], included)
    for path in ("pyproject.toml", "images/build.sh"):
        assert _in_context(path, included), path
    # Every dependency at the version the tests ran with (tests/unit/test_constraints.py).
    constraints = "constraints-maxtext.txt" if image is images.MAXTEXT_IMAGE else "constraints.txt"
    assert any(s.endswith(constraints) for s in sources), sources
    assert any(f"-c {constraints}" in rest for rest in builder.all("RUN")), f"pip does not use {constraints}"


def test_parser_reads_continuations_and_stages(tmp_path):
    path = tmp_path / "Dockerfile"
    path.write_text("ARG BASE=python:3.11.14-slim\nFROM ${BASE} AS builder\nRUN a \\\n  # note\n  && b\n"
                    "FROM $BASE\nENTRYPOINT [\"x\"]\n")
    parsed = parse(path)
    assert [s.alias for s in parsed.stages] == ["builder", None]
    assert parsed.stages[0].all("RUN") == ["a  && b"]
    assert {parsed.expand(s.base) for s in parsed.stages} == {"python:3.11.14-slim"}


def test_pathways_images_are_pinned_to_the_jax_in_constraints():
    """Issue 10 item 9: the Pathways server/proxy release follows the jax/jaxlib the controller image installs."""
    from elastic_jax.api import images

    pins = dict(line.split("==", 1) for line in (ROOT / "constraints.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    assert pins["jax"] == pins["jaxlib"] == images.PINNED_JAX, "move images.PINNED_JAX with the jax pin"
    assert images.PINNED_JAX in images.PATHWAYS_RELEASES, "add the Pathways release of the new jax pin"
    assert not images.pathways_image("server").endswith(":latest")


# -- the MaxText variant of the controller image (built and run by e2e/kind/test_maxtext_image.py) ------------

MAXTEXT = images.MAXTEXT_IMAGE


def test_maxtext_variant_is_pinned_like_the_controller_image():
    dockerfile = parse(DOCKERFILE)
    # MaxText 0.2.5 requires Python >= 3.12: its base is a build argument, pinned in one place.
    assert _pinned(images.MAXTEXT_PYTHON_IMAGE) and images.MAXTEXT_PYTHON_IMAGE.startswith("python:3.12.")
    command = f"--target {MAXTEXT.target} \\\n#     --build-arg PYTHON_IMAGE={images.MAXTEXT_PYTHON_IMAGE} \\\n"
    assert command in DOCKERFILE.read_text(), "the MaxText build comment passes the pinned 3.12 base"
    for doc in ("docs/bring-your-own-loop.md", "examples/03-maxtext-pathways.yaml"):
        assert images.MAXTEXT_PYTHON_IMAGE in (ROOT / doc).read_text(), f"{doc}: the MaxText build command"
    venv = _venv(dockerfile, MAXTEXT)
    # On the 3.11 default the build stops first, naming the build argument.
    assert "sys.version_info < (3, 12)" in venv.all("RUN")[0] and "PYTHON_IMAGE" in venv.all("RUN")[0]
    assert _arg_default(venv, "EXTRAS") == "maxtext"
    assert "maxtext[tpu]==0.2.5" in PYPROJECT["project"]["optional-dependencies"]["maxtext"]
    assert any("-c constraints-maxtext.txt" in rest for rest in venv.all("RUN"))
    assert any("sh build.sh project" in rest for rest in venv.all("RUN"))  # which ends in `pip check`
    # The same entry point, non-root user and copy-only final stage as the controller image.
    final = _final(dockerfile, MAXTEXT)
    assert json.loads(final.all("ENTRYPOINT")[0]) == list(images.PROJECT_IMAGES[images.CONTROLLER_IMAGE].entrypoint)
    assert final.all("USER") == ["65532:65532"]
    assert final.all("COPY") == [f"--from={MAXTEXT.target}-venv /opt/venv /opt/venv"]
    # The build context is checked with the other images' (test_build_context_holds_every_package_folder).


def test_maxtext_constraints_pin_the_jax_of_the_example_and_agree_with_pyproject():
    pins = {}
    for line in (ROOT / "controller_image" / "constraints-maxtext.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep, f"constraints-maxtext.txt: {line!r} is not an exact pin"
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    for req in PYPROJECT["project"]["optional-dependencies"]["maxtext"] + PYPROJECT["project"]["dependencies"]:
        name, _, version = req.partition("==")
        name = re.sub(r"[-_.]+", "-", re.sub(r"\[.*\]", "", name)).lower()
        assert pins.get(name) == version, f"{name}: pyproject {version}, constraints-maxtext.txt {pins.get(name)}"
    assert pins["jax"] == pins["jaxlib"] and f"jax-{pins['jax']}" in (ROOT / "examples" / "03-maxtext-pathways.yaml").read_text()


# -- images/build.sh: the build steps every image shares (issue 11) ----------------------------------------

@pytest.mark.parametrize("image", ALL_IMAGES, ids=_image_id)
def test_every_image_runs_the_shared_build_steps(image):
    # The venv, the project install, the pip CA secret and the user are written once, in images/build.sh.
    dockerfile = parse(DOCKERFILE)
    runs = [r for r in _venv(dockerfile, image).all("RUN") if "sh build.sh " in r]
    assert [r.split("sh build.sh ", 1)[1].split()[0] for r in runs] == ["venv", "project"], runs
    assert all("type=secret,id=pip-ca" in _mounts(r) for r in runs), runs
    assert [r.split("sh /build.sh ", 1)[1] for r in _final(dockerfile, image).all("RUN")] == ["user"]
    text = DOCKERFILE.read_text()
    for written_once in ("PIP_CERT", "useradd", "python3 -m venv", "pip check", "requirements.py pyproject.toml"):
        assert written_once not in text, f"{images.DOCKERFILE}: {written_once!r} belongs in images/build.sh"


def _build_sh(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", str(ROOT / "images" / "build.sh"), *args], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)


def test_build_script_checks_the_installed_venv():
    project = (ROOT / "images" / "build.sh").read_text().split("    project)", 1)[1].split(";;", 1)[0]
    assert "pip install --no-deps" in project and project.rstrip().endswith("/opt/venv/bin/pip check"), project


def test_build_script_names_a_bad_step_or_a_missing_argument():
    proc = _build_sh("install")
    assert proc.returncode == 2 and "unknown step 'install' (venv, project or user)" in proc.stderr, proc.stderr
    proc = _build_sh("venv")
    assert proc.returncode != 0 and "EXTRAS" in proc.stderr, proc.stderr
    proc = _build_sh("project")
    assert proc.returncode != 0 and "SOURCE" in proc.stderr, proc.stderr
    proc = _build_sh()
    assert proc.returncode != 0 and "usage: build.sh" in proc.stderr, proc.stderr
