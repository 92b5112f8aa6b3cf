#!/usr/bin/env bash
# gpu-bench.sh: the benchmarks that need a GPU (allocation pairs through the
# real runtime with and without gpupool; PyTorch steps when PyTorch is there).
# Writes bench/GPU.md ($OUT/GPU.md where OUT is set); scripts/bench.sh puts
# it into BENCHMARKS.md. Takes a few minutes on an H200. Exit 77: no GPU here.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-bench: no GPU here; nothing run"
  exit 77
fi
cudalib=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib; do [ -e "$d/libcudart.so.13" ] && cudalib=$d && break; done
if [ -z "$cudalib" ]; then
  cudalib=$(python3 -c "import nvidia.cuda_runtime, os; print(os.path.join(nvidia.cuda_runtime.__path__[0], 'lib'))" 2>/dev/null || true)
fi
export LD_LIBRARY_PATH="${cudalib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [ ! -x build/bin/gpupool-bench-api ] || [ ! -f build/lib/libgpupool.so ]; then
  echo "gpu-bench: building gpupool"
  cmake --preset default >/dev/null && cmake --build --preset default >/dev/null
fi
exec python3 bench/gpu_bench.py "$@"
