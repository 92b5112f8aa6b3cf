#include "report/diagnosis.hpp"
#include "report/format.hpp"
#include "report/json_writer.hpp"

namespace gpupool::report {

namespace {

void fragmentation(JsonWriter& w, const char* name, const Fragmentation& f) {
  w.key(name).begin_object();
  w.field("free_bytes", f.free_bytes);
  w.field("largest_free_block_bytes", f.largest_free_block);
  w.field("free_blocks", f.free_blocks);
  w.field("external_fragmentation", f.external);
  w.field("rounding_waste_bytes", f.rounding_waste);
  w.field("peak_reserved_to_peak_requested", f.peak_reserved_to_peak_requested);
  w.end_object();
}

void histogram(JsonWriter& w, const char* name, const SizeHistogram& h) {
  w.key(name).begin_array();
  for (int b = 0; b < kHistogramBuckets; ++b) {
    if (h.count[b] == 0) continue;
    w.begin_object();
    w.field("min_bytes", std::uint64_t{1} << b);
    w.field("count", h.count[b]);
    w.field("bytes", h.bytes[b]);
    w.end_object();
  }
  w.end_array();
}

// Blocks by the call stack that allocated them (GPUPOOL_BACKTRACE=1).
void sites(JsonWriter& w, const std::vector<LeakSite>& by_site) {
  w.key("sites").begin_array();
  for (const LeakSite& site : by_site) {
    w.begin_object();
    w.field("blocks", site.blocks);
    w.field("bytes", site.bytes);
    w.key("frames").begin_array();
    for (const std::string& f : site.frames) w.value(f);
    w.end_array();
    w.end_object();
  }
  w.end_array();
}

void device(JsonWriter& w, const DeviceReport& d) {
  const MemoryStats& s = d.stats;
  w.begin_object();
  w.key("stats").begin_object();
  for_each_flat_stat(s, [&](const std::string& name, std::int64_t v) { w.field(name, v); });
  w.end_object();
  fragmentation(w, "fragmentation", d.fragmentation);
  fragmentation(w, "fragmentation_at_peak", d.fragmentation_at_peak);

  w.key("upstream").begin_object();
  w.field("cuda_malloc_calls", s.num_device_alloc + s.num_device_alloc_failures);
  w.field("cuda_malloc_failures", s.num_device_alloc_failures);
  w.field("cuda_free_calls", s.num_device_free + s.num_device_free_failures);
  w.field("cuda_free_failures", s.num_device_free_failures);
  // Time in every call that takes memory from the device (cudaMalloc, or
  // with expandable segments cuMemCreate and cuMemMap) and gives it back.
  w.field("cuda_malloc_ns", s.upstream_alloc_ns);
  w.field("cuda_free_ns", s.upstream_free_ns);
  w.field("page_maps", s.num_page_maps);
  w.field("page_unmaps", s.num_page_unmaps);
  w.field("page_unmap_failures", s.num_page_unmap_failures);
  w.field("pool_operations", s.pool_ops);
  w.field("pool_ns_estimated",
          s.pool_ops_sampled == 0 ? std::uint64_t{0} : s.pool_ns_sampled * s.pool_ops / s.pool_ops_sampled);
  w.end_object();

  const std::int64_t lookups = s.cache_hits + s.cache_misses;
  w.key("cache").begin_object();
  w.field("hits", s.cache_hits);
  w.field("misses", s.cache_misses);
  w.field("hit_ratio", lookups == 0 ? 0.0 : static_cast<double>(s.cache_hits) / static_cast<double>(lookups));
  w.field("garbage_collected_segments", s.num_gc_releases);
  w.field("retries_served", s.num_retries_served);
  w.end_object();

  w.key("histograms").begin_object();
  histogram(w, "requests", d.requests);
  histogram(w, "free_blocks_at_peak", d.free_blocks_at_peak);
  histogram(w, "free_blocks_at_exit", d.free_blocks_now);
  w.end_object();

  w.key("streams").begin_array();
  for (const StreamReport& r : d.streams) {
    w.begin_object();
    w.field("stream", stream_name(r.id));
    w.field("alive", r.alive);
    w.field("streams", r.streams);
    w.field("cached_blocks", r.cached_blocks);
    w.field("cached_bytes", r.cached_bytes);
    w.field("same_stream_reuses", r.counters.same_stream_reuses);
    w.field("cross_stream_reuses", r.counters.cross_stream_reuses);
    w.field("event_waits", r.counters.event_waits);
    w.field("destroyed_stream_waits", r.counters.destroyed_stream_waits);
    w.field("barrier_waits", r.counters.barrier_waits);
    w.field("idle_queries", r.counters.idle_queries);
    w.field("caught_up_barriers", r.counters.caught_up_barriers);
    w.field("searched_reuses", r.counters.searched_reuses);
    w.field("fences_recorded", r.counters.fences_recorded);
    w.field("host_syncs", r.counters.host_syncs);
    w.field("destroyed_unseen", r.counters.destroyed_unseen);
    w.end_object();
  }
  w.end_array();

  w.key("ooms").begin_array();
  for (const OomRecord& o : d.ooms) {
    const OomDiagnosis diag = diagnose(o, d.options);
    w.begin_object();
    w.field("time_s", static_cast<double>(o.time_ns) / 1e9);
    w.field("requested_bytes", o.requested);
    w.field("rounded_bytes", o.rounded);
    w.field("segment_asked_bytes", o.segment_asked);
    w.field("stream", stream_name(o.stream));
    w.field("reserved_bytes", o.reserved);
    w.field("allocated_bytes", o.allocated);
    w.field("free_in_pool_bytes", o.free_in_pool);
    w.field("largest_free_block_bytes", o.largest_free_block);
    w.field("largest_fitting_free_block_bytes", o.largest_fitting_block);
    w.field("during_capture", o.during_capture);
    w.field("cache_kept_for_capture", o.cache_kept_for_capture);
    w.field("device_free_bytes", o.device_free);
    w.field("device_total_bytes", o.device_total);
    w.field("limit_reached", o.limit_reached);
    w.field("cause", cause_name(diag.cause));
    w.field("verdict", diag.verdict);
    w.field("advice", diag.advice);
    w.end_object();
  }
  w.end_array();

  w.key("leaks").begin_object();
  w.field("blocks", d.leaks.blocks);
  w.field("bytes", d.leaks.bytes);
  w.field("requested_bytes", d.leaks.requested_bytes);
  w.key("largest").begin_array();
  for (const LeakedBlock& b : d.leaks.largest) {
    w.begin_object();
    w.field("address", static_cast<std::uint64_t>(b.addr));
    w.field("bytes", b.size);
    w.field("requested_bytes", b.requested);
    w.field("stream", stream_name(b.stream));
    w.end_object();
  }
  w.end_array();
  sites(w, d.leaks.sites);
  w.end_object();
  w.key("device_resets").begin_object();
  w.field("count", d.resets.count);
  w.field("blocks_freed_by_reset", d.resets.blocks);
  w.field("bytes_freed_by_reset", d.resets.bytes);
  sites(w, d.resets.sites);
  w.end_object();
  w.field("quarantined_bytes", d.quarantined_bytes);
  w.field("thread_cache_kept_peak_bytes", d.thread_cache_kept_peak);
  w.field("thread_cache_frees", d.thread_cache_keeps);
  w.field("thread_cache_frees_found_full", d.thread_cache_keeps_full);
  w.field("thread_cache_blocks_let_go", d.thread_cache_let_go);

  w.key("timeline").begin_object();
  w.field("stride_operations", d.timeline_stride);
  w.key("columns").begin_array().value("time_s").value("operation").value("allocated_bytes")
      .value("reserved_bytes").value("requested_bytes").end_array();
  w.key("samples").begin_array();
  for (const TimelineSample& t : d.timeline) {
    w.begin_array();
    w.value(static_cast<double>(t.time_ns) / 1e9).value(t.op).value(t.allocated).value(t.reserved).value(t.requested);
    w.end_array();
  }
  w.end_array();
  w.end_object();

  w.key("advice").begin_array();
  for (const std::string& line : advice(d)) w.value(line);
  w.end_array();
  w.end_object();
}

}  // namespace

std::string to_json(const Report& r) {
  JsonWriter w;
  w.begin_object();
  w.field("gpupool_report", 1);
  w.field("pid", r.pid);
  w.field("program", r.program);
  w.field("reason", r.reason);
  w.field("wall_seconds", r.wall_seconds);
  w.key("config").begin_array();
  for (const ConfigRow& c : r.config) {
    w.begin_object();
    w.field("variable", c.variable);
    w.field("key", c.key);
    w.field("value", c.value);
    w.field("default", c.default_value);
    w.field("non_default", c.non_default());
    w.end_object();
  }
  w.end_array();
  w.key("config_problems").begin_array();
  for (const std::string& p : r.config_problems) w.value(p);
  w.end_array();
  w.key("config_notes").begin_array();
  for (const std::string& n : r.config_notes) w.value(n);
  w.end_array();
  w.key("trace_problems").begin_array();
  for (const std::string& t : r.trace_problems) w.value(t);
  w.end_array();
  if (!r.stepped_aside_call.empty()) {
    w.key("stepped_aside").begin_object();
    w.field("call", r.stepped_aside_call);
    w.field("reason", r.stepped_aside_reason);
    w.end_object();
  }
  w.key("devices").begin_object();
  for (const DeviceReport& d : r.devices) {
    w.key(std::to_string(d.device));
    device(w, d);
  }
  w.end_object();
  w.end_object();
  return w.str() + "\n";
}

}  // namespace gpupool::report
