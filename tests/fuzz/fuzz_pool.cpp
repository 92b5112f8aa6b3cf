// The pool under any configuration and any sequence of the calls the shim
// makes: allocations and frees on plain, legacy, blocking and non-blocking
// streams (and three more non-blocking streams no block is freed on, as in a
// stream pool, which make barriers check first whether the device has caught
// up), cross-stream frees, captures (here and on another device), a stream
// destroyed and its handle reused (a capturing one too), device failures, a
// device that lags or keeps up (or one stream that lags behind the rest),
// cache releases, threads that allocate on their per-thread default streams
// and end, a stream destroyed through the driver whose handle stays unused
// for a while (then named again by a stream made there too, or given to one
// the runtime makes). After
// every step every invariant of the pool holds; no allocation overlaps a live
// one or leaves the device's memory, and none may race the work queued before
// its bytes were last freed (ordering_oracle.hpp judges by CUDA's rules), not
// even on a stream made while a plain allocation is live; no page is unmapped
// under queued work; nothing a capture forbids is called during one; at the
// end the books balance.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "pool/device_pool.hpp"
#include "pool/size_rules.hpp"
#include "pool/virtual_upstream.hpp"
#include "tests/fuzz/fuzz_check.hpp"
#include "tests/fuzz/ordering_oracle.hpp"
#include "tests/stream_rows.hpp"

using namespace gpupool;

namespace {

class Input {
 public:
  Input(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  bool empty() const { return at_ == size_; }
  std::uint8_t byte() { return at_ < size_ ? data_[at_++] : 0; }
  template <typename T, std::size_t N>
  T pick(const T (&choices)[N]) { return choices[byte() % N]; }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t at_ = 0;
};

constexpr StreamId kLegacy = VirtualUpstream::kLegacy;
constexpr StreamId kNonBlocking = 0x100;
constexpr StreamId kBlocking = 0x200;
constexpr StreamId kPoolStreams[] = {0x300, 0x301, 0x302};  // non-blocking
constexpr std::size_t kMostLive = 256 * kGiB;

PoolOptions options_from(Input& in) {
  PoolOptions o;
  const std::uint8_t flags = in.byte();
  o.expandable_segments = (flags & 1) != 0;
  o.recycle_pages = (flags & 2) != 0;
  o.cross_stream_reuse = static_cast<CrossStreamReuse>((flags >> 2) % 3);
  // From the flags' top bits, so that the saved inputs decode as before
  // (those with both bits clear, exactly).
  constexpr std::uint32_t kSearches[] = {0, 1, 4, 16};
  o.plain_reuse_search = kSearches[flags >> 6];
  o.max_split_size = in.pick({kUnlimited, 21 * kMiB, 64 * kMiB, 300 * kMiB});
  o.max_non_split_rounding = in.pick({std::size_t{0}, 20 * kMiB, kUnlimited});
  o.small_segment_size = in.pick({2 * kMiB, 4 * kMiB});
  o.large_segment_size = in.pick({4 * kMiB, 20 * kMiB, 64 * kMiB});
  const std::uint32_t divisions = in.pick({0u, 1u, 2u, 4u, 8u, 1024u});
  for (std::uint32_t& d : o.roundup_divisions) d = (in.byte() & 1) != 0 ? divisions : 0;
  o.garbage_collection_threshold = in.pick({0.0, 0.5, 0.8});
  o.memory_limit = in.pick({kUnlimited, 64 * kMiB, 300 * kMiB, 1 * kGiB});
  o.recycle_idle_allocations = in.pick({std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{16}});
  return o;
}

std::size_t size_from(Input& in) {
  // A power of two from 1 B to 1 GiB times a factor up to 2, odd sizes
  // included; now and then more than any device holds.
  const unsigned shift = in.byte() % 32;
  if (shift == 31) return kMaxRequest + in.byte();
  const std::size_t base = std::size_t{1} << shift;
  return base + base * in.byte() / 256 + in.byte() % 7;
}

void check_valid(const DevicePool& pool) {
  std::string why;
  if (pool.validate(&why)) return;
  std::fprintf(stderr, "invariant broken: %s\n", why.c_str());
  std::abort();
}

// The report's stream rows hold every cached block once (checked where the
// cache is largest: each step would slow the fuzzer down).
void check_stream_rows(const DevicePool& pool) {
  if (testing::stream_rows_cover_cache(pool)) return;
  std::fprintf(stderr, "stream rows do not add up to the cache\n");
  std::abort();
}

// FUZZ_POOL_TRACE=1 prints each step, for reading a failing input.
const bool kTrace = std::getenv("FUZZ_POOL_TRACE") != nullptr;
#define SAY(...)                                 \
  do {                                           \
    if (kTrace) std::fprintf(stderr, __VA_ARGS__); \
  } while (0)

struct Live {
  std::size_t size;
  StreamId stream;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Input in(data, size);
  const PoolOptions options = options_from(in);
  const std::size_t capacity = in.pick({kUnlimited, 512 * kMiB, 2 * kGiB});
  VirtualUpstream upstream(capacity);
  upstream.set_virtual_memory(options.expandable_segments);
  fuzz::OrderingOracle oracle(upstream);
  oracle.set_events_complete_at_once(false);
  DevicePool pool(oracle, options, capacity == kUnlimited ? 80 * kGiB : capacity);
  std::map<DevicePtr, Live> live;
  std::size_t live_bytes = 0;
  auto begin_stream = [&](StreamId id, StreamKind kind) {
    oracle.stream_begins(id, kind);
    // Unordered only when the device refused both a wait and a host wait,
    // which the pool then says (a real device fails both only once a sticky
    // error has stopped it running work).
    if (!pool.stream_created(id, kind)) {
      SAY("the new stream could not be ordered\n");
      std::vector<std::pair<DevicePtr, DevicePtr>> plain_blocks;
      for (const auto& [ptr, block] : live) {
        if (block.stream != kAnyStream) continue;
        const Block* b = pool.find_allocated(ptr);
        FUZZ_CHECK(b != nullptr);
        plain_blocks.emplace_back(b->addr, b->addr + b->size);
      }
      oracle.stream_not_ordered(id, plain_blocks);
      return;
    }
    std::string why;
    if (!oracle.stream_ready_for_plain(id, &why)) {
      std::fprintf(stderr, "unordered reuse: %s\n", why.c_str());
      std::abort();
    }
  };
  begin_stream(kLegacy, StreamKind::Legacy);
  begin_stream(kNonBlocking, StreamKind::NonBlocking);
  begin_stream(kBlocking, StreamKind::Blocking);
  for (StreamId id : kPoolStreams) begin_stream(id, StreamKind::NonBlocking);
  const StreamId streams[] = {kAnyStream, kLegacy, kNonBlocking, kBlocking};
  int failures_left = 0;
  upstream.set_failure([&](std::uint64_t) { return failures_left > 0 && failures_left-- > 0; });
  // The non-blocking stream was destroyed through the driver, and no stream
  // has its handle yet: the device refuses calls naming it.
  bool non_blocking_gone = false;
  // And the pool has closed its books (DevicePool::take_forgotten_streams,
  // which the shim drains as this does).
  bool non_blocking_forgotten = false;
  auto drain_forgotten = [&] {
    for (StreamId id : pool.take_forgotten_streams()) {
      FUZZ_CHECK(id == kNonBlocking && non_blocking_gone);
      non_blocking_forgotten = true;
    }
  };
  // Whether the program may name `stream` now. Not the gone handle, unless
  // the pool has closed its books: then a stream made through the driver
  // gets the handle, and is named; the shim, having forgotten the handle
  // too, introduces it as new. (Named earlier, it would take the old
  // stream's blocks as its own: the README's streams both made and
  // destroyed past gpupool.)
  auto may_name = [&](StreamId stream) {
    if (stream != kNonBlocking || !non_blocking_gone) return true;
    drain_forgotten();
    if (!non_blocking_forgotten) return false;
    SAY("a stream made through the driver gets the gone handle\n");
    non_blocking_gone = non_blocking_forgotten = false;
    upstream.set_gone_stream(0);
    begin_stream(kNonBlocking, StreamKind::NonBlocking);
    return true;
  };

  // Returns the block, or 0 where none was had.
  auto allocate = [&](std::size_t bytes, StreamId stream) -> DevicePtr {
    if (pool.is_capturing(stream) || !may_name(stream)) return 0;  // the shim hands those to the runtime
    // An unlimited device still has a bound here: the virtual upstream
    // keeps a node per mapped page.
    if (bytes <= kMaxRequest && live_bytes + bytes > kMostLive) return 0;
    const Allocation a = pool.allocate(bytes, stream);
    SAY("allocate %zu on %llx: %llx%s\n", bytes, static_cast<unsigned long long>(stream),
        static_cast<unsigned long long>(a.ptr), a.ok ? "" : " (failed)");
    if (!a.ok) return 0;
    FUZZ_CHECK(a.ptr % 512 == 0);
    FUZZ_CHECK(upstream.covers(a.ptr, bytes));
    auto next = live.lower_bound(a.ptr);
    FUZZ_CHECK(next == live.end() || next->first >= a.ptr + bytes);
    if (next != live.begin()) {
      auto prev = std::prev(next);
      FUZZ_CHECK(prev->first + prev->second.size <= a.ptr);
    }
    std::string why;
    if (!oracle.safe_to_use(a.ptr, bytes, stream, &why)) {
      std::fprintf(stderr, "unordered reuse: %s\n", why.c_str());
      std::abort();
    }
    live.emplace(a.ptr, Live{bytes, stream});
    live_bytes += bytes;
    return a.ptr;
  };
  auto release = [&](std::map<DevicePtr, Live>::iterator it, StreamId site) {
    const DevicePtr ptr = it->first;
    live_bytes -= it->second.size;
    SAY("free %llx on %llx\n", static_cast<unsigned long long>(ptr), static_cast<unsigned long long>(site));
    oracle.freed(ptr, it->second.size, site);
    live.erase(it);
    FUZZ_CHECK(pool.deallocate(ptr, site) == FreeResult::Freed);
    FUZZ_CHECK(pool.deallocate(ptr, site) == FreeResult::NotAllocated);  // a second free is refused
  };
  // Per-thread default streams of threads that come and go: ids never
  // reused, none of them another stream's handle.
  constexpr StreamId kFirstThreadStream = 0x10002;
  StreamId next_thread_stream = kFirstThreadStream;
  auto ended_thread_stream = [&](StreamId id) { return id >= kFirstThreadStream && id != kAnyStream; };
  // A thread allocates on its per-thread stream, frees the block there or
  // leaves it live (for another thread to free), and ends.
  auto thread_comes_and_goes = [&](bool frees) {
    const StreamId stream = next_thread_stream;
    next_thread_stream += 0x10;
    SAY("thread with per-thread stream %llx begins\n", static_cast<unsigned long long>(stream));
    begin_stream(stream, StreamKind::PerThread);
    const DevicePtr p = allocate(size_from(in), stream);
    if (p != 0 && frees) release(live.find(p), stream);
    SAY("the thread ends\n");
    pool.thread_stream_ended(stream);
  };

  for (int step = 0; step < 4096 && !in.empty(); ++step) {
    switch (in.byte() % 12) {
      case 0: case 1: case 2: case 3: {  // allocate
        const std::size_t bytes = size_from(in);
        allocate(bytes, in.pick(streams));
        break;
      }
      case 4: case 5: case 6: {  // free: plain, on its own stream, or on another
        if (live.empty()) break;
        auto it = std::next(live.begin(), static_cast<long>(in.byte() % live.size()));
        const std::uint8_t how = in.byte() % 3;
        StreamId site = how == 0 ? kAnyStream : how == 1 ? it->second.stream : in.pick(streams);
        if (ended_thread_stream(site)) site = kAnyStream;  // its thread is gone: another frees it
        if (!may_name(site)) site = kAnyStream;
        release(it, site);
        break;
      }
      case 7:
        SAY("complete all\n");
        oracle.complete_all();  // the device catches up
        break;
      case 8:
        switch (in.byte() % 3) {
          case 0: SAY("release cached\n"); pool.release_cached(); break;
          case 1: {
            const std::uint8_t b = in.byte();
            // 0x78-0x7f, bytes no saved input has here (they replay the
            // steps they were saved for): a thread comes and goes.
            if ((b & 0xF8) == 0x78) {
              thread_comes_and_goes(b % 2 == 0);
              break;
            }
            const bool yes = b % 2 == 0;
            SAY("events complete at once: %d\n", yes);
            oracle.set_events_complete_at_once(yes);
            break;
          }
          case 2: {  // and, from the same byte: one stream's events lag behind the rest
            const std::uint8_t b = in.byte();
            const bool yes = b % 2 == 0;
            // (Top bits 100 or 110: combinations the saved inputs never
            // use, so that they replay the steps they were saved for.)
            const bool lags = b >> 5 == 4 || b >> 5 == 6;
            const StreamId lagging = lags ? streams[b / 2 % 4] : 0;
            SAY("streams idle: %d, lagging stream: %llx\n", yes, static_cast<unsigned long long>(lagging));
            upstream.set_streams_idle(yes);  // what stream queries answer
            oracle.set_lagging_stream(lagging == kAnyStream ? 0 : lagging);
            break;
          }
        }
        break;
      case 9:  // a capture on the blocking stream begins or ends
        SAY("capture %s\n", pool.is_capturing(kBlocking) ? "ends" : "begins");
        if (pool.is_capturing(kBlocking)) {
          pool.capture_ended(kBlocking);
          oracle.set_capturing(kBlocking, false);
        } else {
          oracle.set_capturing(kBlocking, true);
          pool.capture_began(kBlocking);
        }
        break;
      case 10: {  // the non-blocking stream is destroyed and its handle reused
        const std::uint8_t b = in.byte();
        // 0x7c-0x7f, bytes no saved input has here (they replay the steps
        // they were saved for): destroyed through the driver, its handle
        // given to no stream for now.
        drain_forgotten();
        if ((b & 0xFC) == 0x7C && !non_blocking_gone) {
          SAY("non-blocking stream destroyed unseen, its handle unused\n");
          non_blocking_gone = true;
          non_blocking_forgotten = false;
          upstream.set_gone_stream(kNonBlocking);
          oracle.stream_gone(kNonBlocking);
          break;
        }
        if (non_blocking_gone) {  // the runtime makes a stream, which gets the handle
          SAY("the gone handle given to a new stream\n");
          non_blocking_gone = non_blocking_forgotten = false;
          upstream.set_gone_stream(0);
        } else if (b % 4 != 0) {
          SAY("non-blocking stream destroyed and made again\n");
          pool.stream_destroying(kNonBlocking);
        } else {  // by the driver, where gpupool could not see it
          SAY("non-blocking stream destroyed unseen and made again\n");
        }
        begin_stream(kNonBlocking, StreamKind::NonBlocking);
        if (pool.is_capturing(kBlocking) && in.byte() % 2 == 0) {  // a destroy the runtime refuses: it captures on
          SAY("capturing blocking stream's destroy refused\n");
          pool.stream_destroy_begin(kBlocking);
          pool.stream_destroy_end(kBlocking, false);
        } else if (pool.is_capturing(kBlocking)) {  // and the blocking one, its capture ending with it
          SAY("capturing blocking stream destroyed and made again\n");
          pool.stream_destroying(kBlocking);
          begin_stream(kBlocking, StreamKind::Blocking);
        }
        break;
      }
      case 11:  // the device fails: allocations (for want of memory, or a device error), records, waits, events
        switch (in.byte() % 3) {
          case 0:
            failures_left = in.byte() % 4;
            upstream.set_failures_are_device_errors(in.byte() % 2 == 0);
            SAY("next %d allocation attempts fail\n", failures_left);
            break;
          case 1: {  // the low bits pick the stream, the next ones what fails on it
            const std::uint8_t b = in.byte();
            const StreamId failing = streams[b % std::size(streams)];
            const StreamId stream = failing == kAnyStream ? 0 : failing;  // kAnyStream: none
            const std::size_t what = b / std::size(streams) % 3;  // 0 records, 1 waits, 2 both
            upstream.set_failing_record_stream(what != 1 ? stream : 0);
            upstream.set_failing_wait_stream(what != 0 ? stream : 0);
            SAY("%s fail on %llx\n", what == 0 ? "records" : what == 1 ? "waits" : "records and waits",
                static_cast<unsigned long long>(failing));
            break;
          }
          case 2: {  // and, from the same byte: another device's stream captures
            const std::uint8_t b = in.byte();
            const bool creation_fails = b % 2 == 0, host_waits_fail = b / 2 % 2 == 1, queries_fail = b / 4 % 2 == 1;
            const bool capture_elsewhere = b / 8 % 2 == 1;
            // Event queries alone may fail while streams answer (a barrier
            // that finds every stream idle must not take such an event as
            // done). Bits 4-6 010: a combination no saved input uses.
            const bool event_queries_fail = (b & 0x70) == 0x20;
            SAY("event creation fails: %d, host waits fail: %d, queries fail: %d (event queries: %d), capture "
                "elsewhere: %d\n",
                creation_fails, host_waits_fail, queries_fail, event_queries_fail, capture_elsewhere);
            upstream.set_event_creation_fails(creation_fails);
            upstream.set_host_waits_fail(host_waits_fail);
            upstream.set_queries_fail(queries_fail);
            upstream.set_event_queries_fail(event_queries_fail);
            oracle.set_capture_elsewhere(capture_elsewhere);
            break;
          }
        }
        break;
    }
    check_valid(pool);
    if (!oracle.violation().empty()) {
      std::fprintf(stderr, "ordering broken: %s\n", oracle.violation().c_str());
      std::abort();
    }
  }
  upstream.set_failure(nullptr);
  upstream.set_failing_record_stream(0);
  upstream.set_failing_wait_stream(0);
  upstream.set_event_creation_fails(false);
  upstream.set_host_waits_fail(false);
  upstream.set_queries_fail(false);
  upstream.set_event_queries_fail(false);
  oracle.set_lagging_stream(0);
  oracle.set_capture_elsewhere(false);
  if (pool.is_capturing(kBlocking)) {
    pool.capture_ended(kBlocking);
    oracle.set_capturing(kBlocking, false);
  }
  for (const auto& [ptr, block] : live) {
    oracle.freed(ptr, block.size, kAnyStream);
    FUZZ_CHECK(pool.deallocate(ptr, kAnyStream) == FreeResult::Freed);
  }
  check_stream_rows(pool);
  oracle.complete_all();
  pool.release_cached();
  check_valid(pool);
  FUZZ_CHECK(oracle.violation().empty());
  FUZZ_CHECK(pool.stats().allocated_bytes[kAll].current == 0);
  FUZZ_CHECK(pool.stats().requested_bytes[kAll].current == 0);
  if (pool.quarantined_bytes() == 0) FUZZ_CHECK(pool.stats().reserved_bytes[kAll].current == 0);
  return 0;
}
