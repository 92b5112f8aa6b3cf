// The process-wide state behind the exported entry points: configuration, one
// pool per device (each behind its own lock), the streams seen, and the
// lifecycle: lazy start on the first intercepted call, fork, report on demand,
// report at exit. Created once and never destroyed, so nothing here runs during
// static destruction.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "config/config.hpp"
#include "pool/device_pool.hpp"
#include "shim/call_sites.hpp"
#include "shim/cuda_upstream.hpp"
#include "shim/locks.hpp"
#include "shim/step_aside.hpp"
#include "shim/thread_cache.hpp"
#include "shim/trace_writer.hpp"

namespace gpupool::shim {

inline constexpr int kMaxDevices = 64;

struct DeviceState {
  DeviceState(int index, const UnsafeCallRules& rules, bool alone) : device(index), upstream(index, rules, alone) {}
  int device;
  AdaptiveMutex mu;
  CudaUpstream upstream;
  std::unique_ptr<DevicePool> pool;
  // Blocks freed with cudaFreeAsync on another device's stream. The pool
  // orders only this device's streams, so each waits here, still allocated in
  // the pool, until an event recorded on that stream after the free has
  // completed; then it goes back as freed. Event 0: freed inside a capture of
  // that stream, the graph's for good. Guarded by mu.
  struct ForeignFree {
    DevicePtr ptr;
    EventHandle event;
    int event_device;  // the freeing stream's device
  };
  std::vector<ForeignFree> foreign_frees;
  // Captures under way on its streams, with the mode each began in (which
  // says whom it forbids unsafe calls) and the thread that began it (whose
  // count a thread-local one is in). Guarded by mu.
  struct Capture {
    StreamId stream;
    cudaStreamCaptureMode mode;
    StreamId thread;  // its this_thread_stream(), never reused
  };
  std::vector<Capture> captures;
  // A block a thread's cache lent again may serve a request of another size
  // than the one the pool lent it for, which the pool goes on counting (its
  // current requested bytes drift from the program's; the caches count the
  // drift). When the block goes back to the pool, the pool counts that first
  // request freed: the report counts the last one, this much more per pool
  // kind, and as much less drift. Guarded by mu.
  std::int64_t requested_returned_drift[kPoolKinds] = {};
  // Reset after gpupool stepped aside: the runtime freed its memory, so the
  // pool no longer says which pointers are gpupool's.
  std::atomic<bool> reset_after_stepping_aside{false};
};

// True when the process has loaded the CUDA driver (libcuda): it used CUDA.
bool cuda_driver_loaded();
// At exit, in a process that used CUDA without a single allocation reaching
// gpupool: one line on what gpupool cannot see.
void explain_nothing_pooled(bool static_runtime_asked);
// At exit: one line naming a library seen taking memory from the driver by
// name without being taken over, if any (the program's other memory was
// pooled, or none was). True when it wrote the line.
bool explain_library_not_taken_over(bool nothing_pooled);
// The file name of the first library seen fetching the driver's allocation
// calls itself (by name) without being taken over; empty if none.
std::string driver_library_not_taken_over();

// The calling thread's last stream named in a stream-ordered call, with its
// device, while streams_generation_ was `generation` (0: none yet).
struct LastStream {
  StreamId stream;
  int device;
  std::uint64_t generation;
};
extern constinit thread_local LastStream t_last_stream;

class Runtime {
 public:
  // Inline: every intercepted call asks (the first one starts it).
  static Runtime& get() {
    Runtime* r = if_started();
    return r != nullptr ? *r : start();
  }
  // The runtime if some intercepted call has started it, else null.
  static Runtime* if_started() { return started_.load(std::memory_order_acquire); }

  // True when calls go straight to the runtime: GPUPOOL_DISABLE=1, the
  // process is exiting (nothing may call into CUDA for the pool then), or
  // gpupool stepped aside (step_aside.hpp).
  bool bypass() const { return disabled_ || exiting_.load(std::memory_order_relaxed) || stepped_aside(); }
  bool disabled() const { return disabled_; }
  bool exiting() const { return exiting_.load(std::memory_order_relaxed); }
  const config::Config& config() const { return config_; }

  // With `runtime_serves` (a stream-ordered call): nothing is allocated and
  // *runtime_serves is set where the runtime must serve the call instead:
  // the consumer stream is capturing (the allocation becomes a graph node),
  // or the program made a pool of its own the device's current pool (see
  // current_pool_set).
  // named_default_pool: cudaMallocFromPoolAsync named the device's default
  // pool, which is gpupool's whatever pool is current.
  cudaError_t allocate(void** out, std::size_t size, StreamId consumer, int device, bool* runtime_serves = nullptr,
                       bool named_default_pool = false);
  // Freed: done. NotOwned: the caller passes the pointer to the runtime.
  // NotAllocated: a pointer inside the pool that is not live (double free).
  // Once gpupool has stepped aside, a pointer into the pool is Freed and kept.
  // site_device: the device of the stream `site` (a stream-ordered free).
  // Freed, *owner (if given) is the device whose memory it was.
  FreeResult deallocate(void* ptr, StreamId site, int site_device = -1, int* owner = nullptr);
  // The device whose pool holds the memory ptr lies in, or -1.
  int device_holding(const void* ptr);
  // Waits for all work on `device`, as the runtime's cudaFree does for the
  // memory it frees (free_synchronizes:1); returns the error it reports.
  cudaError_t synchronize_for_free(int device);

  // With one device visible, that one without asking (inline: every
  // allocation asks).
  int current_device() const { return one_device_.load(std::memory_order_relaxed) ? 0 : asked_current_device(); }
  int asked_current_device() const;
  int device_of(StreamId stream);
  void stream_created(cudaStream_t stream, unsigned flags);
  // Before the runtime destroys `stream`: returns its device, or -1 where
  // gpupool does not know it. Then stream_destroy_answered with the answer.
  int stream_destroying(cudaStream_t stream);
  void stream_destroy_answered(StreamId stream, int device, bool destroyed);
  // The device of a stream a call names, after registering the stream with
  // that device's pool on first sight. Cached per thread for the last stream.
  // kNoSuchStream where gpupool does not know the handle and the runtime
  // says it names no stream (cudaErrorInvalidResourceHandle: a destroyed
  // one): the call is the runtime's to answer, as without gpupool.
  static constexpr int kNoSuchStream = -1;
  int prepare_stream(StreamId stream) {
    const LastStream& last = t_last_stream;
    if (last.stream == stream && last.generation == streams_generation_.load(std::memory_order_acquire)) {
      return last.device;
    }
    return prepare_new_stream(stream);
  }
  void note_stream_ordered_call() { caches_.note_caller(); }
  // The calling thread is ending (a pthread key's destructor): its cache
  // goes back, then its per-thread stream leaves the pools' books
  // (DevicePool::thread_stream_ended), so that they do not keep a stream per
  // thread that ever lived. A main thread that returns from main never gets
  // here (exit runs no key destructors), so its stream stays for the report;
  // one that calls pthread_exit ends like any other thread.
  void thread_ending();
  void capture_began(StreamId stream, cudaStreamCaptureMode mode);
  void capture_ended(StreamId stream);
  // Whether the runtime says `stream` captures (asked after it refused an end).
  bool still_capturing(StreamId stream);
  bool any_capture() const { return captures_active_.load(std::memory_order_relaxed) > 0; }
  void adjust_mem_get_info(std::size_t* free_bytes, std::size_t* total_bytes);
  // Before the runtime's reset of `device`: what must be done while its
  // events still mean something.
  void device_resetting(int device);
  // After it, with the runtime's answer. If the reset took place (it
  // succeeded, or the memory gpupool held there is gone: a reset may return
  // an earlier launch's error), gpupool forgets the device's memory and
  // pools, its streams' captures end, and other devices' blocks freed inside
  // those captures go back to their pools. If the runtime refused it (that
  // memory is still there), nothing changes.
  void device_reset_answered(int device, cudaError_t err);
  // The same, once gpupool has stepped aside: the device's pool is left as
  // it was, and pointers into it are no longer taken as gpupool's (unless
  // the runtime refused the reset).
  void device_reset_after_stepping_aside(int device, cudaError_t err);
  // cudaMemPoolTrimTo(pool, keep): each device whose default pool that is
  // gives back its idle memory (threads' caches first), unless it reserves
  // no more than `keep`.
  void trim(cudaMemPool_t pool, std::size_t keep);
  // cudaDeviceSetMemPool(device, pool) succeeded (or CUDA 13's
  // cudaMemSetMemPool for the device's pinned memory). While a device's
  // current pool is one the program made, its cudaMallocAsync calls are the
  // runtime's: that pool's properties (IPC export, peer access, location)
  // are what the program asked for.
  void current_pool_set(int device, cudaMemPool_t pool);
  // cudaMemPoolSetAccess(pool, descs, count) succeeded. Where `pool` is a
  // device's default pool, the devices it opened it to may use that
  // device's stream-ordered memory, gpupool's: its mapped pages are opened
  // to them, now and later (peer access does not reach pool memory, so
  // nothing else would). A pool of fixed segments cannot follow (cudaMalloc
  // memory opens only to peer access), so its device's stream-ordered calls
  // go to the runtime from then on. Access taken away again
  // (cudaMemAccessFlagsProtNone) closes the pages to that device, unless it
  // still has peer access; where the runtime serves, its pool follows.
  void pool_access_set(cudaMemPool_t pool, const cudaMemAccessDesc* descs, std::size_t count);
  // cudaMemPoolDestroy succeeded: a device whose current pool it was has its
  // default pool current again.
  void pool_destroyed();
  // Whether `pool` is `device`'s default memory pool (the pool gpupool's
  // memory stands for).
  bool is_default_pool(cudaMemPool_t pool, int device);
  // cudaMemPoolGetAttribute(pool, attr) gave the runtime's figure in *value:
  // adds what gpupool holds for each device whose default pool that is,
  // bytes reserved or in use (blocks threads keep are not), now or at the
  // high watermark. Other attributes are the runtime's alone.
  void add_pool_figure(cudaMemPool_t pool, cudaMemPoolAttr attr, void* value);
  // cudaMemPoolSetAttribute reset one of those high watermarks: gpupool's too,
  // once threads' caches are back in the pool.
  void reset_pool_high(cudaMemPool_t pool, cudaMemPoolAttr attr);
  // False, after a line saying why, when a CUDA IPC handle for ptr would make
  // the other process map memory other than the program's block: the block
  // lies in an expandable segment (not exportable) or not at its segment's
  // start (the handle names the segment). The line names `call` (the
  // runtime's or the driver's) and its `refusal`.
  bool ipc_exportable(const void* ptr, const char* call, const char* refusal);
  // Why one device may reach another's memory: gpupool's pages of `owner`
  // are open to `accessor` while any holds (one page serves both kinds of
  // blocks), for reads and writes unless the default pool's read-only grant
  // (cudaMemAccessFlagsProtRead) is all that holds. The pool has one grant
  // at a time: kPoolAccess or kPoolReadAccess.
  enum AccessReason : unsigned { kPeerAccess = 1, kPoolAccess = 2, kPoolReadAccess = 4 };
  static constexpr unsigned kAnyPoolAccess = kPoolAccess | kPoolReadAccess;
  // `accessor` may now reach `owner`'s memory (cudaDeviceEnablePeerAccess, or
  // owner's default pool opened to it, or opened again with other flags): so
  // may it gpupool's pages there.
  void access_granted(int accessor, int owner, AccessReason reason);
  // Taken away again (cudaDeviceDisablePeerAccess, the pool closed, or, for
  // every reason at once, a device reset): `reasons` is a set of them.
  void access_revoked(int accessor, int owner, unsigned reasons);

  // A report requested by signal is written by the next intercepted call.
  void poll_report_request() {
    if (report_requested_.load(std::memory_order_relaxed)) write_requested_report();
  }
  void write_report(const char* reason);
  void at_exit();

  // Fork safety: no pool lock may be held across fork().
  void before_fork();
  void after_fork_parent();
  void after_fork_child();

 private:
  Runtime();
  // False where the handle is new to gpupool and the runtime says it names
  // no stream; it is then left out of the books.
  bool ensure_known(StreamId stream, int device);
  // prepare_stream for a stream other than the thread's last one, or after
  // streams came or went.
  int prepare_new_stream(StreamId stream);
  // The device's state, made on first use (the check inline: every
  // allocation and free asks).
  DeviceState& device(int index) {
    if (DeviceState* d = existing(index)) return *d;
    return make_device(index);
  }
  DeviceState& make_device(int index);
  DeviceState* existing(int index) const { return devices_[index].load(std::memory_order_acquire); }
  void install_report_signal();
  void write_requested_report();
  // Before a report: the blocks held outside the pools (threads' caches,
  // frees whose work on another device is done) go back to them.
  void return_held_blocks();
  void warn_oom(const DeviceState& d);
  // Drops the captures of `stream` (kAnyStream: of all d's streams) from the
  // books: captures that ended without cudaStreamEndCapture (their stream
  // was destroyed, their thread ended, their device was reset). Under d.mu.
  void forget_captures(DeviceState& d, StreamId stream);
  // After a reset that may or may not have taken place: drops the captures
  // whose stream the runtime says no longer captures. Takes d.mu.
  void forget_ended_captures(DeviceState& d);
  // The reset took place: a fresh pool, the old one's history carried on.
  void forget_device_memory(DeviceState& d);
  enum class ResetOutcome { Happened, Refused, Unknown };
  ResetOutcome reset_outcome(DeviceState& d, cudaError_t err);
  // Takes a capture's share off the counts capture_began added to.
  void uncount_capture(const DeviceState::Capture& c);
  // Tells the device's pool of a program's stream (flags as cudaStreamCreateWithFlags').
  void introduce_stream(int dev, StreamId id, unsigned flags);
  // Adds the streams whose books the pool of `d` closed since it was last
  // asked (see DevicePool::take_forgotten_streams). Under its lock.
  // The check inline: every pooled call makes it, and it is nearly always false.
  static void take_forgotten_streams(DeviceState& d, std::vector<StreamId>* into) {
    if (d.pool->streams_forgotten()) move_forgotten_streams(d, into);
  }
  static void move_forgotten_streams(DeviceState& d, std::vector<StreamId>* into);
  // Forgets those handles here too: a stream given one later is introduced
  // to the pool as new, and blocks threads keep for them go back. Not under
  // a pool's lock.
  void forget_stream_handles(int dev, const std::vector<StreamId>& ids);
  // After a reset of `dev` (not refused): forgets the handles of its streams.
  void forget_device_streams(int dev);
  // Bytes of `device`'s blocks that threads keep for reuse: the program freed
  // them, the pool counts them allocated. Takes the caches' locks, so call it
  // before the pool's.
  std::int64_t kept_by_threads(int device);
  // Calls f(d) for each device d whose default memory pool is `pool` (the
  // pool gpupool's memory stands for).
  template <typename F>
  void for_each_device_of_pool(cudaMemPool_t pool, F&& f);
  // The device whose default memory pool `pool` is, or -1 (any device, with
  // a pool of gpupool's or not).
  int device_of_default_pool(cudaMemPool_t pool);
  // d's default pool was opened to another device: where d's pool has fixed
  // segments, its stream-ordered calls go to the runtime from now on (see
  // pool_access_set), said once. d.mu not held.
  void follow_opened_pool(DeviceState& d);
  // `dev` was reset: its default pool starts closed again, and peer access
  // to its memory and from it ends (as CUDA documents for
  // cudaDeviceEnablePeerAccess), so gpupool's pages close where no grant is
  // left.
  void end_grants_at_reset(int dev);
  // A store only the first time: every call writing the flag would bounce its
  // cache line between the cores of a multi-threaded program.
  void mark_used() {
    if (!used_.load(std::memory_order_relaxed)) used_.store(true, std::memory_order_relaxed);
  }
  bool take_cached(void** out, std::size_t size, StreamId consumer, int device);
  // The block the calling thread's cache kept past its limit, if any, back to d's pool (d.mu held).
  [[gnu::noinline]] void return_spill(DeviceState& d, int dev);
  // deallocate once gpupool has stepped aside.
  FreeResult keep_after_stepping_aside(DevicePtr ptr, int* owner);
  // deallocate's free of p from d's pool where more than the pool's free is
  // owed (d.mu held): a free on another device's stream, a trace to write,
  // frees waiting on another device (p may be among them: freed twice), the
  // last request of a block the live table tracked to count.
  [[gnu::noinline]] FreeResult free_with_books(DeviceState& d, DevicePtr p, StreamId site, int site_device,
                                               int index, bool foreign_site, const std::size_t* last_request);
  // A block of d freed on a stream of another device (d.mu held).
  FreeResult free_foreign(DeviceState& d, DevicePtr ptr, StreamId site, int site_device);
  // Gives back to d's pool the foreign frees whose event has completed; with
  // `wait`, all of them, waiting for each on the host (d.mu held). With
  // `reset_device`, only those whose event is that device's, which its reset
  // is about to destroy: each is waited for, and no longer queried after.
  void return_foreign_frees(DeviceState& d, bool wait, int reset_device = -1);
  // Counts d's frees still waiting on another device's stream as freed, and
  // forgets them: the memory goes with a reset or the process, so they are
  // not waited for (d.mu held). destroy_events: the device that recorded the
  // events is still there to take them back (not at exit).
  void settle_foreign_frees(DeviceState& d, bool destroy_events);
  static void give_back_cached(const CachedBlock& block);
  // Before a block the live table tracked goes back to d's pool (or is lost
  // to a reset): its last request, `requested`, is what the report counts
  // freed (d.mu held).
  static void count_last_request(DeviceState& d, DevicePtr ptr, std::size_t requested);

  config::Config config_;
  std::vector<config::Problem> problems_;
  std::vector<std::string> config_notes_;
  std::string trace_not_opened_;  // GPUPOOL_TRACE's file could not be opened (said in the report too)
  bool disabled_ = false;
  std::atomic<bool> exiting_{false};
  std::atomic<bool> used_{false};  // an allocation reached the pool
  bool forked_child_ = false;       // CUDA was the parent's to use
  std::atomic<DeviceState*> devices_[kMaxDevices] = {};
  std::mutex devices_mu_;  // creation of device states
  int device_states_ = 0;  // made so far; guarded by devices_mu_
  bool devices_counted_ = false;  // guarded by devices_mu_
  // The runtime said it sees one device: it is always the current one, which
  // current_device() then answers without a runtime call.
  std::atomic<bool> one_device_{false};
  // The device while it is the only one with a state, else -1: where a plain
  // free's block is, without asking the runtime.
  std::atomic<int> only_device_{-1};
  // A forked child's copies of the parent's pools, kept and never used.
  // Room for one more fork's is made before it: the child's handler must not
  // allocate (another thread may have held an allocator's lock at the fork).
  std::vector<DeviceState*> inherited_;
  // The access granted between devices (guarded by devices_mu_), also for
  // pools made later: reasons is a bit of AccessReason each.
  struct AccessGrant {
    int accessor;
    int owner;
    unsigned reasons;
  };
  std::vector<AccessGrant> access_grants_;
  // How gpupool's pages open to a device for a grant's reasons.
  static CUmemAccess_flags access_flags(unsigned reasons);
  // The grant of (accessor, owner), or access_grants_.end(); devices_mu_ held.
  std::vector<AccessGrant>::iterator grant_of(int accessor, int owner);
  // stream_devices_ with streams_mu_ held: in a forked child, the parent's
  // streams are dropped at the child's first use, not in its fork handler.
  std::unordered_map<StreamId, int>& streams_locked();
  std::mutex streams_mu_;
  std::unordered_map<StreamId, int> stream_devices_;
  bool parents_streams_ = false;  // guarded by streams_mu_
  std::atomic<std::uint64_t> streams_generation_{1};  // bumped when streams come or go
  SteadyClock clock_;  // from gpupool's start: the report's times and its run length
  CallSites call_sites_;
  std::unique_ptr<TraceWriter> trace_;
  std::atomic<int> oom_warnings_{0};
  std::atomic<int> captures_active_{0};  // per-thread caches stand aside while any capture runs
  UnsafeCallRules unsafe_call_rules_;
  std::atomic<bool> own_pool_current_[kMaxDevices] = {};  // see current_pool_set
  std::atomic<cudaMemPool_t> default_pools_[kMaxDevices] = {};  // each device's, once asked
  std::atomic<std::uint64_t> own_pool_allocations_{0};     // left to the runtime so, told at exit
  std::atomic<bool> default_pool_opened_[kMaxDevices] = {};   // to another device: see pool_access_set
  std::atomic<bool> opened_pool_to_runtime_[kMaxDevices] = {};  // the runtime serves it: fixed segments
  std::atomic<std::uint64_t> opened_pool_allocations_{0};  // left to the runtime so, told at exit
  StreamCaches caches_{&Runtime::give_back_cached};

  static Runtime& start();  // once, by the first call (threads meeting there wait for it)
  static std::atomic<Runtime*> started_;
  static std::atomic<bool> report_requested_;
  static void on_report_signal(int);
};

}  // namespace gpupool::shim
