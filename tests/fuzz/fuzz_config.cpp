// The environment parser runs inside every program that preloads gpupool, on
// whatever its users exported. Whatever the input: no crash, each problem is
// one line, and the configuration in force is one the option table accepts
// and a pool can run with.
//   Input: entries separated by NUL, each NAME=VALUE; an entry without '='
//   is a GPUPOOL_CONF value.
#include <cstdint>
#include <string>
#include <string_view>

#include "config/config.hpp"
#include "pool/device_pool.hpp"
#include "pool/virtual_upstream.hpp"
#include "tests/fuzz/fuzz_check.hpp"

using namespace gpupool;

namespace {

config::Environment environment_of(std::string_view input) {
  config::Environment env;
  while (!input.empty()) {
    const std::size_t end = input.find('\0');
    const std::string_view entry = input.substr(0, end);
    input = end == std::string_view::npos ? std::string_view() : input.substr(end + 1);
    const std::size_t eq = entry.find('=');
    if (eq == std::string_view::npos) {
      env.emplace_back("GPUPOOL_CONF", std::string(entry));
    } else {
      env.emplace_back(std::string(entry.substr(0, eq)), std::string(entry.substr(eq + 1)));
    }
  }
  return env;
}

// A few allocations and frees on two streams, each checked against the pool's
// invariants: any accepted configuration must give a working pool.
void exercise(const PoolOptions& options) {
  VirtualUpstream upstream(8 * kGiB);
  upstream.set_virtual_memory(options.expandable_segments);
  DevicePool pool(upstream, options, 8 * kGiB);
  pool.stream_created(0x10, StreamKind::NonBlocking);
  DevicePtr held[6] = {};
  const std::size_t sizes[6] = {1, 512 * 1024 + 3, 3 * kMiB, 21 * kMiB, 100 * kMiB, 700 * kMiB};
  for (int i = 0; i < 6; ++i) {
    const Allocation a = pool.allocate(sizes[i], i % 2 == 0 ? kAnyStream : StreamId{0x10});
    if (a.ok) FUZZ_CHECK(upstream.covers(a.ptr, sizes[i]));
    held[i] = a.ok ? a.ptr : 0;
  }
  for (int i = 0; i < 6; i += 2) {
    if (held[i] != 0) FUZZ_CHECK(pool.deallocate(held[i], kAnyStream) == FreeResult::Freed);
  }
  for (int i = 1; i < 6; i += 2) {
    if (held[i] != 0) FUZZ_CHECK(pool.deallocate(held[i], 0x10) == FreeResult::Freed);
  }
  std::string why;
  FUZZ_CHECK(pool.validate(&why));
  pool.release_cached();
  FUZZ_CHECK(pool.validate(&why));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const config::ParsedConfig parsed =
      config::parse_config(environment_of(std::string_view(reinterpret_cast<const char*>(data), size)));
  for (const config::Problem& problem : parsed.problems) {
    const std::string line = problem.line();
    FUZZ_CHECK(line.rfind("gpupool: ", 0) == 0);
    FUZZ_CHECK(line.find_first_of("\n\r") == std::string::npos);  // one line, whatever the value
  }
  // The values in force read back as themselves: each lies in its range.
  for (const config::OptionInfo& option : config::option_table()) {
    config::Config copy;
    std::string why;
    const std::string shown = option.show(parsed.config);
    FUZZ_CHECK(option.parse(shown, copy, &why));
    FUZZ_CHECK(option.show(copy) == shown);
  }
  exercise(config::to_pool_options(parsed.config));
  return 0;
}
