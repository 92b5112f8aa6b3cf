// Process lifecycle under gpupool, one mode per run:
//   leak       leaves three blocks allocated (allocated in leak_here(), for
//              GPUPOOL_BACKTRACE=1 to name)
//   leak-async leaves a block allocated on a stream of its own; prints
//              {"stream": the stream's handle, as the report names it}
//   static     frees a block from a static object's destructor, after main
//   fork       uses CUDA, then forks a child that exits without using it
//   fork-while-loading  a thread's first CUDA call loads the core (under a
//              slow one) while the main thread forks a child that exits at
//              once; prints {"child_exit_ms": how long the child took}
//   fork-reports N  forks N children (each exits at once) while another
//              thread has reports written over and over (SIGUSR1), with
//              blocks leaked from leak_here() for GPUPOOL_BACKTRACE=1 to name:
//              neither may wait on the other for good
//   signal R   raises SIGUSR1; the next CUDA call writes a report to R, which
//              this program then prints
//   signal-lent-again R  the same while it holds a block its thread's cache
//              lent again for 3.5 MiB (made for 4 MiB; thread caches on)
//   reset [HOW [LIBRARY]]  with a second thread's stream-ordered calls
//              (gpupool's thread caches on), frees a block on the legacy
//              stream, resets the device, and allocates there again: nothing
//              from before the reset may come back. HOW: cudaDeviceReset (the
//              default), thread-exit (CUDA 12's cudaThreadExit), or the
//              driver's cuDevicePrimaryCtxReset called directly
//              (driver-linked), fetched with dlsym from the driver
//              (driver-dlsym) or the global scope (driver-global), through
//              the driver's cuGetProcAddress (driver-proc-address), or by
//              LIBRARY (driver_lookup_module.c's lookup_in; driver-library)
//   driver-free HOW [LIBRARY]  frees blocks of cudaMalloc and cudaMallocAsync
//              (the first at the start of its segment) with the driver's
//              cuMemFree, reached as HOW says (as for reset, but not
//              thread-exit), and memory the driver allocated (cuMemAlloc);
//              a second free of a block is refused, and the runtime's last
//              error stays as it was. Then the device's memory is used again
//              while a block from before stays live: every block keeps its
//              bytes
//   driver-free-async HOW [LIBRARY]  the same with the driver's
//              cuMemFreeAsync and its per-thread version, reached as HOW
//              says: the cudaMalloc block freed on the per-thread default
//              stream, the cudaMallocAsync block written on a stream of its
//              own and freed there, and memory the driver allocated on that
//              stream (cuMemAllocAsync); first, a free of that block on a
//              stream the program destroyed is refused
//   reset-live with thread caches on, resets the device while a stream-ordered
//              block is live (one the thread's cache lent again, for a
//              request 512 KiB smaller than the one it was made for), then
//              frees that block stream-ordered: refused, as the reset freed
//              it (were it taken into a thread cache, the next allocation
//              would get memory the reset took)
//   reset-error  blocks live (a thread cache's lent again, a plain one, each
//              filled) and one kept in the thread's cache when the device is
//              reset under SIMCUDA_RESET_ERROR: refused, the blocks keep their
//              bytes and are freed; reset with an earlier launch's error, their
//              frees are refused as after any reset. Then new blocks are used.
//              Prints {"reset": the reset's answer}
//   trim [KEEP] with thread caches on, frees 8 blocks of 8 MiB on the legacy
//              stream, then, given KEEP, trims the device's default pool to
//              KEEP bytes; then allocates and uses a block
//   trace-written N [PAUSE_MS]  allocates N blocks of 512 bytes, (given
//              PAUSE_MS, sleeps that long,) frees them all, then prints
//              {"written": the size of GPUPOOL_TRACE's file now}
//   trace-interrupted N  the same, while another thread sends the main
//              thread a signal every 500 us (handled without SA_RESTART, so
//              that it interrupts a blocked write) from before the first CUDA
//              call to exit; prints {"signals": how many it handled so far}
//   chdir      makes its first CUDA call after changing directory
//   stderr-reused F [cuda-first]  closes descriptor 2 (if open), opens F,
//              which gets it, writes one line there and makes its first CUDA
//              calls (gpupool loads, and writes its lines at exit); with
//              cuda-first, the first cudaMalloc comes before (gpupool loads,
//              and opens GPUPOOL_TRACE, while descriptor 2 may be free). F
//              must hold only the program's line. Prints {"fd": F's descriptor}
//   stderr-piped  puts a pipe at descriptor 2 (as Jupyter's kernel does),
//              makes its first CUDA calls, and reads the pipe: prints
//              {"piped": whether gpupool's configuration line came through it}
//   ipc [HOW [LIBRARY]]  takes the IPC handles of two blocks, the second
//              inside a pooled segment, and of a pointer inside each; HOW:
//              cudaIpcGetMemHandle (the default) or the driver's
//              cuIpcGetMemHandle reached as for reset (not thread-exit).
//              Prints each call's result and the error cudaGetLastError
//              then reports, one line each
//   ipc-foreign  takes the IPC handle of memory gpupool does not own (from a
//              memory pool the program made), and of a pointer inside it:
//              the runtime's to judge. Prints each call's result as "ipc"
//   fault      holds a plain and a stream-ordered block when a kernel faults
//              (the simulated runtime's simcuda_fault_stream), then frees
//              both, synchronizes and allocates again; prints each call's
//              result as JSON and exits 0: a broken device must not crash or
//              hang the process
//   fault-release  frees a 40 MiB plain block, has a kernel fault, then asks
//              for 48 MiB: the pool, past its garbage collection threshold,
//              gives the idle block back with a cudaFree the faulted runtime
//              refuses. Prints the request's result as JSON and exits 0
//   remap      on a device of 4 pages (2 MiB each; SIMCUDA_MEMORY=8M) with
//              every unmap of gpupool's refused: holds 4 MiB of a memory pool
//              of its own (the runtime's, not gpupool's), asks gpupool for
//              6 MiB (the third page fails; the two just mapped stay mapped,
//              their undo refused), frees its own 4 MiB and asks for 6 MiB
//              again, which those two pages and one new one can serve. Prints
//              each request's result as JSON and exits 0
//   library LIB loads LIB, a library that fetches the driver's calls by name,
//              has it make 5 pairs of each kind and one block from the
//              default memory pool, then allocates one block through the
//              runtime
//   thread-exit  with thread caches on, a thread frees blocks from the
//              destructor of a thread_local made before its first CUDA call
//              (so run after gpupool's own thread-exit cleanup), then
//              allocates, fills, checks and frees one more there
//   driver LIB none|stream|alloc [fork]
//              loads LIB as the CUDA driver (as a program's own static
//              runtime would), then makes no CUDA call, only stream calls, or
//              an allocation through the shared runtime; with fork, a child
//              then exits without using CUDA
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <cuda.h>

#include "common.hpp"
#include "driver_ways.hpp"

// CUDA 12's old name of cudaDeviceReset, which CUDA 13's headers dropped (the
// simulated runtime has it, as CUDA 12's does). Weak: CUDA 13's static
// runtime, which nvcc links by default (scripts/gpu-check.sh), lacks it.
extern "C" cudaError_t cudaThreadExit(void) __attribute__((weak));
// The driver's per-thread cuMemFreeAsync, which cuda.h declares only to code
// built for the per-thread default stream (under the plain name).
extern "C" CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream);
// The driver's functions the driver-linked modes call, weak: the simulated
// runtime is the driver too and defines them, a real runtime does not, and
// this build runs on a real one in gpu-check (its other modes), where a
// strong reference would stop it at its start ("undefined symbol").
#pragma weak cuMemAlloc_v2
#pragma weak cuMemAllocAsync
#pragma weak cuMemFree_v2
#pragma weak cuMemFreeAsync
#pragma weak cuMemFreeAsync_ptsz
#pragma weak cuDevicePrimaryCtxReset_v2
#pragma weak cuIpcGetMemHandle

namespace {

struct FreedAtExit {
  void* p = nullptr;
  ~FreedAtExit() {
    if (p != nullptr) cudaFree(p);
  }
};
FreedAtExit g_static_block;
std::atomic<int> g_signals{0};

// A thread's blocks, freed in their stream's order when the thread ends;
// then one more block is allocated, filled and freed there.
struct FreedAtThreadExit {
  std::vector<void*> blocks;
  cudaStream_t stream = nullptr;
  ~FreedAtThreadExit() {
    for (void* p : blocks) {
      if (cudaFreeAsync(p, stream) != cudaSuccess) std::abort();
    }
    void* late = nullptr;
    if (cudaMallocAsync(&late, 8192, stream) != cudaSuccess) std::abort();
    if (cudaMemsetAsync(late, 0x5a, 8192, stream) != cudaSuccess) std::abort();
    if (cudaStreamSynchronize(stream) != cudaSuccess) std::abort();
    if (!testprog::holds(late, 8192, 0x5a)) std::abort();
    if (cudaFreeAsync(late, stream) != cudaSuccess) std::abort();
    if (cudaStreamSynchronize(stream) != cudaSuccess) std::abort();
  }
};

// A block asked for after a device reset, written and checked on the legacy
// stream, then freed: the memset fails on memory the reset took.
void use_after_reset(size_t size) {
  void* p = nullptr;
  CHECK_CUDA(cudaMallocAsync(&p, size, nullptr));
  CHECK_CUDA(cudaMemsetAsync(p, 7, size, nullptr));
  CHECK_CUDA(cudaStreamSynchronize(nullptr));
  EXPECT(testprog::holds_sampled(p, size, 7));
  CHECK_CUDA(cudaFreeAsync(p, nullptr));
}

using testprog::driver_function;

// The driver's cuIpcGetMemHandle as `how` says (see ipc below), or null.
using IpcGetMemHandle = CUresult (*)(CUipcMemHandle*, CUdeviceptr);
IpcGetMemHandle driver_ipc_handle_by(const std::string& how, const char* library) {
  if (how == "driver-linked") return &cuIpcGetMemHandle;
  return reinterpret_cast<IpcGetMemHandle>(driver_function(how, "cuIpcGetMemHandle", "cuIpcGetMemHandle", library));
}

const char* driver_result_name(CUresult r) {
  if (r == CUDA_SUCCESS) return "CUDA_SUCCESS";
  return r == CUDA_ERROR_INVALID_VALUE ? "CUDA_ERROR_INVALID_VALUE" : "another CUresult";
}

// Resets device 0 as `how` says (see reset above): true where it was reset.
bool reset_device_by(const std::string& how, const char* library) {
  if (how == "cudaDeviceReset") return cudaDeviceReset() == cudaSuccess;
  if (how == "thread-exit") return &cudaThreadExit != nullptr && cudaThreadExit() == cudaSuccess;
  if (how == "driver-linked") return cuDevicePrimaryCtxReset(0) == CUDA_SUCCESS;
  using Reset = CUresult (*)(CUdevice);
  auto reset = reinterpret_cast<Reset>(driver_function(how, "cuDevicePrimaryCtxReset_v2", "cuDevicePrimaryCtxReset",
                                                       library));
  return reset != nullptr && reset(0) == CUDA_SUCCESS;
}

// The driver's cuMemFree as `how` says (see driver-free above), or null.
using MemFree = CUresult (*)(CUdeviceptr);
MemFree driver_free_by(const std::string& how, const char* library) {
  if (how == "driver-linked") return &cuMemFree;
  return reinterpret_cast<MemFree>(driver_function(how, "cuMemFree_v2", "cuMemFree", library));
}

// The driver's cuMemFreeAsync, or its per-thread version (a null stream
// naming the per-thread default stream), as `how` says; or null.
using MemFreeAsync = CUresult (*)(CUdeviceptr, CUstream);
MemFreeAsync driver_free_async_by(const std::string& how, bool per_thread, const char* library) {
  if (how == "driver-linked") return per_thread ? &cuMemFreeAsync_ptsz : &cuMemFreeAsync;
  const char* name = per_thread ? "cuMemFreeAsync_ptsz" : "cuMemFreeAsync";
  const cuuint64_t flags = per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0;
  return reinterpret_cast<MemFreeAsync>(driver_function(how, name, "cuMemFreeAsync", library, flags));
}

CUdeviceptr device_pointer(void* p) { return reinterpret_cast<CUdeviceptr>(p); }

// What the driver frees: a cudaMalloc block (the first, at its segment's
// start) and a cudaMallocAsync block on `stream`; and one kept (0x3c) for
// used_again_beside.
struct ToFree {
  void* first = nullptr;
  void* async = nullptr;
  void* kept = nullptr;
};
ToFree lend_to_free(size_t size, cudaStream_t stream) {
  ToFree lent;
  CHECK_CUDA(cudaMalloc(&lent.first, size));
  CHECK_CUDA(cudaMallocAsync(&lent.async, size, stream));
  CHECK_CUDA(cudaMalloc(&lent.kept, size));
  CHECK_CUDA(cudaMemset(lent.kept, 0x3c, size));
  return lent;
}

// After the driver freed blocks: the device's memory lent again (eight
// blocks, each written) while `kept` stays live. Every block keeps its bytes
// (`kept` holds 0x3c), then all are freed.
void used_again_beside(void* kept, size_t size) {
  std::vector<void*> later(8);
  for (size_t i = 0; i < later.size(); ++i) {
    CHECK_CUDA(cudaMalloc(&later[i], size));
    CHECK_CUDA(cudaMemset(later[i], static_cast<int>(i + 1), size));
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  EXPECT(testprog::holds(kept, size, 0x3c));
  for (size_t i = 0; i < later.size(); ++i) EXPECT(testprog::holds(later[i], size, static_cast<unsigned char>(i + 1)));
  for (void* p : later) CHECK_CUDA(cudaFree(p));
  CHECK_CUDA(cudaFree(kept));
}

// A block this thread's cache lends again: made for `size` bytes on the legacy
// stream, freed into the cache (thread caches on), then asked for with
// 512 KiB less.
void* lent_again(size_t size) {
  void* first = nullptr;
  CHECK_CUDA(cudaMallocAsync(&first, size, nullptr));
  CHECK_CUDA(cudaFreeAsync(first, nullptr));
  void* again = nullptr;
  CHECK_CUDA(cudaMallocAsync(&again, size - (512 << 10), nullptr));
  EXPECT(again == first);
  return again;
}

}  // namespace

// Outside the anonymous namespace and exported, so that the report can name it.
__attribute__((noinline)) void* leak_here(size_t bytes) {
  void* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, bytes));
  return p;
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "leak-async") {
    cudaStream_t s = nullptr;
    CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    void* p = nullptr;
    CHECK_CUDA(cudaMallocAsync(&p, 1 << 20, s));
    CHECK_CUDA(cudaStreamSynchronize(s));
    std::printf("{\"stream\": \"%#llx\"}\n", static_cast<unsigned long long>(reinterpret_cast<std::uintptr_t>(s)));
    return 0;
  }
  if (mode == "leak") {
    for (size_t n : {size_t{1} << 20, size_t{3} << 20, size_t{5} << 10}) leak_here(n);
    void* freed = nullptr;
    CHECK_CUDA(cudaMalloc(&freed, 4096));
    CHECK_CUDA(cudaFree(freed));
    return 0;
  }
  if (mode == "static") {
    CHECK_CUDA(cudaMalloc(&g_static_block.p, 1 << 20));
    return 0;
  }
  if (mode == "fork") {
    void* p = nullptr;
    CHECK_CUDA(cudaMalloc(&p, 1 << 20));
    CHECK_CUDA(cudaFree(p));
    const pid_t child = fork();
    if (child == 0) std::exit(0);  // runs the child's exit handlers
    int status = 0;
    waitpid(child, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
  }
  if (mode == "fork-while-loading") {
    // Under a core that loads slowly (slow_core.c): a thread's first call
    // loads it while the main thread forks a child that exits at once.
    std::thread first([] {
      void* p = nullptr;
      CHECK_CUDA(cudaMalloc(&p, 4096));
      CHECK_CUDA(cudaFree(p));
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const auto start = std::chrono::steady_clock::now();
    const pid_t child = fork();
    if (child == 0) std::exit(0);  // the exit handlers, in a child without the loading thread
    int status = 0;
    waitpid(child, &status, 0);
    const auto waited = std::chrono::steady_clock::now() - start;
    first.join();
    std::printf("{\"child_exit_ms\": %lld}\n",
                static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(waited).count()));
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
  }
  if (mode == "fork-reports" && argc > 2) {
    for (size_t n : {size_t{1} << 20, size_t{3} << 20}) leak_here(n);
    std::atomic<bool> done{false};
    std::thread reporter([&] {
      while (!done.load()) {
        raise(SIGUSR1);  // the next call writes a report, naming the leaks' call site
        void* p = nullptr;
        CHECK_CUDA(cudaMalloc(&p, 4096));
        CHECK_CUDA(cudaFree(p));
      }
    });
    const int children = std::atoi(argv[2]);
    for (int i = 0; i < children; ++i) {
      const pid_t child = fork();
      if (child == 0) _exit(0);
      int status = 0;
      waitpid(child, &status, 0);
    }
    done.store(true);
    reporter.join();
    return 0;
  }
  if (mode == "signal" && argc > 2) {
    void* p = nullptr;
    CHECK_CUDA(cudaMalloc(&p, 1 << 20));  // held while the report is written
    const int printed = testprog::print_requested_report(argv[2]);
    CHECK_CUDA(cudaFree(p));
    return printed;
  }
  if (mode == "signal-lent-again" && argc > 2) {
    testprog::turn_thread_caches_on();
    void* held = lent_again(size_t{4} << 20);
    const int printed = testprog::print_requested_report(argv[2]);
    CHECK_CUDA(cudaFreeAsync(held, nullptr));
    CHECK_CUDA(cudaStreamSynchronize(nullptr));
    return printed;
  }
  if (mode == "reset") {
    testprog::turn_thread_caches_on();
    void* never_freed = nullptr;  // the reset frees it
    CHECK_CUDA(cudaMalloc(&never_freed, size_t{2} << 20));
    std::vector<void*> before;
    for (size_t size : {size_t{1} << 20, size_t{3} << 20}) {
      void* p = nullptr;
      CHECK_CUDA(cudaMallocAsync(&p, size, nullptr));
      before.push_back(p);
    }
    for (void* p : before) CHECK_CUDA(cudaFreeAsync(p, nullptr));  // kept for this thread's next requests
    EXPECT(reset_device_by(argc > 2 ? argv[2] : "cudaDeviceReset", argc > 3 ? argv[3] : nullptr));
    for (size_t size : {size_t{1} << 20, size_t{3} << 20}) use_after_reset(size);
    CHECK_CUDA(cudaStreamSynchronize(nullptr));
    std::printf("lifecycle: reset\n");
    return 0;
  }
  if (mode == "driver-free" && argc > 2) {
    const MemFree mem_free = driver_free_by(argv[2], argc > 3 ? argv[3] : nullptr);
    if (mem_free == nullptr) return 1;
    constexpr size_t kSize = size_t{1} << 20;
    const ToFree lent = lend_to_free(kSize, nullptr);
    CUdeviceptr drivers = 0;
    EXPECT(cuMemAlloc(&drivers, kSize) == CUDA_SUCCESS);
    CHECK_CUDA(cudaDeviceSynchronize());
    for (void* p : {lent.first, lent.async}) EXPECT(mem_free(device_pointer(p)) == CUDA_SUCCESS);
    EXPECT(mem_free(drivers) == CUDA_SUCCESS);
    EXPECT(mem_free(device_pointer(lent.first)) == CUDA_ERROR_INVALID_VALUE);
    EXPECT(cudaGetLastError() == cudaSuccess);
    used_again_beside(lent.kept, kSize);
    std::printf("lifecycle: driver-free\n");
    return 0;
  }
  if (mode == "driver-free-async" && argc > 2) {
    const char* library = argc > 3 ? argv[3] : nullptr;
    const MemFreeAsync free_async = driver_free_async_by(argv[2], false, library);
    const MemFreeAsync free_async_ptsz = driver_free_async_by(argv[2], true, library);
    if (free_async == nullptr || free_async_ptsz == nullptr) return 1;
    constexpr size_t kSize = size_t{1} << 20;
    cudaStream_t stream = nullptr;
    CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const auto s = reinterpret_cast<CUstream>(stream);
    const ToFree lent = lend_to_free(kSize, stream);
    CUdeviceptr drivers = 0;
    EXPECT(cuMemAllocAsync(&drivers, kSize, s) == CUDA_SUCCESS);
    CHECK_CUDA(cudaDeviceSynchronize());
    // A stream the program destroyed: the free is refused (an invalid handle,
    // as the driver answers), and the block stays allocated.
    cudaStream_t gone = nullptr;
    CHECK_CUDA(cudaStreamCreateWithFlags(&gone, cudaStreamNonBlocking));
    CHECK_CUDA(cudaStreamDestroy(gone));
    EXPECT(free_async(device_pointer(lent.async), reinterpret_cast<CUstream>(gone)) == CUDA_ERROR_INVALID_HANDLE);
    CHECK_CUDA(cudaMemsetAsync(lent.async, 0x5a, kSize, stream));  // work of its stream's before its free there
    EXPECT(free_async_ptsz(device_pointer(lent.first), nullptr) == CUDA_SUCCESS);
    EXPECT(free_async(device_pointer(lent.async), s) == CUDA_SUCCESS);
    EXPECT(free_async(drivers, s) == CUDA_SUCCESS);
    CHECK_CUDA(cudaDeviceSynchronize());  // the frees done, as a second free would find them
    EXPECT(free_async(device_pointer(lent.first), s) == CUDA_ERROR_INVALID_VALUE);
    EXPECT(cudaGetLastError() == cudaSuccess);
    used_again_beside(lent.kept, kSize);
    CHECK_CUDA(cudaStreamDestroy(stream));
    std::printf("lifecycle: driver-free-async\n");
    return 0;
  }
  if (mode == "reset-live") {
    testprog::turn_thread_caches_on();
    constexpr size_t kSize = size_t{4} << 20;
    void* held = lent_again(kSize);  // live at the reset, which frees it
    CHECK_CUDA(cudaStreamSynchronize(nullptr));
    CHECK_CUDA(cudaDeviceReset());
    EXPECT(cudaFreeAsync(held, nullptr) == cudaErrorInvalidValue);
    EXPECT(cudaGetLastError() == cudaErrorInvalidValue);
    use_after_reset(kSize);
    CHECK_CUDA(cudaStreamSynchronize(nullptr));
    std::printf("lifecycle: reset-live\n");
    return 0;
  }
  if (mode == "reset-error") {
    // SIMCUDA_RESET_ERROR says how the runtime answers the reset.
    testprog::turn_thread_caches_on();
    constexpr size_t kSize = size_t{4} << 20;
    void* held = lent_again(kSize);  // this thread's cache's
    void* plain = nullptr;
    CHECK_CUDA(cudaMalloc(&plain, size_t{2} << 20));
    CHECK_CUDA(cudaMemsetAsync(held, 0x3c, kSize - (512 << 10), nullptr));
    CHECK_CUDA(cudaMemsetAsync(plain, 0x4d, size_t{2} << 20, nullptr));
    void* kept = nullptr;  // kept in this thread's cache at the reset
    CHECK_CUDA(cudaMallocAsync(&kept, size_t{1} << 20, nullptr));
    CHECK_CUDA(cudaFreeAsync(kept, nullptr));
    CHECK_CUDA(cudaStreamSynchronize(nullptr));
    const cudaError_t reset = cudaDeviceReset();
    (void)cudaGetLastError();
    if (reset == cudaErrorNotPermitted) {
      // Nothing was reset: the blocks keep their bytes, and are freed as ever.
      EXPECT(testprog::holds_sampled(held, kSize - (512 << 10), 0x3c));
      EXPECT(testprog::holds_sampled(plain, size_t{2} << 20, 0x4d));
      CHECK_CUDA(cudaFreeAsync(held, nullptr));
      CHECK_CUDA(cudaFree(plain));
    } else {
      // Reset all the same: the blocks went with it.
      EXPECT(cudaFreeAsync(held, nullptr) == cudaErrorInvalidValue);
      EXPECT(cudaFree(plain) == cudaErrorInvalidValue);
      (void)cudaGetLastError();
    }
    use_after_reset(kSize);
    use_after_reset(size_t{1} << 20);
    CHECK_CUDA(cudaStreamSynchronize(nullptr));
    std::printf("{\"reset\": \"%s\"}\n", cudaGetErrorName(reset));
    return 0;
  }
  if (mode == "thread-exit") {
    testprog::turn_thread_caches_on();
    cudaStream_t stream = nullptr;
    CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    std::thread([stream] {
      thread_local FreedAtThreadExit mine;  // made now, before this thread's first CUDA call
      mine.stream = stream;
      for (size_t size : {size_t{4096}, size_t{1} << 20}) {
        void* p = nullptr;
        CHECK_CUDA(cudaMallocAsync(&p, size, stream));
        mine.blocks.push_back(p);
      }
      void* kept = nullptr;  // one block in this thread's cache when it ends
      CHECK_CUDA(cudaMallocAsync(&kept, 8192, stream));
      CHECK_CUDA(cudaFreeAsync(kept, stream));
    }).join();
    CHECK_CUDA(cudaStreamDestroy(stream));
    std::printf("lifecycle: thread-exit\n");
    return 0;
  }
  if (mode == "trim") {
    testprog::turn_thread_caches_on();
    std::vector<void*> blocks(8);
    for (void*& p : blocks) CHECK_CUDA(cudaMallocAsync(&p, size_t{8} << 20, nullptr));
    for (void* p : blocks) CHECK_CUDA(cudaFreeAsync(p, nullptr));  // kept for this thread's next requests
    CHECK_CUDA(cudaStreamSynchronize(nullptr));
    if (argc > 2) {
      cudaMemPool_t pool = nullptr;
      CHECK_CUDA(cudaDeviceGetDefaultMemPool(&pool, 0));
      CHECK_CUDA(cudaMemPoolTrimTo(pool, std::strtoull(argv[2], nullptr, 10)));
    }
    // Memory is still there to use after a trim.
    void* p = nullptr;
    CHECK_CUDA(cudaMalloc(&p, size_t{1} << 20));
    CHECK_CUDA(cudaMemset(p, 3, size_t{1} << 20));
    EXPECT(testprog::holds_sampled(p, size_t{1} << 20, 3));
    CHECK_CUDA(cudaFree(p));
    std::printf("lifecycle: trim\n");
    return 0;
  }
  if (mode == "trace-written" && argc > 2) {
    std::vector<void*> blocks(std::strtoul(argv[2], nullptr, 10));
    for (void*& p : blocks) CHECK_CUDA(cudaMalloc(&p, 512));
    if (argc > 3) std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(argv[3])));
    for (void* p : blocks) CHECK_CUDA(cudaFree(p));
    const char* trace = std::getenv("GPUPOOL_TRACE");
    struct stat st {};
    EXPECT(trace != nullptr && stat(trace, &st) == 0);
    std::printf("{\"written\": %lld}\n", static_cast<long long>(st.st_size));
    return 0;
  }
  if (mode == "trace-interrupted" && argc > 2) {
    struct sigaction counting {};
    counting.sa_handler = [](int) { g_signals.fetch_add(1, std::memory_order_relaxed); };
    sigemptyset(&counting.sa_mask);
    counting.sa_flags = 0;  // no SA_RESTART
    EXPECT(sigaction(SIGALRM, &counting, nullptr) == 0);
    std::thread([main_thread = pthread_self()] {
      for (;;) {  // until the process ends, through gpupool's flush at exit
        pthread_kill(main_thread, SIGALRM);
        usleep(500);
      }
    }).detach();
    std::vector<void*> blocks(std::strtoul(argv[2], nullptr, 10));
    for (void*& p : blocks) CHECK_CUDA(cudaMalloc(&p, 512));
    for (void* p : blocks) CHECK_CUDA(cudaFree(p));
    std::printf("{\"signals\": %d}\n", g_signals.load());
    return 0;
  }
  if (mode == "stderr-reused" && argc > 2) {
    const bool cuda_first = argc > 3 && std::string(argv[3]) == "cuda-first";
    void* p = nullptr;
    if (cuda_first) CHECK_CUDA(cudaMalloc(&p, 1 << 20));
    close(STDERR_FILENO);
    const int fd = open(argv[2], O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const char line[] = "the program's own line\n";
    if (fd < 0 || write(fd, line, sizeof line - 1) != static_cast<ssize_t>(sizeof line - 1)) return 1;
    if (!cuda_first) CHECK_CUDA(cudaMalloc(&p, 1 << 20));
    CHECK_CUDA(cudaFree(p));
    std::printf("{\"fd\": %d}\n", fd);
    return 0;
  }
  if (mode == "stderr-piped") {
    int fds[2];
    if (pipe(fds) != 0 || dup2(fds[1], STDERR_FILENO) < 0) return 1;
    void* p = nullptr;
    CHECK_CUDA(cudaMalloc(&p, 1 << 20));
    CHECK_CUDA(cudaFree(p));
    if (fcntl(fds[0], F_SETFL, O_NONBLOCK) != 0) return 1;
    char got[4096];
    const ssize_t n = read(fds[0], got, sizeof got - 1);
    got[n > 0 ? n : 0] = '\0';
    std::printf("{\"piped\": %s}\n", std::strstr(got, "unknown key") != nullptr ? "true" : "false");
    return 0;
  }
  if (mode == "chdir") {
    // The first CUDA call comes after the working directory changed.
    if (chdir("/") != 0) return 1;
    void* p = nullptr;
    CHECK_CUDA(cudaMalloc(&p, 1 << 20));
    CHECK_CUDA(cudaFree(p));
    return 0;
  }
  if (mode == "ipc") {
    // Under gpupool the second block lies inside a segment: a handle would map
    // the segment's start in the other process (in an expandable segment,
    // neither block can be exported). A pointer inside a block is judged by
    // its block.
    const std::string how = argc > 2 ? argv[2] : "cudaIpcGetMemHandle";
    const bool runtimes = how == "cudaIpcGetMemHandle";
    const IpcGetMemHandle driver_get = runtimes ? nullptr : driver_ipc_handle_by(how, argc > 3 ? argv[3] : nullptr);
    if (!runtimes && driver_get == nullptr) return 1;
    void* first = nullptr;
    void* second = nullptr;
    CHECK_CUDA(cudaMalloc(&first, 4096));
    CHECK_CUDA(cudaMalloc(&second, 4096));
    for (void* p : {first, second, static_cast<void*>(static_cast<char*>(first) + 512),
                    static_cast<void*>(static_cast<char*>(second) + 512)}) {
      if (driver_get != nullptr) {
        CUipcMemHandle handle;
        const CUresult r = driver_get(&handle, device_pointer(p));
        std::printf("cuIpcGetMemHandle: %s, then %s\n", driver_result_name(r), cudaGetErrorName(cudaGetLastError()));
        continue;
      }
      cudaIpcMemHandle_t handle;
      const cudaError_t e = cudaIpcGetMemHandle(&handle, p);
      std::printf("cudaIpcGetMemHandle: %s, then %s\n", cudaGetErrorName(e), cudaGetErrorName(cudaGetLastError()));
    }
    CHECK_CUDA(cudaFree(second));
    CHECK_CUDA(cudaFree(first));
    return 0;
  }
  if (mode == "ipc-foreign") {
    cudaMemPool_t own_pool = testprog::new_device_pool(0);
    void* foreign = nullptr;
    CHECK_CUDA(cudaMallocFromPoolAsync(&foreign, 1 << 20, own_pool, nullptr));
    CHECK_CUDA(cudaStreamSynchronize(nullptr));
    for (void* p : {foreign, static_cast<void*>(static_cast<char*>(foreign) + 512)}) {
      cudaIpcMemHandle_t handle;
      const cudaError_t e = cudaIpcGetMemHandle(&handle, p);
      std::printf("cudaIpcGetMemHandle: %s, then %s\n", cudaGetErrorName(e), cudaGetErrorName(cudaGetLastError()));
    }
    CHECK_CUDA(cudaFreeAsync(foreign, nullptr));
    CHECK_CUDA(cudaStreamSynchronize(nullptr));
    CHECK_CUDA(cudaMemPoolDestroy(own_pool));
    return 0;
  }
  if (mode == "remap") {
    cudaMemPool_t own = testprog::new_device_pool(0);
    void* held = nullptr;
    CHECK_CUDA(cudaMallocFromPoolAsync(&held, 4 << 20, own, nullptr));
    CHECK_CUDA(cudaStreamSynchronize(nullptr));
    void* first = nullptr;
    const cudaError_t first_err = cudaMalloc(&first, 6 << 20);
    if (first_err == cudaSuccess) CHECK_CUDA(cudaFree(first));
    CHECK_CUDA(cudaFreeAsync(held, nullptr));
    CHECK_CUDA(cudaStreamSynchronize(nullptr));
    void* again = nullptr;
    const cudaError_t again_err = cudaMalloc(&again, 6 << 20);
    if (again_err == cudaSuccess) {
      CHECK_CUDA(cudaMemset(again, 0x5a, 6 << 20));
      CHECK_CUDA(cudaFree(again));
    }
    std::printf("{\"first\": \"%s\", \"again\": \"%s\"}\n", cudaGetErrorName(first_err),
                cudaGetErrorName(again_err));
    return 0;
  }
  if (mode == "fault-release") {
    const auto fault = reinterpret_cast<void (*)(void*, int)>(dlsym(RTLD_DEFAULT, "simcuda_fault_stream"));
    if (fault == nullptr) return 77;
    void* idle = nullptr;
    CHECK_CUDA(cudaMalloc(&idle, 40 << 20));
    CHECK_CUDA(cudaFree(idle));
    fault(nullptr, cudaErrorIllegalAddress);
    void* more = nullptr;
    const cudaError_t err = cudaMalloc(&more, 48 << 20);
    std::printf("{\"cudaMalloc\": \"%s\"}\n", cudaGetErrorName(err));
    return 0;
  }
  if (mode == "fault") {
    const auto fault = reinterpret_cast<void (*)(void*, int)>(dlsym(RTLD_DEFAULT, "simcuda_fault_stream"));
    if (fault == nullptr) return 77;  // a real runtime: no simulated faults
    cudaStream_t stream = nullptr;
    CHECK_CUDA(cudaStreamCreate(&stream));
    void* plain = nullptr;
    void* ordered = nullptr;
    CHECK_CUDA(cudaMalloc(&plain, 1 << 20));
    CHECK_CUDA(cudaMallocAsync(&ordered, 1 << 20, stream));
    fault(stream, cudaErrorIllegalAddress);
    const cudaError_t free_plain = cudaFree(plain);
    const cudaError_t free_ordered = cudaFreeAsync(ordered, stream);
    const cudaError_t sync = cudaDeviceSynchronize();
    void* again = nullptr;
    const cudaError_t malloc_again = cudaMalloc(&again, 1 << 20);
    if (malloc_again == cudaSuccess) cudaFree(again);
    const cudaError_t last = cudaGetLastError();
    std::printf("{\"cudaFree\": \"%s\", \"cudaFreeAsync\": \"%s\", \"cudaDeviceSynchronize\": \"%s\", "
                "\"cudaMalloc\": \"%s\", \"cudaGetLastError\": \"%s\"}\n",
                cudaGetErrorName(free_plain), cudaGetErrorName(free_ordered), cudaGetErrorName(sync),
                cudaGetErrorName(malloc_again), cudaGetErrorName(last));
    return 0;
  }
  if (mode == "library" && argc > 2) {
    void* module = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
    auto by_name = module != nullptr ? reinterpret_cast<int (*)(int)>(dlsym(module, "library_by_name")) : nullptr;
    EXPECT(by_name != nullptr && by_name(5) == 0);
    void* p = nullptr;
    CHECK_CUDA(cudaMalloc(&p, 4096));
    CHECK_CUDA(cudaFree(p));
    std::printf("lifecycle: library\n");
    return 0;
  }
  if (mode == "driver" && argc > 3) {
    if (dlopen(argv[2], RTLD_NOW | RTLD_GLOBAL) == nullptr) {
      std::fprintf(stderr, "lifecycle: cannot load %s: %s\n", argv[2], dlerror());
      return 1;
    }
    const std::string use = argv[3];
    if (use == "stream") {
      cudaStream_t stream = nullptr;
      CHECK_CUDA(cudaStreamCreate(&stream));
      CHECK_CUDA(cudaStreamDestroy(stream));
    } else if (use == "alloc") {
      void* p = nullptr;
      CHECK_CUDA(cudaMalloc(&p, 1 << 20));
      CHECK_CUDA(cudaFree(p));
    }
    if (argc > 4 && std::string(argv[4]) == "fork") {
      const pid_t child = fork();
      if (child == 0) std::exit(0);
      int status = 0;
      waitpid(child, &status, 0);
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return 1;
    }
    return 0;
  }
  std::fprintf(stderr,
               "usage: lifecycle leak|leak-async|static|fork|reset|reset-live|reset-error|chdir|ipc|ipc-foreign|signal[-lent-again] REPORT|driver LIB USE [fork]\n");
  return 64;
}
