/* ff_gpu_cuda.cu — the GPU query of a CUDA build. A missing driver or device is not an error
 * here: it is reported as zero GPUs with the runtime's reason, and the caller falls back. */
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

#include "../ff_gpu.h"

extern "C" int ff_gpu_built(void) { return 1; }

extern "C" int ff_gpu_count(const char **why) {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    if (why)
      *why = cudaGetErrorString(err);
    cudaGetLastError(); /* clear the sticky error so later calls start clean */
    return 0;
  }
  if (n == 0 && why)
    *why = "no CUDA device found";
  return n;
}

extern "C" int ff_gpu_query(int index, ff_gpu_info *out) {
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, index) != cudaSuccess)
    return 1;
  memset(out, 0, sizeof *out);
  snprintf(out->name, sizeof out->name, "%s", prop.name);
  out->memory_gib = (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0);
  out->cc_major = prop.major;
  out->cc_minor = prop.minor;
  if (cudaDeviceGetPCIBusId(out->pci_bus_id, (int)sizeof out->pci_bus_id, index) != cudaSuccess) {
    cudaGetLastError();
    snprintf(out->pci_bus_id, sizeof out->pci_bus_id, "%04x:%02x:%02x.0", prop.pciDomainID,
             prop.pciBusID, prop.pciDeviceID);
  }
  return 0;
}

extern "C" int ff_gpu_current(void) {
  int d = -1;
  if (cudaGetDevice(&d) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return d;
}
