#!/usr/bin/env bash
# GRPO on SmolLM2-135M-Instruct on one GPU (docs/real-model.md): converts the GGUF file to a model
# directory when there is none, then runs configs/grpo-smollm2-arith-gpu.yaml through
# deploy/demo.sh once per set of overrides, keeping each run's metrics.jsonl and logs in
# OUT_DIR/run-K.
#   tests/bench/smollm2_gpu.sh GGUF_FILE OUT_DIR ["key=value ..." ...]   (default: one run, as is)
# Needs RLHFD_BIN_DIR (a deploy/bundle.sh bin/, its env.sh sourced), python3 with torch,
# gguf, safetensors and tokenizers, and data/smol-arith2 (deploy/prepare_data.py, see the config).
# RLHFD_RUN_TIMEOUT_S: the longest one run may take (default 600).
set -uo pipefail
gguf=${1:?GGUF file}; out=${2:?output directory}; shift 2
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
model="${repo_root}/models/smollm2-135m-instruct"
mkdir -p "${out}"
if [[ ! -f "${model}/config.json" ]]; then
  python3 "${repo_root}/deploy/convert_gguf.py" "${gguf}" "${model}" || exit 1
fi
status=0
(($# > 0)) || set -- ""
for ((k = 1; k <= $#; k++)); do
  overrides="${!k}"
  run="${out}/run-${k}"
  state="$(mktemp -d /tmp/smollm2-gpu-XXXXXX)"
  mkdir -p "${run}"
  echo "== run ${k}: ${overrides:-the config as is}" | tee "${run}/demo.txt"
  start=$(date +%s)
  RLHFD_DEMO_DIR="${state}" RLHFD_DEMO_OVERRIDES="${overrides}" \
    RLHFD_DEMO_CONFIG="${repo_root}/configs/grpo-smollm2-arith-gpu.yaml" \
    timeout "${RLHFD_RUN_TIMEOUT_S:-600}" "${repo_root}/deploy/demo.sh" >> "${run}/demo.txt" 2>&1 \
    || status=1
  echo "wall_s $(($(date +%s) - start))" >> "${run}/demo.txt"
  tail -8 "${run}/demo.txt"
  cp "${state}/state/logs/job-1/metrics.jsonl" "${state}"/*.log "${run}/" 2>/dev/null || true
done
exit "${status}"
