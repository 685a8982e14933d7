/* cublas_v2.h — the part of cuBLAS the CUDA backend calls, for its emulated build (see
 * cuda_runtime.h beside this file). The GEMMs (cuda_emu_blas.cc) check their arguments as cuBLAS
 * documents them — leading dimensions, the data and compute types it accepts together — and
 * fail with CUBLAS_STATUS_INVALID_VALUE or CUBLAS_STATUS_NOT_SUPPORTED where it would; they
 * compute in fp32 through the CPU's sgemm, with bf16 operands widened exactly, fp32 operands under
 * CUBLAS_COMPUTE_32F_FAST_16BF rounded to bf16 first, and bf16 results rounded on the way out. */
#ifndef FF_CUDA_EMU_CUBLAS_H
#define FF_CUDA_EMU_CUBLAS_H

#include "cuda_runtime.h"

typedef enum cudaDataType_t { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14 } cudaDataType_t;

typedef enum {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
} cublasStatus_t;

typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum {
  CUBLAS_COMPUTE_32F = 68,
  CUBLAS_COMPUTE_32F_FAST_16BF = 75,
} cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;

typedef struct cublasContext *cublasHandle_t;

const char *cublasGetStatusString(cublasStatus_t status);
cublasStatus_t cublasCreate(cublasHandle_t *handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb,
                            int m, int n, int k, const void *alpha, const void *A,
                            cudaDataType_t a_type, int lda, const void *B, cudaDataType_t b_type,
                            int ldb, const void *beta, void *C, cudaDataType_t c_type, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t algo);
cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
    const void *alpha, const void *A, cudaDataType_t a_type, int lda, long long stride_a,
    const void *B, cudaDataType_t b_type, int ldb, long long stride_b, const void *beta, void *C,
    cudaDataType_t c_type, int ldc, long long stride_c, int batch, cublasComputeType_t compute,
    cublasGemmAlgo_t algo);

#endif
