// A CUDA program that knows nothing of gpupool: kernels and allocations in a
// loop, results checked on the host. Built with nvcc -cudart shared.
#include <cstdio>
#include <vector>

__global__ void axpy(float* y, const float* x, float a, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += a * x[i];
}

int main() {
  const int n = 1 << 20;
  std::vector<float> host(n);
  for (int step = 0; step < 200; ++step) {
    float *x = nullptr, *y = nullptr, *scratch = nullptr;
    if (cudaMalloc(&x, n * sizeof(float)) || cudaMalloc(&y, n * sizeof(float)) ||
        cudaMalloc(&scratch, (step % 7 + 1) << 20)) {
      return 1;
    }
    for (int i = 0; i < n; ++i) host[i] = 1.0f;
    cudaMemcpy(x, host.data(), n * sizeof(float), cudaMemcpyHostToDevice);
    cudaMemset(y, 0, n * sizeof(float));
    axpy<<<(n + 255) / 256, 256>>>(y, x, static_cast<float>(step), n);
    cudaMemcpy(host.data(), y, n * sizeof(float), cudaMemcpyDeviceToHost);
    for (int i = 0; i < n; i += 4097) {
      if (host[i] != static_cast<float>(step)) {
        std::printf("user_program: wrong result at step %d\n", step);
        return 1;
      }
    }
    cudaFree(scratch);
    cudaFree(y);
    cudaFree(x);
  }
  std::printf("user_program: 200 steps, results correct\n");
  return cudaDeviceSynchronize() == cudaSuccess ? 0 : 1;
}
