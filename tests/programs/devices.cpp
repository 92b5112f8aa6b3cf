// One process driving two devices, as JAX or DataParallel do: every block
// comes from the memory of the device it was asked for, blocks freed while
// another device is current go back to their own device's pool, and reusing
// them is ordered on their own device. Every buffer carries a pattern checked
// before it is freed. Run with SIMCUDA_DEVICES=2 and, under gpupool, a memory
// limit that leaves each device room for one block: then a block freed with
// cudaFree can only be reused, on its device, whatever device is current.
//   devices cross [rounds]     one thread switching devices between calls
//   devices threads [rounds]   a thread per device, at the same time
//   devices foreign [rounds]   device 0's blocks written by a stream of device 1
//                              (through peer access) and freed in its order
//                              with cudaFreeAsync, then asked for again on
//                              device 0: never handed out before that write
//                              is done (run with SIMCUDA_OP_DELAY_US)
//   devices foreign-capture    such a free inside a capture of device 1's
//                              stream: the block is the graph's from then on
//                              and never handed out again
//   devices foreign-capture-reset  such a free inside a capture, then device 1
//                              reset (its pool holding memory; the reset may
//                              return an earlier launch's error): its graphs
//                              and work are gone, so device 0 gets the block
//                              back (run as for foreign-reset)
//   devices foreign-reset      such a free still queued when device 1 is reset:
//                              the reset ends that work, so device 0 gets the
//                              block back (run with a limit that leaves room
//                              for one block, and SIMCUDA_OP_DELAY_US)
//   devices foreign-signal REPORT  such a free, its work done, then a report
//                              asked for with SIGUSR1 (written to REPORT):
//                              prints the report
//   devices foreign-twice      such a free, then the same block freed again
//                              while the first free still waits (on device
//                              1's stream, then with cudaFree): refused, and
//                              device 0 gets the block back once (run as for
//                              foreign-reset)
//   devices owner-reset        such a free, its work done but not yet seen
//                              by gpupool, when device 0 (the block's own) is
//                              reset
//   devices unseen-stream [rounds]  cudaMallocAsync on a stream of device 1
//                              made through the driver (past gpupool) while
//                              device 0 is current: the memory is device 1's,
//                              as the runtime gives it
//   devices handle-again       a stream of device 0 used and destroyed, and its
//                              handle given to a new stream of device 1 (run with
//                              SIMCUDA_REUSE_STREAM_HANDLES=1: the simulated
//                              runtime then gives the last destroyed handle
//                              to the next stream made): that stream's memory
//                              is device 1's, though device 0 is current
#include <thread>

#include "common.hpp"
#include "device_blocks.hpp"

namespace {

using namespace device_blocks;

// Device d's blocks, asked for and freed while d or the other device is current.
void cross(int d, cudaStream_t stream, int round) {
  const int other = 1 - d;
  const auto tag = static_cast<unsigned char>(round * 4 + d * 2 + 1);
  void* p = nullptr;
  CHECK_CUDA(cudaSetDevice(d));
  CHECK_CUDA(cudaMalloc(&p, kBytes));
  expect_on(p, d);
  fill(p, tag, nullptr);
  CHECK_CUDA(cudaFree(p));

  // Stream-ordered on d's stream with the other device current: the block
  // cudaFree gave back is the only room d has, and reusing it needs d's barrier.
  CHECK_CUDA(cudaSetDevice(other));
  void* q = nullptr;
  CHECK_CUDA(cudaMallocAsync(&q, kBytes, stream));
  expect_on(q, d);
  fill(q, static_cast<unsigned char>(tag + 1), stream);
  CHECK_CUDA(cudaFreeAsync(q, stream));

  // Plain cudaMalloc on d, freed while the other device is current.
  CHECK_CUDA(cudaSetDevice(d));
  void* r = nullptr;
  CHECK_CUDA(cudaMalloc(&r, kBytes));
  expect_on(r, d);
  fill(r, tag, nullptr);
  CHECK_CUDA(cudaSetDevice(other));
  CHECK_CUDA(cudaFree(r));
}

void own_device(int d, int rounds) {
  CHECK_CUDA(cudaSetDevice(d));
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (int round = 0; round < rounds; ++round) {
    const auto tag = static_cast<unsigned char>(round * 2 + d + 1);
    void* p = nullptr;
    CHECK_CUDA(cudaMallocAsync(&p, kBytes, stream));
    expect_on(p, d);
    fill(p, tag, stream);
    CHECK_CUDA(cudaFreeAsync(p, stream));
    void* q = nullptr;
    CHECK_CUDA(cudaMalloc(&q, kBytes));
    expect_on(q, d);
    fill(q, tag, nullptr);
    CHECK_CUDA(cudaFree(q));
  }
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_CUDA(cudaStreamDestroy(stream));
}

// A non-blocking stream of device 1 that may write device 0's memory (peer
// access); false, said on stdout, where the devices cannot access each other.
bool peer_stream_of_device_one(cudaStream_t* one) {
  CHECK_CUDA(cudaSetDevice(1));
  CHECK_CUDA(cudaStreamCreateWithFlags(one, cudaStreamNonBlocking));
  int can = 0;
  CHECK_CUDA(cudaDeviceCanAccessPeer(&can, 1, 0));
  if (can == 0) {
    std::printf("devices: device 1 cannot access device 0 here; nothing checked\n");
    return false;
  }
  if (cudaDeviceEnablePeerAccess(0, 0) != cudaErrorPeerAccessAlreadyEnabled) CHECK_CUDA(cudaGetLastError());
  return true;
}

int foreign(int rounds) {
  cudaStream_t zero = nullptr, one = nullptr;
  if (!peer_stream_of_device_one(&one)) return 0;
  CHECK_CUDA(cudaSetDevice(0));
  testprog::turn_thread_caches_on();
  CHECK_CUDA(cudaStreamCreateWithFlags(&zero, cudaStreamNonBlocking));
  for (int round = 0; round < rounds; ++round) {
    const auto tag = static_cast<unsigned char>(round + 1);
    void* p = nullptr;
    if (round % 2 == 0) {
      CHECK_CUDA(cudaMalloc(&p, kBytes));
    } else {
      CHECK_CUDA(cudaMallocAsync(&p, kBytes, zero));
    }
    expect_on(p, 0);
    fill(p, tag, zero);
    CHECK_CUDA(cudaMemsetAsync(p, 0xEE, kBytes, one));  // device 1's last use, still queued
    CHECK_CUDA(cudaFreeAsync(p, one));                   // freed in device 1's stream order
  }
  CHECK_CUDA(cudaStreamSynchronize(zero));
  CHECK_CUDA(cudaSetDevice(1));
  CHECK_CUDA(cudaStreamSynchronize(one));
  CHECK_CUDA(cudaStreamDestroy(one));
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaStreamDestroy(zero));
  return 0;
}

// Device 0's block freed inside a capture of device 1's new stream `one`: a
// free node of the graph returned. Device 1 is current after.
cudaGraph_t free_inside_capture_on_device_one(cudaStream_t* one, void** freed) {
  CHECK_CUDA(cudaSetDevice(1));
  CHECK_CUDA(cudaStreamCreateWithFlags(one, cudaStreamNonBlocking));
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaMalloc(freed, kBytes));
  fill(*freed, 1, nullptr);
  CHECK_CUDA(cudaSetDevice(1));
  CHECK_CUDA(cudaStreamBeginCapture(*one, cudaStreamCaptureModeRelaxed));
  CHECK_CUDA(cudaFreeAsync(*freed, *one));
  cudaGraph_t graph = nullptr;
  CHECK_CUDA(cudaStreamEndCapture(*one, &graph));
  EXPECT(graph != nullptr);
  return graph;
}

int foreign_capture() {
  cudaStream_t one = nullptr;
  void* p = nullptr;
  const cudaGraph_t graph = free_inside_capture_on_device_one(&one, &p);
  CHECK_CUDA(cudaSetDevice(0));
  void* q = nullptr;
  CHECK_CUDA(cudaMalloc(&q, kBytes));
  EXPECT(q != p);  // the graph's memory is not handed out again
  CHECK_CUDA(cudaFree(q));
  CHECK_CUDA(cudaGraphDestroy(graph));
  CHECK_CUDA(cudaSetDevice(1));
  CHECK_CUDA(cudaStreamDestroy(one));
  return 0;
}

// Device 0's block, last written by device 1's stream `one` (still queued)
// and freed in that stream's order; device 1 is current after.
void* free_on_device_one(cudaStream_t one) {
  CHECK_CUDA(cudaSetDevice(0));
  void* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, kBytes));
  fill(p, 1, nullptr);
  CHECK_CUDA(cudaSetDevice(1));
  CHECK_CUDA(cudaMemsetAsync(p, 0xEE, kBytes, one));
  CHECK_CUDA(cudaFreeAsync(p, one));
  return p;
}

// A block of device 0's, freed when device 0 is current.
void use_device_zero() {
  CHECK_CUDA(cudaSetDevice(0));
  void* q = nullptr;
  CHECK_CUDA(cudaMalloc(&q, kBytes));  // under a limit of one block, only the freed block's memory is left
  fill(q, 2, nullptr);
  CHECK_CUDA(cudaFree(q));
}

int foreign_capture_reset() {
  cudaStream_t one = nullptr;
  void* p = nullptr;
  // The graph destroyed unlaunched: the block stays the graph's until the
  // reset, which ends device 1's work (and would destroy the graph too).
  CHECK_CUDA(cudaGraphDestroy(free_inside_capture_on_device_one(&one, &p)));
  // Device 1's pool holds memory, by which gpupool tells a reset that
  // returned an earlier launch's error (SIMCUDA_RESET_ERROR=late) from one
  // refused.
  void* held = nullptr;
  CHECK_CUDA(cudaMalloc(&held, 1 << 20));
  CHECK_CUDA(cudaFree(held));
  const cudaError_t reset = cudaDeviceReset();
  EXPECT(reset == cudaSuccess || reset == cudaErrorLaunchFailure);
  (void)cudaGetLastError();
  use_device_zero();
  return 0;
}

int foreign_reset() {
  cudaStream_t one = nullptr;
  if (!peer_stream_of_device_one(&one)) return 0;
  free_on_device_one(one);
  CHECK_CUDA(cudaDeviceReset());  // ends that work, and destroys device 1's events and streams
  use_device_zero();
  return 0;
}

// A report asked for (SIGUSR1) once device 1 has done the work the free
// waited for: printed as it was written.
int foreign_signal(const char* report) {
  cudaStream_t one = nullptr;
  if (!peer_stream_of_device_one(&one)) return 0;
  free_on_device_one(one);
  CHECK_CUDA(cudaStreamSynchronize(one));
  return testprog::print_requested_report(report);
}

int foreign_twice() {
  cudaStream_t one = nullptr;
  if (!peer_stream_of_device_one(&one)) return 0;
  void* p = free_on_device_one(one);
  EXPECT(cudaFreeAsync(p, one) == cudaErrorInvalidValue);  // the first free still waits
  EXPECT(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK_CUDA(cudaSetDevice(0));
  EXPECT(cudaFree(p) == cudaErrorInvalidValue);  // nor a plain free, on the block's own device
  EXPECT(cudaGetLastError() == cudaErrorInvalidValue);
  use_device_zero();
  use_device_zero();  // the block came back once: it serves request after request
  CHECK_CUDA(cudaSetDevice(1));
  CHECK_CUDA(cudaStreamSynchronize(one));
  CHECK_CUDA(cudaStreamDestroy(one));
  return 0;
}

int owner_reset() {
  cudaStream_t one = nullptr;
  if (!peer_stream_of_device_one(&one)) return 0;
  free_on_device_one(one);
  CHECK_CUDA(cudaStreamSynchronize(one));  // done; device 0's pool has not looked yet
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaDeviceReset());
  use_device_zero();
  return 0;
}

// A stream gpupool never saw made: the driver's cuStreamCreate, on device 1.
int unseen_stream(int rounds) {
  using StreamCreate = int (*)(void**, unsigned);
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  auto create = driver != nullptr ? reinterpret_cast<StreamCreate>(dlsym(driver, "cuStreamCreate")) : nullptr;
  EXPECT(create != nullptr);
  CHECK_CUDA(cudaSetDevice(1));
  void* made = nullptr;
  EXPECT(create(&made, cudaStreamNonBlocking) == 0);
  const auto stream = static_cast<cudaStream_t>(made);
  CHECK_CUDA(cudaSetDevice(0));
  for (int round = 0; round < rounds; ++round) {
    void* p = nullptr;
    CHECK_CUDA(cudaMallocAsync(&p, kBytes, stream));
    expect_on(p, 1);
    fill(p, static_cast<unsigned char>(round + 1), stream);
    CHECK_CUDA(cudaFreeAsync(p, stream));
  }
  CHECK_CUDA(cudaStreamSynchronize(stream));
  return 0;
}

// The thread's last stream is remembered with its device (Runtime::
// prepare_stream): a handle that comes back names another stream.
int handle_again() {
  CHECK_CUDA(cudaSetDevice(0));
  cudaStream_t first = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&first, cudaStreamNonBlocking));
  void* p = nullptr;
  CHECK_CUDA(cudaMallocAsync(&p, kBytes, first));
  expect_on(p, 0);
  CHECK_CUDA(cudaFreeAsync(p, first));
  CHECK_CUDA(cudaStreamSynchronize(first));
  CHECK_CUDA(cudaStreamDestroy(first));
  CHECK_CUDA(cudaSetDevice(1));
  cudaStream_t second = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&second, cudaStreamNonBlocking));
  EXPECT(second == first);  // else this checks nothing
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaMallocAsync(&p, kBytes, second));
  expect_on(p, 1);
  fill(p, 7, second);
  CHECK_CUDA(cudaFreeAsync(p, second));
  CHECK_CUDA(cudaStreamSynchronize(second));
  CHECK_CUDA(cudaStreamDestroy(second));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "handle-again") == 0) return handle_again();
  if (argc > 1 && std::strcmp(argv[1], "unseen-stream") == 0) return unseen_stream(argc > 2 ? std::atoi(argv[2]) : 5);
  if (argc > 1 && std::strcmp(argv[1], "foreign-capture") == 0) return foreign_capture();
  if (argc > 1 && std::strcmp(argv[1], "foreign-reset") == 0) return foreign_reset();
  if (argc > 1 && std::strcmp(argv[1], "foreign-capture-reset") == 0) return foreign_capture_reset();
  if (argc > 1 && std::strcmp(argv[1], "owner-reset") == 0) return owner_reset();
  if (argc > 1 && std::strcmp(argv[1], "foreign-twice") == 0) return foreign_twice();
  if (argc > 2 && std::strcmp(argv[1], "foreign-signal") == 0) return foreign_signal(argv[2]);
  if (argc > 1 && std::strcmp(argv[1], "foreign") == 0) return foreign(argc > 2 ? std::atoi(argv[2]) : 20);
  const bool threads = argc > 1 && std::strcmp(argv[1], "threads") == 0;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 20;
  int count = 0;
  CHECK_CUDA(cudaGetDeviceCount(&count));
  EXPECT(count >= 2);
  if (threads) {
    std::thread first(own_device, 0, rounds);
    std::thread second(own_device, 1, rounds);
    first.join();
    second.join();
    return 0;
  }
  cudaStream_t streams[2] = {};
  for (int d = 0; d < 2; ++d) {
    CHECK_CUDA(cudaSetDevice(d));
    CHECK_CUDA(cudaStreamCreateWithFlags(&streams[d], cudaStreamNonBlocking));
  }
  for (int round = 0; round < rounds; ++round) {
    for (int d = 0; d < 2; ++d) cross(d, streams[d], round);
  }
  for (int d = 0; d < 2; ++d) {
    CHECK_CUDA(cudaSetDevice(d));
    CHECK_CUDA(cudaStreamSynchronize(streams[d]));
    CHECK_CUDA(cudaStreamDestroy(streams[d]));
  }
  return 0;
}
