#!/usr/bin/env bash
# The whole TPU check of issue 29 as ONE call on the TPU machine: the TPU benchmark, then the TPU
# test tier. Logs and JSON go to $OUT (the folder that comes back).
#
# Prepare here first (docs/benchmarks.md "TPU"): bash benchmarks/tpu_wheels.sh, which fills
# .tpu-wheels/ (git-ignored, ~60 MB); carry it with the run, e.g.
#   run(command="bash benchmarks/tpu_session.sh", carry=[".tpu-wheels"], timeout_s=600)
#
# On the machine: Python 3.11 and JAX 0.10.2 with libtpu, first on PYTHONPATH (kept first: we only
# append), no network, no TCP/UDP sockets, one program at a time on the chip, an ordinary user.
# Budget (measured 2026-12-06): install ~10 s; the benchmark ~4-5 min (examples/02's model, 22 s per
# compile); the tier ~50 s per scenario without a cache. BENCH_TIMEOUT_S and TIER_TIMEOUT_S bound each so
# that both report within 10 min.
set -uo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${OUT:?set OUT to the folder whose files come back}"
WHEELS="${TPU_WHEELS:-$REPO/.tpu-wheels}"
SITE="${TPU_SITE:-/tmp/site}"
TIER_TIMEOUT_S="${TIER_TIMEOUT_S:-230}"
BENCH_TIMEOUT_S="${BENCH_TIMEOUT_S:-300}"
mkdir -p "$OUT"
exec > >(tee -a "$OUT/session.log") 2>&1
cd "$REPO" || exit 1
echo "== $(date -u +%FT%TZ) $(uname -n) python: $(python3 --version 2>&1)"

# 1. Dependencies: the carried wheels into $SITE, APPENDED to PYTHONPATH (libtpu's JAX stays first).
if ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  echo "no wheels in $WHEELS: run bash benchmarks/tpu_wheels.sh here and carry .tpu-wheels"; exit 3
fi
python3 -m pip install -q --upgrade --no-index --no-deps --target "$SITE" "$WHEELS"/*.whl || exit 3
# elastic-jax itself from this copy of the tree: its packages live in several folders (pyproject.toml
# package-dir), so links make elastic_jax/ whole, found first from the repository root as every
# process here starts there (no build tools needed on the machine). Meant for the machine's copy.
for link in controller:controller_image/controller worker:worker_image/worker k8s_operator:operator/k8s_operator; do
  [ -e "elastic_jax/${link%%:*}" ] || ln -s "../${link#*:}" "elastic_jax/${link%%:*}"
done
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$SITE:$REPO"
echo "PYTHONPATH=$PYTHONPATH"
python3 -c "import jax, elastic_jax.controller.loop as l; print('jax', jax.__version__, jax.__file__); print(l.__file__)" \
  || exit 3

# A killed holder keeps the chip ~12 s (DESIGN.md "The TPU machine"): wait until a probe opens it.
wait_for_chip() {
  for _ in $(seq 12); do
    JAX_PLATFORMS=tpu python3 -c "import jax; jax.devices()" >/dev/null 2>&1 && return 0
    sleep 5
  done
  echo "the chip stayed busy"
}

# `tpu_session.sh largest`: issue 29 item 4's ladder alone (benchmarks/bench_tpu_largest.py, up to ~8 min:
# larger models compile longer), as its own device call.
if [ "${1:-}" = largest ]; then
  echo "== $(date -u +%T) largest"
  timeout -k 10 "${LARGEST_TIMEOUT_S:-540}" python3 benchmarks/bench_tpu_largest.py --out "$OUT/largest.json" \
    --workdir "$(mktemp -d /tmp/bench-tpu-largest.XXXXXX)" 2>&1 | tee "$OUT/largest.log"
  rc=${PIPESTATUS[0]}
  echo "== $(date -u +%FT%TZ) done: largest $rc"
  exit "$rc"
fi

# `tpu_session.sh ratio`: the bench's main child alone (runtime step vs fused step, slice loss -> next step,
# steps lost), for a call on little device time (~2 min after the install).
if [ "${1:-}" = ratio ]; then
  echo "== $(date -u +%T) ratio (main child)"
  JAX_PLATFORMS=tpu timeout -k 10 "${RATIO_TIMEOUT_S:-200}" python3 benchmarks/bench_tpu.py --child main --platform tpu \
    --workdir "$(mktemp -d /tmp/bench-tpu-ratio.XXXXXX)" 2>&1 | tee "$OUT/ratio.log"
  rc=${PIPESTATUS[0]}
  echo "== $(date -u +%FT%TZ) done: ratio $rc"
  exit "$rc"
fi

# 2. The benchmark first (refuses to report a run whose devices are not TPUs): its figures are the ones no
#    CPU run can give.
echo "== $(date -u +%T) bench"
timeout -k 10 "$BENCH_TIMEOUT_S" python3 benchmarks/bench_tpu.py --out "$OUT/bench_tpu.json" \
  --workdir /tmp/bench-tpu 2>&1 | tee "$OUT/bench.log"
bench_rc=${PIPESTATUS[0]}
echo "bench exit $bench_rc"
wait_for_chip

# 3. The TPU tier, one pytest process (each scenario is a child that holds the chip alone, then exits).
#    --confcutdir: only tests/tpu/conftest.py (the root one loads CI plugins this machine does not need).
#    The scenarios compile the same small model again and again: a persistent compilation cache shared by
#    their children keeps the tier inside the session (it checks behaviour, not speed).
echo "== $(date -u +%T) tier"
JAX_COMPILATION_CACHE_DIR=/tmp/tier-jax-cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 \
  timeout -k 10 "$TIER_TIMEOUT_S" python3 -m pytest tests/tpu -m tpu -v -rA -p no:cacheprovider \
  --durations=0 --confcutdir=tests/tpu --junitxml="$OUT/tier.xml" 2>&1 | tee "$OUT/tier.log"
tier_rc=${PIPESTATUS[0]}
echo "tier exit $tier_rc"
echo "== $(date -u +%FT%TZ) done: tier $tier_rc, bench $bench_rc"
[ "$tier_rc" = 0 ] && [ "$bench_rc" = 0 ]
