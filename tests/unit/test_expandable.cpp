// Expandable segments: one address range per pool kind, pages mapped as it
// grows and unmapped when released.
#include "pool_fixture.hpp"
#include "report/collect.hpp"
#include "report/diagnosis.hpp"

using namespace gpupool;
using gpupool::testing::PoolFixture;

namespace {
constexpr std::size_t kPage = VirtualUpstream::kPage;

struct ExpandableFixture : PoolFixture {
  ExpandableFixture() { options.expandable_segments = true; }
  std::int64_t reserved() const { return pool->stats().reserved_bytes[kAll].current; }
  void check_mapping() {
    check();
    REQUIRE(upstream.mapped_pages() * kPage == static_cast<std::size_t>(reserved()));
  }
};
}  // namespace

TEST_CASE_METHOD(ExpandableFixture, "an expandable segment maps only the pages requests need") {
  make();
  const DevicePtr a = alloc(3 * kMiB);
  check_mapping();
  CHECK(reserved() == static_cast<std::int64_t>(4 * kMiB));  // two 2 MiB pages
  const DevicePtr b = alloc(3 * kMiB);
  check_mapping();
  CHECK(b > a);
  CHECK(upstream.allocations() == 0);  // no cudaMalloc-style segments at all
  CHECK(pool->stats().segment[kLargePool].current == 1);
}

TEST_CASE_METHOD(ExpandableFixture, "growth extends a free block at the end instead of stranding it") {
  make();
  alloc(2 * kMiB);
  const DevicePtr b = alloc(6 * kMiB);
  alloc(1 * kMiB + 512);  // takes part of the last page
  release(b);
  // 9 MiB fits nowhere mapped; the free 6 MiB block in the middle cannot grow,
  // but a new request at the end reuses the last page's free tail.
  const std::int64_t before = reserved();
  alloc(9 * kMiB);
  check_mapping();
  CHECK(reserved() - before <= static_cast<std::int64_t>(10 * kMiB));
}

TEST_CASE_METHOD(ExpandableFixture, "a free block before the unmapped tail grows into it") {
  make();
  alloc(2 * kMiB);
  const DevicePtr b = alloc(4 * kMiB);
  release(b);  // free, mapped, right before the unmapped rest of the range
  const std::int64_t before = reserved();
  CHECK(alloc(8 * kMiB) == b);  // the free 4 MiB plus 4 MiB of new pages
  CHECK(reserved() - before == static_cast<std::int64_t>(4 * kMiB));
  check_mapping();
}

TEST_CASE_METHOD(ExpandableFixture, "release_cached unmaps whole free pages and keeps partial ones") {
  make();
  const DevicePtr a = alloc(5 * kMiB);
  const DevicePtr b = alloc(5 * kMiB + 512);
  alloc(3 * kMiB);
  release(a);
  release(b);
  const std::int64_t before = reserved();
  CHECK(pool->release_cached() > 0);
  check_mapping();
  CHECK(reserved() < before);
  // The freed range is address space again; it is mapped afresh when needed.
  const DevicePtr c = alloc(10 * kMiB);
  check_mapping();
  CHECK(upstream.covers(c, 10 * kMiB));
}

TEST_CASE_METHOD(ExpandableFixture, "free blocks of an expandable segment are not counted non-releasable, as in PyTorch") {
  make();
  const DevicePtr a = alloc(5 * kMiB);
  alloc(3 * kMiB);
  const DevicePtr c = alloc(1000);  // a small segment of its own, split too
  release(a);  // free, between the segment's start and a live block: split
  release(c);
  const MemoryStats& s = pool->stats();
  CHECK(s.inactive_split[kAll].current == 0);
  CHECK(s.inactive_split_bytes[kAll].current == 0);
  CHECK(s.inactive_split[kAll].allocated == 0);
  CHECK(s.inactive_split_bytes[kAll].peak == 0);
  // They are releasable: their whole pages go back.
  const std::int64_t before = reserved();
  CHECK(pool->release_cached() > 0);
  CHECK(reserved() < before);
  check_mapping();
}

TEST_CASE_METHOD(ExpandableFixture, "pages the driver refuses to unmap stay mapped, free and counted reserved") {
  make();
  const DevicePtr a = alloc(8 * kMiB);  // four whole pages, freed below
  const DevicePtr b = alloc(3 * kMiB);
  release(a);
  const std::int64_t before = reserved();
  SECTION("refused from the first page: nothing is given back, and nothing more is asked") {
    upstream.set_unmaps_allowed(0);
    release(b);  // a second candidate, never asked for
    CHECK(pool->release_cached() == 0);
    check_mapping();
    CHECK(reserved() == before);
    CHECK(pool->stats().num_page_unmaps == 1);
    CHECK(pool->stats().num_page_unmap_failures == 1);
    const auto maps = pool->stats().num_page_maps;
    CHECK(alloc(8 * kMiB) == a);  // the same memory serves again, mapped as it was
    CHECK(pool->stats().num_page_maps == maps);
    check_mapping();
  }
  SECTION("refused from the second page: the first becomes address space, the rest stays a free block") {
    upstream.set_unmaps_allowed(1);
    CHECK(pool->release_cached() == kPage);
    check_mapping();
    CHECK(reserved() == before - static_cast<std::int64_t>(kPage));
    CHECK(pool->stats().num_page_unmap_failures == 1);
    CHECK(alloc(6 * kMiB) == a + kPage);  // the three pages still mapped, with no new map
    check_mapping();
    CHECK(reserved() == before - static_cast<std::int64_t>(kPage));
  }
  SECTION("a driver that takes them again gives the rest back") {
    upstream.set_unmaps_allowed(1);
    pool->release_cached();
    upstream.set_unmaps_allowed(kUnlimited);
    CHECK(pool->release_cached() == 3 * kPage);
    check_mapping();
    CHECK(reserved() == before - static_cast<std::int64_t>(4 * kPage));
    CHECK(pool->stats().num_page_unmap_failures == 1);
  }
}

TEST_CASE_METHOD(ExpandableFixture, "releasing waits for the device before unmapping") {
  make();
  pool->stream_created(0x1000, StreamKind::Blocking);
  upstream.set_events_complete_at_once(false);
  const DevicePtr a = alloc(8 * kMiB, 0x1000);
  alloc(2 * kMiB);
  release(a, 0x1000);
  upstream.clear_calls();
  CHECK(pool->release_cached() == 8 * kMiB);
  bool synced = false;
  for (const auto& c : upstream.calls()) synced |= c.kind == VirtualUpstream::Call::SyncEvent;
  CHECK(synced);
  check_mapping();
}

TEST_CASE_METHOD(ExpandableFixture, "recycling unmaps only frees already known complete, without waiting") {
  options.recycle_idle_allocations = 0;  // a just freed is a candidate
  make();
  pool->stream_created(0x1000, StreamKind::Blocking);
  upstream.set_events_complete_at_once(false);
  const DevicePtr a = alloc(8 * kMiB, 0x1000);
  alloc(2 * kMiB, 0x1000);  // keeps a away from the unmapped tail
  release(a, 0x1000);
  upstream.clear_calls();
  alloc(20 * kMiB, 0x1000);  // past the peak: recycling is tried, but a's last use may be pending
  for (const auto& c : upstream.calls()) CHECK(c.kind != VirtualUpstream::Call::SyncEvent);
  CHECK(upstream.covers(a, 8 * kMiB));  // still mapped
  check_mapping();
  upstream.complete_all();
  alloc(30 * kMiB, 0x1000);  // now a's pages are known idle and go back first
  for (const auto& c : upstream.calls()) CHECK(c.kind != VirtualUpstream::Call::SyncEvent);
  CHECK_FALSE(upstream.covers(a, kPage));
  check_mapping();
  CHECK(reserved() == static_cast<std::int64_t>(52 * kMiB));
}

namespace {
// A free 8 MiB block away from the tail, then a request it cannot serve.
std::int64_t reserved_after_growth(PoolFixture& f) {
  const DevicePtr a = f.alloc(8 * kMiB);
  f.alloc(2 * kMiB);
  f.release(a);
  f.alloc(20 * kMiB);
  return f.pool->stats().reserved_bytes[kAll].peak;
}
}  // namespace

TEST_CASE_METHOD(ExpandableFixture, "recycling gives idle pages back before growing past the peak") {
  options.recycle_idle_allocations = 0;
  make();
  CHECK(reserved_after_growth(*this) == static_cast<std::int64_t>(22 * kMiB));
  check_mapping();
}

TEST_CASE_METHOD(ExpandableFixture, "without recycling the idle pages stay mapped") {
  options.recycle_pages = false;
  make();
  CHECK(reserved_after_growth(*this) == static_cast<std::int64_t>(30 * kMiB));
  check_mapping();
}

TEST_CASE_METHOD(ExpandableFixture, "a failed mapping releases free pages and retries") {
  options.recycle_pages = false;
  make(40 * kMiB);
  const DevicePtr a = alloc(30 * kMiB);
  alloc(2 * kMiB);
  release(a);
  const DevicePtr b = alloc(31 * kMiB);  // 32 mapped + 32 > 40: unmap a's pages, then map
  check_mapping();
  CHECK(upstream.covers(b, 31 * kMiB));
  CHECK(pool->stats().num_alloc_retries == 1);
  CHECK(pool->stats().num_ooms == 0);
}

TEST_CASE_METHOD(ExpandableFixture, "the memory limit counts mapped pages") {
  options.memory_limit = 16 * kMiB;
  make();
  alloc(12 * kMiB);
  CHECK_FALSE(pool->allocate(6 * kMiB, kAnyStream).ok);
  REQUIRE(pool->ooms().size() == 1);
  CHECK(pool->ooms()[0].limit_reached);
  check_mapping();
}

TEST_CASE_METHOD(ExpandableFixture, "without virtual memory upstream, fixed segments are used") {
  upstream.set_virtual_memory(false);
  options.max_split_size = 32 * kMiB;
  make();
  alloc(3 * kMiB);
  CHECK(upstream.allocations() == 1);
  CHECK(reserved() == static_cast<std::int64_t>(20 * kMiB));
  check();
  // The options say what the pool runs with: fixed segments, whose split limit holds.
  CHECK_FALSE(pool->options().expandable_segments);
  CHECK(pool->options().max_split_size == 32 * kMiB);
  const DevicePtr big = alloc(40 * kMiB);
  release(big);
  CHECK(alloc(4 * kMiB) != big);
}

TEST_CASE_METHOD(ExpandableFixture, "a split limit does not hold in expandable segments") {
  options.max_split_size = 32 * kMiB;
  make();
  CHECK(pool->options().max_split_size == kUnlimited);
  const DevicePtr big = alloc(40 * kMiB);
  release(big);
  // The free 40 MiB serves a small request from its start, with no new pages.
  const std::int64_t before = reserved();
  CHECK(alloc(4 * kMiB) == big);
  CHECK(reserved() == before);
  CHECK(alloc(30 * kMiB) == big + 4 * kMiB);
  CHECK(reserved() == before);
  CHECK(pool->stats().oversize_allocations.peak == 0);
  check_mapping();
}

TEST_CASE_METHOD(ExpandableFixture, "a stream-ordered request splits off a remainder under 1 MiB, a plain one not") {
  constexpr StreamId kStream = 0x1000;
  make();
  pool->stream_created(kStream, StreamKind::Blocking);
  const DevicePtr a = alloc(8 * kMiB, kStream);
  const DevicePtr guard = alloc(2 * kMiB, kStream);
  release(a, kStream);
  const std::int64_t allocated = current(pool->stats().allocated_bytes);
  const DevicePtr b = alloc(8 * kMiB - 512, kStream);
  CHECK(b == a);
  CHECK(current(pool->stats().allocated_bytes) - allocated == static_cast<std::int64_t>(8 * kMiB - 512));
  release(b, kStream);  // joins the 512 B remainder: one free block of 8 MiB again
  CHECK(alloc(8 * kMiB, kStream) == a);
  release(a, kStream);
  // A plain request keeps the remainder with the block (DevicePool::carve says why).
  const DevicePtr c = alloc(8 * kMiB - 512);
  CHECK(c == a);
  CHECK(current(pool->stats().allocated_bytes) - allocated == static_cast<std::int64_t>(8 * kMiB));
  release(c);
  release(guard, kStream);
  check_mapping();
}

TEST_CASE_METHOD(ExpandableFixture, "growth never extends another stream's block when streams are kept apart") {
  options.cross_stream_reuse = CrossStreamReuse::Never;
  options.recycle_pages = false;
  make();
  pool->stream_created(0x1000, StreamKind::Blocking);
  pool->stream_created(0x2000, StreamKind::Blocking);
  alloc(2 * kMiB, 0x1000);
  const DevicePtr a = alloc(4 * kMiB, 0x1000);
  release(a, 0x1000);  // free, right before the unmapped tail
  // Its stream idle, a's work is known done: under "auto" a would grow.
  upstream.set_streams_idle(true);
  const DevicePtr b = alloc(8 * kMiB, 0x2000);
  CHECK(b != a);
  CHECK(b >= a + 4 * kMiB);
  check_mapping();
}

TEST_CASE_METHOD(ExpandableFixture, "blocks of streams kept apart still give their pages back once all is done") {
  // Found by tests/fuzz (fuzz-pool): two free blocks of one page, freed on
  // different streams, never merged under "never", so release_cached left the
  // page mapped for good.
  options.cross_stream_reuse = CrossStreamReuse::Never;
  make();
  pool->stream_created(0x1000, StreamKind::Blocking);
  release(alloc(16 * 1024, 0x1000), 0x1000);
  const DevicePtr b = alloc(512, 0x1000);  // from the block just freed
  release(b);                              // a plain free: another history
  upstream.complete_all();
  pool->release_cached();
  check_mapping();
  CHECK(reserved() == 0);
}

TEST_CASE_METHOD(ExpandableFixture, "a free next to a block whose work is known done keeps only its own history") {
  make();
  constexpr StreamId kS1 = 0x1000, kS2 = 0x2000, kS3 = 0x3000;
  for (StreamId s : {kS1, kS2, kS3}) pool->stream_created(s, StreamKind::Blocking);
  upstream.set_events_complete_at_once(false);
  const DevicePtr a = alloc(8 * kMiB, kS2);
  const DevicePtr b = alloc(4 * kMiB, kS1);
  REQUIRE(b == a + 8 * kMiB);
  release(a, kS2);
  alloc(2 * kMiB, kS3);  // a's work may be pending: new pages (and a fence on s2)
  upstream.complete_all();
  REQUIRE(alloc(2 * kMiB, kS3) == a);  // now known done: a's first 2 MiB are taken
  // The rest of a, known done, joins b's free: the merged block is s1's alone,
  // so s1 reuses it at once; were it keyed to no stream, s1 would need a's and
  // b's work both seen complete, and would grow instead.
  release(b, kS1);
  const auto maps = pool->stats().num_page_maps;
  upstream.clear_calls();
  CHECK(alloc(10 * kMiB, kS1) == a + 2 * kMiB);
  CHECK(pool->stats().num_page_maps == maps);
  CHECK(upstream.calls().empty());
  check_mapping();
}

TEST_CASE_METHOD(ExpandableFixture, "recycling unmaps only the pages growth needs, from a free block's top") {
  options.recycle_idle_allocations = 0;
  make();
  const DevicePtr a = alloc(16 * kMiB);
  release(a);
  const std::int64_t peak = pool->stats().reserved_bytes[kAll].peak;
  alloc(1000);  // the small pool's first page: 2 MiB of a's pages go back, not all 16
  CHECK(pool->stats().reserved_bytes[kAll].peak == peak);
  CHECK(upstream.covers(a, 14 * kMiB));  // a's lower part stays mapped
  CHECK_FALSE(upstream.covers(a + 14 * kMiB, kPage));
  CHECK(alloc(14 * kMiB) == a);  // and serves the next request that fits, with no mapping
  check_mapping();
}

TEST_CASE_METHOD(ExpandableFixture, "recycling leaves the blocks of the working set alone") {
  make();
  const std::uint64_t idle = options.recycle_idle_allocations;
  REQUIRE(idle > 0);
  const DevicePtr a = alloc(8 * kMiB);
  alloc(2 * kMiB);  // keeps a away from the unmapped tail
  release(a);
  alloc(20 * kMiB);  // past the peak, but a was used one allocation ago
  CHECK(upstream.covers(a, 8 * kMiB));
  check_mapping();
  for (std::uint64_t i = 0; i < idle; ++i) release(alloc(4096));  // the small pool's; a idles
  const std::int64_t peak = pool->stats().reserved_bytes[kAll].peak;
  alloc(8 * kMiB + kPage);  // past the peak again: a's pages are idle now and go back
  CHECK_FALSE(upstream.covers(a, kPage));
  CHECK(pool->stats().reserved_bytes[kAll].peak == peak + static_cast<std::int64_t>(kPage));  // 1 new page, not 5
  check_mapping();
}

namespace {
// A single-stream loop whose working set (one block at a time, the largest
// 64 MiB, plus the small pool's page) needs one page more than the pool's
// peak after the first pass; returns the pages mapped over `passes` passes.
std::int64_t maps_cycling_sizes(PoolFixture& f, int passes) {
  const std::size_t sizes[] = {64 * kMiB, 1000, 30 * kMiB, 4096, 6 * kMiB, 512, 12 * kMiB};
  for (int pass = 0; pass < passes; ++pass) {
    for (std::size_t size : sizes) f.release(f.alloc(size));
  }
  return f.pool->stats().num_page_maps;
}
}  // namespace

TEST_CASE_METHOD(ExpandableFixture, "a working set just above the peak is not remapped over and over") {
  make();
  const std::int64_t warm = maps_cycling_sizes(*this, 2);
  CHECK(maps_cycling_sizes(*this, 200) == warm);  // the pages stay mapped
  CHECK(pool->stats().reserved_bytes[kAll].peak <= static_cast<std::int64_t>(66 * kMiB));
  check_mapping();
}

TEST_CASE_METHOD(ExpandableFixture, "recycling every idle page keeps the lowest peak at the cost of remapping") {
  options.recycle_idle_allocations = 0;
  make();
  const std::int64_t warm = maps_cycling_sizes(*this, 2);
  CHECK(maps_cycling_sizes(*this, 200) > warm + 100);  // the small pool's page and 64 MiB take turns
  CHECK(pool->stats().reserved_bytes[kAll].peak == static_cast<std::int64_t>(64 * kMiB));
  check_mapping();
}

namespace {
bool advises_keeping_pages(const DevicePool& pool) {
  const std::vector<std::string> lines = report::advice(report::collect(pool, 0));
  return std::any_of(lines.begin(), lines.end(), [](const std::string& line) {
    return line.find("GPUPOOL_RECYCLE_IDLE_ALLOCATIONS") != std::string::npos;
  });
}
}  // namespace

TEST_CASE_METHOD(ExpandableFixture, "the report tells when recycling remaps pages over and over") {
  options.recycle_idle_allocations = GENERATE(0u, 16u);
  make();
  maps_cycling_sizes(*this, 200);
  CHECK(advises_keeping_pages(*pool) == (options.recycle_idle_allocations == 0));
}

TEST_CASE_METHOD(ExpandableFixture, "with no event to be made, a full pool waits for the device rather than fail") {
  // The device is full; the only memory left is another stream's block whose
  // work is still queued. Ordering it needs an event (a fence, or the barrier
  // before its pages go back); with none to be had, the pool waits for the
  // whole device on the host and serves the request.
  make(4 * kMiB);
  pool->stream_created(0x1000, StreamKind::NonBlocking);
  pool->stream_created(0x2000, StreamKind::NonBlocking);
  upstream.set_events_complete_at_once(false);
  const DevicePtr p = alloc(4 * kMiB, 0x1000);
  release(p, 0x1000);
  upstream.set_event_creation_fails(true);
  const Allocation a = pool->allocate(3 * kMiB, 0x2000);
  REQUIRE(a.ok);
  check_mapping();
  CHECK(upstream.device_syncs() == 1);
  CHECK(pool->stats().num_ooms == 0);
}

TEST_CASE_METHOD(ExpandableFixture, "the address of held memory is a mapped page and never bare address space") {
  // A reset answered with an error is judged by whether that address is still memory.
  make();
  CHECK(pool->held_address() == 0);
  const DevicePtr a = alloc(2 * kPage);
  const DevicePtr b = alloc(2 * kPage);
  release(a);
  CHECK(pool->release_cached() > 0);  // a's pages go: the segment starts with address space
  const DevicePtr held = pool->held_address();
  CHECK(held != 0);
  CHECK(upstream.covers(held, 1));
  release(b);
  CHECK(pool->release_cached() > 0);
  CHECK(pool->held_address() == 0);  // address space only
}
