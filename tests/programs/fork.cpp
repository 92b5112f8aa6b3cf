// A CUDA program that forks, one mode per run:
//   handlers   uses CUDA (plain and stream-ordered calls, a stream of its
//              own, thread caches on, every device), then forks; prints as JSON how many
//              heap calls (malloc, free and kin) the child made before fork()
//              returned in it, that is in the fork handlers. Another thread
//              may hold an allocator's lock at the fork, so they must make
//              none. Under a sanitizer, whose allocator this program cannot
//              wrap, prints {"skipped": true}.
//   child-uses-cuda  with thread caches on (a second thread's pair of 512
//              bytes), makes a plain pair of 1 MiB and a stream-ordered pair
//              of 3 MiB twice, waits 1.5 s, forks a child that makes a plain pair of 2 MiB and a
//              stream-ordered pair of 4 MiB on the parent's stream (the
//              simulated runtime lets it), and waits for it
//   message-at-fork  forks while another thread is held inside a line
//              gpupool writes (stderr is a full pipe, drained only from
//              300 ms on); the child has gpupool write a line too, which
//              must not wait for good (the child is given 10 s)
//   flush-at-fork  forks while a thread holds device 0's pool lock inside
//              its out-of-memory line (stderr as above), and a thread
//              flushing the threads' caches (a trim) comes to wait for that
//              lock after fork's handler; the child's report at exit
//              flushes the caches too, and must not wait for good
//   reset-in-child  forks 40 times while another thread's stream-ordered
//              pairs are served by its thread's cache; each child allocates
//              and resets the device (cudaDeviceReset), which must not wait
//              for a lock of gpupool's table of live blocks (each child is
//              given 10 s)
#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common.hpp"

#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define COUNTS_HEAP_CALLS 1
// This program's heap calls, glibc's underneath: each counts while armed in
// a process other than the one that armed it (the child, until fork returns).
extern "C" {
void* __libc_malloc(size_t);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);
void __libc_free(void*);
}

namespace {
std::atomic<long> g_armed_by{0};  // the pid that armed the count; 0: off
std::atomic<int> g_child_heap_calls{0};

void count_heap_call() {
  const long armed_by = g_armed_by.load(std::memory_order_relaxed);
  if (armed_by != 0 && syscall(SYS_getpid) != armed_by) g_child_heap_calls.fetch_add(1);
}
}  // namespace

extern "C" {
void* malloc(size_t n) {
  count_heap_call();
  return __libc_malloc(n);
}
void* calloc(size_t n, size_t size) {
  count_heap_call();
  return __libc_calloc(n, size);
}
void* realloc(void* p, size_t n) {
  count_heap_call();
  return __libc_realloc(p, n);
}
void free(void* p) {
  if (p != nullptr) count_heap_call();
  __libc_free(p);
}
void* memalign(size_t alignment, size_t n) {
  count_heap_call();
  return __libc_memalign(alignment, n);
}
void* aligned_alloc(size_t alignment, size_t n) {
  count_heap_call();
  return __libc_memalign(alignment, n);
}
int posix_memalign(void** out, size_t alignment, size_t n) {
  count_heap_call();
  void* p = __libc_memalign(alignment, n);
  if (p == nullptr) return ENOMEM;
  *out = p;
  return 0;
}
}
#endif

namespace {

// A child may use the simulated runtime only if none of its stream threads
// held its lock at the fork (it has no fork handlers; on real CUDA any use
// in such a child is undefined). Waiting for the device leaves them idle.
void idle_streams_before_fork() { CHECK_CUDA(cudaDeviceSynchronize()); }

void use_cuda(size_t plain_bytes, size_t ordered_bytes, cudaStream_t stream) {
  void* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, plain_bytes));
  CHECK_CUDA(cudaFree(p));
  CHECK_CUDA(cudaMallocAsync(&p, ordered_bytes, stream));
  CHECK_CUDA(cudaFreeAsync(p, stream));
}

int wait_for(pid_t child) {
  int status = 0;
  if (waitpid(child, &status, 0) != child || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

// A second cudaFree of a block: gpupool says so in a line on stderr, with
// none of its other locks held.
void free_twice() {
  void* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, 4096));
  CHECK_CUDA(cudaFree(p));
  if (cudaFree(p) == cudaSuccess) std::_Exit(3);
}

// Forks while threads that `hold` starts are kept waiting inside gpupool
// behind a line it writes: stderr is a full pipe until 300 ms after the fork
// began. The child runs `in_child` (which ends it) and must finish within
// 10 s; prints {"child_finished": ...}.
template <typename Hold, typename InChild>
int fork_while_held(Hold&& hold, InChild&& in_child) {
  const int saved_stderr = dup(2);
  int pipe_fds[2];
  if (saved_stderr < 0 || pipe(pipe_fds) != 0) return 1;
  const auto say = [saved_stderr](const char* line) { (void)!write(saved_stderr, line, std::strlen(line)); };
  // Fill the pipe: the next line written to stderr waits for a reader.
  fcntl(pipe_fds[1], F_SETFL, O_NONBLOCK);
  static char filler[4096];
  std::memset(filler, '.', sizeof filler);
  while (write(pipe_fds[1], filler, sizeof filler) > 0) {
  }
  fcntl(pipe_fds[1], F_SETFL, 0);
  CHECK_CUDA(cudaFree(nullptr));  // gpupool and the device start before stderr is the pipe
  idle_streams_before_fork();
  dup2(pipe_fds[1], 2);
  std::vector<std::thread> held = hold();
  std::thread drainer([fd = pipe_fds[0]] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    char buffer[4096];
    while (read(fd, buffer, sizeof buffer) > 0) {
    }
  });
  const pid_t child = fork();
  if (child == 0) in_child();
  int status = -1;
  for (int waited_ms = 0; waited_ms < 10000; waited_ms += 10) {
    if (waitpid(child, &status, WNOHANG) == child) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const bool hung = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  if (hung) {
    kill(child, SIGKILL);
    waitpid(child, &status, 0);
  }
  for (std::thread& t : held) t.join();
  dup2(saved_stderr, 2);
  close(pipe_fds[1]);
  drainer.join();
  close(pipe_fds[0]);
  if (hung) say("fork: the child did not finish\n");
  std::printf("{\"child_finished\": %s}\n", hung ? "false" : "true");
  return 0;
}

int message_at_fork() {
  return fork_while_held(
      [] {
        std::vector<std::thread> held;
        held.emplace_back(free_twice);  // held in gpupool's line
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        return held;
      },
      [] {
        free_twice();
        _exit(0);
      });
}

int flush_at_fork() {
  testprog::turn_thread_caches_on();
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaMemPool_t pool = nullptr;
  CHECK_CUDA(cudaDeviceGetDefaultMemPool(&pool, 0));
  CHECK_CUDA(cudaMemPoolTrimTo(pool, 0));  // gpupool learns which pool is the default one
  void* block = nullptr;
  CHECK_CUDA(cudaMallocAsync(&block, 1 << 20, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  return fork_while_held(
      [&] {
        std::vector<std::thread> held;
        // Held in its out-of-memory line with device 0's pool lock.
        held.emplace_back([] {
          void* p = nullptr;
          if (cudaMallocAsync(&p, size_t{1} << 50, cudaStreamPerThread) == cudaSuccess) std::_Exit(3);
          cudaGetLastError();
        });
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        // Keeps the block in its thread's cache now; 100 ms into the fork,
        // once fork's handler waits for that pool lock, trims: the flush of
        // the caches takes their flush lock, then waits for the pool lock
        // behind the handler, which gets it first.
        held.emplace_back([&] {
          CHECK_CUDA(cudaFreeAsync(block, stream));
          std::this_thread::sleep_for(std::chrono::milliseconds(150));
          CHECK_CUDA(cudaMemPoolTrimTo(pool, 0));
        });
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        return held;
      },
      [] {
        // Its report at exit flushes the caches (none in the child).
        use_cuda(2 << 20, 4 << 20, cudaStreamPerThread);
        std::exit(0);
      });
}

// Forks 40 times while another thread makes stream-ordered pairs served by
// its thread's cache (each takes and gives back a lock of gpupool's table of
// live blocks); each child allocates and resets the device, which must not
// wait for a lock of that table. Prints how many children finished in 10 s.
int reset_in_child() {
  testprog::turn_thread_caches_on();
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::atomic<bool> stop{false};
  std::atomic<bool> warm{false};
  std::thread pairs([&] {
    void* p = nullptr;
    for (long i = 0; !stop.load(std::memory_order_relaxed); ++i) {
      CHECK_CUDA(cudaMallocAsync(&p, 4096 << (i % 4), stream));
      CHECK_CUDA(cudaFreeAsync(p, stream));
      if (i == 16) warm.store(true);
    }
  });
  while (!warm.load()) std::this_thread::yield();
  int finished = 0;
  for (int i = 0; i < 40; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const pid_t child = fork();
    if (child == 0) {
      void* p = nullptr;
      CHECK_CUDA(cudaMalloc(&p, 1 << 20));
      CHECK_CUDA(cudaFree(p));
      CHECK_CUDA(cudaDeviceReset());
      _exit(0);
    }
    int status = -1;
    for (int waited_ms = 0; waited_ms < 10000; waited_ms += 5) {
      if (waitpid(child, &status, WNOHANG) == child) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      ++finished;
    } else {
      kill(child, SIGKILL);
      waitpid(child, &status, 0);
    }
  }
  stop.store(true);
  pairs.join();
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_CUDA(cudaStreamDestroy(stream));
  std::printf("{\"children_finished\": %d}\n", finished);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "handlers") {
#ifdef COUNTS_HEAP_CALLS
    testprog::turn_thread_caches_on();
    cudaStream_t stream = nullptr;
    CHECK_CUDA(cudaStreamCreate(&stream));
    use_cuda(1 << 20, 3 << 20, stream);
    use_cuda(1 << 20, 3 << 20, cudaStreamPerThread);
    CHECK_CUDA(cudaDeviceSynchronize());
    int devices = 0;
    CHECK_CUDA(cudaGetDeviceCount(&devices));
    for (int device = 1; device < devices; ++device) {  // a pool on each device for the child to set aside
      CHECK_CUDA(cudaSetDevice(device));
      use_cuda(1 << 20, 3 << 20, cudaStreamPerThread);
      CHECK_CUDA(cudaDeviceSynchronize());
    }
    CHECK_CUDA(cudaSetDevice(0));
    g_armed_by.store(syscall(SYS_getpid));
    const pid_t child = fork();
    if (child == 0) {
      const int calls = g_child_heap_calls.load();
      g_armed_by.store(0);
      _exit(calls < 100 ? calls : 100);
    }
    g_armed_by.store(0);
    std::printf("{\"child_heap_calls\": %d}\n", wait_for(child));
    CHECK_CUDA(cudaStreamDestroy(stream));
#else
    std::printf("{\"skipped\": true}\n");
#endif
    return 0;
  }
  if (mode == "child-uses-cuda") {
    testprog::turn_thread_caches_on();  // the parent's blocks and counts in threads' caches are the parent's
    cudaStream_t stream = nullptr;
    CHECK_CUDA(cudaStreamCreate(&stream));
    for (int i = 0; i < 2; ++i) use_cuda(1 << 20, 3 << 20, stream);  // the second pairs are cache hits
    idle_streams_before_fork();
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // the parent's run is 1.5 s longer
    const pid_t child = fork();
    if (child == 0) {
      use_cuda(2 << 20, 4 << 20, stream);
      std::exit(0);  // runs the child's exit handlers: its trace and report
    }
    EXPECT(wait_for(child) == 0);
    CHECK_CUDA(cudaStreamDestroy(stream));
    return 0;
  }
  if (mode == "message-at-fork") return message_at_fork();
  if (mode == "flush-at-fork") return flush_at_fork();
  if (mode == "reset-in-child") return reset_in_child();
  std::fprintf(stderr, "usage: fork handlers|child-uses-cuda|message-at-fork|flush-at-fork|reset-in-child\n");
  return 64;
}
