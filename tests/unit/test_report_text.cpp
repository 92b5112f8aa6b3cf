// The text report's stream rows: which streams share a row, and what the
// shared rows count.
#include <catch2/catch.hpp>

#include <sstream>
#include <string>

#include "report/format.hpp"

using namespace gpupool;

namespace {

StreamReport row(StreamId id, bool alive, std::uint64_t streams, std::size_t cached_blocks) {
  StreamReport r;
  r.id = id;
  r.alive = alive;
  r.streams = streams;
  r.cached_blocks = cached_blocks;
  r.cached_bytes = cached_blocks * kMiB;
  r.counters.same_stream_reuses = 1;  // none is quiet
  return r;
}

// The text's stream row named `name`, or "" where it has none.
std::string stream_line(const std::string& text, const std::string& name) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("  " + name + " ", 0) == 0) return line;
  }
  return "";
}

}  // namespace

TEST_CASE("the text report folds gone streams holding no cache into one row that counts each stream") {
  report::Report r;
  report::DeviceReport d;
  d.streams = {row(kAnyStream, true, 1, 0),
               row(0x12, false, 1, 0),      // ended threads' streams
               row(0x22, false, 1, 0),
               row(0x32, false, 1, 2),      // one that still holds blocks
               row(0, false, 40, 0)};       // the row of every later gone stream
  r.devices.push_back(d);
  const std::string text = report::to_text(r);
  CHECK_FALSE(stream_line(text, "42 gone, none cached").empty());
  CHECK_FALSE(stream_line(text, "per-thread #3 (gone)").empty());
  CHECK(stream_line(text, "per-thread #1 (gone)").empty());
  CHECK(stream_line(text, "40 more gone").empty());
}

TEST_CASE("the text report says how many gone streams were destroyed where gpupool could not see it") {
  report::Report r;
  report::DeviceReport d;
  d.streams = {row(kAnyStream, true, 1, 0), row(0x12, false, 1, 0), row(0x22, false, 1, 0), row(0x32, false, 1, 2)};
  r.devices.push_back(d);
  const std::string said = "destroyed where gpupool could not see it";
  CHECK(report::to_text(r).find(said) == std::string::npos);
  r.devices[0].streams[3].counters.destroyed_unseen = 1;
  CHECK(report::to_text(r).find("  1 of the gone streams was " + said) != std::string::npos);
  // One folded into the row of gone streams without cache, one on its own.
  r.devices[0].streams[2].counters.destroyed_unseen = 1;
  CHECK(report::to_text(r).find("  2 of the gone streams were " + said) != std::string::npos);
}

TEST_CASE("the text report keeps the row of later gone streams that holds blocks") {
  report::Report r;
  report::DeviceReport d;
  d.streams = {row(kAnyStream, true, 1, 0), row(0x12, false, 1, 0), row(0x22, false, 1, 0),
               row(0, false, 40, 3)};
  r.devices.push_back(d);
  const std::string text = report::to_text(r);
  CHECK_FALSE(stream_line(text, "2 gone, none cached").empty());
  CHECK_FALSE(stream_line(text, "40 more gone").empty());
}

TEST_CASE("the text report says how many cudaFree calls and unmaps were refused and how many barriers the search saved") {
  report::Report r;
  report::DeviceReport d;
  d.streams = {row(kAnyStream, true, 1, 0)};
  r.devices.push_back(d);
  const std::string quiet = report::to_text(r);
  CHECK(quiet.find("cudaFree calls 0 (0 refused)") != std::string::npos);
  CHECK(quiet.find("unmaps 0 (0 refused)") != std::string::npos);
  CHECK(quiet.find("plain_reuse_search") == std::string::npos);  // no search, no line
  r.devices[0].stats.num_device_free = 2;
  r.devices[0].stats.num_device_free_failures = 3;
  r.devices[0].stats.num_page_unmaps = 6;
  r.devices[0].stats.num_page_unmap_failures = 4;
  r.devices[0].streams[0].counters.searched_reuses = 7;
  const std::string text = report::to_text(r);
  CHECK(text.find("cudaFree calls 5 (3 refused)") != std::string::npos);
  CHECK(text.find("unmaps 6 (4 refused)") != std::string::npos);
  CHECK(text.find("  7 cudaMalloc calls took memory the last device barrier covered from a larger free block") !=
        std::string::npos);
}
