// 2D and 3D arrays as image and volume code allocates them (cudaMallocPitch,
// cudaMalloc3D), freed with cudaFree: every pitch is one a texture can be
// bound to, every block holds all its rows without touching another's, and a
// block freed and allocated again comes back whole. Prints one JSON line.
//
//   pitched [ROUNDS]   ROUNDS rounds (default 3) of allocating every shape, freeing half
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <utility>

#include "common.hpp"

namespace {

struct Array {
  void* ptr = nullptr;
  size_t pitch = 0;
  size_t width = 0;  // bytes in a row
  size_t rows = 0;   // height x depth
  unsigned char tag = 0;
  size_t bytes() const { return pitch * rows; }
};

int g_texture_alignment = 0;  // of the base
int g_pitch_alignment = 0;    // of the pitch
int g_allocations = 0;

void check_shape(const Array& a) {
  EXPECT(a.ptr != nullptr);
  EXPECT(a.pitch >= a.width);
  EXPECT(a.pitch % static_cast<size_t>(g_pitch_alignment) == 0);
  EXPECT(reinterpret_cast<uintptr_t>(a.ptr) % static_cast<uintptr_t>(g_texture_alignment) == 0);
}

// Every row written whole, pitch and padding included: the memory is the
// program's to use.
Array fill(Array a, unsigned char tag) {
  a.tag = tag;
  CHECK_CUDA(cudaMemset(a.ptr, tag, a.bytes()));
  return a;
}

Array make_2d(size_t width, size_t height, unsigned char tag) {
  Array a;
  a.width = width;
  a.rows = height;
  CHECK_CUDA(cudaMallocPitch(&a.ptr, &a.pitch, width, height));
  ++g_allocations;
  check_shape(a);
  return fill(a, tag);
}

Array make_3d(size_t width, size_t height, size_t depth, unsigned char tag) {
  cudaPitchedPtr p{};
  CHECK_CUDA(cudaMalloc3D(&p, cudaExtent{width, height, depth}));
  ++g_allocations;
  EXPECT(p.xsize == width && p.ysize == height);
  Array a;
  a.ptr = p.ptr;
  a.pitch = p.pitch;
  a.width = width;
  a.rows = height * depth;
  check_shape(a);
  return fill(a, tag);
}

// No two arrays share a byte, and each holds its own tag.
void check_all(std::vector<Array> arrays) {
  std::sort(arrays.begin(), arrays.end(), [](const Array& x, const Array& y) { return x.ptr < y.ptr; });
  for (size_t i = 0; i < arrays.size(); ++i) {
    const Array& a = arrays[i];
    if (i + 1 < arrays.size()) {
      EXPECT(static_cast<const char*>(a.ptr) + a.bytes() <= arrays[i + 1].ptr);
    }
    EXPECT(testprog::holds_sampled(a.ptr, a.bytes(), a.tag));
  }
}

// Image rows (RGB8 and float4 at common resolutions) and small volumes.
std::vector<Array> make_all(unsigned char first_tag) {
  const std::pair<size_t, size_t> images[] = {{1, 1},           {100, 3},         {511, 17},        {512, 480},
                                               {513, 480},       {640 * 3, 480},   {1920 * 3, 1080}, {1920 * 16, 64},
                                               {4000, 7},        {65536 + 7, 2}};
  std::vector<Array> arrays;
  unsigned char tag = first_tag;
  for (const auto& [width, height] : images) arrays.push_back(make_2d(width, height, tag++));
  arrays.push_back(make_3d(64 * 4, 64, 64, tag++));
  arrays.push_back(make_3d(100, 30, 20, tag++));
  arrays.push_back(make_3d(1, 1, 1, tag++));
  return arrays;
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 3;
  CHECK_CUDA(cudaDeviceGetAttribute(&g_texture_alignment, cudaDevAttrTextureAlignment, 0));
  CHECK_CUDA(cudaDeviceGetAttribute(&g_pitch_alignment, cudaDevAttrTexturePitchAlignment, 0));
  EXPECT(g_texture_alignment > 0 && g_pitch_alignment > 0);

  std::vector<Array> live;
  for (int round = 0; round < rounds; ++round) {
    std::vector<Array> made = make_all(static_cast<unsigned char>(1 + round * 20));
    live.insert(live.end(), made.begin(), made.end());
    check_all(live);
    // Half go: the next round's arrays may take their place.
    std::vector<Array> kept;
    for (size_t i = 0; i < live.size(); ++i) {
      if (i % 2 == 0) {
        CHECK_CUDA(cudaFree(live[i].ptr));
      } else {
        kept.push_back(live[i]);
      }
    }
    live = kept;
    check_all(live);
  }
  for (const Array& a : live) CHECK_CUDA(cudaFree(a.ptr));

  // Arguments the runtime refuses are refused as it refuses them.
  void* p = nullptr;
  EXPECT(cudaMallocPitch(&p, nullptr, 64, 64) == cudaErrorInvalidValue);
  EXPECT(cudaGetLastError() == cudaErrorInvalidValue);
  size_t pitch = 0;
  EXPECT(cudaMallocPitch(&p, &pitch, size_t{1} << 40, 1 << 10) == cudaErrorMemoryAllocation);
  EXPECT(cudaGetLastError() == cudaErrorMemoryAllocation);
  const cudaError_t overflow = cudaMallocPitch(&p, &pitch, SIZE_MAX - 10, 2);
  EXPECT(overflow != cudaSuccess);
  EXPECT(cudaGetLastError() == overflow);
  // Rows times slices past 2^64: gpupool leaves the runtime to answer. The
  // simulated one refuses; CUDA 13 wraps them to 4 rows and grants those.
  cudaPitchedPtr volume{};
  const cudaError_t too_deep = cudaMalloc3D(&volume, cudaExtent{64, (size_t{1} << 62) + 1, 4});
  EXPECT(cudaGetLastError() == too_deep);
  if (too_deep == cudaSuccess) CHECK_CUDA(cudaFree(volume.ptr));
  // The pitch of a 1-byte row, to compare with the runtime's own.
  void* one = nullptr;
  size_t one_pitch = 0;
  CHECK_CUDA(cudaMallocPitch(&one, &one_pitch, 1, 1));
  CHECK_CUDA(cudaFree(one));
  std::printf("{\"allocations\": %d, \"pitch_of_a_1_byte_row\": %zu, \"too_deep_granted\": %d}\n",
              g_allocations + 1, one_pitch, too_deep == cudaSuccess ? 1 : 0);
  return 0;
}
