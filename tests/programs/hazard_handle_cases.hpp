// The reuse-hazard cases of stream handles: a stream destroyed where gpupool
// sees it or not (the driver's own cuStreamDestroy, found as a program or a
// library finds it), a handle given again to a new stream, and a stream found
// gone by a barrier (hazard_cases.hpp's run_case names them).
#pragma once

#include "driver_ways.hpp"
#include "hazard_setup.hpp"

namespace hazards {

// A stream destroyed, then a new stream given its handle while the old one's
// write still runs: the block freed on the old stream must still wait for
// that write. With `unseen`, the destroy is one gpupool cannot see (the
// driver's own cuStreamDestroy, which a program on the shared runtime calls
// past gpupool). Shows something only where the runtime gives the handle
// again at once (the simulated one with SIMCUDA_REUSE_STREAM_HANDLES=1); 2
// otherwise. With `threads`, a second thread's stream-ordered call first
// switches gpupool's per-thread caches on, so that the freed block waits in
// this thread's.
using StreamDestroy = CUresult (*)(CUstream);

// The driver's cuStreamDestroy_v2 as the program's own dlsym finds it, which
// gpupool watches (watched), or as a library that resolves the driver's
// functions privately finds it, through libc's own dlsym: a destroy gpupool
// cannot see. Null (said) if not found.
inline StreamDestroy driver_stream_destroy(bool watched = false) {
  using Lookup = void* (*)(void*, const char*);
  Lookup lookup = dlsym;
  if (!watched) {
    void* libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    void* own = libc != nullptr ? dlvsym(libc, "dlsym", "GLIBC_2.34") : nullptr;
    if (own == nullptr && libc != nullptr) own = dlvsym(libc, "dlsym", "GLIBC_2.2.5");
    lookup = reinterpret_cast<Lookup>(own);
  }
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  auto destroy = driver != nullptr && lookup != nullptr
                     ? reinterpret_cast<StreamDestroy>(lookup(driver, "cuStreamDestroy_v2"))
                     : nullptr;
  if (destroy == nullptr) std::fprintf(stderr, "the driver's cuStreamDestroy_v2 was not found\n");
  return destroy;
}

// A stream destroyed through the driver's cuStreamDestroy_v2 that the program
// fetched with its own dlsym, or (Linked) called directly, linked with the
// driver, or (Library) that a library fetched with dlsym: the one whose path
// HAZARDS_DRIVER_LIBRARY names (tests/programs' driver_lookup_module.c), or
// (Runtime) that the program fetched through the runtime's
// cudaGetDriverEntryPoint. gpupool sees it as it sees cudaStreamDestroy, so the block freed on it
// while its write is queued goes to another stream only after that write,
// and no call names the dead handle.
enum class DriverDestroy { LookedUp, Linked, Library, Runtime };
inline int watched_driver_destroy(DriverDestroy how) {
  StreamDestroy driver_destroy = nullptr;
  if (how == DriverDestroy::Linked) {
    driver_destroy = &cuStreamDestroy;  // cuda.h's name for cuStreamDestroy_v2
  } else if (how == DriverDestroy::Library) {
    const char* path = std::getenv("HAZARDS_DRIVER_LIBRARY");
    void* library = path != nullptr ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : nullptr;
    driver_destroy = library != nullptr ? reinterpret_cast<StreamDestroy>(dlsym(library, "destroy_stream_by_name"))
                                        : nullptr;
    if (driver_destroy == nullptr) std::fprintf(stderr, "no library in HAZARDS_DRIVER_LIBRARY to destroy with\n");
  } else if (how == DriverDestroy::Runtime) {
    driver_destroy = reinterpret_cast<StreamDestroy>(
        testprog::runtime_entry_point("runtime-entry-point", "cuStreamDestroy", 0, 0));
    if (driver_destroy == nullptr) std::fprintf(stderr, "the runtime found no cuStreamDestroy\n");
  } else {
    driver_destroy = driver_stream_destroy(true);
  }
  if (driver_destroy == nullptr) return 3;
  cudaStream_t s1 = stream(cudaStreamNonBlocking), s2 = stream(cudaStreamNonBlocking);
  void* p = busy_freed_block(s1);
  if (driver_destroy(reinterpret_cast<CUstream>(s1)) != CUDA_SUCCESS) {
    std::fprintf(stderr, "the stream's destroy failed\n");
    return 3;
  }
  void* q = nullptr;
  HAZARD_CHECK(cudaMallocAsync(&q, kBytes, s2));
  return verdict(p, q, s2);
}

// A second thread's stream-ordered call switches gpupool's per-thread caches
// on, so that a block this thread frees with cudaFreeAsync waits in its cache.
inline void switch_thread_caches_on() {
  std::thread([] {
    void* none = nullptr;
    HAZARD_CHECK(cudaMallocAsync(&none, 0, kThreadStream));
  }).join();
}

// A non-blocking stream made through the driver's cuStreamCreate (past
// gpupool), which is to get `old`'s handle (destroyed): 0, with it in *out;
// 2 (said, the device synchronized) where it got another; 3 where the
// driver failed.
inline int driver_stream_on(cudaStream_t old, cudaStream_t* out) {
  using StreamCreate = CUresult (*)(CUstream*, unsigned);
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  auto create = driver != nullptr ? reinterpret_cast<StreamCreate>(dlsym(driver, "cuStreamCreate")) : nullptr;
  CUstream s = nullptr;
  if (create == nullptr || create(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
    std::fprintf(stderr, "the driver's cuStreamCreate was not found or failed\n");
    return 3;
  }
  *out = reinterpret_cast<cudaStream_t>(s);
  if (*out == old) return 0;
  std::printf("not reused: the new stream has a handle of its own\n");
  HAZARD_CHECK(cudaDeviceSynchronize());
  return 2;
}

inline int handle_given_again(bool unseen, bool threads) {
  StreamDestroy driver_destroy = nullptr;
  if (unseen && (driver_destroy = driver_stream_destroy()) == nullptr) return 3;
  if (threads) switch_thread_caches_on();
  cudaStream_t s1 = stream(cudaStreamNonBlocking);
  void* p = busy_freed_block(s1);
  if (unseen) {
    if (driver_destroy(reinterpret_cast<CUstream>(s1)) != CUDA_SUCCESS) {
      std::fprintf(stderr, "cuStreamDestroy_v2 failed\n");
      return 3;
    }
  } else {
    HAZARD_CHECK(cudaStreamDestroy(s1));
  }
  cudaStream_t s2 = stream(cudaStreamNonBlocking);
  if (s2 != s1) {
    std::printf("not reused: the new stream has a handle of its own\n");
    HAZARD_CHECK(cudaDeviceSynchronize());
    return 2;
  }
  void* q = nullptr;
  HAZARD_CHECK(cudaMallocAsync(&q, kBytes, s2));
  return verdict(p, q, s2);
}

// A stream destroyed through the driver, past gpupool, whose handle no new
// stream gets: the block freed on it while its write is queued goes to a
// plain cudaMalloc only once that write is done (2 where that request took
// new memory instead). Then plain pairs, each of which needs a barrier: with
// the gone stream kept in the barriers, each would fail, and each pair take
// new memory (the test reads the peak reserved and the runtime's count of
// calls naming the gone stream).
inline int gone_stream(int plain_pairs) {
  const StreamDestroy driver_destroy = driver_stream_destroy();
  if (driver_destroy == nullptr) return 3;
  cudaStream_t s1 = stream(cudaStreamNonBlocking);
  void* p = busy_freed_block(s1);
  if (driver_destroy(reinterpret_cast<CUstream>(s1)) != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuStreamDestroy_v2 failed\n");
    return 3;
  }
  void* q = nullptr;
  HAZARD_CHECK(cudaMalloc(&q, kBytes));
  const int result = verdict(p, q, nullptr);
  HAZARD_CHECK(cudaFree(q));
  for (int i = 0; i < plain_pairs; ++i) {
    HAZARD_CHECK(cudaMalloc(&q, kBytes));
    HAZARD_CHECK(cudaFree(q));
  }
  return result;
}

// A stream destroyed through the driver, then found gone by a plain request
// (which takes new memory), then a stream made through the driver
// (cuStreamCreate, past gpupool) gets its handle. The old stream's block,
// freed while its write was queued, must not go to the new stream by stream
// order, from the pool or from this thread's cache (`threads`, as in
// handle_given_again): gpupool has forgotten the handle, and meets the new
// stream as a new one. The plain request finds the old stream gone by
// looking at a block too large for a thread's cache of 2 MiB, freed on it
// (kLarge). Needs room for those, the old block's segment and kLarge more,
// and no more (10 MiB with expandable segments): the request on the new
// stream then waits for the old write before it takes the old block (0).
// Shows something only where the runtime gives the handle again at once; 2
// otherwise.
inline int gone_stream_made_again(bool threads) {
  constexpr size_t kLarge = 4 << 20;
  const StreamDestroy driver_destroy = driver_stream_destroy();
  if (driver_destroy == nullptr) return 3;
  if (threads) switch_thread_caches_on();
  cudaStream_t s1 = stream(cudaStreamNonBlocking);
  void* large = nullptr;
  HAZARD_CHECK(cudaMallocAsync(&large, kLarge, s1));  // first: a cache's blocks go back when the pool grows
  void* p = busy_freed_block(s1);
  HAZARD_CHECK(cudaFreeAsync(large, s1));
  if (driver_destroy(reinterpret_cast<CUstream>(s1)) != CUDA_SUCCESS) return 3;
  void* q = nullptr;
  HAZARD_CHECK(cudaMalloc(&q, kLarge));
  cudaStream_t s2 = nullptr;
  if (const int got = driver_stream_on(s1, &s2); got != 0) return got;
  void* r = nullptr;
  HAZARD_CHECK(cudaMallocAsync(&r, kBytes, s2));
  const int result = verdict(p, r, s2);
  HAZARD_CHECK(cudaFree(q));
  return result;
}

// A stream found gone by a barrier (destroyed through the driver), whose
// handle then goes to a stream made through the driver after a later
// barrier that ordered a live plain block: named in a stream-ordered call,
// the new stream must be made to follow that barrier, as a stream gpupool
// meets for the first time (new_stream_after_barrier), though gpupool had
// met its handle. Shows something only where the runtime gives the handle
// again at once; 2 otherwise.
inline int gone_handle_after_barrier() {
  const StreamDestroy driver_destroy = driver_stream_destroy();
  if (driver_destroy == nullptr) return 3;
  cudaStream_t s1 = stream(cudaStreamNonBlocking);  // first: the destroyed handle goes to the driver's stream
  cudaStream_t s0 = stream(cudaStreamNonBlocking);
  void* p = only_room();
  HAZARD_CHECK(cudaFree(p));
  if (driver_destroy(reinterpret_cast<CUstream>(s0)) != CUDA_SUCCESS) return 3;
  HAZARD_CHECK(cudaMalloc(&p, kBytes));  // its barrier finds s0 gone: a device wait
  old_owner_writes(p, s1);
  HAZARD_CHECK(cudaFree(p));
  void* q = nullptr;
  HAZARD_CHECK(cudaMalloc(&q, kBytes));  // after the barrier: s1's write, then the legacy stream's event
  cudaStream_t s2 = nullptr;
  if (const int got = driver_stream_on(s0, &s2); got != 0) return got;
  void* none = nullptr;
  HAZARD_CHECK(cudaMallocAsync(&none, 0, s2));  // gpupool meets it
  return verdict(p, q, s2);
}

}  // namespace hazards
