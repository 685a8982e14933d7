/* ff_gpu_none.c — the GPU query of a build without CUDA: there is never a GPU. */
#include "ff_gpu.h"

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
