/* cuda_runtime.h — the part of the CUDA runtime API the CUDA backend (kernels/cuda) calls, on the
 * CPU, for its emulated build (tests/meson.build: the CUDA sources made plain C++ by unlaunch.py,
 * their kernels run by cuda_emu.h). One emulated GPU, an H200's figures; everything runs at once,
 * in order, so streams and events only keep time. Fresh device memory is filled with NaN, as a
 * reminder that cudaMalloc does not clear it: a kernel or GEMM that reads what nobody wrote shows
 * up in the results. Device and host memory are both plain heap memory here, so the sanitizers
 * see every access of a kernel or GEMM outside its buffers. */
#ifndef FF_CUDA_EMU_RUNTIME_H
#define FF_CUDA_EMU_RUNTIME_H

#include <stddef.h>

#ifdef __cplusplus
#include "cuda_emu.h"
#define EMU_DEFAULT(x) = x
extern "C" {
#else
#define EMU_DEFAULT(x)
#endif

typedef enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidDevice = 101,
  cudaErrorNotReady = 600,
} cudaError_t;

typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost,
  cudaMemcpyHostToDevice,
  cudaMemcpyDeviceToHost,
  cudaMemcpyDeviceToDevice,
  cudaMemcpyDefault
};
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
enum cudaDeviceAttr { cudaDevAttrMaxSharedMemoryPerBlockOptin = 97 };
enum { cudaStreamNonBlocking = 1, cudaEventDisableTiming = 2 };
enum cudaMemoryType {
  cudaMemoryTypeUnregistered = 0,
  cudaMemoryTypeHost = 1,
  cudaMemoryTypeDevice = 2,
  cudaMemoryTypeManaged = 3
};

typedef struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  int major, minor;
  int pciDomainID, pciBusID, pciDeviceID;
} cudaDeviceProp;

struct cudaPointerAttributes {
  enum cudaMemoryType type;
  int device;
  void *devicePointer, *hostPointer;
};

/* The emulated GPU's memory and shared-memory limits (an H200's). */
#define EMU_DEVICE_BYTES ((size_t)141 << 30)
#define EMU_SHARED_OPTIN (227 * 1024)

const char *cudaGetErrorString(cudaError_t err);
cudaError_t cudaGetLastError(void);
cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int device);
cudaError_t cudaDeviceGetPCIBusId(char *id, int len, int device);
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device);
cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocHost(void **p, size_t bytes);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t stream EMU_DEFAULT(0));
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t stream EMU_DEFAULT(0));
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, enum cudaMemcpyKind kind,
                              cudaStream_t stream EMU_DEFAULT(0));
/* Device memory is what cudaMalloc handed out; everything else is host memory. */
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p);
cudaError_t cudaStreamCreate(cudaStream_t *stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags);
cudaError_t cudaEventCreate(cudaEvent_t *event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream EMU_DEFAULT(0));
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t stop);

#ifdef __cplusplus
}

template <typename T> cudaError_t cudaMalloc(T **p, size_t bytes) {
  return cudaMalloc((void **)p, bytes);
}

/* A launch as unlaunch.py writes it: everything runs in order, so the stream only has to exist. */
template <typename F>
void emu_launch(dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream, F body) {
  emu_require(stream != nullptr, "a launch on no stream");
  emu_launch(grid, block, smem_bytes, body);
}

/* A kernel's opt-in to more than 48 KiB of dynamic shared memory: past the GPU's limit it fails,
 * as on a GPU. */
template <typename Kernel>
cudaError_t cudaFuncSetAttribute(Kernel, cudaFuncAttribute, int value) {
  return value >= 0 && value <= EMU_SHARED_OPTIN ? cudaSuccess : cudaErrorInvalidValue;
}
#endif /* __cplusplus */

#endif
