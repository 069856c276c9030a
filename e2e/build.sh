#!/usr/bin/env bash
# Builds every binary the local e2e cluster and the kind tier need into e2e/.build/bin:
#   localcluster (etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
#   kubectl and the pki tool for the local cluster; kubelet, kubeadm, kube-proxy,
#   coredns and pause for the kind node image; one binary, a symlink per part),
#   jobset-controller (sigs.k8s.io/jobset), helm (helm.sh/helm/v3), and for the
#   kind tier the kind CLI (sigs.k8s.io/kind) and crictl (sigs.k8s.io/cri-tools).
#
# localcluster links against glibc (cgo, Go's default here): it runs on the
# host and in the kind images, which are all Debian bookworm (glibc 2.36).
#
# Go's module and build caches stay in their default places (~/go,
# ~/.cache/go-build), so a rebuild after a change recompiles only what changed.
# When the inputs (versions, go.mod, go.sum, our Go sources) are unchanged since
# the last successful build, the script exits at once: linking alone takes about
# a minute on two cores.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
BIN="${E2E_BUILD_DIR:-$HERE/.build}/bin"

# The pinned releases: k8s.io/kubernetes, sigs.k8s.io/jobset and helm in
# localcluster/go.mod (the last two are `tool`s of that module), kind and crictl here.
# kind v0.33.0: the newest release the module proxy serves; supports Kubernetes 1.35
# (kubeadm v1beta4). crictl v1.34.0: the newest cri-tools release served at or below
# our Kubernetes minor (v1.35.0 is not served); CRI v1 is stable across that skew.
KIND_VERSION=v0.33.0
CRICTL_VERSION=v1.34.0
module_version() { awk -v m="$1" '$1==m && $2 ~ /^v/ {print $2; exit}' "$HERE/localcluster/go.mod"; }
JOBSET_VERSION="$(module_version sigs.k8s.io/jobset)"
HELM_VERSION="$(module_version helm.sh/helm/v3)"
K8S_VERSION="$(module_version k8s.io/kubernetes)"

# Module mode even where a vendor folder or a workspace would say otherwise;
# two cores: keep one compile per core so concurrent tests still get CPU.
export GOFLAGS=-mod=mod
export GOMAXPROCS="${GOMAXPROCS:-2}"

stamp_inputs() {
  echo "$JOBSET_VERSION $HELM_VERSION $K8S_VERSION $KIND_VERSION $CRICTL_VERSION $(go env GOVERSION)"
  cat "$HERE/build.sh" "$HERE"/localcluster/go.mod "$HERE"/localcluster/go.sum "$HERE"/localcluster/*.go
}
# One build per build folder at a time: the suite's lanes (xdist workers, tests/support/lanes.py) each
# start this script; the second waits here for the first, then finds the stamp up to date below.
mkdir -p "$BIN"
exec 9>"$BIN/../build.lock"
if ! flock -n 9; then
  echo "build.sh: another build into $BIN runs; waiting for it"
  waited=$(date +%s)
  flock 9
  echo "build.sh: waited $(( $(date +%s) - waited ))s for the other build"
fi
STAMP="$BIN/.inputs.sha256"
want="$(stamp_inputs | sha256sum | cut -d' ' -f1)"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" && -x "$BIN/localcluster" && -x "$BIN/jobset-controller" && -x "$BIN/helm" \
      && -x "$BIN/kind" && -x "$BIN/crictl" ]]; then
  echo "build.sh: up to date in $BIN"
  exit 0
fi
mkdir -p "$BIN"

start=$(date +%s)
# The k8s version variables feed `kubectl version`, the API server's /version
# and helm's kubeVersion checks; an unstamped build reports v0.0.0.
major="${K8S_VERSION#v}"; major="${major%%.*}"
minor="${K8S_VERSION#v*.}"; minor="${minor%%.*}"
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
# -X of a package a binary does not link is ignored, so one set serves all three.
ldflags+=" -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"

# One `go build` for localcluster and the two `tool`s of our module (see go.mod):
# they share one module graph, so client-go, k8s.io/api and the rest compile once
# (helm built from its own go.mod pins other k8s library versions: all of them
# compiled a second time), and one build schedules all packages across both
# cores. cgo on for all three (the default here): they run on the host and in
# the kind images, all Debian bookworm (glibc 2.36).
echo "build.sh: building localcluster (k8s $K8S_VERSION), jobset $JOBSET_VERSION, helm $HELM_VERSION"
out="$(mktemp -d "$BIN/.out.XXXXXX")"
trap 'rm -rf "$out"' EXIT
(cd "$HERE/localcluster" && go build -trimpath -p 2 -ldflags "$ldflags" -o "$out/" \
  . sigs.k8s.io/jobset helm.sh/helm/v3/cmd/helm)
mv -f "$out/localcluster" "$out/helm" "$BIN/"
mv -f "$out/jobset" "$BIN/jobset-controller"
rmdir "$out"
for part in etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kubeadm kube-proxy coredns pause; do
  ln -sfn localcluster "$BIN/$part"
done

# kind and crictl: their own go.mod files (`go install pkg@version` needs no
# replace lines); static (CGO_ENABLED=0) so kind runs anywhere and crictl in any
# node image. crictl v1.34 does not compile against our k8s.io/kubectl v0.35
# (term.TerminalSizeQueue changed), so it cannot be a tool of our module; it
# compiles the few client-go packages it uses at its own versions.
echo "build.sh: building kind $KIND_VERSION and crictl $CRICTL_VERSION"
CGO_ENABLED=0 GOBIN="$BIN" go install -trimpath -p 2 -ldflags "-s -w" "sigs.k8s.io/kind@$KIND_VERSION"
CGO_ENABLED=0 GOBIN="$BIN" go install -trimpath -p 2 \
  -ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$CRICTL_VERSION" \
  "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION"

echo "$want" > "$STAMP"
echo "build.sh: built in $(( $(date +%s) - start ))s into $BIN"
