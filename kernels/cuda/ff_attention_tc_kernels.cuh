/* ff_attention_tc_kernels.cuh — causal attention on bf16 tensor cores with fp32 accumulation, the
 * memory-efficient scheme of FlashAttention-2 (Dao, 2023) with its products done by WMMA: the
 * alternative to ff_attention_cuda.cu's fp32 kernel that FF_ATTENTION=tensor selects under bf16
 * math, for head dimensions D that are multiples of 16 up to 128.
 *
 * A block of four warps takes 64 query rows (forward, dq) or 64 keys (dk, dv); each warp owns 16
 * of them. q, k, v and dout are read in fp32 and rounded to bf16 as they enter shared memory.
 * Forward, per tile of 64 keys: S = Q·Kᵀ (fp32, shared memory), the online softmax turns a
 * warp's rows into bf16 probabilities P (rescaling the rows of the fp32 output O, held in
 * accumulator fragments, whose max grew), and O += P·V; at the end O is divided by the row sums
 * and lse = max + log Σ exp is kept, as by the fp32 kernel. Backward recomputes P from q, k and
 * lse:
 *   dq:     per query tile, over the key tiles it sees: dP = dO·Vᵀ, dS = P∘(dP − Δ)·scale
 *           (Δ = rowsum(dO∘O)), dQ += dS·K, the accumulators held in registers;
 *   dk, dv: per key tile, over the query heads that share its kv head and the query tiles that
 *           see it: Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ, then dV += Pᵀ·dO and dK += dSᵀ·Q.
 * No atomics, so a run repeats bit for bit. WMMA's fragments are only ever loaded from and stored
 * to shared memory, so nothing depends on how a fragment spreads over the lanes.
 *
 * The kernels are here and their launchers in ff_attention_tc_cuda.cu, so that
 * tests/unit/test_cuda_emulated.cc can run these same kernels on the CPU, a thread per CUDA
 * thread, against the CPU backend.
 *
 * Layouts as kernels/ff_kernels.h: q, out, dq, dout (B, S, Hq, D); k, v, dk, dv (B, S, Hkv, D);
 * lse (B, Hq, S). Shared-memory rows are padded (bf16 by 8, fp32 by 4 elements) so that every
 * fragment starts 32-byte aligned and rows do not all fall in the same banks. */
#ifndef FF_ATTENTION_TC_KERNELS_CUH
#define FF_ATTENTION_TC_KERNELS_CUH

#include <cuda_bf16.h>
#include <mma.h>
#include <stddef.h>

#include "ff_attention_rows.cuh"
#include "ff_cuda_device.cuh"

using namespace nvcuda;

enum {
  TC_TILE = 64, /* query rows or keys per block and per inner tile */
  TC_WARPS = 4, /* 16 rows each */
  TC_THREADS = TC_WARPS * FF_WARP,
  TC_MAX_D = 128,
  TC_LDS = TC_TILE + 4, /* fp32 score tiles */
  TC_LDP = TC_TILE + 8, /* bf16 probability tiles */
};

typedef __nv_bfloat16 bf16;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> frag_a;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> frag_b;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> frag_bt;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> frag_c;

/* Rows [first, first + TILE) of a (S, stride) fp32 or bf16 matrix's D columns, rounded to
 * bf16 (exact for bf16), into a tile of row pitch ld; rows at or past S are zero. */
template <typename T>
__device__ static void load_bf16(bf16 *tile, int ld, const T *src, size_t stride, int first,
                                 int S, int D) {
  for (int idx = threadIdx.x; idx < TC_TILE * D; idx += blockDim.x) {
    int r = idx / D, c = idx % D, row = first + r;
    tile[r * ld + c] =
        __float2bfloat16_rn(row < S ? ff_load(&src[(size_t)row * stride + c]) : 0.0f);
  }
}

/* C (16 × 64, fp32, pitch ldc) = A · Bᵀ, where A is 16 rows and B 64 rows of 16·KT bf16 columns
 * (pitches lda, ldb): one warp's rows of a score tile. */
template <int KT>
__device__ static void warp_abt(float *c, int ldc, const bf16 *a, int lda, const bf16 *b,
                                int ldb) {
  for (int n = 0; n < TC_TILE / 16; n++) {
    frag_c acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int kk = 0; kk < KT; kk++) {
      frag_a fa;
      frag_bt fb; /* Bᵀ's 16 × 16 block (kk, n): B's rows 16n.., columns 16kk.., column-major */
      wmma::load_matrix_sync(fa, a + kk * 16, lda);
      wmma::load_matrix_sync(fb, b + (size_t)n * 16 * ldb + kk * 16, ldb);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(c + n * 16, acc, ldc, wmma::mem_row_major);
  }
}

/* acc[n] += A · B for n < NT: A is 16 × 64 bf16 (pitch lda), B 64 × 16·NT bf16 (pitch ldb). */
template <int NT>
__device__ static void warp_ab(frag_c *acc, const bf16 *a, int lda, const bf16 *b, int ldb) {
  for (int kk = 0; kk < TC_TILE / 16; kk++) {
    frag_a fa;
    wmma::load_matrix_sync(fa, a + kk * 16, lda);
    for (int n = 0; n < NT; n++) {
      frag_b fb;
      wmma::load_matrix_sync(fb, b + (size_t)kk * 16 * ldb + n * 16, ldb);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
}

/* ---- forward ---------------------------------------------------------------------------- */

/* D = 16·DT; TI: the type of q, k, v (fp32 or bf16), TO: of out */
template <int DT, typename TI = float, typename TO = float>
__global__ void __launch_bounds__(TC_THREADS)
    tc_fwd_kernel(TO *out, float *lse, const TI *q, const TI *k, const TI *v, int S, int Hq,
                  int Hkv, int q_first, int kv_first, int group, float scale) {
  constexpr int D = 16 * DT, LDH = D + 8, LDO = D + 4;
  FF_DYNAMIC_SHARED(smem, 128);
  bf16 *Qs = (bf16 *)smem;                     /* TILE × LDH */
  bf16 *Ks = Qs + TC_TILE * LDH;               /* TILE × LDH */
  bf16 *Vs = Ks + TC_TILE * LDH;               /* TILE × LDH */
  float *Ss = (float *)(Vs + TC_TILE * LDH);   /* TILE × LDS: scores */
  float *Os = Ss + TC_TILE * TC_LDS;           /* TILE × LDO: the output, unnormalised */
  bf16 *Ps = (bf16 *)(Os + TC_TILE * LDO);     /* TILE × LDP: probabilities */
  int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * TC_TILE;
  int lane = threadIdx.x % FF_WARP, warp = threadIdx.x / FF_WARP;
  int hk = ff_attn_kv_head(h, q_first, kv_first, group);
  ff_attn_head a = ff_attn_head_at(b, h, hk, S, Hq, Hkv, D);
  size_t q_stride = a.q_stride, kv_stride = a.kv_stride;
  const TI *q_bh = q + a.q_off, *k_bh = k + a.kv_off, *v_bh = v + a.kv_off;
  load_bf16(Qs, LDH, q_bh, q_stride, q0, S, D);

  /* two lanes per row: this lane's row r of the tile; the pair takes alternate columns (half,
   * half + 2, ...), so that the warp's 16 rows read at once fall in at most two-way conflicts */
  int r = warp * 16 + lane / 2, half = lane % 2, t = q0 + r;
  float m = -INFINITY, l = 0.0f;
  float *s_row = Ss + r * TC_LDS, *o_row = Os + r * LDO;
  bf16 *p_row = Ps + r * TC_LDP;
  float *o_warp = Os + warp * 16 * LDO;
  frag_c acc[DT]; /* the warp's 16 rows of the output, unnormalised */
  for (int n = 0; n < DT; n++) wmma::fill_fragment(acc[n], 0.0f);
  int q_last = min(S, q0 + TC_TILE) - 1;
  for (int j0 = 0; j0 <= q_last; j0 += TC_TILE) {
    __syncthreads(); /* the previous K, V are no longer read (and Q is in place) */
    load_bf16(Ks, LDH, k_bh, kv_stride, j0, S, D);
    load_bf16(Vs, LDH, v_bh, kv_stride, j0, S, D);
    __syncthreads();
    warp_abt<DT>(Ss + warp * 16 * TC_LDS, TC_LDS, Qs + warp * 16 * LDH, LDH, Ks, LDH);
    __syncwarp();
    float mx = -INFINITY;
    for (int c = half; c < TC_TILE; c += 2)
      if (j0 + c <= t && t < S) mx = fmaxf(mx, s_row[c] * scale);
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    float m_new = fmaxf(m, mx);
    float alpha = m_new == -INFINITY ? 1.0f : expf(m - m_new); /* 0 on the first tile */
    float sum = 0.0f;
    for (int c = half; c < TC_TILE; c += 2) {
      float p = j0 + c <= t && t < S ? expf(s_row[c] * scale - m_new) : 0.0f;
      p_row[c] = __float2bfloat16_rn(p);
      sum += p;
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = l * alpha + sum;
    m = m_new;
    /* Rows whose max grew scale their output by alpha, through shared memory (a fragment's rows
     * are not addressable); a tile that moves no max in the warp, the usual case once the
     * largest scores have been seen, skips the round trip, and so does the first (all zero). */
    if (__any_sync(0xffffffffu, alpha != 1.0f) && j0 > 0) {
      for (int n = 0; n < DT; n++)
        wmma::store_matrix_sync(o_warp + n * 16, acc[n], LDO, wmma::mem_row_major);
      __syncwarp();
      for (int c = half; c < D; c += 2) o_row[c] *= alpha;
      __syncwarp();
      for (int n = 0; n < DT; n++)
        wmma::load_matrix_sync(acc[n], o_warp + n * 16, LDO, wmma::mem_row_major);
    }
    __syncwarp(); /* the warp's probabilities are written */
    warp_ab<DT>(acc, Ps + warp * 16 * TC_LDP, TC_LDP, Vs, LDH);
  }
  for (int n = 0; n < DT; n++)
    wmma::store_matrix_sync(o_warp + n * 16, acc[n], LDO, wmma::mem_row_major);
  __syncwarp();
  if (t < S) {
    float inv_l = 1.0f / l;
    TO *o = out + ((size_t)b * S + t) * q_stride + (size_t)h * D;
    for (int c = half; c < D; c += 2) ff_store(&o[c], o_row[c] * inv_l);
    if (half == 0) lse[((size_t)b * Hq + h) * S + t] = m + logf(l);
  }
}

/* ---- backward: dq ----------------------------------------------------------------------- */

/* TI: the type of out, q, k, v (fp32 or bf16) */
template <int DT, typename TI = float>
__global__ void __launch_bounds__(TC_THREADS)
    tc_bwd_dq_kernel(float *dq, const float *dout, const TI *out, const float *lse, const TI *q,
                     const TI *k, const TI *v, int S, int Hq, int Hkv, int q_first, int kv_first,
                     int group, float scale) {
  constexpr int D = 16 * DT, LDH = D + 8, LDO = D + 4;
  FF_DYNAMIC_SHARED(smem, 128);
  bf16 *Qs = (bf16 *)smem;                     /* TILE × LDH */
  bf16 *dOs = Qs + TC_TILE * LDH;              /* TILE × LDH */
  bf16 *Ks = dOs + TC_TILE * LDH;              /* TILE × LDH */
  bf16 *Vs = Ks + TC_TILE * LDH;               /* TILE × LDH */
  float *Ss = (float *)(Vs + TC_TILE * LDH);   /* TILE × LDS: scores */
  float *dPs = Ss + TC_TILE * TC_LDS;          /* TILE × LDS: dO·Vᵀ */
  bf16 *dSs = (bf16 *)(dPs + TC_TILE * TC_LDS); /* TILE × LDP */
  float *lse_s = (float *)(dSs + TC_TILE * TC_LDP), *delta_s = lse_s + TC_TILE;
  int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * TC_TILE;
  int lane = threadIdx.x % FF_WARP, warp = threadIdx.x / FF_WARP;
  int hk = ff_attn_kv_head(h, q_first, kv_first, group);
  ff_attn_head a = ff_attn_head_at(b, h, hk, S, Hq, Hkv, D);
  size_t q_stride = a.q_stride, kv_stride = a.kv_stride, q_off = a.q_off;
  const TI *k_bh = k + a.kv_off, *v_bh = v + a.kv_off;
  load_bf16(Qs, LDH, q + q_off, q_stride, q0, S, D);
  load_bf16(dOs, LDH, dout + q_off, q_stride, q0, S, D);
  ff_attn_row_stats(delta_s, lse_s, TC_TILE, TC_WARPS, dout, out, lse, q_off, q_stride,
                    ((size_t)b * Hq + h) * S, q0, S, D);

  int r = warp * 16 + lane / 2, half = lane % 2, t = q0 + r;
  frag_c acc[DT];
  for (int n = 0; n < DT; n++) wmma::fill_fragment(acc[n], 0.0f);
  int q_last = min(S, q0 + TC_TILE) - 1;
  for (int j0 = 0; j0 <= q_last; j0 += TC_TILE) {
    __syncthreads();
    load_bf16(Ks, LDH, k_bh, kv_stride, j0, S, D);
    load_bf16(Vs, LDH, v_bh, kv_stride, j0, S, D);
    __syncthreads();
    warp_abt<DT>(Ss + warp * 16 * TC_LDS, TC_LDS, Qs + warp * 16 * LDH, LDH, Ks, LDH);
    warp_abt<DT>(dPs + warp * 16 * TC_LDS, TC_LDS, dOs + warp * 16 * LDH, LDH, Vs, LDH);
    __syncwarp();
    const float *s_row = Ss + r * TC_LDS, *dp_row = dPs + r * TC_LDS;
    bf16 *ds_row = dSs + r * TC_LDP;
    for (int c = half; c < TC_TILE; c += 2) { /* alternate columns, as in the forward */
      float ds = 0.0f;
      if (j0 + c <= t && t < S) {
        float p = expf(s_row[c] * scale - lse_s[r]);
        ds = p * (dp_row[c] - delta_s[r]) * scale;
      }
      ds_row[c] = __float2bfloat16_rn(ds);
    }
    __syncwarp();
    warp_ab<DT>(acc, dSs + warp * 16 * TC_LDP, TC_LDP, Ks, LDH);
  }
  __syncthreads(); /* every warp is done with K and V: their space takes dQ */
  float *dQs = (float *)Ks; /* TILE × LDO */
  for (int n = 0; n < DT; n++)
    wmma::store_matrix_sync(dQs + warp * 16 * LDO + n * 16, acc[n], LDO, wmma::mem_row_major);
  __syncwarp();
  if (t < S) {
    float *row = dq + q_off + (size_t)t * q_stride;
    const float *src = dQs + r * LDO;
    for (int c = half; c < D; c += 2) row[c] = src[c];
  }
}

/* ---- backward: dk, dv ------------------------------------------------------------------- */

template <int DT, typename TI = float>
__global__ void __launch_bounds__(TC_THREADS)
    tc_bwd_dkdv_kernel(float *dk, float *dv, const float *dout, const TI *out, const float *lse,
                       const TI *q, const TI *k, const TI *v, int S, int Hq, int Hkv,
                       int q_first, int kv_first, int group, float scale) {
  constexpr int D = 16 * DT, LDH = D + 8, LDO = D + 4;
  FF_DYNAMIC_SHARED(smem, 128);
  bf16 *Ks = (bf16 *)smem;                     /* TILE × LDH */
  bf16 *Vs = Ks + TC_TILE * LDH;               /* TILE × LDH */
  bf16 *Qs = Vs + TC_TILE * LDH;               /* TILE × LDH */
  bf16 *dOs = Qs + TC_TILE * LDH;              /* TILE × LDH */
  float *Ss = (float *)(dOs + TC_TILE * LDH);  /* TILE × LDS: Sᵀ, keys by queries */
  float *dPs = Ss + TC_TILE * TC_LDS;          /* TILE × LDS: dPᵀ */
  bf16 *Ps = (bf16 *)(dPs + TC_TILE * TC_LDS); /* TILE × LDP: Pᵀ */
  bf16 *dSs = Ps + TC_TILE * TC_LDP;           /* TILE × LDP: dSᵀ */
  float *lse_s = (float *)(dSs + TC_TILE * TC_LDP), *delta_s = lse_s + TC_TILE;
  int b = blockIdx.z, hk = blockIdx.y, k0 = blockIdx.x * TC_TILE;
  int lane = threadIdx.x % FF_WARP, warp = threadIdx.x / FF_WARP;
  size_t q_stride = (size_t)Hq * D, kv_stride = (size_t)Hkv * D;
  size_t kv_off = (size_t)b * S * kv_stride + (size_t)hk * D;
  load_bf16(Ks, LDH, k + kv_off, kv_stride, k0, S, D);
  load_bf16(Vs, LDH, v + kv_off, kv_stride, k0, S, D);

  int r = warp * 16 + lane / 2, half = lane % 2, j = k0 + r; /* this lane's key */
  frag_c dk_acc[DT], dv_acc[DT];
  for (int n = 0; n < DT; n++) {
    wmma::fill_fragment(dk_acc[n], 0.0f);
    wmma::fill_fragment(dv_acc[n], 0.0f);
  }
  for (int h = 0; h < Hq; h++) {
    if (ff_attn_kv_head(h, q_first, kv_first, group) != hk) continue;
    size_t q_off = (size_t)b * S * q_stride + (size_t)h * D;
    for (int i0 = k0; i0 < S; i0 += TC_TILE) { /* earlier query tiles see none of these keys */
      __syncthreads(); /* the previous Q, dO and row statistics are no longer read */
      load_bf16(Qs, LDH, q + q_off, q_stride, i0, S, D);
      load_bf16(dOs, LDH, dout + q_off, q_stride, i0, S, D);
      ff_attn_row_stats(delta_s, lse_s, TC_TILE, TC_WARPS, dout, out, lse, q_off, q_stride,
                        ((size_t)b * Hq + h) * S, i0, S, D);
      __syncthreads();
      warp_abt<DT>(Ss + warp * 16 * TC_LDS, TC_LDS, Ks + warp * 16 * LDH, LDH, Qs, LDH);
      warp_abt<DT>(dPs + warp * 16 * TC_LDS, TC_LDS, Vs + warp * 16 * LDH, LDH, dOs, LDH);
      __syncwarp();
      const float *s_row = Ss + r * TC_LDS, *dp_row = dPs + r * TC_LDS;
      bf16 *p_row = Ps + r * TC_LDP, *ds_row = dSs + r * TC_LDP;
      for (int col = half; col < TC_TILE; col += 2) { /* alternate query columns */
        int t = i0 + col;
        float p = 0.0f, ds = 0.0f;
        if (t >= j && t < S) {
          p = expf(s_row[col] * scale - lse_s[col]);
          ds = p * (dp_row[col] - delta_s[col]) * scale;
        }
        p_row[col] = __float2bfloat16_rn(p);
        ds_row[col] = __float2bfloat16_rn(ds);
      }
      __syncwarp();
      warp_ab<DT>(dv_acc, Ps + warp * 16 * TC_LDP, TC_LDP, dOs, LDH);
      warp_ab<DT>(dk_acc, dSs + warp * 16 * TC_LDP, TC_LDP, Qs, LDH);
    }
  }
  __syncthreads(); /* every warp is done with the tiles: their space takes dK and dV */
  float *dKs = (float *)smem, *dVs = dKs + TC_TILE * LDO; /* TILE × LDO each */
  for (int n = 0; n < DT; n++) {
    wmma::store_matrix_sync(dKs + warp * 16 * LDO + n * 16, dk_acc[n], LDO, wmma::mem_row_major);
    wmma::store_matrix_sync(dVs + warp * 16 * LDO + n * 16, dv_acc[n], LDO, wmma::mem_row_major);
  }
  __syncwarp();
  if (j < S) {
    size_t at = kv_off + (size_t)j * kv_stride;
    const float *src_k = dKs + r * LDO, *src_v = dVs + r * LDO;
    for (int c = half; c < D; c += 2) {
      dk[at + c] = src_k[c];
      dv[at + c] = src_v[c];
    }
  }
}

/* ---- shared memory of each kernel ------------------------------------------------------- */

static inline size_t tc_tiles_bytes(int D, int bf16_tiles, int fp32_tiles, int p_tiles,
                                    int fp32_wide) {
  return (size_t)TC_TILE * ((size_t)bf16_tiles * (D + 8) * sizeof(bf16) +
                            (size_t)fp32_tiles * TC_LDS * sizeof(float) +
                            (size_t)p_tiles * TC_LDP * sizeof(bf16) +
                            (size_t)fp32_wide * (D + 4) * sizeof(float));
}
static inline size_t tc_fwd_smem(int D) { return tc_tiles_bytes(D, 3, 1, 1, 1); }
static inline size_t tc_dq_smem(int D) {
  return tc_tiles_bytes(D, 4, 2, 1, 0) + 2 * TC_TILE * sizeof(float); /* + lse, delta */
}
static inline size_t tc_dkdv_smem(int D) {
  return tc_tiles_bytes(D, 4, 2, 2, 0) + 2 * TC_TILE * sizeof(float);
}

#endif
