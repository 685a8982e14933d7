/* ff_cuda_device.cuh — the device helpers the kernels share: warp and block reductions, the
 * grid of a grid-stride loop, dynamic shared memory. Nothing here needs the CUDA runtime API, so
 * the CPU emulation of the kernels (tests/unit/cuda_emu) compiles this very file. */
#ifndef FF_CUDA_DEVICE_CUH
#define FF_CUDA_DEVICE_CUH

#include <math.h>
#include <stdint.h>

enum { FF_WARP = 32 };

/* The block's dynamic shared memory, as bytes aligned to `align` (a macro so that the CPU
 * emulation of the kernels, tests/unit/cuda_emu, can spell it its own way). */
#ifndef FF_DYNAMIC_SHARED
#define FF_DYNAMIC_SHARED(name, align) extern __shared__ __align__(align) unsigned char name[]
#endif

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

/* for (i over [0, n)) with every thread of the grid taking every gridDim·blockDim-th element */
#define FF_GRID_STRIDE(i, n)                                                                   \
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n);                    \
       i += (int64_t)gridDim.x * blockDim.x)

/* Grid size for n elements at `threads` per block, capped so grid-stride loops cover the rest. */
static inline unsigned ff_grid_for(int64_t n, int threads) {
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks < 1) blocks = 1;
  if (blocks > 65535LL * 16) blocks = 65535LL * 16;
  return (unsigned)blocks;
}

#endif
