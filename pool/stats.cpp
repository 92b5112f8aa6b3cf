#include "pool/stats.hpp"

#include <bit>

namespace gpupool {

int histogram_bucket(std::size_t size) {
  return size == 0 ? 0 : static_cast<int>(std::bit_width(size)) - 1;
}

void SizeHistogram::add(std::size_t size) {
  const int b = histogram_bucket(size);
  ++count[b];
  bytes[b] += size;
}

void end_current_figures(MemoryStats& s) {
  auto end = [](Stat& st) {
    st.freed += st.current;
    st.current = 0;
  };
  for_each_stat(
      s,
      [&](const char*, StatArray& a) {
        for (Stat& st : a) end(st);
      },
      [&](const char*, Stat& st) { end(st); });
  end(s.stream_ordered_bytes);
}

bool SizeHistogram::empty() const {
  for (std::uint64_t c : count) {
    if (c != 0) return false;
  }
  return true;
}

}  // namespace gpupool
