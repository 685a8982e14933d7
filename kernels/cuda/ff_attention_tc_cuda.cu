/* ff_attention_tc_cuda.cu — the launchers of the tensor-core attention kernels
 * (ff_attention_tc_kernels.cuh, which describes them): FF_ATTENTION=tensor under bf16 math. */
#include <stdio.h>

#include "../ff_kernels.h"
#include "ff_attention.h"
#include "ff_cuda_common.cuh"
#include "ff_attention_tc_kernels.cuh"

/* ---- launchers -------------------------------------------------------------------------- */

/* TI: the element type of q, k, v (and out in the backward), TO: of the forward's out */
template <int DT, typename TI, typename TO>
static void fwd_launch(TO *out, float *lse, const TI *q, const TI *k, const TI *v, int B, int S,
                       int Hq, int Hkv, int q_first, int kv_first, int group) {
  int D = 16 * DT;
  size_t smem = tc_fwd_smem(D);
  ff_cuda_allow_shared(tc_fwd_kernel<DT, TI, TO>, smem, "tc_fwd");
  dim3 grid((unsigned)((S + TC_TILE - 1) / TC_TILE), (unsigned)Hq, (unsigned)B);
  tc_fwd_kernel<DT, TI, TO><<<grid, TC_THREADS, smem, ff_cuda_stream()>>>(
      out, lse, q, k, v, S, Hq, Hkv, q_first, kv_first, group, 1.0f / sqrtf((float)D));
  FF_CUDA_LAUNCHED("attention_tc_fwd");
}

template <int DT, typename TI>
static void bwd_launch(float *dq, float *dk, float *dv, const float *dout, const TI *out,
                       const float *lse, const TI *q, const TI *k, const TI *v, int B, int S,
                       int Hq, int Hkv, int q_first, int kv_first, int group) {
  int D = 16 * DT;
  float scale = 1.0f / sqrtf((float)D);
  unsigned tiles = (unsigned)((S + TC_TILE - 1) / TC_TILE);
  size_t smem_dq = tc_dq_smem(D);
  ff_cuda_allow_shared(tc_bwd_dq_kernel<DT, TI>, smem_dq, "tc_bwd_dq");
  tc_bwd_dq_kernel<DT, TI><<<dim3(tiles, (unsigned)Hq, (unsigned)B), TC_THREADS, smem_dq,
                             ff_cuda_stream()>>>(dq, dout, out, lse, q, k, v, S, Hq, Hkv,
                                                 q_first, kv_first, group, scale);
  FF_CUDA_LAUNCHED("attention_tc_bwd_dq");
  if (Hkv <= 0) return;
  size_t smem_kv = tc_dkdv_smem(D);
  ff_cuda_allow_shared(tc_bwd_dkdv_kernel<DT, TI>, smem_kv, "tc_bwd_dkdv");
  tc_bwd_dkdv_kernel<DT, TI><<<dim3(tiles, (unsigned)Hkv, (unsigned)B), TC_THREADS, smem_kv,
                               ff_cuda_stream()>>>(dk, dv, dout, out, lse, q, k, v, S, Hq, Hkv,
                                                   q_first, kv_first, group, scale);
  FF_CUDA_LAUNCHED("attention_tc_bwd_dkdv");
}

/* The instantiation for head dimension D (a multiple of 16 up to TC_MAX_D). */
template <typename TI, typename TO>
static void fwd_for(int D, TO *out, float *lse, const TI *q, const TI *k, const TI *v, int B,
                    int S, int Hq, int Hkv, int q_first, int kv_first, int group) {
  if (B <= 0 || S <= 0 || Hq <= 0) return;
#define FF_FWD(DT) fwd_launch<DT>(out, lse, q, k, v, B, S, Hq, Hkv, q_first, kv_first, group)
  switch (D / 16) {
  case 1: FF_FWD(1); break;
  case 2: FF_FWD(2); break;
  case 3: FF_FWD(3); break;
  case 4: FF_FWD(4); break;
  case 5: FF_FWD(5); break;
  case 6: FF_FWD(6); break;
  case 7: FF_FWD(7); break;
  default: FF_FWD(8); break;
  }
#undef FF_FWD
}

template <typename TI>
static void bwd_for(int D, float *dq, float *dk, float *dv, const float *dout, const TI *out,
                    const float *lse, const TI *q, const TI *k, const TI *v, int B, int S, int Hq,
                    int Hkv, int q_first, int kv_first, int group) {
  if (B <= 0 || S <= 0 || Hq <= 0) return;
#define FF_BWD(DT) \
  bwd_launch<DT>(dq, dk, dv, dout, out, lse, q, k, v, B, S, Hq, Hkv, q_first, kv_first, group)
  switch (D / 16) {
  case 1: FF_BWD(1); break;
  case 2: FF_BWD(2); break;
  case 3: FF_BWD(3); break;
  case 4: FF_BWD(4); break;
  case 5: FF_BWD(5); break;
  case 6: FF_BWD(6); break;
  case 7: FF_BWD(7); break;
  default: FF_BWD(8); break;
  }
#undef FF_BWD
}

/* A head dimension the kernels take, whose shared memory this GPU has (at D 128 the dk, dv
 * kernel needs 120.5 KiB: an RTX 4090's 99 KiB then leaves it to the fused kernel). */
extern "C" bool ff_cuda_attention_tc_supports(int D) {
  if (D < 16 || D > TC_MAX_D || D % 16 != 0) return false;
  size_t most = tc_fwd_smem(D);
  if (tc_dq_smem(D) > most) most = tc_dq_smem(D);
  if (tc_dkdv_smem(D) > most) most = tc_dkdv_smem(D);
  return most <= ff_cuda_shared_limit();
}

/* For head dimensions ff_cuda_attention_tc_supports and Hq > 0: the caller sends a shard with no
 * query heads (whose kv gradients are zero) to the fp32 kernel. */
extern "C" void ff_cuda_attention_tc_fwd(float *out, float *lse, const float *q, const float *k,
                                         const float *v, int B, int S, int Hq, int Hkv, int D,
                                         int q_first, int kv_first, int group) {
  fwd_for(D, out, lse, q, k, v, B, S, Hq, Hkv, q_first, kv_first, group);
}

extern "C" void ff_cuda_attention_tc_bwd(float *dq, float *dk, float *dv, const float *dout,
                                         const float *out, const float *lse, const float *q,
                                         const float *k, const float *v, int B, int S, int Hq,
                                         int Hkv, int D, int q_first, int kv_first, int group) {
  bwd_for(D, dq, dk, dv, dout, out, lse, q, k, v, B, S, Hq, Hkv, q_first, kv_first, group);
}

/* The same on bf16 q, k, v and out (bf16 plans keep them so), the forward writing out in bf16. */
extern "C" void ff_cuda_attention_tc_fwd_bf16(uint16_t *out, float *lse, const uint16_t *q,
                                              const uint16_t *k, const uint16_t *v, int B, int S,
                                              int Hq, int Hkv, int D, int q_first, int kv_first,
                                              int group) {
  fwd_for(D, out, lse, q, k, v, B, S, Hq, Hkv, q_first, kv_first, group);
}

extern "C" void ff_cuda_attention_tc_bwd_bf16(float *dq, float *dk, float *dv, const float *dout,
                                              const uint16_t *out, const float *lse,
                                              const uint16_t *q, const uint16_t *k,
                                              const uint16_t *v, int B, int S, int Hq, int Hkv,
                                              int D, int q_first, int kv_first, int group) {
  bwd_for(D, dq, dk, dv, dout, out, lse, q, k, v, B, S, Hq, Hkv, q_first, kv_first, group);
}
