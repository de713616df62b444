#!/usr/bin/env bash
# Packs the built daemons (and optionally test binaries) with the non-system shared libraries
# they need (gRPC, protobuf, Abseil, yaml-cpp, ...) into one relocatable folder, for hosts that
# lack those libraries — e.g. GPU machines that only have CUDA, NCCL and PyTorch.
#   deploy/bundle.sh OUT_DIR [EXTRA_BINARY ...]
# Layout: OUT_DIR/bin (daemons, extras), OUT_DIR/lib (libraries; RPATH $ORIGIN/../lib), and
# OUT_DIR/env.sh, which finds the host's LibTorch and CUDA libraries for LibTorch binaries.
# LibTorch, CUDA, NCCL and glibc/libstdc++ are not copied: the target supplies them.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${RLHFD_BUILD_DIR:-${repo_root}/build}"
out="${1:?usage: deploy/bundle.sh OUT_DIR [EXTRA_BINARY ...]}"
shift
command -v patchelf >/dev/null || { echo "bundle: patchelf missing; run deploy/setup.sh" >&2; exit 1; }

binaries=("${build_dir}/controller/rlhfd-controller" "${build_dir}/worker/rlhfd-worker"
          "${build_dir}/controller/rlhfctl" "$@")
rm -rf "${out}"
mkdir -p "${out}/bin" "${out}/lib"

# Provided by every Linux host, or by the target's CUDA/PyTorch installation.
is_host_library() {
  case "$1" in
    linux-vdso*|ld-linux*|libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libutil.so*) return 0 ;;
    libgcc_s.so*|libstdc++.so*|libgomp.so*) return 0 ;;
    libtorch*|libc10*|libcuda*|libcudart*|libnccl*|libcublas*|libcudnn*|libcufft*|libcurand*) return 0 ;;
    libcusparse*|libcusolver*|libcupti*|libnvJitLink*|libnvshmem*|libnvrtc*|libcufile*|libnvToolsExt*) return 0 ;;
  esac
  return 1
}

for binary in "${binaries[@]}"; do
  [[ -x "${binary}" ]] || { echo "bundle: ${binary} not built" >&2; exit 1; }
  cp "${binary}" "${out}/bin/"
  strip --strip-debug "${out}/bin/$(basename "${binary}")"
  patchelf --set-rpath '$ORIGIN/../lib' "${out}/bin/$(basename "${binary}")"
  while read -r name path; do
    [[ -n "${path}" && -f "${path}" ]] || continue
    is_host_library "${name}" && continue
    if [[ ! -f "${out}/lib/${name}" ]]; then
      cp -L "${path}" "${out}/lib/${name}"
      strip --strip-debug "${out}/lib/${name}"
      patchelf --set-rpath '$ORIGIN' "${out}/lib/${name}"
    fi
  done < <(ldd "${binary}" | awk '$2 == "=>" {print $1, $3}')
done

cat > "${out}/env.sh" <<'ENV'
# Source this before running LibTorch binaries from the bundle: it puts the host's LibTorch and
# CUDA libraries on LD_LIBRARY_PATH. Set RLHFD_PYTHON to the python that has torch.
python="${RLHFD_PYTHON:-python3}"
torch_lib="$("${python}" -W ignore -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))' 2>/dev/null)"
if [[ -n "${torch_lib}" ]]; then
  export LD_LIBRARY_PATH="${torch_lib}:${torch_lib}/../../nvidia/cu13/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"
fi
export NCCL_NVLS_ENABLE=0
ENV
echo "bundle: ${out} ($(du -sh "${out}" | cut -f1)): $(ls "${out}/bin" | tr '\n' ' ')"
