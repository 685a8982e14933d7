/* ff_attention.h — the CUDA backend's three attentions, as ff_kernels_cuda.cu calls them:
 * the fused fp32 kernels (ff_attention_cuda.cu), the tensor-core kernels
 * (ff_attention_tc_cuda.cu) and attention through cuBLAS (ff_attention_gemm_cuda.cu). Every
 * definition includes this header, so a launcher cannot drift from the call. Arguments and
 * layouts as ff_kernels.h's attention_fwd and attention_bwd; the caller has checked the shard's
 * head map (ff_cuda_attention_check_gqa) whenever Hq > 0. Internal to kernels/cuda. */
#ifndef FF_ATTENTION_H
#define FF_ATTENTION_H

#include <cublas_v2.h>
#include <stdint.h>

/* Every local query head must map to a local kv head: a bad shard would read outside k and v.
 * Ends the job (ff_cuda_fatal) otherwise. */
extern "C" void ff_cuda_attention_check_gqa(int Hq, int Hkv, int q_first, int kv_first, int group);

extern "C" void ff_cuda_attention_fwd(float *out, float *lse, const float *q, const float *k,
                                      const float *v, int B, int S, int Hq, int Hkv, int D,
                                      int q_first, int kv_first, int group);
extern "C" void ff_cuda_attention_bwd(float *dq, float *dk, float *dv, const float *dout,
                                      const float *out, const float *lse, const float *q,
                                      const float *k, const float *v, int B, int S, int Hq,
                                      int Hkv, int D, int q_first, int kv_first, int group);

/* A head dimension the tensor-core kernels take, whose shared memory this GPU has; they are for
 * Hq > 0 only (a shard without query heads goes to the fused kernels). */
extern "C" bool ff_cuda_attention_tc_supports(int D);
extern "C" void ff_cuda_attention_tc_fwd(float *out, float *lse, const float *q, const float *k,
                                         const float *v, int B, int S, int Hq, int Hkv, int D,
                                         int q_first, int kv_first, int group);
extern "C" void ff_cuda_attention_tc_bwd(float *dq, float *dk, float *dv, const float *dout,
                                         const float *out, const float *lse, const float *q,
                                         const float *k, const float *v, int B, int S, int Hq,
                                         int Hkv, int D, int q_first, int kv_first, int group);
/* The same on bf16 q, k, v and out, the forward writing out in bf16. */
extern "C" void ff_cuda_attention_tc_fwd_bf16(uint16_t *out, float *lse, const uint16_t *q,
                                              const uint16_t *k, const uint16_t *v, int B, int S,
                                              int Hq, int Hkv, int D, int q_first, int kv_first,
                                              int group);
extern "C" void ff_cuda_attention_tc_bwd_bf16(float *dq, float *dk, float *dv, const float *dout,
                                              const uint16_t *out, const float *lse,
                                              const uint16_t *q, const uint16_t *k,
                                              const uint16_t *v, int B, int S, int Hq, int Hkv,
                                              int D, int q_first, int kv_first, int group);

extern "C" void ff_cuda_attention_gemm_fwd(cublasHandle_t blas, cublasComputeType_t ct, float *out,
                                           float *lse, const float *q, const float *k,
                                           const float *v, int B, int S, int Hq, int Hkv, int D,
                                           int q_first, int kv_first, int group);
extern "C" void ff_cuda_attention_gemm_bwd(cublasHandle_t blas, cublasComputeType_t ct, float *dq,
                                           float *dk, float *dv, const float *dout,
                                           const float *out, const float *lse, const float *q,
                                           const float *k, const float *v, int B, int S, int Hq,
                                           int Hkv, int D, int q_first, int kv_first, int group);

#endif
