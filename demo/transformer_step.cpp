// gpupool-demo: the allocation pattern of a transformer training loop, written
// against the plain CUDA runtime API as a program that knows nothing of
// gpupool would be (PyTorch with PYTORCH_NO_CUDA_MEMORY_CACHING=1 behaves so).
//
// Weights and optimizer state are allocated once. Each step draws a batch of a
// different sequence length; the forward pass allocates each layer's
// activations and frees its temporaries (attention scores, MLP intermediate);
// the backward pass frees activations in reverse and allocates gradients. The
// next batch is staged on a separate non-blocking stream with
// cudaMallocAsync and freed on the compute stream. Every buffer is written
// with a pattern and read back before it is freed, so a pool that hands out
// overlapping or still-busy memory fails the run.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

namespace {

struct Options {
  int layers = 8;
  int hidden = 512;
  int heads = 8;
  int batch = 4;
  int max_seq = 256;
  int steps = 20;
};

int failures = 0;

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "gpupool-demo: %s failed: %s\n", what, cudaGetErrorString(err));
    std::exit(1);
  }
}

long long program_mallocs = 0;
long long program_frees = 0;

// A device buffer tagged with a byte pattern.
struct Buffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  unsigned char tag = 0;
};

Buffer make(size_t bytes, unsigned char tag, cudaStream_t stream = nullptr) {
  Buffer b;
  b.bytes = bytes;
  b.tag = tag;
  check(cudaMalloc(&b.ptr, bytes), "cudaMalloc");
  ++program_mallocs;
  check(cudaMemsetAsync(b.ptr, tag, bytes, stream), "cudaMemsetAsync");
  return b;
}

// Reads back the first and last bytes; they must still carry the tag.
void verify(const Buffer& b, const char* what) {
  unsigned char head[64];
  unsigned char tail[64];
  const size_t n = b.bytes < sizeof head ? b.bytes : sizeof head;
  check(cudaMemcpy(head, b.ptr, n, cudaMemcpyDeviceToHost), "cudaMemcpy");
  check(cudaMemcpy(tail, static_cast<char*>(b.ptr) + b.bytes - n, n, cudaMemcpyDeviceToHost), "cudaMemcpy");
  for (size_t i = 0; i < n; ++i) {
    if (head[i] != b.tag || tail[i] != b.tag) {
      std::fprintf(stderr, "gpupool-demo: %s buffer corrupted (expected %u, found %u/%u)\n", what, b.tag,
                   head[i], tail[i]);
      ++failures;
      return;
    }
  }
}

void release(Buffer& b, const char* what) {
  verify(b, what);
  check(cudaFree(b.ptr), "cudaFree");
  ++program_frees;
  b.ptr = nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--steps") == 0) o.steps = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--layers") == 0) o.layers = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--hidden") == 0) o.hidden = std::atoi(argv[i + 1]);
  }
  const size_t elem = 2;  // bf16
  const size_t h = static_cast<size_t>(o.hidden);

  cudaStream_t loader;
  check(cudaStreamCreateWithFlags(&loader, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  cudaEvent_t staged;
  check(cudaEventCreateWithFlags(&staged, cudaEventDisableTiming), "cudaEventCreateWithFlags");

  std::vector<Buffer> weights, moments;
  for (int l = 0; l < o.layers; ++l) {
    weights.push_back(make(12 * h * h * elem, static_cast<unsigned char>(l + 1)));
    moments.push_back(make(2 * 12 * h * h * 4, static_cast<unsigned char>(l + 101)));
  }

  std::mt19937 rng(7);
  const auto start = std::chrono::steady_clock::now();
  for (int step = 0; step < o.steps; ++step) {
    const size_t seq = 64 + rng() % static_cast<unsigned>(o.max_seq - 63);
    const size_t tokens = static_cast<size_t>(o.batch) * seq;
    const auto tag = static_cast<unsigned char>(200 + step % 50);

    // Stage the batch on the loader stream; the compute stream waits for it.
    void* input = nullptr;
    check(cudaMallocAsync(&input, tokens * 4, loader), "cudaMallocAsync");
    ++program_mallocs;
    check(cudaMemsetAsync(input, tag, tokens * 4, loader), "cudaMemsetAsync");
    check(cudaEventRecord(staged, loader), "cudaEventRecord");
    check(cudaStreamWaitEvent(nullptr, staged, 0), "cudaStreamWaitEvent");

    std::vector<Buffer> activations;
    for (int l = 0; l < o.layers; ++l) {
      const auto t = static_cast<unsigned char>(tag + l);
      activations.push_back(make(tokens * h * elem, t));                        // layer output
      Buffer qkv = make(3 * tokens * h * elem, t);                              // projections
      Buffer scores = make(static_cast<size_t>(o.batch * o.heads) * seq * seq * elem, t);
      release(scores, "attention scores");
      Buffer mlp = make(4 * tokens * h * elem, t);                              // MLP intermediate
      release(mlp, "MLP intermediate");
      release(qkv, "projections");
    }
    Buffer loss = make(tokens * 4, tag);
    release(loss, "loss");
    for (int l = o.layers - 1; l >= 0; --l) {
      Buffer grad = make(12 * h * h * elem, static_cast<unsigned char>(l + 151));
      Buffer grad_input = make(tokens * h * elem, static_cast<unsigned char>(l + 171));
      release(activations[static_cast<size_t>(l)], "activation");
      release(grad_input, "input gradient");
      release(grad, "weight gradient");
    }
    check(cudaFreeAsync(input, nullptr), "cudaFreeAsync");
    ++program_frees;
  }
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  for (int l = 0; l < o.layers; ++l) {
    release(weights[static_cast<size_t>(l)], "weights");
    release(moments[static_cast<size_t>(l)], "optimizer state");
  }
  check(cudaStreamDestroy(loader), "cudaStreamDestroy");
  check(cudaEventDestroy(staged), "cudaEventDestroy");

  std::printf("gpupool-demo: %d steps of a %d-layer model in %.3f s (%.2f ms/step); the program made %lld "
              "cudaMalloc/cudaMallocAsync calls and %lld frees; %s\n",
              o.steps, o.layers, seconds, 1000.0 * seconds / o.steps, program_mallocs, program_frees,
              failures == 0 ? "every buffer read back intact" : "CORRUPTED BUFFERS FOUND");
  return failures == 0 ? 0 : 1;
}
