/* cuda_emu.h — just enough of CUDA to run the CUDA backend's kernels on the CPU, for
 * tests/unit/test_cuda_emulated.cc and the emulated build of the CUDA backend (cuda_runtime.h):
 * a block is a fiber per CUDA thread (x first, then y) on one CPU thread, taking turns
 * (cuda_emu.cc), __syncthreads and __syncwarp are barriers where a fiber waits for its block or
 * warp, so every interleaving the barriers allow is one a GPU could run; a barrier that some
 * thread of the block never reaches stops the program, where a GPU would hang or worse. Shuffles
 * go through shared slots, and WMMA
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
  unsigned x, y, z;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

/* The emulator's state (cuda_emu.cc): the indices of the fiber running, the warps' shuffle
 * slots, and the dynamic shared memory of every kernel. */
extern dim3 threadIdx, blockIdx, blockDim, gridDim;
extern double emu_slots[32][32];
enum { EMU_SHARED_BYTES = 256 * 1024 };
extern unsigned char smem[EMU_SHARED_BYTES];

/* This thread's index in its block, x first: warp emu_linear() / 32, lane emu_linear() % 32. */
inline unsigned emu_linear() { return threadIdx.x + threadIdx.y * blockDim.x; }

void emu_sync_block(void);
void emu_sync_warp(void);
inline void __syncthreads() { emu_sync_block(); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu_sync_warp(); }

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

/* Run fn(arg) as every thread of a grid of blocks of `block` threads (cuda_emu.cc). */
void emu_run_grid(dim3 grid, dim3 block, void (*fn)(void *), void *arg);

/* Run body() as a grid of blocks of `block` threads, one block at a time; before each block
 * the dynamic shared memory is filled with NaN again. */
template <typename F> void emu_launch(dim3 grid, dim3 block, size_t smem_bytes, F body) {
  unsigned threads = block.x * block.y * block.z;
  if (smem_bytes > sizeof smem || threads % 32 != 0 || threads > 1024 || block.z != 1) {
    fprintf(stderr, "cuda_emu: a launch of %zu bytes of shared memory, %u x %u x %u threads\n",
            smem_bytes, block.x, block.y, block.z);
    abort();
  }
  emu_run_grid(grid, block, [](void *f) { (*(F *)f)(); }, &body);
}

#endif
