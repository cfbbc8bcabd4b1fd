#!/usr/bin/env bash
# Starts N Peregrine replicas on one machine and vLLM's router in front of them (the
# `vllm-router` package from PyPI: `pip install vllm-router`), as tests/e2e/check_router.py
# drives them (smg, the Shepherd model gateway, takes the same flags after `smg launch`).
# The router takes the OpenAI requests on ROUTER_PORT and probes each replica's /ready,
# which turns 503 as soon as a replica begins to drain.
#
#   deploy/router/run.sh [N] [POLICY] [-- SERVE ARGS...]
#
# N replicas (default 3) on ports BASE_PORT, BASE_PORT + 1, ... (default 8001); POLICY one
# of vllm-router's (default cache_aware; round_robin, power_of_two, ...); SERVE ARGS go to
# every `peregrine serve` (default: the default model). Env: PEREGRINE (the binary, default
# peregrine on PATH), BASE_PORT, ROUTER_PORT (default 8000), ROUTER_METRICS_PORT (the
# router's own Prometheus port, default 29000). Ctrl-C stops them all.
set -euo pipefail
n=${1:-3}
policy=${2:-cache_aware}
shift $(($# < 2 ? $# : 2))
[ "${1:-}" = -- ] && shift
peregrine=${PEREGRINE:-peregrine}
base_port=${BASE_PORT:-8001}
router_port=${ROUTER_PORT:-8000}
router_metrics_port=${ROUTER_METRICS_PORT:-29000}
command -v vllm-router >/dev/null || {
  echo "run.sh: vllm-router is not installed (pip install vllm-router)" >&2
  exit 1
}
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait' EXIT
urls=()
for i in $(seq 0 $((n - 1))); do
  port=$((base_port + i))
  "$peregrine" serve --host 127.0.0.1 --port "$port" "$@" &
  pids+=($!)
  urls+=("http://127.0.0.1:$port")
done
for url in "${urls[@]}"; do
  until curl -sf "$url/ready" >/dev/null; do sleep 0.5; done
  echo "run.sh: $url ready"
done
vllm-router --host 0.0.0.0 --port "$router_port" --policy "$policy" --worker-urls "${urls[@]}" \
  --health-check-endpoint /ready --health-check-interval-secs 1 \
  --prometheus-port "$router_metrics_port" &
pids+=($!)
wait -n
