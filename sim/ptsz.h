/* The per-thread-default-stream twins the simulated runtime defines, which the
   CUDA headers do not declare. */
#ifndef SIMCUDA_PTSZ_H
#define SIMCUDA_PTSZ_H

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

cudaError_t cudaMallocAsync_ptsz(void**, size_t, cudaStream_t);
cudaError_t cudaFreeAsync_ptsz(void*, cudaStream_t);
cudaError_t cudaMallocFromPoolAsync_ptsz(void**, size_t, cudaMemPool_t, cudaStream_t);
cudaError_t cudaMemcpy_ptds(void*, const void*, size_t, enum cudaMemcpyKind);
cudaError_t cudaMemset_ptds(void*, int, size_t);
cudaError_t cudaMemcpyAsync_ptsz(void*, const void*, size_t, enum cudaMemcpyKind, cudaStream_t);
cudaError_t cudaMemsetAsync_ptsz(void*, int, size_t, cudaStream_t);
cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t);
cudaError_t cudaStreamQuery_ptsz(cudaStream_t);
cudaError_t cudaStreamWaitEvent_ptsz(cudaStream_t, cudaEvent_t, unsigned int);
cudaError_t cudaEventRecord_ptsz(cudaEvent_t, cudaStream_t);
cudaError_t cudaLaunchHostFunc_ptsz(cudaStream_t, cudaHostFn_t, void*);
cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t, enum cudaStreamCaptureMode);
cudaError_t cudaStreamBeginCaptureToGraph_ptsz(cudaStream_t, cudaGraph_t, const cudaGraphNode_t*,
                                               const cudaGraphEdgeData*, size_t, enum cudaStreamCaptureMode);
cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t, cudaGraph_t*);
cudaError_t cudaStreamIsCapturing_ptsz(cudaStream_t, enum cudaStreamCaptureStatus*);
cudaError_t cudaStreamGetFlags_ptsz(cudaStream_t, unsigned int*);
cudaError_t cudaStreamGetDevice_ptsz(cudaStream_t, int*);
cudaError_t cudaLaunchKernel_ptsz(const void*, dim3, dim3, void**, size_t, cudaStream_t);
cudaError_t cudaGetDriverEntryPoint_ptsz(const char*, void**, unsigned long long, enum cudaDriverEntryPointQueryResult*);
cudaError_t cudaGetDriverEntryPointByVersion_ptsz(const char*, void**, unsigned int, unsigned long long,
                                                  enum cudaDriverEntryPointQueryResult*);

#ifdef __cplusplus
}
#endif

#endif
