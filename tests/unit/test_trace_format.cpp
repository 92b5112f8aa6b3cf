// GPUPOOL_TRACE's number formatting (shim/trace_format.hpp) against snprintf,
// at every length's edges and on random values: a wrong digit would make a
// trace replay pointers and sizes the program never had.
#include <catch2/catch.hpp>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "shim/trace_format.hpp"

namespace gpupool::shim::trace_format {
namespace {

// Every power of two and of ten, one below and one above each, and random
// values of every bit length.
std::vector<unsigned long long> edge_and_random_values() {
  std::vector<unsigned long long> values{0, 1, ~0ull, ~0ull - 1};
  for (int bit = 0; bit < 64; ++bit) {
    const unsigned long long p = 1ull << bit;
    values.insert(values.end(), {p - 1, p, p + 1});
  }
  for (unsigned long long p = 1; p <= 10000000000000000000ull; p *= 10) {
    values.insert(values.end(), {p - 1, p, p + 1});
    if (p > ~0ull / 10) break;
  }
  std::mt19937_64 rng(7);
  for (int i = 0; i < 20000; ++i) values.push_back(rng() >> (rng() % 64));
  return values;
}

TEST_CASE("trace numbers are written as snprintf writes them", "[trace]") {
  char buffer[64];
  char expected[64];
  for (const unsigned long long v : edge_and_random_values()) {
    std::snprintf(expected, sizeof expected, "%llu", v);
    REQUIRE(std::string(buffer, put_decimal(buffer, v)) == expected);
    REQUIRE(decimal_digits(v) == static_cast<int>(std::string(expected).size()));
    std::snprintf(expected, sizeof expected, "0x%llx", v);
    REQUIRE(std::string(buffer, put_hex(buffer, v)) == expected);
  }
}

TEST_CASE("a trace's fixed-width fields keep their leading zeros", "[trace]") {
  char buffer[8] = {};
  for (const unsigned long v : {0ul, 7ul, 59ul, 999999ul, 123456ul, 1000000ul + 42}) {
    put_fixed(buffer + 6, v, 6);
    char expected[8];
    std::snprintf(expected, sizeof expected, "%06lu", v % 1000000);
    REQUIRE(std::string(buffer, 6) == expected);
  }
}

}  // namespace
}  // namespace gpupool::shim::trace_format
