#!/usr/bin/env bash
# Downloads, here, the wheels the TPU machine needs for benchmarks/tpu_session.sh into .tpu-wheels/
# (git-ignored; carried to the machine with the run: carry [".tpu-wheels"]).
#
# The TPU machine has Python 3.11 and JAX 0.10.2 with libtpu, and reaches no network: every other
# package of the controller group (pyproject.toml), pathwaysutils, and pytest travel as wheels pinned
# by constraints.txt. jax, jaxlib, numpy, scipy, ml_dtypes and opt_einsum are removed: the machine's
# own (libtpu's) must win. docs/benchmarks.md "TPU" says how the session uses them.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
DEST="${1:-$REPO/.tpu-wheels}"
PY="${PYTHON:-python3}"
rm -rf "$DEST" && mkdir -p "$DEST"
# The controller group and the tpu group's pathwaysutils, as pyproject.toml pins them, plus the test runner.
mapfile -t REQS < <("$PY" - "$REPO/pyproject.toml" <<'PYEOF'
import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
groups = project["optional-dependencies"]
reqs = project["dependencies"] + groups["controller"] + [r for r in groups["tpu"] if not r.startswith("elastic-jax")]
reqs += [r for r in groups["dev"] if r.split("==")[0] in ("pytest", "pytest-timeout")]
print("\n".join(r.replace("jax[cpu]", "jax") for r in reqs))
PYEOF
)
"$PY" -m pip download -q --only-binary=:all: --python-version 3.11 --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -c "$REPO/constraints.txt" -d "$DEST" "${REQS[@]}"
# The machine's own: its JAX has libtpu; a second numpy or jaxlib on PYTHONPATH would shadow nothing
# (ours is appended) but is dead weight under the 64 MiB the run may carry.
for name in jax jaxlib numpy scipy ml_dtypes opt_einsum; do
  rm -f "$DEST/$name"-[0-9]*.whl
done
du -sh "$DEST"
find "$DEST" -name '*.whl' | wc -l
