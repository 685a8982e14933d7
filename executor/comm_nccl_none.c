/* comm_nccl_none.c — ff_comm_nccl in a build without CUDA: there is no NCCL, and it says so. */
#include <stdio.h>

#include "comm.h"

const ff_comm_backend *ff_comm_nccl(const ff_kernels *k, char *why, size_t why_cap) {
  (void)k;
  snprintf(why, why_cap, "this build has no CUDA backend, so no NCCL");
  return NULL;
}
