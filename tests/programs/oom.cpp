// Out of memory on a small simulated device (run with SIMCUDA_MEMORY=64M), in
// a way the report must diagnose; prints the 8 MiB request's result:
//   fragmentation  plenty free in the pool, in 2 MiB pieces, and an 8 MiB request
//   full           the program's own live blocks fill the device
//   none           nothing before it (with the simulated runtime's injected
//                  failures: a device that refuses, or has a sticky error)
//   capture        48 MiB freed with cudaFree, its work still queued (run with
//                  SIMCUDA_OP_DELAY_US), then, while a stream captures, a 20 MiB
//                  request on another (reusing the block would need the legacy
//                  stream, which the capture forbids)
#include <string>

#include "common.hpp"

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  std::vector<void*> blocks;
  if (mode == "fragmentation") {
    // Three 20 MiB segments cut into 2 MiB blocks; every other block freed.
    for (int i = 0; i < 30; ++i) {
      void* p = nullptr;
      CHECK_CUDA(cudaMalloc(&p, 2 << 20));
      blocks.push_back(p);
    }
    for (size_t i = 0; i < blocks.size(); i += 2) CHECK_CUDA(cudaFree(blocks[i]));
  } else if (mode == "full") {
    for (int i = 0; i < 3; ++i) {
      void* p = nullptr;
      CHECK_CUDA(cudaMalloc(&p, 20 << 20));
      blocks.push_back(p);
    }
  } else if (mode == "capture") {
    cudaStream_t capturing = nullptr, asking = nullptr;
    CHECK_CUDA(cudaStreamCreate(&capturing));
    CHECK_CUDA(cudaStreamCreateWithFlags(&asking, cudaStreamNonBlocking));
    void* p = nullptr;
    CHECK_CUDA(cudaMalloc(&p, 48 << 20));
    CHECK_CUDA(cudaMemsetAsync(p, 1, 48 << 20, nullptr));  // still queued when the request comes
    CHECK_CUDA(cudaFree(p));
    CHECK_CUDA(cudaStreamBeginCapture(capturing, cudaStreamCaptureModeGlobal));
    void* q = nullptr;
    const cudaError_t err = cudaMallocAsync(&q, 20 << 20, asking);
    if (err != cudaSuccess) EXPECT(cudaGetLastError() == err);
    cudaGraph_t graph = nullptr;
    CHECK_CUDA(cudaStreamEndCapture(capturing, &graph));
    CHECK_CUDA(cudaGraphDestroy(graph));
    if (err == cudaSuccess) CHECK_CUDA(cudaFreeAsync(q, asking));
    std::printf("oom: %s\n", cudaGetErrorName(err));
    return 0;
  } else if (mode != "none") {
    std::fprintf(stderr, "usage: oom fragmentation|full|none|capture\n");
    return 64;
  }
  // Fixed segments cannot serve this; expandable segments can, by giving the
  // free pages back and mapping them where the request fits.
  void* big = nullptr;
  const cudaError_t err = cudaMalloc(&big, 8 << 20);
  if (err != cudaSuccess) EXPECT(cudaGetLastError() == err);
  std::printf("oom: %s\n", cudaGetErrorName(err));
  return 0;
}
