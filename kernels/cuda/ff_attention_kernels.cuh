/* ff_attention_kernels.cuh — causal attention of the CUDA backend, memory-efficient in the
 * manner of FlashAttention-2 (Dao, 2023): scores are formed a tile of 32 keys at a time in
 * registers and folded into the output with an online softmax, so nothing of size S×S ever
 * reaches HBM. Backward recomputes the probabilities from q, k and the saved log-sum-exp, in two
 * kernels so that neither needs atomics (results are reproducible bit for bit):
 *   dq:     one block per 32 query rows walks the key tiles it can see;
 *   dk, dv: one block per 32 keys walks the query heads that share its kv head, then the query
 *           tiles that can see it, in the same order as the CPU backend sums them.
 * fp32 throughout; a warp owns a query row (forward, dq) or a key (dk, dv) and each lane holds
 * D/32 of its head dimension, so D ≤ 256 (FF_ATTN_MAX_D).
 *
 * Layouts as kernels/ff_kernels.h: q, out, dq (B, S, Hq, D); k, v, dk, dv (B, S, Hkv, D);
 * lse (B, Hq, S). Launch: grid (tiles of S, heads, B), FF_ATTN_WARPS warps per block.
 *
 * The kernels are here and their launchers in ff_attention_cuda.cu, so that
 * tests/unit/test_cuda_emulated.cc can run these same kernels on the CPU. */
#ifndef FF_ATTENTION_KERNELS_CUH
#define FF_ATTENTION_KERNELS_CUH

#include <stddef.h>

#include "ff_attention_rows.cuh"
#include "ff_cuda_device.cuh"

enum {
  FF_ATTN_TILE = 32,   /* query rows or keys per block and per inner tile: one per lane */
  FF_ATTN_WARPS = 8,
  FF_ATTN_ROWS_PER_WARP = FF_ATTN_TILE / FF_ATTN_WARPS,
  FF_ATTN_MAX_D = 256,
};

/* Load rows [first, first + TILE) of a (S, stride) matrix's D columns into a tile with row pitch
 * `pitch` (D, or D + 1 where lanes read along rows: an odd pitch spreads them over the banks).
 * Rows past S read as zero. */
__device__ static void load_tile(float *tile, int pitch, const float *src, size_t stride,
                                 int first, int S, int D) {
  for (int idx = threadIdx.x; idx < FF_ATTN_TILE * D; idx += blockDim.x) {
    int r = idx / D, c = idx % D, row = first + r;
    tile[r * pitch + c] = row < S ? src[(size_t)row * stride + c] : 0.0f;
  }
}

__device__ static float row_dot(const float *a, const float *b, int D) {
  float s = 0.0f;
  for (int c = 0; c < D; c++) s += a[c] * b[c];
  return s;
}

/* ---- forward ---------------------------------------------------------------------------- */

template <int DL>
__global__ void attention_fwd_kernel(float *out, float *lse, const float *q, const float *k,
                                     const float *v, int S, int Hq, int Hkv, int D, int q_first,
                                     int kv_first, int group, float scale) {
  FF_DYNAMIC_SHARED(smem, 16);
  float *Qs = (float *)smem;                   /* TILE × D      */
  float *Ks = Qs + FF_ATTN_TILE * D;           /* TILE × (D+1)  */
  float *Vs = Ks + FF_ATTN_TILE * (D + 1);     /* TILE × D      */
  int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * FF_ATTN_TILE;
  int lane = threadIdx.x % FF_WARP, warp = threadIdx.x / FF_WARP;
  int hk = ff_attn_kv_head(h, q_first, kv_first, group);
  ff_attn_head a = ff_attn_head_at(b, h, hk, S, Hq, Hkv, D);
  size_t q_stride = a.q_stride, kv_stride = a.kv_stride;
  const float *q_bh = q + a.q_off, *k_bh = k + a.kv_off, *v_bh = v + a.kv_off;
  load_tile(Qs, D, q_bh, q_stride, q0, S, D);

  float acc[FF_ATTN_ROWS_PER_WARP][DL], m[FF_ATTN_ROWS_PER_WARP], l[FF_ATTN_ROWS_PER_WARP];
  for (int i = 0; i < FF_ATTN_ROWS_PER_WARP; i++) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
    for (int e = 0; e < DL; e++) acc[i][e] = 0.0f;
  }
  int q_last = min(S, q0 + FF_ATTN_TILE) - 1;
  for (int j0 = 0; j0 <= q_last; j0 += FF_ATTN_TILE) {
    __syncthreads(); /* the previous tile is no longer read */
    load_tile(Ks, D + 1, k_bh, kv_stride, j0, S, D);
    load_tile(Vs, D, v_bh, kv_stride, j0, S, D);
    __syncthreads();
    for (int i = 0; i < FF_ATTN_ROWS_PER_WARP; i++) {
      int r = warp + i * FF_ATTN_WARPS, t = q0 + r; /* interleaved: causal work evens out */
      if (t >= S || j0 > t) continue;                /* the same for the whole warp */
      int j = j0 + lane;
      float s = j <= t ? row_dot(Qs + r * D, Ks + lane * (D + 1), D) * scale : -INFINITY;
      float m_new = fmaxf(m[i], ff_warp_max(s));
      float p = j <= t ? expf(s - m_new) : 0.0f;
      float rescale = expf(m[i] - m_new); /* 0 on the first tile: m = -inf */
      l[i] = l[i] * rescale + ff_warp_sum(p);
      m[i] = m_new;
      for (int e = 0; e < DL; e++) acc[i][e] *= rescale;
      int valid = min(FF_ATTN_TILE, t - j0 + 1);
      for (int jj = 0; jj < valid; jj++) {
        float pj = __shfl_sync(0xffffffffu, p, jj);
        for (int e = 0; e < DL; e++) {
          int c = lane + FF_WARP * e;
          if (c < D) acc[i][e] += pj * Vs[jj * D + c];
        }
      }
    }
  }
  for (int i = 0; i < FF_ATTN_ROWS_PER_WARP; i++) {
    int t = q0 + warp + i * FF_ATTN_WARPS;
    if (t >= S) continue;
    float inv_l = 1.0f / l[i];
    float *o = out + (size_t)b * S * q_stride + (size_t)t * q_stride + (size_t)h * D;
    for (int e = 0; e < DL; e++) {
      int c = lane + FF_WARP * e;
      if (c < D) o[c] = acc[i][e] * inv_l;
    }
    if (lane == 0) lse[((size_t)b * Hq + h) * S + t] = m[i] + logf(l[i]);
  }
}

/* ---- backward: dq ----------------------------------------------------------------------- */

template <int DL>
__global__ void attention_bwd_dq_kernel(float *dq, const float *dout, const float *out,
                                        const float *lse, const float *q, const float *k,
                                        const float *v, int S, int Hq, int Hkv, int D,
                                        int q_first, int kv_first, int group, float scale) {
  FF_DYNAMIC_SHARED(smem, 16);
  float *Qs = (float *)smem;                 /* TILE × D     */
  float *dOs = Qs + FF_ATTN_TILE * D;        /* TILE × D     */
  float *Ks = dOs + FF_ATTN_TILE * D;        /* TILE × (D+1) */
  float *Vs = Ks + FF_ATTN_TILE * (D + 1);   /* TILE × (D+1) */
  int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * FF_ATTN_TILE;
  int lane = threadIdx.x % FF_WARP, warp = threadIdx.x / FF_WARP;
  int hk = ff_attn_kv_head(h, q_first, kv_first, group);
  ff_attn_head a = ff_attn_head_at(b, h, hk, S, Hq, Hkv, D);
  size_t q_stride = a.q_stride, kv_stride = a.kv_stride, q_off = a.q_off;
  const float *k_bh = k + a.kv_off, *v_bh = v + a.kv_off;
  load_tile(Qs, D, q + q_off, q_stride, q0, S, D);
  load_tile(dOs, D, dout + q_off, q_stride, q0, S, D);

  float acc[FF_ATTN_ROWS_PER_WARP][DL], row_lse[FF_ATTN_ROWS_PER_WARP];
  float dout_out[FF_ATTN_ROWS_PER_WARP];
  for (int i = 0; i < FF_ATTN_ROWS_PER_WARP; i++) {
    int t = q0 + warp + i * FF_ATTN_WARPS;
    for (int e = 0; e < DL; e++) acc[i][e] = 0.0f;
    row_lse[i] = t < S ? lse[((size_t)b * Hq + h) * S + t] : 0.0f;
    dout_out[i] = t < S ? ff_attn_row_dot(dout + q_off + (size_t)t * q_stride,
                                       out + q_off + (size_t)t * q_stride, D)
                        : 0.0f;
  }
  int q_last = min(S, q0 + FF_ATTN_TILE) - 1;
  for (int j0 = 0; j0 <= q_last; j0 += FF_ATTN_TILE) {
    __syncthreads();
    load_tile(Ks, D + 1, k_bh, kv_stride, j0, S, D);
    load_tile(Vs, D + 1, v_bh, kv_stride, j0, S, D);
    __syncthreads();
    for (int i = 0; i < FF_ATTN_ROWS_PER_WARP; i++) {
      int r = warp + i * FF_ATTN_WARPS, t = q0 + r;
      if (t >= S || j0 > t) continue;
      int j = j0 + lane;
      float ds = 0.0f;
      if (j <= t) {
        float p = expf(row_dot(Qs + r * D, Ks + lane * (D + 1), D) * scale - row_lse[i]);
        ds = p * (row_dot(dOs + r * D, Vs + lane * (D + 1), D) - dout_out[i]) * scale;
      }
      int valid = min(FF_ATTN_TILE, t - j0 + 1);
      for (int jj = 0; jj < valid; jj++) {
        float dsj = __shfl_sync(0xffffffffu, ds, jj);
        for (int e = 0; e < DL; e++) {
          int c = lane + FF_WARP * e;
          if (c < D) acc[i][e] += dsj * Ks[jj * (D + 1) + c];
        }
      }
    }
  }
  for (int i = 0; i < FF_ATTN_ROWS_PER_WARP; i++) {
    int t = q0 + warp + i * FF_ATTN_WARPS;
    if (t >= S) continue;
    float *row = dq + q_off + (size_t)t * q_stride;
    for (int e = 0; e < DL; e++) {
      int c = lane + FF_WARP * e;
      if (c < D) row[c] = acc[i][e];
    }
  }
}

/* ---- backward: dk, dv ------------------------------------------------------------------- */

template <int DL>
__global__ void attention_bwd_dkdv_kernel(float *dk, float *dv, const float *dout,
                                          const float *out, const float *lse, const float *q,
                                          const float *k, const float *v, int S, int Hq, int Hkv,
                                          int D, int q_first, int kv_first, int group,
                                          float scale) {
  FF_DYNAMIC_SHARED(smem, 16);
  float *Ks = (float *)smem;                  /* TILE × D     */
  float *Vs = Ks + FF_ATTN_TILE * D;          /* TILE × D     */
  float *Qs = Vs + FF_ATTN_TILE * D;          /* TILE × (D+1) */
  float *dOs = Qs + FF_ATTN_TILE * (D + 1);   /* TILE × (D+1) */
  float *lse_s = dOs + FF_ATTN_TILE * (D + 1);
  float *dot_s = lse_s + FF_ATTN_TILE;
  int b = blockIdx.z, hk = blockIdx.y, k0 = blockIdx.x * FF_ATTN_TILE;
  int lane = threadIdx.x % FF_WARP, warp = threadIdx.x / FF_WARP;
  size_t q_stride = (size_t)Hq * D, kv_stride = (size_t)Hkv * D;
  size_t kv_off = (size_t)b * S * kv_stride + (size_t)hk * D;
  load_tile(Ks, D, k + kv_off, kv_stride, k0, S, D);
  load_tile(Vs, D, v + kv_off, kv_stride, k0, S, D);

  float dk_acc[FF_ATTN_ROWS_PER_WARP][DL], dv_acc[FF_ATTN_ROWS_PER_WARP][DL];
  for (int i = 0; i < FF_ATTN_ROWS_PER_WARP; i++)
    for (int e = 0; e < DL; e++) dk_acc[i][e] = dv_acc[i][e] = 0.0f;
  for (int h = 0; h < Hq; h++) {
    if (ff_attn_kv_head(h, q_first, kv_first, group) != hk) continue;
    size_t q_off = (size_t)b * S * q_stride + (size_t)h * D;
    for (int i0 = k0; i0 < S; i0 += FF_ATTN_TILE) {
      __syncthreads();
      load_tile(Qs, D + 1, q + q_off, q_stride, i0, S, D);
      load_tile(dOs, D + 1, dout + q_off, q_stride, i0, S, D);
      ff_attn_row_stats(dot_s, lse_s, FF_ATTN_TILE, FF_ATTN_WARPS, dout, out, lse, q_off,
                        q_stride, ((size_t)b * Hq + h) * S, i0, S, D);
      __syncthreads();
      for (int kk = 0; kk < FF_ATTN_ROWS_PER_WARP; kk++) {
        int jl = warp + kk * FF_ATTN_WARPS, j = k0 + jl;
        if (j >= S) continue;
        int t = i0 + lane; /* this lane's query row */
        float p = 0.0f, ds = 0.0f;
        if (t < S && t >= j) {
          p = expf(row_dot(Qs + lane * (D + 1), Ks + jl * D, D) * scale - lse_s[lane]);
          ds = p * (row_dot(dOs + lane * (D + 1), Vs + jl * D, D) - dot_s[lane]) * scale;
        }
        for (int ii = 0; ii < FF_ATTN_TILE; ii++) {
          float pi = __shfl_sync(0xffffffffu, p, ii), dsi = __shfl_sync(0xffffffffu, ds, ii);
          for (int e = 0; e < DL; e++) {
            int c = lane + FF_WARP * e;
            if (c < D) {
              dv_acc[kk][e] += pi * dOs[ii * (D + 1) + c];
              dk_acc[kk][e] += dsi * Qs[ii * (D + 1) + c];
            }
          }
        }
      }
    }
  }
  for (int kk = 0; kk < FF_ATTN_ROWS_PER_WARP; kk++) {
    int j = k0 + warp + kk * FF_ATTN_WARPS;
    if (j >= S) continue;
    for (int e = 0; e < DL; e++) {
      int c = lane + FF_WARP * e;
      if (c < D) {
        dk[kv_off + (size_t)j * kv_stride + c] = dk_acc[kk][e];
        dv[kv_off + (size_t)j * kv_stride + c] = dv_acc[kk][e];
      }
    }
  }
}

/* ---- shared memory of each kernel ------------------------------------------------------- */

static inline size_t ff_attn_fwd_smem(int D) { /* Q, K (padded), V */
  return (size_t)FF_ATTN_TILE * (3 * D + 1) * sizeof(float);
}
static inline size_t ff_attn_dq_smem(int D) { /* Q, dO, K and V (padded) */
  return (size_t)FF_ATTN_TILE * (4 * D + 2) * sizeof(float);
}
static inline size_t ff_attn_dkdv_smem(int D) { /* K, V, Q and dO (padded), lse, Σ dO∘O */
  return (size_t)FF_ATTN_TILE * (4 * D + 4) * sizeof(float);
}

#endif
