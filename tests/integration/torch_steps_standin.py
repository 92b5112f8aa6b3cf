"""A stand-in for bench/torch_steps.py where PyTorch is not installed, for
the test that runs bench/gpu_bench.py whole (GPU_BENCH_TORCH_STEPS): makes
a few hundred cudaMalloc/cudaFree pairs through whatever runtime the
process loads (under gpupool, its report then has figures to read), a
non-blocking stream first with --side-stream, and prints torch_steps.py's
JSON line with made-up figures."""
import ctypes
import json
import sys

ctypes.CDLL("libcudart.so.13", mode=ctypes.RTLD_GLOBAL)
cuda = ctypes.CDLL(None)  # the global scope: gpupool's entry points where it is preloaded
if "--side-stream" in sys.argv:
    stream = ctypes.c_void_p()
    if cuda.cudaStreamCreateWithFlags(ctypes.byref(stream), 1) != 0:
        sys.exit("torch_steps_standin: cudaStreamCreateWithFlags failed")
for step in range(300):
    ptr = ctypes.c_void_p()
    if cuda.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t((step % 7 + 1) << 20)) != 0 or cuda.cudaFree(ptr) != 0:
        sys.exit("torch_steps_standin: cudaMalloc or cudaFree failed")
print(json.dumps({"ms_per_step": 10.0, "torch_reserved_peak": 64 << 20, "torch_allocated_peak": 7 << 20}))
