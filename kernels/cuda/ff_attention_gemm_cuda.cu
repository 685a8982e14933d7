/* ff_attention_gemm_cuda.cu — causal attention through cuBLAS, on tensor cores when the backend's
 * math is bf16: the alternative to ff_attention_cuda.cu's fused fp32 kernel that FF_ATTENTION=gemm
 * selects. Queries go in chunks of R rows; for each chunk and head the scores against the keys
 * the chunk can see, R × (chunk end), are one strided-batched GEMM over the heads into a
 * workspace, a row kernel turns them into probabilities (and the log-sum-exp), and a second GEMM
 * forms the output. So at most Hq·R·S scores exist at once, never S×S per head, and R is chosen so
 * that they fit 256 MiB. The backward recomputes each chunk's probabilities from the saved
 * log-sum-exp, then dV += Pᵀ·dO, dP = dO·Vᵀ, dS = P∘(dP − rowsum(dO∘O)), dQ = dS·K,
 * dK += dSᵀ·Q, all GEMMs but the two row kernels.
 *
 * Grouped-query attention: k and v are first copied out to one head per query head, and dk, dv
 * summed back over the query heads of each kv head in head order, so every GEMM is a plain
 * strided batch over heads. Nothing uses atomics, so a run repeats bit for bit.
 *
 * Row-major X(r, c) with leading dimension ld is column-major Xᵀ(c, r): each product below is
 * written as its transpose, as in ff_kernels_cuda.cu. Layouts as kernels/ff_kernels.h: q, out,
 * dq, dout (B, S, Hq, D); k, v, dk, dv (B, S, Hkv, D); lse (B, Hq, S). The workspace is the
 * backend's own, outside the allocation ledger (the device's runtime reserve covers it). */
#include <cublas_v2.h>
#include <stdio.h>
#include <stdlib.h>

#include "../ff_kernels.h"
#include "ff_attention.h"
#include "ff_attention_rows.cuh"
#include "ff_cuda_common.cuh"

enum {
  ROW_THREADS = 256,
  EW_THREADS = 256,
  CHUNK_ALIGN = 64,
};

#define SCORES_BUDGET ((int64_t)1 << 26) /* floats of one score buffer: 256 MiB */

/* ---- workspace -------------------------------------------------------------------------- */

static struct {
  float *base;
  size_t floats;
} ws;

/* At least n floats of device memory, grown (after the stream has passed its last use) and kept. */
static float *workspace(size_t n) {
  if (n > ws.floats) {
    if (ws.base) {
      FF_CUDA_CHECK(cudaStreamSynchronize(ff_cuda_stream()));
      FF_CUDA_CHECK(cudaFree(ws.base));
      ws.base = NULL;
      ws.floats = 0;
    }
    FF_CUDA_CHECK(cudaMalloc(&ws.base, n * sizeof(float)));
    ws.floats = n;
  }
  return ws.base;
}

/* Query rows per chunk: all of S when the scores fit the budget, else a multiple of 64. The test
 * hook FF_TEST_ATTENTION_ROWS=N makes chunks of N rows, so small checks cross chunks too. */
static int chunk_rows(int S, int Hq) {
  const char *test = getenv("FF_TEST_ATTENTION_ROWS");
  if (test && atoi(test) > 0) return atoi(test) < S ? atoi(test) : S;
  int64_t r = SCORES_BUDGET / ((int64_t)Hq * S);
  if (r >= S) return S;
  r = r / CHUNK_ALIGN * CHUNK_ALIGN;
  return r < CHUNK_ALIGN ? CHUNK_ALIGN : (int)r;
}

/* ---- row kernels ------------------------------------------------------------------------ */

/* One block per (chunk row, head): the row's scores (already scaled) over keys [0, L) become
 * probabilities, masked above the diagonal (key > t), and lse = max + log Σ exp. */
__global__ void softmax_rows_kernel(float *scores, float *lse, int r0, int L, int S, int Hq,
                                    size_t head_stride, int ld, int b) {
  int r = blockIdx.x, h = blockIdx.y, t = r0 + r;
  float *row = scores + (size_t)h * head_stride + (size_t)r * ld;
  float m = -INFINITY;
  for (int j = threadIdx.x; j <= t && j < L; j += blockDim.x) m = fmaxf(m, row[j]);
  m = ff_block_reduce(m, ff_op_max(), -INFINITY);
  float l = 0.0f;
  for (int j = threadIdx.x; j <= t && j < L; j += blockDim.x) l += expf(row[j] - m);
  l = ff_block_reduce(l, ff_op_sum(), 0.0f);
  float inv = 1.0f / l;
  for (int j = threadIdx.x; j < L; j += blockDim.x) row[j] = j <= t ? expf(row[j] - m) * inv : 0.0f;
  if (threadIdx.x == 0) lse[((size_t)b * Hq + h) * S + t] = m + logf(l);
}

/* Backward, first: the probabilities again, from the scores and the saved lse. */
__global__ void probs_rows_kernel(float *scores, const float *lse, int r0, int L, int S, int Hq,
                                  size_t head_stride, int ld, int b) {
  int r = blockIdx.x, h = blockIdx.y, t = r0 + r;
  float *row = scores + (size_t)h * head_stride + (size_t)r * ld;
  float m = lse[((size_t)b * Hq + h) * S + t];
  for (int j = threadIdx.x; j < L; j += blockDim.x) row[j] = j <= t ? expf(row[j] - m) : 0.0f;
}

/* Backward, second: dS = P ∘ (dP − Δ) in place of dP, Δ = rowsum(dO ∘ O) of the row. */
__global__ void dscores_rows_kernel(float *dp, const float *probs, const float *delta, int r0,
                                    int L, int S, int Hq, size_t head_stride, int ld, int b) {
  int r = blockIdx.x, h = blockIdx.y, t = r0 + r;
  size_t at = (size_t)h * head_stride + (size_t)r * ld;
  float d = delta[((size_t)b * Hq + h) * S + t];
  for (int j = threadIdx.x; j < L; j += blockDim.x)
    dp[at + j] = j <= t ? probs[at + j] * (dp[at + j] - d) : 0.0f;
}

/* Δ(b, h, t) = Σ_c dout·out over the head dimension: one warp per row. */
__global__ void delta_kernel(float *delta, const float *dout, const float *out, int B, int S,
                             int Hq, int D) {
  int64_t row = (int64_t)blockIdx.x * (blockDim.x / FF_WARP) + threadIdx.x / FF_WARP;
  if (row >= (int64_t)B * Hq * S) return;
  int t = (int)(row % S), h = (int)(row / S % Hq), b = (int)(row / ((int64_t)S * Hq));
  size_t at = (((size_t)b * S + t) * Hq + h) * D;
  float s = ff_attn_row_dot(dout + at, out + at, D);
  if (threadIdx.x % FF_WARP == 0) delta[row] = s;
}

/* ke(B, S, Hq, D) = k(B, S, Hkv, D) read through the head map, likewise v. */
__global__ void expand_kv_kernel(float *ke, float *ve, const float *k, const float *v, int B,
                                 int S, int Hq, int Hkv, int D, int q_first, int kv_first,
                                 int group) {
  FF_GRID_STRIDE(i, (int64_t)B * S * Hq * D) {
    int c = (int)(i % D), h = (int)(i / D % Hq);
    int64_t bt = i / ((int64_t)D * Hq);
    int hk = ff_attn_kv_head(h, q_first, kv_first, group);
    size_t from = ((size_t)bt * Hkv + hk) * D + c;
    ke[i] = k[from];
    ve[i] = v[from];
  }
}

/* dk(B, S, Hkv, D) = Σ over the query heads of each kv head of dke, in head order; likewise dv. */
__global__ void reduce_kv_kernel(float *dk, float *dv, const float *dke, const float *dve, int B,
                                 int S, int Hq, int Hkv, int D, int q_first, int kv_first,
                                 int group) {
  FF_GRID_STRIDE(i, (int64_t)B * S * Hkv * D) {
    int c = (int)(i % D), hk = (int)(i / D % Hkv);
    int64_t bt = i / ((int64_t)D * Hkv);
    float sk = 0.0f, sv = 0.0f;
    for (int h = 0; h < Hq; h++) {
      if (ff_attn_kv_head(h, q_first, kv_first, group) != hk) continue;
      size_t from = ((size_t)bt * Hq + h) * D + c;
      sk += dke[from];
      sv += dve[from];
    }
    dk[i] = sk;
    dv[i] = sv;
  }
}

#define LAUNCHED(kernel) FF_CUDA_LAUNCHED(#kernel)

/* ---- the GEMMs -------------------------------------------------------------------------- */

/* Column-major C(m, n) = alpha · op(A) · op(B) + beta · C, batched over the Hq heads. */
static void gemm_heads(cublasHandle_t blas, cublasComputeType_t ct, bool ta, bool tb, int m, int n,
                       int k, float alpha, const float *A, int lda, long long sa, const float *B,
                       int ldb, long long sb, float beta, float *C, int ldc, long long sc,
                       int heads) {
  FF_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      blas, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha, A,
      CUDA_R_32F, lda, sa, B, CUDA_R_32F, ldb, sb, &beta, C, CUDA_R_32F, ldc, sc, heads, ct,
      CUBLAS_GEMM_DEFAULT));
}

/* scores(h)(R, L) = scale · Q(h)[r0, r0 + R) · K(h)[0, L)ᵀ  ⇔  scoresᵀ(L, R) = K · Qᵀ */
static void scores_gemm(cublasHandle_t blas, cublasComputeType_t ct, float *scores, int ld,
                        size_t head_stride, const float *q, const float *ke, int r0, int R, int L,
                        int Hq, int D, float scale) {
  int row = Hq * D;
  gemm_heads(blas, ct, true, false, L, R, D, scale, ke, row, D, q + (size_t)r0 * row, row, D, 0.0f,
             scores, ld, (long long)head_stride, Hq);
}

/* ---- entry points ----------------------------------------------------------------------- */

extern "C" void ff_cuda_attention_gemm_fwd(cublasHandle_t blas, cublasComputeType_t ct, float *out,
                                           float *lse, const float *q, const float *k,
                                           const float *v, int B, int S, int Hq, int Hkv, int D,
                                           int q_first, int kv_first, int group) {
  if (B <= 0 || S <= 0 || Hq <= 0) return;
  cudaStream_t st = ff_cuda_stream();
  int R = chunk_rows(S, Hq), row = Hq * D;
  size_t head_stride = (size_t)R * S, per_b = (size_t)S * row;
  size_t kv = (size_t)B * per_b;
  float *base = workspace(2 * kv + (size_t)Hq * head_stride);
  float *ke = base, *ve = ke + kv, *scores = ve + kv;
  expand_kv_kernel<<<ff_grid_for((int64_t)kv, EW_THREADS), EW_THREADS, 0, st>>>(
      ke, ve, k, v, B, S, Hq, Hkv, D, q_first, kv_first, group);
  LAUNCHED(expand_kv_kernel);
  float scale = 1.0f / sqrtf((float)D);
  for (int b = 0; b < B; b++)
    for (int r0 = 0; r0 < S; r0 += R) {
      int rows = S - r0 < R ? S - r0 : R, L = r0 + rows;
      scores_gemm(blas, ct, scores, S, head_stride, q + b * per_b, ke + b * per_b, r0, rows, L, Hq,
                  D, scale);
      softmax_rows_kernel<<<dim3(rows, Hq), ROW_THREADS, 0, st>>>(scores, lse, r0, L, S, Hq,
                                                                  head_stride, S, b);
      LAUNCHED(softmax_rows_kernel);
      /* out(h)(R, D) = P(R, L) · V(L, D)  ⇔  outᵀ(D, R) = Vᵀ · Pᵀ */
      gemm_heads(blas, ct, false, false, D, rows, L, 1.0f, ve + b * per_b, row, D, scores, S,
                 (long long)head_stride, 0.0f, out + b * per_b + (size_t)r0 * row, row, D, Hq);
    }
}

extern "C" void ff_cuda_attention_gemm_bwd(cublasHandle_t blas, cublasComputeType_t ct, float *dq,
                                           float *dk, float *dv, const float *dout,
                                           const float *out, const float *lse, const float *q,
                                           const float *k, const float *v, int B, int S, int Hq,
                                           int Hkv, int D, int q_first, int kv_first, int group) {
  if (B <= 0 || S <= 0) return;
  cudaStream_t st = ff_cuda_stream();
  int R = chunk_rows(S, Hq), row = Hq * D;
  size_t head_stride = (size_t)R * S, per_b = (size_t)S * row;
  size_t kv = (size_t)B * per_b, rows_all = (size_t)B * Hq * S;
  float *base = workspace(4 * kv + 2 * (size_t)Hq * head_stride + rows_all);
  float *ke = base, *ve = ke + kv, *dke = ve + kv, *dve = dke + kv;
  float *probs = dve + kv, *dp = probs + (size_t)Hq * head_stride;
  float *delta = dp + (size_t)Hq * head_stride;
  expand_kv_kernel<<<ff_grid_for((int64_t)kv, EW_THREADS), EW_THREADS, 0, st>>>(
      ke, ve, k, v, B, S, Hq, Hkv, D, q_first, kv_first, group);
  LAUNCHED(expand_kv_kernel);
  FF_CUDA_CHECK(cudaMemsetAsync(dke, 0, 2 * kv * sizeof(float), st));
  int warps = EW_THREADS / FF_WARP;
  delta_kernel<<<(unsigned)((rows_all + warps - 1) / warps), EW_THREADS, 0, st>>>(
      delta, dout, out, B, S, Hq, D);
  LAUNCHED(delta_kernel);
  float scale = 1.0f / sqrtf((float)D);
  for (int b = 0; b < B; b++) {
    const float *qb = q + b * per_b, *kb = ke + b * per_b, *vb = ve + b * per_b;
    const float *dob = dout + b * per_b;
    float *dqb = dq + b * per_b, *dkb = dke + b * per_b, *dvb = dve + b * per_b;
    for (int r0 = 0; r0 < S; r0 += R) {
      int rows = S - r0 < R ? S - r0 : R, L = r0 + rows;
      const float *q_rows = qb + (size_t)r0 * row, *do_rows = dob + (size_t)r0 * row;
      scores_gemm(blas, ct, probs, S, head_stride, qb, kb, r0, rows, L, Hq, D, scale);
      probs_rows_kernel<<<dim3(rows, Hq), ROW_THREADS, 0, st>>>(probs, lse, r0, L, S, Hq,
                                                                head_stride, S, b);
      LAUNCHED(probs_rows_kernel);
      /* dV(h)(L, D) += P(R, L)ᵀ · dO(R, D)  ⇔  dVᵀ(D, L) += dOᵀ · P */
      gemm_heads(blas, ct, false, true, D, L, rows, 1.0f, do_rows, row, D, probs, S,
                 (long long)head_stride, 1.0f, dvb, row, D, Hq);
      /* dP(h)(R, L) = dO(R, D) · V(L, D)ᵀ  ⇔  dPᵀ(L, R) = V · dOᵀ */
      gemm_heads(blas, ct, true, false, L, rows, D, 1.0f, vb, row, D, do_rows, row, D, 0.0f, dp, S,
                 (long long)head_stride, Hq);
      dscores_rows_kernel<<<dim3(rows, Hq), ROW_THREADS, 0, st>>>(dp, probs, delta, r0, L, S, Hq,
                                                                  head_stride, S, b);
      LAUNCHED(dscores_rows_kernel);
      /* dQ(h)(R, D) = scale · dS(R, L) · K(L, D)  ⇔  dQᵀ(D, R) = Kᵀ · dSᵀ */
      gemm_heads(blas, ct, false, false, D, rows, L, scale, kb, row, D, dp, S,
                 (long long)head_stride, 0.0f, dqb + (size_t)r0 * row, row, D, Hq);
      /* dK(h)(L, D) += scale · dS(R, L)ᵀ · Q(R, D)  ⇔  dKᵀ(D, L) += Qᵀ · dS */
      gemm_heads(blas, ct, false, true, D, L, rows, scale, q_rows, row, D, dp, S,
                 (long long)head_stride, 1.0f, dkb, row, D, Hq);
    }
  }
  reduce_kv_kernel<<<ff_grid_for((int64_t)B * S * Hkv * D, EW_THREADS), EW_THREADS, 0, st>>>(
      dk, dv, dke, dve, B, S, Hq, Hkv, D, q_first, kv_first, group);
  LAUNCHED(reduce_kv_kernel);
}
