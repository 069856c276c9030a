"""The Dockerfiles: hadolint-clean, and in agreement with elastic_jax.api.images.

The kind tier (e2e/kind/) builds and runs the images for real; these checks
need no engine and fail in seconds: the linter, what each image runs and
installs, that the build context holds every package folder setuptools maps,
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


def _image_id(image: images.ProjectImage) -> str:
    return image.dockerfile


@pytest.mark.parametrize("image", IMAGES, ids=_image_id)
def test_hadolint_clean(image):
    # Every rule at every severity: a finding of any level fails.
    proc = subprocess.run([str(BIN / "hadolint"), "--failure-threshold", "style", str(ROOT / image.dockerfile)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout + proc.stderr


def test_hadolint_reports_a_bad_dockerfile(tmp_path):
    # The linter really runs: an unpinned base and apt-get without cleanup are findings.
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN apt-get update && apt-get install -y curl\n")
    proc = subprocess.run([str(BIN / "hadolint"), str(bad)], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "DL3006" in proc.stdout and "DL3008" in proc.stdout, proc.stdout


@pytest.mark.parametrize("image", IMAGES, ids=_image_id)
def test_entrypoint_and_extra_match_the_images_module(image):
    dockerfile = parse(ROOT / image.dockerfile)
    builder, final = dockerfile.stages[0], dockerfile.stages[-1]
    (entrypoint,) = final.all("ENTRYPOINT")
    # Exec form (JSON): the console script is PID 1 and gets SIGTERM from the kubelet.
    assert json.loads(entrypoint) == list(image.entrypoint)
    (script,) = image.entrypoint
    assert script in PYPROJECT["project"]["scripts"], f"{script} is not a console script in pyproject.toml"
    assert _arg_default(builder, "EXTRAS") == image.extra
    assert image.extra in PYPROJECT["project"]["optional-dependencies"]
    assert f"-t {image.name} ." in (ROOT / image.dockerfile).read_text(), "the build comment names the image"


@pytest.mark.parametrize("image", IMAGES, ids=_image_id)
def test_the_working_directory_is_the_contracts(image):
    """`spec.checkpoint.uri` may not cover it (elastic_jax.api.cluster): it must be the image's real one."""
    final = parse(ROOT / image.dockerfile).stages[-1]
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
        assert entry.cmd == (), f"{image.name}: the Dockerfiles set no CMD"
    ours = {key for key in node_images.IMAGES if key.startswith(images.REGISTRY + "/")}
    assert ours <= set(images.PROJECT_IMAGES), f"stale project images in the node agent's table: {ours}"


def _pinned(reference: str) -> bool:
    """python:3.11.14-slim-bookworm@sha256:... : an exact patch version and a digest."""
    return re.fullmatch(r"[\w./-]+:\d+\.\d+\.\d+[\w.-]*@sha256:[0-9a-f]{64}", reference) is not None


@pytest.mark.parametrize("image", IMAGES, ids=_image_id)
def test_base_is_pinned_and_final_stage_is_minimal_and_non_root(image):
    dockerfile = parse(ROOT / image.dockerfile)
    assert len(dockerfile.stages) == 2, "a builder stage and a final stage"
    builder, final = dockerfile.stages
    assert builder.alias == "builder"
    bases = {dockerfile.expand(stage.base) for stage in dockerfile.stages}
    assert len(bases) == 1, f"both stages share one base (the venv's interpreter path): {bases}"
    (base,) = bases
    assert _pinned(base) and base.startswith("python:3.11."), base

    # Nothing is built or fetched in the final stage: only the builder's venv is copied in.
    for rest in final.all("RUN"):
        assert not re.search(r"\b(pip|apt-get|apt|gcc|make|curl|wget)\b", rest), rest
    copies = final.all("COPY")
    assert copies and all(c.startswith("--from=builder ") for c in copies), copies
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


MAXTEXT_DOCKERFILE = ROOT / "controller_image" / "Dockerfile.maxtext"
ALL_DOCKERFILES = [*(ROOT / i.dockerfile for i in IMAGES), MAXTEXT_DOCKERFILE]


@pytest.mark.parametrize("image", ALL_DOCKERFILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_build_context_holds_every_package_folder(image):
    # setuptools maps folders from several design-card directories into one
    # import root; the project step installs from the build context bind-mounted,
    # so a folder .dockerignore leaves out would only show when the image is built.
    builder = parse(image).stages[0]
    included = _included()
    sources: list[str] = []
    for rest in builder.all("COPY"):
        words = shlex.split(rest)
        assert not words[0].startswith("--from"), rest
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
    if image.name == "Dockerfile":
        assert "constraints.txt" in sources
        assert any("-c constraints.txt" in rest for rest in builder.all("RUN")), "pip does not use constraints.txt"


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


# -- the MaxText variant of the controller image (opt-in, not built by CI) --------------------------------------


def test_maxtext_variant_is_hadolint_clean():
    proc = subprocess.run([str(BIN / "hadolint"), "--failure-threshold", "style", str(MAXTEXT_DOCKERFILE)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout + proc.stderr


def test_maxtext_variant_is_pinned_like_the_controller_image():
    dockerfile = parse(MAXTEXT_DOCKERFILE)
    builder, final = dockerfile.stages
    (base,) = {dockerfile.expand(stage.base) for stage in dockerfile.stages}
    # MaxText 0.2.5 requires Python >= 3.12.
    assert _pinned(base) and base.startswith("python:3.12."), base
    assert _arg_default(builder, "EXTRAS") == "maxtext"
    assert "maxtext[tpu]==0.2.5" in PYPROJECT["project"]["optional-dependencies"]["maxtext"]
    assert any("-c constraints-maxtext.txt" in rest for rest in builder.all("RUN"))
    assert any("sh build.sh project" in rest for rest in builder.all("RUN"))  # which ends in `pip check`
    # The same entry point, non-root user and copy-only final stage as the controller image.
    assert json.loads(final.all("ENTRYPOINT")[0]) == list(images.PROJECT_IMAGES[images.CONTROLLER_IMAGE].entrypoint)
    assert final.all("USER") == ["65532:65532"]
    assert all(c.startswith("--from=builder ") for c in final.all("COPY"))
    # The build context is checked with the other Dockerfiles' (test_build_context_holds_every_package_folder).


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


# -- images/build.sh: the build steps every Dockerfile shares (issue 11) ----------------------------------------

@pytest.mark.parametrize("path", ALL_DOCKERFILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_dockerfile_runs_the_shared_build_steps(path):
    # The venv, the project install, the pip CA secret and the user are written once, in images/build.sh.
    dockerfile = parse(path)
    builder, final = dockerfile.stages
    runs = builder.all("RUN")
    assert [r.split("sh build.sh ", 1)[1].split()[0] for r in runs] == ["venv", "project"], runs
    assert all("type=secret,id=pip-ca" in _mounts(r) for r in runs), runs
    assert [r.split("sh /build.sh ", 1)[1] for r in final.all("RUN")] == ["user"]
    text = path.read_text()
    for written_once in ("PIP_CERT", "useradd", "python3 -m venv", "pip check", "requirements.py pyproject.toml"):
        assert written_once not in text, f"{path.name}: {written_once!r} belongs in images/build.sh"


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
