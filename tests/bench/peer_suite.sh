#!/usr/bin/env bash
# The same-call peer measurements of issues [rollout-tp] and [train-speed] on a GPU machine, in
# phases that fit device calls of at most SECONDS each: a phase starts only when its estimated
# time is left, and the next call (the machine kept warm, /tmp kept) goes on after the last phase
# done (/tmp/peer_suite.done). Each phase's output goes to OUT_DIR/<phase>.txt.
#   tests/bench/peer_suite.sh SECONDS OUT_DIR
# Needs: RLHFD_BIN_DIR (a deploy/bundle.sh bin/ with rollout_bench, its env.sh sourced), vLLM 0.26
# and TRL 1.16 importable (PYTHONPATH; ../shared/gpu-anchors/README.md and split_peer_wheels.sh
# bring them). PEER_PHASES: the phases to run, in order (default all below).
set -uo pipefail
seconds=${1:?SECONDS}; out=${2:?OUT_DIR}
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="${RLHFD_BIN_DIR:?set RLHFD_BIN_DIR to the bin of a bundle}"
export ROLLOUT_BENCH="${bin}/rollout_bench" NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1
# shellcheck source=tests/bench/phases.sh
source "${here}/phases.sh"
phases_begin "${seconds}" "${out}" /tmp/peer_suite.done

# A long 7B batch: B 256 where the card holds its cache (N 4,096: 64 GB beside 15 GB of weights),
# else B 128.
long_batch() {
  local total_mib
  total_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
  ((total_mib > 100000)) && echo 256 || echo 128
}

for name in ${PEER_PHASES:-gen7 gen05 gen15 grpo gen7long grpolong}; do
  case "${name}" in
    gen7) phase gen7 330 "${here}/generate_vs_vllm.sh" qwen2.5-7b "64 256 512" 256 256 ;;
    gen05) phase gen05 170 "${here}/generate_vs_vllm.sh" qwen2.5-0.5b "64 256 512" 256 256 ;;
    gen15) phase gen15 200 "${here}/generate_vs_vllm.sh" qwen2.5-1.5b "64 256 512" 256 256 ;;
    gen7long) phase gen7long 330 env REPEAT=1 "${here}/generate_vs_vllm.sh" qwen2.5-7b \
      "$(long_batch)" 256 4096 ;;
    grpo) phase grpo 260 env TRL_RUNS="64:0" "${here}/grpo_vs_trl.sh" 64 8 256 256 5 64 ;;
    grpolong) phase grpolong 420 env TRL_RUNS="32:0" "${here}/grpo_vs_trl.sh" 32 8 256 1024 4 32 ;;
    *) echo "peer_suite: no phase '${name}'" >&2; exit 2 ;;
  esac
done
echo "== all phases done"
