/* test_kernels.c — every operation of the CPU backend (ff_kernels_cpu) against an independent
 * naive float64 reference written here: forwards against the reference directly, backwards
 * against central finite differences of the scalar loss Σ dout·f(x) on that float64 reference
 * (a fixed random dout). Shapes are small, tolerance relative (fp32 kernels vs float64 truth).
 * Also the contracts of the header: accumulate (+=) versus overwrite (=), vocabulary and head
 * shards, causality, in-place forms, and bit-for-bit determinism. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ff_exp.h"
#include "ff_kernels.h"

#define TOL 1e-4      /* relative: fp32 kernels against float64 truth */
#define FD_STEP 1e-5  /* central differences in float64: error ~ step² and 1e-16/step */
#define GARBAGE 1e30f /* fills outputs the kernels must overwrite */

static const ff_kernels *K;

static int setup(void **state) {
  (void)state;
  K = ff_kernels_cpu(1);
  return K ? 0 : -1;
}

/* ---- helpers ---------------------------------------------------------------------------- */

/* uniform in [-1, 1) from a splitmix64 stream: the same on every machine */
static float frand(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return (float)((double)(z >> 40) / (double)(1ull << 23) - 1.0);
}

static float *fvec(int64_t n) {
  float *x = calloc((size_t)(n > 0 ? n : 1), sizeof *x);
  assert_non_null(x);
  return x;
}

static double *dvec(int64_t n) {
  double *x = calloc((size_t)(n > 0 ? n : 1), sizeof *x);
  assert_non_null(x);
  return x;
}

static float *frandom(int64_t n, float scale, uint64_t seed) {
  float *x = fvec(n);
  for (int64_t i = 0; i < n; i++) x[i] = scale * frand(&seed);
  return x;
}

static float *ffill(int64_t n, float value) {
  float *x = fvec(n);
  for (int64_t i = 0; i < n; i++) x[i] = value;
  return x;
}

static double *widen(const float *x, int64_t n) {
  double *y = dvec(n);
  for (int64_t i = 0; i < n; i++) y[i] = x[i];
  return y;
}

static float *fcopy(const float *x, int64_t n) {
  float *y = fvec(n);
  memcpy(y, x, (size_t)n * sizeof *y);
  return y;
}

/* |got − want| ≤ tol·(|want| + max|want|) elementwise: relative, with an absolute floor set by
 * the array's scale so entries near zero do not demand impossible precision */
static void assert_close(const char *what, const float *got, const double *want, int64_t n,
                         double tol) {
  double scale = 0.0;
  for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(want[i]));
  for (int64_t i = 0; i < n; i++)
    if (!(fabs(got[i] - want[i]) <= tol * (fabs(want[i]) + scale)))
      fail_msg("%s[%lld]: got %.9g, want %.9g (scale %.3g)", what, (long long)i, got[i],
               want[i], scale);
}

static void assert_close_f(const char *what, const float *got, const float *want, int64_t n,
                           double tol) {
  double *w = widen(want, n);
  assert_close(what, got, w, n, tol);
  free(w);
}

static double dot_d(const double *a, const double *b, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
  return s;
}

/* grad(n) = ∂loss/∂x by central differences; x lies inside ctx, which loss reads */
typedef double (*loss_fn)(void *ctx);

static void finite_difference(double *grad, double *x, int64_t n, loss_fn loss, void *ctx) {
  for (int64_t i = 0; i < n; i++) {
    double saved = x[i];
    x[i] = saved + FD_STEP;
    double up = loss(ctx);
    x[i] = saved - FD_STEP;
    double down = loss(ctx);
    x[i] = saved;
    grad[i] = (up - down) / (2.0 * FD_STEP);
  }
}

/* ---- memory ----------------------------------------------------------------------------- */

static void alloc_returns_zeroed_cache_aligned_memory_and_copies_round_trip(void **state) {
  (void)state;
  assert_string_equal(K->name, "cpu");
  float *a = K->alloc(1000 * sizeof(float));
  assert_non_null(a);
  assert_true((uintptr_t)a % 64 == 0);
  for (int i = 0; i < 1000; i++) assert_true(a[i] == 0.0f);
  void *empty = K->alloc(0);
  assert_non_null(empty);
  float *host = frandom(1000, 1.0f, 1), *back = fvec(1000);
  K->to_device(a, host, 1000 * sizeof(float));
  K->to_host(back, a, 1000 * sizeof(float));
  assert_memory_equal(back, host, 1000 * sizeof(float));
  K->zero(a, 1000 * sizeof(float));
  for (int i = 0; i < 1000; i++) assert_true(a[i] == 0.0f);
  K->release(a);
  K->release(empty);
  free(host);
  free(back);
}

/* ---- matmul ----------------------------------------------------------------------------- */

enum { MM_N = 5, MM_I = 8, MM_O = 6 };

typedef struct matmul_problem {
  double inp[MM_N * MM_I], w[MM_O * MM_I], dout[MM_N * MM_O], out[MM_N * MM_O];
} matmul_problem;

/* out(N, O) = inp(N, I) · w(O, I)ᵀ */
static void ref_matmul(double *out, const double *inp, const double *w, int N, int I, int O) {
  for (int n = 0; n < N; n++)
    for (int o = 0; o < O; o++) out[n * O + o] = dot_d(inp + n * I, w + o * I, I);
}

static double matmul_loss(void *ctx) {
  matmul_problem *p = ctx;
  ref_matmul(p->out, p->inp, p->w, MM_N, MM_I, MM_O);
  return dot_d(p->dout, p->out, MM_N * MM_O);
}

static matmul_problem *matmul_problem_of(const float *inp, const float *w, const float *dout) {
  matmul_problem *p = calloc(1, sizeof *p);
  assert_non_null(p);
  for (int i = 0; i < MM_N * MM_I; i++) p->inp[i] = inp[i];
  for (int i = 0; i < MM_O * MM_I; i++) p->w[i] = w[i];
  for (int i = 0; i < MM_N * MM_O; i++) p->dout[i] = dout[i];
  return p;
}

static void matmul_fwd_is_inp_times_w_transposed(void **state) {
  (void)state;
  float *inp = frandom(MM_N * MM_I, 1.0f, 11), *w = frandom(MM_O * MM_I, 1.0f, 12);
  float *out = ffill(MM_N * MM_O, GARBAGE);
  double *want = dvec(MM_N * MM_O), *inp_d = widen(inp, MM_N * MM_I), *w_d = widen(w, MM_O * MM_I);
  K->matmul_fwd(out, inp, w, MM_N, MM_I, MM_O);
  ref_matmul(want, inp_d, w_d, MM_N, MM_I, MM_O);
  assert_close("out", out, want, MM_N * MM_O, TOL);
  free(inp), free(w), free(out), free(want), free(inp_d), free(w_d);
}

static void matmul_bwd_matches_finite_differences_and_accumulates_dw(void **state) {
  (void)state;
  float *inp = frandom(MM_N * MM_I, 1.0f, 21), *w = frandom(MM_O * MM_I, 1.0f, 22);
  float *dout = frandom(MM_N * MM_O, 1.0f, 23);
  float *dinp = ffill(MM_N * MM_I, GARBAGE), *dw = fvec(MM_O * MM_I);
  matmul_problem *p = matmul_problem_of(inp, w, dout);
  double *want_dinp = dvec(MM_N * MM_I), *want_dw = dvec(MM_O * MM_I);
  finite_difference(want_dinp, p->inp, MM_N * MM_I, matmul_loss, p);
  finite_difference(want_dw, p->w, MM_O * MM_I, matmul_loss, p);

  K->matmul_bwd(dinp, dw, dout, inp, w, MM_N, MM_I, MM_O);
  assert_close("dinp", dinp, want_dinp, MM_N * MM_I, TOL);
  assert_close("dw", dw, want_dw, MM_O * MM_I, TOL);
  /* a second call overwrites dinp and adds to dw */
  K->matmul_bwd(dinp, dw, dout, inp, w, MM_N, MM_I, MM_O);
  for (int i = 0; i < MM_O * MM_I; i++) want_dw[i] *= 2.0;
  assert_close("dinp twice", dinp, want_dinp, MM_N * MM_I, TOL);
  assert_close("dw twice", dw, want_dw, MM_O * MM_I, TOL);
  free(inp), free(w), free(dout), free(dinp), free(dw), free(p), free(want_dinp), free(want_dw);
}

static void matmul_bwd_with_null_dinp_only_accumulates_dw(void **state) {
  (void)state;
  float *inp = frandom(MM_N * MM_I, 1.0f, 31), *w = frandom(MM_O * MM_I, 1.0f, 32);
  float *dout = frandom(MM_N * MM_O, 1.0f, 33);
  float *dw_alone = fvec(MM_O * MM_I), *dw_both = fvec(MM_O * MM_I), *dinp = fvec(MM_N * MM_I);
  K->matmul_bwd(NULL, dw_alone, dout, inp, w, MM_N, MM_I, MM_O);
  K->matmul_bwd(dinp, dw_both, dout, inp, w, MM_N, MM_I, MM_O);
  assert_memory_equal(dw_alone, dw_both, MM_O * MM_I * sizeof(float));
  free(inp), free(w), free(dout), free(dw_alone), free(dw_both), free(dinp);
}

/* The bf16 matmuls compute exactly what the fp32 ones do on the bf16 values: checked on shapes
 * that span several of the CPU backend's 256-wide blocks in every dimension, with ragged ends. */
enum { BM_N = 300, BM_I = 520, BM_O = 270 };

static uint16_t *bf16_random(int64_t n, uint64_t seed, double **exact) {
  float *x = frandom(n, 1.0f, seed), *back = fvec(n);
  uint16_t *h = calloc((size_t)n, sizeof *h);
  assert_non_null(h);
  K->to_bf16(h, x, n);
  K->from_bf16(back, h, n);
  *exact = widen(back, n);
  free(x), free(back);
  return h;
}

static void bf16_matmuls_match_float64_on_the_bf16_values(void **state) {
  (void)state;
  double *inp_d, *w_d, *dout_d;
  uint16_t *inp = bf16_random(BM_N * BM_I, 41, &inp_d), *w = bf16_random(BM_O * BM_I, 42, &w_d);
  uint16_t *dout = bf16_random(BM_N * BM_O, 43, &dout_d);
  float *out = ffill(BM_N * BM_O, GARBAGE), *dinp = ffill(BM_N * BM_I, GARBAGE);
  float *dw = ffill(BM_O * BM_I, 0.5f), *dw_only = ffill(BM_O * BM_I, 0.5f);
  double *want = dvec(BM_N * BM_O), *want_dinp = dvec(BM_N * BM_I), *want_dw = dvec(BM_O * BM_I);
  ref_matmul(want, inp_d, w_d, BM_N, BM_I, BM_O);
  for (int n = 0; n < BM_N; n++)
    for (int o = 0; o < BM_O; o++)
      for (int i = 0; i < BM_I; i++) {
        want_dinp[n * BM_I + i] += dout_d[n * BM_O + o] * w_d[o * BM_I + i];
        want_dw[o * BM_I + i] += dout_d[n * BM_O + o] * inp_d[n * BM_I + i];
      }
  for (int j = 0; j < BM_O * BM_I; j++) want_dw[j] += 0.5; /* dw accumulates */
  K->matmul_fwd_bf16(out, inp, w, BM_N, BM_I, BM_O);
  assert_close("out", out, want, BM_N * BM_O, TOL);
  K->matmul_bwd_bf16(dinp, dw, dout, inp, w, BM_N, BM_I, BM_O);
  assert_close("dinp", dinp, want_dinp, BM_N * BM_I, TOL);
  assert_close("dw", dw, want_dw, BM_O * BM_I, TOL);
  K->matmul_bwd_bf16(NULL, dw_only, dout, inp, w, BM_N, BM_I, BM_O);
  assert_memory_equal(dw_only, dw, BM_O * BM_I * sizeof(float));
  /* the _acc form adds its input gradient: dinp (= d) plus d again */
  K->matmul_bwd_bf16_acc(dinp, NULL, dout, inp, w, BM_N, BM_I, BM_O);
  for (int j = 0; j < BM_N * BM_I; j++) want_dinp[j] *= 2.0;
  assert_close("dinp added", dinp, want_dinp, BM_N * BM_I, TOL);
  /* an empty reduction writes zeros */
  K->matmul_fwd_bf16(out, inp, w, BM_N, 0, BM_O);
  for (int j = 0; j < BM_N * BM_O; j++) assert_true(out[j] == 0.0f);
  free(inp), free(w), free(dout), free(out), free(dinp), free(dw), free(dw_only);
  free(inp_d), free(w_d), free(dout_d), free(want), free(want_dinp), free(want_dw);
}

/* The bf16-writing forms give the bits of the fp32 form rounded by to_bf16, across the chunks
 * and tiles they compute in (rows of 600, 1000 elements, the bf16 matmul's shape: ragged ends). */
static void assert_rounds_of(const char *what, const uint16_t *got, const float *fp32, int64_t n) {
  uint16_t *want = calloc((size_t)n, sizeof *want);
  assert_non_null(want);
  K->to_bf16(want, fp32, n);
  for (int64_t i = 0; i < n; i++)
    if (got[i] != want[i])
      fail_msg("%s[%lld]: 0x%04x, to_bf16 of the fp32 result 0x%04x", what, (long long)i,
               got[i], want[i]);
  free(want);
}

static void bf16_writing_kernels_round_their_fp32_results(void **state) {
  (void)state;
  enum { RN = 3, RC = 600, SN = 1000 };
  float *x = frandom(RN * RC, 2.0f, 51), *w = frandom(RC, 1.0f, 52), *out = fvec(RN * RC);
  float *rstd = fvec(RN), *rstd16 = fvec(RN);
  uint16_t *h = calloc(RN * RC, sizeof *h), *g16 = calloc(SN, sizeof *g16);
  uint16_t *u16 = calloc(SN, sizeof *u16);
  assert_true(h && g16 && u16);
  K->rmsnorm_fwd(out, rstd, x, w, RN, RC, 1e-5f);
  K->rmsnorm_fwd_bf16(h, rstd16, x, w, RN, RC, 1e-5f);
  assert_rounds_of("rmsnorm_fwd_bf16", h, out, RN * RC);
  assert_memory_equal(rstd, rstd16, RN * sizeof *rstd);
  /* SwiGLU's bf16 forms read bf16 gate and up: against the fp32 forms on the same values */
  double *gate_d, *up_d;
  uint16_t *gate = bf16_random(SN, 53, &gate_d), *up = bf16_random(SN, 54, &up_d);
  float *gate_f = fvec(SN), *up_f = fvec(SN), *dout = frandom(SN, 1.0f, 55);
  K->from_bf16(gate_f, gate, SN);
  K->from_bf16(up_f, up, SN);
  float *act = fvec(SN), *dg = fvec(SN), *du = fvec(SN);
  K->swiglu_fwd(act, gate_f, up_f, SN);
  K->swiglu_fwd_bf16(g16, gate, up, SN);
  assert_rounds_of("swiglu_fwd_bf16", g16, act, SN);
  K->swiglu_bwd(dg, du, dout, gate_f, up_f, SN);
  K->swiglu_bwd_bf16(g16, u16, dout, gate, up, SN);
  assert_rounds_of("swiglu_bwd_bf16 dgate", g16, dg, SN);
  assert_rounds_of("swiglu_bwd_bf16 dup", u16, du, SN);
  /* the rounded matmul: matmul_fwd_bf16's fp32 product, rounded */
  double *w_d, *x_d;
  uint16_t *wm = bf16_random(BM_O * BM_I, 56, &w_d), *xm = bf16_random(BM_N * BM_I, 57, &x_d);
  free(w_d), free(x_d);
  float *prod = fvec(BM_N * BM_O);
  uint16_t *prod16 = calloc(BM_N * BM_O, sizeof *prod16);
  assert_non_null(prod16);
  K->matmul_fwd_bf16(prod, xm, wm, BM_N, BM_I, BM_O);
  K->matmul_fwd_bf16_rounded(prod16, xm, wm, BM_N, BM_I, BM_O);
  assert_rounds_of("matmul_fwd_bf16_rounded", prod16, prod, BM_N * BM_O);
  free(x), free(w), free(out), free(rstd), free(rstd16), free(h), free(g16), free(u16);
  free(gate), free(up), free(gate_d), free(up_d), free(gate_f), free(up_f), free(dout), free(act);
  free(dg), free(du), free(wm), free(xm), free(prod), free(prod16);
}

/* The bf16 attention forms compute what the fp32 forms compute on the bf16 values (the forward's
 * output rounded); the bf16 RoPE and cross-entropy forms write the fp32 forms' results rounded. */
static void bf16_attention_rope_and_loss_are_the_fp32_forms_rounded(void **state) {
  (void)state;
  enum { B = 2, S = 9, HQ = 4, HKV = 2, D = 8, NQ = B * S * HQ * D, NK = B * S * HKV * D };
  double *unused[3];
  uint16_t *q = bf16_random(NQ, 61, &unused[0]), *k = bf16_random(NK, 62, &unused[1]);
  uint16_t *v = bf16_random(NK, 63, &unused[2]);
  float *qf = fvec(NQ), *kf = fvec(NK), *vf = fvec(NK), *out = fvec(NQ), *lse = fvec(B * HQ * S);
  float *lse16 = fvec(B * HQ * S), *work = fvec(2 * NQ + 2 * NK), *dout = frandom(NQ, 1.0f, 64);
  uint16_t *out16 = calloc(NQ, sizeof *out16);
  assert_non_null(out16);
  K->from_bf16(qf, q, NQ), K->from_bf16(kf, k, NK), K->from_bf16(vf, v, NK);
  K->attention_fwd(out, lse, qf, kf, vf, B, S, HQ, HKV, D, 0, 0, 2);
  K->attention_fwd_bf16(out16, lse16, q, k, v, B, S, HQ, HKV, D, 0, 0, 2, work);
  assert_rounds_of("attention_fwd_bf16 out", out16, out, NQ);
  assert_memory_equal(lse, lse16, B * HQ * S * sizeof *lse);
  float *outw = fvec(NQ), *g[6];
  for (int i = 0; i < 6; i++) g[i] = fvec(i % 3 == 0 ? NQ : NK);
  K->from_bf16(outw, out16, NQ);
  K->attention_bwd(g[0], g[1], g[2], dout, outw, lse, qf, kf, vf, B, S, HQ, HKV, D, 0, 0, 2);
  K->attention_bwd_bf16(g[3], g[4], g[5], dout, out16, lse, q, k, v, B, S, HQ, HKV, D, 0, 0, 2,
                        work);
  assert_memory_equal(g[0], g[3], NQ * sizeof(float));
  assert_memory_equal(g[1], g[4], NK * sizeof(float));
  assert_memory_equal(g[2], g[5], NK * sizeof(float));
  float *x = frandom(NQ, 1.0f, 65), *rot = fcopy(x, NQ);
  K->rope_fwd(rot, B, S, HQ, D, 10000.0f);
  K->rope_fwd_bf16(out16, x, B, S, HQ, D, 10000.0f);
  assert_rounds_of("rope_fwd_bf16", out16, rot, NQ);
  float *dx = frandom(NQ, 1.0f, 66), *back = fcopy(dx, NQ);
  K->rope_bwd(back, B, S, HQ, D, 10000.0f);
  K->rope_bwd_bf16(out16, dx, B, S, HQ, D, 10000.0f);
  assert_rounds_of("rope_bwd_bf16", out16, back, NQ);
  free(dx), free(back);
  /* ce_loss_grad_bf16: the same loss, and the gradient rounded (rows of 600: ragged chunks) */
  enum { CN = 3, CV = 600 };
  float *z = frandom(CN * CV, 4.0f, 67), *mx = fvec(CN), *sum = fvec(CN), *dz = fvec(CN * CV);
  float *loss = fvec(CN), *loss16 = fvec(CN);
  int32_t tgt[CN] = {5, 599, 1000}; /* the last one off this shard */
  uint16_t *dz16 = calloc(CN * CV, sizeof *dz16);
  assert_non_null(dz16);
  K->ce_row_max(mx, z, CN, CV);
  K->ce_row_sum(sum, z, mx, CN, CV);
  K->ce_loss_grad(loss, dz, z, tgt, mx, sum, CN, CV, 0, 0.25f);
  K->ce_loss_grad_bf16(loss16, dz16, z, tgt, mx, sum, CN, CV, 0, 0.25f);
  assert_memory_equal(loss, loss16, CN * sizeof *loss);
  assert_rounds_of("ce_loss_grad_bf16", dz16, dz, CN * CV);
  free(z), free(mx), free(sum), free(dz), free(loss), free(loss16), free(dz16);
  for (int i = 0; i < 3; i++) free(unused[i]);
  for (int i = 0; i < 6; i++) free(g[i]);
  free(q), free(k), free(v), free(qf), free(kf), free(vf), free(out), free(lse), free(lse16);
  free(work), free(dout), free(out16), free(outw), free(x), free(rot);
}

/* ---- embedding -------------------------------------------------------------------------- */

enum { EMB_N = 7, EMB_C = 8, EMB_FIRST = 3, EMB_END = 7 }; /* a shard of rows [3, 7) of 10 */
static const int32_t emb_tokens[EMB_N] = {0, 3, 6, 7, 9, 3, 5};

static int emb_in_shard(int32_t tok) { return tok >= EMB_FIRST && tok < EMB_END; }

static void embedding_fwd_copies_shard_rows_and_zeros_tokens_off_the_shard(void **state) {
  (void)state;
  float *table = frandom((EMB_END - EMB_FIRST) * EMB_C, 1.0f, 41);
  float *out = ffill(EMB_N * EMB_C, GARBAGE);
  K->embedding_fwd(out, emb_tokens, table, EMB_N, EMB_C, EMB_FIRST, EMB_END);
  for (int n = 0; n < EMB_N; n++)
    for (int c = 0; c < EMB_C; c++) {
      float want = emb_in_shard(emb_tokens[n]) ? table[(emb_tokens[n] - EMB_FIRST) * EMB_C + c]
                                               : 0.0f;
      assert_true(out[n * EMB_C + c] == want);
    }
  free(table), free(out);
}

static void embedding_bwd_adds_dout_to_shard_rows_and_ignores_tokens_off_the_shard(void **state) {
  (void)state;
  int rows = EMB_END - EMB_FIRST;
  float *dtable = frandom(rows * EMB_C, 1.0f, 51), *dout = frandom(EMB_N * EMB_C, 1.0f, 52);
  double *want = widen(dtable, rows * EMB_C);
  for (int n = 0; n < EMB_N; n++)
    if (emb_in_shard(emb_tokens[n]))
      for (int c = 0; c < EMB_C; c++)
        want[(emb_tokens[n] - EMB_FIRST) * EMB_C + c] += dout[n * EMB_C + c];
  K->embedding_bwd(dtable, dout, emb_tokens, EMB_N, EMB_C, EMB_FIRST, EMB_END);
  assert_close("dtable", dtable, want, rows * EMB_C, TOL);
  free(dtable), free(dout), free(want);
}

/* ---- RMSNorm ---------------------------------------------------------------------------- */

enum { RN_N = 5, RN_C = 11 }; /* C not a multiple of the kernel's 8 lanes */
#define RN_EPS 1e-5f

typedef struct rmsnorm_problem {
  double inp[RN_N * RN_C], w[RN_C], dout[RN_N * RN_C], out[RN_N * RN_C], rstd[RN_N];
} rmsnorm_problem;

static void ref_rmsnorm(double *out, double *rstd, const double *inp, const double *w, int N,
                        int C, double eps) {
  for (int n = 0; n < N; n++) {
    const double *x = inp + n * C;
    rstd[n] = 1.0 / sqrt(dot_d(x, x, C) / C + eps);
    for (int c = 0; c < C; c++) out[n * C + c] = x[c] * rstd[n] * w[c];
  }
}

static double rmsnorm_loss(void *ctx) {
  rmsnorm_problem *p = ctx;
  ref_rmsnorm(p->out, p->rstd, p->inp, p->w, RN_N, RN_C, RN_EPS);
  return dot_d(p->dout, p->out, RN_N * RN_C);
}

static void rmsnorm_fwd_scales_rows_by_reciprocal_rms_and_weight(void **state) {
  (void)state;
  float *inp = frandom(RN_N * RN_C, 2.0f, 61), *w = frandom(RN_C, 1.0f, 62);
  float *out = ffill(RN_N * RN_C, GARBAGE), *rstd = fvec(RN_N);
  rmsnorm_problem *p = calloc(1, sizeof *p);
  assert_non_null(p);
  for (int i = 0; i < RN_N * RN_C; i++) p->inp[i] = inp[i];
  for (int i = 0; i < RN_C; i++) p->w[i] = w[i];
  rmsnorm_loss(p);
  K->rmsnorm_fwd(out, rstd, inp, w, RN_N, RN_C, RN_EPS);
  assert_close("out", out, p->out, RN_N * RN_C, TOL);
  assert_close("rstd", rstd, p->rstd, RN_N, TOL);
  free(inp), free(w), free(out), free(rstd), free(p);
}

static void rmsnorm_bwd_matches_finite_differences_and_accumulates_dw(void **state) {
  (void)state;
  float *inp = frandom(RN_N * RN_C, 2.0f, 71), *w = frandom(RN_C, 1.0f, 72);
  float *dout = frandom(RN_N * RN_C, 1.0f, 73), *dw = frandom(RN_C, 1.0f, 74);
  float *out = fvec(RN_N * RN_C), *rstd = fvec(RN_N), *dinp = ffill(RN_N * RN_C, GARBAGE);
  rmsnorm_problem *p = calloc(1, sizeof *p);
  assert_non_null(p);
  for (int i = 0; i < RN_N * RN_C; i++) p->inp[i] = inp[i], p->dout[i] = dout[i];
  for (int i = 0; i < RN_C; i++) p->w[i] = w[i];
  double *want_dinp = dvec(RN_N * RN_C), *want_dw = dvec(RN_C);
  finite_difference(want_dinp, p->inp, RN_N * RN_C, rmsnorm_loss, p);
  finite_difference(want_dw, p->w, RN_C, rmsnorm_loss, p);
  for (int i = 0; i < RN_C; i++) want_dw[i] += dw[i]; /* dw accumulates */

  K->rmsnorm_fwd(out, rstd, inp, w, RN_N, RN_C, RN_EPS);
  K->rmsnorm_bwd(dinp, dw, dout, inp, w, rstd, RN_N, RN_C);
  assert_close("dinp", dinp, want_dinp, RN_N * RN_C, TOL);
  assert_close("dw", dw, want_dw, RN_C, TOL);
  /* the _acc form adds its input gradient to dinp (and dw accumulates again) */
  float *twice = fcopy(dinp, RN_N * RN_C);
  K->rmsnorm_bwd_acc(twice, dw, dout, inp, w, rstd, RN_N, RN_C);
  for (int i = 0; i < RN_N * RN_C; i++) assert_true(twice[i] == dinp[i] + dinp[i]);
  free(twice);
  /* the bf16-input form: the fp32 form on the widened values, bit for bit (rows of 603, past
   * the CPU's chunk of 256 and not a multiple of its lanes) */
  enum { WN = 3, WC = 603 };
  double *unused;
  uint16_t *x16 = bf16_random(WN * WC, 75, &unused);
  float *xw = fvec(WN * WC), *ww = frandom(WC, 1.0f, 76), *dy = frandom(WN * WC, 1.0f, 77);
  float *rs = fvec(WN), *o = fvec(WN * WC), *d1 = ffill(WN * WC, 0.5f), *d2 = ffill(WN * WC, 0.5f);
  float *g1 = fvec(WC), *g2 = fvec(WC);
  K->from_bf16(xw, x16, WN * WC);
  K->rmsnorm_fwd(o, rs, xw, ww, WN, WC, RN_EPS);
  K->rmsnorm_bwd_acc(d1, g1, dy, xw, ww, rs, WN, WC);
  K->rmsnorm_bwd_acc_bf16(d2, g2, dy, x16, ww, rs, WN, WC);
  assert_memory_equal(d1, d2, WN * WC * sizeof *d1);
  assert_memory_equal(g1, g2, WC * sizeof *g1);
  free(unused), free(x16), free(xw), free(ww), free(dy), free(rs), free(o), free(d1), free(d2);
  free(g1), free(g2);
  free(inp), free(w), free(dout), free(dw), free(out), free(rstd), free(dinp), free(p);
  free(want_dinp), free(want_dw);
}

/* ---- RoPE ------------------------------------------------------------------------------- */

enum { RP_B = 2, RP_S = 5, RP_H = 3, RP_D = 8, RP_N = RP_B * RP_S * RP_H * RP_D };
#define RP_THETA 10.0f /* small, so the later pairs turn by visible angles at S = 5 */

typedef struct rope_problem {
  double x[RP_N], dout[RP_N], out[RP_N];
} rope_problem;

/* out = x with pair (2i, 2i+1) of position s turned by s · theta^(-2i/D) */
static void ref_rope(double *out, const double *x, int B, int S, int H, int D, double theta) {
  for (int bs = 0; bs < B * S; bs++)
    for (int h = 0; h < H; h++)
      for (int i = 0; i < D / 2; i++) {
        double angle = (bs % S) * pow(theta, -2.0 * i / D);
        const double *xp = x + (bs * H + h) * D + 2 * i;
        double *op = out + (bs * H + h) * D + 2 * i;
        op[0] = xp[0] * cos(angle) - xp[1] * sin(angle);
        op[1] = xp[0] * sin(angle) + xp[1] * cos(angle);
      }
}

static double rope_loss(void *ctx) {
  rope_problem *p = ctx;
  ref_rope(p->out, p->x, RP_B, RP_S, RP_H, RP_D, RP_THETA);
  return dot_d(p->dout, p->out, RP_N);
}

static void rope_fwd_turns_interleaved_pairs_by_position_times_frequency(void **state) {
  (void)state;
  float *x = frandom(RP_N, 1.0f, 81);
  double *x_d = widen(x, RP_N), *want = dvec(RP_N);
  ref_rope(want, x_d, RP_B, RP_S, RP_H, RP_D, RP_THETA);
  K->rope_fwd(x, RP_B, RP_S, RP_H, RP_D, RP_THETA);
  assert_close("rope", x, want, RP_N, TOL);
  /* position 0 is not turned at all */
  for (int b = 0; b < RP_B; b++)
    for (int i = 0; i < RP_H * RP_D; i++) {
      int at = b * RP_S * RP_H * RP_D + i;
      assert_true(x[at] == (float)x_d[at]);
    }
  free(x), free(x_d), free(want);
}

static void rope_bwd_undoes_rope_fwd(void **state) {
  (void)state;
  float *x = frandom(RP_N, 1.0f, 91), *orig = fcopy(x, RP_N);
  K->rope_fwd(x, RP_B, RP_S, RP_H, RP_D, 10000.0f);
  K->rope_bwd(x, RP_B, RP_S, RP_H, RP_D, 10000.0f);
  assert_close_f("bwd(fwd(x))", x, orig, RP_N, 1e-6);
  free(x), free(orig);
}

static void rope_bwd_matches_finite_differences(void **state) {
  (void)state;
  float *x = frandom(RP_N, 1.0f, 101), *dx = frandom(RP_N, 1.0f, 102);
  rope_problem *p = calloc(1, sizeof *p);
  assert_non_null(p);
  for (int i = 0; i < RP_N; i++) p->x[i] = x[i], p->dout[i] = dx[i];
  double *want = dvec(RP_N);
  finite_difference(want, p->x, RP_N, rope_loss, p);
  K->rope_bwd(dx, RP_B, RP_S, RP_H, RP_D, RP_THETA);
  assert_close("dx", dx, want, RP_N, TOL);
  free(x), free(dx), free(p), free(want);
}

/* ---- attention -------------------------------------------------------------------------- */

typedef struct attn_shape {
  int B, S, Hq, Hkv, D, q_first, kv_first, group;
} attn_shape;

static int64_t attn_nq(const attn_shape *a) { return (int64_t)a->B * a->S * a->Hq * a->D; }
static int64_t attn_nkv(const attn_shape *a) { return (int64_t)a->B * a->S * a->Hkv * a->D; }
static int64_t attn_nlse(const attn_shape *a) { return (int64_t)a->B * a->Hq * a->S; }

/* Naive causal attention in float64: the full score row of each query, softmax, weighted sum. */
static void ref_attention(double *out, double *lse, const double *q, const double *k,
                          const double *v, const attn_shape *a) {
  double *score = dvec(a->S);
  for (int b = 0; b < a->B; b++)
    for (int h = 0; h < a->Hq; h++)
      for (int t = 0; t < a->S; t++) {
        int hk = (a->q_first + h) / a->group - a->kv_first;
        const double *qt = q + ((b * a->S + t) * a->Hq + h) * a->D;
        double *ot = out + ((b * a->S + t) * a->Hq + h) * a->D, m = -INFINITY, sum = 0.0;
        for (int j = 0; j <= t; j++) {
          score[j] = dot_d(qt, k + ((b * a->S + j) * a->Hkv + hk) * a->D, a->D) / sqrt(a->D);
          m = fmax(m, score[j]);
        }
        for (int j = 0; j <= t; j++) sum += exp(score[j] - m);
        lse[(b * a->Hq + h) * a->S + t] = m + log(sum);
        for (int d = 0; d < a->D; d++) ot[d] = 0.0;
        for (int j = 0; j <= t; j++)
          for (int d = 0; d < a->D; d++)
            ot[d] += exp(score[j] - m) / sum * v[((b * a->S + j) * a->Hkv + hk) * a->D + d];
      }
  free(score);
}

typedef struct attn_problem {
  attn_shape a;
  double *q, *k, *v, *dout, *out, *lse;
} attn_problem;

static double attention_loss(void *ctx) {
  attn_problem *p = ctx;
  ref_attention(p->out, p->lse, p->q, p->k, p->v, &p->a);
  return dot_d(p->dout, p->out, attn_nq(&p->a));
}

/* Forward against the reference, backward against finite differences of Σ dout·out. */
static void check_attention(const attn_shape *a, uint64_t seed) {
  int64_t nq = attn_nq(a), nkv = attn_nkv(a), nl = attn_nlse(a);
  float *q = frandom(nq, 1.5f, seed), *k = frandom(nkv, 1.5f, seed + 1);
  float *v = frandom(nkv, 1.0f, seed + 2), *dout = frandom(nq, 1.0f, seed + 3);
  float *out = ffill(nq, GARBAGE), *lse = ffill(nl, GARBAGE);
  float *dq = ffill(nq, GARBAGE), *dk = ffill(nkv, GARBAGE), *dv = ffill(nkv, GARBAGE);
  attn_problem p = {*a, widen(q, nq), widen(k, nkv), widen(v, nkv), widen(dout, nq), dvec(nq),
                    dvec(nl)};
  double *want_dq = dvec(nq), *want_dk = dvec(nkv), *want_dv = dvec(nkv);
  finite_difference(want_dq, p.q, nq, attention_loss, &p);
  finite_difference(want_dk, p.k, nkv, attention_loss, &p);
  finite_difference(want_dv, p.v, nkv, attention_loss, &p);
  attention_loss(&p);

  K->attention_fwd(out, lse, q, k, v, a->B, a->S, a->Hq, a->Hkv, a->D, a->q_first, a->kv_first,
                   a->group);
  assert_close("out", out, p.out, nq, TOL);
  assert_close("lse", lse, p.lse, nl, TOL);
  K->attention_bwd(dq, dk, dv, dout, out, lse, q, k, v, a->B, a->S, a->Hq, a->Hkv, a->D,
                   a->q_first, a->kv_first, a->group);
  assert_close("dq", dq, want_dq, nq, TOL);
  assert_close("dk", dk, want_dk, nkv, TOL);
  assert_close("dv", dv, want_dv, nkv, TOL);
  free(q), free(k), free(v), free(dout), free(out), free(lse), free(dq), free(dk), free(dv);
  free(p.q), free(p.k), free(p.v), free(p.dout), free(p.out), free(p.lse);
  free(want_dq), free(want_dk), free(want_dv);
}

static void attention_mha_matches_reference_and_finite_differences(void **state) {
  (void)state;
  attn_shape a = {.B = 2, .S = 5, .Hq = 2, .Hkv = 2, .D = 4, .group = 1};
  check_attention(&a, 111);
}

static void attention_gqa_sums_dk_dv_over_the_query_heads_of_a_kv_head(void **state) {
  (void)state;
  attn_shape a = {.B = 2, .S = 5, .Hq = 4, .Hkv = 2, .D = 4, .group = 2};
  check_attention(&a, 121);
}

static void attention_sharded_gqa_maps_local_heads_through_global_offsets(void **state) {
  (void)state;
  /* global Hq 4, Hkv 2, group 2: this rank holds query heads 2, 3 and kv head 1 */
  attn_shape a = {.B = 2, .S = 5, .Hq = 2, .Hkv = 1, .D = 4, .q_first = 2, .kv_first = 1,
                  .group = 2};
  check_attention(&a, 131);
  /* an uneven split: query heads 1, 2 straddle kv heads 0 and 1 */
  attn_shape straddle = {.B = 1, .S = 4, .Hq = 2, .Hkv = 2, .D = 4, .q_first = 1, .kv_first = 0,
                         .group = 2};
  check_attention(&straddle, 141);
}

/* Copy heads [first, first + count) of x(B·S, H, D) into y(B·S, count, D). */
static void slice_heads(float *y, const float *x, int BS, int H, int D, int first, int count) {
  for (int r = 0; r < BS; r++)
    memcpy(y + (size_t)r * count * D, x + ((size_t)r * H + first) * D,
           (size_t)count * D * sizeof *y);
}

static void attention_shard_output_equals_its_heads_of_the_unsharded_output(void **state) {
  (void)state;
  enum { B = 2, S = 5, HQ = 4, HKV = 2, D = 4, G = 2, BS = B * S };
  float *q = frandom(BS * HQ * D, 1.5f, 151), *k = frandom(BS * HKV * D, 1.5f, 152);
  float *v = frandom(BS * HKV * D, 1.0f, 153);
  float *out = fvec(BS * HQ * D), *lse = fvec(B * HQ * S);
  K->attention_fwd(out, lse, q, k, v, B, S, HQ, HKV, D, 0, 0, G);
  float *q_loc = fvec(BS * 2 * D), *k_loc = fvec(BS * D), *v_loc = fvec(BS * D);
  float *out_loc = fvec(BS * 2 * D), *lse_loc = fvec(B * 2 * S), *want = fvec(BS * 2 * D);
  slice_heads(q_loc, q, BS, HQ, D, 2, 2);
  slice_heads(k_loc, k, BS, HKV, D, 1, 1);
  slice_heads(v_loc, v, BS, HKV, D, 1, 1);
  K->attention_fwd(out_loc, lse_loc, q_loc, k_loc, v_loc, B, S, 2, 1, D, 2, 1, G);
  slice_heads(want, out, BS, HQ, D, 2, 2);
  assert_memory_equal(out_loc, want, BS * 2 * D * sizeof(float));
  for (int b = 0; b < B; b++)
    assert_memory_equal(lse_loc + b * 2 * S, lse + (b * HQ + 2) * S, 2 * S * sizeof(float));
  free(q), free(k), free(v), free(out), free(lse), free(q_loc), free(k_loc), free(v_loc);
  free(out_loc), free(lse_loc), free(want);
}

static void attention_is_causal_a_later_key_or_value_never_changes_earlier_outputs(void **state) {
  (void)state;
  enum { B = 2, S = 5, HQ = 4, HKV = 2, D = 4, ROW = HQ * D, KV_ROW = HKV * D };
  float *q = frandom(B * S * ROW, 1.5f, 161), *k = frandom(B * S * KV_ROW, 1.5f, 162);
  float *v = frandom(B * S * KV_ROW, 1.0f, 163);
  float *out = fvec(B * S * ROW), *lse = fvec(B * HQ * S);
  float *out2 = fvec(B * S * ROW), *lse2 = fvec(B * HQ * S);
  K->attention_fwd(out, lse, q, k, v, B, S, HQ, HKV, D, 0, 0, 2);
  for (int b = 0; b < B; b++) /* change the last position's keys and values */
    for (int i = 0; i < KV_ROW; i++) {
      k[(b * S + S - 1) * KV_ROW + i] += 3.0f;
      v[(b * S + S - 1) * KV_ROW + i] -= 2.0f;
    }
  K->attention_fwd(out2, lse2, q, k, v, B, S, HQ, HKV, D, 0, 0, 2);
  for (int b = 0; b < B; b++) {
    assert_memory_equal(out + b * S * ROW, out2 + b * S * ROW, (S - 1) * ROW * sizeof(float));
    assert_memory_not_equal(out + (b * S + S - 1) * ROW, out2 + (b * S + S - 1) * ROW,
                            ROW * sizeof(float));
    for (int h = 0; h < HQ; h++)
      assert_memory_equal(lse + (b * HQ + h) * S, lse2 + (b * HQ + h) * S,
                          (S - 1) * sizeof(float));
  }
  free(q), free(k), free(v), free(out), free(lse), free(out2), free(lse2);
}

static void attention_bwd_matches_finite_differences_across_score_tiles(void **state) {
  (void)state;
  /* S = 67 crosses the kernel's 64-row and 64-key tiles: full tiles below the diagonal, masked
   * diagonal tiles and a short last tile, in the forward and the backward; GQA sums dk, dv */
  attn_shape a = {.B = 1, .S = 67, .Hq = 2, .Hkv = 1, .D = 4, .group = 2};
  check_attention(&a, 181);
}

static void attention_fwd_is_exact_across_score_tiles_of_long_sequences(void **state) {
  (void)state;
  /* S = 300 crosses the kernel's tiles of scores; the running max must rescale */
  attn_shape a = {.B = 1, .S = 300, .Hq = 2, .Hkv = 1, .D = 4, .group = 2};
  int64_t nq = attn_nq(&a), nkv = attn_nkv(&a), nl = attn_nlse(&a);
  float *q = frandom(nq, 2.0f, 171), *k = frandom(nkv, 2.0f, 172), *v = frandom(nkv, 1.0f, 173);
  for (int j = 0; j < a.S; j++) /* keys grow along the sequence: later tiles hold the max */
    for (int d = 0; d < a.D; d++) k[j * a.D + d] *= 1.0f + j / 100.0f;
  float *out = fvec(nq), *lse = fvec(nl);
  double *want = dvec(nq), *want_lse = dvec(nl);
  double *q_d = widen(q, nq), *k_d = widen(k, nkv), *v_d = widen(v, nkv);
  ref_attention(want, want_lse, q_d, k_d, v_d, &a);
  K->attention_fwd(out, lse, q, k, v, a.B, a.S, a.Hq, a.Hkv, a.D, 0, 0, a.group);
  assert_close("out", out, want, nq, TOL);
  assert_close("lse", lse, want_lse, nl, TOL);
  free(q), free(k), free(v), free(out), free(lse), free(want), free(want_lse);
  free(q_d), free(k_d), free(v_d);
}

static void attention_is_deterministic_to_the_bit(void **state) {
  (void)state;
  enum { B = 2, S = 7, HQ = 4, HKV = 2, D = 16, NQ = B * S * HQ * D, NKV = B * S * HKV * D };
  float *q = frandom(NQ, 1.0f, 181), *k = frandom(NKV, 1.0f, 182), *v = frandom(NKV, 1.0f, 183);
  float *dout = frandom(NQ, 1.0f, 184);
  float *run[2][5];
  for (int r = 0; r < 2; r++) {
    float **o = run[r];
    o[0] = fvec(NQ), o[1] = fvec(B * HQ * S), o[2] = fvec(NQ), o[3] = fvec(NKV), o[4] = fvec(NKV);
    K->attention_fwd(o[0], o[1], q, k, v, B, S, HQ, HKV, D, 0, 0, 2);
    K->attention_bwd(o[2], o[3], o[4], dout, o[0], o[1], q, k, v, B, S, HQ, HKV, D, 0, 0, 2);
  }
  size_t sizes[5] = {NQ, B * HQ * S, NQ, NKV, NKV};
  for (int i = 0; i < 5; i++) {
    assert_memory_equal(run[0][i], run[1][i], sizes[i] * sizeof(float));
    free(run[0][i]), free(run[1][i]);
  }
  free(q), free(k), free(v), free(dout);
}

/* ---- SwiGLU ----------------------------------------------------------------------------- */

enum { SW_N = 37 };

typedef struct swiglu_problem {
  double gate[SW_N], up[SW_N], dout[SW_N];
} swiglu_problem;

static double ref_silu(double g) { return g / (1.0 + exp(-g)); }

static double swiglu_loss(void *ctx) {
  swiglu_problem *p = ctx;
  double loss = 0.0;
  for (int i = 0; i < SW_N; i++) loss += p->dout[i] * ref_silu(p->gate[i]) * p->up[i];
  return loss;
}

/* ff_exp_lanes, the exponential of the element-wise kernels: within 1.25 ulp of e^x (in double)
 * on every 997th float of its finite range, exact at 0, ∞ above it, 0 below it, NaN kept. */
static double ulp_of(double v) {
  int e;
  frexp(v, &e);
  return ldexp(1.0, e - 24 < -149 ? -149 : e - 24);
}

static void exp_lanes_is_within_an_ulp_and_a_quarter_of_exp(void **state) {
  (void)state;
  double worst = 0.0;
  float worst_at = 0.0f;
  uint32_t lo, hi;
  float a = -103.9f, b = 88.7f;
  memcpy(&lo, &a, sizeof lo); /* negative floats: larger bits, more negative */
  memcpy(&hi, &b, sizeof hi);
  for (int64_t bits = -(int64_t)(lo & 0x7fffffffu); bits <= (int64_t)hi; bits += 997) {
    uint32_t u = bits < 0 ? (uint32_t)(-bits) | 0x80000000u : (uint32_t)bits;
    float x;
    memcpy(&x, &u, sizeof x);
    double want = exp((double)x), err = fabs((double)ff_exp_lanes(x) - want) / ulp_of(want);
    if (err > worst) worst = err, worst_at = x;
  }
  if (worst > 1.25) fail_msg("ff_exp_lanes(%.9g) is %.3f ulp from exp", (double)worst_at, worst);
  assert_true(ff_exp_lanes(0.0f) == 1.0f);
  assert_true(ff_exp_lanes(-0.0f) == 1.0f);
  assert_true(isinf(ff_exp_lanes(89.0f)) && isinf(ff_exp_lanes(1e30f)));
  assert_true(isinf(ff_exp_lanes(INFINITY)) && ff_exp_lanes(INFINITY) > 0);
  assert_true(ff_exp_lanes(-104.0f) == 0.0f && ff_exp_lanes(-INFINITY) == 0.0f);
  assert_true(ff_exp_lanes(-100.0f) > 0.0f); /* a subnormal, as expf gives */
  assert_true(isnan(ff_exp_lanes(NAN)));
  assert_true(ff_exp_lanes(88.72f) < INFINITY && ff_exp_lanes(88.72f) > 3.3e38f);
}

static void swiglu_fwd_is_silu_of_gate_times_up(void **state) {
  (void)state;
  float *gate = frandom(SW_N, 5.0f, 191), *up = frandom(SW_N, 2.0f, 192);
  float *out = ffill(SW_N, GARBAGE);
  double want[SW_N];
  for (int i = 0; i < SW_N; i++) want[i] = ref_silu(gate[i]) * up[i];
  K->swiglu_fwd(out, gate, up, SW_N);
  assert_close("out", out, want, SW_N, TOL);
  free(gate), free(up), free(out);
}

static void swiglu_bwd_matches_finite_differences(void **state) {
  (void)state;
  float *gate = frandom(SW_N, 5.0f, 201), *up = frandom(SW_N, 2.0f, 202);
  float *dout = frandom(SW_N, 1.0f, 203);
  float *dgate = ffill(SW_N, GARBAGE), *dup = ffill(SW_N, GARBAGE);
  swiglu_problem p;
  for (int i = 0; i < SW_N; i++) p.gate[i] = gate[i], p.up[i] = up[i], p.dout[i] = dout[i];
  double want_dgate[SW_N], want_dup[SW_N];
  finite_difference(want_dgate, p.gate, SW_N, swiglu_loss, &p);
  finite_difference(want_dup, p.up, SW_N, swiglu_loss, &p);
  K->swiglu_bwd(dgate, dup, dout, gate, up, SW_N);
  assert_close("dgate", dgate, want_dgate, SW_N, TOL);
  assert_close("dup", dup, want_dup, SW_N, TOL);
  free(gate), free(up), free(dout), free(dgate), free(dup);
}

/* ---- elementwise ------------------------------------------------------------------------ */

static void add_accumulate_and_scale_are_exact_elementwise_and_add_may_write_over_a(void **state) {
  (void)state;
  enum { N = 29 };
  float *a = frandom(N, 1.0f, 211), *b = frandom(N, 1.0f, 212), *out = fvec(N);
  float *a0 = fcopy(a, N);
  K->add(out, a, b, N);
  for (int i = 0; i < N; i++) assert_true(out[i] == a[i] + b[i]);
  K->add(a, a, b, N); /* out aliasing a */
  assert_memory_equal(a, out, N * sizeof(float));
  K->accumulate(out, b, N);
  for (int i = 0; i < N; i++) assert_true(out[i] == a[i] + b[i]);
  K->scale(out, -0.5f, N);
  for (int i = 0; i < N; i++) assert_true(out[i] == (a0[i] + b[i] + b[i]) * -0.5f);
  free(a), free(b), free(out), free(a0);
}

/* ---- cross-entropy ---------------------------------------------------------------------- */

enum { CE_N = 5, CE_V = 10, CE_SPLIT = 4 }; /* two shards: columns [0, 4) and [4, 10) */
static const int32_t ce_targets[CE_N] = {0, 3, 4, 9, 6};
#define CE_SCALE (1.0f / CE_N) /* mean over tokens */

typedef struct ce_problem {
  double logits[CE_N * CE_V];
} ce_problem;

/* loss(N) = logsumexp(row) − row[target]; returns scale · Σ loss */
static double ref_cross_entropy(double *loss, const double *logits, const int32_t *targets,
                                int N, int V, double scale) {
  double total = 0.0;
  for (int n = 0; n < N; n++) {
    const double *z = logits + n * V;
    double m = -INFINITY, sum = 0.0;
    for (int j = 0; j < V; j++) m = fmax(m, z[j]);
    for (int j = 0; j < V; j++) sum += exp(z[j] - m);
    loss[n] = m + log(sum) - z[targets[n]];
    total += scale * loss[n];
  }
  return total;
}

static double ce_loss(void *ctx) {
  ce_problem *p = ctx;
  double loss[CE_N];
  return ref_cross_entropy(loss, p->logits, ce_targets, CE_N, CE_V, CE_SCALE);
}

/* The three passes on one shard holding all V columns: loss += and dlogits = . */
static void ce_unsharded(float *loss, float *dlogits, const float *logits, int N, int V,
                         const int32_t *targets, float scale) {
  float *row_max = fvec(N), *row_sum = fvec(N);
  K->ce_row_max(row_max, logits, N, V);
  K->ce_row_sum(row_sum, logits, row_max, N, V);
  K->ce_loss_grad(loss, dlogits, logits, targets, row_max, row_sum, N, V, 0, scale);
  free(row_max), free(row_sum);
}

static void cross_entropy_matches_reference_loss_and_finite_differences(void **state) {
  (void)state;
  float *logits = frandom(CE_N * CE_V, 4.0f, 221), *dlogits = ffill(CE_N * CE_V, GARBAGE);
  float *loss = ffill(CE_N, 1.0f); /* loss accumulates */
  ce_problem p;
  for (int i = 0; i < CE_N * CE_V; i++) p.logits[i] = logits[i];
  double want_loss[CE_N], want_grad[CE_N * CE_V];
  ref_cross_entropy(want_loss, p.logits, ce_targets, CE_N, CE_V, CE_SCALE);
  for (int n = 0; n < CE_N; n++) want_loss[n] += 1.0;
  finite_difference(want_grad, p.logits, CE_N * CE_V, ce_loss, &p);
  ce_unsharded(loss, dlogits, logits, CE_N, CE_V, ce_targets, CE_SCALE);
  assert_close("loss", loss, want_loss, CE_N, TOL);
  assert_close("dlogits", dlogits, want_grad, CE_N * CE_V, TOL);
  free(logits), free(dlogits), free(loss);
}

/* Copy columns [first, first + cols) of x(N, V) into y(N, cols), or back when `back`. */
static void ce_columns(float *y, float *x, int N, int V, int first, int cols, int back) {
  for (int n = 0; n < N; n++)
    for (int j = 0; j < cols; j++) {
      if (back) x[n * V + first + j] = y[n * cols + j];
      else y[n * cols + j] = x[n * V + first + j];
    }
}

static void cross_entropy_over_two_vocab_shards_equals_the_unsharded_loss_and_gradient(
    void **state) {
  (void)state;
  int first[2] = {0, CE_SPLIT}, cols[2] = {CE_SPLIT, CE_V - CE_SPLIT};
  float *logits = frandom(CE_N * CE_V, 4.0f, 231), *want_grad = fvec(CE_N * CE_V);
  float *want_loss = fvec(CE_N), *loss = fvec(CE_N), *grad = fvec(CE_N * CE_V);
  ce_unsharded(want_loss, want_grad, logits, CE_N, CE_V, ce_targets, CE_SCALE);
  float *shard[2], *mx[2], *sm[2], gmax[CE_N], gsum[CE_N];
  for (int s = 0; s < 2; s++) {
    shard[s] = fvec(CE_N * cols[s]), mx[s] = fvec(CE_N), sm[s] = fvec(CE_N);
    ce_columns(shard[s], logits, CE_N, CE_V, first[s], cols[s], 0);
    K->ce_row_max(mx[s], shard[s], CE_N, cols[s]);
  }
  for (int n = 0; n < CE_N; n++) gmax[n] = fmaxf(mx[0][n], mx[1][n]); /* the group's max */
  for (int s = 0; s < 2; s++) K->ce_row_sum(sm[s], shard[s], gmax, CE_N, cols[s]);
  for (int n = 0; n < CE_N; n++) gsum[n] = sm[0][n] + sm[1][n]; /* the group's sum */
  for (int s = 0; s < 2; s++) { /* in place over the shard's logits */
    K->ce_loss_grad(loss, shard[s], shard[s], ce_targets, gmax, gsum, CE_N, cols[s], first[s],
                    CE_SCALE);
    ce_columns(shard[s], grad, CE_N, CE_V, first[s], cols[s], 1);
  }
  assert_close_f("loss", loss, want_loss, CE_N, TOL);
  assert_close_f("dlogits", grad, want_grad, CE_N * CE_V, TOL);
  for (int s = 0; s < 2; s++) free(shard[s]), free(mx[s]), free(sm[s]);
  free(logits), free(want_grad), free(want_loss), free(loss), free(grad);
}

static void cross_entropy_of_uniform_logits_is_log_vocab_size(void **state) {
  (void)state;
  float *logits = ffill(CE_N * CE_V, 0.7f), *loss = fvec(CE_N), *dlogits = fvec(CE_N * CE_V);
  double want[CE_N];
  for (int n = 0; n < CE_N; n++) want[n] = log((double)CE_V);
  ce_unsharded(loss, dlogits, logits, CE_N, CE_V, ce_targets, 1.0f);
  assert_close("loss", loss, want, CE_N, 1e-6);
  free(logits), free(loss), free(dlogits);
}

/* ---- AdamW ------------------------------------------------------------------------------ */

enum { AW_N = 19 };

typedef struct adamw_hyper {
  float lr, beta1, beta2, eps, weight_decay, grad_scale;
} adamw_hyper;

/* torch.optim.AdamW's single-tensor step, in float64 */
static void ref_adamw(double *p, const double *grad, double *m, double *v, int n,
                      const adamw_hyper *h, int64_t step) {
  double bc1 = 1.0 - pow(h->beta1, (double)step), bc2 = 1.0 - pow(h->beta2, (double)step);
  for (int i = 0; i < n; i++) {
    double g = grad[i] * h->grad_scale;
    p[i] *= 1.0 - (double)h->lr * h->weight_decay;
    m[i] = h->beta1 * m[i] + (1.0 - h->beta1) * g;
    v[i] = h->beta2 * v[i] + (1.0 - h->beta2) * g * g;
    p[i] -= h->lr / bc1 * m[i] / (sqrt(v[i]) / sqrt(bc2) + h->eps);
  }
}

static void adamw_one_and_two_steps_match_torch_adamw_formulas(void **state) {
  (void)state;
  adamw_hyper h = {1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f};
  float *p = frandom(AW_N, 1.0f, 241), *m = fvec(AW_N), *v = fvec(AW_N);
  double *p_d = widen(p, AW_N), *p0 = widen(p, AW_N), *m_d = dvec(AW_N), *v_d = dvec(AW_N);
  double delta_want[AW_N];
  float delta[AW_N];
  for (int64_t step = 1; step <= 2; step++) {
    float *grad = frandom(AW_N, 1.0f, 250 + (uint64_t)step);
    double *grad_d = widen(grad, AW_N);
    K->adamw(p, grad, m, v, AW_N, h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, step,
             h.grad_scale);
    ref_adamw(p_d, grad_d, m_d, v_d, AW_N, &h, step);
    for (int i = 0; i < AW_N; i++) delta[i] = (float)(p[i] - p0[i]), delta_want[i] = p_d[i] - p0[i];
    assert_close("param change", delta, delta_want, AW_N, TOL);
    assert_close("m", m, m_d, AW_N, TOL);
    assert_close("v", v, v_d, AW_N, TOL);
    free(grad), free(grad_d);
  }
  free(p), free(m), free(v), free(p_d), free(p0), free(m_d), free(v_d);
}

static void adamw_with_zero_gradient_only_decays_the_weights(void **state) {
  (void)state;
  float *p = frandom(AW_N, 1.0f, 261), *grad = fvec(AW_N), *m = fvec(AW_N), *v = fvec(AW_N);
  float *p0 = fcopy(p, AW_N);
  K->adamw(p, grad, m, v, AW_N, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, 1.0f);
  /* torch multiplies by the float rounding of the double 1 − lr·wd */
  float decay = (float)(1.0 - (double)1e-2f * (double)0.1f);
  for (int i = 0; i < AW_N; i++) assert_true(p[i] == p0[i] * decay);
  free(p), free(grad), free(m), free(v), free(p0);
}

/* ---- sum of squares --------------------------------------------------------------------- */

static void sum_squares_is_exact_in_double_for_any_length(void **state) {
  (void)state;
  float *x = frandom(1003, 3.0f, 271);
  x[5] = 1e20f; /* its square overflows fp32, not double */
  int64_t lengths[] = {0, 1, 7, 8, 9, 1003};
  for (size_t c = 0; c < sizeof lengths / sizeof *lengths; c++) {
    long double want = 0.0L;
    for (int64_t i = 0; i < lengths[c]; i++) want += (long double)x[i] * x[i];
    double got = K->sum_squares(x, lengths[c]);
    assert_true(fabs(got - (double)want) <= 1e-14 * (double)want);
  }
  free(x);
}

/* ---- strided copies --------------------------------------------------------------------- */

static void copy_rows_moves_a_column_block_and_touches_nothing_else(void **state) {
  (void)state;
  enum { ROWS = 5, STRIDE = 11, WIDTH = 4, FIRST = 3 };
  float *src = frandom(ROWS * STRIDE, 1.0f, 17), packed[ROWS * WIDTH + 2], back[ROWS * STRIDE];
  for (int i = 0; i < ROWS * WIDTH + 2; i++) packed[i] = -7.0f;
  K->copy_rows(packed + 1, WIDTH, src + FIRST, STRIDE, WIDTH, ROWS);
  assert_true(packed[0] == -7.0f && packed[ROWS * WIDTH + 1] == -7.0f);
  for (int r = 0; r < ROWS; r++)
    for (int c = 0; c < WIDTH; c++) assert_true(packed[1 + r * WIDTH + c] == src[r * STRIDE + FIRST + c]);
  for (int i = 0; i < ROWS * STRIDE; i++) back[i] = 0.5f;
  K->copy_rows(back + FIRST, STRIDE, packed + 1, WIDTH, WIDTH, ROWS);
  for (int r = 0; r < ROWS; r++)
    for (int c = 0; c < STRIDE; c++) {
      bool in = c >= FIRST && c < FIRST + WIDTH;
      assert_true(back[r * STRIDE + c] == (in ? src[r * STRIDE + c] : 0.5f));
    }
  free(src);
}

/* ---- bf16 storage ----------------------------------------------------------------------- */

static float from_bits(uint32_t b) {
  float f;
  memcpy(&f, &b, sizeof f);
  return f;
}

static void bf16_rounds_to_nearest_even_and_keeps_nan_and_infinity(void **state) {
  (void)state;
  float in[] = {1.0f, from_bits(0x3f808000u), from_bits(0x3f818000u), from_bits(0x3f808001u),
                -2.5f, INFINITY, -INFINITY, NAN, from_bits(0x7f7fffffu), 0.0f, -0.0f,
                from_bits(0x00010000u)};
  uint16_t want[] = {0x3f80, 0x3f80, 0x3f82, 0x3f81, 0xc020, 0x7f80, 0xff80, 0, 0x7f80, 0x0000,
                     0x8000, 0x0001};
  enum { N = sizeof in / sizeof *in };
  uint16_t got[N];
  float back[N];
  K->to_bf16(got, in, N);
  K->from_bf16(back, got, N);
  for (int i = 0; i < N; i++) {
    if (isnan(in[i])) {
      assert_true(isnan(back[i]));
      continue;
    }
    assert_int_equal(got[i], want[i]);
    assert_true(back[i] == from_bits((uint32_t)want[i] << 16));
  }
  /* values that are bf16 already come back unchanged */
  float exact[] = {0.15625f, -3.0f, 65536.0f, 1e-30f};
  uint16_t mid[4];
  float round_trip[4];
  exact[3] = from_bits(0x0d7f0000u);
  K->to_bf16(mid, exact, 4);
  K->from_bf16(round_trip, mid, 4);
  for (int i = 0; i < 4; i++) assert_true(round_trip[i] == exact[i]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(alloc_returns_zeroed_cache_aligned_memory_and_copies_round_trip),
      cmocka_unit_test(matmul_fwd_is_inp_times_w_transposed),
      cmocka_unit_test(matmul_bwd_matches_finite_differences_and_accumulates_dw),
      cmocka_unit_test(matmul_bwd_with_null_dinp_only_accumulates_dw),
      cmocka_unit_test(bf16_matmuls_match_float64_on_the_bf16_values),
      cmocka_unit_test(bf16_writing_kernels_round_their_fp32_results),
      cmocka_unit_test(bf16_attention_rope_and_loss_are_the_fp32_forms_rounded),
      cmocka_unit_test(embedding_fwd_copies_shard_rows_and_zeros_tokens_off_the_shard),
      cmocka_unit_test(embedding_bwd_adds_dout_to_shard_rows_and_ignores_tokens_off_the_shard),
      cmocka_unit_test(rmsnorm_fwd_scales_rows_by_reciprocal_rms_and_weight),
      cmocka_unit_test(rmsnorm_bwd_matches_finite_differences_and_accumulates_dw),
      cmocka_unit_test(rope_fwd_turns_interleaved_pairs_by_position_times_frequency),
      cmocka_unit_test(rope_bwd_undoes_rope_fwd),
      cmocka_unit_test(rope_bwd_matches_finite_differences),
      cmocka_unit_test(attention_mha_matches_reference_and_finite_differences),
      cmocka_unit_test(attention_gqa_sums_dk_dv_over_the_query_heads_of_a_kv_head),
      cmocka_unit_test(attention_sharded_gqa_maps_local_heads_through_global_offsets),
      cmocka_unit_test(attention_shard_output_equals_its_heads_of_the_unsharded_output),
      cmocka_unit_test(attention_is_causal_a_later_key_or_value_never_changes_earlier_outputs),
      cmocka_unit_test(attention_fwd_is_exact_across_score_tiles_of_long_sequences),
      cmocka_unit_test(attention_bwd_matches_finite_differences_across_score_tiles),
      cmocka_unit_test(attention_is_deterministic_to_the_bit),
      cmocka_unit_test(exp_lanes_is_within_an_ulp_and_a_quarter_of_exp),
      cmocka_unit_test(swiglu_fwd_is_silu_of_gate_times_up),
      cmocka_unit_test(swiglu_bwd_matches_finite_differences),
      cmocka_unit_test(add_accumulate_and_scale_are_exact_elementwise_and_add_may_write_over_a),
      cmocka_unit_test(cross_entropy_matches_reference_loss_and_finite_differences),
      cmocka_unit_test(cross_entropy_over_two_vocab_shards_equals_the_unsharded_loss_and_gradient),
      cmocka_unit_test(cross_entropy_of_uniform_logits_is_log_vocab_size),
      cmocka_unit_test(adamw_one_and_two_steps_match_torch_adamw_formulas),
      cmocka_unit_test(adamw_with_zero_gradient_only_decays_the_weights),
      cmocka_unit_test(sum_squares_is_exact_in_double_for_any_length),
      cmocka_unit_test(copy_rows_moves_a_column_block_and_touches_nothing_else),
      cmocka_unit_test(bf16_rounds_to_nearest_even_and_keeps_nan_and_infinity),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
