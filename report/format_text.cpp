#include <cstdio>
#include <string>

#include "report/diagnosis.hpp"
#include "report/format.hpp"

namespace gpupool::report {

namespace {

constexpr int kWidth = 85;  // the memory_summary table's width

void appendf(std::string& out, const char* fmt, auto... args) {
  const int n = std::snprintf(nullptr, 0, fmt, args...);
  if (n <= 0) return;
  const std::size_t at = out.size();
  out.resize(at + static_cast<std::size_t>(n) + 1);
  std::snprintf(out.data() + at, static_cast<std::size_t>(n) + 1, fmt, args...);
  out.pop_back();  // snprintf's terminating NUL
}

std::string rule(char c) { return "|" + std::string(kWidth - 2, c) + "|\n"; }

std::string bytes(std::int64_t b) { return human_bytes(static_cast<double>(b)); }

std::string stepped_aside_line(const Report& r) {
  return "gpupool stepped aside at " + r.stepped_aside_call + ": " + r.stepped_aside_reason +
         ". From then on the CUDA runtime served every allocation, the memory gpupool had lent stayed held until "
         "exit, and the figures below stop there.";
}

// A stream that reused nothing, waited for no other stream and holds no
// cache: PyTorch makes dozens of them (its stream pool), and they differ only
// in the barrier waits they were made to do. Shown as one row.
bool quiet(const StreamReport& r) {
  const StreamCounters& c = r.counters;
  return r.id != kAnyStream && r.id != 0x1 && r.cached_blocks == 0 && c.same_stream_reuses == 0 &&
         c.cross_stream_reuses == 0 && c.event_waits == 0 && c.host_syncs == 0;
}

void stream_rows(std::string& out, const std::vector<StreamReport>& streams) {
  out += "\nStreams                    cached blocks      cached  same-stream  cross-stream  event waits"
         "  barrier waits  fences  host syncs\n";
  auto row = [&](const std::string& name, const StreamReport& r) {
    appendf(out, "  %-22s %14zu %11s %12llu %13llu %12llu %14llu %7llu %11llu\n", name.c_str(), r.cached_blocks,
            human_bytes(static_cast<double>(r.cached_bytes)).c_str(),
            static_cast<unsigned long long>(r.counters.same_stream_reuses),
            static_cast<unsigned long long>(r.counters.cross_stream_reuses),
            static_cast<unsigned long long>(r.counters.event_waits),
            static_cast<unsigned long long>(r.counters.barrier_waits),
            static_cast<unsigned long long>(r.counters.fences_recorded),
            static_cast<unsigned long long>(r.counters.host_syncs));
  };
  // Gone streams that hold no cache (a server that starts a thread per
  // request ends one per-thread stream each) are one row, as are quiet ones.
  auto gone = [](const StreamReport& r) { return !r.alive && r.cached_blocks == 0; };
  std::size_t gone_rows = 0;
  std::size_t quiet_rows = 0;
  for (const StreamReport& r : streams) {
    gone_rows += gone(r) ? 1 : 0;
    quiet_rows += !gone(r) && quiet(r) ? 1 : 0;
  }
  StreamReport gone_ones;
  gone_ones.streams = 0;
  StreamReport quiet_ones;
  for (const StreamReport& r : streams) {
    if (gone_rows >= 2 && gone(r)) {
      gone_ones.streams += r.streams;
      gone_ones.counters += r.counters;
      continue;
    }
    if (quiet_rows >= 2 && quiet(r)) {
      quiet_ones.counters.barrier_waits += r.counters.barrier_waits;
      quiet_ones.counters.idle_queries += r.counters.idle_queries;
      quiet_ones.counters.fences_recorded += r.counters.fences_recorded;
      continue;
    }
    // The row of every stream gone after the first ones listed: how many.
    row(r.id == 0 ? std::to_string(r.streams) + " more gone" : stream_name(r.id) + (r.alive ? "" : " (gone)"), r);
  }
  if (gone_rows >= 2) row(std::to_string(gone_ones.streams) + " gone, none cached", gone_ones);
  if (quiet_rows >= 2) row(std::to_string(quiet_rows) + " others, no reuse", quiet_ones);
  std::uint64_t idle_queries = 0;
  std::uint64_t event_waits = 0;
  std::uint64_t destroyed_stream_waits = 0;
  std::uint64_t destroyed_unseen = 0;
  for (const StreamReport& r : streams) {
    idle_queries += r.counters.idle_queries;
    event_waits += r.counters.event_waits;
    destroyed_stream_waits += r.counters.destroyed_stream_waits;
    destroyed_unseen += r.counters.destroyed_unseen;
    if (r.id != kAnyStream) continue;
    if (r.counters.caught_up_barriers > 0) {
      appendf(out, "  %llu of the %llu device barriers found the device caught up: no stream waited for them\n",
              static_cast<unsigned long long>(r.counters.caught_up_barriers),
              static_cast<unsigned long long>(r.counters.fences_recorded));
    }
    if (r.counters.searched_reuses > 0) {
      appendf(out,
              "  %llu cudaMalloc calls took memory the last device barrier covered from a larger free block, "
              "instead of a new barrier (plain_reuse_search)\n",
              static_cast<unsigned long long>(r.counters.searched_reuses));
    }
  }
  if (idle_queries > 0) {
    appendf(out, "  device barriers asked the non-blocking streams %llu times whether they were idle\n",
            static_cast<unsigned long long>(idle_queries));
  }
  if (destroyed_stream_waits > 0) {
    appendf(out,
            "  %llu of the %llu event waits were for the last work of a stream destroyed with work queued, "
            "whose block the waiting stream took\n",
            static_cast<unsigned long long>(destroyed_stream_waits), static_cast<unsigned long long>(event_waits));
  }
  if (destroyed_unseen > 0) {
    appendf(out,
            "  %llu of the gone streams %s destroyed where gpupool could not see it: the runtime refused a call "
            "naming one, or gave its handle to a new stream\n",
            static_cast<unsigned long long>(destroyed_unseen), destroyed_unseen == 1 ? "was" : "were");
  }
}

// Blocks by the call stack that allocated them (GPUPOOL_BACKTRACE=1).
void sites(std::string& out, const std::vector<LeakSite>& by_site) {
  for (const LeakSite& site : by_site) {
    appendf(out, "  %s in %llu blocks, allocated at:\n", human_bytes(static_cast<double>(site.bytes)).c_str(),
            static_cast<unsigned long long>(site.blocks));
    for (const std::string& frame : site.frames) appendf(out, "      %s\n", frame.c_str());
  }
}

// One memory_summary row group: the total and its two pools.
void stat_rows(std::string& out, const char* name, const StatArray& s, bool is_bytes) {
  static constexpr const char* kLabels[kStatIndexes] = {"", "      from small pool", "      from large pool"};
  static constexpr int kOrder[kStatIndexes] = {kAll, kLargePool, kSmallPool};
  for (int i : kOrder) {
    const Stat& st = s[i];
    auto cell = [&](std::int64_t v) { return is_bytes ? bytes(v) : std::to_string(v); };
    const std::string label = i == kAll ? std::string(name) : kLabels[i];
    appendf(out, "| %-26s| %11s | %11s | %11s | %11s |\n", label.c_str(), cell(st.current).c_str(),
            cell(st.peak).c_str(), cell(st.allocated).c_str(), cell(st.freed).c_str());
  }
}

void single_row(std::string& out, const char* name, const Stat& st) {
  appendf(out, "| %-26s| %11lld | %11lld | %11lld | %11lld |\n", name,
          static_cast<long long>(st.current), static_cast<long long>(st.peak),
          static_cast<long long>(st.allocated), static_cast<long long>(st.freed));
}

void histogram(std::string& out, const char* title, const SizeHistogram& h) {
  if (h.empty()) return;
  appendf(out, "  %s\n", title);
  for (int b = 0; b < kHistogramBuckets; ++b) {
    if (h.count[b] == 0) continue;
    const std::string lo = human_bytes(static_cast<double>(std::uint64_t{1} << b));
    appendf(out, "    >= %-11s %10llu blocks %12s\n", lo.c_str(),
            static_cast<unsigned long long>(h.count[b]),
            human_bytes(static_cast<double>(h.bytes[b])).c_str());
  }
}

void device_section(std::string& out, const DeviceReport& d) {
  const MemoryStats& s = d.stats;
  out += '\n';
  out += rule('=');
  appendf(out, "| %-*s|\n", kWidth - 3, ("gpupool memory summary, device " + std::to_string(d.device)).c_str());
  out += rule('-');
  appendf(out, "| %-26s| %11s | %11s | %11s | %11s |\n", "Metric", "Cur Usage", "Peak Usage",
          "Tot Alloc", "Tot Freed");
  out += rule('-');
  stat_rows(out, "Allocated memory", s.allocated_bytes, true);
  out += rule('-');
  stat_rows(out, "Active memory", s.allocated_bytes, true);  // the same (see for_each_stat)
  out += rule('-');
  stat_rows(out, "Requested memory", s.requested_bytes, true);
  out += rule('-');
  stat_rows(out, "GPU reserved memory", s.reserved_bytes, true);
  out += rule('-');
  stat_rows(out, "Non-releasable memory", s.inactive_split_bytes, true);
  out += rule('-');
  stat_rows(out, "Allocations", s.allocation, false);
  out += rule('-');
  stat_rows(out, "Active allocs", s.allocation, false);
  out += rule('-');
  stat_rows(out, "GPU reserved segments", s.segment, false);
  out += rule('-');
  stat_rows(out, "Non-releasable allocs", s.inactive_split, false);
  out += rule('-');
  single_row(out, "Oversize allocations", s.oversize_allocations);
  single_row(out, "Oversize GPU segments", s.oversize_segments);
  out += rule('=');

  const Fragmentation& f = d.fragmentation;
  const Fragmentation& p = d.fragmentation_at_peak;
  out += "\nFragmentation                      now             at reserved peak\n";
  appendf(out, "  free bytes in segments     %14s      %14s\n", human_bytes(static_cast<double>(f.free_bytes)).c_str(),
          human_bytes(static_cast<double>(p.free_bytes)).c_str());
  appendf(out, "  largest free block         %14s      %14s\n",
          human_bytes(static_cast<double>(f.largest_free_block)).c_str(),
          human_bytes(static_cast<double>(p.largest_free_block)).c_str());
  appendf(out, "  external fragmentation     %14.3f      %14.3f   (1 - largest free / free)\n",
          f.external, p.external);
  appendf(out, "  rounding waste             %14s      %14s   (allocated - requested)\n",
          human_bytes(static_cast<double>(f.rounding_waste)).c_str(),
          human_bytes(static_cast<double>(p.rounding_waste)).c_str());
  appendf(out, "  peak reserved / peak requested: %.4f\n", f.peak_reserved_to_peak_requested);

  const double hits = static_cast<double>(s.cache_hits);
  const double total = hits + static_cast<double>(s.cache_misses);
  out += "\nUpstream and cache\n";
  appendf(out,
          "  cudaMalloc calls %lld (%lld failed), cudaFree calls %lld (%lld refused); page maps %lld, unmaps %lld "
          "(%lld refused)\n",
          static_cast<long long>(s.num_device_alloc + s.num_device_alloc_failures),
          static_cast<long long>(s.num_device_alloc_failures),
          static_cast<long long>(s.num_device_free + s.num_device_free_failures),
          static_cast<long long>(s.num_device_free_failures), static_cast<long long>(s.num_page_maps),
          static_cast<long long>(s.num_page_unmaps), static_cast<long long>(s.num_page_unmap_failures));
  appendf(out, "  time taking memory from the device (cudaMalloc, page maps) %.3f ms, giving it back (cudaFree, "
               "page unmaps) %.3f ms, in the pool ~%.3f ms (%llu operations)\n",
          static_cast<double>(s.upstream_alloc_ns) / 1e6, static_cast<double>(s.upstream_free_ns) / 1e6,
          s.pool_ops_sampled == 0 ? 0.0
                                  : static_cast<double>(s.pool_ns_sampled) / static_cast<double>(s.pool_ops_sampled) *
                                        static_cast<double>(s.pool_ops) / 1e6,
          static_cast<unsigned long long>(s.pool_ops));
  appendf(out, "  cache hits %lld of %lld allocations (%.1f%%); retries %lld (%lld served), out-of-memory %lld, "
               "segments returned by garbage collection %lld\n",
          static_cast<long long>(s.cache_hits), static_cast<long long>(total),
          total == 0 ? 0.0 : 100.0 * hits / total, static_cast<long long>(s.num_alloc_retries),
          static_cast<long long>(s.num_retries_served), static_cast<long long>(s.num_ooms),
          static_cast<long long>(s.num_gc_releases));

  if (!d.streams.empty()) stream_rows(out, d.streams);

  out += "\nSizes\n";
  histogram(out, "requests", d.requests);
  histogram(out, "free blocks at the reserved peak", d.free_blocks_at_peak);
  histogram(out, "free blocks now", d.free_blocks_now);

  if (s.num_ooms > 0) {
    appendf(out, "\nOut of memory: %lld time(s)\n", static_cast<long long>(s.num_ooms));
    for (const OomRecord& o : d.ooms) {
      const OomDiagnosis diag = diagnose(o, d.options);
      appendf(out, "  [%.3f s] asked %s on %s: %s\n", static_cast<double>(o.time_ns) / 1e9,
              human_bytes(static_cast<double>(o.requested)).c_str(), stream_name(o.stream).c_str(),
              diag.verdict.c_str());
      if (!diag.advice.empty()) appendf(out, "      advice: %s\n", diag.advice.c_str());
    }
    if (static_cast<std::size_t>(s.num_ooms) > d.ooms.size()) {
      appendf(out, "  (%lld more not itemized)\n", static_cast<long long>(s.num_ooms) - static_cast<long long>(d.ooms.size()));
    }
  }

  if (d.leaks.blocks > 0) {
    appendf(out, "\nStill allocated at exit: %llu blocks, %s\n", static_cast<unsigned long long>(d.leaks.blocks),
            human_bytes(static_cast<double>(d.leaks.bytes)).c_str());
    for (const LeakedBlock& b : d.leaks.largest) {
      appendf(out, "  %#zx  %s (asked %zu bytes) on %s\n", static_cast<std::size_t>(b.addr),
              human_bytes(static_cast<double>(b.size)).c_str(), b.requested, stream_name(b.stream).c_str());
    }
    sites(out, d.leaks.sites);
  }
  if (d.resets.count > 0) {
    appendf(out, "\nDevice resets (cudaDeviceReset, cudaThreadExit or the driver's cuDevicePrimaryCtxReset): %llu; the "
            "figures above cover the whole run\n",
            static_cast<unsigned long long>(d.resets.count));
    if (d.resets.blocks > 0) {
      appendf(out, "  still allocated when a reset freed them: %llu blocks, %s\n",
              static_cast<unsigned long long>(d.resets.blocks),
              human_bytes(static_cast<double>(d.resets.bytes)).c_str());
    }
    sites(out, d.resets.sites);
  }
  if (d.quarantined_bytes > 0) {
    appendf(out, "\nFreed inside a stream capture (kept out of reuse): %s\n",
            human_bytes(static_cast<double>(d.quarantined_bytes)).c_str());
  }
  if (d.thread_cache_kept_peak > 0) {
    appendf(out,
            "\nBlocks kept in per-thread caches count as allocated in the peaks above: up to %s (the most "
            "each thread kept, summed over threads). GPUPOOL_THREAD_CACHE_SIZE=0 gives exact peaks\n",
            human_bytes(static_cast<double>(d.thread_cache_kept_peak)).c_str());
  }
  if (d.thread_cache_keeps > 0) {
    appendf(out,
            "Per-thread caches took %lld stream-ordered frees; %lld found the cache full, and %lld blocks went "
            "back to the pool for want of room\n",
            static_cast<long long>(d.thread_cache_keeps), static_cast<long long>(d.thread_cache_keeps_full),
            static_cast<long long>(d.thread_cache_let_go));
  }

  const std::vector<std::string> lines = advice(d);
  if (!lines.empty()) {
    out += "\nAdvice\n";
    for (const std::string& line : lines) out += "  - " + line + "\n";
  }
}

}  // namespace

std::string stream_name(StreamId id) {
  if (id == kAnyStream) return "cudaMalloc/cudaFree";
  if (id == 0x1) return "legacy";
  if (id == 0) return "later streams";  // those gone after the first 63, in one row
  char buf[32];
  std::snprintf(buf, sizeof buf, (id & 0xF) == 0x2 ? "per-thread #%llu" : "%#llx",
                static_cast<unsigned long long>((id & 0xF) == 0x2 ? id >> 4 : id));
  return buf;
}

std::string to_text(const Report& r) {
  std::string out;
  appendf(out, "gpupool report: %s (pid %ld), %s after %.3f s\n", r.program.c_str(), r.pid,
          r.reason == "exit" ? "at exit" : "on signal", r.wall_seconds);
  out += "\nConfiguration (* = not the default)\n";
  for (const ConfigRow& c : r.config) {
    appendf(out, "  %c %-36s %s\n", c.non_default() ? '*' : ' ', c.variable.c_str(), c.value.c_str());
  }
  for (const std::string& p : r.config_problems) out += "  problem: " + p + "\n";
  for (const std::string& n : r.config_notes) out += "  note: " + n + "\n";
  for (const std::string& t : r.trace_problems) out += "  trace: " + t + "\n";
  if (!r.stepped_aside_call.empty()) {
    out += '\n';
    out += stepped_aside_line(r);
    out += '\n';
  }
  if (r.devices.empty()) out += "\nNo device memory went through gpupool.\n";
  for (const DeviceReport& d : r.devices) device_section(out, d);
  return out;
}

}  // namespace gpupool::report
