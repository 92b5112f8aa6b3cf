// Plays a program built with nvcc's default static runtime: no CUDA runtime
// library, and the driver reached as that runtime reaches it. It opens
// libcuda.so.1 (RTLD_NOW, local), asks dlsym for cuGetProcAddress_v2, fetches
// cuGetProcAddress itself through it and every other entry point through
// that copy, at the versions CUDA 13's static runtime asks for. Each mode
// prints one JSON line; a broken byte or a failed call exits 1. With
// --cuda11 first, it plays a CUDA 11 static runtime instead: dlsym of
// cuGetProcAddress (the first form, without the status argument), versions
// up to 11080. With STATIC_RUNTIME_PRIORITY=N set, its streams are made at
// priority N (cuStreamCreateWithPriority), as PyTorch makes its pool's.
//
//   static_runtime pairs N        N cuMemAlloc/cuMemFree pairs of mixed sizes, each block checked
//   static_runtime pitched N      N cuMemAllocPitch/cuMemFree pairs of mixed shapes, as the static
//                                 runtime's cudaMallocPitch and cudaMalloc3D make them
//   static_runtime trim [KEEP]    8 blocks of 8 MiB freed on a stream, then, given KEEP, the default
//                                 memory pool trimmed to KEEP bytes; then a block allocated and checked.
//                                 Prints the pool's figures (cuMemPoolGetAttribute) on the way, and
//                                 the device's free bytes (cuMemGetInfo) before, with the blocks
//                                 held and after they were freed
//   static_runtime own-pool       a memory pool of its own made device 0's current pool: 4 stream-ordered
//                                 blocks drawn from it, one from each pool named (cuMemAllocFromPoolAsync),
//                                 then one from the default pool made current again,
//                                 and one more after another pool was made current and destroyed
//   static_runtime own-pool by-location  the same, each pool made current with CUDA 13's
//                                 cuMemSetMemPool (device 0's pinned memory)
//   static_runtime async N        the same, stream-ordered on a non-blocking stream (and ptsz twins)
//   static_runtime hazard [MS [MIB]]  a block of MIB MiB (default 1) freed while a slower stream still
//                                 writes it (MS ms later, default 100), then asked for again
//   static_runtime destroyed [MS] a block freed on a stream destroyed while a slower write on it is queued
//   static_runtime capture        plain and stream-ordered calls while a stream captures (global mode)
//   static_runtime capture-to-graph  the same, the capture begun into a graph of the program's
//                                 (cuStreamBeginCaptureToGraph, CUDA 12.3)
//   static_runtime capture-per-thread  the same on the per-thread default stream, through the
//                                 entry points fetched for it (as a per-thread build's runtime does)
//   static_runtime capture-to-graph-per-thread  the same, begun into a graph of the program's
//   static_runtime ipc            a handle for a block inside a pooled segment
//   static_runtime reset          allocations across cuDevicePrimaryCtxReset
//   static_runtime lookups        where dlsym's answers come from (program, library, RTLD_NEXT)
//   static_runtime threads T N    T threads at once, each opening the driver and making N pairs
//   static_runtime peer           two devices: pooled memory reachable once peer access is enabled,
//                                 and not once it is disabled
//   static_runtime pool-access    two devices: device 0's default memory pool opened to device 1
//                                 (cuMemPoolSetAccess) between two stream-ordered blocks; prints
//                                 whether device 1 may reach each
//   static_runtime cross-device [MS]  a block of device 1 freed on one of its streams under a slower write,
//                                 then asked for on another of its streams while device 0 is current:
//                                 gpupool orders the reuse on device 1 from device 0's thread
//   static_runtime unseen-stream  two devices: stream-ordered pairs, each block checked, on a stream of
//                                 device 1 that gpupool never saw made (the driver's cuStreamCreate
//                                 found through libc's own dlsym, as a library that resolves the
//                                 driver privately finds it) while device 0 is current
//   static_runtime foreign-capture-reset  two devices: a block of device 0 freed inside a capture of a
//                                 stream of device 1, then device 1 reset (cuDevicePrimaryCtxReset);
//                                 then a block of device 0 (with a limit leaving room for one: the
//                                 freed block's memory)
//   static_runtime library LIB N  LIB (a library that reaches the driver itself) makes N pairs
//   static_runtime library-by-name LIB N
//                                 LIB fetches each driver function with dlsym by its exported name and
//                                 makes N plain, 2N stream-ordered and N pitched pairs
//   static_runtime library-pool-access LIB
//                                 LIB, on two devices, takes a block from device 0's default pool named,
//                                 opens that pool to device 1, takes another; prints whether device 1
//                                 may use each (every driver function fetched by name, as XLA's async
//                                 allocator does)
//   static_runtime library-peer LIB
//                                 LIB, on two devices, gives device 0 peer access to device 1's memory
//                                 and takes it away (cuCtxEnablePeerAccess, cuCtxDisablePeerAccess
//                                 fetched by name); prints whether device 0 may use a block of device 1
//                                 with the access and after: {"with_access": B, "taken_away": B}
//   static_runtime library-reset LIB NAME
//                                 LIB resets the device through NAME fetched by name between two
//                                 allocations; the second must be usable
#include <cuda.h>
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "static_runtime_driver.hpp"

namespace {

using namespace static_runtime;

int pairs(int n) {
  make_pairs(n, 0);
  std::printf("{\"pairs\": %d}\n", n);
  return 0;
}

// Rows of every width the pitch may pad, each block written whole and read
// back; an element size the driver refuses is refused still.
int pitched(int n) {
  const size_t widths[] = {1, 300, 512, 513, 5760};
  const size_t heights[] = {1, 7, 480};
  const unsigned element_sizes[] = {4, 8, 16};
  for (int i = 0; i < n; ++i) {
    const size_t width = widths[i % 5];
    const size_t height = heights[i % 3];
    CUdeviceptr p = 0;
    size_t pitch = 0;
    check(d.mem_alloc_pitch(&p, &pitch, width, height, element_sizes[i % 3]), "cuMemAllocPitch");
    if (pitch < width || pitch % 32 != 0 || p % 512 != 0) {
      std::fprintf(stderr, "static_runtime: pitch %zu for rows of %zu bytes at %llx\n", pitch, width,
                   static_cast<unsigned long long>(p));
      return 1;
    }
    write_and_check(p, pitch * height, static_cast<unsigned>(i));
    check(d.mem_free(p), "cuMemFree");
  }
  CUdeviceptr p = 0;
  size_t pitch = 0;
  if (d.mem_alloc_pitch(&p, &pitch, 256, 4, 3) != CUDA_ERROR_INVALID_VALUE) {
    std::fprintf(stderr, "static_runtime: cuMemAllocPitch took an element size of 3 bytes\n");
    return 1;
  }
  std::printf("{\"pairs\": %d}\n", n);
  return 0;
}

unsigned long long used_of(CUmemoryPool pool) {
  cuuint64_t value = 0;
  check(d.mem_pool_get_attribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &value), "cuMemPoolGetAttribute");
  return static_cast<unsigned long long>(value);
}

// Makes `pool` device 0's current pool, with the call of CUDA 13 or the older one.
void make_current(CUmemoryPool pool, bool by_location) {
  if (!by_location) {
    check(d.device_set_mem_pool(0, pool), "cuDeviceSetMemPool");
    return;
  }
  CUmemLocation location{};
  location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  location.id = 0;
  check(d.mem_set_mem_pool(&location, CU_MEM_ALLOCATION_TYPE_PINNED, pool), "cuMemSetMemPool");
}

int own_pool(bool by_location) {
  constexpr size_t kBlock = size_t{4} << 20;
  CUmemPoolProps props{};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = 0;
  CUmemoryPool own = nullptr;
  CUmemoryPool default_pool = nullptr;
  check(d.mem_pool_create(&own, &props), "cuMemPoolCreate");
  check(d.device_get_default_mem_pool(&default_pool, 0), "cuDeviceGetDefaultMemPool");
  make_current(own, by_location);
  CUstream s = new_stream(CU_STREAM_NON_BLOCKING);
  CUdeviceptr blocks[4];
  for (CUdeviceptr& p : blocks) check(d.mem_alloc_async(&p, kBlock, s), "cuMemAllocAsync");
  check(d.stream_synchronize(s), "cuStreamSynchronize");
  const unsigned long long own_used = used_of(own);
  for (CUdeviceptr p : blocks) check(d.mem_free_async(p, s), "cuMemFreeAsync");
  // Each pool named: from it, whichever is current.
  for (CUmemoryPool named : {default_pool, own}) {
    CUdeviceptr q = 0;
    check(d.mem_alloc_from_pool_async(&q, kBlock, named, s), "cuMemAllocFromPoolAsync");
    check(d.mem_free_async(q, s), "cuMemFreeAsync");
  }
  make_current(default_pool, by_location);
  CUdeviceptr p = 0;
  check(d.mem_alloc_async(&p, kBlock, s), "cuMemAllocAsync");
  check(d.stream_synchronize(s), "cuStreamSynchronize");
  const unsigned long long default_used = used_of(default_pool);
  check(d.mem_free_async(p, s), "cuMemFreeAsync");
  check(d.stream_synchronize(s), "cuStreamSynchronize");
  check(d.mem_pool_destroy(own), "cuMemPoolDestroy");
  // Destroying the current pool makes the default one current.
  check(d.mem_pool_create(&own, &props), "cuMemPoolCreate");
  make_current(own, by_location);
  check(d.mem_pool_destroy(own), "cuMemPoolDestroy");
  check(d.mem_alloc_async(&p, kBlock, s), "cuMemAllocAsync");
  check(d.mem_free_async(p, s), "cuMemFreeAsync");
  check(d.stream_synchronize(s), "cuStreamSynchronize");
  check(d.stream_destroy(s), "cuStreamDestroy");
  std::printf("{\"own_pool_used\": %llu, \"default_pool_used\": %llu}\n", own_used, default_used);
  return 0;
}

int trim(const char* keep) {
  CUstream s = new_stream(CU_STREAM_NON_BLOCKING);
  CUmemoryPool pool = nullptr;
  check(d.device_get_default_mem_pool(&pool, 0), "cuDeviceGetDefaultMemPool");
  auto figure = [pool](CUmemPool_attribute attr) {
    cuuint64_t value = 0;
    check(d.mem_pool_get_attribute(pool, attr, &value), "cuMemPoolGetAttribute");
    return static_cast<unsigned long long>(value);
  };
  auto free_bytes = [] {
    size_t free = 0;
    size_t total = 0;
    check(d.mem_get_info(&free, &total), "cuMemGetInfo");
    return static_cast<unsigned long long>(free);
  };
  const unsigned long long free_before = free_bytes();
  std::vector<CUdeviceptr> blocks(8);
  for (CUdeviceptr& p : blocks) check(d.mem_alloc_async(&p, size_t{8} << 20, s), "cuMemAllocAsync");
  check(d.stream_synchronize(s), "cuStreamSynchronize");
  const unsigned long long used_held = figure(CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
  const unsigned long long free_held = free_bytes();
  for (CUdeviceptr p : blocks) check(d.mem_free_async(p, s), "cuMemFreeAsync");
  check(d.stream_synchronize(s), "cuStreamSynchronize");
  const unsigned long long free_after = free_bytes();
  cuuint64_t zero = 0;  // resets the high watermark to what is in use
  check(d.mem_pool_set_attribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &zero), "cuMemPoolSetAttribute");
  const unsigned long long used_high_reset = figure(CU_MEMPOOL_ATTR_USED_MEM_HIGH);
  if (keep != nullptr) check(d.mem_pool_trim_to(pool, std::strtoull(keep, nullptr, 10)), "cuMemPoolTrimTo");
  const unsigned long long reserved = figure(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
  CUdeviceptr p = 0;
  check(d.mem_alloc(&p, size_t{1} << 20), "cuMemAlloc");
  write_and_check(p, size_t{1} << 20, 5);
  check(d.mem_free(p), "cuMemFree");
  check(d.stream_destroy(s), "cuStreamDestroy");
  std::printf(
      "{\"trimmed\": %s, \"used_held\": %llu, \"used_high_reset\": %llu, \"reserved\": %llu, "
      "\"free_before\": %llu, \"free_held\": %llu, \"free_after\": %llu}\n",
      keep != nullptr ? "true" : "false", used_held, used_high_reset, reserved, free_before, free_held, free_after);
  return 0;
}

// The first lookups, the first calls and the pool's start, from several
// threads at once.
int threads(int count, int n) {
  std::vector<std::thread> all;
  for (int t = 0; t < count; ++t) {
    all.emplace_back([t, n] {
      open_driver();
      make_pairs(n, static_cast<unsigned>(t) * 1000);
    });
  }
  for (std::thread& t : all) t.join();
  std::printf("{\"pairs\": %d}\n", count * n);
  return 0;
}

int async(int n) {
  // A destroyed stream's handle: the runtime's answer, not the cache's; the
  // block a refused free names stays allocated.
  CUstream gone = new_stream(CU_STREAM_NON_BLOCKING);
  CUdeviceptr left = 0;
  check(d.mem_alloc_async(&left, kSizes[0], gone), "cuMemAllocAsync");
  check(d.stream_synchronize(gone), "cuStreamSynchronize");
  check(d.stream_destroy(gone), "cuStreamDestroy");
  CUdeviceptr none = 0;
  if (d.mem_alloc_async(&none, kSizes[0], gone) != CUDA_ERROR_INVALID_HANDLE ||
      d.mem_free_async(left, gone) != CUDA_ERROR_INVALID_HANDLE) {
    std::fprintf(stderr, "static_runtime: a call on a destroyed stream was served\n");
    return 1;
  }
  check(d.mem_free(left), "cuMemFree");
  CUstream s = new_stream(CU_STREAM_NON_BLOCKING);
  for (int i = 0; i < n; ++i) {
    const size_t size = kSizes[i % 6];
    CUdeviceptr p = 0;
    check(d.mem_alloc_async(&p, size, s), "cuMemAllocAsync");
    check(d.stream_synchronize(s), "cuStreamSynchronize");
    write_and_check(p, size, static_cast<unsigned>(i));
    check(d.mem_free_async(p, s), "cuMemFreeAsync");
    // The per-thread default stream's twins: NULL names that stream.
    check(d.mem_alloc_async_ptsz(&p, size, nullptr), "cuMemAllocAsync_ptsz");
    check(d.stream_synchronize(CU_STREAM_PER_THREAD), "cuStreamSynchronize");
    write_and_check(p, size, static_cast<unsigned>(i) + 7);
    check(d.mem_free_async_ptsz(p, nullptr), "cuMemFreeAsync_ptsz");
  }
  check(d.stream_synchronize(s), "cuStreamSynchronize");
  check(d.stream_destroy(s), "cuStreamDestroy");
  std::printf("{\"pairs\": %d}\n", n);
  return 0;
}

// Stands in for a kernel still writing the block: waits, then writes.
struct LateWrite {
  CUdeviceptr p;
  size_t size;
};
unsigned g_late_write_ms = 100;
size_t g_hazard_bytes = 1 << 20;
void late_write(void* data) {
  auto* w = static_cast<LateWrite*>(data);
  usleep(g_late_write_ms * 1000);
  std::memset(reinterpret_cast<void*>(static_cast<uintptr_t>(w->p)), 0xAA, w->size);  // host memory here
}

int hazard() {
  const size_t size = g_hazard_bytes;
  CUstream slow = new_stream(CU_STREAM_NON_BLOCKING);
  CUdeviceptr a = 0;
  check(d.mem_alloc(&a, size), "cuMemAlloc");
  LateWrite w{a, size};
  check(d.launch_host_func(slow, late_write, &w), "cuLaunchHostFunc");
  // cuMemFree waits for the device: the late write is over before the block
  // can be anyone's. A pool must keep that promise.
  check(d.mem_free(a), "cuMemFree");
  CUdeviceptr b = 0;
  check(d.mem_alloc(&b, size), "cuMemAlloc");
  write_and_check(b, size, 5);
  check(d.ctx_synchronize(), "cuCtxSynchronize");
  std::vector<unsigned char> back(size);
  check(d.memcpy_dtoh(back.data(), b, size), "cuMemcpyDtoH");
  for (size_t i = 0; i < size; ++i) {
    if (back[i] != static_cast<unsigned char>((i * 31 + 5) & 0xff)) {
      std::fprintf(stderr, "static_runtime: the reused block was overwritten by work queued before its free\n");
      return 1;
    }
  }
  check(d.mem_free(b), "cuMemFree");
  check(d.stream_destroy(slow), "cuStreamDestroy");
  std::printf("{\"reused\": %d}\n", a == b ? 1 : 0);
  return 0;
}

// A block freed on a stream under a slower write, then asked for on another
// stream (with GPUPOOL_MEMORY_LIMIT=20M: reused, not new). Destroyed: the
// freeing stream is destroyed with the late write still queued on it.
// CrossDevice: both streams are device 1's, and device 0 is current for the
// request: gpupool orders the reuse on device 1 from device 0's thread.
enum class LateReuse { Destroyed, CrossDevice };
int reuse_after_late_write(LateReuse how) {
  constexpr size_t kSize = 16 << 20;
  const bool cross = how == LateReuse::CrossDevice;
  if (cross) use_device(1);
  CUstream slow = new_stream(CU_STREAM_NON_BLOCKING);
  CUstream other = new_stream(CU_STREAM_NON_BLOCKING);
  CUdeviceptr a = 0;
  check(d.mem_alloc_async(&a, kSize, slow), "cuMemAllocAsync");
  LateWrite w{a, kSize};
  check(d.launch_host_func(slow, late_write, &w), "cuLaunchHostFunc");
  check(d.mem_free_async(a, slow), "cuMemFreeAsync");
  if (cross) {
    use_device(0);  // the streams name device 1: its pool serves, its events order
  } else {
    check(d.stream_destroy(slow), "cuStreamDestroy");
  }
  CUdeviceptr b = 0;
  check(d.mem_alloc_async(&b, kSize, other), "cuMemAllocAsync");
  std::vector<unsigned char> pattern(kSize, 0x55), back(kSize);
  check(d.memcpy_htod_async(b, pattern.data(), kSize, other), "cuMemcpyHtoDAsync");
  if (cross) {
    check(d.stream_synchronize(other), "cuStreamSynchronize");
    check(d.stream_synchronize(slow), "cuStreamSynchronize");
  } else {
    check(d.ctx_synchronize(), "cuCtxSynchronize");  // the destroyed stream's write too
  }
  check(d.memcpy_dtoh(back.data(), b, kSize), "cuMemcpyDtoH");
  if (back != pattern) {
    std::fprintf(stderr, "static_runtime: the reused block was overwritten by work queued before its free\n");
    return 1;
  }
  check(d.mem_free_async(b, other), "cuMemFreeAsync");
  check(d.stream_synchronize(other), "cuStreamSynchronize");
  if (cross) {
    use_device(1);
    check(d.stream_destroy(slow), "cuStreamDestroy");
  }
  check(d.stream_destroy(other), "cuStreamDestroy");
  std::printf("{\"reused\": %d}\n", a == b ? 1 : 0);
  return 0;
}

enum class Capture { Stream, ToGraph, PerThread, ToGraphPerThread };
int capture(Capture how) {
  // A current context first, as the static runtime makes one before its
  // first stream (the driver refuses cuStreamCreate without one).
  use_device(0);
  // The per-thread default stream is NULL to the entry points fetched for it.
  const bool per_thread = how == Capture::PerThread || how == Capture::ToGraphPerThread;
  const bool to_graph = how == Capture::ToGraph || how == Capture::ToGraphPerThread;
  CUstream s = per_thread ? nullptr : new_stream(0);
  CUstream other = new_stream(CU_STREAM_NON_BLOCKING);
  const auto alloc_async = per_thread ? d.mem_alloc_async_ptsz : d.mem_alloc_async;
  const auto free_async = per_thread ? d.mem_free_async_ptsz : d.mem_free_async;
  const auto alloc_from_pool = per_thread ? d.mem_alloc_from_pool_async_ptsz : d.mem_alloc_from_pool_async;
  CUmemoryPool default_pool = nullptr;
  check(d.device_get_default_mem_pool(&default_pool, 0), "cuDeviceGetDefaultMemPool");
  // Blocks to reuse while the capture runs: freed before it, plain and ordered.
  CUdeviceptr warm = 0;
  check(d.mem_alloc(&warm, 1 << 20), "cuMemAlloc");
  check(d.mem_free(warm), "cuMemFree");
  CUgraph target = nullptr;
  if (to_graph) {
    // Fetched here: a CUDA 11 static runtime could not ask for them.
    const auto graph_create = fetch<decltype(&cuGraphCreate)>("cuGraphCreate", 10000);
    const auto begin_to_graph = fetch<decltype(&cuStreamBeginCaptureToGraph)>(
        "cuStreamBeginCaptureToGraph", 12030, per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0);
    check(graph_create(&target, 0), "cuGraphCreate");
    check(begin_to_graph(s, target, nullptr, nullptr, 0, CU_STREAM_CAPTURE_MODE_GLOBAL),
          "cuStreamBeginCaptureToGraph");
  } else {
    check((per_thread ? d.begin_capture_ptsz : d.begin_capture)(s, CU_STREAM_CAPTURE_MODE_GLOBAL),
          "cuStreamBeginCapture");
  }
  CUdeviceptr p = 0;
  check(alloc_async(&p, 4096, s), "cuMemAllocAsync (captured)");
  check(free_async(p, s), "cuMemFreeAsync (captured)");
  check(alloc_from_pool(&p, 4096, default_pool, s), "cuMemAllocFromPoolAsync (captured)");
  check(free_async(p, s), "cuMemFreeAsync (captured)");
  CUdeviceptr q = 0;
  check(d.mem_alloc(&q, 1 << 20), "cuMemAlloc during a capture");
  check(d.mem_free(q), "cuMemFree during a capture");
  // On a stream that is not capturing: new memory, which the pool allocates
  // as a capture allows.
  CUdeviceptr grown = 0;
  check(d.mem_alloc_async(&grown, 64 << 20, other), "cuMemAllocAsync during a capture");
  check(d.mem_free_async(grown, other), "cuMemFreeAsync during a capture");
  CUgraph graph = nullptr;
  check((per_thread ? d.end_capture_ptsz : d.end_capture)(s, &graph), "cuStreamEndCapture");
  if (graph == nullptr || (to_graph && graph != target)) return 1;
  check(d.graph_destroy(graph), "cuGraphDestroy");
  check(d.stream_synchronize(other), "cuStreamSynchronize");
  check(d.stream_destroy(other), "cuStreamDestroy");
  if (!per_thread) check(d.stream_destroy(s), "cuStreamDestroy");
  std::printf("{\"captured\": 1}\n");
  return 0;
}

int ipc() {
  CUdeviceptr first = 0, second = 0;
  check(d.mem_alloc(&first, 4096), "cuMemAlloc");
  check(d.mem_alloc(&second, 4096), "cuMemAlloc");
  CUipcMemHandle handle{};
  const CUresult r = d.ipc_get_mem_handle(&handle, second);
  std::printf("{\"ipc_result\": %d}\n", static_cast<int>(r));
  return 0;
}

int reset() {
  CUdeviceptr p = 0;
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 6; ++i) {
      check(d.mem_alloc(&p, kSizes[i]), "cuMemAlloc");
      write_and_check(p, kSizes[i], static_cast<unsigned>(round * 6 + i));
      check(d.mem_free(p), "cuMemFree");
    }
    check(d.primary_ctx_reset(0), "cuDevicePrimaryCtxReset");
  }
  std::printf("{\"rounds\": 3}\n");
  return 0;
}

std::string object_of(void* fn) {
  Dl_info info{};
  if (fn == nullptr || dladdr(fn, &info) == 0 || info.dli_fname == nullptr) return "none";
  const char* slash = std::strrchr(info.dli_fname, '/');
  return slash != nullptr ? slash + 1 : info.dli_fname;
}

int lookups(const char* library) {
  void* h = dlopen("libcuda.so.1", RTLD_NOW);
  void* module = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr || module == nullptr) return 1;
  using Lookup = void* (*)(void*, const char*);
  auto from_library = reinterpret_cast<Lookup>(dlsym(module, "lookup_in"));
  if (from_library == nullptr) return 1;
  std::printf(
      "{\"program\": \"%s\", \"library\": \"%s\", \"next\": \"%s\", \"plain\": \"%s\"}\n",
      object_of(dlsym(h, "cuGetProcAddress_v2")).c_str(),
      object_of(from_library(h, "cuGetProcAddress_v2")).c_str(),
      // RTLD_NEXT from the program: the first object after it that has the
      // name, the preloaded library when there is one.
      object_of(dlsym(RTLD_NEXT, "cudaMalloc")).c_str(), object_of(dlsym(h, "cuInit")).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--cuda11") == 0) {
    g_cuda11 = true;
    --argc;
    ++argv;
  }
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "lookups" && argc > 2) return lookups(argv[2]);
  if (mode == "threads" && argc > 3) return threads(std::atoi(argv[2]), std::atoi(argv[3]));
  if (mode == "library-pool-access" && argc > 2) {
    void* module = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
    auto open_in = module != nullptr ? reinterpret_cast<int (*)()>(dlsym(module, "library_pool_access_by_name"))
                                     : nullptr;
    const int open = open_in != nullptr ? open_in() : -1;
    if (open < 0) return 1;
    std::printf("{\"before\": %d, \"after\": %d}\n", open & 1, open >> 1 & 1);
    return 0;
  }
  if (mode == "library-peer" && argc > 2) {
    void* module = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
    auto peer_in = module != nullptr ? reinterpret_cast<int (*)()>(dlsym(module, "library_peer_by_name")) : nullptr;
    const int open = peer_in != nullptr ? peer_in() : -1;
    if (open < 0) return 1;
    std::printf("{\"with_access\": %d, \"taken_away\": %d}\n", open & 1, open >> 1 & 1);
    return 0;
  }
  if (mode == "library-reset" && argc > 3) {
    void* module = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
    auto reset_in =
        module != nullptr ? reinterpret_cast<int (*)(const char*)>(dlsym(module, "library_reset_by_name")) : nullptr;
    if (reset_in == nullptr || reset_in(argv[3]) != 0) return 1;
    std::printf("{\"reset\": \"%s\"}\n", argv[3]);
    return 0;
  }
  if ((mode == "library" || mode == "library-by-name") && argc > 3) {
    void* module = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
    const char* entry = mode == "library" ? "library_pairs" : "library_by_name";
    auto pairs_in = module != nullptr ? reinterpret_cast<int (*)(int)>(dlsym(module, entry)) : nullptr;
    if (pairs_in == nullptr || pairs_in(std::atoi(argv[3])) != 0) return 1;
    std::printf("{\"pairs\": %d}\n", std::atoi(argv[3]));
    return 0;
  }
  open_driver();
  const int n = argc > 2 ? std::atoi(argv[2]) : 60;
  if (mode == "pairs") return pairs(n);
  if (mode == "async") return async(n);
  if (mode == "pitched") return pitched(n);
  if (mode == "trim") return trim(argc > 2 ? argv[2] : nullptr);
  if (mode == "own-pool") return own_pool(argc > 2 && std::strcmp(argv[2], "by-location") == 0);
  if ((mode == "hazard" || mode == "destroyed" || mode == "cross-device") && argc > 2) {
    g_late_write_ms = static_cast<unsigned>(n);
    if (mode == "hazard" && argc > 3) g_hazard_bytes = std::strtoull(argv[3], nullptr, 10) << 20;
  }
  if (mode == "hazard") return hazard();
  if (mode == "capture") return capture(Capture::Stream);
  if (mode == "capture-to-graph") return capture(Capture::ToGraph);
  if (mode == "capture-per-thread") return capture(Capture::PerThread);
  if (mode == "capture-to-graph-per-thread") return capture(Capture::ToGraphPerThread);
  if (mode == "destroyed") return reuse_after_late_write(LateReuse::Destroyed);
  if (mode == "ipc") return ipc();
  if (mode == "reset") return reset();
  if (mode == "peer") return peer();
  if (mode == "pool-access") return pool_access();
  if (mode == "cross-device") return reuse_after_late_write(LateReuse::CrossDevice);
  if (mode == "unseen-stream") return unseen_stream();
  if (mode == "foreign-capture-reset") return foreign_capture_reset();
  std::fprintf(stderr,
               "usage: static_runtime [--cuda11] "
               "pairs|pitched|trim|own-pool|async|hazard|destroyed|capture|capture-to-graph|capture-per-thread|"
               "ipc|reset|peer|pool-access|cross-device|unseen-stream|"
               "foreign-capture-reset [N] | "
               "lookups LIBRARY | "
               "threads T N | "
               "library|library-by-name LIBRARY N | library-pool-access|library-peer LIBRARY | library-reset LIBRARY NAME\n");
  return 2;
}
