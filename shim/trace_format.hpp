// The number formatting of GPUPOOL_TRACE's lines (trace_writer.cpp), by
// hand: snprintf's parsing cost most of a traced call. Each writes at `out`
// and returns the end of what it wrote. Two digits at a time from tables,
// and the length of a number found from its highest bit, not by dividing.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>

namespace gpupool::shim::trace_format {

inline constexpr char kDigitPairs[] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

// "00" to "ff" for each byte.
inline constexpr std::array<char, 512> kHexPairs = [] {
  constexpr char kDigits[] = "0123456789abcdef";
  std::array<char, 512> pairs{};
  for (int b = 0; b < 256; ++b) {
    pairs[2 * b] = kDigits[b >> 4];
    pairs[2 * b + 1] = kDigits[b & 15];
  }
  return pairs;
}();

// Writes v's last `width` decimal digits (width even), ending at `end`.
inline void put_fixed(char* end, unsigned long v, int width) {
  for (; width > 0; width -= 2, v /= 100) {
    end -= 2;
    std::memcpy(end, &kDigitPairs[v % 100 * 2], 2);
  }
}

// The number of decimal digits of v (1 for 0).
inline int decimal_digits(unsigned long long v) {
  static constexpr unsigned long long kPowers[20] = {
      1ull,           10ull,           100ull,           1000ull,           10000ull,
      100000ull,      1000000ull,      10000000ull,      100000000ull,      1000000000ull,
      10000000000ull, 100000000000ull, 1000000000000ull, 10000000000000ull, 100000000000000ull,
      1000000000000000ull, 10000000000000000ull, 100000000000000000ull, 1000000000000000000ull,
      10000000000000000000ull};
  // log10(2) is about 1233/4096: from the highest bit, a guess that is one
  // too many at most (v | 1: 0 has one digit, as 1 has).
  const int guess = (64 - __builtin_clzll(v | 1)) * 1233 >> 12;
  return guess + 1 - ((v | 1) < kPowers[guess] ? 1 : 0);
}

inline char* put_decimal(char* out, unsigned long long v) {
  char* const end = out + decimal_digits(v);
  char* p = end;
  for (; v >= 100; v /= 100) {
    p -= 2;
    std::memcpy(p, &kDigitPairs[v % 100 * 2], 2);
  }
  if (v >= 10) {
    std::memcpy(p - 2, &kDigitPairs[v * 2], 2);
  } else {
    p[-1] = static_cast<char>('0' + v);
  }
  return end;
}

// "0x" and v in lower-case hexadecimal, without leading zeros ("0x0" for 0).
inline char* put_hex(char* out, unsigned long long v) {
  const int digits = v == 0 ? 1 : (64 - __builtin_clzll(v) + 3) / 4;
  *out++ = '0';
  *out++ = 'x';
  char* const end = out + digits;
  char* p = end;
  for (; p - out >= 2; v >>= 8) {
    p -= 2;
    std::memcpy(p, &kHexPairs[(v & 0xff) * 2], 2);
  }
  if (p != out) *out = kHexPairs[(v & 0xf) * 2 + 1];
  return end;
}

inline char* put_text(char* out, const char* text, std::size_t n) {
  std::memcpy(out, text, n);
  return out + n;
}

}  // namespace gpupool::shim::trace_format
