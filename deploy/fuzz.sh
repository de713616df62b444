#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) and runs each for a short time on a seed
# corpus from configs/ and the fixtures. Skips (exit 0) where clang is not installed.
#   RLHFD_FUZZ_SECONDS=20   time per target
#   RLHFD_FUZZ_TARGETS="config_fuzz model_files_fuzz"   a subset (default: all four)
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
    -DRLHFD_WITH_TORCH=OFF -DRLHFD_WITH_CUDA=OFF -DRLHFD_WITH_PARQUET=OFF >/dev/null
fi
targets="${RLHFD_FUZZ_TARGETS:-safetensors_header_fuzz tokenizer_fuzz config_fuzz model_files_fuzz}"
# shellcheck disable=SC2086
cmake --build "${build_dir}" --target ${targets} -j "$(nproc)"

corpus="${build_dir}/corpus"
mkdir -p "${corpus}/safetensors_header_fuzz" "${corpus}/tokenizer_fuzz" "${corpus}/config_fuzz" \
  "${corpus}/model_files_fuzz"
for f in "${repo_root}"/tests/fixtures/models/*/golden.safetensors; do
  cp "$f" "${corpus}/safetensors_header_fuzz/$(basename "$(dirname "$f")").safetensors"
done
printf 'Hello, world! 12345 日本語 😀\n\t  x' > "${corpus}/tokenizer_fuzz/seed-text"
cp "${repo_root}/tests/fixtures/tokenizers/qwen2-style/tokenizer.json" "${corpus}/tokenizer_fuzz/seed.json"
# The first byte picks the syntax (even: YAML, odd: JSON), and for model files which file.
for f in "${repo_root}"/configs/*.yaml; do
  { printf '\x00'; cat "$f"; } > "${corpus}/config_fuzz/$(basename "$f")"
done
for f in "${repo_root}"/configs/*.json; do
  { printf '\x01'; cat "$f"; } > "${corpus}/config_fuzz/$(basename "$f")"
done
for dir in "${repo_root}"/tests/fixtures/models/*/; do
  name="$(basename "${dir}")"
  { printf '\x00'; cat "${dir}/config.json"; } > "${corpus}/model_files_fuzz/${name}-config"
  if [[ -f "${dir}/generation_config.json" ]]; then
    { printf '\x01'; cat "${dir}/generation_config.json"; } > "${corpus}/model_files_fuzz/${name}-generation"
  fi
done
for f in "${repo_root}"/tests/fixtures/tokenizers/*/tokenizer_config.json; do
  { printf '\x02'; cat "$f"; } > "${corpus}/model_files_fuzz/$(basename "$(dirname "$f")")-tokenizer-config"
done

for name in ${targets}; do
  echo "fuzz: ${name} for ${seconds}s"
  "${build_dir}/tests/fuzz/${name}" -max_total_time="${seconds}" -max_len=65536 -print_final_stats=1 \
    "${corpus}/${name}" 2>&1 | tail -n 4
done
echo "fuzz: no crashes"
