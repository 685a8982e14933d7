/* ff_gpu.h — what the GPU backend can tell before any work is placed on it: how many GPUs
 * answer and what they are. Built from kernels/cuda when CUDA is enabled, from ff_gpu_none.c
 * otherwise; either way a machine without a GPU simply reports none, so the same binary falls
 * back to the CPU backend. */
#ifndef FF_GPU_H
#define FF_GPU_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ff_gpu_info {
  char name[256];
  double memory_gib;
  int cc_major, cc_minor; /* compute capability */
  char pci_bus_id[32];    /* domain:bus:device.function, the same whichever devices a process sees */
} ff_gpu_info;

/* 1 when this build contains the CUDA backend. */
int ff_gpu_built(void);
/* GPUs that answer (0 without a driver or device); on failure *why (may be NULL) says why. */
int ff_gpu_count(const char **why);
/* 0 on success. */
int ff_gpu_query(int index, ff_gpu_info *out);
/* The GPU this thread's CUDA calls go to (the CUDA backend's once it has started), -1 if none. */
int ff_gpu_current(void);

#ifdef __cplusplus
}
#endif
#endif
