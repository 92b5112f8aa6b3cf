#include <catch2/catch.hpp>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "config/config.hpp"

using namespace gpupool;
using namespace gpupool::config;

namespace {

ParsedConfig parse(std::initializer_list<std::pair<std::string, std::string>> vars) {
  return parse_config(Environment(vars));
}

bool is_path(const OptionInfo& o) { return o.kind == PathTemplate::kKind; }

// Bad inputs by class; which classes apply depends on the option's kind (any
// string is a valid path, for instance).
struct BadInput {
  const char* name;
  std::string value;
};

std::vector<BadInput> bad_inputs(const OptionInfo& o) {
  std::vector<BadInput> out = {{"empty", ""}, {"blank", "   "}};
  if (is_path(o)) {
    out.push_back({"unknown % expansion", "/tmp/report-%q"});
    return out;
  }
  if (o.kind == NameList::kKind) {  // any file name will do
    out.push_back({"a path", "/opt/lib/libengine.so"});
    out.push_back({"an empty name", "libengine.so::libplugin.so"});
    return out;
  }
  out.push_back({"negative", "-5"});
  out.push_back({"non-numeric", "lots"});
  out.push_back({"overflowing", "123456789012345678901234567890"});
  out.push_back({"trailing garbage", "12abc"});
  if (o.kind == Fraction::kKind) {
    out.push_back({"out of range (1)", "1"});
    out.push_back({"out of range (above)", "1.5"});
  }
  if (o.max != 0 || o.min != 0) {
    if (o.min > 1) out.push_back({"below the range", "1K"});
    if (o.max != kUnlimited) out.push_back({"above the range", "2T"});
  }
  return out;
}

}  // namespace

TEST_CASE("defaults hold when the environment says nothing") {
  const ParsedConfig p = parse({{"PATH", "/bin"}, {"HOME", "/root"}});
  CHECK(p.problems.empty());
  CHECK(p.config.max_split_size_mb == kUnlimited);
  CHECK(p.config.max_non_split_rounding_mb == 20 * kMiB);
  CHECK(p.config.small_segment_size == 2 * kMiB);
  CHECK(p.config.large_segment_size == 20 * kMiB);
  CHECK(p.config.log_format == LogFormat::Text);
  CHECK(p.config.report);
  CHECK_FALSE(p.config.disable);
  for (const OptionInfo& o : option_table()) CHECK(o.show(p.config) == o.default_text);
}

TEST_CASE("every option rejects every bad input with one line naming it, and keeps its default") {
  for (const OptionInfo& o : option_table()) {
    for (const BadInput& bad : bad_inputs(o)) {
      INFO(o.variable << " given " << bad.name << " '" << bad.value << "'");
      const ParsedConfig p = parse({{o.variable, bad.value}});
      REQUIRE(p.problems.size() == 1);
      const std::string line = p.problems[0].line();
      CHECK(line.rfind("gpupool: " + o.variable + ": ", 0) == 0);
      CHECK(line.find("('" + bad.value + "'); using " + o.default_text) != std::string::npos);
      CHECK(line.find('\n') == std::string::npos);
      CHECK(o.show(p.config) == o.default_text);
    }
  }
}

TEST_CASE("every option's default, written back, parses cleanly through both spellings") {
  for (const OptionInfo& o : option_table()) {
    if (is_path(o)) continue;  // the default is "(none)"
    INFO(o.variable);
    CHECK(parse({{o.variable, o.default_text}}).problems.empty());
    CHECK(parse({{"GPUPOOL_CONF", o.key + ":" + o.default_text}}).problems.empty());
  }
}

TEST_CASE("GPUPOOL_CONF takes a pasted PYTORCH_CUDA_ALLOC_CONF") {
  const ParsedConfig p = parse({{"GPUPOOL_CONF",
                                 "max_split_size_mb:128,roundup_power2_divisions:[256:1,512:2,>:8],"
                                 "garbage_collection_threshold:0.6,max_non_split_rounding_mb:64"}});
  CHECK(p.problems.empty());
  CHECK(p.config.max_split_size_mb == 128 * kMiB);
  CHECK(p.config.max_non_split_rounding_mb == 64 * kMiB);
  CHECK(p.config.garbage_collection_threshold == Approx(0.6));
  const RoundupDivisions& d = p.config.roundup_power2_divisions;
  CHECK(d[0] == 1);  // the first entry also covers smaller intervals
  CHECK(d[8] == 1);  // 256 MiB
  CHECK(d[9] == 2);  // 512 MiB
  CHECK(d[10] == 8);
  CHECK(d[15] == 8);
}

TEST_CASE("roundup_power2_divisions takes a single value for every size") {
  const ParsedConfig p = parse({{"GPUPOOL_CONF", "roundup_power2_divisions:4"}});
  CHECK(p.problems.empty());
  for (std::uint32_t d : p.config.roundup_power2_divisions) CHECK(d == 4);
  CHECK(parse({{"GPUPOOL_ROUNDUP_POWER2_DIVISIONS", "3"}}).problems.size() == 1);
  CHECK(parse({{"GPUPOOL_ROUNDUP_POWER2_DIVISIONS", "[300:2]"}}).problems.size() == 1);
  CHECK(parse({{"GPUPOOL_ROUNDUP_POWER2_DIVISIONS", "[256:2"}}).problems.size() == 1);
  CHECK(parse({{"GPUPOOL_ROUNDUP_POWER2_DIVISIONS", "[256]"}}).problems.size() == 1);
}

TEST_CASE("a roundup_power2_divisions table is shown as text that reads back as the same table") {
  // Shown in the report and by gpupool-config, and pasted back by users: an
  // interval no entry names is 0, not the value before it.
  const OptionInfo* option = find_option("roundup_power2_divisions");
  REQUIRE(option != nullptr);
  for (const char* text : {"[256:1,512:2,>:8]", "[64:4,128:0,256:8]", "[1:0,2:4,4:0,8:4]", "[1:4]", "[>:4]",
                           "[32768:2]", "[2:8,4:8,16:2]", "[1024:4,2048:0,>:2]"}) {
    INFO(text);
    const ParsedConfig p = parse({{"GPUPOOL_ROUNDUP_POWER2_DIVISIONS", text}});
    REQUIRE(p.problems.empty());
    const std::string shown = option->show(p.config);
    INFO(shown);
    const ParsedConfig again = parse({{"GPUPOOL_ROUNDUP_POWER2_DIVISIONS", shown}});
    CHECK(again.problems.empty());
    CHECK(again.config.roundup_power2_divisions == p.config.roundup_power2_divisions);
  }
  CHECK(option->show(parse({{"GPUPOOL_ROUNDUP_POWER2_DIVISIONS", "[256:1,512:2,>:8]"}}).config) ==
        "[256:1,512:2,>:8]");
}

TEST_CASE("a problem with a control character or a long value in it is still one short line") {
  const ParsedConfig p = parse({{"GPUPOOL_LOG_LEVEL", "debug\nGPUPOOL_REPORT=0"},
                                {"GPUPOOL_MEMORY_LIMIT", std::string(10000, '9')}});
  REQUIRE(p.problems.size() == 2);
  for (const Problem& problem : p.problems) {
    const std::string line = problem.line();
    INFO(line);
    CHECK(line.find('\n') == std::string::npos);
    CHECK(line.size() < 400);
  }
  const bool escaped = std::any_of(p.problems.begin(), p.problems.end(), [](const Problem& problem) {
    return problem.line().find("('debug\\nGPUPOOL_REPORT=0')") != std::string::npos;
  });
  CHECK(escaped);
}

TEST_CASE("a GPUPOOL_<KEY> variable wins over the same key in GPUPOOL_CONF") {
  const ParsedConfig p =
      parse({{"GPUPOOL_CONF", "max_split_size_mb:128"}, {"GPUPOOL_MAX_SPLIT_SIZE_MB", "256"}});
  CHECK(p.problems.empty());
  CHECK(p.config.max_split_size_mb == 256 * kMiB);
}

TEST_CASE("a bad variable falls back to the GPUPOOL_CONF value, and says so") {
  const ParsedConfig p =
      parse({{"GPUPOOL_CONF", "max_split_size_mb:128"}, {"GPUPOOL_MAX_SPLIT_SIZE_MB", "big"}});
  REQUIRE(p.problems.size() == 1);
  CHECK(p.config.max_split_size_mb == 128 * kMiB);
  CHECK(p.problems[0].line().find("using 128") != std::string::npos);
}

TEST_CASE("sizes take K, M, G and T suffixes where the key is a byte size") {
  CHECK(parse({{"GPUPOOL_MEMORY_LIMIT", "8G"}}).config.memory_limit == 8 * kGiB);
  CHECK(parse({{"GPUPOOL_MEMORY_LIMIT", "512MiB"}}).config.memory_limit == 512 * kMiB);
  CHECK(parse({{"GPUPOOL_MEMORY_LIMIT", "1t"}}).config.memory_limit == 1024 * kGiB);
  CHECK(parse({{"GPUPOOL_SMALL_SEGMENT_SIZE", "4194304"}}).config.small_segment_size == 4 * kMiB);
  CHECK(parse({{"GPUPOOL_MAX_SPLIT_SIZE_MB", "1G"}}).config.max_split_size_mb == kGiB);
  CHECK(parse({{"GPUPOOL_MEMORY_LIMIT", "8X"}}).problems.size() == 1);
}

TEST_CASE("a size that fits a whole number but not with its unit is refused, not wrapped around") {
  // 2^44 T and 2^44 MiB are 2^84 and 2^64 bytes: the number alone fits 64 bits.
  for (const auto& [variable, value] : {std::pair{"GPUPOOL_MEMORY_LIMIT", "17592186044416T"},
                                        std::pair{"GPUPOOL_MAX_SPLIT_SIZE_MB", "17592186044416"}}) {
    INFO(variable << "=" << value);
    const ParsedConfig p = parse({{variable, value}});
    REQUIRE(p.problems.size() == 1);
    CHECK(p.problems[0].line().find("size too large") != std::string::npos);
  }
}

TEST_CASE("every problem is reported, not just the first") {
  const ParsedConfig p = parse({{"GPUPOOL_CONF", "max_split_size_mb:abc,bogus:1,pinned_use_cuda_host_register:True,nocolon"},
                                {"GPUPOOL_LOG_FORMAT", "xml"},
                                {"GPUPOOL_MEMORY_LIMT", "8G"},
                                {"GPUPOOL_DISABLE", "maybe"}});
  REQUIRE(p.problems.size() == 6);
  std::string all;
  for (const Problem& pr : p.problems) all += pr.line() + "\n";
  CHECK(all.find("GPUPOOL_CONF:max_split_size_mb: not a size") != std::string::npos);
  CHECK(all.find("unknown key 'bogus'") != std::string::npos);
  // A PyTorch-only key is valid PyTorch: a note, not a problem.
  CHECK(all.find("pinned_use_cuda_host_register") == std::string::npos);
  REQUIRE(p.notes.size() == 1);
  CHECK(p.notes[0] ==
        "gpupool: GPUPOOL_CONF: PyTorch option 'pinned_use_cuda_host_register' has no gpupool equivalent "
        "('pinned_use_cuda_host_register:True'); ignored");
  CHECK(all.find("expected key:value ('nocolon'); ignored") != std::string::npos);
  CHECK(all.find("GPUPOOL_LOG_FORMAT: must be one of text or json ('xml'); using text") != std::string::npos);
  CHECK(all.find("GPUPOOL_MEMORY_LIMT: unknown variable (did you mean GPUPOOL_MEMORY_LIMIT?)") !=
        std::string::npos);
  CHECK(all.find("GPUPOOL_DISABLE: must be 1 or 0") != std::string::npos);
}

TEST_CASE("library names for static_runtime_libraries: colon-separated file names, matched by prefix") {
  const ParsedConfig ok = parse({{"GPUPOOL_CONF", "static_runtime:1,static_runtime_libraries:libengine.so:libplug"}});
  REQUIRE(ok.problems.empty());
  CHECK(ok.notes.empty());
  const std::string& names = ok.config.static_runtime_libraries;
  CHECK(names_match(names, "/opt/app/lib/libengine.so.3"));
  CHECK(names_match(names, "libplugin_cuda.so"));
  CHECK_FALSE(names_match(names, "/usr/lib/libmyengine.so"));
  CHECK_FALSE(names_match(names, "/opt/libengine.so.d/other.so"));  // the file name, not a folder
  CHECK_FALSE(names_match("", "libengine.so"));
  for (const char* bad : {"libengine.so::libplug.so", "/opt/lib/libengine.so", "libengine.so:"}) {
    const ParsedConfig p = parse({{"GPUPOOL_STATIC_RUNTIME_LIBRARIES", bad}});
    REQUIRE(p.problems.size() == 1);
    CHECK(p.config.static_runtime_libraries.empty());
  }
  // Without static_runtime:1 the names do nothing: said, not a problem.
  const ParsedConfig alone = parse({{"GPUPOOL_STATIC_RUNTIME_LIBRARIES", "libengine.so"}});
  CHECK(alone.problems.empty());
  REQUIRE(alone.notes.size() == 1);
  CHECK(alone.notes[0].find("static_runtime:1") != std::string::npos);
}

TEST_CASE("unknown GPUPOOL_CONF keys suggest the nearest known key") {
  const ParsedConfig p = parse({{"GPUPOOL_CONF", "max_split_size:64"}});
  REQUIRE(p.problems.size() == 1);
  CHECK(p.problems[0].what == "unknown key 'max_split_size' (did you mean max_split_size_mb?)");
}

TEST_CASE("max_split_size_mb must exceed the large segment size") {
  const ParsedConfig p = parse({{"GPUPOOL_MAX_SPLIT_SIZE_MB", "64"}, {"GPUPOOL_LARGE_SEGMENT_SIZE", "64M"}});
  REQUIRE(p.problems.size() == 1);
  CHECK(p.config.max_split_size_mb == kUnlimited);
  CHECK(p.problems[0].line() ==
        "gpupool: GPUPOOL_MAX_SPLIT_SIZE_MB: must be more than large_segment_size (64M) ('64'); using unlimited");
}

TEST_CASE("a split limit with expandable segments is a note, not a problem") {
  const ParsedConfig pasted = parse({{"GPUPOOL_CONF", "max_split_size_mb:128"}});
  CHECK(pasted.problems.empty());
  CHECK(pasted.config.max_split_size_mb == 128 * kMiB);  // kept: it applies where segments are fixed
  REQUIRE(pasted.notes.size() == 1);
  CHECK(pasted.notes[0].find("max_split_size_mb (128)") != std::string::npos);
  CHECK(pasted.notes[0].find("expandable_segments:0") != std::string::npos);
  CHECK(parse({{"GPUPOOL_CONF", "max_split_size_mb:128,expandable_segments:0"}}).notes.empty());
  CHECK(parse({{"GPUPOOL_CONF", "expandable_segments:1"}}).notes.empty());
}

TEST_CASE("segment sizes must be whole 2 MiB pages") {
  const ParsedConfig p = parse({{"GPUPOOL_SMALL_SEGMENT_SIZE", "3M"}});
  REQUIRE(p.problems.size() == 1);
  CHECK(p.config.small_segment_size == 2 * kMiB);
}

TEST_CASE("choices, flags and signals parse every accepted spelling") {
  CHECK(parse({{"GPUPOOL_CROSS_STREAM_REUSE", "never"}}).config.cross_stream_reuse == CrossStreamReuse::Never);
  CHECK(parse({{"GPUPOOL_MEM_GET_INFO", "cached_is_used"}}).config.mem_get_info == MemGetInfo::CachedIsUsed);
  CHECK(parse({{"GPUPOOL_DISABLE", "yes"}}).config.disable);
  CHECK(parse({{"GPUPOOL_DISABLE", "TRUE"}}).config.disable);
  CHECK_FALSE(parse({{"GPUPOOL_REPORT", "off"}}).config.report);
  {
    // A path where a flag goes: the report stays on, and the line says where a path goes.
    const ParsedConfig p = parse({{"GPUPOOL_REPORT", "/tmp/run.txt"}});
    CHECK(p.config.report);
    REQUIRE(p.problems.size() == 1);
    CHECK(p.problems[0].line().find("the report's path goes in GPUPOOL_LOG") != std::string::npos);
    CHECK(parse({{"GPUPOOL_REPORT", "maybe"}}).problems[0].line().find("GPUPOOL_LOG") == std::string::npos);
  }
  CHECK(parse({{"GPUPOOL_REPORT_SIGNAL", "none"}}).config.report_signal == 0);
  CHECK(parse({{"GPUPOOL_REPORT_SIGNAL", "SIGUSR2"}}).config.report_signal == SIGUSR2);
  CHECK(parse({{"GPUPOOL_LOG", "/tmp/r-%e-%p-%r.txt"}}).config.log == "/tmp/r-%e-%p-%r.txt");
}

TEST_CASE("a trace path may name the device, a report path may not (one report covers every device)") {
  CHECK(parse({{"GPUPOOL_TRACE", "/tmp/t-%p-%d.csv"}}).problems.empty());
  CHECK(parse({{"GPUPOOL_TRACE", "/tmp/t-%p-%d.csv"}}).config.trace == "/tmp/t-%p-%d.csv");
  const ParsedConfig log = parse({{"GPUPOOL_LOG", "/tmp/r-%d.txt"}});
  REQUIRE(log.problems.size() == 1);
  CHECK(log.problems[0].line().find("unknown '%d'") != std::string::npos);
  CHECK(log.config.log.empty());
}

TEST_CASE("the pool options follow the configuration") {
  const ParsedConfig p = parse({{"GPUPOOL_CONF", "max_split_size_mb:256,garbage_collection_threshold:0.8"},
                                {"GPUPOOL_MEMORY_LIMIT", "8G"},
                                {"GPUPOOL_CROSS_STREAM_REUSE", "completed"},
                                {"GPUPOOL_RECYCLE_IDLE_ALLOCATIONS", "0"},
                                {"GPUPOOL_PLAIN_REUSE_SEARCH", "16"}});
  const PoolOptions o = to_pool_options(p.config);
  CHECK(o.max_split_size == 256 * kMiB);
  CHECK(o.garbage_collection_threshold == Approx(0.8));
  CHECK(o.memory_limit == 8 * kGiB);
  CHECK(o.cross_stream_reuse == CrossStreamReuse::Completed);
  CHECK(o.recycle_idle_allocations == 0);
  CHECK(o.plain_reuse_search == 16);
  CHECK_FALSE(o.unsafe_skip_ordering);
}

TEST_CASE("plain_reuse_search is auto by default, and takes auto or a count") {
  CHECK(to_pool_options(parse({}).config).plain_reuse_search == PoolOptions::kSearchAuto);
  CHECK(to_pool_options(parse({{"GPUPOOL_PLAIN_REUSE_SEARCH", " Auto "}}).config).plain_reuse_search ==
        PoolOptions::kSearchAuto);
  CHECK(to_pool_options(parse({{"GPUPOOL_CONF", "plain_reuse_search:0"}}).config).plain_reuse_search == 0);
  const ParsedConfig over = parse({{"GPUPOOL_PLAIN_REUSE_SEARCH", "1001"}});
  REQUIRE(over.problems.size() == 1);
  CHECK(over.problems[0].line().find("out of range (auto, or from 0 to 1000)") != std::string::npos);
  CHECK(to_pool_options(over.config).plain_reuse_search == PoolOptions::kSearchAuto);
  // The sentinel is not a count a user can give.
  CHECK_FALSE(parse({{"GPUPOOL_PLAIN_REUSE_SEARCH", std::to_string(PoolOptions::kSearchAuto)}}).problems.empty());
}

TEST_CASE("the README's option table is the one the code generates") {
  std::ifstream readme(GPUPOOL_SOURCE_DIR "/README.md");
  REQUIRE(readme.good());
  std::stringstream text;
  text << readme.rdbuf();
  const std::string s = text.str();
  const std::string begin = "<!-- options:begin -->\n";
  const std::string end = "<!-- options:end -->";
  const std::size_t a = s.find(begin);
  const std::size_t b = s.find(end);
  REQUIRE(a != std::string::npos);
  REQUIRE(b != std::string::npos);
  INFO("regenerate with: scripts/sync-readme-options");
  CHECK(s.substr(a + begin.size(), b - a - begin.size()) == markdown_table());
}
