#!/usr/bin/env bash
# elastic-jax on kind, end to end: a kind cluster, the three images built and
# loaded, JobSet and the Helm chart, examples/01-cpu-job.yaml, a worker process
# SIGKILLed inside its container, and the checks: the slice is replaced, the
# controller pod never restarted, status shows the recovery, the job Succeeded.
#
#   e2e/kind/run.sh --air-gapped    # no registry needed: see below (what CI runs)
#   e2e/kind/run.sh                 # with internet: public kind node image, JobSet release URL
#   KEEP_CLUSTER=1 e2e/kind/run.sh  # leave the cluster for a look afterwards
#
# --air-gapped (or AIR_GAPPED=1) pulls nothing: root on Debian; it installs
# Docker's Debian packages if missing, starts its own Docker engine unless
# DOCKER_HOST answers, builds a Debian/Python base with mmdebstrap, the three
# images on it, and kind's node image from the pinned Kubernetes Go modules,
# and installs JobSet from its pinned Go module. It is `python -m e2e.kind.demo`
# (e2e/kind/demo.py), which the test suite also runs (e2e/kind/test_kind.py).
#
# Environment: KIND_CLUSTER_NAME (elastic-jax), KIND_NODE_IMAGE (kind's default),
# JOBSET_VERSION (v0.11.1, the version the local control plane runs), PYTHON
# (.venv/bin/python, else python3: reads the image table), TIMEOUT_S (900).
set -euo pipefail

if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then
  sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'  # (this header)
  exit 0
fi

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CLUSTER="${KIND_CLUSTER_NAME:-elastic-jax}"
JOBSET_VERSION="${JOBSET_VERSION:-v0.11.1}"
TIMEOUT_S="${TIMEOUT_S:-900}"
RELEASE=elastic-jax
SYSTEM_NS=elastic-jax-system
JOB_NS=default
JOB=cpu-job
EXAMPLE="$ROOT/examples/01-cpu-job.yaml"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
[[ -x "$PYTHON" ]] || PYTHON=python3

if [[ "${1:-}" == --air-gapped || "${AIR_GAPPED:-0}" == 1 ]]; then
  [[ "${1:-}" == --air-gapped ]] && shift
  keep=()
  [[ "${KEEP_CLUSTER:-0}" == 1 ]] && keep=(--keep)
  cd "$ROOT"
  exec "$PYTHON" -m e2e.kind.demo "${keep[@]}" "$@"
fi
# kubectl and helm: the caller's, else the ones the local e2e build made.
export PATH="$PATH:$ROOT/e2e/.build/bin"

log() { printf '[kind/run.sh %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "FAIL: $*"; exit 1; }

for tool in docker kind kubectl helm; do
  command -v "$tool" >/dev/null || die "$tool is not on PATH"
done
docker info >/dev/null 2>&1 || die "docker cannot reach an engine (docker info failed); without Docker or internet: sudo e2e/kind/run.sh --air-gapped (starts its own engine)"

CONTEXT="kind-$CLUSTER"
kc() { kubectl --context "$CONTEXT" "$@"; }

created=0
cleanup() {
  local rc=$?
  if (( rc != 0 )); then
    log "diagnostics:"
    kc get ejob,jobsets,pods -A -o wide >&2 || true
    kc -n "$SYSTEM_NS" logs deploy/"$RELEASE" --tail=100 >&2 || true
  fi
  if (( created )) && [[ "${KEEP_CLUSTER:-0}" != 1 ]]; then
    log "deleting kind cluster $CLUSTER"
    kind delete cluster --name "$CLUSTER" >&2 || true
  fi
  exit "$rc"
}
trap cleanup EXIT

# Polls a command until its output is non-empty and not "false"; prints it.
wait_until() {
  local what="$1" timeout_s="$2"; shift 2
  local deadline=$(( SECONDS + timeout_s )) out
  while (( SECONDS < deadline )); do
    out="$("$@" 2>/dev/null || true)"
    if [[ -n "$out" && "$out" != false ]]; then
      printf '%s\n' "$out"
      return 0
    fi
    sleep 2
  done
  die "timed out after ${timeout_s}s waiting for $what"
}

ejob_field() { kc -n "$JOB_NS" get ejob "$JOB" -o "jsonpath={.status.$1}"; }

# 1. Cluster.
if kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  log "reusing kind cluster $CLUSTER"
else
  log "creating kind cluster $CLUSTER"
  kind create cluster --name "$CLUSTER" ${KIND_NODE_IMAGE:+--image "$KIND_NODE_IMAGE"} --wait 180s
  created=1
fi

# 2. Images: names and targets of images/Dockerfile from elastic_jax.api.images (the
# one table the chart, the job defaults and the local control plane also use).
mapfile -t IMAGES < <(PYTHONPATH="$ROOT" "$PYTHON" -c '
from elastic_jax.api.images import PROJECT_IMAGES
for image in PROJECT_IMAGES.values():
    print(image.dockerfile, image.target, image.name)')
(( ${#IMAGES[@]} == 3 )) || die "expected 3 images from elastic_jax.api.images, got: ${IMAGES[*]}"
for line in "${IMAGES[@]}"; do
  read -r dockerfile target name <<<"$line"
  log "building $name: $dockerfile, target $target"
  docker build -f "$ROOT/$dockerfile" --target "$target" -t "$name" "$ROOT"
  kind load docker-image "$name" --name "$CLUSTER"
done
operator_image="$(printf '%s\n' "${IMAGES[@]}" | awk '$2 == "operator" {print $3}')"

# 3. JobSet, from its pinned release manifest.
log "installing JobSet $JOBSET_VERSION"
kc apply --server-side -f "https://github.com/kubernetes-sigs/jobset/releases/download/$JOBSET_VERSION/manifests.yaml"
kc -n jobset-system wait --for=condition=Available deploy/jobset-controller-manager --timeout=300s

# 4. The chart (the images were loaded, never pulled).
log "installing the chart"
helm --kube-context "$CONTEXT" upgrade --install "$RELEASE" "$ROOT/helm/elastic-jax" \
  -n "$SYSTEM_NS" --create-namespace \
  --set image.repository="${operator_image%:*}" --set image.tag="${operator_image##*:}" \
  --set image.pullPolicy=Never --wait --timeout 300s
kc label namespace "$SYSTEM_NS" pod-security.kubernetes.io/enforce=restricted --overwrite

# 5. The CPU example.
log "applying $EXAMPLE"
kc -n "$JOB_NS" delete ejob "$JOB" --ignore-not-found --wait=true
kc -n "$JOB_NS" apply -f "$EXAMPLE"
wait_until "training to reach step 20" "$TIMEOUT_S" \
  bash -c "step=\$(kubectl --context '$CONTEXT' -n '$JOB_NS' get ejob '$JOB' -o jsonpath='{.status.step}'); (( \${step:-0} >= 20 )) && echo \$step" >/dev/null

ctrl_selector="elasticjax.dev/job-name=$JOB,elasticjax.dev/role=controller"
ctrl_uid="$(kc -n "$JOB_NS" get pods -l "$ctrl_selector" -o jsonpath='{.items[0].metadata.uid}')"
ctrl_restarts="$(kc -n "$JOB_NS" get pods -l "$ctrl_selector" -o jsonpath='{.items[0].status.containerStatuses[0].restartCount}')"
[[ -n "$ctrl_uid" ]] || die "no controller pod"

# 6. SIGKILL the worker process of slice 0 inside its container, from its node
#    (as the OOM killer or a crash would): crictl on the node gives its PID.
worker="$(kc -n "$JOB_NS" get pods -l "elasticjax.dev/job-name=$JOB,elasticjax.dev/slice-index=0" \
  --field-selector=status.phase=Running -o jsonpath='{.items[0].metadata.name}')"
[[ -n "$worker" ]] || die "no running worker pod for slice 0"
node="$(kc -n "$JOB_NS" get pod "$worker" -o jsonpath='{.spec.nodeName}')"
cid="$(kc -n "$JOB_NS" get pod "$worker" -o jsonpath='{.status.containerStatuses[0].containerID}')"
pid="$(docker exec "$node" crictl inspect --output go-template --template '{{.info.pid}}' "${cid#*://}")"
log "SIGKILL worker process $pid of $worker on $node (controller pod $ctrl_uid, restartCount $ctrl_restarts)"
docker exec "$node" kill -KILL "$pid"

# 7. The job finishes; the controller pod is the same one, never restarted.
phase="$(wait_until "the job to finish" "$TIMEOUT_S" bash -c \
  "p=\$(kubectl --context '$CONTEXT' -n '$JOB_NS' get ejob '$JOB' -o jsonpath='{.status.phase}'); [[ \$p == Succeeded || \$p == Failed ]] && echo \$p")"
kc -n "$JOB_NS" get ejob "$JOB" >&2
[[ "$phase" == Succeeded ]] || die "job ended $phase: $(ejob_field failureReason)"
uid_after="$(kc -n "$JOB_NS" get pods -l "$ctrl_selector" -o jsonpath='{.items[0].metadata.uid}')"
restarts_after="$(kc -n "$JOB_NS" get pods -l "$ctrl_selector" -o jsonpath='{.items[0].status.containerStatuses[0].restartCount}')"
[[ "$uid_after" == "$ctrl_uid" ]] || die "controller pod replaced: $ctrl_uid -> $uid_after"
[[ "$restarts_after" == "$ctrl_restarts" ]] || die "controller restartCount $ctrl_restarts -> $restarts_after"
recoveries="$(ejob_field recoveries)"
replacements="$(ejob_field sliceReplacements)"
(( ${recoveries:-0} >= 1 )) || die "no recovery in status (recoveries=${recoveries:-0})"
(( ${replacements:-0} >= 1 )) || die "no slice replacement in status"
log "OK: job Succeeded, controller pod $ctrl_uid restartCount $restarts_after, recoveries $recoveries, slice replacements $replacements"
