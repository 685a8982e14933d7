/* cuda_emu.h — just enough of CUDA to run the attention kernels on the CPU, for
 * tests/unit/test_attention_emulated.cc: a block is a std::thread per CUDA thread, __syncthreads and __syncwarp are
 * barriers, shuffles go through shared slots, and WMMA fragments are plain 16 × 16 arrays
 * (mma.h beside this file). Shared memory is one buffer, filled with NaN before every block, so
 * a read of something no thread wrote shows up in the results. One block runs at a time.
 *
 * Each lane owns the accumulator elements i (row-major index) with i % 32 == lane: it loads,
 * stores and computes only those, as on a GPU each lane holds part of the fragment. So a lane
 * that reads what another lane stored without a __syncwarp in between races here too. */
#ifndef FF_CUDA_EMU_H
#define FF_CUDA_EMU_H

#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __shared__
#define __align__(n)

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
};

extern thread_local dim3 threadIdx, blockIdx;
extern dim3 blockDim;
extern std::barrier<> *emu_block_barrier;
extern std::barrier<> *emu_warp_barrier[32];
extern float emu_slots[32][32];

inline void __syncthreads() { emu_block_barrier->arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) {
  emu_warp_barrier[threadIdx.x / 32]->arrive_and_wait();
}
/* Every lane of the warp posts v and reads lane src's. */
inline float emu_shuffle(float v, unsigned src) {
  unsigned w = threadIdx.x / 32, l = threadIdx.x % 32;
  __syncwarp(); /* the last shuffle's reads are done */
  emu_slots[w][l] = v;
  __syncwarp();
  return emu_slots[w][src % 32];
}
inline float __shfl_xor_sync(unsigned, float v, int m) {
  return emu_shuffle(v, (threadIdx.x % 32) ^ (unsigned)m);
}
inline float __shfl_sync(unsigned, float v, int src) { return emu_shuffle(v, (unsigned)src); }
inline int min(int a, int b) { return a < b ? a : b; }

/* ff_cuda_common.cuh's warp reductions, over the emulated shuffle */
#define FF_CUDA_COMMON_CUH
enum { FF_WARP = 32 };
inline float ff_warp_sum(float x) {
  for (int o = FF_WARP / 2; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
inline float ff_warp_max(float x) {
  for (int o = FF_WARP / 2; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

/* A misaligned fragment pointer or pitch faults on a GPU: here it stops the test. */
inline void emu_require(bool ok, const char *what) {
  if (!ok) {
    fprintf(stderr, "cuda_emu: %s\n", what);
    abort();
  }
}

#endif
