/* ff_cuda_common.cuh — what the CUDA backend's files share: the one stream every kernel and copy
 * of this rank runs on, the error checks every CUDA, cuBLAS and launch call goes through, and
 * small warp/block reductions. Internal to kernels/cuda. */
#ifndef FF_CUDA_COMMON_CUH
#define FF_CUDA_COMMON_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

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

enum { FF_WARP = 32 };

__device__ __forceinline__ float ff_warp_sum(float x) {
  for (int o = FF_WARP / 2; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

__device__ __forceinline__ double ff_warp_sum_f64(double x) {
  for (int o = FF_WARP / 2; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

__device__ __forceinline__ float ff_warp_max(float x) {
  for (int o = FF_WARP / 2; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

/* Block-wide sum or max for blockDim.x a multiple of 32 (≤ 1024), the result in every thread.
 * The combination order is fixed by the thread layout, so results are reproducible. */
template <typename T, typename Op>
__device__ T ff_block_reduce(T x, Op op, T identity) {
  __shared__ T partial[FF_WARP];
  int lane = threadIdx.x % FF_WARP, warp = threadIdx.x / FF_WARP;
  int warps = blockDim.x / FF_WARP;
  for (int o = FF_WARP / 2; o > 0; o /= 2) x = op(x, __shfl_xor_sync(0xffffffffu, x, o));
  __syncthreads(); /* partial[] may still be read by a previous call */
  if (lane == 0) partial[warp] = x;
  __syncthreads();
  x = lane < warps ? partial[lane] : identity;
  for (int o = FF_WARP / 2; o > 0; o /= 2) x = op(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

struct ff_op_sum {
  template <typename T> __device__ T operator()(T a, T b) const { return a + b; }
};
struct ff_op_max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

/* Kernels above 48 KiB of dynamic shared memory must say so before their launch. */
template <typename Kernel>
static void ff_cuda_allow_shared(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    FF_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)bytes));
}

/* Grid size for n elements at `threads` per block, capped so grid-stride loops cover the rest. */
static inline unsigned ff_grid_for(int64_t n, int threads) {
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks < 1) blocks = 1;
  if (blocks > 65535LL * 16) blocks = 65535LL * 16;
  return (unsigned)blocks;
}

#endif
