#!/usr/bin/env bash
# Generation throughput of rlhfd's engine (rollout_bench) and of vLLM on the same shapes in the same
# call (issue [rollout-tp]): random weights of a Qwen2.5 preset, B prompts of P tokens, N new tokens
# each, ignore_eos, temperature 1. Prints each side's JSON lines and a table with the ratio.
#   tests/bench/generate_vs_vllm.sh PRESET "B1 B2 ..." P N
#     PRESET: qwen2.5-0.5b, qwen2.5-1.5b or qwen2.5-7b
# Needs ROLLOUT_BENCH (the rollout_bench binary; its LibTorch libraries found, e.g. a bundle's env.sh
# sourced) and python3 with vLLM 0.26 (../shared/gpu-anchors/README.md brings it to the GPU
# machine). RLHFD_BENCH_DIR: where the config goes (default /tmp/generate-bench). REPEAT: timed
# runs per batch size on each side, the best reported (default 3).
set -euo pipefail
preset=${1:?preset}; batches=${2:?batch sizes}; prompt_len=${3:?P}; new_tokens=${4:?N}
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bench="${ROLLOUT_BENCH:?set ROLLOUT_BENCH to the rollout_bench binary}"
dir="${RLHFD_BENCH_DIR:-/tmp/generate-bench}/${preset}"
"${bench}" --preset="${preset}" --write_hf_config="${dir}" > /dev/null
# shellcheck disable=SC2086  # the batch sizes are words
rlhfd=$("${bench}" --preset="${preset}" --batch="${batches// /,}" --prompt_len="${prompt_len}" \
  --new_tokens="${new_tokens}" --repeat="${REPEAT:-3}" | grep '^{')
echo "${rlhfd}"
# shellcheck disable=SC2086
vllm=$(python3 "${here}/vllm_generate_baseline.py" --config_dir "${dir}" --batch ${batches} \
  --prompt_len "${prompt_len}" --new_tokens "${new_tokens}" --repeat "${REPEAT:-3}" \
  2>"${dir}/vllm.log" | grep '^{') ||
  { echo "vLLM failed:"; tail -20 "${dir}/vllm.log"; exit 1; }
echo "${vllm}"
python3 - "${rlhfd}" "${vllm}" <<'PY'
import json, sys
ours = {r["batch"]: r for r in map(json.loads, sys.argv[1].splitlines())}
peer = {r["batch"]: r for r in map(json.loads, sys.argv[2].splitlines())}
print("| shape | B | P | N | rlhfd tok/s | vLLM tok/s | rlhfd / vLLM | rlhfd decode, share of roofline |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for b in sorted(ours):
    o, v = ours[b], peer.get(b)
    theirs = f"{v['tokens_per_second']:,.0f}" if v else "-"
    ratio = f"{o['tokens_per_second'] / v['tokens_per_second']:.2f}x" if v else "-"
    print(f"| {o['preset']} | {b} | {o['prompt_len']} | {o['new_tokens']} | "
          f"{o['tokens_per_second']:,.0f} | {theirs} | {ratio} | "
          f"{100 * o['roofline_share_decode']:.1f} % |")
PY
