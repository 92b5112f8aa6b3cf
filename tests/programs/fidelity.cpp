// The runtime's observable behaviour that a transparent pool must keep, and
// the driver's that it relies on.
#include <cuda.h>

#include "common.hpp"

int main() {
  // Size 0: success and a null pointer, plain or stream-ordered.
  void* p = reinterpret_cast<void*>(0x1);
  CHECK_CUDA(cudaMalloc(&p, 0));
  EXPECT(p == nullptr);
  p = reinterpret_cast<void*>(0x1);
  CHECK_CUDA(cudaMallocAsync(&p, 0, nullptr));
  EXPECT(p == nullptr);
  // A null out-pointer: cudaErrorInvalidValue, reported by cudaGetLastError once.
  EXPECT(cudaMalloc(nullptr, 16) == cudaErrorInvalidValue);
  EXPECT(cudaPeekAtLastError() == cudaErrorInvalidValue);
  EXPECT(cudaGetLastError() == cudaErrorInvalidValue);
  EXPECT(cudaGetLastError() == cudaSuccess);
  // Freeing null: success.
  EXPECT(cudaFree(nullptr) == cudaSuccess);
  EXPECT(cudaFreeAsync(nullptr, nullptr) == cudaSuccess);
  // Alignment of many small blocks.
  std::vector<void*> blocks;
  for (size_t n = 1; n < 5000; n += 37) {
    void* q = nullptr;
    CHECK_CUDA(cudaMalloc(&q, n));
    EXPECT(reinterpret_cast<uintptr_t>(q) % 512 == 0);
    blocks.push_back(q);
  }
  for (void* q : blocks) CHECK_CUDA(cudaFree(q));
  // A double free: the runtime's answer, cudaErrorInvalidValue, and nothing else breaks.
  void* a = nullptr;
  CHECK_CUDA(cudaMalloc(&a, 4096));
  CHECK_CUDA(cudaFree(a));
  EXPECT(cudaFree(a) == cudaErrorInvalidValue);
  EXPECT(cudaGetLastError() == cudaErrorInvalidValue);
  // A pointer the pool never handed out goes to the runtime untouched: here one
  // from a memory pool the program made, which gpupool leaves to the runtime.
  void* foreign = nullptr;
  cudaMemPool_t own_pool = testprog::new_device_pool(0);
  CHECK_CUDA(cudaMallocFromPoolAsync(&foreign, 1 << 20, own_pool, nullptr));
  CHECK_CUDA(cudaStreamSynchronize(nullptr));
  EXPECT(cudaFree(foreign) == cudaSuccess);
  CHECK_CUDA(cudaMemPoolDestroy(own_pool));
  // Mixed use: cudaFree of a cudaMallocAsync block, cudaFreeAsync of a cudaMalloc block.
  void* x = nullptr;
  void* y = nullptr;
  CHECK_CUDA(cudaMallocAsync(&x, 1 << 16, nullptr));
  CHECK_CUDA(cudaMalloc(&y, 1 << 16));
  CHECK_CUDA(cudaFree(x));
  CHECK_CUDA(cudaFreeAsync(y, nullptr));
  // A stream the program destroyed: its stream-ordered calls get the
  // runtime's answer, cudaErrorInvalidResourceHandle here, not memory from
  // the cache; the block a refused free names stays allocated.
  cudaStream_t gone = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&gone, cudaStreamNonBlocking));
  void* left = nullptr;
  CHECK_CUDA(cudaMallocAsync(&left, 1 << 16, gone));
  CHECK_CUDA(cudaStreamDestroy(gone));
  void* none = nullptr;
  EXPECT(cudaMallocAsync(&none, 1 << 16, gone) == cudaErrorInvalidResourceHandle);
  EXPECT(cudaGetLastError() == cudaErrorInvalidResourceHandle);
  cudaMemPool_t default_pool = nullptr;
  CHECK_CUDA(cudaDeviceGetDefaultMemPool(&default_pool, 0));
  EXPECT(cudaMallocFromPoolAsync(&none, 1 << 16, default_pool, gone) == cudaErrorInvalidResourceHandle);
  EXPECT(cudaFreeAsync(left, gone) == cudaErrorInvalidResourceHandle);
  EXPECT(cudaGetLastError() == cudaErrorInvalidResourceHandle);
  CHECK_CUDA(cudaFree(left));
  // Out of memory (the device is small in this test): the error, also from
  // cudaGetLastError; then recovery leaves no error behind.
  void* huge = nullptr;
  EXPECT(cudaMalloc(&huge, size_t{1} << 40) == cudaErrorMemoryAllocation);
  EXPECT(cudaGetLastError() == cudaErrorMemoryAllocation);
  EXPECT(cudaGetLastError() == cudaSuccess);
  // Fill the device with cached blocks, then ask for one big block: the pool
  // must release its cache and succeed, leaving no error.
  size_t free_bytes = 0, total = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total));
  std::vector<void*> many;
  for (int i = 0; i < 6; ++i) {
    void* q = nullptr;
    CHECK_CUDA(cudaMalloc(&q, total / 8));
    many.push_back(q);
  }
  for (void* q : many) CHECK_CUDA(cudaFree(q));
  void* big = nullptr;
  CHECK_CUDA(cudaMalloc(&big, total / 2 + total / 4));
  EXPECT(cudaGetLastError() == cudaSuccess);
  CHECK_CUDA(cudaFree(big));
  // Address ranges reserved through the driver (reached through the runtime,
  // as gpupool reaches it) start on a granule whatever their size: expandable
  // segments map pages at granule offsets from the start.
  void* reserve_fn = nullptr;
  void* free_fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  CHECK_CUDA(cudaGetDriverEntryPointByVersion("cuMemAddressReserve", &reserve_fn, 12000, cudaEnableDefault, &found));
  CHECK_CUDA(cudaGetDriverEntryPointByVersion("cuMemAddressFree", &free_fn, 12000, cudaEnableDefault, &found));
  EXPECT(reserve_fn != nullptr && free_fn != nullptr);
  const auto reserve = reinterpret_cast<decltype(&cuMemAddressReserve)>(reserve_fn);
  const auto release = reinterpret_cast<decltype(&cuMemAddressFree)>(free_fn);
  constexpr size_t kGranule = 2 << 20;
  for (size_t granules : {1, 3, 5, 1000}) {
    CUdeviceptr base = 0;
    EXPECT(reserve(&base, granules * kGranule, 0, 0, 0) == CUDA_SUCCESS);
    EXPECT(base % kGranule == 0);
    EXPECT(release(base, granules * kGranule) == CUDA_SUCCESS);
  }
  // A device reset destroys the streams the program made there: a call that
  // names one after it gets the runtime's answer too.
  cudaStream_t made = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&made, cudaStreamNonBlocking));
  void* before_reset = nullptr;
  CHECK_CUDA(cudaMallocAsync(&before_reset, 1 << 16, made));
  CHECK_CUDA(cudaFreeAsync(before_reset, made));
  CHECK_CUDA(cudaDeviceReset());
  EXPECT(cudaMallocAsync(&none, 1 << 16, made) == cudaErrorInvalidResourceHandle);
  EXPECT(cudaGetLastError() == cudaErrorInvalidResourceHandle);
  std::printf("fidelity: all checks passed\n");
  return 0;
}
