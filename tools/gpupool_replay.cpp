// gpupool-replay: replays allocation traces through gpupool's pool and says
// how much memory each configuration reserves for them.
//
//   gpupool-replay [--passes N] [--capacity SIZE] [--conf CONF] [--set KEY=VALUE]...
//                  [--sweep KEY=V1,V2,...]... [--tune] [--plain] [--idle-streams N] [--json]
//                  [--details] TRACE.csv...
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "report/diagnosis.hpp"
#include "report/json_writer.hpp"
#include "tools/replay.hpp"

using namespace gpupool;

namespace {

struct Sweep {
  std::string key;
  std::vector<std::string> values;
};

struct Args {
  int passes = 1;
  std::size_t capacity = 80 * kGiB;
  std::vector<std::string> settings;  // key:value, applied in order
  std::vector<Sweep> sweeps;
  bool tune = false;
  bool json = false;
  bool details = false;
  bool plain = false;
  int idle_streams = 0;
  std::vector<std::string> traces;
};

[[noreturn]] void usage(const char* why) {
  if (why != nullptr) std::fprintf(stderr, "gpupool-replay: %s\n", why);
  std::fprintf(stderr,
               "usage: gpupool-replay [--passes N] [--capacity SIZE] [--conf K:V,...] [--set KEY=VALUE]...\n"
               "                      [--sweep KEY=V1,V2,...]... [--tune] [--plain] [--idle-streams N] [--json]\n"
               "                      [--details] TRACE.csv...\n"
               "  KEY is any GPUPOOL_CONF key (gpupool config lists them); --sweep tries every combination.\n"
               "  --tune tries the settings that shape how much memory the pool reserves (segment mode,\n"
               "  page recycling, split limit, size rounding) and recommends the best.\n"
               "  --plain replays every call as plain cudaMalloc/cudaFree, with no stream (a program\n"
               "  under PYTORCH_NO_CUDA_MEMORY_CACHING=1).\n"
               "  --idle-streams N adds N non-blocking streams that are never used, as PyTorch's stream pool\n"
               "  (32 per priority level once a program asks for a side stream); --json then counts the\n"
               "  waits and queries each device barrier makes on them.\n");
  std::exit(2);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::size_t start = 0;
  int depth = 0;
  for (std::size_t i = 0; i <= s.size(); ++i) {
    if (i < s.size() && s[i] == '[') ++depth;
    if (i < s.size() && s[i] == ']') --depth;
    if (i == s.size() || (s[i] == sep && depth == 0)) {
      out.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  }
  return out;
}

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing value after " + arg).c_str());
      return argv[++i];
    };
    if (arg == "--passes") {
      a.passes = std::atoi(value().c_str());
      if (a.passes < 1) usage("--passes must be at least 1");
    } else if (arg == "--capacity") {
      std::string why;
      if (!config::parse_size(value(), 1, &a.capacity, &why)) usage(("--capacity: " + why).c_str());
    } else if (arg == "--conf") {
      for (const std::string& kv : split(value(), ',')) a.settings.push_back(kv);
    } else if (arg == "--set") {
      std::string kv = value();
      const std::size_t eq = kv.find('=');
      if (eq == std::string::npos) usage("--set takes KEY=VALUE");
      a.settings.push_back(kv.substr(0, eq) + ":" + kv.substr(eq + 1));
    } else if (arg == "--sweep") {
      const std::string kv = value();
      const std::size_t eq = kv.find('=');
      if (eq == std::string::npos) usage("--sweep takes KEY=V1,V2,...");
      a.sweeps.push_back(Sweep{kv.substr(0, eq), split(kv.substr(eq + 1), ',')});
    } else if (arg == "--tune") {
      a.tune = true;
    } else if (arg == "--json") {
      a.json = true;
    } else if (arg == "--details") {
      a.details = true;
    } else if (arg == "--plain") {
      a.plain = true;
    } else if (arg == "--idle-streams") {
      a.idle_streams = std::atoi(value().c_str());
      if (a.idle_streams < 0 || a.idle_streams > 4096) usage("--idle-streams takes 0 to 4096");
    } else if (arg == "-h" || arg == "--help") {
      usage(nullptr);
    } else if (!arg.empty() && arg[0] == '-') {
      usage(("unknown option " + arg).c_str());
    } else {
      a.traces.push_back(arg);
    }
  }
  if (a.traces.empty()) usage("no trace given");
  return a;
}

// What --tune tries: each segment mode with the settings that matter to it
// (a split limit and page recycling each apply to one mode only), the
// defaults first so that a tie recommends them.
std::vector<std::vector<std::string>> tuning_settings() {
  std::vector<std::vector<std::string>> out;
  for (const char* rounding : {"0", "4"}) {
    for (const char* idle : {"16", "0"}) {
      out.push_back({"expandable_segments:1", "recycle_pages:1", std::string("recycle_idle_allocations:") + idle,
                     std::string("roundup_power2_divisions:") + rounding});
    }
    out.push_back({"expandable_segments:1", "recycle_pages:0", std::string("roundup_power2_divisions:") + rounding});
    for (const char* split : {"unlimited", "256"}) {
      out.push_back({"expandable_segments:0", std::string("max_split_size_mb:") + split,
                     std::string("roundup_power2_divisions:") + rounding});
    }
  }
  return out;
}

// The settings as one GPUPOOL_CONF string, validated by gpupool's own parser.
PoolOptions options_for(const std::vector<std::string>& settings, std::string* conf) {
  std::string joined;
  for (const std::string& s : settings) joined += (joined.empty() ? "" : ",") + s;
  const config::ParsedConfig parsed = config::parse_config({{"GPUPOOL_CONF", joined}});
  if (!parsed.problems.empty()) {
    for (const config::Problem& p : parsed.problems) std::fprintf(stderr, "%s\n", p.line().c_str());
    std::exit(2);
  }
  static std::set<std::string> told;  // a sweep builds many configurations: each note once
  for (const std::string& note : parsed.notes) {
    if (!told.insert(note).second) continue;
    std::fflush(stdout);  // after the rows printed so far, where both go to one file
    std::fprintf(stderr, "%s\n", note.c_str());
  }
  *conf = joined;
  return config::to_pool_options(parsed.config);
}

std::string human(std::size_t bytes) { return report::human_bytes(static_cast<double>(bytes)); }

void print_json(const tools::ReplayResult& r, const std::string& conf, bool plain, int idle_streams) {
  report::JsonWriter w;
  w.begin_object();
  w.field("trace", r.trace);
  w.field("conf", conf);
  w.field("passes", r.passes);
  w.field("plain", plain);
  w.field("allocations", r.allocations);
  w.field("frees", r.frees);
  w.field("unknown_frees", r.unknown_frees);
  w.field("lost_frees", r.lost_frees);
  w.field("trace_allocation_failures", r.trace_failures);
  w.field("peak_live_bytes", r.peak_live);
  w.field("peak_reserved_bytes", r.peak_reserved);
  w.field("peak_reserved_to_peak_live", r.ratio());
  w.field("upstream_mallocs", r.upstream_mallocs);
  w.field("page_maps", r.device.stats.num_page_maps);
  w.field("page_unmaps", r.device.stats.num_page_unmaps);
  w.field("last_pass_page_maps", r.last_pass.page_maps);
  w.field("last_pass_page_unmaps", r.last_pass.page_unmaps);
  w.field("last_pass_upstream_mallocs", r.last_pass.mallocs);
  w.field("last_pass_upstream_frees", r.last_pass.frees);
  w.field("events_recorded", r.events_recorded);
  w.field("event_queries", r.event_queries);
  w.field("stream_waits", r.stream_waits);
  w.field("stream_queries", r.stream_queries);
  w.field("idle_streams", idle_streams);
  w.field("barriers", r.barriers);
  w.field("ooms", r.ooms);
  w.field("external_fragmentation_at_peak", r.external_fragmentation_at_peak);
  w.field("ns_per_op", r.ns_per_op);
  w.end_object();
  std::printf("%s\n", w.str().c_str());
}

// The first column is as wide as its longest label (a trace's name, or a
// sweep's configuration), so that the figures line up.
int label_width(const std::vector<std::string>& labels) {
  std::size_t width = 30;
  for (const std::string& l : labels) width = std::max(width, l.size());
  return static_cast<int>(width);
}

void print_header(const char* title, int width) {
  std::printf("%-*s %8s %12s %14s %8s %10s %7s %5s %9s %9s %10s %7s\n", width, title, "allocs", "peak live",
              "peak reserved", "ratio", "cudaMalloc", "maps", "OOMs", "extfrag@pk", "last pass", "sync/alloc",
              "ns/op");
}

// The pool's event and stream calls that order reuse (records, waits,
// queries), per allocation: what --plain and --idle-streams weigh.
double sync_per_allocation(const tools::ReplayResult& r) {
  const double calls = static_cast<double>(r.events_recorded + r.event_queries + r.stream_waits + r.stream_queries);
  return r.allocations > 0 ? calls / static_cast<double>(r.allocations) : 0.0;
}

// "last pass": the device calls (maps, unmaps, cudaMalloc, cudaFree) of the
// last pass, which a loop would make at every step; "-" with one pass.
// "sync/alloc": sync_per_allocation.
void print_row(const tools::ReplayResult& r, const std::string& label, int width) {
  const std::string last = r.passes > 1 ? std::to_string(r.last_pass.total()) : "-";
  const double per_allocation = sync_per_allocation(r);
  std::printf("%-*s %8llu %12s %14s %8.4f %10lld %7lld %5lld %9.3f %9s %10.2f %7.0f\n", width, label.c_str(),
              static_cast<unsigned long long>(r.allocations), human(r.peak_live).c_str(),
              human(r.peak_reserved).c_str(), r.ratio(), static_cast<long long>(r.upstream_mallocs),
              static_cast<long long>(r.device.stats.num_page_maps), static_cast<long long>(r.ooms),
              r.external_fragmentation_at_peak, last.c_str(), per_allocation, r.ns_per_op);
  if (r.unknown_frees > 0) {
    std::printf("%*s (%llu frees of pointers the trace never allocated: skipped)\n", width, "",
                static_cast<unsigned long long>(r.unknown_frees));
  }
  if (r.lost_frees == 1) {
    std::printf("%*s (1 allocation of a pointer still live, whose free the trace lost: that block freed first)\n",
                width, "");
  } else if (r.lost_frees > 1) {
    std::printf("%*s (%llu allocations of pointers still live, whose frees the trace lost: those blocks freed "
                "first)\n",
                width, "", static_cast<unsigned long long>(r.lost_frees));
  }
}

void print_details(const tools::ReplayResult& r) {
  const report::DeviceReport& d = r.device;
  const auto& cause = r.peak_cause;
  std::printf("  reserved memory peaked at event %llu of pass %d: %s asked on stream %#llx; cached then:\n",
              static_cast<unsigned long long>(cause.event), cause.pass + 1, human(cause.size).c_str(),
              static_cast<unsigned long long>(cause.stream));
  for (const StreamReport& s : cause.cached) {
    if (s.cached_blocks == 0) continue;
    std::printf("    stream %#llx: %zu blocks, %s\n", static_cast<unsigned long long>(s.id), s.cached_blocks,
                human(s.cached_bytes).c_str());
  }
  std::printf("  free blocks when reserved memory peaked (%s free, largest %s):\n",
              human(d.fragmentation_at_peak.free_bytes).c_str(),
              human(d.fragmentation_at_peak.largest_free_block).c_str());
  for (int b = 0; b < kHistogramBuckets; ++b) {
    if (d.free_blocks_at_peak.count[b] == 0) continue;
    std::printf("    >= %-11s %8llu blocks %12s\n", human(std::size_t{1} << b).c_str(),
                static_cast<unsigned long long>(d.free_blocks_at_peak.count[b]),
                human(d.free_blocks_at_peak.bytes[b]).c_str());
  }
  for (const StreamReport& s : d.streams) {
    if (s.counters.same_stream_reuses + s.counters.cross_stream_reuses == 0) continue;
    std::printf("  stream %#llx: %llu same-stream, %llu cross-stream reuses\n",
                static_cast<unsigned long long>(s.id), static_cast<unsigned long long>(s.counters.same_stream_reuses),
                static_cast<unsigned long long>(s.counters.cross_stream_reuses));
  }
}

// What a loop past its warm-up would ask of the device at every step. Maps
// and unmaps (each of a run of pages) timed on an H200 (README): about
// 0.5 ms and 0.3 ms each; a cudaMalloc and a cudaFree of fixed segments about
// 0.045 ms each (a pair of the traces' sizes took 90.5 us there, BENCHMARKS.md).
double churn_cost_ms(const tools::ReplayResult::DeviceCalls& c) {
  return static_cast<double>(c.page_maps) * 0.5 + static_cast<double>(c.page_unmaps) * 0.3 +
         static_cast<double>(c.mallocs + c.frees) * 0.045;
}

std::string churn(const tools::ReplayResult::DeviceCalls& c) {
  std::string s = "the last pass maps pages " + std::to_string(c.page_maps) + " times and unmaps them " +
                  std::to_string(c.page_unmaps) + " times";
  char ms[64];
  std::snprintf(ms, sizeof ms, " (about %.1f ms per pass on an H200)", churn_cost_ms(c));
  s += ms;
  if (c.mallocs + c.frees > 0) {
    s += ", and makes " + std::to_string(c.mallocs) + " cudaMalloc and " + std::to_string(c.frees) + " cudaFree calls";
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse_args(argc, argv);
  std::vector<tools::Trace> traces(args.traces.size());
  for (std::size_t i = 0; i < traces.size(); ++i) {
    std::string error;
    if (!tools::read_trace(args.traces[i], &traces[i], &error)) {
      std::fprintf(stderr, "gpupool-replay: %s\n", error.c_str());
      return 1;
    }
    const auto& events = traces[i].events;
    if (std::none_of(events.begin(), events.end(),
                     [](const tools::TraceEvent& e) { return e.action == tools::TraceEvent::Action::Allocate; })) {
      // An empty file (a run that never allocated, or one stopped before its
      // first flush): nothing to measure, and no setting to recommend.
      std::fprintf(stderr, "gpupool-replay: %s: no allocation to replay (%zu events)\n", args.traces[i].c_str(),
                   events.size());
      return 1;
    }
    if (traces[i].cut_line != 0) {
      std::fprintf(stderr,
                   "gpupool-replay: %s:%zu: the trace ends partway through this line (was its writer stopped?); "
                   "replaying the %zu events before it\n",
                   args.traces[i].c_str(), traces[i].cut_line, traces[i].events.size());
    }
    if (traces[i].unterminated_line != 0) {
      std::fprintf(stderr,
                   "gpupool-replay: %s:%zu: the trace's last line has no newline; replayed as read (had its writer "
                   "been stopped, its last field may be cut short)\n",
                   args.traces[i].c_str(), traces[i].unterminated_line);
    }
  }

  // Every combination of the swept values, on top of the fixed settings (and
  // of the tuning settings, which come after them and so win).
  std::vector<std::vector<std::string>> configs{args.settings};
  if (args.tune) {
    configs.clear();
    for (const auto& tuning : tuning_settings()) {
      auto c = args.settings;
      c.insert(c.end(), tuning.begin(), tuning.end());
      configs.push_back(c);
    }
  }
  for (const Sweep& sweep : args.sweeps) {
    std::vector<std::vector<std::string>> next;
    for (const auto& base : configs) {
      for (const std::string& v : sweep.values) {
        auto c = base;
        c.push_back(sweep.key + ":" + v);
        next.push_back(c);
      }
    }
    configs = next;
  }

  struct Row {
    std::string conf;
    std::vector<tools::ReplayResult> results;
    double mean_ratio = 0.0;
    double worst_ratio = 0.0;
  };
  std::vector<Row> rows;
  for (const auto& settings : configs) {
    Row row;
    const PoolOptions options = options_for(settings, &row.conf);
    for (const tools::Trace& t : traces) {
      try {
        row.results.push_back(tools::replay(t, options, args.capacity, args.passes, args.details, args.plain,
                                            args.idle_streams));
      } catch (const std::logic_error& e) {
        std::fprintf(stderr, "gpupool-replay: internal error (%s): %s\n", row.conf.c_str(), e.what());
        return 70;
      }
      const tools::ReplayResult& r = row.results.back();
      row.mean_ratio += r.ratio() / static_cast<double>(traces.size());
      row.worst_ratio = std::max(row.worst_ratio, r.ratio());
      if (args.json) print_json(r, row.conf, args.plain, args.idle_streams);
    }
    rows.push_back(std::move(row));
  }
  if (args.json) return 0;

  if (rows.size() == 1) {
    std::vector<std::string> names;
    for (const tools::ReplayResult& r : rows[0].results) names.push_back(r.trace);
    const int width = label_width(names);
    print_header("trace", width);
    for (const tools::ReplayResult& r : rows[0].results) {
      print_row(r, r.trace, width);
      if (args.details) print_details(r);
    }
    return 0;
  }
  // A sweep: per trace, configurations by peak reserved; then the overall
  // best. With several passes, a best whose last pass still maps and unmaps
  // pages (a loop past its warm-up would pay that at every step) is said so,
  // with the lowest peak among the configurations that pay a tenth of that
  // or less (or 1 ms per pass): the other end of the trade.
  auto churn_ms = [](const Row& r, std::size_t t) { return churn_cost_ms(r.results[t].last_pass); };
  auto calm_enough = [](double ms, double than) { return ms < than && ms <= std::max(1.0, than / 10); };
  for (std::size_t t = 0; t < traces.size(); ++t) {
    std::vector<const Row*> order;
    for (const Row& r : rows) order.push_back(&r);
    std::stable_sort(order.begin(), order.end(), [&](const Row* a, const Row* b) {
      const tools::ReplayResult& x = a->results[t];
      const tools::ReplayResult& y = b->results[t];
      if (x.ooms != y.ooms) return x.ooms < y.ooms;
      if (x.peak_reserved != y.peak_reserved) return x.peak_reserved < y.peak_reserved;
      return sync_per_allocation(x) < sync_per_allocation(y);  // the same memory for fewer calls
    });
    std::printf("\n%s (%d pass%s)\n", traces[t].name.c_str(), args.passes, args.passes == 1 ? "" : "es");
    auto label = [](const Row* r) { return r->conf.empty() ? std::string("(defaults)") : r->conf; };
    std::vector<std::string> labels;
    for (const Row* r : order) labels.push_back(label(r));
    const int width = label_width(labels);
    print_header("configuration", width);
    for (const Row* r : order) print_row(r->results[t], label(r), width);
    std::printf("best for %s: GPUPOOL_CONF=%s\n", traces[t].name.c_str(), order[0]->conf.c_str());
    if (churn_ms(*order[0], t) > 0.0) {
      std::printf("  %s\n", churn(order[0]->results[t].last_pass).c_str());
      for (const Row* r : order) {
        if (r->results[t].ooms == order[0]->results[t].ooms && calm_enough(churn_ms(*r, t), churn_ms(*order[0], t))) {
          std::printf("  remapping a tenth as much or less: GPUPOOL_CONF=%s (%.4f; about %.1f ms per pass)\n",
                      r->conf.c_str(), r->results[t].ratio(), churn_ms(*r, t));
          break;
        }
      }
    }
    // The other trade: ordering calls (device barriers, with --plain; each
    // many calls beside --idle-streams; see plain_reuse_search) against
    // memory. Said where the best makes one for every ten allocations or more.
    const double best_sync = sync_per_allocation(order[0]->results[t]);
    for (const Row* r : order) {
      const double sync = sync_per_allocation(r->results[t]);
      if (r->results[t].ooms == order[0]->results[t].ooms && best_sync >= 0.1 && sync <= best_sync / 2) {
        std::printf("  half the ordering calls or fewer: GPUPOOL_CONF=%s (%.2f per allocation against %.2f; %.4f)\n",
                    r->conf.c_str(), sync, best_sync, r->results[t].ratio());
        break;
      }
    }
  }
  auto ooms_of = [](const Row& r) {
    std::int64_t ooms = 0;
    for (const auto& x : r.results) ooms += x.ooms;
    return ooms;
  };
  auto total_churn_ms = [&](const Row& r) {
    double ms = 0.0;
    for (std::size_t t = 0; t < traces.size(); ++t) ms += churn_ms(r, t);
    return ms;
  };
  auto sync_of = [](const Row& r) {
    double calls = 0.0;
    for (const auto& x : r.results) calls += sync_per_allocation(x);
    return calls;
  };
  auto better = [&](const Row& a, const Row& b) {
    if (ooms_of(a) != ooms_of(b)) return ooms_of(a) < ooms_of(b);
    if (a.mean_ratio != b.mean_ratio) return a.mean_ratio < b.mean_ratio;
    return sync_of(a) < sync_of(b);  // the same memory for fewer calls
  };
  const Row* best = &rows[0];
  for (const Row& r : rows) {
    if (better(r, *best)) best = &r;
  }
  std::printf("\nrecommended for %s: GPUPOOL_CONF=%s  (peak reserved / peak live: mean %.4f, worst %.4f)\n",
              traces.size() == 1 ? "this trace" : "these traces together", best->conf.c_str(), best->mean_ratio,
              best->worst_ratio);
  if (total_churn_ms(*best) > 0.0) {
    const Row* calmer = nullptr;
    for (const Row& r : rows) {
      if (ooms_of(r) == ooms_of(*best) && calm_enough(total_churn_ms(r), total_churn_ms(*best)) &&
          (calmer == nullptr || better(r, *calmer))) {
        calmer = &r;
      }
    }
    std::printf("  past the first pass it keeps remapping pages: about %.0f ms per pass on an H200 over all traces\n",
                total_churn_ms(*best));
    if (calmer != nullptr) {
      std::printf("  remapping a tenth as much or less: GPUPOOL_CONF=%s  (mean %.4f, worst %.4f; about %.1f ms per pass)\n",
                  calmer->conf.c_str(), calmer->mean_ratio, calmer->worst_ratio, total_churn_ms(*calmer));
    }
  }
  return 0;
}
