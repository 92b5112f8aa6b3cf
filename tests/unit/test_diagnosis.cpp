// The advice an out-of-memory diagnosis gives for fragmentation names the
// setting that would have served the request in that configuration; the
// advice on retries speaks only of retries that served their request.
#include <catch2/catch.hpp>

#include <algorithm>

#include "report/diagnosis.hpp"

using namespace gpupool;

namespace {

// 24 MiB free in 4 MiB pieces, an 8 MiB request: fragmentation.
OomRecord fragmented(std::size_t request) {
  OomRecord r;
  r.requested = request;
  r.rounded = request;
  r.reserved = 128 * kMiB;
  r.allocated = 104 * kMiB;
  r.free_in_pool = 24 * kMiB + request;
  r.largest_free_block = 4 * kMiB;
  return r;
}

}  // namespace

TEST_CASE("fragmentation in fixed segments is advised expandable segments") {
  PoolOptions options;
  options.expandable_segments = false;
  const report::OomDiagnosis d = report::diagnose(fragmented(8 * kMiB), options);
  CHECK(d.cause == report::OomCause::Fragmentation);
  CHECK(d.advice.find("GPUPOOL_EXPANDABLE_SEGMENTS=1") != std::string::npos);
}

TEST_CASE("fragmentation in expandable segments is advised rounding, then a sweep") {
  PoolOptions options;
  options.expandable_segments = true;
  CHECK(report::diagnose(fragmented(8 * kMiB), options).advice.find("GPUPOOL_ROUNDUP_POWER2_DIVISIONS=4") !=
        std::string::npos);
  options.roundup_divisions.fill(4);  // rounding already on: only a sweep can tell
  CHECK(report::diagnose(fragmented(8 * kMiB), options).advice.find("gpupool-replay --tune") != std::string::npos);
}

TEST_CASE("fragmentation for a large request is advised a split limit in fixed segments only") {
  PoolOptions options;
  options.expandable_segments = false;
  CHECK(report::diagnose(fragmented(256 * kMiB), options).advice.find("GPUPOOL_MAX_SPLIT_SIZE_MB=128") !=
        std::string::npos);
  // Expandable segments ignore the limit (DevicePool's constructor says why).
  options.expandable_segments = true;
  const report::OomDiagnosis d = report::diagnose(fragmented(256 * kMiB), options);
  CHECK(d.advice.find("MAX_SPLIT") == std::string::npos);
  CHECK(d.advice.find("GPUPOOL_ROUNDUP_POWER2_DIVISIONS=4") != std::string::npos);
}

TEST_CASE("retries are advised on only when flushing the cache served them") {
  auto says_retry = [](const report::DeviceReport& d) {
    const std::vector<std::string> lines = report::advice(d);
    return std::any_of(lines.begin(), lines.end(),
                       [](const std::string& l) { return l.find("retrying") != std::string::npos; });
  };
  report::DeviceReport d;
  d.stats.num_alloc_retries = 3;  // each ended out of memory
  CHECK_FALSE(says_retry(d));
  d.stats.num_retries_served = 2;
  CHECK(says_retry(d));
  CHECK(report::advice(d).front().find("2 allocations were served only after") == 0);
  d.options.garbage_collection_threshold = 0.8;  // already returning idle segments early
  CHECK(report::advice(d).front().find("GARBAGE_COLLECTION") == std::string::npos);
}

TEST_CASE("threads' caches are advised larger only when they sent back more than 1 block in 100 frees") {
  auto cache_line = [](const report::DeviceReport& d) {
    for (const std::string& l : report::advice(d)) {
      if (l.find("from full per-thread caches") != std::string::npos) return l;
    }
    return std::string();
  };
  report::DeviceReport d;
  d.thread_cache_size = 256 * kMiB;
  d.thread_cache_keeps = 10000;
  d.thread_cache_let_go = 100;  // 1 in 100: a lock trip now and then
  CHECK(cache_line(d).empty());
  d.thread_cache_let_go = 101;
  CHECK(cache_line(d).find("101 blocks went back to the pool from full per-thread caches, for 10000 "
                           "stream-ordered frees into them (1%; GPUPOOL_THREAD_CACHE_SIZE=256M)") == 0);
  // Frees that found a cache full but sent nothing back (the spill served
  // the next request of its size) cost no lock trip.
  d.thread_cache_let_go = 0;
  d.thread_cache_keeps_full = 5000;
  CHECK(cache_line(d).empty());
  d.thread_cache_keeps = 999;  // too few to judge
  d.thread_cache_let_go = 999;
  CHECK(cache_line(d).empty());
}

TEST_CASE("threads' caches holding a large share of the reserved peak are advised smaller, not larger") {
  auto line_with = [](const report::DeviceReport& d, const char* text) {
    for (const std::string& l : report::advice(d)) {
      if (l.find(text) != std::string::npos) return l;
    }
    return std::string();
  };
  report::DeviceReport d;
  d.thread_cache_size = 256 * kMiB;
  d.thread_cache_keeps = 10000;
  d.thread_cache_let_go = 500;  // blocks sent back often: alone, a larger cache would be advised
  d.stats.reserved_bytes[kAll].peak = 688 * static_cast<std::int64_t>(kMiB);
  d.stats.requested_bytes[kAll].peak = d.stats.allocated_bytes[kAll].peak = 583 * static_cast<std::int64_t>(kMiB);
  d.thread_cache_kept_peak = 172 * static_cast<std::int64_t>(kMiB);  // exactly a quarter: not yet
  CHECK(line_with(d, "per-thread caches held").empty());
  CHECK_FALSE(line_with(d, "from full per-thread caches").empty());
  d.thread_cache_kept_peak = 583 * static_cast<std::int64_t>(kMiB);
  const std::string line = line_with(d, "per-thread caches held");
  CHECK(line.find("per-thread caches held up to 583.00 MiB of the 688.00 MiB reserved at peak "
                  "(GPUPOOL_THREAD_CACHE_SIZE=256M per thread)") == 0);
  CHECK(line.find("A smaller GPUPOOL_THREAD_CACHE_SIZE reserves less") != std::string::npos);
  CHECK(line_with(d, "from full per-thread caches").empty());
  // A small program's caches are not worth a line, whatever their share.
  d.stats.reserved_bytes[kAll].peak = 80 * static_cast<std::int64_t>(kMiB);
  d.thread_cache_kept_peak = 64 * static_cast<std::int64_t>(kMiB);
  CHECK(line_with(d, "per-thread caches held").empty());
}

TEST_CASE("an out-of-memory that giving the cache back would have served, but for a capture, says so") {
  OomRecord r;  // 40 MiB cached, 12 MiB live, 12 MiB left on a 64 MiB device; asked 48 MiB
  r.requested = r.rounded = 48 * kMiB;
  r.reserved = 52 * kMiB;
  r.allocated = 12 * kMiB;
  r.free_in_pool = r.largest_free_block = 40 * kMiB;
  r.device_free = 12 * kMiB;
  r.device_total = 64 * kMiB;
  r.cache_kept_for_capture = true;
  const report::OomDiagnosis d = report::diagnose(r, PoolOptions{});
  CHECK(d.cause == report::OomCause::CaptureKeptCache);
  CHECK(d.verdict.find("40.00 MiB free in the pool") != std::string::npos);
  CHECK(d.advice.find("cudaMemPoolTrimTo") != std::string::npos);
  r.device_free = 4 * kMiB;  // the cache and the device together hold too little
  CHECK(report::diagnose(r, PoolOptions{}).cause == report::OomCause::DeviceFull);
  r.device_free = 12 * kMiB;
  r.cache_kept_for_capture = false;  // no capture: then the cache was given back, and it was not enough
  CHECK(report::diagnose(r, PoolOptions{}).cause == report::OomCause::DeviceFull);
}

namespace {

std::string advice_with(const report::DeviceReport& d, const char* text) {
  for (const std::string& l : report::advice(d)) {
    if (l.find(text) != std::string::npos) return l;
  }
  return std::string();
}

constexpr std::int64_t kMiBs = static_cast<std::int64_t>(kMiB);

}  // namespace

TEST_CASE("a free block that fits exactly but is not known free is pending reuse, not fragmentation") {
  OomRecord r = fragmented(8 * kMiB);
  r.largest_fitting_block = 8 * kMiB;  // exactly the rounded request
  PoolOptions options;
  report::OomDiagnosis d = report::diagnose(r, options);
  CHECK(d.cause == report::OomCause::PendingReuse);
  CHECK(d.verdict.find("a free block of 8.00 MiB fits") != std::string::npos);
  CHECK(d.advice.empty());  // cross-stream reuse is already on
  options.cross_stream_reuse = CrossStreamReuse::Never;
  CHECK(report::diagnose(r, options).advice.find("GPUPOOL_CROSS_STREAM_REUSE=auto") != std::string::npos);
  r.largest_fitting_block = 8 * kMiB - 512;  // too small: the free space is in pieces
  CHECK(report::diagnose(r, options).cause == report::OomCause::Fragmentation);
}

TEST_CASE("a device held mostly by others is told apart from a full device") {
  OomRecord r;  // 64 MiB device, 8 MiB reserved by this pool, 4 MiB free: 52 MiB is someone else's
  r.requested = r.rounded = 16 * kMiB;
  r.reserved = 8 * kMiB;
  r.allocated = 8 * kMiB;
  r.device_total = 64 * kMiB;
  r.device_free = 4 * kMiB;
  const report::OomDiagnosis d = report::diagnose(r, PoolOptions{});
  CHECK(d.cause == report::OomCause::OtherUsers);
  CHECK(d.verdict.find("it reserves 8.00 MiB of 64.00 MiB; 52.00 MiB is held by other processes") != std::string::npos);
  r.reserved = r.allocated = 56 * kMiB;  // the pool holds most of it: full
  r.device_free = 4 * kMiB;
  CHECK(report::diagnose(r, PoolOptions{}).cause == report::OomCause::DeviceFull);
}

TEST_CASE("rounding waste is advised above 15% of allocated memory and 64 MiB") {
  report::DeviceReport d;
  d.options.roundup_divisions.fill(4);
  d.stats.allocated_bytes[kAll].peak = 1000 * kMiBs;
  d.stats.reserved_bytes[kAll].peak = 1000 * kMiBs;
  d.stats.requested_bytes[kAll].peak = 860 * kMiBs;  // 14% waste
  CHECK(advice_with(d, "rounding costs").empty());
  d.stats.requested_bytes[kAll].peak = 840 * kMiBs;  // 16%
  CHECK(advice_with(d, "rounding costs").find("rounding costs 160.00 MiB at peak (16% of allocated memory)") == 0);
  d.options.roundup_divisions.fill(0);  // no rounding to lower
  CHECK(advice_with(d, "rounding costs").empty());
  d.options.roundup_divisions.fill(4);
  d.stats.allocated_bytes[kAll].peak = 100 * kMiBs;  // 16% of a small peak: not worth a line
  d.stats.reserved_bytes[kAll].peak = 100 * kMiBs;
  d.stats.requested_bytes[kAll].peak = 84 * kMiBs;
  CHECK(advice_with(d, "rounding costs").empty());
}

TEST_CASE("reserved memory well above the requested peak is advised a trace and a tune") {
  report::DeviceReport d;
  d.stats.requested_bytes[kAll].peak = d.stats.allocated_bytes[kAll].peak = 400 * kMiBs;
  d.stats.reserved_bytes[kAll].peak = 500 * kMiBs;  // 1.25x: not yet
  CHECK(advice_with(d, "gpupool-replay --tune").empty());
  d.stats.reserved_bytes[kAll].peak = 520 * kMiBs;
  CHECK(advice_with(d, "gpupool-replay --tune").find("reserved memory peaked at 520.00 MiB, 1.30x") == 0);
}

TEST_CASE("barrier calls on unused streams are advised once they pass the allocations") {
  report::DeviceReport d;
  d.stats.allocation[kAll].allocated = 3000;
  StreamReport barriers;
  barriers.id = kAnyStream;
  barriers.counters.fences_recorded = 100;
  StreamReport unused;
  unused.id = 0x7000;
  unused.counters.barrier_waits = 2000;
  unused.counters.idle_queries = 1000;  // one call per allocation: not yet
  d.streams = {barriers, unused};
  CHECK(advice_with(d, "device barriers").empty());
  d.streams[1].counters.idle_queries = 1001;
  CHECK(advice_with(d, "device barriers").find("behind 100 device barriers, which made non-blocking streams (1 of "
                                               "them) wait 2000 times and asked them 1001 times whether they were "
                                               "idle: 1.0 of these calls per allocation") != std::string::npos);
  // Queries alone count: barriers that always find the device caught up.
  d.streams[1].counters.barrier_waits = 0;
  d.streams[1].counters.idle_queries = 3001;
  CHECK_FALSE(advice_with(d, "device barriers").empty());
  // The search that trades memory for barriers, unless it is on already:
  // set, or left on auto beside enough non-blocking streams.
  CHECK(d.options.plain_reuse_search == PoolOptions::kSearchAuto);
  CHECK(advice_with(d, "device barriers").find("GPUPOOL_PLAIN_REUSE_SEARCH=16") != std::string::npos);
  d.options.plain_reuse_search = 4;
  CHECK(advice_with(d, "device barriers").find("GPUPOOL_PLAIN_REUSE_SEARCH") == std::string::npos);
  for (std::size_t i = 1; i < PoolOptions::kAutoSearchStreams; ++i) d.streams.push_back(unused);
  d.options.plain_reuse_search = PoolOptions::kSearchAuto;
  CHECK(advice_with(d, "device barriers").find("GPUPOOL_PLAIN_REUSE_SEARCH") == std::string::npos);
  d.options.plain_reuse_search = 0;
  CHECK(advice_with(d, "device barriers").find("GPUPOOL_PLAIN_REUSE_SEARCH=16") != std::string::npos);
}

TEST_CASE("refused cudaFree calls and page unmaps are said, with where the memory went") {
  report::DeviceReport d;
  CHECK(advice_with(d, "refused").empty());
  d.stats.num_page_unmap_failures = 2;
  CHECK(advice_with(d, "refused").find("the CUDA runtime refused 2 of gpupool's page unmaps:") == 0);
  d.stats.num_device_free_failures = 3;
  CHECK(advice_with(d, "refused").find("the CUDA runtime refused 3 of gpupool's cudaFree calls and 2 of its page "
                                       "unmaps:") == 0);
  d.stats.num_page_unmap_failures = 0;
  CHECK(advice_with(d, "refused").find("the CUDA runtime refused 3 of gpupool's cudaFree calls:") == 0);
}

TEST_CASE("leaks are advised GPUPOOL_BACKTRACE only when it was off") {
  report::DeviceReport d;
  d.leaks.blocks = 3;
  d.leaks.bytes = 5 * kMiB;
  CHECK(advice_with(d, "GPUPOOL_BACKTRACE=1").find("3 blocks (5.00 MiB) were still allocated at exit") == 0);
  d.leaks.sites.push_back(report::LeakSite{});
  CHECK(advice_with(d, "GPUPOOL_BACKTRACE=1").empty());
}

TEST_CASE("memory freed inside a capture is advised to be freed outside it") {
  report::DeviceReport d;
  CHECK(advice_with(d, "inside a stream capture").empty());
  d.quarantined_bytes = 3 * kMiB;
  CHECK(advice_with(d, "inside a stream capture").find("3.00 MiB freed with cudaFreeAsync inside a stream capture") ==
        0);
}

TEST_CASE("streams destroyed where gpupool could not see it are advised the calls it sees") {
  report::DeviceReport d;
  StreamReport seen;
  seen.id = 0x7000;
  seen.alive = false;
  d.streams = {seen};
  CHECK(advice_with(d, "could not see").empty());  // destroyed with cudaStreamDestroy
  StreamReport unseen = seen;
  unseen.counters.destroyed_unseen = 1;
  StreamReport later_ones = unseen;  // the row of later gone streams adds theirs up
  later_ones.id = 0;
  later_ones.streams = 5;
  later_ones.counters.destroyed_unseen = 4;
  d.streams = {seen, unseen};
  CHECK(advice_with(d, "could not see").find("1 stream was destroyed where gpupool could not see it") == 0);
  d.streams = {seen, unseen, later_ones};
  const std::string line = advice_with(d, "could not see");
  CHECK(line.find("5 streams were destroyed where gpupool could not see it") == 0);
  CHECK(line.find("gpupool named them in calls") != std::string::npos);
  CHECK(line.find("cudaStreamDestroy") != std::string::npos);
}
