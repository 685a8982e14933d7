/* ff_kernels_cpu.c — the CPU backend of ff_kernels.h: fp32 arithmetic throughout (bf16 operands
 * are unpacked exactly), matmuls through OpenBLAS (cblas_sgemm), everything else plain C loops
 * over contiguous rows, written so the compiler can vectorise them (restrict pointers,
 * reductions split into CPU_LANES partial sums).
 *
 * Deterministic by construction: no threads in these loops and every reduction runs in a fixed
 * order, so the same inputs give the same bits (OpenBLAS splits sgemm over output blocks, not
 * over the reduction, so its threads do not change the bits either).
 *
 * Nothing here allocates except `alloc`: attention keeps one fixed tile of scores in a static
 * buffer and combines tiles with an online softmax, so memory does not grow with S, and the
 * bf16 matmuls unpack their operands a fixed block at a time into static tiles.
 * Pointers marked restrict must not alias; the header allows only add's out == a and
 * ce_loss_grad's dlogits == logits, and those two are written without restrict. */
#include <assert.h>
#include <stdint.h>
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ff_attention_widened.h"
#include "ff_exp.h"
#include "ff_kernels.h"

/* The element-wise loops, compiled three times, for SSE2 (every x86-64), AVX2 and AVX-512
 * (x86-64-v4); the loader picks the widest the CPU has. The three give the same bits: IEEE
 * arithmetic in the source's order, no contraction into FMA (-ffp-contract=off), reductions in
 * CPU_LANES partial sums whatever the vector width (tests/unit/kernel_bits.c compares them with
 * a build of one, -DFF_CPU_ONE_ISA). GCC on x86-64 only; elsewhere one build. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(FF_CPU_ONE_ISA)
#define CPU_CLONES __attribute__((target_clones("default", "avx2", "arch=x86-64-v4")))
#else
#define CPU_CLONES
#endif

/* Declared here too: the netlib cblas.h lacks it, OpenBLAS's declares the same prototype. */
void openblas_set_num_threads(int num_threads);

enum {
  CPU_ALIGN = 64,   /* bytes: a cache line, and an AVX-512 register */
  CPU_LANES = 8,    /* partial sums per reduction: the compiler maps them onto one vector */
  ATTN_TQ = 64,     /* query rows per tile of attention scores */
  ATTN_TK = 64,     /* keys per tile of attention scores */
  ROPE_CHUNK = 128, /* rotation pairs whose cos/sin are kept on the stack at once */
  BF16_TILE = 256,  /* rows and columns of a bf16 matmul block unpacked to fp32 at once */
  BF16_CHUNK = 256, /* fp32 results kept on the stack before a bf16-writing kernel rounds them */
};

/* ---- memory ----------------------------------------------------------------------------- */

/* What alloc holds now and at most: one process, one thread of allocation, so plain counters.
 * Each block carries its size in a header one alignment unit long, ahead of the pointer, and
 * whether it counts: alloc_host's staging buffers do not, as they are not device memory on a
 * GPU either, so the peak is the same share of a rank's memory on both backends. */
static int64_t cpu_allocated_bytes, cpu_peak_bytes;

static void *cpu_alloc_counted(size_t bytes, bool counted) {
  size_t rounded = (bytes + CPU_ALIGN - 1) / CPU_ALIGN * CPU_ALIGN;
  if (rounded < bytes || rounded > SIZE_MAX - CPU_ALIGN) return NULL; /* overflow */
  char *base = aligned_alloc(CPU_ALIGN, rounded + CPU_ALIGN);
  if (!base) return NULL;
  memset(base + CPU_ALIGN, 0, rounded);
  size_t header[2] = {rounded, counted};
  memcpy(base, header, sizeof header);
  if (counted) {
    cpu_allocated_bytes += (int64_t)rounded;
    if (cpu_allocated_bytes > cpu_peak_bytes) cpu_peak_bytes = cpu_allocated_bytes;
  }
  return base + CPU_ALIGN;
}

static void *cpu_alloc(size_t bytes) { return cpu_alloc_counted(bytes, true); }
static void *cpu_alloc_host(size_t bytes) { return cpu_alloc_counted(bytes, false); }

static void cpu_release(void *p) {
  if (!p) return;
  char *base = (char *)p - CPU_ALIGN;
  size_t header[2];
  memcpy(header, base, sizeof header);
  if (header[1]) cpu_allocated_bytes -= (int64_t)header[0];
  free(base);
}

static void cpu_sync(void) {}

/* Time in matmuls and attention, for the metrics' split of a step. */
static double cpu_matmul_seconds, cpu_attention_seconds;

static double wall_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void cpu_op_seconds(double *matmul_seconds, double *attention_seconds) {
  *matmul_seconds = cpu_matmul_seconds;
  *attention_seconds = cpu_attention_seconds;
}

static void cpu_memory(ff_kernel_memory *out) {
  out->allocated_bytes = cpu_allocated_bytes;
  out->peak_bytes = cpu_peak_bytes;
  out->device_used_bytes = out->device_total_bytes = 0;
}

static void cpu_zero(void *p, size_t bytes) {
  if (bytes) memset(p, 0, bytes);
}

static void cpu_copy(void *dst, const void *src, size_t bytes) {
  if (bytes) memcpy(dst, src, bytes);
}

/* ---- reductions in a fixed order -------------------------------------------------------- */

/* Σ a[i]·b[i] over n, in CPU_LANES partial sums combined in a fixed order */
static float dot(const float *restrict a, const float *restrict b, int64_t n) {
  float lane[CPU_LANES] = {0};
  int64_t i = 0;
  for (; i + CPU_LANES <= n; i += CPU_LANES)
    for (int l = 0; l < CPU_LANES; l++) lane[l] += a[i + l] * b[i + l];
  float sum = 0.0f;
  for (int l = 0; l < CPU_LANES; l++) sum += lane[l];
  for (; i < n; i++) sum += a[i] * b[i];
  return sum;
}

/* y(n) += alpha · x(n), blocked by CPU_LANES so that -O2's cheapest vectoriser takes it too */
static void axpy(float *restrict y, float alpha, const float *restrict x, int64_t n) {
  int64_t i = 0;
  for (; i + CPU_LANES <= n; i += CPU_LANES)
    for (int l = 0; l < CPU_LANES; l++) y[i + l] += alpha * x[i + l];
  for (; i < n; i++) y[i] += alpha * x[i];
}

/* ---- matmul ----------------------------------------------------------------------------- */

/* out(N, Out) = inp(N, In) · w(Out, In)ᵀ */
static void matmul_fwd_untimed(float *out, const float *inp, const float *w, int N, int In,
                               int Out) {
  if (N <= 0 || Out <= 0) return;
  if (In <= 0) {
    memset(out, 0, (size_t)N * (size_t)Out * sizeof *out);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, Out, In, 1.0f, inp, In, w, In, 0.0f, out,
              Out);
}

/* dinp(N, In) = dout(N, Out) · w(Out, In) (overwritten, skipped when NULL);
 * dw(Out, In) += dout(N, Out)ᵀ · inp(N, In) (skipped when NULL) */
static void matmul_bwd_untimed(float *dinp, float *dw, const float *dout, const float *inp,
                       const float *w, int N, int In, int Out) {
  if (N <= 0 || In <= 0) return;
  if (Out <= 0) {
    if (dinp) memset(dinp, 0, (size_t)N * (size_t)In * sizeof *dinp);
    return;
  }
  if (dinp)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, In, Out, 1.0f, dout, Out, w, In, 0.0f,
                dinp, In);
  if (dw)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, Out, In, N, 1.0f, dout, Out, inp, In, 1.0f,
                dw, In);
}

/* Row-major C(M, N) = op(A) · op(B) + beta · C on bf16 operands, in blocks of BF16_TILE along
 * each dimension: a block of each operand is unpacked to fp32 (exactly) into a static tile and
 * multiplied by sgemm, the K blocks accumulating into C in order. Tiles keep memory fixed
 * ("nothing allocates"); unpacking costs one pass per BF16_TILE multiply-adds of a block. */
static float bf16_tile_a[BF16_TILE * BF16_TILE], bf16_tile_b[BF16_TILE * BF16_TILE];
static float bf16_tile_c[BF16_TILE * BF16_TILE];

static void to_bf16(uint16_t *restrict dst, const float *restrict src, int64_t n);
static void from_bf16(float *restrict dst, const uint16_t *restrict src, int64_t n);

/* rows × cols of src (row-major, ld) at (r0, c0) into tile (row-major, ld cols) */
static void unpack_block(float *restrict tile, const uint16_t *restrict src, int64_t ld, int r0,
                         int c0, int rows, int cols) {
  for (int r = 0; r < rows; r++) {
    const uint16_t *row = src + (int64_t)(r0 + r) * ld + c0;
    float *out = tile + (int64_t)r * cols;
    for (int c = 0; c < cols; c++) {
      uint32_t bits = (uint32_t)row[c] << 16;
      memcpy(&out[c], &bits, sizeof bits);
    }
  }
}

/* With C16 instead of C (beta 0), each block of C is made in a static fp32 tile and rounded
 * into C16 by to_bf16 once its K blocks are summed: the fp32 product, rounded. */
static void gemm_bf16(bool ta, bool tb, int M, int N, int K, const uint16_t *A, int lda,
                      const uint16_t *B, int ldb, float beta, float *C, uint16_t *C16, int ldc) {
  for (int m0 = 0; m0 < M; m0 += BF16_TILE)
    for (int n0 = 0; n0 < N; n0 += BF16_TILE) {
      int mb = M - m0 < BF16_TILE ? M - m0 : BF16_TILE;
      int nb = N - n0 < BF16_TILE ? N - n0 : BF16_TILE;
      float *c = C16 ? bf16_tile_c : C + (int64_t)m0 * ldc + n0;
      int ld = C16 ? nb : ldc;
      for (int k0 = 0; k0 < K; k0 += BF16_TILE) {
        int kb = K - k0 < BF16_TILE ? K - k0 : BF16_TILE;
        /* op(A) is (M, K): A is (M, K), or (K, M) when transposed; op(B) likewise (K, N) */
        if (ta) unpack_block(bf16_tile_a, A, lda, k0, m0, kb, mb);
        else unpack_block(bf16_tile_a, A, lda, m0, k0, mb, kb);
        if (tb) unpack_block(bf16_tile_b, B, ldb, n0, k0, nb, kb);
        else unpack_block(bf16_tile_b, B, ldb, k0, n0, kb, nb);
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                    mb, nb, kb, 1.0f, bf16_tile_a, ta ? mb : kb, bf16_tile_b, tb ? kb : nb,
                    k0 == 0 ? beta : 1.0f, c, ld);
      }
      if (C16)
        for (int r = 0; r < mb; r++)
          to_bf16(C16 + (int64_t)(m0 + r) * ldc + n0, bf16_tile_c + (int64_t)r * nb, nb);
    }
}

static void matmul_fwd_bf16_untimed(float *out, const uint16_t *inp, const uint16_t *w, int N,
                                    int In, int Out) {
  if (N <= 0 || Out <= 0) return;
  if (In <= 0) {
    memset(out, 0, (size_t)N * (size_t)Out * sizeof *out);
    return;
  }
  gemm_bf16(false, true, N, Out, In, inp, In, w, In, 0.0f, out, NULL, Out);
}

static void matmul_fwd_bf16_rounded_untimed(uint16_t *out, const uint16_t *inp, const uint16_t *w,
                                            int N, int In, int Out) {
  if (N <= 0 || Out <= 0) return;
  if (In <= 0) {
    memset(out, 0, (size_t)N * (size_t)Out * sizeof *out);
    return;
  }
  gemm_bf16(false, true, N, Out, In, inp, In, w, In, 0.0f, NULL, out, Out);
}

/* add: dinp += instead of = */
static void matmul_bwd_bf16_untimed(float *dinp, float *dw, const uint16_t *dout,
                                    const uint16_t *inp, const uint16_t *w, int N, int In,
                                    int Out, bool add) {
  if (N <= 0 || In <= 0) return;
  if (Out <= 0) {
    if (dinp && !add) memset(dinp, 0, (size_t)N * (size_t)In * sizeof *dinp);
    return;
  }
  if (dinp) gemm_bf16(false, false, N, In, Out, dout, Out, w, In, add, dinp, NULL, In);
  if (dw) gemm_bf16(true, false, Out, In, N, dout, Out, inp, In, 1.0f, dw, NULL, In);
}

/* ---- embedding -------------------------------------------------------------------------- */

/* out(N, C) = table(vocab_end - vocab_first, C)[tok - vocab_first], 0 for tokens off the shard */
static void embedding_fwd(float *restrict out, const int32_t *restrict tokens,
                          const float *restrict table, int N, int C, int vocab_first,
                          int vocab_end) {
  for (int n = 0; n < N; n++) {
    float *out_n = out + (size_t)n * C;
    int32_t tok = tokens[n];
    if (tok >= vocab_first && tok < vocab_end)
      memcpy(out_n, table + (size_t)(tok - vocab_first) * C, (size_t)C * sizeof *out_n);
    else
      memset(out_n, 0, (size_t)C * sizeof *out_n);
  }
}

/* dtable(vocab_end - vocab_first, C)[tok - vocab_first] += dout(N, C)[n], tokens on the shard */
static void embedding_bwd(float *restrict dtable, const float *restrict dout,
                          const int32_t *restrict tokens, int N, int C, int vocab_first,
                          int vocab_end) {
  for (int n = 0; n < N; n++) {
    int32_t tok = tokens[n];
    if (tok >= vocab_first && tok < vocab_end)
      axpy(dtable + (size_t)(tok - vocab_first) * C, 1.0f, dout + (size_t)n * C, C);
  }
}

/* ---- RMSNorm ---------------------------------------------------------------------------- */

/* inp, out (N, C), w (C), rstd (N): out = inp · rstd · w, rstd = 1 / sqrt(mean(inp²) + eps) */
static float rms_inverse(const float *x, int C, float eps) {
  return 1.0f / sqrtf(dot(x, x, C) / (float)C + eps);
}

CPU_CLONES
static void rmsnorm_fwd(float *restrict out, float *restrict rstd, const float *restrict inp,
                        const float *restrict w, int N, int C, float eps) {
  for (int n = 0; n < N; n++) {
    const float *x = inp + (size_t)n * C;
    float *o = out + (size_t)n * C;
    float r = rms_inverse(x, C, eps);
    for (int c = 0; c < C; c++) o[c] = x[c] * r * w[c];
    rstd[n] = r;
  }
}

/* The bf16-writing forms compute BF16_CHUNK fp32 results at a time on the stack, as the fp32
 * forms do, and round them with to_bf16: the bits of the two passes, without their memory. */
static void rmsnorm_fwd_bf16(uint16_t *restrict out, float *restrict rstd,
                             const float *restrict inp, const float *restrict w, int N, int C,
                             float eps) {
  float tmp[BF16_CHUNK];
  for (int n = 0; n < N; n++) {
    const float *x = inp + (size_t)n * C;
    float r = rms_inverse(x, C, eps);
    for (int c0 = 0; c0 < C; c0 += BF16_CHUNK) {
      int m = C - c0 < BF16_CHUNK ? C - c0 : BF16_CHUNK;
      for (int c = 0; c < m; c++) tmp[c] = x[c0 + c] * r * w[c0 + c];
      to_bf16(out + (size_t)n * C + c0, tmp, m);
    }
    rstd[n] = r;
  }
}

/* Columns [at, at + m) of a row of inp: the fp32 row itself, or the bf16 row widened into tmp */
static const float *row_chunk(const float *xf, const uint16_t *xh, int64_t at, int m,
                              float *tmp) {
  if (xf) return xf + at;
  from_bf16(tmp, xh + at, m);
  return tmp;
}

_Static_assert(BF16_CHUNK % CPU_LANES == 0, "chunks must keep the reduction's lanes in order");

/* dout, inp, dinp (N, C), w, dw (C), rstd (N):
 * dinp = rstd · (dout∘w) − rstd³/C · inp · Σ(dout∘w∘inp) (overwritten, or added with `add`);
 * dw += Σ_n dout∘inp·rstd. inp is fp32 (inp) or bf16 (inp16): a bf16 row is widened
 * BF16_CHUNK values at a time, which keeps the reduction's order, so both give the same bits on
 * the same values. */
CPU_CLONES
static void rmsnorm_backward(float *restrict dinp, float *restrict dw, const float *restrict dout,
                             const float *inp, const uint16_t *inp16, const float *restrict w,
                             const float *restrict rstd, int N, int C, bool add) {
  float tmp[BF16_CHUNK];
  for (int n = 0; n < N; n++) {
    int64_t row = (int64_t)n * C;
    const float *dy = dout + row;
    float *dx = dinp + row;
    float r = rstd[n];
    float lane[CPU_LANES] = {0}, tail[CPU_LANES];
    int tails = 0;
    for (int c0 = 0; c0 < C; c0 += BF16_CHUNK) {
      int m = C - c0 < BF16_CHUNK ? C - c0 : BF16_CHUNK, c = 0;
      const float *x = row_chunk(inp ? inp + row : NULL, inp16 ? inp16 + row : NULL, c0, m, tmp);
      for (; c + CPU_LANES <= m; c += CPU_LANES)
        for (int l = 0; l < CPU_LANES; l++)
          lane[l] += dy[c0 + c + l] * w[c0 + c + l] * x[c + l];
      for (; c < m; c++) tail[tails++] = dy[c0 + c] * w[c0 + c] * x[c]; /* the last chunk's */
    }
    float dyw_x = 0.0f;
    for (int l = 0; l < CPU_LANES; l++) dyw_x += lane[l];
    for (int t = 0; t < tails; t++) dyw_x += tail[t];
    float k = r * r * r * dyw_x / (float)C;
    for (int c0 = 0; c0 < C; c0 += BF16_CHUNK) {
      int m = C - c0 < BF16_CHUNK ? C - c0 : BF16_CHUNK;
      const float *x = row_chunk(inp ? inp + row : NULL, inp16 ? inp16 + row : NULL, c0, m, tmp);
      for (int c = 0; c < m; c++) {
        float g = r * dy[c0 + c] * w[c0 + c] - k * x[c];
        dx[c0 + c] = add ? dx[c0 + c] + g : g;
        dw[c0 + c] += dy[c0 + c] * x[c] * r;
      }
    }
  }
}

static void rmsnorm_bwd(float *restrict dinp, float *restrict dw, const float *restrict dout,
                        const float *restrict inp, const float *restrict w,
                        const float *restrict rstd, int N, int C) {
  rmsnorm_backward(dinp, dw, dout, inp, NULL, w, rstd, N, C, false);
}

static void rmsnorm_bwd_acc(float *restrict dinp, float *restrict dw, const float *restrict dout,
                            const float *restrict inp, const float *restrict w,
                            const float *restrict rstd, int N, int C) {
  rmsnorm_backward(dinp, dw, dout, inp, NULL, w, rstd, N, C, true);
}

static void rmsnorm_bwd_acc_bf16(float *restrict dinp, float *restrict dw,
                                 const float *restrict dout, const uint16_t *restrict inp,
                                 const float *restrict w, const float *restrict rstd, int N,
                                 int C) {
  rmsnorm_backward(dinp, dw, dout, NULL, inp, w, rstd, N, C, true);
}

/* ---- RoPE ------------------------------------------------------------------------------- */

/* x(B, S, H, D) in place: pair (2i, 2i+1) of position s turns by s · theta^(-2i/D), times `sign`.
 * Angles, cos and sin are computed in double once per (s, i), for a chunk of pairs at a time kept
 * on the stack, and applied to every (b, h). */
static void rope_rotate(float *x, int B, int S, int H, int D, float theta, float sign) {
  int pairs = D / 2;
  for (int i0 = 0; i0 < pairs; i0 += ROPE_CHUNK) {
    int chunk = pairs - i0 < ROPE_CHUNK ? pairs - i0 : ROPE_CHUNK;
    double inv_freq[ROPE_CHUNK];
    for (int i = 0; i < chunk; i++) inv_freq[i] = pow((double)theta, -2.0 * (i0 + i) / D);
    for (int s = 0; s < S; s++) {
      float cs[ROPE_CHUNK], sn[ROPE_CHUNK];
      for (int i = 0; i < chunk; i++) {
        cs[i] = (float)cos(s * inv_freq[i]);
        sn[i] = sign * (float)sin(s * inv_freq[i]);
      }
      for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
          float *restrict xp = x + (((size_t)b * S + s) * H + h) * D + 2 * (size_t)i0;
          for (int i = 0; i < chunk; i++) {
            float x0 = xp[2 * i], x1 = xp[2 * i + 1];
            xp[2 * i] = x0 * cs[i] - x1 * sn[i];
            xp[2 * i + 1] = x0 * sn[i] + x1 * cs[i];
          }
        }
    }
  }
}

/* x(B, S, H, D) in place, rotated forward */
static void rope_fwd(float *x, int B, int S, int H, int D, float theta) {
  rope_rotate(x, B, S, H, D, theta, 1.0f);
}

static void rope_fwd_bf16(uint16_t *out, float *x, int B, int S, int H, int D, float theta) {
  rope_rotate(x, B, S, H, D, theta, 1.0f);
  to_bf16(out, x, (int64_t)B * S * H * D);
}

static void rope_bwd_bf16(uint16_t *out, float *dx, int B, int S, int H, int D, float theta) {
  rope_rotate(dx, B, S, H, D, theta, -1.0f);
  to_bf16(out, dx, (int64_t)B * S * H * D);
}

/* dx(B, S, H, D) in place, rotated back: a rotation's transpose is its inverse */
static void rope_bwd(float *dx, int B, int S, int H, int D, float theta) {
  rope_rotate(dx, B, S, H, D, theta, -1.0f);
}

/* ---- attention -------------------------------------------------------------------------- */

/* Local kv head used by local query head i (global q_first + i; group query heads per kv head). */
static int kv_head_of(int i, int q_first, int kv_first, int group, int Hkv) {
  int hk = (q_first + i) / group - kv_first;
  assert(group > 0 && hk >= 0 && hk < Hkv); /* the shard holds the kv heads its queries use */
  (void)Hkv;
  return hk;
}

/* Attention a tile at a time, its products handed to sgemm: ATTN_TQ query rows against
 * ATTN_TK keys, tiles above the causal diagonal never computed, the scores of one tile in a
 * fixed buffer (memory does not grow with S). One (sequence, head) is computed alone, with the
 * same calls whatever the batch and the rank's heads, so a head's result does not depend on the
 * plan's micro-batch or its TP split. A head's rows lie q_stride (q, out) or kv_stride (k, v)
 * floats apart. */
static float attn_s[ATTN_TQ * ATTN_TK], attn_dp[ATTN_TQ * ATTN_TK];

/* Of a tile of n_q query rows from i0 against n_k keys from j0, row r sees the keys up to
 * i0 + r: how many of the tile's columns that is (0 to n_k). */
static int attn_visible(int i0, int r, int j0, int n_k) {
  int c = i0 + r - j0 + 1;
  return c < 0 ? 0 : c > n_k ? n_k : c;
}

/* One (sequence, head): out = softmax(q·kᵀ·scale, causal)·v and the rows' log-sum-exp. Tiles of
 * keys are combined by an online softmax (running max m, running sum l, the output rows rescaled
 * when m grows). */
CPU_CLONES
static void attention_head_fwd(float *out, float *lse, const float *q, const float *k,
                               const float *v, int S, int D, size_t q_stride, size_t kv_stride,
                               float scale) {
  float m[ATTN_TQ], l[ATTN_TQ];
  for (int i0 = 0; i0 < S; i0 += ATTN_TQ) {
    int n_q = S - i0 < ATTN_TQ ? S - i0 : ATTN_TQ;
    const float *qi = q + (size_t)i0 * q_stride;
    float *oi = out + (size_t)i0 * q_stride;
    for (int r = 0; r < n_q; r++) {
      memset(oi + (size_t)r * q_stride, 0, (size_t)D * sizeof *oi);
      m[r] = -INFINITY, l[r] = 0.0f;
    }
    for (int j0 = 0; j0 < i0 + n_q; j0 += ATTN_TK) {
      int n_k = i0 + n_q - j0 < ATTN_TK ? i0 + n_q - j0 : ATTN_TK;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n_q, n_k, D, scale, qi,
                  (int)q_stride, k + (size_t)j0 * kv_stride, (int)kv_stride, 0.0f, attn_s,
                  ATTN_TK);
      for (int r = 0; r < n_q; r++) {
        float *s = attn_s + (size_t)r * ATTN_TK;
        int seen = attn_visible(i0, r, j0, n_k);
        for (int c = seen; c < n_k; c++) s[c] = 0.0f;
        if (seen == 0) /* the row's keys all lie before this tile */
          continue;
        float m_new = m[r];
        for (int c = 0; c < seen; c++)
          if (s[c] > m_new) m_new = s[c];
        if (m_new > m[r] && l[r] > 0.0f) {
          float rescale = ff_exp_lanes(m[r] - m_new), *o = oi + (size_t)r * q_stride;
          l[r] *= rescale;
          for (int d = 0; d < D; d++) o[d] *= rescale;
        }
        m[r] = m_new;
        for (int c = 0; c < seen; c++) s[c] = ff_exp_lanes(s[c] - m_new);
        for (int c = 0; c < seen; c++) l[r] += s[c];
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n_q, D, n_k, 1.0f, attn_s, ATTN_TK,
                  v + (size_t)j0 * kv_stride, (int)kv_stride, 1.0f, oi, (int)q_stride);
    }
    for (int r = 0; r < n_q; r++) {
      float inv_l = 1.0f / l[r], *o = oi + (size_t)r * q_stride;
      for (int d = 0; d < D; d++) o[d] *= inv_l;
      lse[i0 + r] = m[r] + logf(l[r]);
    }
  }
}

/* q, out (B, S, Hq, D); k, v (B, S, Hkv, D); lse (B, Hq, S). Causal, scale 1/sqrt(D). */
static void attention_fwd_untimed(float *restrict out, float *restrict lse, const float *restrict q,
                          const float *restrict k, const float *restrict v, int B, int S, int Hq,
                          int Hkv, int D, int q_first, int kv_first, int group) {
  float scale = 1.0f / sqrtf((float)D);
  size_t q_stride = (size_t)Hq * D, kv_stride = (size_t)Hkv * D;
  for (int b = 0; b < B; b++)
    for (int h = 0; h < Hq; h++) {
      size_t kv = (size_t)b * S * kv_stride +
                  (size_t)kv_head_of(h, q_first, kv_first, group, Hkv) * D;
      size_t at = (size_t)b * S * q_stride + (size_t)h * D;
      attention_head_fwd(out + at, lse + ((size_t)b * Hq + h) * S, q + at, k + kv, v + kv, S, D,
                         q_stride, kv_stride, scale);
    }
}

/* Backward of one (sequence, head), P recomputed tile by tile from q, k and lse:
 * dP = dout·vᵀ, dS = P ∘ (dP − rowsum(dout ∘ out)); dv += Pᵀ·dout, dq += scale·dS·k,
 * dk += scale·dSᵀ·q (dq, dk, dv accumulated: the caller zeroes them). */
CPU_CLONES
static void attention_head_bwd(float *dq, float *dk, float *dv, const float *dout,
                               const float *out, const float *lse, const float *q, const float *k,
                               const float *v, int S, int D, size_t q_stride, size_t kv_stride,
                               float scale) {
  float delta[ATTN_TQ];
  for (int i0 = 0; i0 < S; i0 += ATTN_TQ) {
    int n_q = S - i0 < ATTN_TQ ? S - i0 : ATTN_TQ;
    size_t at = (size_t)i0 * q_stride;
    for (int r = 0; r < n_q; r++)
      delta[r] = dot(dout + at + (size_t)r * q_stride, out + at + (size_t)r * q_stride, D);
    for (int j0 = 0; j0 < i0 + n_q; j0 += ATTN_TK) {
      int n_k = i0 + n_q - j0 < ATTN_TK ? i0 + n_q - j0 : ATTN_TK;
      size_t kj = (size_t)j0 * kv_stride;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n_q, n_k, D, scale, q + at,
                  (int)q_stride, k + kj, (int)kv_stride, 0.0f, attn_s, ATTN_TK);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n_q, n_k, D, 1.0f, dout + at,
                  (int)q_stride, v + kj, (int)kv_stride, 0.0f, attn_dp, ATTN_TK);
      for (int r = 0; r < n_q; r++) {
        float *p = attn_s + (size_t)r * ATTN_TK, *ds = attn_dp + (size_t)r * ATTN_TK;
        int seen = attn_visible(i0, r, j0, n_k);
        float row_lse = lse[i0 + r];
        for (int c = 0; c < seen; c++) {
          p[c] = ff_exp_lanes(p[c] - row_lse);
          ds[c] = p[c] * (ds[c] - delta[r]);
        }
        for (int c = seen; c < n_k; c++) p[c] = ds[c] = 0.0f;
      }
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n_k, D, n_q, 1.0f, attn_s, ATTN_TK,
                  dout + at, (int)q_stride, 1.0f, dv + kj, (int)kv_stride);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n_q, D, n_k, scale, attn_dp, ATTN_TK,
                  k + kj, (int)kv_stride, 1.0f, dq + at, (int)q_stride);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n_k, D, n_q, scale, attn_dp, ATTN_TK,
                  q + at, (int)q_stride, 1.0f, dk + kj, (int)kv_stride);
    }
  }
}

/* dq, dout, out, q (B, S, Hq, D); dk, dv, k, v (B, S, Hkv, D); lse (B, Hq, S).
 * dq, dk, dv are overwritten; dk, dv sum over the local query heads sharing a kv head. */
static void attention_bwd_untimed(float *restrict dq, float *restrict dk, float *restrict dv,
                          const float *restrict dout, const float *restrict out,
                          const float *restrict lse, const float *restrict q,
                          const float *restrict k, const float *restrict v, int B, int S, int Hq,
                          int Hkv, int D, int q_first, int kv_first, int group) {
  float scale = 1.0f / sqrtf((float)D);
  size_t q_stride = (size_t)Hq * D, kv_stride = (size_t)Hkv * D;
  size_t kv_bytes = (size_t)B * S * kv_stride * sizeof(float);
  cpu_zero(dq, (size_t)B * S * q_stride * sizeof(float));
  cpu_zero(dk, kv_bytes);
  cpu_zero(dv, kv_bytes);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < Hq; h++) {
      size_t kv = (size_t)b * S * kv_stride +
                  (size_t)kv_head_of(h, q_first, kv_first, group, Hkv) * D;
      size_t at = (size_t)b * S * q_stride + (size_t)h * D;
      attention_head_bwd(dq + at, dk + kv, dv + kv, dout + at, out + at,
                         lse + ((size_t)b * Hq + h) * S, q + at, k + kv, v + kv, S, D, q_stride,
                         kv_stride, scale);
    }
}

/* ---- SwiGLU ----------------------------------------------------------------------------- */

static float sigmoid(float x) { return 1.0f / (1.0f + ff_exp_lanes(-x)); }

/* out, gate, up (n): out = silu(gate) · up, silu(g) = g · sigmoid(g) */
CPU_CLONES
static void swiglu_fwd(float *restrict out, const float *restrict gate, const float *restrict up,
                       int64_t n) {
  for (int64_t i = 0; i < n; i++) out[i] = gate[i] * sigmoid(gate[i]) * up[i];
}

/* dgate, dup, dout, gate, up (n): dup = dout · silu(g),
 * dgate = dout · up · sigmoid(g) · (1 + g · (1 − sigmoid(g))) (both overwritten) */
CPU_CLONES
static void swiglu_bwd(float *restrict dgate, float *restrict dup, const float *restrict dout,
                       const float *restrict gate, const float *restrict up, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    float g = gate[i], sg = sigmoid(g);
    dup[i] = dout[i] * g * sg;
    dgate[i] = dout[i] * up[i] * sg * (1.0f + g * (1.0f - sg));
  }
}

static void swiglu_fwd_bf16(uint16_t *restrict out, const uint16_t *restrict gate,
                            const uint16_t *restrict up, int64_t n) {
  float g[BF16_CHUNK], u[BF16_CHUNK], tmp[BF16_CHUNK];
  for (int64_t i = 0; i < n; i += BF16_CHUNK) {
    int64_t m = n - i < BF16_CHUNK ? n - i : BF16_CHUNK;
    from_bf16(g, gate + i, m);
    from_bf16(u, up + i, m);
    swiglu_fwd(tmp, g, u, m);
    to_bf16(out + i, tmp, m);
  }
}

static void swiglu_bwd_bf16(uint16_t *restrict dgate, uint16_t *restrict dup,
                            const float *restrict dout, const uint16_t *restrict gate,
                            const uint16_t *restrict up, int64_t n) {
  float g[BF16_CHUNK], u[BF16_CHUNK], tg[BF16_CHUNK], tu[BF16_CHUNK];
  for (int64_t i = 0; i < n; i += BF16_CHUNK) {
    int64_t m = n - i < BF16_CHUNK ? n - i : BF16_CHUNK;
    from_bf16(g, gate + i, m);
    from_bf16(u, up + i, m);
    swiglu_bwd(tg, tu, dout + i, g, u, m);
    to_bf16(dgate + i, tg, m);
    to_bf16(dup + i, tu, m);
  }
}

/* ---- elementwise ------------------------------------------------------------------------ */

/* out, a, b (n): out = a + b; out may alias a (so no restrict) */
static void add(float *out, const float *a, const float *b, int64_t n) {
  for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

/* out, a (n): out += a */
static void accumulate(float *restrict out, const float *restrict a, int64_t n) {
  axpy(out, 1.0f, a, n);
}

/* x (n): x *= s */
static void scale(float *restrict x, float s, int64_t n) {
  for (int64_t i = 0; i < n; i++) x[i] *= s;
}

/* ---- cross-entropy ---------------------------------------------------------------------- */

/* logits (N, V), row_max (N): pass 1, the max of each row over this shard */
static void ce_row_max(float *restrict row_max, const float *restrict logits, int N, int V) {
  for (int n = 0; n < N; n++) {
    const float *z = logits + (size_t)n * V;
    float m = -INFINITY;
    for (int j = 0; j < V; j++) m = z[j] > m ? z[j] : m;
    row_max[n] = m;
  }
}

/* logits (N, V), row_max, row_sum (N): pass 2, Σ exp(logit − max) over this shard's columns */
CPU_CLONES
static void ce_row_sum(float *restrict row_sum, const float *restrict logits,
                       const float *restrict row_max, int N, int V) {
  for (int n = 0; n < N; n++) {
    const float *z = logits + (size_t)n * V;
    float m = row_max[n];
    double sum = 0.0; /* a vocabulary row is long: keep the many small terms */
    float e[BF16_CHUNK]; /* the exponentials a chunk at a time (vectorised), summed in order */
    for (int j0 = 0; j0 < V; j0 += BF16_CHUNK) {
      int c = V - j0 < BF16_CHUNK ? V - j0 : BF16_CHUNK;
      for (int j = 0; j < c; j++) e[j] = ff_exp_lanes(z[j0 + j] - m);
      for (int j = 0; j < c; j++) sum += e[j];
    }
    row_sum[n] = (float)sum;
  }
}

/* logits, dlogits (N, V) (may be the same array; dlogits NULL: loss only), targets, loss,
 * row_max, row_sum (N), with global max and sum: pass 3, loss += log Σ − (logit[target] − max)
 * where this shard owns the target, dlogits = (softmax − onehot) · scale (overwritten). */
CPU_CLONES
static void ce_loss_grad(float *loss, float *dlogits, const float *logits,
                         const int32_t *targets, const float *row_max, const float *row_sum,
                         int N, int V, int vocab_first, float scale) {
  for (int n = 0; n < N; n++) {
    const float *z = logits + (size_t)n * V;
    float m = row_max[n], inv_sum = 1.0f / row_sum[n];
    int64_t target = (int64_t)targets[n] - vocab_first; /* in [0, V) when this shard owns it */
    int owned = target >= 0 && target < V;
    if (owned) loss[n] += logf(row_sum[n]) - (z[target] - m);
    if (!dlogits) continue;
    float *dz = dlogits + (size_t)n * V;
    for (int j = 0; j < V; j++) dz[j] = ff_exp_lanes(z[j] - m) * inv_sum * scale;
    if (owned) dz[target] -= scale;
  }
}

static void ce_loss_grad_bf16(float *restrict loss, uint16_t *restrict dlogits,
                              const float *restrict logits, const int32_t *restrict targets,
                              const float *restrict row_max, const float *restrict row_sum, int N,
                              int V, int vocab_first, float scale) {
  ce_loss_grad(loss, NULL, logits, targets, row_max, row_sum, N, V, vocab_first, scale);
  float tmp[BF16_CHUNK];
  for (int n = 0; n < N; n++) { /* the gradient as ce_loss_grad makes it, BF16_CHUNK at a time */
    const float *z = logits + (size_t)n * V;
    float m = row_max[n], inv_sum = 1.0f / row_sum[n];
    int64_t target = (int64_t)targets[n] - vocab_first;
    for (int j0 = 0; j0 < V; j0 += BF16_CHUNK) {
      int c = V - j0 < BF16_CHUNK ? V - j0 : BF16_CHUNK;
      for (int j = 0; j < c; j++) tmp[j] = ff_exp_lanes(z[j0 + j] - m) * inv_sum * scale;
      if (target >= j0 && target < j0 + c) tmp[target - j0] -= scale;
      to_bf16(dlogits + (size_t)n * V + j0, tmp, c);
    }
  }
}

/* ---- optimizer -------------------------------------------------------------------------- */

/* param, grad, m, v (n). torch.optim.AdamW (single-tensor path), with g = grad · grad_scale:
 * p *= 1 − lr·wd; m = β1 m + (1−β1) g; v = β2 v + (1−β2) g²;
 * p −= lr/(1−β1^step) · m / (sqrt(v)/sqrt(1−β2^step) + eps) */
CPU_CLONES
static void adamw(float *restrict param, const float *restrict grad, float *restrict m,
                  float *restrict v, int64_t n, float lr, float beta1, float beta2, float eps,
                  float weight_decay, int64_t step, float grad_scale) {
  float decay = (float)(1.0 - (double)lr * weight_decay);
  float step_size = (float)(lr / (1.0 - pow(beta1, (double)step)));
  float bc2_sqrt = (float)sqrt(1.0 - pow(beta2, (double)step));
  float one_minus_b1 = 1.0f - beta1, one_minus_b2 = 1.0f - beta2;
  for (int64_t i = 0; i < n; i++) {
    float g = grad[i] * grad_scale;
    float mi = beta1 * m[i] + one_minus_b1 * g;
    float vi = beta2 * v[i] + one_minus_b2 * g * g;
    m[i] = mi;
    v[i] = vi;
    float p = param[i] * decay; /* torch: param.mul_(1 - lr * wd) first */
    param[i] = p - step_size * (mi / (sqrtf(vi) / bc2_sqrt + eps));
  }
}

/* x (n): Σ x² in double, in CPU_LANES partial sums combined in a fixed order */
static double sum_squares(const float *restrict x, int64_t n) {
  double lane[CPU_LANES] = {0}, sum = 0.0;
  int64_t i = 0;
  for (; i + CPU_LANES <= n; i += CPU_LANES)
    for (int l = 0; l < CPU_LANES; l++) lane[l] += (double)x[i + l] * x[i + l];
  for (int l = 0; l < CPU_LANES; l++) sum += lane[l];
  for (; i < n; i++) sum += (double)x[i] * x[i];
  return sum;
}

static void copy_rows(float *restrict dst, int64_t dst_stride, const float *restrict src,
                      int64_t src_stride, int64_t width, int64_t rows) {
  for (int64_t r = 0; r < rows; r++)
    memcpy(dst + r * dst_stride, src + r * src_stride, (size_t)width * sizeof *dst);
}

CPU_CLONES
static void to_bf16(uint16_t *restrict dst, const float *restrict src, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    uint32_t bits;
    memcpy(&bits, &src[i], sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it one, quiet */
      dst[i] = (uint16_t)((bits >> 16) | 0x0040u);
    else
      dst[i] = (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
  }
}

CPU_CLONES
static void from_bf16(float *restrict dst, const uint16_t *restrict src, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    uint32_t bits = (uint32_t)src[i] << 16;
    memcpy(&dst[i], &bits, sizeof bits);
  }
}

/* ---- timed entry points ----------------------------------------------------------------- */

#define TIMED(seconds, call)                                                                   \
  do {                                                                                         \
    double t_ = wall_seconds();                                                                \
    call;                                                                                      \
    (seconds) += wall_seconds() - t_;                                                          \
  } while (0)

static void matmul_fwd(float *out, const float *inp, const float *w, int N, int In, int Out) {
  TIMED(cpu_matmul_seconds, matmul_fwd_untimed(out, inp, w, N, In, Out));
}

static void matmul_bwd(float *dinp, float *dw, const float *dout, const float *inp,
                       const float *w, int N, int In, int Out) {
  TIMED(cpu_matmul_seconds, matmul_bwd_untimed(dinp, dw, dout, inp, w, N, In, Out));
}

static void matmul_fwd_bf16(float *out, const uint16_t *inp, const uint16_t *w, int N, int In,
                            int Out) {
  TIMED(cpu_matmul_seconds, matmul_fwd_bf16_untimed(out, inp, w, N, In, Out));
}

static void matmul_bwd_bf16(float *dinp, float *dw, const uint16_t *dout, const uint16_t *inp,
                            const uint16_t *w, int N, int In, int Out) {
  TIMED(cpu_matmul_seconds, matmul_bwd_bf16_untimed(dinp, dw, dout, inp, w, N, In, Out, false));
}

static void matmul_bwd_bf16_acc(float *dinp, float *dw, const uint16_t *dout,
                                const uint16_t *inp, const uint16_t *w, int N, int In, int Out) {
  TIMED(cpu_matmul_seconds, matmul_bwd_bf16_untimed(dinp, dw, dout, inp, w, N, In, Out, true));
}

static void matmul_fwd_bf16_rounded(uint16_t *out, const uint16_t *inp, const uint16_t *w, int N,
                                    int In, int Out) {
  TIMED(cpu_matmul_seconds, matmul_fwd_bf16_rounded_untimed(out, inp, w, N, In, Out));
}

static void attention_fwd(float *out, float *lse, const float *q, const float *k, const float *v,
                          int B, int S, int Hq, int Hkv, int D, int q_first, int kv_first,
                          int group) {
  TIMED(cpu_attention_seconds,
        attention_fwd_untimed(out, lse, q, k, v, B, S, Hq, Hkv, D, q_first, kv_first, group));
}

static void attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *out,
                          const float *lse, const float *q, const float *k, const float *v, int B,
                          int S, int Hq, int Hkv, int D, int q_first, int kv_first, int group) {
  TIMED(cpu_attention_seconds, attention_bwd_untimed(dq, dk, dv, dout, out, lse, q, k, v, B, S,
                                                     Hq, Hkv, D, q_first, kv_first, group));
}

/* The bf16 forms compute from widened copies in the caller's work room (ff_attention_widened.c),
 * through this table. */
static const ff_kernels cpu_kernels;

static void attention_fwd_bf16(uint16_t *out, float *lse, const uint16_t *q, const uint16_t *k,
                               const uint16_t *v, int B, int S, int Hq, int Hkv, int D,
                               int q_first, int kv_first, int group, float *work) {
  ff_attention_fwd_widened(&cpu_kernels, out, lse, q, k, v, B, S, Hq, Hkv, D, q_first, kv_first,
                           group, work);
}

static void attention_bwd_bf16(float *dq, float *dk, float *dv, const float *dout,
                               const uint16_t *out, const float *lse, const uint16_t *q,
                               const uint16_t *k, const uint16_t *v, int B, int S, int Hq,
                               int Hkv, int D, int q_first, int kv_first, int group, float *work) {
  ff_attention_bwd_widened(&cpu_kernels, dq, dk, dv, dout, out, lse, q, k, v, B, S, Hq, Hkv, D,
                           q_first, kv_first, group, work);
}

/* ---- the table -------------------------------------------------------------------------- */

static const ff_kernels cpu_kernels = {
    .name = "cpu",
    .host_memory = true,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .zero = cpu_zero,
    .to_device = cpu_copy,
    .to_host = cpu_copy,
    .alloc_host = cpu_alloc_host,
    .release_host = cpu_release,
    .sync = cpu_sync,
    .memory = cpu_memory,
    .op_seconds = cpu_op_seconds,
    .matmul_fwd = matmul_fwd,
    .matmul_bwd = matmul_bwd,
    .matmul_fwd_bf16 = matmul_fwd_bf16,
    .matmul_bwd_bf16 = matmul_bwd_bf16,
    .matmul_fwd_bf16_rounded = matmul_fwd_bf16_rounded,
    .matmul_bwd_bf16_acc = matmul_bwd_bf16_acc,
    .embedding_fwd = embedding_fwd,
    .embedding_bwd = embedding_bwd,
    .rmsnorm_fwd = rmsnorm_fwd,
    .rmsnorm_bwd = rmsnorm_bwd,
    .rmsnorm_fwd_bf16 = rmsnorm_fwd_bf16,
    .rmsnorm_bwd_acc = rmsnorm_bwd_acc,
    .rmsnorm_bwd_acc_bf16 = rmsnorm_bwd_acc_bf16,
    .rope_fwd = rope_fwd,
    .rope_bwd = rope_bwd,
    .rope_fwd_bf16 = rope_fwd_bf16,
    .rope_bwd_bf16 = rope_bwd_bf16,
    .attention_fwd = attention_fwd,
    .attention_bwd = attention_bwd,
    .attention_fwd_bf16 = attention_fwd_bf16,
    .attention_bwd_bf16 = attention_bwd_bf16,
    .swiglu_fwd = swiglu_fwd,
    .swiglu_bwd = swiglu_bwd,
    .swiglu_fwd_bf16 = swiglu_fwd_bf16,
    .swiglu_bwd_bf16 = swiglu_bwd_bf16,
    .add = add,
    .accumulate = accumulate,
    .scale = scale,
    .ce_row_max = ce_row_max,
    .ce_row_sum = ce_row_sum,
    .ce_loss_grad = ce_loss_grad,
    .ce_loss_grad_bf16 = ce_loss_grad_bf16,
    .adamw = adamw,
    .sum_squares = sum_squares,
    .copy_rows = copy_rows,
    .to_bf16 = to_bf16,
    .from_bf16 = from_bf16,
};

const ff_kernels *ff_kernels_cpu(int threads) {
  openblas_set_num_threads(threads > 0 ? threads : 1);
  return &cpu_kernels;
}

/* The same kernels, declaring their memory off limits to the host. */
static ff_kernels staged_kernels;

const ff_kernels *ff_kernels_cpu_staged(int threads) {
  staged_kernels = *ff_kernels_cpu(threads);
  staged_kernels.name = "cpu-staged";
  staged_kernels.host_memory = false;
  return &staged_kernels;
}
