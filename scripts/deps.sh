#!/usr/bin/env bash
# Installs the Debian packages gpupool needs to build and test, if missing, and
# checks for the CUDA Toolkit (headers only; no GPU needed). Used by
# scripts/demo, scripts/test and .ci/run; arguments name more packages
# (scripts/fuzz asks for clang).
set -euo pipefail

packages=(g++ cmake ninja-build libspdlog-dev libfmt-dev libboost-dev catch2 python3 python3-jsonschema python3-matplotlib valgrind libbenchmark-dev "$@")
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "gpupool: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null ||
    { $sudo apt-get update >/dev/null && $sudo apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null; }
fi

# The CUDA Toolkit is not a Debian package at version 13: it must be there.
cuda_root="${CUDAToolkit_ROOT:-/usr/local/cuda}"
if [ ! -f "$cuda_root/include/cuda_runtime_api.h" ]; then
  echo "gpupool: the CUDA Toolkit headers were not found in $cuda_root (set CUDAToolkit_ROOT)" >&2
  exit 1
fi
