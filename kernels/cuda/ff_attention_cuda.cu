/* ff_attention_cuda.cu — the launchers of the fused fp32 attention kernels
 * (ff_attention_kernels.cuh, which describes them), and the check of a shard's head map that
 * ff_kernels_cuda.cu makes before any of the three attentions (ff_attention.h). */
#include <stdio.h>

#include "../ff_kernels.h"
#include "ff_attention.h"
#include "ff_cuda_common.cuh"
#include "ff_attention_kernels.cuh"

/* ---- launchers -------------------------------------------------------------------------- */

static void check_head_dim(int D) {
  if (D < 1 || D > FF_ATTN_MAX_D) {
    char why[96];
    snprintf(why, sizeof why, "head dimension %d is outside the attention kernel's 1..%d", D,
             FF_ATTN_MAX_D);
    ff_cuda_fatal(__FILE__, __LINE__, "attention", why);
  }
}

extern "C" void ff_cuda_attention_check_gqa(int Hq, int Hkv, int q_first, int kv_first, int group) {
  int lo = group > 0 ? q_first / group - kv_first : -1;
  int hi = group > 0 ? (q_first + Hq - 1) / group - kv_first : -1;
  if (Hq > 0 && (group <= 0 || lo < 0 || hi >= Hkv)) {
    char why[160];
    snprintf(why, sizeof why, "query heads %d..%d (group %d) map to kv heads outside the local "
             "%d..%d", q_first, q_first + Hq - 1, group, kv_first, kv_first + Hkv - 1);
    ff_cuda_fatal(__FILE__, __LINE__, "attention", why);
  }
}

template <int DL>
static void fwd_launch(float *out, float *lse, const float *q, const float *k, const float *v,
                       int B, int S, int Hq, int Hkv, int D, int q_first, int kv_first,
                       int group) {
  dim3 grid((unsigned)((S + FF_ATTN_TILE - 1) / FF_ATTN_TILE), (unsigned)Hq, (unsigned)B);
  size_t smem = ff_attn_fwd_smem(D);
  ff_cuda_allow_shared(attention_fwd_kernel<DL>, smem, "attention_fwd");
  attention_fwd_kernel<DL><<<grid, FF_ATTN_WARPS * FF_WARP, smem, ff_cuda_stream()>>>(
      out, lse, q, k, v, S, Hq, Hkv, D, q_first, kv_first, group, 1.0f / sqrtf((float)D));
  FF_CUDA_LAUNCHED("attention_fwd");
}

template <int DL>
static void bwd_launch(float *dq, float *dk, float *dv, const float *dout, const float *out,
                       const float *lse, const float *q, const float *k, const float *v, int B,
                       int S, int Hq, int Hkv, int D, int q_first, int kv_first, int group) {
  float scale = 1.0f / sqrtf((float)D);
  unsigned tiles = (unsigned)((S + FF_ATTN_TILE - 1) / FF_ATTN_TILE);
  size_t smem_dq = ff_attn_dq_smem(D);
  ff_cuda_allow_shared(attention_bwd_dq_kernel<DL>, smem_dq, "attention_bwd_dq");
  attention_bwd_dq_kernel<DL><<<dim3(tiles, (unsigned)Hq, (unsigned)B), FF_ATTN_WARPS * FF_WARP,
                                smem_dq, ff_cuda_stream()>>>(
      dq, dout, out, lse, q, k, v, S, Hq, Hkv, D, q_first, kv_first, group, scale);
  FF_CUDA_LAUNCHED("attention_bwd_dq");
  if (Hkv <= 0) return;
  size_t smem_kv = ff_attn_dkdv_smem(D);
  ff_cuda_allow_shared(attention_bwd_dkdv_kernel<DL>, smem_kv, "attention_bwd_dkdv");
  attention_bwd_dkdv_kernel<DL><<<dim3(tiles, (unsigned)Hkv, (unsigned)B),
                                  FF_ATTN_WARPS * FF_WARP, smem_kv, ff_cuda_stream()>>>(
      dk, dv, dout, out, lse, q, k, v, S, Hq, Hkv, D, q_first, kv_first, group, scale);
  FF_CUDA_LAUNCHED("attention_bwd_dkdv");
}

extern "C" void ff_cuda_attention_fwd(float *out, float *lse, const float *q, const float *k,
                                      const float *v, int B, int S, int Hq, int Hkv, int D,
                                      int q_first, int kv_first, int group) {
  if (B <= 0 || S <= 0 || Hq <= 0) return;
  check_head_dim(D);
  if (D <= 32) fwd_launch<1>(out, lse, q, k, v, B, S, Hq, Hkv, D, q_first, kv_first, group);
  else if (D <= 64) fwd_launch<2>(out, lse, q, k, v, B, S, Hq, Hkv, D, q_first, kv_first, group);
  else if (D <= 128) fwd_launch<4>(out, lse, q, k, v, B, S, Hq, Hkv, D, q_first, kv_first, group);
  else fwd_launch<8>(out, lse, q, k, v, B, S, Hq, Hkv, D, q_first, kv_first, group);
}

extern "C" void ff_cuda_attention_bwd(float *dq, float *dk, float *dv, const float *dout,
                                      const float *out, const float *lse, const float *q,
                                      const float *k, const float *v, int B, int S, int Hq,
                                      int Hkv, int D, int q_first, int kv_first, int group) {
  if (B <= 0 || S <= 0) return;
  check_head_dim(D);
  if (Hq <= 0) { /* no query head here: the kv gradients are zero */
    size_t bytes = (size_t)B * S * Hkv * D * sizeof(float);
    FF_CUDA_CHECK(cudaMemsetAsync(dk, 0, bytes, ff_cuda_stream()));
    FF_CUDA_CHECK(cudaMemsetAsync(dv, 0, bytes, ff_cuda_stream()));
    return;
  }
#define FF_BWD(DL) \
  bwd_launch<DL>(dq, dk, dv, dout, out, lse, q, k, v, B, S, Hq, Hkv, D, q_first, kv_first, group)
  if (D <= 32) FF_BWD(1);
  else if (D <= 64) FF_BWD(2);
  else if (D <= 128) FF_BWD(4);
  else FF_BWD(8);
#undef FF_BWD
}
