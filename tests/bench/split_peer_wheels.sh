#!/usr/bin/env bash
# Re-cuts the peer wheel set that ../shared/gpu-anchors/fetch_wheels.sh leaves in DIR into groups
# that fit one device call beside this repository: a call carries the tracked tree (about 10 MiB)
# and what it names within 64 MiB, so fetch_wheels.sh's 60 MiB groups are refused. Leaves DIR/g1
# … gN in the layout ../shared/gpu-anchors/device_install.sh reads: vLLM's wheel in parts
# (vllm.whl.part-aa, -ab, …) one per group, the last group with every other wheel and
# MANIFEST.txt (and the last part, where they fit together in PART_MIB). Then, as gpu-anchors/README.md says: calls 1 … N−1 carry DIR/gK and run
# `mkdir -p /tmp/stash && cp -r DIR/gK /tmp/stash/`, back to back; call N carries DIR/gN and runs
# device_install.sh $PWD/DIR/gN (an absolute path: it checks the sums from /tmp/w). On 2026-12-05
# the GPU machine's pip stopped on vLLM's wheel (IndexError reading its RECORD) after the sums
# passed; `python3 -m zipfile -e /tmp/w/vllm-*.whl /tmp/site` and pip for the other wheels worked.
#   tests/bench/split_peer_wheels.sh .whl [PART_MIB=50]   (50: six calls)
set -euo pipefail
dir="${1:?usage: split_peer_wheels.sh DIR [PART_MIB]}"
part_mib="${2:-50}"
wheel=$(find "${dir}/all" -maxdepth 1 -name "vllm-*.whl" 2>/dev/null | head -1)
[[ -n "${wheel}" && -f "${dir}/MANIFEST.txt" ]] ||
  { echo "split_peer_wheels: run ../shared/gpu-anchors/fetch_wheels.sh ${dir} first" >&2; exit 1; }
rm -rf "${dir}"/g[0-9]*
staging="${dir}/parts"
rm -rf "${staging}" && mkdir -p "${staging}"
split -b "${part_mib}M" "${wheel}" "${staging}/vllm.whl.part-"
group=0
for part in "${staging}"/vllm.whl.part-*; do
  group=$((group + 1))
  mkdir -p "${dir}/g${group}"
  mv "${part}" "${dir}/g${group}/"
done
rmdir "${staging}"
last="${dir}/g${group}"
find "${dir}/all" -name '*.whl' ! -name 'vllm-*' -exec cp {} "${last}/" \;
cp "${dir}/MANIFEST.txt" "${last}/"
if (($(du -sm "${last}" | cut -f1) > part_mib)); then  # The small wheels in a group of their own.
  group=$((group + 1))
  mkdir -p "${dir}/g${group}"
  find "${last}" -maxdepth 1 ! -name 'vllm.whl.part-*' -type f -exec mv {} "${dir}/g${group}/" \;
fi
du -sh "${dir}"/g[0-9]*
