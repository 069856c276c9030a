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

# The pinned releases: k8s.io/kubernetes and sigs.k8s.io/jobset in localcluster/go.mod, helm here.
HELM_VERSION=v3.20.2
# kind v0.33.0: the newest release the module proxy serves; supports Kubernetes 1.35
# (kubeadm v1beta4). crictl v1.34.0: the newest cri-tools release served at or below
# our Kubernetes minor (v1.35.0 is not served); CRI v1 is stable across that skew.
KIND_VERSION=v0.33.0
CRICTL_VERSION=v1.34.0
K8S_VERSION="$(awk '$1=="k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' "$HERE/localcluster/go.mod")"
JOBSET_VERSION="$(awk '$1=="sigs.k8s.io/jobset" && $2 ~ /^v/ {print $2; exit}' "$HERE/localcluster/go.mod")"

# Module mode even where a vendor folder or a workspace would say otherwise;
# two cores: keep one compile per core so concurrent tests still get CPU.
export GOFLAGS=-mod=mod
export GOMAXPROCS="${GOMAXPROCS:-2}"

stamp_inputs() {
  echo "$JOBSET_VERSION $HELM_VERSION $K8S_VERSION $KIND_VERSION $CRICTL_VERSION $(go env GOVERSION)"
  cat "$HERE/build.sh" "$HERE"/localcluster/go.mod "$HERE"/localcluster/go.sum "$HERE"/localcluster/*.go
}
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
echo "build.sh: building localcluster (k8s $K8S_VERSION)"
(cd "$HERE/localcluster" && go build -trimpath -p 2 -ldflags "$ldflags" -o "$BIN/localcluster" .)
for part in etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kubeadm kube-proxy coredns pause; do
  ln -sfn localcluster "$BIN/$part"
done

# The JobSet controller is a `tool` of our module (see go.mod), so it shares
# the compiled k8s.io libraries with localcluster. (`go install ...@version`
# also fails here: the module proxy refuses the jobset version list.)
echo "build.sh: building jobset controller $JOBSET_VERSION"
(cd "$HERE/localcluster" && go build -trimpath -p 2 -ldflags "-s -w" -o "$BIN/jobset-controller" sigs.k8s.io/jobset)
# helm pins its own k8s libraries; `go install pkg@version` builds it with its
# own go.mod (it has no replace lines, which that mode requires).
echo "build.sh: building helm $HELM_VERSION"
GOBIN="$BIN" go install -trimpath -p 2 -ldflags "-s -w" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"

# kind and crictl: small, independent modules without replace lines; static
# (CGO_ENABLED=0) so kind runs anywhere and crictl in any node image.
echo "build.sh: building kind $KIND_VERSION and crictl $CRICTL_VERSION"
CGO_ENABLED=0 GOBIN="$BIN" go install -trimpath -p 2 -ldflags "-s -w" "sigs.k8s.io/kind@$KIND_VERSION"
CGO_ENABLED=0 GOBIN="$BIN" go install -trimpath -p 2 \
  -ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$CRICTL_VERSION" \
  "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION"

echo "$want" > "$STAMP"
echo "build.sh: built in $(( $(date +%s) - start ))s into $BIN"
