#include "shim/report_file.hpp"

#include <errno.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <utility>

#include "report/collect.hpp"
#include "report/format.hpp"
#include "shim/messages.hpp"
#include "shim/output_file.hpp"
#include "shim/runtime.hpp"
#include "shim/sigpipe_held.hpp"
#include "shim/step_aside.hpp"

namespace gpupool::shim {

namespace {

std::string program_name() {
  return program_invocation_short_name != nullptr ? program_invocation_short_name : "program";
}

std::string rank() {
  for (const char* name : {"RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"}) {
    const char* v = std::getenv(name);
    if (v != nullptr && *v != '\0') return v;
  }
  return "0";
}

std::string default_path(config::LogFormat format) {
  const char* tmp = std::getenv("TMPDIR");
  const std::string dir = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
  return dir + "/gpupool-%e-%p." + (format == config::LogFormat::Json ? "json" : "txt");
}

// Blocks tallied by allocation call stack, symbolized, most bytes first.
std::vector<report::LeakSite> symbolized(const std::map<std::uint32_t, report::LeakSite>& by_site,
                                         CallSites& sites) {
  std::vector<report::LeakSite> out;
  for (const auto& [id, s] : by_site) {
    out.push_back(s);
    out.back().frames = sites.symbolize(id);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.bytes > b.bytes; });
  if (out.size() > 20) out.resize(20);
  return out;
}

// Leaked blocks grouped by allocation call stack.
std::vector<report::LeakSite> leak_sites(const DevicePool& pool, CallSites& sites) {
  std::map<std::uint32_t, report::LeakSite> by_site;
  pool.for_each_allocated([&](const Block& b) {
    if (b.site == 0) return;
    report::LeakSite& s = by_site[b.site];
    ++s.blocks;
    s.bytes += b.size;
  });
  return symbolized(by_site, sites);
}

// Blocks a device reset freed before the program did, by call stack.
std::vector<report::LeakSite> reset_sites(const DevicePool& pool, CallSites& sites) {
  std::map<std::uint32_t, report::LeakSite> by_site;
  for (const auto& [id, tally] : pool.reset_losses().by_site) {
    by_site[id].blocks = tally.blocks;
    by_site[id].bytes = tally.bytes;
  }
  return symbolized(by_site, sites);
}

// The per-thread caches served these allocations and frees without the pool:
// its totals gain them (its current figures count the blocks the caches keep
// as allocated, as it does). Requested bytes: the pool counts a block lent
// again at the request it lent it for until the block comes back, and then
// that request freed (see DeviceState::requested_returned_drift).
void add_cache_traffic(const CacheTraffic& t, const std::int64_t (&returned_drift)[kPoolKinds], MemoryStats& s) {
  for (int k = 0; k < kPoolKinds; ++k) {
    const auto kind = static_cast<PoolKind>(k);
    const auto add = [&](StatArray& a, std::int64_t allocated, std::int64_t freed) {
      for (int i : {static_cast<int>(kAll), stat_index(kind)}) {
        a[i].allocated += allocated;
        a[i].freed += freed;
      }
    };
    add(s.allocation, t.allocations[k], t.frees[k]);
    add(s.allocated_bytes, t.allocated_bytes[k], t.freed_bytes[k]);
    add(s.requested_bytes, t.requested_bytes[k], t.requested_freed[k] + returned_drift[k]);
    for (int i : {static_cast<int>(kAll), stat_index(kind)}) {
      Stat& requested = s.requested_bytes[i];
      requested.current += t.requested_drift[k] - returned_drift[k];
      requested.peak = std::max(requested.peak, requested.current);  // the pool's peak is of its own figure
    }
    s.cache_hits += t.allocations[k];
  }
}

// The pool counts a block a thread's cache lent again at the request it
// first lent it for; the live table has the program's last one.
void use_last_requests(const DevicePool& pool, StreamCaches& caches, int device, report::Leaks& leaks) {
  if (caches.forked()) return;  // the table is the parent's
  auto last_request = [&](DevicePtr ptr, std::size_t pools) {
    LiveBlock entry;
    return caches.live().find(ptr, &entry) && entry.device == device ? entry.requested : pools;
  };
  leaks.requested_bytes = 0;
  pool.for_each_allocated([&](const Block& b) { leaks.requested_bytes += last_request(b.addr, b.requested); });
  for (report::LeakedBlock& b : leaks.largest) b.requested = last_request(b.addr, b.requested);
}

}  // namespace

std::string expand_path_template(const std::string& pattern, int device) {
  std::string out;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '%' || i + 1 == pattern.size()) {
      out += pattern[i];
      continue;
    }
    switch (pattern[++i]) {
      case 'p': out += std::to_string(getpid()); break;
      case 'e': out += program_name(); break;
      case 'r': out += rank(); break;
      case 'd': out += std::to_string(device); break;
      default: out += pattern[i]; break;
    }
  }
  return out;
}

namespace {
bool names_field(const std::string& pattern, char field) {
  for (std::size_t i = 0; i + 1 < pattern.size(); ++i) {
    if (pattern[i] != '%') continue;
    if (pattern[i + 1] == field) return true;
    ++i;  // %% and the other fields
  }
  return false;
}
}  // namespace

bool names_device(const std::string& pattern) { return names_field(pattern, 'd'); }
bool names_process(const std::string& pattern) { return names_field(pattern, 'p'); }

void write_report_file(const config::Config& config, const std::vector<config::Problem>& problems,
                       const std::vector<std::string>& notes, const std::vector<std::string>& trace_problems,
                       const std::vector<DeviceState*>& devices, CallSites& call_sites, StreamCaches& caches,
                       const char* reason, double wall_seconds) {
  report::Report r;
  r.program = program_name();
  r.pid = getpid();
  r.reason = reason;
  r.wall_seconds = wall_seconds;
  for (const config::OptionInfo& o : config::option_table()) {
    r.config.push_back(report::ConfigRow{o.variable, o.key, o.show(config), o.default_text});
  }
  for (const config::Problem& p : problems) r.config_problems.push_back(p.line());
  r.config_notes = notes;
  r.trace_problems = trace_problems;
  r.stepped_aside_call = stepped_aside_call();
  r.stepped_aside_reason = stepped_aside_reason();
  for (DeviceState* d : devices) {
    std::lock_guard<AdaptiveMutex> lock(d->mu);
    report::DeviceReport dr = report::collect(*d->pool, d->device);
    const CacheTraffic traffic = caches.traffic(d->device);
    add_cache_traffic(traffic, d->requested_returned_drift, dr.stats);
    use_last_requests(*d->pool, caches, d->device, dr.leaks);
    // Never more than the allocated peak it is part of (the sum of each
    // thread's most can be, when the threads' peaks came at different times).
    dr.thread_cache_kept_peak = std::min(traffic.kept_bytes_peak, dr.stats.allocated_bytes[kAll].peak);
    dr.thread_cache_size = caches.max_bytes();
    dr.thread_cache_keeps = traffic.keeps;
    dr.thread_cache_keeps_full = traffic.keeps_full;
    dr.thread_cache_let_go = traffic.let_go;
    if (call_sites.enabled()) {
      dr.leaks.sites = leak_sites(*d->pool, call_sites);
      dr.resets.sites = reset_sites(*d->pool, call_sites);
    }
    r.devices.push_back(std::move(dr));
  }

  const bool default_path_taken = config.log.empty();
  const std::string path =
      expand_path_template(default_path_taken ? default_path(config.log_format) : config.log);
  const std::string text = config.log_format == config::LogFormat::Json ? report::to_json(r) : report::to_text(r);
  std::string failure;
  {
    const SigpipeHeld held;  // a reader gone from the pipe the path names must not end the program
    const OpenedOutput out =
        open_output_file(path, default_path_taken ? OutputPlace::SharedTemporary : OutputPlace::Chosen);
    int error = 0;
    if (out.fd >= 0) {
      const bool written = write_whole(out.fd, text, &error);
      // A network file system may tell of a failed write only here. Closed
      // before anything that could throw.
      if (::close(out.fd) != 0 && errno != EINTR && written) error = errno;
    }
    if (out.fd < 0) {
      failure = out.problem;
    } else if (error != 0) {
      failure = std::strerror(error);
    }
  }
  if (!failure.empty()) {
    if (default_path_taken) failure += " (the default path; GPUPOOL_LOG names another)";
    message(config::LogLevel::Error, "gpupool: GPUPOOL_LOG: cannot write the report to '" + path + "': " + failure);
    return;
  }
  message(config::LogLevel::Info, "gpupool: report written to " + path);
}

}  // namespace gpupool::shim
