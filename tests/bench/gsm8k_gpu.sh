#!/usr/bin/env bash
# GRPO on GSM8K with a Qwen2.5-Coder GGUF on one GPU, across back-to-back device calls of at most
# ten minutes each (docs/real-model.md, "GSM8K with Qwen2.5-Coder"). `start` converts the GGUF
# (once), starts a controller and one GPU worker in sessions of their own (setsid), so that they
# outlive the call while the machine stays warm, and submits the config; `watch` follows the job
# for up to SECONDS; `stop` cancels it. Each prints the job's steps as they land and copies its
# metrics.jsonl, samples.jsonl and the daemons' logs into OUT_DIR. `then` chains a second job on
# the first one's result (an SFT cold start, then GRPO with tools: docs/real-model.md): once the
# job followed so far has succeeded, it exports that job's actor and submits CONFIG from it.
#   tests/bench/gsm8k_gpu.sh start GGUF CONFIG OUT_DIR ["key=value ..."]
#   tests/bench/gsm8k_gpu.sh then CONFIG OUT_DIR ["key=value ..."]
#   tests/bench/gsm8k_gpu.sh watch SECONDS OUT_DIR
#   tests/bench/gsm8k_gpu.sh stop OUT_DIR
# start needs RLHFD_BIN_DIR (a deploy/bundle.sh bin/; the bundle is copied into the work dir, since a
# carried folder is gone in the next call) and python3 with torch, gguf, safetensors, tokenizers.
# RLHFD_GSM8K_DIR (default /tmp/gsm8k-gpu): the model, the bundle's copy, state and checkpoints.
# RLHFD_GSM8K_DEVICE (default cuda:0): the worker's device (cpu rehearses the script).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd "${here}/../.." && pwd)"
work="${RLHFD_GSM8K_DIR:-/tmp/gsm8k-gpu}"
command=${1:?start, then, watch or stop}; shift

ctl() { "${work}/bundle/bin/rlhfctl" "$@"; }
# The job followed: the last one submitted (start's, then then's).
job() { cat "${work}/job" 2>/dev/null || echo job-1; }
# Submits CONFIG with its words of overrides and follows the job it makes from now on.
submit() {
  local submitted
  # shellcheck disable=SC2086  # the overrides are words
  submitted=$(ctl submit "$@") || { echo "${submitted}"; exit 1; }
  echo "${submitted}"
  grep -o "job-[0-9]*" <<< "${submitted}" | head -1 > "${work}/job"
  rm -f "${work}/printed"
}
connect() {
  source "${work}/bundle/env.sh"
  export RLHFD_CONTROLLER="127.0.0.1:$(cat "${work}/controller.port")"
  export RLHFD_TOKEN_FILE="${work}/state/token"
}
# The job's state (JOB_STATE_RUNNING, ...) from `rlhfctl --json status`.
job_state() {
  ctl --json status "$(job)" 2>/dev/null |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["job"]["state"])' 2>/dev/null || echo "?"
}
# One line per step of metrics.jsonl after those already printed (their count is kept in
# ${work}/printed): the figures docs/real-model.md tabulates. A line still being written waits.
print_steps() {
  python3 - "${work}/state/logs/$(job)/metrics.jsonl" "${work}/printed" <<'PY'
import json, sys
path, printed = sys.argv[1], sys.argv[2]
try:
    skip = int(open(printed).read())
except (FileNotFoundError, ValueError):
    skip = 0
try:
    text = open(path).read()
except FileNotFoundError:
    sys.exit()
lines = text.split("\n")[:-1]  # complete lines only
keys = ["critic/score/mean", "train/loss", "val/score/mean", "val/score/gsm8k_flexible/mean",
        "val/score/gsm8k_boxed/mean", "response_length/mean", "val/response_length/mean",
        "training/num_turns/mean", "val-aux/num_turns/mean", "agent/tool_calls/mean",
        "agent/tool_errors/mean", "timing_s/agent_loop/tool_calls/mean",
        "timing_s/step", "timing_s/gen", "timing_s/update_actor", "timing_s/testing",
        "perf/throughput", "perf/max_memory_allocated_gb", "actor/kl_loss"]
for line in lines[skip:]:
    row = json.loads(line)
    data = row["data"]
    shown = " ".join(f"{k}={data[k]:.4g}" for k in keys if isinstance(data.get(k), (int, float)))
    print(f"step {row['step']}: {shown}", flush=True)
open(printed, "w").write(str(max(skip, len(lines))))
PY
}
collect() {
  local out=$1
  mkdir -p "${out}"
  cp "${work}/state/logs/$(job)/metrics.jsonl" "${work}/state/logs/$(job)/samples.jsonl" \
    "${work}"/*.log "${out}/" 2>/dev/null || true
}
follow() {
  local seconds=$1 out=$2 state
  local deadline=$(($(date +%s) + seconds))
  while :; do
    print_steps
    # Copied every round, so that a call cut short by its time limit still brings them back.
    collect "${out}"
    state=$(job_state)
    case "${state}" in *SUCCEEDED | *FAILED | *CANCELLED)
      print_steps; echo "$(job) ${state}"; ctl status "$(job)" | tail -5; break ;;
    esac
    (($(date +%s) < deadline)) || { echo "$(job) ${state} after ${seconds} s of watching"; break; }
    sleep 10
  done
  collect "${out}"
}

case "${command}" in
  start)
    gguf=${1:?GGUF}; config=${2:?CONFIG}; out=${3:?OUT_DIR}; overrides=${4:-}
    : "${RLHFD_BIN_DIR:?set RLHFD_BIN_DIR to the bin of a bundle}"
    mkdir -p "${work}"
    rm -rf "${work}/bundle"; cp -r "${RLHFD_BIN_DIR}/.." "${work}/bundle"
    if [[ ! -f "${work}/model/config.json" ]]; then
      start=$(date +%s)
      python3 "${repo_root}/deploy/convert_gguf.py" "${gguf}" "${work}/model" --dtype bf16
      echo "converted in $(($(date +%s) - start)) s"
    fi
    rm -rf "${work}/state" "${work}/printed" "${work}/job"
    port_file="${work}/controller.port"; rm -f "${port_file}"
    source "${work}/bundle/env.sh"
    setsid "${work}/bundle/bin/rlhfd-controller" --listen=127.0.0.1:0 --state_dir="${work}/state" \
      --port_file="${port_file}" >"${work}/controller.log" 2>&1 < /dev/null &
    echo $! > "${work}/controller.pid"
    for _ in $(seq 100); do [[ -s "${port_file}" ]] && break; sleep 0.1; done
    [[ -s "${port_file}" ]] || { tail -20 "${work}/controller.log"; echo "no controller" >&2; exit 1; }
    connect
    setsid "${work}/bundle/bin/rlhfd-worker" --controller="${RLHFD_CONTROLLER}" \
      --device="${RLHFD_GSM8K_DEVICE:-cuda:0}" --worker_id=gpu0 >"${work}/worker.log" 2>&1 < /dev/null &
    echo $! > "${work}/worker.pid"
    alive=0
    for _ in $(seq 300); do
      ctl --json workers | grep -q WORKER_STATE_ALIVE && { alive=1; break; }; sleep 0.1
    done
    ((alive)) || { tail -20 "${work}/worker.log"; echo "the worker did not register" >&2; exit 1; }
    # shellcheck disable=SC2086  # the overrides are words
    submit "${config}" "model.path=${work}/model" ${overrides}
    follow "${RLHFD_WATCH_S:-480}" "${out}"
    ;;
  then)
    config=${1:?CONFIG}; out=${2:?OUT_DIR}; overrides=${3:-}
    connect
    previous=$(job)
    state=$(job_state)
    [[ "${state}" == *SUCCEEDED ]] ||
      { echo "gsm8k_gpu.sh then: ${previous} is ${state}, not succeeded: nothing to go on from" >&2; exit 1; }
    rm -rf "${work}/model-${previous}"
    ctl export "${previous}" --out "${work}/model-${previous}"
    # shellcheck disable=SC2086  # the overrides are words
    submit "${config}" "model.path=${work}/model-${previous}" ${overrides}
    follow "${RLHFD_WATCH_S:-480}" "${out}"
    ;;
  watch)
    seconds=${1:?SECONDS}; out=${2:?OUT_DIR}
    connect
    follow "${seconds}" "${out}"
    ;;
  stop)
    out=${1:?OUT_DIR}
    connect
    ctl cancel "$(job)" || true
    follow 60 "${out}"
    # SIGTERM, then SIGKILL for a daemon still there after 10 s.
    for daemon in worker controller; do
      pid=$(cat "${work}/${daemon}.pid" 2>/dev/null) || continue
      kill "${pid}" 2>/dev/null || continue
      for _ in $(seq 100); do kill -0 "${pid}" 2>/dev/null || break; sleep 0.1; done
      kill -9 "${pid}" 2>/dev/null || true
    done
    ;;
  *) echo "gsm8k_gpu.sh: unknown command '${command}' (start, then, watch, stop)" >&2; exit 2 ;;
esac
