#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) and runs each for a short time on a seed
# corpus from the fixtures. Skips (exit 0) where clang is not installed.
#   RLHFD_FUZZ_SECONDS=20   time per target
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${RLHFD_FUZZ_BUILD_DIR:-${repo_root}/build-fuzz}"
seconds="${RLHFD_FUZZ_SECONDS:-20}"
if ! command -v clang++ >/dev/null; then
  echo "fuzz: clang++ not installed; skipping the fuzz run"
  exit 0
fi
export CCACHE_DIR="${CCACHE_DIR:-${HOME}/.cache/ccache}"
# Paths relative to the checkout, so a fresh clone elsewhere (as CI makes) still hits the cache.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-${repo_root}}"
# -g makes ccache hash the working directory unless told not to; a clone elsewhere would miss.
export CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-true}"
if [[ ! -f "${build_dir}/build.ninja" ]]; then
  cmake -S "${repo_root}" -B "${build_dir}" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DRLHFD_FUZZ=ON \
    -DRLHFD_WITH_TORCH=OFF -DRLHFD_WITH_CUDA=OFF >/dev/null
fi
cmake --build "${build_dir}" --target safetensors_header_fuzz tokenizer_fuzz -j "$(nproc)"

corpus="${build_dir}/corpus"
mkdir -p "${corpus}/safetensors" "${corpus}/tokenizer"
cp "${repo_root}"/tests/fixtures/models/*/golden.safetensors "${corpus}/safetensors/" 2>/dev/null || true
for f in "${repo_root}"/tests/fixtures/models/*/golden.safetensors; do
  cp "$f" "${corpus}/safetensors/$(basename "$(dirname "$f")").safetensors"
done
printf 'Hello, world! 12345 日本語 😀\n\t  x' > "${corpus}/tokenizer/seed-text"
cp "${repo_root}/tests/fixtures/tokenizers/qwen2-style/tokenizer.json" "${corpus}/tokenizer/seed.json"

for target in safetensors_header_fuzz:safetensors tokenizer_fuzz:tokenizer; do
  name="${target%%:*}"
  echo "fuzz: ${name} for ${seconds}s"
  "${build_dir}/tests/fuzz/${name}" -max_total_time="${seconds}" -max_len=65536 -print_final_stats=1 \
    "${corpus}/${target##*:}" 2>&1 | tail -n 4
done
echo "fuzz: no crashes"
