/* bench_train.c — one-rank CPU training speed against what OpenBLAS reaches on a large sgemm,
 * and against PyTorch's step for the same model.
 *
 *   bench_train [--threads N] [--steps N] [--no-torch]
 *
 * Model: Llama with hidden 512, 8 heads, FFN 1376, 8 layers, sequence 256, byte vocabulary 256;
 * a global batch of 8 sequences in micro-batches of 4; data: the LICENSE text. Prints the
 * achieved model FLOP/s of a training step (model FLOPs of the step / step time, median of the
 * timed steps) beside sgemm's FLOP/s on 2048³ in the same run, and the ratio; then, unless
 * --no-torch or PyTorch cannot be imported, the same model's step in PyTorch with as many
 * threads (bench/torch_step.py, run by /usr/bin/python3, Debian's python3-torch) and ffrun's
 * step over PyTorch's. */
#define _POSIX_C_SOURCE 200809L /* popen */
#include <cblas.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "data.h"
#include "ff_blas_core.h"
#include "ff_cost.h"
#include "model.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double sgemm_flops(int n, int reps) {
  float *a = malloc((size_t)n * n * sizeof *a), *b = malloc((size_t)n * n * sizeof *b),
        *c = malloc((size_t)n * n * sizeof *c);
  for (size_t i = 0; i < (size_t)n * n; i++)
    a[i] = (float)(i % 7) * 0.1f, b[i] = (float)(i % 5) * 0.1f;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1, a, n, b, n, 0, c, n);
  double best = 1e30;
  for (int r = 0; r < reps; r++) {
    double t = now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1, a, n, b, n, 0, c, n);
    t = now() - t;
    if (t < best)
      best = t;
  }
  free(a), free(b), free(c);
  return 2.0 * n * (double)n * n / best;
}

/* PyTorch's step for the same model (bench/torch_step.py), in ms; 0 when it cannot run. */
static double torch_step_ms(int threads, int steps) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s/../bench/torch_step.py' --threads %d --steps %d",
           FF_BENCH_PROFILES_DIR, threads, steps);
  FILE *p = popen(cmd, "r");
  if (!p)
    return 0;
  char line[256];
  double ms = 0;
  while (fgets(line, sizeof line, p)) {
    double v;
    if (sscanf(line, "torch_step_ms %lf", &v) == 1)
      ms = v;
  }
  int rc = pclose(p);
  if (rc != 0 || ms <= 0) {
    fprintf(stderr, "bench_train: no PyTorch step to compare (bench/torch_step.py %s)\n",
            rc != 0 ? "failed; is python3-torch installed?" : "printed no time");
    return 0;
  }
  return ms;
}

int main(int argc, char **argv) {
  ff_blas_core_select(argv); /* the kernels ffrun would run */
  int threads = 1, steps = 6;
  bool torch = true;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc)
      threads = atoi(argv[++i]);
    else if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc)
      steps = atoi(argv[++i]);
    else if (strcmp(argv[i], "--no-torch") == 0)
      torch = false;
    else {
      fprintf(stderr, "usage: bench_train [--threads N] [--steps N] [--no-torch]\n");
      return 2;
    }
  }
  if (threads < 1 || steps < 1) {
    fprintf(stderr, "bench_train: --threads and --steps take a positive count\n");
    return 2;
  }
  ff_model m = {.name = "bench-512", .layers = 8, .hidden = 512, .heads = 8, .kv_heads = 8,
                .ffn_hidden = 1376, .vocab = 256, .seq_len = 256, .norm_eps = 1e-5,
                .rope_theta = 10000};
  const int64_t B = 8, mbs = 4, S = m.seq_len;
  const ff_kernels *k = ff_kernels_cpu(threads);
  ff_shard_spec spec = {0, m.layers, true, true, {0, m.heads}, {0, m.kv_heads}, {0, m.ffn_hidden},
                        {0, m.vocab}};
  ff_model_rank mr;
  ff_diag d;
  ff_diag_init(&d, NULL);
  ff_data data;
  if (ff_model_rank_init(&mr, &m, k, &spec, mbs, 1, false, FF_RECOMPUTE_NONE) != FF_OK ||
      ff_data_load(&data, FF_BENCH_PROFILES_DIR "/../LICENSE", 1, m.vocab, S, &d) != FF_OK) {
    ff_diag_print(&d, stderr);
    return 1;
  }
  ff_model_rank_init_weights(&mr, 1234);
  int32_t *in = malloc((size_t)(mbs * S) * sizeof *in), *tg = malloc((size_t)(mbs * S) * sizeof *tg);
  double *times = malloc((size_t)steps * sizeof *times);
  for (int s = 0; s <= steps; s++) { /* step 0 warms up */
    double t = now(), loss = 0;
    k->zero(mr.grads, (size_t)mr.n_params * sizeof(float));
    for (int64_t mb = 0; mb < B / mbs; mb++) {
      for (int64_t i = 0; i < mbs; i++)
        ff_data_sequence(&data, s, mb * mbs + i, B, S, in + i * S, tg + i * S);
      ff_model_rank_step_micro_batch(&mr, in, tg, mbs, 1.0f / (float)(B * S), &loss);
    }
    for (int i = 0; i < mr.n_tensors; i++)
      k->adamw(mr.params + mr.tensors[i].offset, mr.grads + mr.tensors[i].offset,
               mr.m + mr.tensors[i].offset, mr.v + mr.tensors[i].offset, mr.tensors[i].numel,
               1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, s + 1, 1.0f);
    if (s > 0)
      times[s - 1] = now() - t;
  }
  qsort(times, (size_t)steps, sizeof *times, cmp_double);
  double step_s = times[steps / 2];
  double flops = ff_flops_model_per_token(&m) * (double)(B * S);
  double gemm = sgemm_flops(2048, 3);
  printf("| threads | model | tokens/step | step (ms, median of %d) | model GFLOP/s | sgemm 2048³ GFLOP/s | ratio | target |\n", steps);
  printf("|---:|---|---:|---:|---:|---:|---:|---|\n");
  printf("| %d | h512 l8 s256 V256 | %lld | %.1f | %.2f | %.2f | %.1f %% | ≥ 50 %% |\n", threads,
         (long long)(B * S), step_s * 1e3, flops / step_s / 1e9, gemm / 1e9,
         100 * flops / step_s / gemm);
  char core[160];
  ff_blas_core_describe(core, sizeof core);
  printf("\nOpenBLAS core: %s\n", core);
  if (torch) {
    double ms = torch_step_ms(threads, steps);
    if (ms > 0)
      printf("\nPyTorch, same model, batch and optimizer, %d thread%s: %.1f ms per step; "
             "ffrun / PyTorch = %.2f\n", threads, threads == 1 ? "" : "s", ms,
             step_s * 1e3 / ms);
  }
  free(in), free(tg), free(times);
  ff_model_rank_free(&mr);
  ff_data_free(&data);
  return 0;
}
