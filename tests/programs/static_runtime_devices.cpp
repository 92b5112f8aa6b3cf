// static_runtime's modes on two devices (see static_runtime.cpp's list):
// peer and pool access, a stream of device 1 gpupool never saw made, a free
// captured on device 1 then reset.
#include <dlfcn.h>

#include <vector>

#include "static_runtime_driver.hpp"

namespace static_runtime {

int unseen_stream() {
  using Lookup = void* (*)(void*, const char*);
  void* libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  void* own = libc != nullptr ? dlvsym(libc, "dlsym", "GLIBC_2.34") : nullptr;
  if (own == nullptr && libc != nullptr) own = dlvsym(libc, "dlsym", "GLIBC_2.2.5");
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  auto create = own != nullptr && driver != nullptr
                    ? reinterpret_cast<decltype(&cuStreamCreate)>(reinterpret_cast<Lookup>(own)(driver, "cuStreamCreate"))
                    : nullptr;
  if (create == nullptr) {
    std::fprintf(stderr, "static_runtime: the driver's cuStreamCreate was not found\n");
    return 1;
  }
  use_device(1);
  CUstream s = nullptr;
  check(create(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate (unseen)");
  use_device(0);
  constexpr size_t kSize = 1 << 20;
  for (int i = 0; i < 5; ++i) {
    CUdeviceptr a = 0;
    check(d.mem_alloc_async(&a, kSize, s), "cuMemAllocAsync");
    std::vector<unsigned char> pattern(kSize, static_cast<unsigned char>(i + 1)), back(kSize);
    check(d.memcpy_htod_async(a, pattern.data(), kSize, s), "cuMemcpyHtoDAsync");
    check(d.stream_synchronize(s), "cuStreamSynchronize");
    check(d.memcpy_dtoh(back.data(), a, kSize), "cuMemcpyDtoH");
    if (back != pattern) {
      std::fprintf(stderr, "static_runtime: block %d does not hold what was written\n", i);
      return 1;
    }
    check(d.mem_free_async(a, s), "cuMemFreeAsync");
  }
  check(d.stream_synchronize(s), "cuStreamSynchronize");
  std::printf("{\"pairs\": 5}\n");
  return 0;
}

int peer() {
  constexpr size_t kBytes = 4 << 20;
  const CUcontext one = use_device(1);
  CUdeviceptr before = 0;
  check(d.mem_alloc(&before, kBytes), "cuMemAlloc");
  const bool hidden_before = !reachable(before, 0);
  // Device 0 may now reach device 1's memory, pooled pages included, and
  // pages mapped later.
  use_device(0);
  check(d.ctx_enable_peer_access(one, 0), "cuCtxEnablePeerAccess");
  use_device(1);
  CUdeviceptr after = 0;
  check(d.mem_alloc(&after, 3 * kBytes), "cuMemAlloc");
  const bool before_open = reachable(before, 0);
  const bool after_open = reachable(after, 0);
  // Taken away again: no page of device 1's is device 0's, then or later.
  use_device(0);
  check(d.ctx_disable_peer_access(one), "cuCtxDisablePeerAccess");
  use_device(1);
  CUdeviceptr later = 0;
  check(d.mem_alloc(&later, 3 * kBytes), "cuMemAlloc");
  int open_after_disable = 0;
  for (CUdeviceptr p : {before, after, later}) open_after_disable += reachable(p, 0) ? 1 : 0;
  std::printf("{\"hidden_before\": %d, \"before\": %d, \"after\": %d, \"open_after_disable\": %d}\n",
              hidden_before ? 1 : 0, before_open ? 1 : 0, after_open ? 1 : 0, open_after_disable);
  for (CUdeviceptr p : {before, after, later}) check(d.mem_free(p), "cuMemFree");
  return 0;
}

int pool_access() {
  constexpr size_t kBytes = 4 << 20;
  use_device(0);
  CUstream s = new_stream(CU_STREAM_NON_BLOCKING);
  CUdeviceptr before = 0;
  check(d.mem_alloc_async(&before, kBytes, s), "cuMemAllocAsync");
  const bool hidden_before = !reachable(before, 1);
  CUmemoryPool pool = nullptr;
  check(d.device_get_default_mem_pool(&pool, 0), "cuDeviceGetDefaultMemPool");
  CUmemAccessDesc desc{};
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = 1;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  check(d.mem_pool_set_access(pool, &desc, 1), "cuMemPoolSetAccess");
  CUdeviceptr after = 0;
  check(d.mem_alloc_async(&after, 3 * kBytes, s), "cuMemAllocAsync");
  std::printf("{\"hidden_before\": %d, \"before\": %d, \"after\": %d}\n", hidden_before ? 1 : 0,
              reachable(before, 1) ? 1 : 0, reachable(after, 1) ? 1 : 0);
  check(d.mem_free_async(before, s), "cuMemFreeAsync");
  check(d.mem_free_async(after, s), "cuMemFreeAsync");
  check(d.stream_synchronize(s), "cuStreamSynchronize");
  check(d.stream_destroy(s), "cuStreamDestroy");
  return 0;
}

int foreign_capture_reset() {
  constexpr size_t kBytes = 12 << 20;
  use_device(1);
  CUstream one = new_stream(CU_STREAM_NON_BLOCKING);
  use_device(0);
  CUdeviceptr p = 0;
  check(d.mem_alloc(&p, kBytes), "cuMemAlloc");
  write_and_check(p, kBytes, 1);
  use_device(1);
  check(d.begin_capture(one, CU_STREAM_CAPTURE_MODE_RELAXED), "cuStreamBeginCapture");
  check(d.mem_free_async(p, one), "cuMemFreeAsync (captured)");
  CUgraph graph = nullptr;
  check(d.end_capture(one, &graph), "cuStreamEndCapture");
  // The graph destroyed unlaunched: the block stays the graph's until the
  // reset, which ends device 1's work (and would destroy the graph too).
  check(d.graph_destroy(graph), "cuGraphDestroy");
  check(d.primary_ctx_reset(1), "cuDevicePrimaryCtxReset");
  use_device(0);
  CUdeviceptr q = 0;
  check(d.mem_alloc(&q, kBytes), "cuMemAlloc after the reset");
  write_and_check(q, kBytes, 2);
  check(d.mem_free(q), "cuMemFree");
  std::printf("{\"reused\": %d}\n", p == q ? 1 : 0);
  return 0;
}

}  // namespace static_runtime
