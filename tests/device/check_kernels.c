/* check_kernels.c — every operation of the CUDA backend against the CPU backend on fresh random
 * inputs (the ggml test-backend-ops idea). Outputs a kernel overwrites are poisoned with NaN on
 * the GPU before it runs, so an element it fails to write fails the check; outputs it accumulates
 * into start from the same random values on both sides. The error of an output is
 * max |gpu − cpu| / max |cpu| over its elements (NaN anywhere fails, on either side), against
 * 1e-5 for fp32 paths and 1e-2 for matmuls computed in bf16 (and for attention under bf16 math,
 * on tensor cores unless FF_ATTENTION=fused). Every tensor sits between two guard
 * bands holding a sentinel, so a kernel writing outside its output (at index −1, or one past the
 * end) fails too.
 *
 * usage: check_kernels fp32|bf16 [SEED] [--quick]   exit 0 all pass, 1 a failure, 77 no GPU
 *        check_kernels self [SEED]          the CPU backend against itself: checks the checker
 *                                           (poisoning, shapes, comparisons) where no GPU is
 * --quick: smaller attention shapes and no 1B-sized matmul, for the CUDA backend built against
 * the CPU emulation of CUDA (tests/emu), where every GPU thread is a fiber: every
 * operation and every launcher path (each head-dimension class, GQA, a TP shard, tiles and
 * chunks crossed) still runs, at sizes the emulation gets through in seconds. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ff_kernels.h"

static const ff_kernels *cpu, *gpu;
static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static int failures, checks;
static const char *math_name;
static double matmul_tol, attention_tol;

static double uniform(void) { /* xorshift64*, in [-1, 1) */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return (double)((rng_state * 2685821657736338717ull) >> 11) / 4503599627370496.0 - 1.0;
}

/* One tensor on both backends, GUARD floats of SENTINEL either side. */
typedef struct pair {
  float *c, *g;
  int64_t n;
} pair;

enum { GUARD = 16 };
static const float SENTINEL = 7777.25f;

static pair make(int64_t n, double amplitude) {
  float *c = cpu->alloc((size_t)(n + 2 * GUARD) * 4), *g = gpu->alloc((size_t)(n + 2 * GUARD) * 4);
  if (!c || !g) {
    fprintf(stderr, "check_kernels: out of memory\n");
    exit(1);
  }
  pair p = {c + GUARD, g + GUARD, n};
  for (int i = 0; i < GUARD; i++) c[i] = c[n + GUARD + i] = SENTINEL;
  for (int64_t i = 0; i < n; i++) p.c[i] = (float)(amplitude * uniform());
  gpu->to_device(g, c, (size_t)(n + 2 * GUARD) * 4);
  return p;
}

/* Whether the guard bands of one side still hold the sentinel. */
static bool guards_intact(const float *data, int64_t n, bool on_gpu) {
  float band[2 * GUARD];
  if (on_gpu) {
    gpu->to_host(band, data - GUARD, GUARD * 4);
    gpu->to_host(band + GUARD, data + n, GUARD * 4);
  } else {
    memcpy(band, data - GUARD, GUARD * 4);
    memcpy(band + GUARD, data + n, GUARD * 4);
  }
  for (int i = 0; i < 2 * GUARD; i++)
    if (band[i] != SENTINEL) return false;
  return true;
}

/* An output the kernel overwrites: zero on the CPU, NaN on the GPU. */
static pair output(int64_t n) {
  pair p = make(n, 0.0);
  float *nan = malloc((size_t)n * 4);
  for (int64_t i = 0; i < n; i++) nan[i] = NAN;
  gpu->to_device(p.g, nan, (size_t)n * 4);
  free(nan);
  return p;
}

static void drop(pair p) {
  cpu->release(p.c - GUARD);
  gpu->release(p.g - GUARD);
}

static void check(const char *what, pair p, double tol) {
  float *host = malloc((size_t)p.n * 4);
  gpu->to_host(host, p.g, (size_t)p.n * 4);
  double worst = 0, scale = 0;
  int64_t bad = -1, bad_ref = -1;
  for (int64_t i = 0; i < p.n; i++) {
    if (!isfinite(p.c[i])) { /* the reference itself is broken: nothing to compare against */
      if (bad_ref < 0) bad_ref = i;
      continue;
    }
    scale = fmax(scale, fabs(p.c[i]));
    if (!isfinite(host[i])) {
      if (bad < 0) bad = i;
      continue;
    }
    worst = fmax(worst, fabs((double)host[i] - p.c[i]));
  }
  bool fenced = guards_intact(p.g, p.n, true) && guards_intact(p.c, p.n, false);
  double rel = scale > 0 ? worst / scale : worst;
  bool ok = bad < 0 && bad_ref < 0 && fenced && rel <= tol;
  checks++;
  if (!ok) failures++;
  printf("%-44s %-4s  rel error %.3e  (tolerance %.0e)", what, ok ? "ok" : "FAIL", rel, tol);
  if (bad >= 0) printf("  non-finite output at element %lld", (long long)bad);
  if (bad_ref >= 0) printf("  non-finite reference at element %lld", (long long)bad_ref);
  if (!fenced) printf("  written outside the output");
  printf("\n");
  free(host);
}

static int32_t *tokens_pair(int n, int vocab, int32_t **dev) {
  int32_t *host = malloc((size_t)n * sizeof *host);
  for (int i = 0; i < n; i++) host[i] = (int32_t)((uniform() + 1.0) * 0.5 * vocab) % vocab;
  *dev = gpu->alloc((size_t)n * sizeof **dev);
  gpu->to_device(*dev, host, (size_t)n * sizeof *host);
  return host;
}

/* ---- the operations -------------------------------------------------------------------- */

/* bf16 copies of a pair's values, on both backends (rounded on the CPU: check_bf16 shows the two
 * roundings agree bit for bit). */
static uint16_t *halves(pair p, uint16_t **dev) {
  uint16_t *h = cpu->alloc((size_t)p.n * 2);
  *dev = gpu->alloc((size_t)p.n * 2);
  if (!h || !*dev) {
    fprintf(stderr, "check_kernels: out of memory\n");
    exit(1);
  }
  cpu->to_bf16(h, p.c, p.n);
  gpu->to_device(*dev, h, (size_t)p.n * 2);
  return h;
}

/* A bf16 output on the GPU, poisoned with NaN. */
static uint16_t *gpu_halves(int64_t n) {
  uint16_t *h = gpu->alloc((size_t)n * 2);
  uint16_t *poison = malloc((size_t)n * 2);
  if (!h || !poison) {
    fprintf(stderr, "check_kernels: out of memory\n");
    exit(1);
  }
  for (int64_t i = 0; i < n; i++) poison[i] = 0xffff; /* a NaN */
  gpu->to_device(h, poison, (size_t)n * 2);
  free(poison);
  return h;
}

/* The matmuls on bf16 operands, under either math: both sides multiply the same bf16 values and
 * accumulate in fp32, so only the order of the sums differs (and tensor cores may round their
 * partial sums): 1e-4. */
static void check_matmul_bf16(int N, int In, int Out, int offset) {
  char name[96];
  pair x = make((int64_t)N * In + offset, 1), w = make((int64_t)Out * In + offset, 0.5);
  pair dy = make((int64_t)N * Out + offset, 1);
  pair y = output((int64_t)N * Out + offset), dx = output((int64_t)N * In + offset);
  pair dw = make((int64_t)Out * In + offset, 0.1);
  uint16_t *xg, *wg, *dyg, *xc = halves(x, &xg), *wc = halves(w, &wg), *dyc = halves(dy, &dyg);
  cpu->matmul_fwd_bf16(y.c + offset, xc + offset, wc + offset, N, In, Out);
  gpu->matmul_fwd_bf16(y.g + offset, xg + offset, wg + offset, N, In, Out);
  cpu->matmul_bwd_bf16(dx.c + offset, dw.c + offset, dyc + offset, xc + offset, wc + offset, N,
                       In, Out);
  gpu->matmul_bwd_bf16(dx.g + offset, dw.g + offset, dyg + offset, xg + offset, wg + offset, N,
                       In, Out);
  if (offset) { /* the skipped leading elements are not outputs */
    for (int i = 0; i < offset; i++) y.c[i] = dx.c[i] = 0;
    gpu->zero(y.g, (size_t)offset * 4);
    gpu->zero(dx.g, (size_t)offset * 4);
  }
  const char *odd = offset ? " unaligned" : "";
  snprintf(name, sizeof name, "matmul_fwd_bf16 %dx%dx%d%s", N, In, Out, odd);
  check(name, y, 1e-4);
  snprintf(name, sizeof name, "matmul_bwd_bf16 dinp %dx%dx%d%s", N, In, Out, odd);
  check(name, dx, 1e-4);
  snprintf(name, sizeof name, "matmul_bwd_bf16 dw += %dx%dx%d%s", N, In, Out, odd);
  check(name, dw, 1e-4);
  cpu->matmul_bwd_bf16_acc(dx.c + offset, NULL, dyc + offset, xc + offset, wc + offset, N, In,
                           Out);
  gpu->matmul_bwd_bf16_acc(dx.g + offset, NULL, dyg + offset, xg + offset, wg + offset, N, In,
                           Out);
  snprintf(name, sizeof name, "matmul_bwd_bf16_acc dinp += %dx%dx%d%s", N, In, Out, odd);
  check(name, dx, 1e-4);
  /* the same product rounded to bf16 on the way out, against the CPU's as values: one bf16 step
   * where the two fp32 sums round apart */
  uint16_t *rg = gpu_halves((int64_t)N * Out), *rc = cpu->alloc((size_t)N * Out * 2);
  pair vals = output((int64_t)N * Out);
  cpu->matmul_fwd_bf16_rounded(rc, xc + offset, wc + offset, N, In, Out);
  gpu->matmul_fwd_bf16_rounded(rg, xg + offset, wg + offset, N, In, Out);
  cpu->from_bf16(vals.c, rc, (int64_t)N * Out);
  gpu->from_bf16(vals.g, rg, (int64_t)N * Out);
  snprintf(name, sizeof name, "matmul_fwd_bf16_rounded %dx%dx%d%s", N, In, Out, odd);
  check(name, vals, 1e-2);
  cpu->release(rc);
  gpu->release(rg);
  drop(vals);
  cpu->release(xc), cpu->release(wc), cpu->release(dyc);
  gpu->release(xg), gpu->release(wg), gpu->release(dyg);
  drop(x), drop(w), drop(dy), drop(y), drop(dx), drop(dw);
}

static void check_matmul(int N, int In, int Out, int offset) {
  char name[96];
  pair x = make((int64_t)N * In + offset, 1), w = make((int64_t)Out * In + offset, 0.5);
  pair y = output((int64_t)N * Out + offset), dy = make((int64_t)N * Out + offset, 1);
  pair dx = output((int64_t)N * In + offset), dw = make((int64_t)Out * In + offset, 0.1);
  /* offset floats in: pointers that are not 16-byte aligned, like tensors inside a block */
  cpu->matmul_fwd(y.c + offset, x.c + offset, w.c + offset, N, In, Out);
  gpu->matmul_fwd(y.g + offset, x.g + offset, w.g + offset, N, In, Out);
  cpu->matmul_bwd(dx.c + offset, dw.c + offset, dy.c + offset, x.c + offset, w.c + offset, N, In, Out);
  gpu->matmul_bwd(dx.g + offset, dw.g + offset, dy.g + offset, x.g + offset, w.g + offset, N, In, Out);
  if (offset) { /* the skipped head is not the kernels' to write */
    float zero[4] = {0};
    gpu->to_device(y.g, zero, (size_t)offset * 4);
    gpu->to_device(dx.g, zero, (size_t)offset * 4);
  }
  snprintf(name, sizeof name, "matmul_fwd %dx%dx%d%s (%s)", N, In, Out, offset ? " unaligned" : "", math_name);
  check(name, y, matmul_tol);
  snprintf(name, sizeof name, "matmul_bwd dinp %dx%dx%d%s", N, In, Out, offset ? " unaligned" : "");
  check(name, dx, matmul_tol);
  snprintf(name, sizeof name, "matmul_bwd dw += %dx%dx%d%s", N, In, Out, offset ? " unaligned" : "");
  check(name, dw, matmul_tol);
  drop(x), drop(w), drop(y), drop(dy), drop(dx), drop(dw);
}

static void check_embedding(int N, int C, int vocab, int first, int end) {
  int32_t *tok_g, *tok = tokens_pair(N, vocab, &tok_g);
  pair table = make((int64_t)(end - first) * C, 1), out = output((int64_t)N * C);
  pair dout = make((int64_t)N * C, 1), dtable = make((int64_t)(end - first) * C, 0.1);
  cpu->embedding_fwd(out.c, tok, table.c, N, C, first, end);
  gpu->embedding_fwd(out.g, tok_g, table.g, N, C, first, end);
  cpu->embedding_bwd(dtable.c, dout.c, tok, N, C, first, end);
  gpu->embedding_bwd(dtable.g, dout.g, tok_g, N, C, first, end);
  check("embedding_fwd (vocabulary shard)", out, 1e-5);
  check("embedding_bwd dtable += (repeated tokens)", dtable, 1e-5);
  drop(table), drop(out), drop(dout), drop(dtable);
  free(tok);
  gpu->release(tok_g);
}

/* Strided rows of one buffer into another: a segment packed for a gradient sum, and back. */
static void check_copy_rows(int64_t rows, int64_t width, int64_t stride) {
  pair src = make(rows * stride, 1), packed = output(rows * width);
  cpu->copy_rows(packed.c, width, src.c + 3, stride, width, rows);
  gpu->copy_rows(packed.g, width, src.g + 3, stride, width, rows);
  check("copy_rows (pack a column block)", packed, 0);
  drop(src), drop(packed);
}

/* bf16 storage: rounding and back must be the CPU's bit for bit. */
static void check_bf16(int64_t n) {
  pair x = make(n, 1e3), back = output(n);
  uint16_t *c16 = cpu->alloc((size_t)n * 2), *g16 = gpu->alloc((size_t)n * 2);
  cpu->to_bf16(c16, x.c, n);
  cpu->from_bf16(back.c, c16, n);
  gpu->to_bf16(g16, x.g, n);
  gpu->from_bf16(back.g, g16, n);
  check("to_bf16 then from_bf16", back, 0);
  cpu->release(c16);
  gpu->release(g16);
  drop(x), drop(back);
}

/* The bf16-writing forms (rmsnorm_fwd_bf16, swiglu_fwd_bf16, swiglu_bwd_bf16): on each backend
 * the bits of the fp32 form rounded by to_bf16, and the GPU's against the CPU's as values, to
 * one bf16 step (1e-2), where the two fp32 results round apart. Here: got (bf16, on the GPU)
 * against to_bf16 of the GPU's fp32 result, then as values against the CPU's bf16 form
 * (cpu_half), through `as_values`, an output pair. */
static void check_rounded(const char *what, const uint16_t *got, const float *fp32_g,
                          const uint16_t *cpu_half, pair as_values) {
  int64_t n = as_values.n;
  uint16_t *want_g = gpu_halves(n), *a = malloc((size_t)n * 2), *b = malloc((size_t)n * 2);
  if (!a || !b) {
    fprintf(stderr, "check_kernels: out of memory\n");
    exit(1);
  }
  gpu->to_bf16(want_g, fp32_g, n);
  gpu->to_host(a, got, (size_t)n * 2);
  gpu->to_host(b, want_g, (size_t)n * 2);
  bool same = memcmp(a, b, (size_t)n * 2) == 0;
  checks++;
  if (!same) failures++;
  printf("%-44s %-4s  the GPU's fp32 result rounded, bit for bit\n", what, same ? "ok" : "FAIL");
  cpu->from_bf16(as_values.c, cpu_half, n);
  gpu->from_bf16(as_values.g, got, n);
  char name[96];
  snprintf(name, sizeof name, "%s (values)", what);
  check(name, as_values, 1e-2);
  free(a), free(b);
  gpu->release(want_g);
}

static void check_bf16_forms(int N, int C, int64_t n) {
  pair x = make((int64_t)N * C, 2), w = make(C, 1), y = output((int64_t)N * C), r = output(N);
  pair r16 = output(N), vals = output((int64_t)N * C);
  uint16_t *hc = cpu->alloc((size_t)N * C * 2), *hg = gpu_halves((int64_t)N * C);
  cpu->rmsnorm_fwd_bf16(hc, r16.c, x.c, w.c, N, C, 1e-5f);
  gpu->rmsnorm_fwd(y.g, r.g, x.g, w.g, N, C, 1e-5f);
  gpu->rmsnorm_fwd_bf16(hg, r16.g, x.g, w.g, N, C, 1e-5f);
  check_rounded("rmsnorm_fwd_bf16 out", hg, y.g, hc, vals);
  check("rmsnorm_fwd_bf16 rstd", r16, 1e-5);
  cpu->release(hc);
  gpu->release(hg);
  drop(x), drop(w), drop(y), drop(r), drop(r16), drop(vals);
  /* SwiGLU on bf16 gate and up: the fp32 forms run on the same values, widened */
  pair gate = make(n, 4), up = make(n, 1), dout = make(n, 1), f = output(n), df = output(n);
  pair v1 = output(n), v2 = output(n), v3 = output(n);
  uint16_t *gate_g, *up_g, *gate_c = halves(gate, &gate_g), *up_c = halves(up, &up_g);
  cpu->from_bf16(gate.c, gate_c, n), cpu->from_bf16(up.c, up_c, n);
  gpu->from_bf16(gate.g, gate_g, n), gpu->from_bf16(up.g, up_g, n);
  uint16_t *c1 = cpu->alloc((size_t)n * 2), *c2 = cpu->alloc((size_t)n * 2);
  uint16_t *c3 = cpu->alloc((size_t)n * 2);
  uint16_t *g1 = gpu_halves(n), *g2 = gpu_halves(n), *g3 = gpu_halves(n);
  cpu->swiglu_fwd_bf16(c1, gate_c, up_c, n);
  gpu->swiglu_fwd(f.g, gate.g, up.g, n);
  gpu->swiglu_fwd_bf16(g1, gate_g, up_g, n);
  check_rounded("swiglu_fwd_bf16", g1, f.g, c1, v1);
  cpu->swiglu_bwd_bf16(c2, c3, dout.c, gate_c, up_c, n);
  gpu->swiglu_bwd(f.g, df.g, dout.g, gate.g, up.g, n);
  gpu->swiglu_bwd_bf16(g2, g3, dout.g, gate_g, up_g, n);
  check_rounded("swiglu_bwd_bf16 dgate", g2, f.g, c2, v2);
  check_rounded("swiglu_bwd_bf16 dup", g3, df.g, c3, v3);
  cpu->release(c1), cpu->release(c2), cpu->release(c3), cpu->release(gate_c), cpu->release(up_c);
  gpu->release(g1), gpu->release(g2), gpu->release(g3), gpu->release(gate_g), gpu->release(up_g);
  drop(gate), drop(up), drop(dout), drop(f), drop(df), drop(v1), drop(v2), drop(v3);
}

/* Self mode: the checker must fail a kernel that leaves an element unwritten, writes before its
 * output, or compares against a broken reference. Each case runs check() on a doctored pair and
 * counts as passed when check() fails it. */
static void check_the_checker(void) {
  struct { const char *what; int how; } cases[] = {
      {"checker: an unwritten element fails", 0},
      {"checker: a write at index -1 fails", 1},
      {"checker: a NaN in the reference fails", 2},
  };
  for (int c = 0; c < 3; c++) {
    pair x = make(64, 1), y = output(64);
    for (int i = 0; i < 64; i++) y.c[i] = x.c[i];
    gpu->to_device(y.g, x.c, 64 * 4);
    float nan = NAN, stray = 1.0f;
    if (cases[c].how == 0) gpu->to_device(y.g + 17, &nan, 4);
    if (cases[c].how == 1) gpu->to_device(y.g - 1, &stray, 4);
    if (cases[c].how == 2) y.c[5] = NAN;
    int before = failures;
    printf("  (expected to fail) ");
    check(cases[c].what, y, 1e-5);
    bool caught = failures > before;
    failures = before + (caught ? 0 : 1);
    printf("%-44s %s\n", cases[c].what, caught ? "ok" : "FAIL (not caught)");
    drop(x), drop(y);
  }
}

static void check_rmsnorm(int N, int C) {
  pair x = make((int64_t)N * C, 2), w = make(C, 1), y = output((int64_t)N * C), r = output(N);
  pair dy = make((int64_t)N * C, 1), dx = output((int64_t)N * C), dw = make(C, 0.1);
  cpu->rmsnorm_fwd(y.c, r.c, x.c, w.c, N, C, 1e-5f);
  gpu->rmsnorm_fwd(y.g, r.g, x.g, w.g, N, C, 1e-5f);
  cpu->rmsnorm_bwd(dx.c, dw.c, dy.c, x.c, w.c, r.c, N, C);
  gpu->rmsnorm_bwd(dx.g, dw.g, dy.g, x.g, w.g, r.g, N, C);
  check("rmsnorm_fwd out", y, 1e-5);
  check("rmsnorm_fwd rstd", r, 1e-5);
  check("rmsnorm_bwd dinp", dx, 1e-5);
  check("rmsnorm_bwd dw +=", dw, 1e-5);
  cpu->rmsnorm_bwd_acc(dx.c, dw.c, dy.c, x.c, w.c, r.c, N, C); /* dinp += onto the first's */
  gpu->rmsnorm_bwd_acc(dx.g, dw.g, dy.g, x.g, w.g, r.g, N, C);
  check("rmsnorm_bwd_acc dinp +=", dx, 1e-5);
  /* on a bf16 input: both sides read the same bf16 values */
  uint16_t *xg, *xc = halves(x, &xg);
  cpu->rmsnorm_bwd_acc_bf16(dx.c, dw.c, dy.c, xc, w.c, r.c, N, C);
  gpu->rmsnorm_bwd_acc_bf16(dx.g, dw.g, dy.g, xg, w.g, r.g, N, C);
  check("rmsnorm_bwd_acc_bf16 dinp +=", dx, 1e-5);
  check("rmsnorm_bwd_acc_bf16 dw +=", dw, 1e-5);
  cpu->release(xc);
  gpu->release(xg);
  drop(x), drop(w), drop(y), drop(r), drop(dy), drop(dx), drop(dw);
}

static void check_rope(int B, int S, int H, int D) {
  pair x = make((int64_t)B * S * H * D, 1);
  cpu->rope_fwd(x.c, B, S, H, D, 10000.0f);
  gpu->rope_fwd(x.g, B, S, H, D, 10000.0f);
  check("rope_fwd", x, 1e-5);
  cpu->rope_bwd(x.c, B, S, H, D, 10000.0f);
  gpu->rope_bwd(x.g, B, S, H, D, 10000.0f);
  check("rope_bwd", x, 1e-5);
  /* rope_fwd_bf16: its bf16 output as values (one bf16 step where the fp32 results round apart) */
  int64_t n = (int64_t)B * S * H * D;
  uint16_t *hc = cpu->alloc((size_t)n * 2), *hg = gpu_halves(n);
  pair vals = output(n);
  cpu->rope_fwd_bf16(hc, x.c, B, S, H, D, 10000.0f);
  gpu->rope_fwd_bf16(hg, x.g, B, S, H, D, 10000.0f);
  cpu->from_bf16(vals.c, hc, n);
  gpu->from_bf16(vals.g, hg, n);
  check("rope_fwd_bf16", vals, 1e-2);
  pair dx = make(n, 1);
  cpu->rope_bwd_bf16(hc, dx.c, B, S, H, D, 10000.0f);
  gpu->rope_bwd_bf16(hg, dx.g, B, S, H, D, 10000.0f);
  cpu->from_bf16(vals.c, hc, n);
  gpu->from_bf16(vals.g, hg, n);
  check("rope_bwd_bf16", vals, 1e-2);
  drop(dx);
  cpu->release(hc);
  gpu->release(hg);
  drop(x), drop(vals);
}

/* Hq local query heads from global q_first, over Hkv local kv heads from kv_first. */
static void check_attention(int B, int S, int Hq, int Hkv, int D, int q_first, int kv_first,
                            int group) {
  char name[128];
  int64_t nq = (int64_t)B * S * Hq * D, nk = (int64_t)B * S * Hkv * D;
  pair q = make(nq, 1), k = make(nk, 1), v = make(nk, 1), out = output(nq);
  pair lse = output((int64_t)B * Hq * S), dout = make(nq, 1);
  pair dq = output(nq), dk = output(nk), dv = output(nk);
  cpu->attention_fwd(out.c, lse.c, q.c, k.c, v.c, B, S, Hq, Hkv, D, q_first, kv_first, group);
  gpu->attention_fwd(out.g, lse.g, q.g, k.g, v.g, B, S, Hq, Hkv, D, q_first, kv_first, group);
  cpu->attention_bwd(dq.c, dk.c, dv.c, dout.c, out.c, lse.c, q.c, k.c, v.c, B, S, Hq, Hkv, D,
                     q_first, kv_first, group);
  gpu->attention_bwd(dq.g, dk.g, dv.g, dout.g, out.g, lse.g, q.g, k.g, v.g, B, S, Hq, Hkv, D,
                     q_first, kv_first, group);
  const char *what[5] = {"out", "lse", "dq", "dk", "dv"};
  pair *got[5] = {&out, &lse, &dq, &dk, &dv};
  for (int i = 0; i < 5; i++) {
    snprintf(name, sizeof name, "attention B%d S%d Hq%d Hkv%d D%d q%d kv%d: %s", B, S, Hq, Hkv, D,
             q_first, kv_first, what[i]);
    check(name, *got[i], attention_tol);
  }
  /* the bf16 forms (bf16 q, k, v and out), against the CPU's on the same bf16 values: 1e-2 */
  uint16_t *qg, *kg, *vg, *qc = halves(q, &qg), *kc = halves(k, &kg), *vc = halves(v, &vg);
  uint16_t *oc = cpu->alloc((size_t)nq * 2), *og = gpu_halves(nq);
  size_t work = (size_t)(2 * nq + 2 * nk) * 4;
  float *wc = cpu->alloc(work), *wg = gpu->alloc(work);
  pair o16 = output(nq), lse16 = output((int64_t)B * Hq * S);
  pair dq16 = output(nq), dk16 = output(nk), dv16 = output(nk);
  cpu->attention_fwd_bf16(oc, lse16.c, qc, kc, vc, B, S, Hq, Hkv, D, q_first, kv_first, group, wc);
  gpu->attention_fwd_bf16(og, lse16.g, qg, kg, vg, B, S, Hq, Hkv, D, q_first, kv_first, group, wg);
  cpu->from_bf16(o16.c, oc, nq);
  gpu->from_bf16(o16.g, og, nq);
  cpu->attention_bwd_bf16(dq16.c, dk16.c, dv16.c, dout.c, oc, lse16.c, qc, kc, vc, B, S, Hq, Hkv,
                          D, q_first, kv_first, group, wc);
  gpu->attention_bwd_bf16(dq16.g, dk16.g, dv16.g, dout.g, og, lse16.g, qg, kg, vg, B, S, Hq, Hkv,
                          D, q_first, kv_first, group, wg);
  pair *got16[5] = {&o16, &lse16, &dq16, &dk16, &dv16};
  for (int i = 0; i < 5; i++) {
    snprintf(name, sizeof name, "attention_bf16 B%d S%d Hq%d Hkv%d D%d q%d kv%d: %s", B, S, Hq,
             Hkv, D, q_first, kv_first, what[i]);
    check(name, *got16[i], 1e-2);
  }
  cpu->release(qc), cpu->release(kc), cpu->release(vc), cpu->release(oc), cpu->release(wc);
  gpu->release(qg), gpu->release(kg), gpu->release(vg), gpu->release(og), gpu->release(wg);
  drop(o16), drop(lse16), drop(dq16), drop(dk16), drop(dv16);
  drop(q), drop(k), drop(v), drop(out), drop(lse), drop(dout), drop(dq), drop(dk), drop(dv);
}

static void check_elementwise(int64_t n) {
  pair a = make(n, 3), b = make(n, 3), dy = make(n, 1), out = output(n), da = output(n), db = output(n);
  cpu->swiglu_fwd(out.c, a.c, b.c, n);
  gpu->swiglu_fwd(out.g, a.g, b.g, n);
  check("swiglu_fwd", out, 1e-5);
  cpu->swiglu_bwd(da.c, db.c, dy.c, a.c, b.c, n);
  gpu->swiglu_bwd(da.g, db.g, dy.g, a.g, b.g, n);
  check("swiglu_bwd dgate", da, 1e-5);
  check("swiglu_bwd dup", db, 1e-5);
  cpu->add(a.c, a.c, b.c, n); /* out aliases a, as the header allows */
  gpu->add(a.g, a.g, b.g, n);
  check("add (out aliases a)", a, 1e-5);
  cpu->accumulate(b.c, dy.c, n);
  gpu->accumulate(b.g, dy.g, n);
  check("accumulate", b, 1e-5);
  cpu->scale(dy.c, 0.37f, n);
  gpu->scale(dy.g, 0.37f, n);
  check("scale", dy, 1e-5);
  drop(a), drop(b), drop(dy), drop(out), drop(da), drop(db);
}

static void check_cross_entropy(int N, int V, int vocab_first) {
  int32_t *tg_g, *tg = tokens_pair(N, V + 2 * vocab_first, &tg_g); /* some targets off the shard */
  pair z = make((int64_t)N * V, 4), mx = output(N), sm = output(N), loss = make(N, 0.5);
  cpu->ce_row_max(mx.c, z.c, N, V);
  gpu->ce_row_max(mx.g, z.g, N, V);
  check("ce_row_max", mx, 1e-5);
  cpu->ce_row_sum(sm.c, z.c, mx.c, N, V);
  gpu->ce_row_sum(sm.g, z.g, mx.g, N, V);
  check("ce_row_sum", sm, 1e-5);
  /* the bf16 gradient first (the fp32 one below overwrites the logits): as values, to 1e-2 */
  pair loss16 = make(N, 0.5), vals = output((int64_t)N * V);
  uint16_t *hc = cpu->alloc((size_t)N * V * 2), *hg = gpu_halves((int64_t)N * V);
  cpu->ce_loss_grad_bf16(loss16.c, hc, z.c, tg, mx.c, sm.c, N, V, vocab_first, 1.0f / N);
  gpu->ce_loss_grad_bf16(loss16.g, hg, z.g, tg_g, mx.g, sm.g, N, V, vocab_first, 1.0f / N);
  check("ce_loss_grad_bf16 loss +=", loss16, 1e-5);
  cpu->from_bf16(vals.c, hc, (int64_t)N * V);
  gpu->from_bf16(vals.g, hg, (int64_t)N * V);
  check("ce_loss_grad_bf16 dlogits", vals, 1e-2);
  cpu->release(hc);
  gpu->release(hg);
  drop(loss16), drop(vals);
  cpu->ce_loss_grad(loss.c, z.c, z.c, tg, mx.c, sm.c, N, V, vocab_first, 1.0f / N);
  gpu->ce_loss_grad(loss.g, z.g, z.g, tg_g, mx.g, sm.g, N, V, vocab_first, 1.0f / N);
  check("ce_loss_grad loss +=", loss, 1e-5);
  check("ce_loss_grad dlogits (in place)", z, 1e-5);
  drop(z), drop(mx), drop(sm), drop(loss);
  free(tg);
  gpu->release(tg_g);
}

static void check_optimizer(int64_t n) {
  pair p = make(n, 1), g = make(n, 1), m = make(n, 0.1), v = make(n, 0.1);
  for (int64_t i = 0; i < n; i++) v.c[i] = fabsf(v.c[i]);
  gpu->to_device(v.g, v.c, (size_t)n * 4);
  for (int step = 1; step <= 3; step++) {
    cpu->adamw(p.c, g.c, m.c, v.c, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step, 0.5f);
    gpu->adamw(p.g, g.g, m.g, v.g, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step, 0.5f);
  }
  check("adamw param (3 steps)", p, 1e-5);
  check("adamw m", m, 1e-5);
  check("adamw v", v, 1e-5);
  double a = cpu->sum_squares(g.c, n), b = gpu->sum_squares(g.g, n);
  double rel = fabs(a - b) / a;
  checks++;
  bool ok = isfinite(b) && rel <= 1e-9;
  if (!ok) failures++;
  printf("%-44s %-4s  rel error %.3e  (tolerance 1e-09)\n", "sum_squares (double)", ok ? "ok" : "FAIL", rel);
  drop(p), drop(g), drop(m), drop(v);
}

int main(int argc, char **argv) {
  if (argc < 2 || (strcmp(argv[1], "fp32") && strcmp(argv[1], "bf16") && strcmp(argv[1], "self"))) {
    fprintf(stderr, "usage: check_kernels fp32|bf16|self [SEED] [--quick]\n");
    return 2;
  }
  bool quick = false;
  for (int i = 2; i < argc; i++)
    if (strcmp(argv[i], "--quick") == 0) quick = true;
    else rng_state ^= strtoull(argv[i], NULL, 10) * 0x9e3779b97f4a7c15ull;
  bool self = strcmp(argv[1], "self") == 0;
  bool bf16 = strcmp(argv[1], "bf16") == 0;
  math_name = argv[1];
  matmul_tol = bf16 ? 1e-2 : 1e-5;
  const char *attention = getenv("FF_ATTENTION"); /* bf16 math: tensor cores unless fused */
  bool attention_bf16 = bf16 && !(attention && strcmp(attention, "fused") == 0);
  attention_tol = attention_bf16 ? 1e-2 : 1e-5;
  char why[256];
  cpu = ff_kernels_cpu(1);
  gpu = self ? cpu : ff_kernels_cuda(0, bf16 ? FF_MATH_BF16 : FF_MATH_FP32, NULL, why, sizeof why);
  if (!gpu) {
    printf("check_kernels: no CUDA backend here (%s); nothing checked\n", why);
    return 77;
  }
  check_matmul(154, 96, 200, 0);
  check_matmul(77, 64, 172, 1);
  if (!quick) check_matmul(512, 2048, 5632, 0);
  check_matmul_bf16(154, 96, 200, 0);
  check_matmul_bf16(77, 64, 172, 1);              /* operands 2 bytes off alignment */
  if (!quick) check_matmul_bf16(512, 2048, 5632, 0);
  if (self) check_the_checker();
  check_copy_rows(33, 40, 96);
  int64_t n = quick ? 20011 : 100003; /* elementwise lengths, not a multiple of a block */
  check_bf16(n);
  check_bf16_forms(quick ? 21 : 77, 2048, n);
  check_embedding(154, 96, 256, 40, 200);
  check_embedding(50, 300, 64, 0, 64);           /* C past one block of threads */
  check_rmsnorm(quick ? 33 : 154, 2048);
  check_rmsnorm(77, 96);
  check_rope(2, 77, 3, 64);
  if (quick) {
    check_attention(2, 45, 3, 2, 16, 1, 0, 2);   /* GQA shard: heads 1-3 over kv 0-1 */
    check_attention(1, 70, 2, 1, 64, 2, 1, 2);   /* heads 2-3 over kv head 1, a partial tile */
    check_attention(1, 66, 1, 1, 128, 0, 0, 1);
    check_attention(1, 40, 1, 1, 200, 0, 0, 1);  /* D not a power of two, past 128 */
    check_attention(1, 20, 2, 1, 256, 0, 0, 2);  /* the largest D, GQA */
  } else {
    check_attention(2, 77, 4, 4, 16, 0, 0, 1);   /* MHA, S not a multiple of the tile */
    check_attention(2, 77, 3, 2, 16, 1, 0, 2);   /* GQA shard: heads 1-3 over kv 0-1 */
    check_attention(1, 130, 2, 1, 64, 2, 1, 2);  /* heads 2-3 over kv head 1 */
    check_attention(1, 96, 2, 2, 128, 0, 0, 1);
    check_attention(2, 200, 2, 2, 64, 0, 0, 1);  /* several 64-row tiles, the last one partial */
    check_attention(1, 300, 4, 2, 128, 0, 0, 2); /* the 1B model's head dimension, GQA */
    check_attention(1, 40, 1, 1, 200, 0, 0, 1);  /* D not a power of two, past 128 */
    check_attention(1, 70, 2, 1, 256, 0, 0, 2);  /* the largest D, GQA */
  }
  check_elementwise(n);
  check_cross_entropy(154, 256, 0);
  check_cross_entropy(77, 1000, 300);            /* a vocabulary shard */
  check_optimizer(n);
  ff_kernel_memory mem;
  gpu->memory(&mem);
  printf("check_kernels (%s): %d checks, %d failed; GPU allocations now %.1f MiB, peak %.1f MiB\n",
         math_name, checks, failures, mem.allocated_bytes / 1048576.0, mem.peak_bytes / 1048576.0);
  return failures ? 1 : 0;
}
