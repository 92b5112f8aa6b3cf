#include "report/diagnosis.hpp"

#include <algorithm>
#include <bit>
#include <cstdio>

#include "pool/size_rules.hpp"

namespace gpupool::report {

namespace {

std::string format(const char* fmt, auto... args) {
  const int n = std::snprintf(nullptr, 0, fmt, args...);
  if (n <= 0) return {};
  std::string out(static_cast<std::size_t>(n) + 1, '\0');
  std::snprintf(out.data(), out.size(), fmt, args...);
  out.pop_back();
  return out;
}

std::string bytes(std::size_t b) { return human_bytes(static_cast<double>(b)); }

// A size as a setting takes it: whole MiB as "256M".
std::string size_setting(std::size_t b) { return b % kMiB == 0 ? std::to_string(b / kMiB) + "M" : std::to_string(b); }

constexpr std::size_t kNoticeable = 64 * kMiB;  // waste below this is not worth a line

// The setting that would have left a piece large enough. `options` as the
// pool ran with them: a split limit applies to fixed segments only.
std::string split_advice(std::size_t rounded, const PoolOptions& options) {
  if (!options.expandable_segments && options.max_split_size == kUnlimited && rounded >= 64 * kMiB) {
    const std::size_t threshold = std::max<std::size_t>(32 * kMiB, std::bit_floor(rounded / 2));
    return format(
        "set GPUPOOL_MAX_SPLIT_SIZE_MB=%zu: blocks of %s or more are then kept whole for large "
        "requests instead of being split up by small ones",
        threshold / kMiB, bytes(threshold).c_str());
  }
  if (!options.expandable_segments) {
    // Free space stranded in the tails and holes of fixed segments; one
    // growable range per pool maps it where the request fits.
    return "set GPUPOOL_EXPANDABLE_SEGMENTS=1: free pages then join into one range instead of staying "
           "stranded in separate segments";
  }
  if (options.roundup_divisions[roundup_interval(rounded)] <= 1) {
    return "set GPUPOOL_ROUNDUP_POWER2_DIVISIONS=4: sizes rounded to quarter steps between powers "
           "of two leave blocks that later requests can reuse";
  }
  return "record the workload with GPUPOOL_TRACE=trace.csv and run gpupool-replay --tune on it "
         "to find the settings that fragment least";
}

}  // namespace

std::string human_bytes(double b) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int unit = 0;
  const bool negative = b < 0;
  if (negative) b = -b;
  while (b >= 1024.0 && unit < 5) {
    b /= 1024.0;
    ++unit;
  }
  if (unit == 0) return format("%s%.0f B", negative ? "-" : "", b);
  return format("%s%.2f %s", negative ? "-" : "", b, kUnits[unit]);
}

const char* cause_name(OomCause cause) {
  switch (cause) {
    case OomCause::TooLarge: return "too_large";
    case OomCause::LimitReached: return "limit_reached";
    case OomCause::PendingReuse: return "pending_reuse";
    case OomCause::CaptureKeptCache: return "capture_kept_cache";
    case OomCause::Fragmentation: return "fragmentation";
    case OomCause::OtherUsers: return "other_users";
    case OomCause::DeviceRefused: return "device_refused";
    case OomCause::DeviceFull: return "device_full";
  }
  return "device_full";
}

OomDiagnosis diagnose(const OomRecord& oom, const PoolOptions& options) {
  OomDiagnosis d;
  const std::size_t asked = oom.requested;
  if (oom.requested > kMaxRequest || (oom.device_total != 0 && oom.rounded > oom.device_total)) {
    d.cause = OomCause::TooLarge;
    d.verdict = format("the request is larger than the device: asked %s%s", bytes(asked).c_str(),
                       oom.device_total != 0 ? format(" of a %s device", bytes(oom.device_total).c_str()).c_str() : "");
    return d;
  }
  if (oom.largest_fitting_block >= oom.rounded) {
    // The block was there; what it lacked was proof that its last use is over.
    d.cause = OomCause::PendingReuse;
    d.verdict = format("a free block of %s fits, but the work queued before it was freed was not known to be done",
                       bytes(oom.largest_fitting_block).c_str());
    if (oom.during_capture) {
      d.verdict += " (a stream capture was under way: until it ends no event can be recorded to order reuse)";
      d.advice = "allocate before the capture begins, or synchronize the stream that freed the memory before it";
    } else if (options.cross_stream_reuse != CrossStreamReuse::Auto) {
      d.advice = "set GPUPOOL_CROSS_STREAM_REUSE=auto: another stream may then take it after a device-side wait";
    }
    return d;
  }
  if (oom.cache_kept_for_capture && oom.free_in_pool > 0 && oom.free_in_pool + oom.device_free >= oom.rounded) {
    d.cause = OomCause::CaptureKeptCache;
    d.verdict = format("a stream capture was under way (on this device or another), and cudaFree would have "
                       "made it invalid: the %s free in the pool could not be given back; asked %s",
                       bytes(oom.free_in_pool).c_str(), bytes(asked).c_str());
    d.advice = "give the cache back before the capture begins (cudaMemPoolTrimTo on the device's default pool), "
               "or allocate what is needed during the capture before it";
    return d;
  }
  if (oom.free_in_pool >= oom.rounded) {
    d.cause = OomCause::Fragmentation;
    d.verdict = format("fragmentation: %s free in the pool but the largest block is %s; asked %s",
                       bytes(oom.free_in_pool).c_str(), bytes(oom.largest_free_block).c_str(),
                       bytes(asked).c_str());
    d.advice = split_advice(oom.rounded, options);
    return d;
  }
  if (oom.limit_reached) {
    d.cause = OomCause::LimitReached;
    d.verdict = format("GPUPOOL_MEMORY_LIMIT (%s) reached: asked %s with %s reserved, %s of it allocated",
                       bytes(oom.memory_limit).c_str(), bytes(asked).c_str(), bytes(oom.reserved).c_str(),
                       bytes(oom.allocated).c_str());
    d.advice = "raise GPUPOOL_MEMORY_LIMIT, or allocate less";
    return d;
  }
  if (oom.device_total != 0) {
    const std::size_t accounted = oom.reserved + oom.device_free;
    const std::size_t others = oom.device_total > accounted ? oom.device_total - accounted : 0;
    if (others > oom.device_total / 10 && others > oom.reserved) {
      d.cause = OomCause::OtherUsers;
      d.verdict = format(
          "the device is full, mostly not by this pool: it reserves %s of %s; %s is held by other "
          "processes or by allocations that bypass gpupool; asked %s with %s free",
          bytes(oom.reserved).c_str(), bytes(oom.device_total).c_str(), bytes(others).c_str(),
          bytes(asked).c_str(), bytes(oom.device_free).c_str());
      return d;
    }
  }
  const std::size_t asked_of_device = std::max(oom.rounded, oom.segment_asked);
  if (oom.device_total != 0 && oom.segment_asked != 0 && oom.device_free >= asked_of_device) {
    // cudaMemGetInfo and the failed call disagree: the room is not this
    // process's to take (an MPS or MIG limit, another process that took it
    // in between) or not in one piece.
    d.cause = OomCause::DeviceRefused;
    d.verdict = format("the device refused %s although it reports %s free of %s; this process has %s "
                       "allocated in %s reserved",
                       bytes(asked_of_device).c_str(), bytes(oom.device_free).c_str(),
                       bytes(oom.device_total).c_str(), bytes(oom.allocated).c_str(), bytes(oom.reserved).c_str());
    return d;
  }
  d.cause = OomCause::DeviceFull;
  d.verdict = format("the device is full: asked %s; this process has %s allocated in %s reserved",
                     bytes(asked).c_str(), bytes(oom.allocated).c_str(), bytes(oom.reserved).c_str());
  if (oom.device_total != 0) {
    d.verdict += format(", the device has %s free of %s", bytes(oom.device_free).c_str(),
                        bytes(oom.device_total).c_str());
  }
  if (oom.free_in_pool > kNoticeable && oom.free_in_pool * 10 > oom.reserved) {
    d.advice = format("%s sits free in partly used segments: ", bytes(oom.free_in_pool).c_str()) +
               split_advice(oom.rounded, options);
  }
  return d;
}

std::vector<std::string> advice(const DeviceReport& dev) {
  std::vector<std::string> lines;
  auto add = [&](const std::string& line) {
    if (!line.empty() && std::find(lines.begin(), lines.end(), line) == lines.end()) lines.push_back(line);
  };
  const MemoryStats& s = dev.stats;
  const PoolOptions& o = dev.options;

  for (const OomRecord& oom : dev.ooms) add(diagnose(oom, o).advice);

  const auto reserved_peak = static_cast<double>(s.reserved_bytes[kAll].peak);
  const auto requested_peak = static_cast<double>(s.requested_bytes[kAll].peak);
  if (requested_peak > 0 && reserved_peak > 1.25 * requested_peak &&
      reserved_peak - requested_peak > static_cast<double>(kNoticeable)) {
    add(format("reserved memory peaked at %s, %.2fx the most ever requested at once (%s): record "
               "the run with GPUPOOL_TRACE=trace.csv and run gpupool-replay --tune to find settings "
               "that waste less",
               human_bytes(reserved_peak).c_str(), reserved_peak / requested_peak,
               human_bytes(requested_peak).c_str()));
  }
  const auto allocated_peak = static_cast<double>(s.allocated_bytes[kAll].peak);
  const bool rounding_on = std::any_of(o.roundup_divisions.begin(), o.roundup_divisions.end(),
                                       [](std::uint32_t d) { return d > 1; });
  if (rounding_on && allocated_peak - requested_peak > 0.15 * allocated_peak &&
      allocated_peak - requested_peak > static_cast<double>(kNoticeable)) {
    add(format("rounding costs %s at peak (%.0f%% of allocated memory): lower "
               "GPUPOOL_ROUNDUP_POWER2_DIVISIONS",
               human_bytes(allocated_peak - requested_peak).c_str(),
               100.0 * (allocated_peak - requested_peak) / allocated_peak));
  }
  // Only retries that then succeeded: one that ended out of memory is the
  // diagnosis's to explain, and returning idle segments earlier would not
  // have served it either.
  if (s.num_retries_served > 0) {
    add(format("%lld allocations were served only after flushing the cache and retrying (each flush "
               "synchronizes the device): memory is tight%s",
               static_cast<long long>(s.num_retries_served),
               o.garbage_collection_threshold > 0.0
                   ? ""
                   : "; GPUPOOL_GARBAGE_COLLECTION_THRESHOLD=0.8 returns idle segments earlier, without a flush"));
  }
  if (s.num_device_free_failures > 0 || s.num_page_unmap_failures > 0) {
    const std::string refused =
        s.num_page_unmap_failures == 0
            ? format("%lld of gpupool's cudaFree calls", static_cast<long long>(s.num_device_free_failures))
        : s.num_device_free_failures == 0
            ? format("%lld of gpupool's page unmaps", static_cast<long long>(s.num_page_unmap_failures))
            : format("%lld of gpupool's cudaFree calls and %lld of its page unmaps",
                     static_cast<long long>(s.num_device_free_failures),
                     static_cast<long long>(s.num_page_unmap_failures));
    add(format("the CUDA runtime refused %s: that memory stayed reserved in the pool (the report counts it so) "
               "and served later requests. An earlier kernel's fault (an illegal address, which every later call "
               "reports) is the usual cause; run with compute-sanitizer to find it",
               refused.c_str()));
  }
  if (s.num_gc_releases > 10 && s.cache_misses > s.num_gc_releases) {
    add(format("garbage collection returned %lld segments that later had to be allocated again: "
               "raise GPUPOOL_GARBAGE_COLLECTION_THRESHOLD",
               static_cast<long long>(s.num_gc_releases)));
  }
  // Blocks a thread keeps are free memory only that thread reuses: the pool
  // grows beside them until it takes them back. Where they were a large share
  // of the reserved peak, the advice is a smaller cache, not a larger one.
  const auto kept_peak = static_cast<double>(dev.thread_cache_kept_peak);
  const bool caches_cost_memory = kept_peak > static_cast<double>(kNoticeable) && kept_peak * 4 > reserved_peak;
  if (caches_cost_memory) {
    add(format("per-thread caches held up to %s of the %s reserved at peak (GPUPOOL_THREAD_CACHE_SIZE=%s per "
               "thread): free blocks that only the thread that freed them reuses, beside which the pool grows "
               "until it takes them back. A smaller GPUPOOL_THREAD_CACHE_SIZE reserves less (0 turns the caches "
               "off: every stream-ordered call then takes the device's lock)",
               human_bytes(kept_peak).c_str(), human_bytes(reserved_peak).c_str(),
               size_setting(dev.thread_cache_size).c_str()));
  }
  // Each block a full cache sends back costs a trip through the device's
  // lock, which every thread shares. (A free that finds the cache full need
  // not send one: the block may wait as the spill and serve the next request
  // of its size.)
  const std::int64_t keeps = dev.thread_cache_keeps;
  const std::int64_t let_go = dev.thread_cache_let_go;
  if (!caches_cost_memory && keeps >= 1000 && let_go * 100 > keeps) {
    add(format("%lld blocks went back to the pool from full per-thread caches, for %lld stream-ordered frees "
               "into them (%.0f%%; GPUPOOL_THREAD_CACHE_SIZE=%s): each under the device's lock, which all threads "
               "share. A larger GPUPOOL_THREAD_CACHE_SIZE keeps more of each thread's blocks; the caches go back "
               "to the pool whenever it has to grow, so they cause no out-of-memory",
               static_cast<long long>(let_go), static_cast<long long>(keeps),
               100.0 * static_cast<double>(let_go) / static_cast<double>(keeps),
               size_setting(dev.thread_cache_size).c_str()));
  }
  if (dev.leaks.blocks > 0 && dev.leaks.sites.empty()) {
    add(format("%llu blocks (%s) were still allocated at exit: GPUPOOL_BACKTRACE=1 lists where they "
               "were allocated",
               static_cast<unsigned long long>(dev.leaks.blocks), bytes(dev.leaks.bytes).c_str()));
  }
  if (dev.resets.blocks > 0 && dev.resets.sites.empty()) {
    add(format("%llu blocks (%s) were still allocated when a device reset freed them: GPUPOOL_BACKTRACE=1 "
               "lists where they were allocated",
               static_cast<unsigned long long>(dev.resets.blocks), bytes(dev.resets.bytes).c_str()));
  }
  std::uint64_t waits = 0;
  std::uint64_t destroyed_stream_waits = 0;
  std::uint64_t barrier_waits = 0;
  std::uint64_t idle_queries = 0;
  std::uint64_t barriers = 0;
  std::size_t waiting_streams = 0;
  for (const StreamReport& r : dev.streams) {
    waits += r.counters.event_waits;
    destroyed_stream_waits += r.counters.destroyed_stream_waits;
    barrier_waits += r.counters.barrier_waits;
    idle_queries += r.counters.idle_queries;
    waiting_streams += r.counters.barrier_waits > 0 || r.counters.idle_queries > 0 ? 1 : 0;
    if (r.id == kAnyStream) barriers = r.counters.fences_recorded;
  }
  const auto allocations = static_cast<std::uint64_t>(s.allocation[kAll].allocated);
  // Every barrier makes each live non-blocking stream wait, used or not, or
  // asks it whether it is idle where the device has caught up: with PyTorch's
  // stream pool that is dozens of driver calls per barrier. (Streams come and
  // go, so the count is of those ever asked or made to wait, not per barrier.)
  const std::uint64_t barrier_calls = barrier_waits + idle_queries;
  if (barrier_calls > 1000 && barrier_calls > allocations) {
    // The search's figures: BENCHMARKS.md, plain replays beside 64 idle streams.
    // Left on auto, it searched where the streams were many enough; below
    // that, or set to 0, it is worth naming.
    const bool searching = o.plain_reuse_search == PoolOptions::kSearchAuto
                               ? waiting_streams >= PoolOptions::kAutoSearchStreams
                               : o.plain_reuse_search > 0;
    const char* search =
        searching
            ? ""
            : " GPUPOOL_PLAIN_REUSE_SEARCH=16 records fewer barriers for more memory (the shared PyTorch traces "
              "replayed plain: 3-6x fewer, up to 11% more reserved; auto, the default, searches only beside 8 or "
              "more non-blocking streams); gpupool-replay --plain --idle-streams N "
              "--sweep plain_reuse_search=0,16 on a GPUPOOL_TRACE of this program shows both.";
    add(format("cudaMalloc reused cudaFree'd memory behind %llu device barriers, which made non-blocking streams "
               "(%zu of them) wait %llu times and asked them %llu times whether they were idle: %.1f of these calls "
               "per allocation. A stream made "
               "with cudaStreamNonBlocking costs this even when unused (PyTorch makes 32 per priority level for its "
               "first side stream); streams made without that flag cost nothing here, and cudaMallocAsync/"
               "cudaFreeAsync on the stream that uses the memory need no barrier.%s A PyTorch program may do "
               "better with its own allocator: unset PYTORCH_NO_CUDA_MEMORY_CACHING and set "
               "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, which keeps its waste low",
               static_cast<unsigned long long>(barriers), waiting_streams, static_cast<unsigned long long>(barrier_waits),
               static_cast<unsigned long long>(idle_queries),
               static_cast<double>(barrier_calls) / static_cast<double>(allocations), search));
  }
  if (waits > 1000 && waits * 10 > allocations && o.cross_stream_reuse == CrossStreamReuse::Auto) {
    if (destroyed_stream_waits * 2 > waits) {
      // A stream made for each task while the device is behind: each task
      // takes the last one's block, after its work. What "completed" costs
      // there is the memory of every task still running.
      add(format("streams waited %llu times to reuse memory, %llu of them for the last work of a stream "
                 "destroyed with work queued (a stream made for each task while the device was behind): "
                 "each such task ran after the one before it. GPUPOOL_CROSS_STREAM_REUSE=completed lets "
                 "them run side by side, each task still running then holding memory of its own",
                 static_cast<unsigned long long>(waits), static_cast<unsigned long long>(destroyed_stream_waits)));
    } else {
      add(format("streams waited on each other %llu times to reuse memory: "
                 "GPUPOOL_CROSS_STREAM_REUSE=completed avoids those device-side waits at some memory cost",
                 static_cast<unsigned long long>(waits)));
    }
  }
  // Pages given back and mapped again cost driver calls each time (on an
  // H200 about 0.5 ms a map): a loop doing it on many allocations crawls.
  const auto unmaps = static_cast<std::uint64_t>(s.num_page_unmaps);
  if (o.recycle_pages && unmaps > 100 && unmaps * 20 > allocations) {
    add(format("gpupool gave back and mapped again device pages %llu times (%.0f ms in the driver): the working "
               "set is just above the pool's peak; raise GPUPOOL_RECYCLE_IDLE_ALLOCATIONS (now %llu) or set "
               "GPUPOOL_RECYCLE_PAGES=0 to keep them mapped, at a little more memory",
               static_cast<unsigned long long>(unmaps),
               static_cast<double>(s.upstream_alloc_ns + s.upstream_free_ns) / 1e6,
               static_cast<unsigned long long>(o.recycle_idle_allocations)));
  }
  // Found only by a call that named it: CUDA leaves such a call undefined
  // (on CUDA 13 it can crash), and each find costs a wait for the device.
  std::uint64_t destroyed_unseen = 0;
  for (const StreamReport& r : dev.streams) destroyed_unseen += r.counters.destroyed_unseen;
  if (destroyed_unseen > 0) {
    const bool one = destroyed_unseen == 1;
    add(format("%llu %s destroyed where gpupool could not see it (such as the driver's cuStreamDestroy reached "
               "through a pointer a library resolved itself): gpupool named %s in calls until the runtime refused "
               "one or gave the handle to a new stream, which CUDA leaves undefined, and then waited for the whole "
               "device. Destroy streams with cudaStreamDestroy, or with cuStreamDestroy called directly or found "
               "with dlsym, which gpupool sees",
               static_cast<unsigned long long>(destroyed_unseen), one ? "stream was" : "streams were",
               one ? "it" : "them"));
  }
  if (dev.quarantined_bytes > 0) {
    add(format("%s freed with cudaFreeAsync inside a stream capture is never reused: free such "
               "memory outside the capture",
               bytes(dev.quarantined_bytes).c_str()));
  }
  return lines;
}

}  // namespace gpupool::report
