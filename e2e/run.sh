#!/usr/bin/env bash
# End-to-end suite on a throwaway kind cluster:
#   create the cluster -> build and load both images -> install kube-prometheus-stack,
#   prometheus-adapter (Ferry's queue-time rules) and the Ferry charts -> run the pytest suite
#   in e2e/ (apply config/ samples, Ready, infer over HTTP and gRPC, canary P% / promote /
#   rollback with traffic counted per revision, HPA reading avg_time_queue_us, delete + cleanup)
#   -> dump status, events and logs on failure -> delete the cluster.
#
# Usage: e2e/run.sh [pytest args...]      e.g. e2e/run.sh -m e2e_canary -x
# Needs: docker (a running engine), kind, kubectl, helm 3, python with `pip install -e .[test]`.
# Environment:
#   CLUSTER_NAME (ferry-e2e)  KEEP_CLUSTER (0: delete at the end; 1: keep it for debugging)
#   REUSE_CLUSTER (0; 1: use an existing cluster of that name)  KIND_NODE_IMAGE (kind's default)
#   IMAGE_TAG (e2e)  SKIP_BUILD (0; 1: images already loaded)  ARTIFACTS (e2e/artifacts)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CLUSTER_NAME="${CLUSTER_NAME:-ferry-e2e}"
KEEP_CLUSTER="${KEEP_CLUSTER:-0}"
REUSE_CLUSTER="${REUSE_CLUSTER:-0}"
IMAGE_TAG="${IMAGE_TAG:-e2e}"
SKIP_BUILD="${SKIP_BUILD:-0}"
ARTIFACTS="${ARTIFACTS:-$ROOT/e2e/artifacts}"
OPERATOR_IMAGE="ferry-operator:${IMAGE_TAG}"
SERVER_IMAGE="ferry-server:${IMAGE_TAG}"
CONTEXT="kind-${CLUSTER_NAME}"
FERRY_NS="ferry-system"
MONITORING_NS="monitoring"
TEST_NS="ferry-e2e"

log() { printf '\n=== %s\n' "$*" >&2; }
die() { printf 'e2e/run.sh: %s\n' "$*" >&2; exit 2; }

need() {
  local tool
  for tool in "$@"; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool is not installed (needed: docker, kind, kubectl, helm)"
  done
}

kc() { kubectl --context "$CONTEXT" "$@"; }

dump_state() {
  log "dumping cluster state to $ARTIFACTS"
  mkdir -p "$ARTIFACTS"
  kc get inferenceservices.serving.ferry.dev -A -o yaml >"$ARTIFACTS/inferenceservices.yaml" 2>&1 || true
  kc get all,hpa,configmaps -A -o wide >"$ARTIFACTS/resources.txt" 2>&1 || true
  kc get events -A --sort-by=.lastTimestamp >"$ARTIFACTS/events.txt" 2>&1 || true
  kc describe pods -n "$TEST_NS" >"$ARTIFACTS/pods-describe.txt" 2>&1 || true
  kc logs -n "$FERRY_NS" deployment/ferry --all-containers --tail=-1 >"$ARTIFACTS/operator.log" 2>&1 || true
  local pod
  for pod in $(kc get pods -n "$TEST_NS" -o name 2>/dev/null); do
    kc logs -n "$TEST_NS" "$pod" --all-containers --prefix --tail=500 >"$ARTIFACTS/${pod#pod/}.log" 2>&1 || true
  done
  kc get --raw "/apis/custom.metrics.k8s.io/v1beta1/namespaces/$TEST_NS/pods/*/avg_time_queue_us" \
    >"$ARTIFACTS/custom-metrics.json" 2>&1 || true
  kind export logs "$ARTIFACTS/kind" --name "$CLUSTER_NAME" >/dev/null 2>&1 || true
}

cleanup() {
  local status=$?
  if [[ $status -ne 0 ]]; then
    dump_state
    printf 'e2e/run.sh: FAILED (exit %s); state dumped to %s\n' "$status" "$ARTIFACTS" >&2
  fi
  if [[ "$KEEP_CLUSTER" != "1" && "$REUSE_CLUSTER" != "1" ]]; then
    kind delete cluster --name "$CLUSTER_NAME" >/dev/null 2>&1 || true
  fi
  exit "$status"
}

create_cluster() {
  if [[ "$REUSE_CLUSTER" == "1" ]] && kind get clusters 2>/dev/null | grep -qx "$CLUSTER_NAME"; then
    log "reusing kind cluster $CLUSTER_NAME"
    return
  fi
  log "creating kind cluster $CLUSTER_NAME"
  local args=(create cluster --name "$CLUSTER_NAME" --wait 120s)
  if [[ -n "${KIND_NODE_IMAGE:-}" ]]; then
    args+=(--image "$KIND_NODE_IMAGE")
  fi
  kind "${args[@]}"
}

build_images() {
  if [[ "$SKIP_BUILD" == "1" ]]; then
    return
  fi
  log "building $SERVER_IMAGE and $OPERATOR_IMAGE"
  docker build -f "$ROOT/Dockerfile.server" -t "$SERVER_IMAGE" "$ROOT"
  docker build -f "$ROOT/Dockerfile.operator" -t "$OPERATOR_IMAGE" "$ROOT"
  kind load docker-image "$SERVER_IMAGE" "$OPERATOR_IMAGE" --name "$CLUSTER_NAME"
}

install_monitoring() {
  log "installing kube-prometheus-stack and prometheus-adapter"
  helm repo add prometheus-community https://prometheus-community.github.io/helm-charts --force-update >/dev/null
  helm repo update prometheus-community >/dev/null
  helm upgrade --install kube-prometheus-stack prometheus-community/kube-prometheus-stack \
    --kube-context "$CONTEXT" --namespace "$MONITORING_NS" --create-namespace \
    --set alertmanager.enabled=false --set grafana.enabled=false \
    --set prometheus.prometheusSpec.scrapeInterval=5s \
    --set prometheus.prometheusSpec.podMonitorSelectorNilUsesHelmValues=false \
    --set prometheus.prometheusSpec.serviceMonitorSelectorNilUsesHelmValues=false \
    --wait --timeout 10m
  helm upgrade --install prometheus-adapter prometheus-community/prometheus-adapter \
    --kube-context "$CONTEXT" --namespace "$MONITORING_NS" \
    -f "$ROOT/deploy/prometheus/adapter-values.yaml" \
    --set metricsRelistInterval=10s \
    --wait --timeout 5m
}

install_ferry() {
  log "installing the Ferry charts"
  helm upgrade --install ferry-crds "$ROOT/charts/ferry-crds" --kube-context "$CONTEXT" --wait
  helm upgrade --install ferry "$ROOT/charts/ferry" --kube-context "$CONTEXT" \
    --namespace "$FERRY_NS" --create-namespace --skip-crds \
    --set image.repository=ferry-operator --set image.tag="$IMAGE_TAG" --set image.pullPolicy=Never \
    --set serverImage.repository=ferry-server --set serverImage.tag="$IMAGE_TAG" \
    --set monitoring.podMonitor.enabled=true \
    --wait --timeout 5m
  kc -n "$FERRY_NS" rollout status deployment/ferry --timeout=180s
  kc create namespace "$TEST_NS" --dry-run=client -o yaml | kc apply -f -
}

main() {
  need docker kind kubectl helm
  docker info >/dev/null 2>&1 || die "the docker engine is not reachable (docker info failed)"
  trap cleanup EXIT
  mkdir -p "$ARTIFACTS"
  create_cluster
  build_images
  install_monitoring
  install_ferry
  log "running the e2e pytest suite"
  FERRY_E2E_CONTEXT="$CONTEXT" FERRY_E2E_NAMESPACE="$TEST_NS" FERRY_E2E_ARTIFACTS="$ARTIFACTS" \
    FERRY_E2E_SERVER_IMAGE="$SERVER_IMAGE" \
    python -m pytest "$ROOT/e2e" -m e2e -p no:cacheprovider -o addopts="" -rs "$@"
}

main "$@"
