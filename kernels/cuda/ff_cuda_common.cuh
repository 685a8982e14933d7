/* ff_cuda_common.cuh — what the CUDA backend's files share: the one stream every kernel and copy
 * of this rank runs on, the error checks every CUDA, cuBLAS and launch call goes through, and
 * (ff_cuda_device.cuh) the device helpers kernels share. Internal to kernels/cuda. */
#ifndef FF_CUDA_COMMON_CUH
#define FF_CUDA_COMMON_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdint.h>

#include "ff_cuda_device.cuh"

/* The stream of this process's CUDA backend (created by ff_kernels_cuda). */
cudaStream_t ff_cuda_stream(void);
/* Report a failed call (file, line, what failed, the library's message) and end the job through
 * the fatal hook: a CUDA error leaves the device in an unknown state, so nothing is retried. */
void ff_cuda_fatal(const char *file, int line, const char *call, const char *message);

#define FF_CUDA_CHECK(call)                                                                    \
  do {                                                                                         \
    cudaError_t ff_err_ = (call);                                                              \
    if (ff_err_ != cudaSuccess)                                                                \
      ff_cuda_fatal(__FILE__, __LINE__, #call, cudaGetErrorString(ff_err_));                   \
  } while (0)

/* The same for a cuBLAS or cuBLASLt call. */
#define FF_CUBLAS_CHECK(call)                                                                  \
  do {                                                                                         \
    cublasStatus_t ff_st_ = (call);                                                            \
    if (ff_st_ != CUBLAS_STATUS_SUCCESS)                                                       \
      ff_cuda_fatal(__FILE__, __LINE__, #call, cublasGetStatusString(ff_st_));                 \
  } while (0)

/* After a launch: a bad configuration shows up here, a fault at the next synchronising call. */
#define FF_CUDA_LAUNCHED(what)                                                                 \
  do {                                                                                         \
    cudaError_t ff_err_ = cudaGetLastError();                                                  \
    if (ff_err_ != cudaSuccess)                                                                \
      ff_cuda_fatal(__FILE__, __LINE__, "launch of " what, cudaGetErrorString(ff_err_));        \
  } while (0)

/* The most dynamic shared memory one block may use on this process's GPU (its opt-in limit:
 * 227 KiB on an H100 or H200, 163 KiB on an A100, 99 KiB on an RTX 4090). */
size_t ff_cuda_shared_limit(void);

/* Kernels above 48 KiB of dynamic shared memory must say so before their launch; one that needs
 * more than the GPU has ends the job with the figures, not a bare "invalid argument". */
template <typename Kernel>
static void ff_cuda_allow_shared(Kernel kernel, size_t bytes, const char *what) {
  if (bytes > ff_cuda_shared_limit()) {
    char why[160];
    snprintf(why, sizeof why, "needs %zu KiB of shared memory per block; this GPU allows %zu KiB",
             bytes >> 10, ff_cuda_shared_limit() >> 10);
    ff_cuda_fatal(__FILE__, __LINE__, what, why);
  }
  if (bytes > 48 * 1024)
    FF_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)bytes));
}

#endif
