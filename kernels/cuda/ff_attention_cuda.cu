/* ff_attention_cuda.cu — causal attention of the CUDA backend, memory-efficient in the manner of
 * FlashAttention-2 (Dao, 2023): scores are formed a tile of 32 keys at a time in registers and
 * folded into the output with an online softmax, so nothing of size S×S ever reaches HBM. Backward
 * recomputes the probabilities from q, k and the saved log-sum-exp, in two kernels so that
 * neither needs atomics (results are reproducible bit for bit):
 *   dq:     one block per 32 query rows walks the key tiles it can see;
 *   dk, dv: one block per 32 keys walks the query heads that share its kv head, then the query
 *           tiles that can see it, in the same order as the CPU backend sums them.
 * fp32 throughout; a warp owns a query row (forward, dq) or a key (dk, dv) and each lane holds
 * D/32 of its head dimension, so D ≤ 256 (FF_ATTN_MAX_D).
 *
 * Layouts as kernels/ff_kernels.h: q, out, dq (B, S, Hq, D); k, v, dk, dv (B, S, Hkv, D);
 * lse (B, Hq, S). Launch: grid (tiles of S, heads, B), FF_ATTN_WARPS warps per block. */
#include <stdio.h>

#include "../ff_kernels.h"
#include "ff_cuda_common.cuh"

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
  extern __shared__ float smem[];
  float *Qs = smem;                            /* TILE × D      */
  float *Ks = Qs + FF_ATTN_TILE * D;           /* TILE × (D+1)  */
  float *Vs = Ks + FF_ATTN_TILE * (D + 1);     /* TILE × D      */
  int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * FF_ATTN_TILE;
  int hk = (q_first + h) / group - kv_first;
  int lane = threadIdx.x % FF_WARP, warp = threadIdx.x / FF_WARP;
  size_t q_stride = (size_t)Hq * D, kv_stride = (size_t)Hkv * D;
  const float *q_bh = q + (size_t)b * S * q_stride + (size_t)h * D;
  const float *k_bh = k + (size_t)b * S * kv_stride + (size_t)hk * D;
  const float *v_bh = v + (size_t)b * S * kv_stride + (size_t)hk * D;
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

/* Σ_c dout[c] · out[c] of one row, in every lane of the warp */
__device__ static float warp_row_dot(const float *a, const float *b, int D) {
  float s = 0.0f;
  for (int c = threadIdx.x % FF_WARP; c < D; c += FF_WARP) s += a[c] * b[c];
  return ff_warp_sum(s);
}

template <int DL>
__global__ void attention_bwd_dq_kernel(float *dq, const float *dout, const float *out,
                                        const float *lse, const float *q, const float *k,
                                        const float *v, int S, int Hq, int Hkv, int D,
                                        int q_first, int kv_first, int group, float scale) {
  extern __shared__ float smem[];
  float *Qs = smem;                          /* TILE × D     */
  float *dOs = Qs + FF_ATTN_TILE * D;        /* TILE × D     */
  float *Ks = dOs + FF_ATTN_TILE * D;        /* TILE × (D+1) */
  float *Vs = Ks + FF_ATTN_TILE * (D + 1);   /* TILE × (D+1) */
  int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * FF_ATTN_TILE;
  int hk = (q_first + h) / group - kv_first;
  int lane = threadIdx.x % FF_WARP, warp = threadIdx.x / FF_WARP;
  size_t q_stride = (size_t)Hq * D, kv_stride = (size_t)Hkv * D;
  size_t q_off = (size_t)b * S * q_stride + (size_t)h * D;
  const float *k_bh = k + (size_t)b * S * kv_stride + (size_t)hk * D;
  const float *v_bh = v + (size_t)b * S * kv_stride + (size_t)hk * D;
  load_tile(Qs, D, q + q_off, q_stride, q0, S, D);
  load_tile(dOs, D, dout + q_off, q_stride, q0, S, D);

  float acc[FF_ATTN_ROWS_PER_WARP][DL], row_lse[FF_ATTN_ROWS_PER_WARP];
  float dout_out[FF_ATTN_ROWS_PER_WARP];
  for (int i = 0; i < FF_ATTN_ROWS_PER_WARP; i++) {
    int t = q0 + warp + i * FF_ATTN_WARPS;
    for (int e = 0; e < DL; e++) acc[i][e] = 0.0f;
    row_lse[i] = t < S ? lse[((size_t)b * Hq + h) * S + t] : 0.0f;
    dout_out[i] = t < S ? warp_row_dot(dout + q_off + (size_t)t * q_stride,
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
  extern __shared__ float smem[];
  float *Ks = smem;                           /* TILE × D     */
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
    if ((q_first + h) / group - kv_first != hk) continue;
    size_t q_off = (size_t)b * S * q_stride + (size_t)h * D;
    for (int i0 = k0; i0 < S; i0 += FF_ATTN_TILE) {
      __syncthreads();
      load_tile(Qs, D + 1, q + q_off, q_stride, i0, S, D);
      load_tile(dOs, D + 1, dout + q_off, q_stride, i0, S, D);
      for (int r = warp; r < FF_ATTN_TILE; r += FF_ATTN_WARPS) {
        int t = i0 + r;
        float d = t < S ? warp_row_dot(dout + q_off + (size_t)t * q_stride,
                                       out + q_off + (size_t)t * q_stride, D)
                        : 0.0f;
        if (lane == 0) {
          dot_s[r] = d;
          lse_s[r] = t < S ? lse[((size_t)b * Hq + h) * S + t] : 0.0f;
        }
      }
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

/* ---- launchers -------------------------------------------------------------------------- */

/* Kernels above 48 KiB of shared memory must say so before their launch. */
template <typename Kernel>
static void allow_shared(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    FF_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)bytes));
}

static void check_head_dim(int D) {
  if (D < 1 || D > FF_ATTN_MAX_D) {
    char why[96];
    snprintf(why, sizeof why, "head dimension %d is outside the attention kernel's 1..%d", D,
             FF_ATTN_MAX_D);
    ff_cuda_fatal(__FILE__, __LINE__, "attention", why);
  }
}

/* Every local query head must map to a local kv head: a bad shard would read outside k and v. */
static void check_gqa(int Hq, int Hkv, int q_first, int kv_first, int group) {
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
  size_t smem = (size_t)FF_ATTN_TILE * (3 * D + 1) * sizeof(float);
  allow_shared(attention_fwd_kernel<DL>, smem);
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
  size_t smem_dq = (size_t)FF_ATTN_TILE * (4 * D + 2) * sizeof(float);
  allow_shared(attention_bwd_dq_kernel<DL>, smem_dq);
  attention_bwd_dq_kernel<DL><<<dim3(tiles, (unsigned)Hq, (unsigned)B), FF_ATTN_WARPS * FF_WARP,
                                smem_dq, ff_cuda_stream()>>>(
      dq, dout, out, lse, q, k, v, S, Hq, Hkv, D, q_first, kv_first, group, scale);
  FF_CUDA_LAUNCHED("attention_bwd_dq");
  if (Hkv <= 0) return;
  size_t smem_kv = (size_t)FF_ATTN_TILE * (4 * D + 4) * sizeof(float);
  allow_shared(attention_bwd_dkdv_kernel<DL>, smem_kv);
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
  check_gqa(Hq, Hkv, q_first, kv_first, group);
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
  check_gqa(Hq, Hkv, q_first, kv_first, group);
#define FF_BWD(DL) \
  bwd_launch<DL>(dq, dk, dv, dout, out, lse, q, k, v, B, S, Hq, Hkv, D, q_first, kv_first, group)
  if (D <= 32) FF_BWD(1);
  else if (D <= 64) FF_BWD(2);
  else if (D <= 128) FF_BWD(4);
  else FF_BWD(8);
#undef FF_BWD
}
