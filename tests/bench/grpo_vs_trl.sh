#!/usr/bin/env bash
# One-GPU GRPO benchmark: the same job through rlhfd's daemons (a controller and one GPU worker,
# colocated) and through TRL's GRPOTrainer, on the same GPU in the same run. Random weights of the
# Qwen2.5-0.5B shape, PROMPTS prompts x n N_SAMPLES, prompts of P tokens, responses of N tokens
# (random weights sample no EOS), KL loss 0.001. Prints each side's JSON and a table; the rlhfd
# figures are the means over the steps after the first (verl's timing_s keys), TRL's likewise.
#   [TRL_RUNS="16:1 64:0"] tests/bench/grpo_vs_trl.sh PROMPTS N_SAMPLES P N [STEPS] [MICRO_BATCH] \
#     [make_grpo_bench.py options: --shape 7b, --lora_rank R]
# TRL_RUNS=" " measures rlhfd alone. RLHFD_GPU_WORKERS (default 1): rlhfd workers, all on cuda:0
# (they share the GPU over sockets); RLHFD_OVERRIDES: key=value words for rlhfctl submit, e.g.
# "roles.actor.gpus=2 roles.actor.rollout.tp=2" for a tensor-parallel rollout over two workers.
# Needs: RLHFD_BIN_DIR (a deploy/bundle.sh bin/, env.sh sourced), python3 with torch,
# transformers and trl. RLHFD_BENCH_DIR: where the model and logs go (default /tmp/grpo-bench).
set -euo pipefail
prompts=${1:?prompts}; samples=${2:?n}; prompt_len=${3:?P}; response_len=${4:?N}
steps=${5:-5}; micro_batch=${6:-16}
shift $(($# < 6 ? $# : 6))
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="${RLHFD_BIN_DIR:?set RLHFD_BIN_DIR to the bin of a bundle}"
work="${RLHFD_BENCH_DIR:-/tmp/grpo-bench}"
mkdir -p "${work}"
made=$(python3 "${here}/make_grpo_bench.py" --out "${work}" --prompts "${prompts}" --n "${samples}" \
  --prompt_len "${prompt_len}" --response_len "${response_len}" --steps "${steps}" \
  --micro_batch "${micro_batch}" "$@")
config=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["config"])' "${made}")
data=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["data"])' "${made}")
model=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["model"])' "${made}")

run="${work}/rlhfd-$(basename "${config}" .yaml)"
rm -rf "${run}"; mkdir -p "${run}"
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true' EXIT
"${bin}/rlhfd-controller" --listen=127.0.0.1:0 --state_dir="${run}/state" \
  --port_file="${run}/controller.port" >"${run}/controller.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [[ -s "${run}/controller.port" ]] && break; sleep 0.1; done
export RLHFD_CONTROLLER="127.0.0.1:$(cat "${run}/controller.port")"
export RLHFD_TOKEN_FILE="${run}/state/token"
workers=${RLHFD_GPU_WORKERS:-1}
for ((w = 0; w < workers; ++w)); do
  "${bin}/rlhfd-worker" --controller="${RLHFD_CONTROLLER}" --device=cuda:0 --worker_id="gpu${w}" \
    >"${run}/worker${w}.log" 2>&1 &
  pids+=($!)
done
alive=0
for _ in $(seq 300); do
  alive=$("${bin}/rlhfctl" --json workers | grep -c WORKER_STATE_ALIVE) || true
  [[ "${alive}" -ge "${workers}" ]] && break; sleep 0.1
done
# A worker that never registers would leave the job queued forever.
[[ "${alive}" -ge "${workers}" ]] ||
  { echo "${alive} of ${workers} workers registered within 30 s:"; tail -20 "${run}"/worker*.log; exit 1; }
start=$(date +%s.%N)
# shellcheck disable=SC2086  # the overrides are words
"${bin}/rlhfctl" submit --wait "${config}" ${RLHFD_OVERRIDES:-} ||
  { tail -50 "${run}"/worker*.log; exit 1; }
wall=$(python3 -c "import time; print(time.time() - ${start})")
kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; pids=()

rlhfd_json=$(python3 "${here}/grpo_bench_report.py" rlhfd "${run}/state/logs/job-1/metrics.jsonl" "${wall}")
echo "${rlhfd_json}"
# TRL_RUNS: TRL configurations to measure, each MICRO_BATCH:GRADIENT_CHECKPOINTING (default: its
# defaults with the micro-batch above; "64:0" is TRL tuned for this GPU: no checkpointing).
for trl_run in ${TRL_RUNS:-${micro_batch}:1}; do
  trl_micro=${trl_run%%:*}; trl_checkpointing=${trl_run##*:}
  echo "TRL: micro-batch ${trl_micro}, gradient checkpointing ${trl_checkpointing}"
  trl_json=$(python3 "${here}/trl_grpo_baseline.py" --model "${model}" --data "${data}" \
    --n "${samples}" --response_len "${response_len}" --micro_batch "${trl_micro}" \
    --gradient_checkpointing "${trl_checkpointing}" --steps $((steps > 4 ? 4 : steps)) \
    --out "${work}/trl" 2>"${work}/trl-${trl_run}.log" | tail -1) \
    || { echo "TRL ${trl_run} failed:"; tail -3 "${work}/trl-${trl_run}.log"; failed=1; continue; }
  echo "${trl_json}"
  python3 "${here}/grpo_bench_report.py" table "${rlhfd_json}" "${trl_json}"
done
exit "${failed:-0}"
