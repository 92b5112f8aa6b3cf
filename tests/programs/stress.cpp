// Threads on two devices (or one, where there is one) doing everything at random: plain and stream-ordered
// allocations on the legacy, per-thread, a blocking and a non-blocking stream
// of either device; each block written on a stream of its device and, just
// before it is freed, written again by the stream that frees it (ordered after
// the first write by an event), so that work is still queued when the free
// returns (run with SIMCUDA_OP_DELAY_US). Some frees go on the other device's
// stream, some with plain cudaFree, some through the driver (cuMemFree,
// cuMemFreeAsync: CUDA lets either API free what the other allocated);
// non-blocking streams are destroyed and
// made anew (half with a priority, as PyTorch makes its side streams); now
// and then a stream captures while the other threads go on. A
// pool that hands a block out before its last use is done, or
// overlaps two blocks, or gives a device another's memory, breaks a pattern
// or a check: every live block is read back whenever the threads meet.
//   stress [threads] [rounds] [operations per round] [seed]
#include <atomic>
#include <barrier>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include <cuda.h>

#include "common.hpp"
#include "driver_ways.hpp"

namespace {

constexpr int kMaxDevices = 2;
int devices = kMaxDevices;  // as many as there are, up to two

struct Block {
  size_t size;
  unsigned char tag;
  int device;
  cudaStream_t writer;  // the stream of its last write
};

// Every live block of every thread: no two may overlap. Never destroyed: a
// failed check exits while the other threads still run.
std::mutex& ranges_mu = *new std::mutex;
std::map<char*, size_t>& ranges = *new std::map<char*, size_t>;
std::atomic<long long> allocations{0}, frees{0}, refused{0}, captures{0};

// The driver's frees, looked up in the driver as a program that loads it
// does (the runtime loads it too; this program is not linked with it, so
// that on a GPU it finds the real driver, not this build's simulated one).
// Built for the per-thread default stream, the per-thread stream-ordered
// free, as cuda.h would name it.
struct DriverFrees {
  CUresult (*free)(CUdeviceptr) = nullptr;
  CUresult (*free_async)(CUdeviceptr, CUstream) = nullptr;
};
const DriverFrees& driver_frees() {
  static const DriverFrees found = [] {
    DriverFrees f;
#ifdef CUDA_API_PER_THREAD_DEFAULT_STREAM
    const char* free_async = "cuMemFreeAsync_ptsz";
#else
    const char* free_async = "cuMemFreeAsync";
#endif
    f.free = reinterpret_cast<decltype(f.free)>(
        testprog::driver_function("driver-dlsym", "cuMemFree_v2", "cuMemFree", nullptr));
    f.free_async = reinterpret_cast<decltype(f.free_async)>(
        testprog::driver_function("driver-dlsym", free_async, "cuMemFreeAsync", nullptr));
    EXPECT(f.free != nullptr && f.free_async != nullptr);
    return f;
  }();
  return found;
}

void add_range(void* p, size_t size) {
  std::lock_guard<std::mutex> lock(ranges_mu);
  auto* c = static_cast<char*>(p);
  auto next = ranges.lower_bound(c);
  EXPECT(next == ranges.end() || c + size <= next->first);
  if (next != ranges.begin()) EXPECT(std::prev(next)->first + std::prev(next)->second <= c);
  ranges.emplace(c, size);
}

void remove_range(void* p) {
  std::lock_guard<std::mutex> lock(ranges_mu);
  ranges.erase(static_cast<char*>(p));
}

class Worker {
 public:
  Worker(int index, std::uint64_t seed) : index_(index), rng_(seed) {
    for (int d = 0; d < devices; ++d) {
      CHECK_CUDA(cudaSetDevice(d));
      CHECK_CUDA(cudaStreamCreate(&blocking_[d]));
      CHECK_CUDA(cudaStreamCreateWithFlags(&nonblocking_[d], cudaStreamNonBlocking));
      CHECK_CUDA(cudaEventCreateWithFlags(&event_[d], cudaEventDisableTiming));
    }
  }

  void step() {
    const unsigned r = static_cast<unsigned>(rng_() % 100);
    if (r < 2) {
      renew_stream(static_cast<int>(rng_() % devices));
    } else if (r < 3) {
      capture(static_cast<int>(rng_() % devices));
    } else if (live_.empty() || (r < 55 && live_.size() < 60)) {
      allocate();
    } else {
      release(std::next(live_.begin(), static_cast<long>(rng_() % live_.size())));
    }
  }

  // All threads have synchronized every device: every block must hold its tag.
  void check() const {
    for (const auto& [p, b] : live_) {
      CHECK_CUDA(cudaSetDevice(b.device));
      if (!testprog::holds_sampled(p, b.size, b.tag)) {
        std::fprintf(stderr, "stress: thread %d: block %p (%zu bytes, device %d) lost its pattern %u\n", index_, p,
                     b.size, b.device, b.tag);
        std::exit(1);
      }
    }
  }

  void finish() {
    for (auto it = live_.begin(); it != live_.end();) release(it++);
    for (int d = 0; d < devices; ++d) {
      CHECK_CUDA(cudaSetDevice(d));
      CHECK_CUDA(cudaStreamSynchronize(blocking_[d]));
      CHECK_CUDA(cudaStreamSynchronize(nonblocking_[d]));
      CHECK_CUDA(cudaStreamDestroy(blocking_[d]));
      CHECK_CUDA(cudaStreamDestroy(nonblocking_[d]));
      CHECK_CUDA(cudaEventDestroy(event_[d]));
    }
  }

 private:
  // A stream of device d (the current device must be d for the first two).
  cudaStream_t any_stream(int d) {
    switch (rng_() % 4) {
      case 0: return nullptr;
      case 1: return cudaStreamPerThread;
      case 2: return blocking_[d];
      default: return nonblocking_[d];
    }
  }

  size_t any_size() {
    const unsigned r = static_cast<unsigned>(rng_() % 100);
    return r < 50 ? 1 + rng_() % 8192 : r < 90 ? 8192 + rng_() % (2 << 20) : (2 << 20) + rng_() % (16 << 20);
  }

  void allocate() {
    const int d = static_cast<int>(rng_() % devices);
    CHECK_CUDA(cudaSetDevice(d));
    const size_t size = any_size();
    const bool plain = rng_() % 3 == 0;
    cudaStream_t s = any_stream(d);
    void* p = nullptr;
    const cudaError_t err = plain ? cudaMalloc(&p, size) : cudaMallocAsync(&p, size, s);
    if (err == cudaErrorMemoryAllocation) {  // under the memory limit: free something next
      EXPECT(cudaGetLastError() == err);
      ++refused;
      return;
    }
    CHECK_CUDA(err);
    cudaPointerAttributes a{};
    CHECK_CUDA(cudaPointerGetAttributes(&a, p));
    EXPECT(a.type == cudaMemoryTypeDevice && a.device == d);
    add_range(p, size);
    const auto tag = static_cast<unsigned char>(1 + rng_() % 250);
    CHECK_CUDA(cudaMemsetAsync(p, tag, size, s));
    live_.emplace(p, Block{size, tag, d, s});
    ++allocations;
  }

  void release(std::map<void*, Block>::iterator it) {
    void* p = it->first;
    const Block b = it->second;
    CHECK_CUDA(cudaSetDevice(b.device));
    const unsigned how = static_cast<unsigned>(rng_() % 8);
    if (how == 0) {
      // Plain cudaFree right after a last write still queued on the writer.
      CHECK_CUDA(cudaMemsetAsync(p, b.tag, b.size, b.writer));
      remove_range(p);
      if (rng_() % 2 == 0) {
        CHECK_CUDA(cudaFree(p));
      } else {
        EXPECT(driver_frees().free(reinterpret_cast<CUdeviceptr>(p)) == CUDA_SUCCESS);
      }
    } else {
      // Stream-ordered, on a stream of its device or (1 in 7) of the other
      // one, after a last write there ordered after the writer's.
      int fd = b.device;
      if (how == 1 && devices == 2) fd = 1 - b.device;
      CHECK_CUDA(cudaEventRecord(event_[b.device], b.writer));
      CHECK_CUDA(cudaSetDevice(fd));
      cudaStream_t f = any_stream(fd);
      CHECK_CUDA(cudaStreamWaitEvent(f, event_[b.device], 0));
      CHECK_CUDA(cudaMemsetAsync(p, b.tag, b.size < 4096 ? b.size : 4096, f));
      remove_range(p);
      if (how == 2) {
        const auto stream = reinterpret_cast<CUstream>(f);
        EXPECT(driver_frees().free_async(reinterpret_cast<CUdeviceptr>(p), stream) == CUDA_SUCCESS);
      } else {
        CHECK_CUDA(cudaFreeAsync(p, f));
      }
    }
    live_.erase(it);
    ++frees;
  }

  // A capture on the non-blocking stream while the other threads go on: an
  // allocation inside it is the runtime's (a graph node), and a pooled block
  // freed inside it is the graph's from then on. Nothing may break it.
  void capture(int d) {
    CHECK_CUDA(cudaSetDevice(d));
    cudaStream_t s = nonblocking_[d];
    auto victim = live_.end();
    for (auto it = live_.begin(); it != live_.end(); ++it) {
      if (it->second.device == d) victim = it;
    }
    if (victim != live_.end()) {  // its writes before the capture's work
      CHECK_CUDA(cudaEventRecord(event_[d], victim->second.writer));
      CHECK_CUDA(cudaStreamWaitEvent(s, event_[d], 0));
    }
    CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    void* node = nullptr;
    CHECK_CUDA(cudaMallocAsync(&node, 4096, s));
    CHECK_CUDA(cudaMemsetAsync(node, 1, 4096, s));
    CHECK_CUDA(cudaFreeAsync(node, s));
    if (victim != live_.end()) {
      remove_range(victim->first);
      CHECK_CUDA(cudaFreeAsync(victim->first, s));
      live_.erase(victim);
      ++frees;
    }
    cudaGraph_t graph = nullptr;
    CHECK_CUDA(cudaStreamEndCapture(s, &graph));
    EXPECT(graph != nullptr);
    CHECK_CUDA(cudaGraphDestroy(graph));
    ++captures;
  }

  // Blocks just freed on the old stream are still queued there when it goes.
  void renew_stream(int d) {
    CHECK_CUDA(cudaSetDevice(d));
    cudaStream_t old = nonblocking_[d];
    CHECK_CUDA(cudaEventRecord(event_[d], old));
    CHECK_CUDA(cudaStreamWaitEvent(blocking_[d], event_[d], 0));
    for (auto& [p, b] : live_) {
      if (b.writer == old) b.writer = blocking_[d];  // its writes so far are now before blocking_'s next
    }
    CHECK_CUDA(cudaStreamDestroy(old));
    // Half made as PyTorch makes its side streams: with a priority.
    if (rng_() % 2 == 0) {
      CHECK_CUDA(cudaStreamCreateWithFlags(&nonblocking_[d], cudaStreamNonBlocking));
    } else {
      CHECK_CUDA(cudaStreamCreateWithPriority(&nonblocking_[d], cudaStreamNonBlocking, -1));
    }
  }

  int index_;
  std::mt19937_64 rng_;
  cudaStream_t blocking_[kMaxDevices] = {};
  cudaStream_t nonblocking_[kMaxDevices] = {};
  cudaEvent_t event_[kMaxDevices] = {};
  std::map<void*, Block> live_;
};

void synchronize_devices() {
  for (int d = 0; d < devices; ++d) {
    CHECK_CUDA(cudaSetDevice(d));
    CHECK_CUDA(cudaDeviceSynchronize());
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 3;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 10;
  const int operations = argc > 3 ? std::atoi(argv[3]) : 200;
  const std::uint64_t seed = argc > 4 ? std::strtoull(argv[4], nullptr, 10) : 1;
  int count = 0;
  CHECK_CUDA(cudaGetDeviceCount(&count));
  devices = count < kMaxDevices ? count : kMaxDevices;
  // Each device may use the other's memory: frees go on the other's streams.
  for (int d = 0; devices == 2 && d < devices; ++d) {
    int can = 0;
    CHECK_CUDA(cudaDeviceCanAccessPeer(&can, d, 1 - d));
    EXPECT(can == 1);
    CHECK_CUDA(cudaSetDevice(d));
    CHECK_CUDA(cudaDeviceEnablePeerAccess(1 - d, 0));
  }
  std::barrier meet(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      Worker w(t, seed * 1000 + static_cast<std::uint64_t>(t));
      for (int round = 0; round < rounds; ++round) {
        for (int op = 0; op < operations; ++op) w.step();
        meet.arrive_and_wait();
        if (t == 0) synchronize_devices();
        meet.arrive_and_wait();
        w.check();
        meet.arrive_and_wait();
      }
      w.finish();
    });
  }
  for (std::thread& th : pool) th.join();
  synchronize_devices();
  std::printf("{\"allocations\": %lld, \"frees\": %lld, \"refused\": %lld, \"captures\": %lld}\n",
              allocations.load(), frees.load(), refused.load(), captures.load());
  return 0;
}
