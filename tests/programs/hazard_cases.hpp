// The reuse-hazard cases, one per way a cached block can change hands, shared
// by tests/programs/hazards.cpp (the simulated device: a slow host function
// plays the old owner's kernel) and tests/gpu/hazards_gpu.cu (a slow kernel).
// In each, the old owner slowly writes kOld into a block on its stream; the
// program frees the block at once and allocates the same size again; if the
// pool hands back the same block, the new owner writes kNew on its own stream.
// Unless the pool ordered the new owner after the old work, kOld lands last.
//
// run_case's exit codes: 0 reused, kNew intact; 1 a hazard; 2 not reused (so
// nothing shown); 3 a CUDA call failed (never to be taken for a hazard); 4 a
// task's stream was made to wait behind another stream's work; 64 an
// unknown case. The includer defines, in namespace hazards:
//   extern const size_t kBytes = ...;  // the block size
//   void old_owner_writes(void* p, cudaStream_t s, size_t bytes);  // queues the slow write of kOld
#pragma once

#include <string>

#include "hazard_handle_cases.hpp"
#include "hazard_setup.hpp"

namespace hazards {

// cudaFree promised a device-wide synchronization: a plain cudaMalloc after a
// plain cudaFree may be used on any stream.
inline int cudafree_then_cudamalloc(unsigned old_flags, unsigned new_flags) {
  cudaStream_t s1 = stream(old_flags), s2 = stream(new_flags);
  void* p = nullptr;
  HAZARD_CHECK(cudaMalloc(&p, kBytes));
  old_owner_writes(p, s1);
  HAZARD_CHECK(cudaFree(p));
  void* q = nullptr;
  HAZARD_CHECK(cudaMalloc(&q, kBytes));
  return verdict(p, q, s2);
}

// A non-blocking stream ignores the legacy stream: one made after the
// barrier that ordered a live plain block must be made to wait for it, as
// the program may use the block on it at once.
inline int new_stream_after_barrier() {
  cudaStream_t s1 = stream(cudaStreamNonBlocking);
  void* p = only_room();
  old_owner_writes(p, s1);
  HAZARD_CHECK(cudaFree(p));
  void* q = nullptr;
  HAZARD_CHECK(cudaMalloc(&q, kBytes));  // after the barrier: s1's write, then the legacy stream's event
  cudaStream_t s2 = stream(cudaStreamNonBlocking);
  return verdict(p, q, s2);
}

// A plain cudaMalloc may take, with no barrier of its own, memory freed
// before the last device barrier, past memory freed since then
// (pool/plain_reuse.cpp): that earlier barrier must order the new owner after
// the old one. The old owner's block sits right above a block freed later.
inline int cudafree_covered() {
  const size_t half = kBytes / 2;
  cudaStream_t s1 = stream(cudaStreamNonBlocking), s2 = stream(cudaStreamNonBlocking);
  void* low = nullptr;
  void* high = nullptr;
  HAZARD_CHECK(cudaMalloc(&low, half));
  HAZARD_CHECK(cudaMalloc(&high, half));
  old_owner_writes(high, s1, half);
  HAZARD_CHECK(cudaFree(high));
  // A barrier after that free: a block of the other pool (small or large),
  // freed and asked for again at its size, is reused only after one.
  const size_t other = half > (size_t{1} << 20) ? (size_t{512} << 10) : (size_t{4} << 20);
  void* d = nullptr;
  HAZARD_CHECK(cudaMalloc(&d, other));
  HAZARD_CHECK(cudaFree(d));
  HAZARD_CHECK(cudaMalloc(&d, other));
  HAZARD_CHECK(cudaFree(low));  // freed after the barrier: the request must skip it
  void* q = nullptr;
  HAZARD_CHECK(cudaMalloc(&q, half / 2));
  return verdict(high, q, s2, half / 2);
}

// A barrier asks each non-blocking stream whether it is idle, and records
// and waits only on those with work left (PyTorch's stream pool: dozens of
// streams, most never used). A stream idle at one barrier must be asked
// again at the next, and an idle stream that takes the block must still wait
// for the barrier. `destroyed_writer`: the block's last write is queued on a
// stream destroyed before the cudaFree (cudaFree promises that write done,
// with every stream of the pool idle): a barrier that first looks whether
// the device has caught up must not take an idle device for a done
// destroyed stream's work.
inline int cudafree_idle_streams(bool destroyed_writer) {
  std::vector<cudaStream_t> pool;
  for (int i = 0; i < 8; ++i) pool.push_back(stream(cudaStreamNonBlocking));
  void* p = nullptr;
  HAZARD_CHECK(cudaMalloc(&p, kBytes));
  HAZARD_CHECK(cudaFree(p));
  HAZARD_CHECK(cudaMalloc(&p, kBytes));  // a barrier while every stream is idle
  if (destroyed_writer) {
    cudaStream_t old = stream(cudaStreamNonBlocking);
    old_owner_writes(p, old);
    HAZARD_CHECK(cudaStreamDestroy(old));  // its write still queued
  } else {
    old_owner_writes(p, pool[3]);  // pool[3] is busy at the next barrier
  }
  HAZARD_CHECK(cudaFree(p));
  void* q = nullptr;
  HAZARD_CHECK(cudaMalloc(&q, kBytes));
  return verdict(p, q, pool[5]);
}

inline int same_stream() {
  cudaStream_t s = stream(cudaStreamNonBlocking);
  void* p = nullptr;
  HAZARD_CHECK(cudaMallocAsync(&p, kBytes, s));
  old_owner_writes(p, s);
  HAZARD_CHECK(cudaFreeAsync(p, s));
  void* q = nullptr;
  HAZARD_CHECK(cudaMallocAsync(&q, kBytes, s));
  return verdict(p, q, s);
}

// wait_first: the old owner's stream is synchronized before the new request.
// destroy_first: it is destroyed instead (returns at once; the write is queued).
inline int cross_stream(bool wait_first, bool destroy_first) {
  cudaStream_t s1 = stream(cudaStreamNonBlocking), s2 = stream(cudaStreamNonBlocking);
  void* p = busy_freed_block(s1);
  if (wait_first) HAZARD_CHECK(cudaStreamSynchronize(s1));
  if (destroy_first) HAZARD_CHECK(cudaStreamDestroy(s1));
  void* q = nullptr;
  HAZARD_CHECK(cudaMallocAsync(&q, kBytes, s2));
  return verdict(p, q, s2);
}

// A stream made for each task and destroyed after it: each task frees its
// block with its slow write still queued, and the next task's new stream
// takes that block (exit 2 where it took new memory), ordered after the
// write. 8 tasks.
inline int stream_per_task() {
  void* previous = nullptr;
  for (int task = 0; task < 8; ++task) {
    cudaStream_t s = stream(cudaStreamNonBlocking);
    void* p = nullptr;
    HAZARD_CHECK(cudaMallocAsync(&p, kBytes, s));
    if (previous != nullptr) {
      if (const int result = verdict(previous, p, s); result != 0) return result;
    }
    old_owner_writes(p, s);
    HAZARD_CHECK(cudaFreeAsync(p, s));
    HAZARD_CHECK(cudaStreamDestroy(s));
    previous = p;
  }
  HAZARD_CHECK(cudaDeviceSynchronize());
  return 0;
}

// A stream made for each task beside a stream the program keeps busy (five
// of the old owner's slow writes queued on it before each task, one on the
// task's stream): no task's stream may be made to wait behind the busy
// stream's work, as a device barrier would make it (it orders every stream
// after every busy one). A task may wait for the task before it, whose
// block it takes while that task's write is pending: task k then ends about
// k + 1 writes after the start, long before the busy stream's 5(k + 1)
// writes queued by then; behind them, it ends after them. `overlap`: each
// task's stream is destroyed only after the next task has taken memory, so
// that task finds the block still pending on a live stream (a fence may be
// recorded on that stream, still pending when it is destroyed); tasks then
// may take new memory, and only a wait behind the busy stream fails.
inline int stream_per_task_beside_busy(bool overlap) {
  constexpr int kTasks = 4;
  constexpr int kBusyWrites = 5;
  cudaStream_t busy = stream(cudaStreamNonBlocking);
  void* busy_bytes = nullptr;
  HAZARD_CHECK(cudaMallocAsync(&busy_bytes, 4096, busy));
  cudaEvent_t done[kTasks], busy_done[kTasks];
  for (int task = 0; task < kTasks; ++task) {
    HAZARD_CHECK(cudaEventCreateWithFlags(&done[task], cudaEventDisableTiming));
    HAZARD_CHECK(cudaEventCreateWithFlags(&busy_done[task], cudaEventDisableTiming));
  }
  void* previous = nullptr;
  cudaStream_t last_stream = nullptr;  // with overlap: the last task's, still alive
  bool reused = true;
  for (int task = 0; task < kTasks; ++task) {
    for (int i = 0; i < kBusyWrites; ++i) old_owner_writes(busy_bytes, busy, 4096);
    HAZARD_CHECK(cudaEventRecord(busy_done[task], busy));
    cudaStream_t s = stream(cudaStreamNonBlocking);
    void* p = nullptr;
    HAZARD_CHECK(cudaMallocAsync(&p, kBytes, s));
    reused = reused && (previous == nullptr || p == previous);
    if (last_stream != nullptr) HAZARD_CHECK(cudaStreamDestroy(last_stream));
    old_owner_writes(p, s);
    HAZARD_CHECK(cudaEventRecord(done[task], s));
    HAZARD_CHECK(cudaFreeAsync(p, s));
    if (overlap) {
      last_stream = s;
    } else {
      HAZARD_CHECK(cudaStreamDestroy(s));
    }
    previous = p;
  }
  if (last_stream != nullptr) HAZARD_CHECK(cudaStreamDestroy(last_stream));
  int result = 0;
  for (int task = 0; task < kTasks; ++task) {
    HAZARD_CHECK(cudaEventSynchronize(done[task]));
    const cudaError_t busy_state = cudaEventQuery(busy_done[task]);
    if (busy_state == cudaSuccess) {
      std::printf("task %d ended after the busy stream's writes queued before it: it waited behind them\n", task);
      result = 4;
    } else if (busy_state != cudaErrorNotReady) {
      HAZARD_CHECK(busy_state);
    }
  }
  HAZARD_CHECK(cudaDeviceSynchronize());
  for (int task = 0; task < kTasks; ++task) {
    HAZARD_CHECK(cudaEventDestroy(done[task]));
    HAZARD_CHECK(cudaEventDestroy(busy_done[task]));
  }
  HAZARD_CHECK(cudaFreeAsync(busy_bytes, busy));
  HAZARD_CHECK(cudaStreamDestroy(busy));
  if (result != 0) return result;
  if (!reused && !overlap) {
    std::printf("not reused: a task took new memory\n");
    return 2;
  }
  std::printf("%s, and none waited behind the busy stream\n",
              reused ? "each task took the last one's block" : "some tasks took new memory");
  return 0;
}

// Device 0's block, last written on device 1's stream and freed in its
// order: device 0's barriers do not reach that stream, so the block waits
// until the free's point on it is known passed. Needs two devices.
inline int cross_device_free() {
  HAZARD_CHECK(cudaSetDevice(1));
  HAZARD_CHECK(cudaDeviceEnablePeerAccess(0, 0));
  cudaStream_t one = stream(cudaStreamNonBlocking);
  HAZARD_CHECK(cudaSetDevice(0));
  cudaStream_t zero = stream(cudaStreamNonBlocking);
  void* p = only_room();
  old_owner_writes(p, one);
  HAZARD_CHECK(cudaFreeAsync(p, one));
  void* q = nullptr;
  HAZARD_CHECK(cudaMallocAsync(&q, kBytes, zero));
  return verdict(p, q, zero, kBytes, 1);
}

// Per-thread default streams on two threads: thread A frees, thread B reuses.
// A stays alive until B is done: the real runtime may give an exited thread's
// per-thread stream to the next thread, and then stream order alone would
// hide the hazard.
inline int per_thread_streams() {
  void* p = nullptr;
  std::promise<void> freed, reused;
  std::future<void> freed_done = freed.get_future(), reused_done = reused.get_future();
  std::thread a([&] {
    p = busy_freed_block(kThreadStream);
    freed.set_value();
    reused_done.wait();
  });
  int result = 0;
  std::thread b([&] {
    freed_done.wait();
    void* q = nullptr;
    HAZARD_CHECK(cudaMallocAsync(&q, kBytes, kThreadStream));
    result = verdict(p, q, kThreadStream);
    reused.set_value();
  });
  b.join();
  a.join();
  return result;
}

// The same with thread A ended before B asks: its per-thread stream has left
// gpupool's books by then, and the block freed on it must still wait for A's
// work. (The real runtime may give B the stream A had; stream order then
// protects the block, and the case shows nothing there.)
inline int ended_thread_stream() {
  void* p = nullptr;
  std::thread a([&] { p = busy_freed_block(kThreadStream); });
  a.join();
  int result = 0;
  std::thread b([&] {
    void* q = nullptr;
    HAZARD_CHECK(cudaMallocAsync(&q, kBytes, kThreadStream));
    result = verdict(p, q, kThreadStream);
  });
  b.join();
  return result;
}

// cudaFree also returns only once the device has done all earlier work: a
// program may read on the host what that work wrote to mapped host memory.
// The "block" written here is that host memory; 1: the host read it early.
// With other_device (two devices), the memory and the work are device 1's and
// device 0 is current at the cudaFree: the wait is for the memory's device.
inline int cudafree_host_sync(bool other_device) {
  const int device = other_device ? 1 : 0;
  HAZARD_CHECK(cudaSetDevice(device));
  cudaStream_t s = stream(cudaStreamDefault);
  unsigned char* host = nullptr;
  HAZARD_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host), kBytes, cudaHostAllocMapped | cudaHostAllocPortable));
  std::fill(host, host + kBytes, static_cast<unsigned char>(0));
  void* p = nullptr;
  HAZARD_CHECK(cudaMalloc(&p, kBytes));
  old_owner_writes(host, s);
  HAZARD_CHECK(cudaSetDevice(0));
  HAZARD_CHECK(cudaFree(p));
  const bool done = host[0] == kOld && host[kBytes - 1] == kOld;
  HAZARD_CHECK(cudaSetDevice(device));
  HAZARD_CHECK(cudaDeviceSynchronize());
  HAZARD_CHECK(cudaFreeHost(host));
  HAZARD_CHECK(cudaStreamDestroy(s));
  if (!done) {
    std::printf("HAZARD: cudaFree returned before the device's earlier work was done\n");
    return 1;
  }
  std::printf("synchronized: cudaFree returned after the device's earlier work\n");
  return 0;
}

// `name` is one of the cases; -1 when it is none of them.
inline int run_case(const std::string& name) {
  if (name == "cudafree-blocking") return cudafree_then_cudamalloc(cudaStreamDefault, cudaStreamDefault);
  if (name == "cudafree-nonblocking") return cudafree_then_cudamalloc(cudaStreamNonBlocking, cudaStreamNonBlocking);
  if (name == "cudafree-covered") return cudafree_covered();
  if (name == "new-stream-after-barrier") return new_stream_after_barrier();
  if (name == "cudafree-idle-streams") return cudafree_idle_streams(false);
  if (name == "cudafree-after-destroy-idle-streams") return cudafree_idle_streams(true);
  if (name == "same-stream") return same_stream();
  if (name == "cross-stream-completed") return cross_stream(true, false);
  if (name == "cross-stream-pending") return cross_stream(false, false);
  if (name == "destroyed-stream") return cross_stream(false, true);
  if (name == "stream-per-task") return stream_per_task();
  if (name == "stream-per-task-beside-busy") return stream_per_task_beside_busy(false);
  if (name == "overlapping-tasks-beside-busy") return stream_per_task_beside_busy(true);
  if (name == "per-thread") return per_thread_streams();
  if (name == "ended-thread") return ended_thread_stream();
  if (name == "handle-given-again") return handle_given_again(false, false);
  if (name == "handle-given-again-threads") return handle_given_again(false, true);
  if (name == "unseen-destroy") return handle_given_again(true, false);
  if (name == "unseen-destroy-threads") return handle_given_again(true, true);
  if (name == "driver-destroy") return watched_driver_destroy(DriverDestroy::LookedUp);
  if (name == "linked-driver-destroy") return watched_driver_destroy(DriverDestroy::Linked);
  if (name == "library-driver-destroy") return watched_driver_destroy(DriverDestroy::Library);
  if (name == "runtime-driver-destroy") return watched_driver_destroy(DriverDestroy::Runtime);
  if (name == "gone-stream") return gone_stream(200);
  if (name == "gone-handle-after-barrier") return gone_handle_after_barrier();
  if (name == "gone-stream-made-again") return gone_stream_made_again(false);
  if (name == "gone-stream-made-again-threads") return gone_stream_made_again(true);
  if (name == "cross-device-free") return cross_device_free();
  if (name == "cudafree-host-sync") return cudafree_host_sync(false);
  if (name == "cudafree-host-sync-other-device") return cudafree_host_sync(true);
  return -1;
}

}  // namespace hazards
