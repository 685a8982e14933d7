/* ff_gpu_none.c — the GPU side of a build without CUDA: there is never a GPU, and asking for
 * the CUDA backend says why not. */
#include <stdio.h>

#include "ff_gpu.h"
#include "ff_kernels.h"

int ff_gpu_built(void) { return 0; }

int ff_gpu_count(const char **why) {
  if (why)
    *why = "this build has no CUDA backend (configured with -Dcuda=disabled or without nvcc)";
  return 0;
}

int ff_gpu_query(int index, ff_gpu_info *out) {
  (void)index;
  (void)out;
  return 1;
}

int ff_gpu_current(void) { return -1; }

void *ff_kernels_cuda_stream(void) { return NULL; }

void ff_kernels_cuda_attention(ff_kernel_attention a) { (void)a; }

const ff_kernels *ff_kernels_cuda(int device, ff_kernel_math math, void (*on_fatal)(int status),
                                  char *why, size_t why_cap) {
  (void)device;
  (void)math;
  (void)on_fatal;
  snprintf(why, why_cap, "this build has no CUDA backend (configured with -Dcuda=disabled or "
           "without nvcc)");
  return NULL;
}
