/* cuda_emu_runtime.cc — the CUDA runtime, cuBLAS and cuBLASLt calls of cuda_runtime.h,
 * cublas_v2.h and cublasLt.h, on the CPU, for the emulated build of the CUDA backend. */
#include <cblas.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <vector>

#include "cublasLt.h"
#include "cuda_bf16.h"

/* ---- the runtime ------------------------------------------------------------------------ */

struct CUevent_st {
  std::chrono::steady_clock::time_point at;
};

static std::map<void *, size_t> device_allocs; /* what cudaMalloc handed out, and its size */
static size_t device_bytes;
static cudaError_t last_error = cudaSuccess;
static int current_device;

static cudaError_t fail(cudaError_t err) {
  last_error = err;
  return err;
}

const char *cudaGetErrorString(cudaError_t err) {
  switch (err) {
  case cudaSuccess: return "no error";
  case cudaErrorInvalidValue: return "invalid argument";
  case cudaErrorMemoryAllocation: return "out of memory";
  case cudaErrorInvalidDevice: return "invalid device ordinal";
  case cudaErrorNotReady: return "device not ready";
  }
  return "unknown error";
}

cudaError_t cudaGetLastError(void) {
  cudaError_t err = last_error;
  last_error = cudaSuccess;
  return err;
}

/* One GPU, or FF_EMU_GPUS of them: alike, and each process has its own (ranks of one host that
 * must not share a GPU, as NCCL's, can then each take another). */
static int device_count() {
  const char *n = getenv("FF_EMU_GPUS");
  return n && atoi(n) > 0 ? atoi(n) : 1;
}

cudaError_t cudaGetDeviceCount(int *count) {
  *count = device_count();
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
  current_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
  *device = current_device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int device) {
  if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
  memset(prop, 0, sizeof *prop);
  snprintf(prop->name, sizeof prop->name, "emulated GPU (tests/emu)");
  prop->totalGlobalMem = EMU_DEVICE_BYTES;
  prop->major = 9;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char *id, int len, int device) {
  if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
  snprintf(id, (size_t)len, "0000:%02x:00.0", device);
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device) {
  if (device < 0 || device >= device_count() || attr != cudaDevAttrMaxSharedMemoryPerBlockOptin)
    return fail(cudaErrorInvalidValue);
  *value = EMU_SHARED_OPTIN;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t bytes) {
  if (device_bytes + bytes > EMU_DEVICE_BYTES) return fail(cudaErrorMemoryAllocation);
  *p = aligned_alloc(256, (bytes + 255) / 256 * 256);
  if (!*p) return fail(cudaErrorMemoryAllocation);
  memset(*p, 0xff, bytes); /* NaN: device memory starts as whatever was there */
  device_allocs[*p] = bytes;
  device_bytes += bytes;
  return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
  if (!p) return cudaSuccess;
  auto it = device_allocs.find(p);
  if (it == device_allocs.end()) return fail(cudaErrorInvalidValue);
  device_bytes -= it->second;
  device_allocs.erase(it);
  free(p);
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void **p, size_t bytes) {
  *p = malloc(bytes);
  return *p ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}

cudaError_t cudaFreeHost(void *p) {
  free(p);
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
  *total_bytes = EMU_DEVICE_BYTES;
  *free_bytes = EMU_DEVICE_BYTES - device_bytes;
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t) {
  memset(p, value, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind,
                            cudaStream_t) {
  memmove(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind, cudaStream_t) {
  if (width > dpitch || width > spitch) return fail(cudaErrorInvalidValue); /* as CUDA says */
  for (size_t r = 0; r < height; r++)
    memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p) {
  memset(a, 0, sizeof *a);
  auto it = device_allocs.upper_bound(const_cast<void *>(p)); /* the first past p */
  if (it != device_allocs.begin()) {
    --it;
    if ((const char *)p < (const char *)it->first + it->second) {
      a->type = cudaMemoryTypeDevice;
      a->devicePointer = const_cast<void *>(p);
      return cudaSuccess;
    }
  }
  a->type = cudaMemoryTypeUnregistered;
  a->hostPointer = const_cast<void *>(p);
  return cudaSuccess;
}

/* Streams are names (every call completes before it returns), handed out from a fixed set. */
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned) {
  static char names[64];
  static unsigned made;
  *stream = (cudaStream_t)&names[made++ % sizeof names];
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *stream) { return cudaStreamCreateWithFlags(stream, 0); }
cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }

cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned) { return cudaSuccess; }

cudaError_t cudaEventCreate(cudaEvent_t *event) {
  *event = new CUevent_st();
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned) {
  return cudaEventCreate(event);
}

cudaError_t cudaEventQuery(cudaEvent_t) { return cudaSuccess; }

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete event;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t) {
  event->at = std::chrono::steady_clock::now();
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t stop) {
  *ms = std::chrono::duration<float, std::milli>(stop->at - start->at).count();
  return cudaSuccess;
}

/* ---- GEMM ------------------------------------------------------------------------------- */

const char *cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
  case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
  case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
  case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
  case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
  }
  return "unknown cuBLAS status";
}

static float widen(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static uint16_t round_bf16(float f) { return __float2bfloat16_rn(f).bits; }

/* The type combinations cuBLAS takes for these computes (its cublasGemmEx table): fp32 operands
 * and result under either compute; bf16 operands with a bf16 or fp32 result under 32F only. */
static bool types_supported(cudaDataType_t a, cudaDataType_t b, cudaDataType_t c,
                            cublasComputeType_t compute) {
  if (a != b) return false;
  if (a == CUDA_R_32F) return c == CUDA_R_32F;
  return a == CUDA_R_16BF && compute == CUBLAS_COMPUTE_32F && (c == CUDA_R_16BF || c == CUDA_R_32F);
}

/* A stored rows × cols column-major matrix (leading dimension ld) of `type`, as fp32; under
 * FAST_16BF an fp32 operand is rounded to bf16 first, as cuBLAS's tensor-core path does. */
static std::vector<float> load(const void *p, cudaDataType_t type, int rows, int cols, int ld,
                               bool fast_bf16) {
  std::vector<float> x((size_t)ld * (cols > 0 ? cols : 0));
  for (int j = 0; j < cols; j++)
    for (int i = 0; i < rows; i++) {
      size_t at = (size_t)j * ld + i;
      float v = type == CUDA_R_16BF ? widen(((const uint16_t *)p)[at]) : ((const float *)p)[at];
      x[at] = fast_bf16 && type == CUDA_R_32F ? widen(round_bf16(v)) : v;
    }
  return x;
}

/* Column-major C(m, n) = alpha · op(A) · op(B) + beta · C, cuBLAS's checks first. */
static cublasStatus_t emu_gemm(bool ta, bool tb, int m, int n, int k, float alpha, const void *A,
                               cudaDataType_t a_type, int lda, const void *B,
                               cudaDataType_t b_type, int ldb, float beta, void *C,
                               cudaDataType_t c_type, int ldc, cublasComputeType_t compute) {
  int a_rows = ta ? k : m, b_rows = tb ? n : k;
  if (m < 0 || n < 0 || k < 0 || lda < (a_rows > 1 ? a_rows : 1) ||
      ldb < (b_rows > 1 ? b_rows : 1) || ldc < (m > 1 ? m : 1))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (!types_supported(a_type, b_type, c_type, compute)) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  bool fast = compute == CUBLAS_COMPUTE_32F_FAST_16BF;
  std::vector<float> a = load(A, a_type, a_rows, ta ? m : k, lda, fast);
  std::vector<float> b = load(B, b_type, b_rows, tb ? k : n, ldb, fast);
  std::vector<float> c = beta != 0.0f ? load(C, c_type, m, n, ldc, false) /* else unread: */
                                       : std::vector<float>((size_t)ldc * n); /* may be NaN */
  if (k > 0)
    cblas_sgemm(CblasColMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m,
                n, k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
  else
    for (float &x : c) x *= beta;
  for (int j = 0; j < n; j++)
    for (int i = 0; i < m; i++) {
      size_t at = (size_t)j * ldc + i;
      if (c_type == CUDA_R_16BF) ((uint16_t *)C)[at] = round_bf16(c[at]);
      else ((float *)C)[at] = c[at];
    }
  return CUBLAS_STATUS_SUCCESS;
}

struct cublasContext {
  int unused;
};

cublasStatus_t cublasCreate(cublasHandle_t *handle) {
  *handle = new cublasContext();
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t) {
  return handle ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb,
                            int m, int n, int k, const void *alpha, const void *A,
                            cudaDataType_t a_type, int lda, const void *B, cudaDataType_t b_type,
                            int ldb, const void *beta, void *C, cudaDataType_t c_type, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  return emu_gemm(ta == CUBLAS_OP_T, tb == CUBLAS_OP_T, m, n, k, *(const float *)alpha, A,
                  a_type, lda, B, b_type, ldb, *(const float *)beta, C, c_type, ldc, compute);
}

static size_t type_bytes(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
    const void *alpha, const void *A, cudaDataType_t a_type, int lda, long long stride_a,
    const void *B, cudaDataType_t b_type, int ldb, long long stride_b, const void *beta, void *C,
    cudaDataType_t c_type, int ldc, long long stride_c, int batch, cublasComputeType_t compute,
    cublasGemmAlgo_t algo) {
  if (batch < 0) return CUBLAS_STATUS_INVALID_VALUE;
  for (int i = 0; i < batch; i++) {
    cublasStatus_t st = cublasGemmEx(
        handle, ta, tb, m, n, k, alpha, (const char *)A + i * stride_a * type_bytes(a_type),
        a_type, lda, (const char *)B + i * stride_b * type_bytes(b_type), b_type, ldb, beta,
        (char *)C + i * stride_c * type_bytes(c_type), c_type, ldc, compute, algo);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
  }
  return CUBLAS_STATUS_SUCCESS;
}

/* ---- cuBLASLt --------------------------------------------------------------------------- */

struct cublasLtContext {
  int unused;
};
struct cublasLtMatmulDescOpaque {
  cublasComputeType_t compute;
  cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
};
struct cublasLtMatrixLayoutOpaque {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
};
struct cublasLtMatmulPreferenceOpaque {
  uint32_t align[4] = {256, 256, 256, 256}; /* A, B, C, D: cuBLASLt's defaults */
};

cublasStatus_t cublasLtCreate(cublasLtHandle_t *handle) {
  *handle = new cublasLtContext();
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *desc, cublasComputeType_t compute,
                                        cudaDataType_t scale_type) {
  if (scale_type != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  *desc = new cublasLtMatmulDescOpaque();
  (*desc)->compute = compute;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t size) {
  if (size != sizeof(cublasOperation_t)) return CUBLAS_STATUS_INVALID_VALUE;
  if (attr == CUBLASLT_MATMUL_DESC_TRANSA) memcpy(&desc->ta, buf, size);
  else if (attr == CUBLASLT_MATMUL_DESC_TRANSB) memcpy(&desc->tb, buf, size);
  else return CUBLAS_STATUS_INVALID_VALUE;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *layout, cudaDataType_t type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  if (ld < (int64_t)(rows > 1 ? rows : 1)) return CUBLAS_STATUS_INVALID_VALUE;
  *layout = new cublasLtMatrixLayoutOpaque{type, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete layout;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref) {
  *pref = new cublasLtMatmulPreferenceOpaque();
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void *buf, size_t size) {
  if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES)
    return size == sizeof(uint64_t) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
  int i = attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES;
  if (i < 0 || i > 3 || size != sizeof(uint32_t)) return CUBLAS_STATUS_INVALID_VALUE;
  memcpy(&pref->align[i], buf, size);
  return CUBLAS_STATUS_SUCCESS;
}

/* The shape op(A)(m, k) · op(B)(k, n) → C, D (m, n) the layouts describe, or false. */
static bool shape_of(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                     cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                     int *m, int *n, int *k) {
  bool ta = desc->ta == CUBLAS_OP_T, tb = desc->tb == CUBLAS_OP_T;
  *m = (int)c->rows;
  *n = (int)c->cols;
  *k = (int)(ta ? a->rows : a->cols);
  return (ta ? a->cols : a->rows) == c->rows && (tb ? b->rows : b->cols) == c->cols &&
         (tb ? b->cols : b->rows) == (uint64_t)*k && d->rows == c->rows && d->cols == c->cols &&
         d->ld == c->ld && d->type == c->type;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t *results,
                                              int *found) {
  int m, n, k;
  *found = 0;
  if (!handle || requested < 1 || !shape_of(desc, a, b, c, d, &m, &n, &k))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (!types_supported(a->type, b->type, c->type, desc->compute))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  for (uint32_t al : pref->align)
    if (al < 4) return CUBLAS_STATUS_NOT_SUPPORTED;
  memset(results, 0, sizeof *results);
  memcpy(results->algo.data, pref->align, sizeof pref->align); /* the alignment it was made for */
  *found = 1;
  return CUBLAS_STATUS_SUCCESS;
}

static bool aligned(const void *p, uint64_t align) { return (uintptr_t)p % align == 0; }

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                              const void *alpha, const void *A, cublasLtMatrixLayout_t a,
                              const void *B, cublasLtMatrixLayout_t b, const void *beta,
                              const void *C, cublasLtMatrixLayout_t c, void *D,
                              cublasLtMatrixLayout_t d, const cublasLtMatmulAlgo_t *algo,
                              void *, size_t, cudaStream_t) {
  int m, n, k;
  if (!handle || !algo || !shape_of(desc, a, b, c, d, &m, &n, &k)) return CUBLAS_STATUS_INVALID_VALUE;
  /* an algorithm made for some alignment runs only on pointers that have it */
  if (!aligned(A, algo->data[0] & 0xffffffffu) || !aligned(B, algo->data[0] >> 32) ||
      !aligned(C, algo->data[1] & 0xffffffffu) || !aligned(D, algo->data[1] >> 32))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (C != D) { /* D = alpha · op(A) · op(B) + beta · C, computed in D */
    if (*(const float *)beta != 0.0f)
      for (uint64_t j = 0; j < c->cols; j++)
        memcpy((char *)D + j * d->ld * type_bytes(d->type),
               (const char *)C + j * c->ld * type_bytes(c->type), c->rows * type_bytes(c->type));
  }
  return emu_gemm(desc->ta == CUBLAS_OP_T, desc->tb == CUBLAS_OP_T, m, n, k, *(const float *)alpha,
                  A, a->type, (int)a->ld, B, b->type, (int)b->ld, *(const float *)beta, D, d->type,
                  (int)d->ld, desc->compute);
}
