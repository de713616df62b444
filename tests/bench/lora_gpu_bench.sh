#!/usr/bin/env bash
# LoRA against full fine-tuning on one GPU (issue [lora]): the GRPO benchmark of grpo_vs_trl.sh
# (random Qwen2.5-0.5B weights, PROMPTS x n 8, P 256, N 256) with a full-weight actor and with a
# LoRA actor (rank RANK, alpha 2 x RANK, all-linear) in the same call, then a Qwen2.5-7B-shaped
# LoRA actor (random bf16 weights) for STEPS_7B steps of PROMPTS_7B x 8 (the 0.5B runs: STEPS).
# Prints each run's JSON and one table: seconds per step, the stages, the update's own peak
# memory and the whole peak.
#   tests/bench/lora_gpu_bench.sh [PROMPTS] [RANK] [PROMPTS_7B] [STEPS_7B] [STEPS]
# Needs what grpo_vs_trl.sh needs (RLHFD_BIN_DIR, python3 with torch and transformers).
set -euo pipefail
prompts=${1:-64}; rank=${2:-64}; prompts_7b=${3:-16}; steps_7b=${4:-3}; steps=${5:-5}
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
results=()
run() {
  local label=$1; shift
  echo "== ${label}"
  local out
  out=$(TRL_RUNS=" " "${here}/grpo_vs_trl.sh" "$@") || { echo "${out}"; echo "${label} failed"; exit 1; }
  echo "${out}"
  results+=("${label}=$(grep '^{"bench": "rlhfd_grpo_step"' <<<"${out}")")
}
run "0.5B full" "${prompts}" 8 256 256 "${steps}" 16
run "0.5B LoRA r${rank}" "${prompts}" 8 256 256 "${steps}" 16 --lora_rank "${rank}"
run "7B LoRA r${rank}" "${prompts_7b}" 8 256 256 "${steps_7b}" 16 --shape 7b --lora_rank "${rank}"
python3 - "${results[@]}" <<'PY'
import json, sys
runs = [(arg.split("=", 1)[0], json.loads(arg.split("=", 1)[1])) for arg in sys.argv[1:]]
print(json.dumps({"bench": "lora_gpu", "runs": {label: r for label, r in runs}}))
row = lambda name, cells: print(f"{name:34}" + "".join(f"{c:>16}" for c in cells))
row("", [label for label, _ in runs])
row("seconds per step", [f"{r['seconds_per_step']:.2f}" for _, r in runs])
for key in ("gen", "update_weights", "old_log_prob", "ref", "update_actor"):
    row(f"  timing_s/{key}", [f"{r['mean'].get('timing_s/' + key, 0):.2f}" for _, r in runs])
for key in ("update_max_memory_allocated_gb", "max_memory_allocated_gb", "max_memory_reserved_gb"):
    row(f"perf/{key}", [f"{r['mean'].get('perf/' + key, 0):.1f}" for _, r in runs])
row("tokens/s", [f"{r['mean'].get('perf/throughput', 0):.0f}" for _, r in runs])
row("perf/mfu/actor", [f"{r['mean'].get('perf/mfu/actor', 0):.3f}" for _, r in runs])
PY
# What each role's creation added to the GPU's memory in use (the workers' logs).
grep -H " holds " "${RLHFD_BENCH_DIR:-/tmp/grpo-bench}"/rlhfd-*/worker.log || true
