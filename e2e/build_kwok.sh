#!/usr/bin/env bash
# Builds kwok (sigs.k8s.io/kwok, the Kubernetes SIG's node and pod simulator) into e2e/.build/bin/kwok,
# at the version pinned in e2e/kwok/__init__.py (KWOK_VERSION). Only the operator scale benchmark and
# e2e/test_kwok_scale.py need it; e2e/build.sh does not build it, so the suite's other tests pay nothing.
#
# Static (CGO_ENABLED=0), from its own go.mod (`go install pkg@version`: kwok pins its own k8s libraries,
# newer than our localcluster's). Measured here once: 47 min wall with a cold cache for kwok's own modules,
# under load average 25-70 from other sessions (most of it waiting for CPU); not measured on an idle
# machine. Exits at once when the binary of that version exists.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
BIN="${E2E_BUILD_DIR:-$HERE/.build}/bin"
KWOK_VERSION="$(sed -n 's/^KWOK_VERSION = "\(v[0-9.]*\)"$/\1/p' "$HERE/kwok/__init__.py")"
[[ -n "$KWOK_VERSION" ]] || { echo "build_kwok.sh: no KWOK_VERSION in e2e/kwok/__init__.py" >&2; exit 1; }

STAMP="$BIN/.kwok.version"
if [[ -x "$BIN/kwok" && -f "$STAMP" && "$(cat "$STAMP")" == "$KWOK_VERSION $(go env GOVERSION)" ]]; then
  echo "build_kwok.sh: kwok $KWOK_VERSION up to date in $BIN"
  exit 0
fi
mkdir -p "$BIN"
export GOFLAGS=-mod=mod
export GOMAXPROCS="${GOMAXPROCS:-2}"
start=$(date +%s)
echo "build_kwok.sh: building kwok $KWOK_VERSION"
CGO_ENABLED=0 GOBIN="$BIN" go install -trimpath -p 2 -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
echo "$KWOK_VERSION $(go env GOVERSION)" > "$STAMP"
echo "build_kwok.sh: built in $(( $(date +%s) - start ))s into $BIN"
