/* ff_cuda_device.cuh — the device helpers the kernels share: warp and block reductions, the
 * grid of a grid-stride loop, dynamic shared memory. Nothing here needs the CUDA runtime API, so
 * the CPU emulation of the kernels (tests/emu) compiles this very file. */
#ifndef FF_CUDA_DEVICE_CUH
#define FF_CUDA_DEVICE_CUH

#include <math.h>
#include <stdint.h>

enum { FF_WARP = 32 };

/* The block's dynamic shared memory, as bytes aligned to `align` (a macro so that the CPU
 * emulation of the kernels, tests/emu, can spell it its own way). */
#ifndef FF_DYNAMIC_SHARED
#define FF_DYNAMIC_SHARED(name, align) extern __shared__ __align__(align) unsigned char name[]
#endif

/* to_bf16's rounding of one value: to nearest, ties to even; a NaN stays a NaN (quiet) */
__device__ __forceinline__ uint16_t ff_bf16_bits(float v) {
  uint32_t bits = __float_as_uint(v);
  return (bits & 0x7fffffffu) > 0x7f800000u
             ? (uint16_t)((bits >> 16) | 0x0040u)
             : (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

/* A result stored as fp32, or as bf16 rounded as to_bf16 rounds: the kernels whose bf16 plans
 * keep only a bf16 copy of their output write it so, with the same fp32 arithmetic. */
__device__ __forceinline__ void ff_store(float *p, float v) { *p = v; }
__device__ __forceinline__ void ff_store(uint16_t *p, float v) { *p = ff_bf16_bits(v); }

/* An input read as fp32, or from bf16 (exactly) */
__device__ __forceinline__ float ff_load(const float *p) { return *p; }
__device__ __forceinline__ float ff_load(const uint16_t *p) {
  return __uint_as_float((uint32_t)*p << 16);
}

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
