/* ff_metrics.h — the metrics `ffrun --metrics FILE` writes, one JSON object per line and step
 * (docs/executor.md, "Metrics"), read strictly: every line is parsed by the JSON layer (no
 * duplicate keys, no trailing bytes), every key must be one ffrun writes, every number finite and
 * in range; an error names FILE:LINE and the JSON path. Non-finite losses and norms are written
 * as null. Used by `ffplan calibrate` and `ffplan metrics`, through which the benchmarks and the
 * tests read metrics. */
#ifndef FF_METRICS_H
#define FF_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ff_diag.h"
#include "ff_status.h"

/* One stage of one step: what its first rank measured. */
typedef struct ff_metrics_stage {
  int64_t pipeline, stage;
  double compute_seconds, p2p_seconds, tp_seconds, dp_seconds, bubble_seconds;
  double memory_gib;      /* the backend's allocation peak */
  double device_used_gib; /* 0: not written (the CPU backend) */
  /* The plan's predictions ffrun wrote beside them; -1: not written. */
  double predicted_compute_seconds, predicted_p2p_seconds, predicted_tp_seconds,
      predicted_dp_seconds, predicted_bubble_seconds, predicted_memory_gib;
} ff_metrics_stage;

typedef struct ff_metrics_step {
  int64_t step, ranks;
  bool loss_finite, grad_norm_finite; /* false: written as null */
  double loss, lr, grad_norm, step_seconds, tokens_per_second;
  double flops_per_second, mfu, compute_seconds, other_seconds, matmul_seconds,
      attention_seconds, peak_memory_gib, memory_gib, device_used_gib;
  double predicted_iteration_seconds, predicted_memory_gib;
  /* validation (--eval-data) after this step: NAN when not written (or null) */
  double val_loss, val_perplexity;
  int64_t val_tokens; /* 0: no validation after this step */
  ff_metrics_stage *stages;
  int n_stages;
} ff_metrics_step;

typedef struct ff_metrics {
  ff_metrics_step *steps;
  int n_steps;
} ff_metrics;

/* Every line of text (len bytes) read into *out; file names the source in messages. Blank
 * lines are not allowed; at most FF_METRICS_MAX_STEPS lines. */
#define FF_METRICS_MAX_STEPS 10000000
ff_status ff_metrics_parse(const char *text, size_t len, const char *file, ff_diag *d,
                           ff_metrics *out);
ff_status ff_metrics_read(const char *file, ff_diag *d, ff_metrics *out);
void ff_metrics_free(ff_metrics *m);

#endif
