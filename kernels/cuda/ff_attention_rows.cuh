/* ff_attention_rows.cuh — what the attention kernels share (the fused fp32 ones of
 * ff_attention_kernels.cuh and the tensor-core ones of ff_attention_tc_kernels.cuh): where a
 * head's rows are, and the per-row statistics of the backward. It needs only FF_WARP and
 * ff_warp_sum, so the CPU emulation of the kernels (tests/emu) uses it as it is. */
#ifndef FF_ATTENTION_ROWS_CUH
#define FF_ATTENTION_ROWS_CUH

#include <stddef.h>

#include "ff_cuda_device.cuh"

/* Where batch b's query head h (local) and its kv head hk (local) are: row t of the head in q,
 * out, dq and dout starts at q_off + t·q_stride, of the kv head in k, v, dk and dv at
 * kv_off + t·kv_stride. */
struct ff_attn_head {
  size_t q_stride, kv_stride, q_off, kv_off;
};

__device__ static ff_attn_head ff_attn_head_at(int b, int h, int hk, int S, int Hq, int Hkv,
                                              int D) {
  ff_attn_head a;
  a.q_stride = (size_t)Hq * D;
  a.kv_stride = (size_t)Hkv * D;
  a.q_off = (size_t)b * S * a.q_stride + (size_t)h * D;
  a.kv_off = (size_t)b * S * a.kv_stride + (size_t)hk * D;
  return a;
}

/* The local kv head of local query head h: query heads [q_first, ...) of the model share kv
 * heads in groups of `group`, and this shard's kv heads start at kv_first. */
__device__ static int ff_attn_kv_head(int h, int q_first, int kv_first, int group) {
  return (q_first + h) / group - kv_first;
}

/* Σ_c a[c]·b[c] over one row of D values (b fp32 or bf16), in every lane of the warp. */
template <typename T>
__device__ static float ff_attn_row_dot(const float *a, const T *b, int D) {
  float s = 0.0f;
  for (int c = threadIdx.x % FF_WARP; c < D; c += FF_WARP) s += a[c] * ff_load(&b[c]);
  return ff_warp_sum(s);
}

/* For the `rows` query rows from i0 of one head (q_off: the head's first element in q, out,
 * dout; lse_head: its first in lse), the warps of the block taking every warps-th row:
 * delta[r] = Σ dout∘out over the row and lse_s[r] its log-sum-exp, both 0 past S. out is fp32
 * or bf16. */
template <typename T>
__device__ static void ff_attn_row_stats(float *delta, float *lse_s, int rows, int warps,
                                         const float *dout, const T *out, const float *lse,
                                         size_t q_off, size_t q_stride, size_t lse_head, int i0,
                                         int S, int D) {
  int lane = threadIdx.x % FF_WARP;
  for (int r = threadIdx.x / FF_WARP; r < rows; r += warps) {
    int t = i0 + r;
    size_t at = q_off + (size_t)t * q_stride;
    float d = t < S ? ff_attn_row_dot(dout + at, out + at, D) : 0.0f;
    if (lane == 0) {
      delta[r] = d;
      lse_s[r] = t < S ? lse[lse_head + t] : 0.0f;
    }
  }
}

#endif
