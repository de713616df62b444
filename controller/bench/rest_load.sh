#!/usr/bin/env bash
# The REST load scenario of docs/PERFORMANCE.md: a controller with its gateway, two CPU workers
# running a long GRPO job (configs/demo-digits.yaml), then rest_load_bench's clients for
# SECONDS while the job trains; the bench compares the job's step time in the SECONDS before
# the load with the step time during it.
#   controller/bench/rest_load.sh BIN_DIR [CLIENTS] [SECONDS] [INTERVAL_MS ...]
# Each INTERVAL_MS (a client's pause between requests; 0: back to back) is one load run, one
# after the other on the same job.
set -euo pipefail
bin="$(cd "$1" && pwd)"
clients="${2:-100}"
seconds="${3:-30}"
intervals=("${@:4}")
((${#intervals[@]})) || intervals=(0)
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
work="$(mktemp -d /tmp/rlhfd-rest-load-XXXXXX)"
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true' EXIT

"${bin}/rlhfd-controller" --state_dir="${work}/state" --listen=127.0.0.1:0 \
  --port_file="${work}/port" --http_listen=127.0.0.1:0 --http_port_file="${work}/http.port" \
  > "${work}/controller.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [[ -s "${work}/http.port" ]] && break; sleep 0.1; done
export RLHFD_CONTROLLER="127.0.0.1:$(cat "${work}/port")" RLHFD_TOKEN_FILE="${work}/state/token"
for i in 0 1; do
  "${bin}/rlhfd-worker" --controller="${RLHFD_CONTROLLER}" --device=cpu --cpu_threads=2 \
    --worker_id="load-worker-${i}" > "${work}/worker${i}.log" 2>&1 &
  pids+=($!)
done
(cd "${repo_root}" && "${bin}/rlhfctl" submit configs/demo-digits.yaml trainer.total_steps=100000 \
  trainer.val_every=-1)
for interval in "${intervals[@]}"; do
  # The job's pace without load first, for as long as the load will last.
  sleep $((seconds + 5))
  "${bin}/rest_load_bench" --gateway="127.0.0.1:$(cat "${work}/http.port")" \
    --token_file="${RLHFD_TOKEN_FILE}" --job=job-1 --clients="${clients}" --seconds="${seconds}" \
    --interval_ms="${interval}"
done
"${bin}/rlhfctl" cancel job-1 > /dev/null
