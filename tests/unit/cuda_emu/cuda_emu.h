/* cuda_emu.h — just enough of CUDA to run the CUDA backend's kernels on the CPU, for
 * tests/unit/test_cuda_emulated.cc: a block is a std::thread per CUDA thread (x first, then y),
 * __syncthreads and __syncwarp are barriers, shuffles go through shared slots, and WMMA
 * fragments are plain 16 × 16 arrays (mma.h beside this file). Dynamic shared memory is the
 * harness's buffer, filled with NaN before every block, so a read of something no thread wrote
 * shows up in the results; a static __shared__ array is a function-local static. One block runs
 * at a time. The kernels' own helpers (kernels/cuda/ff_cuda_device.cuh) compile over these.
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
#define __align__(n)
/* A kernel's static __shared__ array is one per block: a function-local static, as one block
 * runs at a time. Dynamic shared memory is the harness's buffer `smem`. */
#define __shared__ static
#define FF_DYNAMIC_SHARED(name, align) extern unsigned char name[]

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
};

extern thread_local dim3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;
extern std::barrier<> *emu_block_barrier;
extern std::barrier<> *emu_warp_barrier[32];
extern double emu_slots[32][32];

/* This thread's index in its block, x first: warp emu_linear() / 32, lane emu_linear() % 32. */
inline unsigned emu_linear() { return threadIdx.x + threadIdx.y * blockDim.x; }

inline void __syncthreads() { emu_block_barrier->arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) {
  emu_warp_barrier[emu_linear() / 32]->arrive_and_wait();
}

/* Every lane of the warp posts v and reads lane src's (floats and doubles pass exactly). */
template <typename T> inline T emu_shuffle(T v, unsigned src) {
  unsigned w = emu_linear() / 32, l = emu_linear() % 32;
  __syncwarp(); /* the last shuffle's reads are done */
  emu_slots[w][l] = (double)v;
  __syncwarp();
  return (T)emu_slots[w][src % 32];
}
template <typename T> inline T __shfl_xor_sync(unsigned, T v, int m) {
  return emu_shuffle(v, (emu_linear() % 32) ^ (unsigned)m);
}
template <typename T> inline T __shfl_sync(unsigned, T v, int src) {
  return emu_shuffle(v, (unsigned)src);
}
/* Whether pred holds in any lane of the warp, in every lane. */
inline int __any_sync(unsigned, int pred) {
  unsigned w = emu_linear() / 32, l = emu_linear() % 32;
  __syncwarp();
  emu_slots[w][l] = pred ? 1.0 : 0.0;
  __syncwarp();
  int any = 0;
  for (int i = 0; i < 32; i++) any |= emu_slots[w][i] != 0.0;
  return any;
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  memcpy(&u, &f, 4);
  return u;
}
inline float __uint_as_float(unsigned u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
inline int min(int a, int b) { return a < b ? a : b; }

/* A misaligned fragment pointer or pitch faults on a GPU: here it stops the test. */
inline void emu_require(bool ok, const char *what) {
  if (!ok) {
    fprintf(stderr, "cuda_emu: %s\n", what);
    abort();
  }
}

#endif
