/* The per-thread-default-stream twins of entry points gpupool serves, which
   the CUDA headers do not declare (they are what a program built with
   --default-stream per-thread calls). */
#ifndef GPUPOOL_SHIM_PTSZ_H
#define GPUPOOL_SHIM_PTSZ_H

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

cudaError_t cudaMallocAsync_ptsz(void**, size_t, cudaStream_t);
cudaError_t cudaMallocFromPoolAsync_ptsz(void**, size_t, cudaMemPool_t, cudaStream_t);
cudaError_t cudaFreeAsync_ptsz(void*, cudaStream_t);
cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t, enum cudaStreamCaptureMode);
cudaError_t cudaStreamBeginCaptureToGraph_ptsz(cudaStream_t, cudaGraph_t, const cudaGraphNode_t*,
                                               const struct cudaGraphEdgeData_st*, size_t,
                                               enum cudaStreamCaptureMode);
cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t, cudaGraph_t*);
cudaError_t cudaGetDriverEntryPoint_ptsz(const char*, void**, unsigned long long,
                                         enum cudaDriverEntryPointQueryResult*);
cudaError_t cudaGetDriverEntryPointByVersion_ptsz(const char*, void**, unsigned int, unsigned long long,
                                                  enum cudaDriverEntryPointQueryResult*);

#ifdef __cplusplus
}
#endif

#endif
