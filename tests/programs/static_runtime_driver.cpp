#include "static_runtime_driver.hpp"

#include <dlfcn.h>

#include <vector>

namespace static_runtime {

thread_local GetProcAddress get_proc_address = nullptr;
thread_local GetProcAddressV1 get_proc_address_v1 = nullptr;
bool g_cuda11 = false;
thread_local Driver d;
thread_local void* driver_library = nullptr;

void open_driver() {
  driver_library = dlopen("libcuda.so.1", RTLD_NOW);
  if (driver_library == nullptr) {
    std::fprintf(stderr, "static_runtime: %s\n", dlerror());
    std::exit(1);
  }
  if (g_cuda11) {
    get_proc_address_v1 = reinterpret_cast<GetProcAddressV1>(dlsym(driver_library, "cuGetProcAddress"));
    if (get_proc_address_v1 == nullptr) std::exit(1);
    get_proc_address_v1 = fetch<GetProcAddressV1>("cuGetProcAddress", 11030);
  } else {
    get_proc_address = reinterpret_cast<GetProcAddress>(dlsym(driver_library, "cuGetProcAddress_v2"));
    if (get_proc_address == nullptr) std::exit(1);
    // As the static runtime does: later lookups through the fetched copy.
    get_proc_address = fetch<GetProcAddress>("cuGetProcAddress", 12000);
  }
  d.init = fetch<decltype(d.init)>("cuInit", 2000);
  d.mem_alloc = fetch<decltype(d.mem_alloc)>("cuMemAlloc", 3020);
  d.mem_free = fetch<decltype(d.mem_free)>("cuMemFree", 3020);
  d.mem_alloc_pitch = fetch<decltype(d.mem_alloc_pitch)>("cuMemAllocPitch", 3020);
  d.mem_pool_trim_to = fetch<decltype(d.mem_pool_trim_to)>("cuMemPoolTrimTo", 11020);
  d.mem_get_info = fetch<decltype(d.mem_get_info)>("cuMemGetInfo", 3020);
  d.mem_pool_create = fetch<decltype(d.mem_pool_create)>("cuMemPoolCreate", 11020);
  d.mem_pool_destroy = fetch<decltype(d.mem_pool_destroy)>("cuMemPoolDestroy", 11020);
  d.device_set_mem_pool = fetch<decltype(d.device_set_mem_pool)>("cuDeviceSetMemPool", 11020);
  if (!g_cuda11) d.mem_set_mem_pool = fetch<decltype(d.mem_set_mem_pool)>("cuMemSetMemPool", 13000);
  d.mem_pool_set_access = fetch<decltype(d.mem_pool_set_access)>("cuMemPoolSetAccess", 11020);
  d.mem_pool_get_attribute = fetch<decltype(d.mem_pool_get_attribute)>("cuMemPoolGetAttribute", 11020);
  d.mem_pool_set_attribute = fetch<decltype(d.mem_pool_set_attribute)>("cuMemPoolSetAttribute", 11020);
  d.device_get_default_mem_pool = fetch<decltype(d.device_get_default_mem_pool)>("cuDeviceGetDefaultMemPool", 11020);
  d.mem_alloc_async = fetch<decltype(d.mem_alloc_async)>("cuMemAllocAsync", 11020);
  d.mem_alloc_from_pool_async = fetch<decltype(d.mem_alloc_from_pool_async)>("cuMemAllocFromPoolAsync", 11020);
  d.mem_free_async = fetch<decltype(d.mem_free_async)>("cuMemFreeAsync", 11020);
  d.mem_alloc_async_ptsz = fetch<decltype(d.mem_alloc_async)>("cuMemAllocAsync", 11020, 2);
  d.mem_free_async_ptsz = fetch<decltype(d.mem_free_async)>("cuMemFreeAsync", 11020, 2);
  d.mem_alloc_from_pool_async_ptsz =
      fetch<decltype(d.mem_alloc_from_pool_async)>("cuMemAllocFromPoolAsync", 11020, 2);
  d.memcpy_htod = fetch<decltype(d.memcpy_htod)>("cuMemcpyHtoD", 3020);
  d.memcpy_dtoh = fetch<decltype(d.memcpy_dtoh)>("cuMemcpyDtoH", 3020);
  d.memcpy_htod_async = fetch<decltype(d.memcpy_htod_async)>("cuMemcpyHtoDAsync", 3020);
  d.stream_create = fetch<decltype(d.stream_create)>("cuStreamCreate", 2000);
  d.stream_create_with_priority =
      fetch<decltype(d.stream_create_with_priority)>("cuStreamCreateWithPriority", 5050);
  d.stream_destroy = fetch<decltype(d.stream_destroy)>("cuStreamDestroy", 4000);
  d.stream_synchronize = fetch<decltype(d.stream_synchronize)>("cuStreamSynchronize", 2000);
  d.begin_capture = fetch<decltype(d.begin_capture)>("cuStreamBeginCapture", 10010);
  d.end_capture = fetch<decltype(d.end_capture)>("cuStreamEndCapture", 10000);
  d.begin_capture_ptsz = fetch<decltype(d.begin_capture)>("cuStreamBeginCapture", 10010, 2);
  d.end_capture_ptsz = fetch<decltype(d.end_capture)>("cuStreamEndCapture", 10000, 2);
  d.graph_destroy = fetch<decltype(d.graph_destroy)>("cuGraphDestroy", 10000);
  d.launch_host_func = fetch<decltype(d.launch_host_func)>("cuLaunchHostFunc", 10000);
  d.ctx_synchronize = fetch<decltype(d.ctx_synchronize)>("cuCtxSynchronize", 2000);
  d.ipc_get_mem_handle = fetch<decltype(d.ipc_get_mem_handle)>("cuIpcGetMemHandle", 4010);
  d.primary_ctx_reset = fetch<decltype(d.primary_ctx_reset)>("cuDevicePrimaryCtxReset", 11000);
  d.primary_ctx_retain = fetch<decltype(d.primary_ctx_retain)>("cuDevicePrimaryCtxRetain", 7000);
  d.ctx_set_current = fetch<decltype(d.ctx_set_current)>("cuCtxSetCurrent", 4000);
  d.ctx_enable_peer_access = fetch<decltype(d.ctx_enable_peer_access)>("cuCtxEnablePeerAccess", 4000);
  d.ctx_disable_peer_access = fetch<decltype(d.ctx_disable_peer_access)>("cuCtxDisablePeerAccess", 4000);
  if (d.init(0) != CUDA_SUCCESS) std::exit(1);
}

void check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  std::fprintf(stderr, "static_runtime: %s failed: %d\n", what, static_cast<int>(r));
  std::exit(1);
}

CUstream new_stream(unsigned flags) {
  CUstream s = nullptr;
  if (const char* priority = std::getenv("STATIC_RUNTIME_PRIORITY")) {
    check(d.stream_create_with_priority(&s, flags, std::atoi(priority)), "cuStreamCreateWithPriority");
  } else {
    check(d.stream_create(&s, flags), "cuStreamCreate");
  }
  return s;
}

void write_and_check(CUdeviceptr p, size_t size, unsigned seed) {
  std::vector<unsigned char> in(size), back(size);
  for (size_t i = 0; i < size; ++i) in[i] = static_cast<unsigned char>((i * 31 + seed) & 0xff);
  check(d.memcpy_htod(p, in.data(), size), "cuMemcpyHtoD");
  check(d.memcpy_dtoh(back.data(), p, size), "cuMemcpyDtoH");
  if (in != back) {
    std::fprintf(stderr, "static_runtime: block %llx of %zu bytes does not hold what was written\n",
                 static_cast<unsigned long long>(p), size);
    std::exit(1);
  }
}

const size_t kSizes[] = {512, 4096, 100000, 1 << 20, 3 << 20, 12 << 20};

void make_pairs(int n, unsigned seed) {
  for (int i = 0; i < n; ++i) {
    const size_t size = kSizes[i % 6];
    CUdeviceptr p = 0;
    check(d.mem_alloc(&p, size), "cuMemAlloc");
    write_and_check(p, size, seed + static_cast<unsigned>(i));
    check(d.mem_free(p), "cuMemFree");
  }
}

CUcontext use_device(int device) {
  CUcontext ctx = nullptr;
  check(d.primary_ctx_retain(&ctx, device), "cuDevicePrimaryCtxRetain");
  check(d.ctx_set_current(ctx), "cuCtxSetCurrent");
  return ctx;
}

bool reachable(CUdeviceptr p, int device) {
  using Accessible = int (*)(const void*, int);
  const auto accessible = reinterpret_cast<Accessible>(dlsym(driver_library, "simcuda_accessible"));
  if (accessible == nullptr) {
    std::fprintf(stderr, "static_runtime: this driver cannot say which device may use memory\n");
    std::exit(1);
  }
  return accessible(reinterpret_cast<void*>(static_cast<uintptr_t>(p)), device) != 0;
}

}  // namespace static_runtime
