// Access between devices: who may use whose memory, pooled pages included,
// as the program grants it and takes it away (peer access, a default memory
// pool's access, a device reset). Run with SIMCUDA_DEVICES=2 (3 for
// pool-access); where the runtime can say (the simulated one), each block's
// access is checked. The first argument names what it checks:
//   peer                       access granted with cudaDeviceEnablePeerAccess
//                              reaches pooled memory: pages mapped before the
//                              grant and after it, and pages of a device whose
//                              pool did not exist yet (checked on the
//                              simulated runtime, which can say)
//   pool-access                device 0's default memory pool opened to device 1
//                              with cudaMemPoolSetAccess (as PyTorch's
//                              cudaMallocAsync backend enables peer copies):
//                              device 0's stream-ordered blocks made after it,
//                              new memory or not, and one from the pool named,
//                              are device 1's to use (a stream of device 1
//                              writes each), not device 2's; with a third
//                              device, device 1's pool, opened to device 2
//                              before device 1 was used, serves blocks device 2
//                              may use and device 0 may not (who may use what
//                              is checked on the simulated runtime); prints
//                              whether a block made before the grant opened
//                              too: {"lent_before_open": true|false}
//   pool-access-reset          a pool of the program's own of device 0 opened to
//                              device 1, then a stream-ordered block of device
//                              0; device 0's default pool opened to device 1,
//                              a block; device 0 reset, a block; device 1's
//                              default pool opened to device 0 before device 1
//                              was used, device 1 reset, a block of device 1;
//                              a reset starts the default pool closed again:
//                              each block after one is closed to the other
//                              device (checked where the runtime can say), and
//                              under gpupool with fixed segments only the
//                              second block is the runtime's
//   access-revoked             device 1's memory opened to device 0 by peer
//                              access and by its default pool: with the pool
//                              closed again (cudaMemAccessFlagsProtNone) peer
//                              access still opens cudaMalloc memory; with both
//                              taken away, no block of device 1's is open to
//                              device 0, made before or after; each opens again
//                              alone; a reset starts device 1's pool closed
//   peer-after-pages           device 0 given peer access to device 1's memory
//                              once device 1 has pooled pages, then more
//                              pages, then the access taken away: prints
//                              whether device 0 may use a block of each, and
//                              whether both are closed at the end,
//                              {"before": B, "after": B, "closed": B} (what a
//                              driver that refuses to open or to close pages
//                              leaves, with SIMCUDA_REFUSE_ACCESS=0[:close] or
//                              0:open-after=K;
//                              where the runtime cannot say, as on a GPU,
//                              every block reads open, and closed false)
//   pool-read [read-gives-write]  device 0's default memory pool opened to
//                              device 1 for reading only before device 0 has
//                              memory, closed, opened so again, then for
//                              writing too, then for reading again, peer
//                              access given to device 1 and taken away, the
//                              pool closed: each block of device 0's,
//                              stream-ordered or not, is open to device 1 no
//                              further than the grants reach together, and as
//                              far where CUDA opens it (gpupool's pages may be
//                              open further: they serve both kinds of block;
//                              checked where the runtime can say); with
//                              read-gives-write, a grant to read opens
//                              gpupool's pages for writing too (a driver
//                              without read-only mappings)
//   access-churn               one thread opens device 0's default pool to
//                              device 1 for reading, for writing, and closes
//                              it, and gives and takes peer access, while
//                              another makes, writes, checks and frees device
//                              0's blocks, plain and stream-ordered, and gives
//                              its idle pages back (cudaMemPoolTrimTo); then,
//                              with the pool open for reading alone, no block
//                              is open further, a new one exactly so, and
//                              with it closed, none is open (checked where
//                              the runtime can say); prints how many blocks
//                              and changes of access it made,
//                              {"steps": N, "changes": M}
//   peer-reset                 device 0 given peer access to device 1's memory,
//                              then device 1 reset: its later blocks are
//                              closed to device 0; access enabled again (not
//                              "already enabled"), then device 0 reset: no
//                              block of device 1's is open to it, made before
//                              or after (either device's reset ends peer
//                              access, as CUDA documents; checked where the
//                              runtime can say)
#include <atomic>
#include <thread>

#include "common.hpp"
#include "device_blocks.hpp"

namespace {

using namespace device_blocks;

// Whether `device` may access ptr; true where the runtime cannot say (a GPU).
bool accessible(const void* ptr, int device) {
  static const auto query = reinterpret_cast<int (*)(const void*, int)>(dlsym(RTLD_DEFAULT, "simcuda_accessible"));
  return query == nullptr || query(ptr, device) != 0;
}

// How `device` may access ptr (a cudaMemAccessFlags value); -1 where the
// runtime cannot say.
int access(const void* ptr, int device) {
  static const auto query = reinterpret_cast<int (*)(const void*, int)>(dlsym(RTLD_DEFAULT, "simcuda_access"));
  return query == nullptr ? -1 : query(ptr, device);
}

// Device 1's access to ptr is `flags` (where the runtime can say).
void expect_access(const void* p, int flags) {
  const int now = access(p, 1);
  if (now >= 0 && now != flags) std::fprintf(stderr, "device 1's access to %p: %d, expected %d\n", p, now, flags);
  EXPECT(now < 0 || now == flags);
}

// Device 1's access to ptr is no more than `flags` (the flags' values order
// them: none 0, read 1, read and write 3).
void expect_no_more(const void* p, int flags) { EXPECT(access(p, 1) <= flags); }

// Whether `accessor` may access `owner`'s memory at all; false, said on
// stdout, where it may not (nothing is checked then).
bool can_access(int accessor, int owner) {
  int can = 0;
  CHECK_CUDA(cudaDeviceCanAccessPeer(&can, accessor, owner));
  if (can == 0) std::printf("devices: device %d cannot access device %d here; nothing checked\n", accessor, owner);
  return can != 0;
}

int peer() {
  const bool simulated = dlsym(RTLD_DEFAULT, "simcuda_accessible") != nullptr;
  if (!can_access(0, 1)) return 0;
  void* before = nullptr;
  CHECK_CUDA(cudaSetDevice(1));
  CHECK_CUDA(cudaMalloc(&before, kBytes));
  if (simulated) EXPECT(!accessible(before, 0));
  // Device 0 may now access device 1's memory, pooled pages included.
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaDeviceEnablePeerAccess(1, 0));
  EXPECT(accessible(before, 0));
  CHECK_CUDA(cudaSetDevice(1));
  void* after = nullptr;
  CHECK_CUDA(cudaMalloc(&after, 3 * kBytes));  // more pages, mapped after the grant
  EXPECT(accessible(after, 0));
  // Device 1 may access device 0's memory, granted before device 0 has a pool.
  CHECK_CUDA(cudaDeviceEnablePeerAccess(0, 0));
  CHECK_CUDA(cudaSetDevice(0));
  void* zero = nullptr;
  CHECK_CUDA(cudaMalloc(&zero, kBytes));
  expect_on(zero, 0);
  EXPECT(accessible(zero, 1));
  for (void* p : {before, after, zero}) CHECK_CUDA(cudaFree(p));
  return 0;
}

// Gives `accessor` peer access to `owner`'s memory (takes it away), then
// makes `current` the current device.
void set_peer_access(int accessor, int owner, bool on, int current) {
  CHECK_CUDA(cudaSetDevice(accessor));
  CHECK_CUDA(on ? cudaDeviceEnablePeerAccess(owner, 0) : cudaDeviceDisablePeerAccess(owner));
  CHECK_CUDA(cudaSetDevice(current));
}

// Opens `owner`'s default memory pool to `accessor` (closes it, with
// cudaMemAccessFlagsProtNone).
void set_default_pool_access(int owner, int accessor, cudaMemAccessFlags flags) {
  cudaMemPool_t pool = nullptr;
  CHECK_CUDA(cudaDeviceGetDefaultMemPool(&pool, owner));
  cudaMemAccessDesc desc{};
  desc.location.type = cudaMemLocationTypeDevice;
  desc.location.id = accessor;
  desc.flags = flags;
  CHECK_CUDA(cudaMemPoolSetAccess(pool, &desc, 1));
  cudaMemAccessFlags now = flags == cudaMemAccessFlagsProtNone ? cudaMemAccessFlagsProtReadWrite
                                                               : cudaMemAccessFlagsProtNone;
  CHECK_CUDA(cudaMemPoolGetAccess(&now, pool, &desc.location));
  EXPECT(now == flags);
}

// Whether the runtime opens device 0's default pool to device 1 for reading
// alone (said on stdout where it does not: nothing is checked then). Left
// closed.
bool pool_opens_for_reading() {
  cudaMemPool_t pool = nullptr;
  CHECK_CUDA(cudaDeviceGetDefaultMemPool(&pool, 0));
  cudaMemAccessDesc desc{};
  desc.location.type = cudaMemLocationTypeDevice;
  desc.location.id = 1;
  desc.flags = cudaMemAccessFlagsProtRead;
  if (const cudaError_t err = cudaMemPoolSetAccess(pool, &desc, 1); err != cudaSuccess) {
    cudaGetLastError();
    std::printf("devices: the runtime does not open a pool for reading alone here (%s); nothing checked\n",
                cudaGetErrorName(err));
    return false;
  }
  set_default_pool_access(0, 1, cudaMemAccessFlagsProtNone);
  return true;
}

void open_default_pool(int owner, int accessor) {
  set_default_pool_access(owner, accessor, cudaMemAccessFlagsProtReadWrite);
}

int pool_access() {
  const bool simulated = dlsym(RTLD_DEFAULT, "simcuda_accessible") != nullptr;
  int count = 0;
  CHECK_CUDA(cudaGetDeviceCount(&count));
  int can = 0;
  if (count >= 2) CHECK_CUDA(cudaDeviceCanAccessPeer(&can, 1, 0));
  if (can == 0) {
    std::printf("devices: device 1 cannot access device 0 here; nothing checked\n");
    return 0;
  }
  int third = 0;
  if (count >= 3) CHECK_CUDA(cudaDeviceCanAccessPeer(&third, 2, 1));
  if (third != 0) open_default_pool(1, 2);  // before device 1 is used at all
  cudaStream_t streams[2] = {};
  for (int d = 0; d < 2; ++d) {
    CHECK_CUDA(cudaSetDevice(d));
    CHECK_CUDA(cudaStreamCreateWithFlags(&streams[d], cudaStreamNonBlocking));
  }
  CHECK_CUDA(cudaSetDevice(0));
  void* before = nullptr;
  CHECK_CUDA(cudaMallocAsync(&before, kBytes, streams[0]));
  if (simulated) EXPECT(!accessible(before, 1));
  open_default_pool(0, 1);
  cudaMemPool_t pool = nullptr;
  CHECK_CUDA(cudaDeviceGetDefaultMemPool(&pool, 0));
  void* after[3] = {};
  CHECK_CUDA(cudaMallocAsync(&after[0], kBytes / 2, streams[0]));
  CHECK_CUDA(cudaMallocAsync(&after[1], 3 * kBytes, streams[0]));  // more memory than the device had
  CHECK_CUDA(cudaMallocFromPoolAsync(&after[2], kBytes, pool, streams[0]));
  const size_t sizes[3] = {kBytes / 2, 3 * kBytes, kBytes};
  CHECK_CUDA(cudaStreamSynchronize(streams[0]));
  CHECK_CUDA(cudaSetDevice(1));
  for (int i = 0; i < 3; ++i) {
    expect_on(after[i], 0);
    EXPECT(accessible(after[i], 1));
    if (simulated && third != 0) EXPECT(!accessible(after[i], 2));
    // Device 1 writes it: on a GPU, a fault where it may not.
    const auto tag = static_cast<unsigned char>(0x40 + i);
    CHECK_CUDA(cudaMemsetAsync(after[i], tag, sizes[i], streams[1]));
    CHECK_CUDA(cudaStreamSynchronize(streams[1]));
    EXPECT(testprog::holds_sampled(after[i], sizes[i], tag));
  }
  void* theirs = nullptr;
  CHECK_CUDA(cudaMallocAsync(&theirs, kBytes, streams[1]));
  expect_on(theirs, 1);
  if (third != 0) EXPECT(accessible(theirs, 2));
  if (simulated) EXPECT(!accessible(theirs, 0));
  const bool lent_before_open = accessible(before, 1);
  CHECK_CUDA(cudaFreeAsync(theirs, streams[1]));
  CHECK_CUDA(cudaSetDevice(0));
  for (void* p : after) CHECK_CUDA(cudaFreeAsync(p, streams[0]));
  CHECK_CUDA(cudaFreeAsync(before, streams[0]));
  for (int d = 0; d < 2; ++d) {
    CHECK_CUDA(cudaSetDevice(d));
    CHECK_CUDA(cudaStreamSynchronize(streams[d]));
    CHECK_CUDA(cudaStreamDestroy(streams[d]));
  }
  std::printf("{\"lent_before_open\": %s}\n", lent_before_open ? "true" : "false");
  return 0;
}

// Device 1's memory, opened to device 0 by peer access and by its default
// pool, then closed again reason by reason.
int access_revoked() {
  const bool simulated = dlsym(RTLD_DEFAULT, "simcuda_accessible") != nullptr;
  if (!can_access(0, 1)) return 0;
  auto peer_access = [](bool on) { set_peer_access(0, 1, on, 1); };
  peer_access(true);
  open_default_pool(1, 0);
  cudaStream_t s = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void* plain = nullptr;
  void* ordered = nullptr;
  CHECK_CUDA(cudaMalloc(&plain, kBytes));
  CHECK_CUDA(cudaMallocAsync(&ordered, kBytes, s));
  CHECK_CUDA(cudaStreamSynchronize(s));
  EXPECT(accessible(plain, 0));
  EXPECT(accessible(ordered, 0));
  // The pool closed: peer access still opens cudaMalloc memory.
  set_default_pool_access(1, 0, cudaMemAccessFlagsProtNone);
  EXPECT(accessible(plain, 0));
  // Peer access gone too: nothing of device 1's is open to device 0, pages
  // mapped before or after.
  peer_access(false);
  void* later = nullptr;
  void* later_ordered = nullptr;
  CHECK_CUDA(cudaMalloc(&later, 3 * kBytes));
  CHECK_CUDA(cudaMallocAsync(&later_ordered, 3 * kBytes, s));
  CHECK_CUDA(cudaStreamSynchronize(s));
  if (simulated) {
    for (void* p : {plain, ordered, later, later_ordered}) EXPECT(!accessible(p, 0));
  }
  // Peer access again opens cudaMalloc memory.
  peer_access(true);
  EXPECT(accessible(plain, 0));
  EXPECT(accessible(later, 0));
  // The pool alone opens stream-ordered memory, and its closing closes it.
  peer_access(false);
  open_default_pool(1, 0);
  EXPECT(accessible(later_ordered, 0));
  set_default_pool_access(1, 0, cudaMemAccessFlagsProtNone);
  if (simulated) EXPECT(!accessible(later_ordered, 0));
  for (void* p : {ordered, later_ordered}) CHECK_CUDA(cudaFreeAsync(p, s));
  for (void* p : {plain, later}) CHECK_CUDA(cudaFree(p));
  CHECK_CUDA(cudaStreamSynchronize(s));
  CHECK_CUDA(cudaStreamDestroy(s));
  // A reset starts device 1's default pool closed.
  open_default_pool(1, 0);
  CHECK_CUDA(cudaDeviceReset());
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void* after_reset = nullptr;
  CHECK_CUDA(cudaMallocAsync(&after_reset, kBytes, s));
  CHECK_CUDA(cudaStreamSynchronize(s));
  if (simulated) EXPECT(!accessible(after_reset, 0));
  CHECK_CUDA(cudaFreeAsync(after_reset, s));
  CHECK_CUDA(cudaStreamSynchronize(s));
  CHECK_CUDA(cudaStreamDestroy(s));
  return 0;
}

// A stream-ordered block of `device`'s on a new stream, written and freed;
// where the runtime can say, closed to device `closed_to` (-1: not checked).
void stream_ordered_block(int device, int closed_to = -1) {
  CHECK_CUDA(cudaSetDevice(device));
  cudaStream_t s = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void* p = nullptr;
  CHECK_CUDA(cudaMallocAsync(&p, kBytes, s));
  expect_on(p, device);
  if (closed_to >= 0 && dlsym(RTLD_DEFAULT, "simcuda_accessible") != nullptr) EXPECT(!accessible(p, closed_to));
  fill(p, 7, s);
  CHECK_CUDA(cudaFreeAsync(p, s));
  CHECK_CUDA(cudaStreamSynchronize(s));
  CHECK_CUDA(cudaStreamDestroy(s));
}

int pool_access_reset() {
  if (!can_access(1, 0)) return 0;
  cudaMemPool_t own = testprog::new_device_pool(0);
  cudaMemAccessDesc desc{};
  desc.location.type = cudaMemLocationTypeDevice;
  desc.location.id = 1;
  desc.flags = cudaMemAccessFlagsProtReadWrite;
  CHECK_CUDA(cudaMemPoolSetAccess(own, &desc, 1));  // not the default pool: nothing of gpupool's
  stream_ordered_block(0);
  open_default_pool(0, 1);
  stream_ordered_block(0);
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaDeviceReset());  // destroys `own` too
  stream_ordered_block(0, 1);
  open_default_pool(1, 0);
  CHECK_CUDA(cudaSetDevice(1));
  CHECK_CUDA(cudaDeviceReset());
  stream_ordered_block(1, 0);  // its pool's grant was forgotten with the reset, though it had no pool of gpupool's
  return 0;
}

// Device 0 given peer access to device 1's memory once device 1 has pooled
// pages, then more pages mapped.
int peer_after_pages() {
  if (!can_access(0, 1)) return 0;
  CHECK_CUDA(cudaSetDevice(1));
  void* before = nullptr;
  CHECK_CUDA(cudaMalloc(&before, kBytes));
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaDeviceEnablePeerAccess(1, 0));
  CHECK_CUDA(cudaSetDevice(1));
  void* after = nullptr;
  CHECK_CUDA(cudaMalloc(&after, 3 * kBytes));
  expect_on(after, 1);
  fill(before, 0x21, nullptr);
  fill(after, 0x22, nullptr);
  const bool before_open = accessible(before, 0);
  const bool after_open = accessible(after, 0);
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaDeviceDisablePeerAccess(1));
  // Every page of both, since a driver may have opened some pages and not
  // others.
  auto closed_whole = [](const void* p, size_t bytes) {
    for (size_t at = 0; at < bytes; at += 1 << 20) {
      if (accessible(static_cast<const char*>(p) + at, 0)) return false;
    }
    return true;
  };
  const bool closed = closed_whole(before, kBytes) && closed_whole(after, 3 * kBytes);
  std::printf("{\"before\": %s, \"after\": %s, \"closed\": %s}\n", before_open ? "true" : "false",
              after_open ? "true" : "false", closed ? "true" : "false");
  for (void* p : {before, after}) CHECK_CUDA(cudaFree(p));
  return 0;
}

int pool_read(bool read_gives_write) {
  if (!can_access(1, 0) || !pool_opens_for_reading()) return 0;
  const int read_write = cudaMemAccessFlagsProtReadWrite;
  // What a grant to read gives gpupool's pages where the driver will not
  // map pages for reading alone (SIMCUDA_REFUSE_ACCESS=1:read): reading and
  // writing.
  const int read = read_gives_write ? read_write : cudaMemAccessFlagsProtRead;
  auto peer_access = [](bool on) { set_peer_access(1, 0, on, 0); };
  // Granted before device 0 has memory: its first pages map for reading.
  set_default_pool_access(0, 1, cudaMemAccessFlagsProtRead);
  CHECK_CUDA(cudaSetDevice(0));
  cudaStream_t s = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void* ordered = nullptr;
  void* plain = nullptr;
  CHECK_CUDA(cudaMallocAsync(&ordered, 3 * kBytes, s));
  CHECK_CUDA(cudaMalloc(&plain, kBytes));
  CHECK_CUDA(cudaStreamSynchronize(s));
  expect_access(ordered, read);
  expect_no_more(plain, read);
  // Closed, then granted again once the pages are there.
  set_default_pool_access(0, 1, cudaMemAccessFlagsProtNone);
  expect_access(ordered, cudaMemAccessFlagsProtNone);
  set_default_pool_access(0, 1, cudaMemAccessFlagsProtRead);
  expect_access(ordered, read);
  // For writing too, then for reading alone again.
  set_default_pool_access(0, 1, cudaMemAccessFlagsProtReadWrite);
  expect_access(ordered, read_write);
  set_default_pool_access(0, 1, cudaMemAccessFlagsProtRead);
  expect_access(ordered, read);
  expect_no_more(plain, read);
  // Peer access opens cudaMalloc memory for writing, pages mapped before and
  // after; taken away, the pool's grant to read is what is left.
  peer_access(true);
  void* during = nullptr;
  CHECK_CUDA(cudaMalloc(&during, 3 * kBytes));
  for (void* p : {plain, during}) expect_access(p, read_write);
  peer_access(false);
  expect_access(ordered, read);
  for (void* p : {plain, during}) expect_no_more(p, read);
  // Closed: nothing of device 0's is open to device 1.
  set_default_pool_access(0, 1, cudaMemAccessFlagsProtNone);
  for (void* p : {ordered, plain, during}) expect_access(p, cudaMemAccessFlagsProtNone);
  CHECK_CUDA(cudaFreeAsync(ordered, s));
  for (void* p : {plain, during}) CHECK_CUDA(cudaFree(p));
  CHECK_CUDA(cudaStreamSynchronize(s));
  CHECK_CUDA(cudaStreamDestroy(s));
  return 0;
}

// One thread opens and closes device 0's memory to device 1 while another
// makes, writes, checks and frees device 0's blocks and gives its idle pages
// back.
int access_churn() {
  if (!can_access(1, 0) || !pool_opens_for_reading()) return 0;
  std::atomic<unsigned> steps{0};  // the blocks' thread's, ~0u once it is done
  unsigned changes = 0;
  std::thread grants([&] {
    CHECK_CUDA(cudaSetDevice(1));
    const cudaMemAccessFlags kPoolSteps[] = {cudaMemAccessFlagsProtRead, cudaMemAccessFlagsProtReadWrite,
                                             cudaMemAccessFlagsProtRead, cudaMemAccessFlagsProtNone};
    bool peer = false;
    // A change or so a block, each while that block's calls run.
    for (unsigned seen = 0; seen != ~0u; ++changes) {
      if (changes % 5 == 4) {
        peer = !peer;
        set_peer_access(1, 0, peer, 1);
      } else {
        set_default_pool_access(0, 1, kPoolSteps[changes % 4]);
      }
      const unsigned last = seen;
      while ((seen = steps.load()) == last) std::this_thread::yield();
    }
    if (peer) set_peer_access(1, 0, false, 1);
  });
  CHECK_CUDA(cudaSetDevice(0));
  cudaStream_t s = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaMemPool_t pool = nullptr;
  CHECK_CUDA(cudaDeviceGetDefaultMemPool(&pool, 0));
  struct Block {
    void* p;
    size_t bytes;
    unsigned char tag;
    bool ordered;
  };
  std::vector<Block> live;
  auto release = [&](const Block& b) {
    CHECK_CUDA(cudaStreamSynchronize(s));
    EXPECT(testprog::holds_sampled(b.p, b.bytes, b.tag));
    CHECK_CUDA(b.ordered ? cudaFreeAsync(b.p, s) : cudaFree(b.p));
  };
  unsigned step = 0;
  while (++step <= 400) {
    steps.store(step);
    Block b{nullptr, (1 + step % 5) * (kBytes / 4), static_cast<unsigned char>(step), step % 2 == 0};
    CHECK_CUDA(b.ordered ? cudaMallocAsync(&b.p, b.bytes, s) : cudaMalloc(&b.p, b.bytes));
    CHECK_CUDA(cudaMemsetAsync(b.p, b.tag, b.bytes, s));
    live.push_back(b);
    if (live.size() > 6) {
      const size_t victim = step * 7 % live.size();
      release(live[victim]);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(victim));
    }
    if (step % 16 == 0) CHECK_CUDA(cudaMemPoolTrimTo(pool, 0));  // pages unmapped while grants change
  }
  steps.store(~0u);
  grants.join();
  // Settled: the pool open for reading alone, no peer access.
  set_default_pool_access(0, 1, cudaMemAccessFlagsProtRead);
  void* fresh = nullptr;
  CHECK_CUDA(cudaMallocAsync(&fresh, 3 * kBytes, s));
  CHECK_CUDA(cudaStreamSynchronize(s));
  expect_access(fresh, cudaMemAccessFlagsProtRead);
  for (const Block& b : live) expect_no_more(b.p, cudaMemAccessFlagsProtRead);
  set_default_pool_access(0, 1, cudaMemAccessFlagsProtNone);
  expect_access(fresh, cudaMemAccessFlagsProtNone);
  for (const Block& b : live) expect_access(b.p, cudaMemAccessFlagsProtNone);
  for (const Block& b : live) release(b);
  CHECK_CUDA(cudaFreeAsync(fresh, s));
  CHECK_CUDA(cudaStreamSynchronize(s));
  CHECK_CUDA(cudaStreamDestroy(s));
  std::printf("{\"steps\": %u, \"changes\": %u}\n", step - 1, changes);
  return 0;
}

int peer_reset() {
  const bool simulated = dlsym(RTLD_DEFAULT, "simcuda_accessible") != nullptr;
  if (!can_access(0, 1)) return 0;
  auto block_of_device_one = [](size_t bytes) {
    CHECK_CUDA(cudaSetDevice(1));
    void* p = nullptr;
    CHECK_CUDA(cudaMalloc(&p, bytes));
    return p;
  };
  auto reset = [](int device) {
    CHECK_CUDA(cudaSetDevice(device));
    CHECK_CUDA(cudaDeviceReset());
  };
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaDeviceEnablePeerAccess(1, 0));
  void* before = block_of_device_one(kBytes);
  EXPECT(accessible(before, 0));
  // The owner's reset ends the access: its memory from then on is its own.
  reset(1);
  void* after_owner_reset = block_of_device_one(kBytes);
  if (simulated) EXPECT(!accessible(after_owner_reset, 0));
  // Enabled again (not "already enabled"), then the accessor's reset: no
  // block of device 1's is device 0's, made before or after.
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaDeviceEnablePeerAccess(1, 0));
  EXPECT(accessible(after_owner_reset, 0));
  reset(0);
  void* after_accessor_reset = block_of_device_one(3 * kBytes);
  if (simulated) {
    for (void* p : {after_owner_reset, after_accessor_reset}) EXPECT(!accessible(p, 0));
  }
  for (void* p : {after_owner_reset, after_accessor_reset}) CHECK_CUDA(cudaFree(p));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "peer") == 0) return peer();
  if (argc > 1 && std::strcmp(argv[1], "pool-access") == 0) return pool_access();
  if (argc > 1 && std::strcmp(argv[1], "pool-access-reset") == 0) return pool_access_reset();
  if (argc > 1 && std::strcmp(argv[1], "access-revoked") == 0) return access_revoked();
  if (argc > 1 && std::strcmp(argv[1], "peer-after-pages") == 0) return peer_after_pages();
  if (argc > 1 && std::strcmp(argv[1], "pool-read") == 0) {
    return pool_read(argc > 2 && std::strcmp(argv[2], "read-gives-write") == 0);
  }
  if (argc > 1 && std::strcmp(argv[1], "access-churn") == 0) return access_churn();
  if (argc > 1 && std::strcmp(argv[1], "peer-reset") == 0) return peer_reset();
  std::fprintf(stderr,
               "usage: device_access peer|pool-access|pool-access-reset|access-revoked|peer-after-pages|"
               "pool-read [read-gives-write]|access-churn|peer-reset\n");
  return 2;
}
