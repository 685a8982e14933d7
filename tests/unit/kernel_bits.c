/* kernel_bits.c — prints one hash of the bits the CPU backend's element-wise kernels write on
 * fixed inputs, to compare builds: the kernels compiled in clones for SSE2, AVX2 and AVX-512
 * (the loader runs the widest the CPU has) against the same source compiled once for SSE2
 * (-DFF_CPU_ONE_ISA). tests/meson.build runs both and the test passes when the hashes are equal,
 * so the vector width never changes a loss.
 *
 *   kernel_bits      prints "<16 hex digits>" and exits 0 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ff_kernels.h"

static uint64_t hash = 1469598103934665603ull; /* FNV-1a, 64 bits */

static void mix(const void *p, size_t bytes) {
  const unsigned char *b = p;
  for (size_t i = 0; i < bytes; i++) hash = (hash ^ b[i]) * 1099511628211ull;
}

static uint64_t rng = 88172645463325252ull;

/* uniform in [-scale, scale), xorshift64: the same numbers on every machine */
static float uniform(float scale) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return scale * ((float)(rng >> 40) / (float)(1u << 24) * 2.0f - 1.0f);
}

static float *filled(int64_t n, float scale) {
  float *x = malloc((size_t)n * sizeof *x);
  if (!x) exit(1);
  for (int64_t i = 0; i < n; i++) x[i] = uniform(scale);
  return x;
}

int main(void) {
  const ff_kernels *K = ff_kernels_cpu(1);
  enum { N = 37, C = 203, B = 2, S = 131, H = 3, D = 20, V = 517, E = 1013 };
  /* SwiGLU, forward and backward, over lengths that leave a tail in every vector width */
  float *gate = filled(E, 12.0f), *up = filled(E, 2.0f), *dout = filled(E, 1.0f);
  float *out = filled(E, 0.0f), *dgate = filled(E, 0.0f), *dup = filled(E, 0.0f);
  K->swiglu_fwd(out, gate, up, E);
  K->swiglu_bwd(dgate, dup, dout, gate, up, E);
  mix(out, E * sizeof *out), mix(dgate, E * sizeof *dgate), mix(dup, E * sizeof *dup);
  /* RMSNorm */
  float *x = filled(N * C, 3.0f), *w = filled(C, 1.0f), *y = filled(N * C, 0.0f);
  float *rstd = filled(N, 0.0f), *dy = filled(N * C, 1.0f), *dx = filled(N * C, 0.0f);
  float *dw = filled(C, 0.0f);
  K->rmsnorm_fwd(y, rstd, x, w, N, C, 1e-5f);
  K->rmsnorm_bwd(dx, dw, dy, x, w, rstd, N, C);
  mix(y, N * C * sizeof *y), mix(rstd, N * sizeof *rstd), mix(dx, N * C * sizeof *dx);
  mix(dw, C * sizeof *dw);
  /* attention across score tiles, forward and backward */
  int64_t t = (int64_t)B * S * H * D;
  float *q = filled(t, 1.5f), *k = filled(t, 1.5f), *v = filled(t, 1.0f), *o = filled(t, 0.0f);
  float *lse = filled(B * H * S, 0.0f), *dout_a = filled(t, 1.0f);
  float *dq = filled(t, 0.0f), *dk = filled(t, 0.0f), *dv = filled(t, 0.0f);
  K->attention_fwd(o, lse, q, k, v, B, S, H, H, D, 0, 0, 1);
  K->attention_bwd(dq, dk, dv, dout_a, o, lse, q, k, v, B, S, H, H, D, 0, 0, 1);
  mix(o, (size_t)t * sizeof *o), mix(lse, B * H * S * sizeof *lse);
  mix(dq, (size_t)t * sizeof *dq), mix(dk, (size_t)t * sizeof *dk), mix(dv, (size_t)t * sizeof *dv);
  /* cross-entropy, its three passes, logits spread wide enough to reach exp's extremes */
  float *logits = filled(N * V, 60.0f), *row_max = filled(N, 0.0f), *row_sum = filled(N, 0.0f);
  float *loss = calloc(N, sizeof *loss), *dlogits = filled(N * V, 0.0f);
  int32_t targets[N];
  for (int n = 0; n < N; n++) targets[n] = (n * 97) % V;
  K->ce_row_max(row_max, logits, N, V);
  K->ce_row_sum(row_sum, logits, row_max, N, V);
  K->ce_loss_grad(loss, dlogits, logits, targets, row_max, row_sum, N, V, 0, 1.0f / N);
  mix(row_sum, N * sizeof *row_sum), mix(loss, N * sizeof *loss);
  mix(dlogits, N * V * sizeof *dlogits);
  /* AdamW, three steps */
  float *p = filled(E, 1.0f), *g = filled(E, 0.1f), *m = calloc(E, sizeof *m);
  float *s2 = calloc(E, sizeof *s2);
  for (int step = 1; step <= 3; step++)
    K->adamw(p, g, m, s2, E, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, step, 0.75f);
  mix(p, E * sizeof *p), mix(m, E * sizeof *m), mix(s2, E * sizeof *s2);
  /* bf16 rounding, a NaN and infinities among the values */
  uint16_t half[E];
  x[5] = NAN, x[6] = INFINITY, x[7] = -INFINITY;
  K->to_bf16(half, x, E);
  K->from_bf16(gate, half, E);
  mix(half, sizeof half), mix(gate, E * sizeof *gate);
  printf("%016llx\n", (unsigned long long)hash);
  free(gate), free(up), free(dout), free(out), free(dgate), free(dup), free(x), free(w), free(y);
  free(rstd), free(dy), free(dx), free(dw), free(q), free(k), free(v), free(o), free(lse);
  free(dout_a), free(dq), free(dk), free(dv), free(logits), free(row_max), free(row_sum);
  free(loss), free(dlogits), free(p), free(g), free(m), free(s2);
  return 0;
}
