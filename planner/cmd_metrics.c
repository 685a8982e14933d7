/* cmd_metrics.c — `ffplan metrics RUN.jsonl [--get KEY,...] [--stages]`: read a run's metrics
 * through the strict reader (ff_metrics.h) and print a summary of the run, or the named keys of
 * every step (with --stages, of every stage of every step) as tab-separated columns, so that
 * scripts read metrics that were checked, never raw JSON. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ff_metrics.h"
#include "ffplan_cmds.h"

/* A column: a double at offset, an int64_t at offset, or the step's number. */
typedef enum { REAL, INTEGER, STEP } column_kind;

typedef struct column {
  const char *key;
  size_t offset;
  column_kind kind;
} column;

#define COL(k) {#k, offsetof(ff_metrics_step, k), REAL}
static const column columns[] = {
    {"step", 0, STEP},
    {"ranks", offsetof(ff_metrics_step, ranks), INTEGER},
    COL(loss),
    COL(lr),
    COL(grad_norm),
    COL(step_seconds),
    COL(tokens_per_second),
    COL(flops_per_second),
    COL(mfu),
    COL(compute_seconds),
    COL(other_seconds),
    COL(matmul_seconds),
    COL(attention_seconds),
    COL(peak_memory_gib),
    COL(memory_gib),
    COL(device_used_gib),
    COL(predicted_iteration_seconds),
    COL(predicted_memory_gib),
    COL(val_loss),
    COL(val_perplexity),
    {"val_tokens", offsetof(ff_metrics_step, val_tokens), INTEGER},
};
#undef COL
#define S_COL(k) {#k, offsetof(ff_metrics_stage, k), REAL}
static const column stage_columns[] = {
    {"step", 0, STEP}, /* the step's, not the stage's */
    {"pipeline", offsetof(ff_metrics_stage, pipeline), INTEGER},
    {"stage", offsetof(ff_metrics_stage, stage), INTEGER},
    S_COL(compute_seconds),
    S_COL(p2p_seconds),
    S_COL(tp_seconds),
    S_COL(dp_seconds),
    S_COL(bubble_seconds),
    S_COL(memory_gib),
    S_COL(device_used_gib),
    S_COL(predicted_compute_seconds),
    S_COL(predicted_p2p_seconds),
    S_COL(predicted_tp_seconds),
    S_COL(predicted_dp_seconds),
    S_COL(predicted_bubble_seconds),
    S_COL(predicted_memory_gib),
};
#undef S_COL

typedef struct table {
  const column *col;
  int n;
} table;

static int metrics_usage(const char *why) {
  fprintf(stderr, "ffplan metrics: %s\nusage: ffplan metrics RUN.jsonl [--get KEY[,KEY...] "
          "[--stages]]\n", why);
  return FF_ERR_INPUT;
}

/* KEYS, comma-separated, as indices into t; exit status 2 naming an unknown key. */
static int parse_keys(const char *keys, table t, int *picked, int *n) {
  *n = 0;
  for (const char *at = keys; *at;) {
    size_t len = strcspn(at, ",");
    int found = -1;
    for (int c = 0; c < t.n && found < 0; c++)
      if (strlen(t.col[c].key) == len && strncmp(t.col[c].key, at, len) == 0)
        found = c;
    if (found < 0 || *n == 64) {
      fprintf(stderr, "ffplan metrics: --get: %.*s: %s; the keys:", (int)len, at,
              found < 0 ? "not a key of a metrics line" : "more than 64 keys");
      for (int c = 0; c < t.n; c++)
        fprintf(stderr, " %s", t.col[c].key);
      fputc('\n', stderr);
      return FF_ERR_INPUT;
    }
    picked[(*n)++] = found;
    at += len + (at[len] == ',');
  }
  return *n ? FF_OK : metrics_usage("--get needs at least one key");
}

/* One row: the picked columns of the record at base (a step or a stage of step `step`). */
static void print_row(table t, const void *base, int64_t step, const int *picked, int n) {
  for (int k = 0; k < n; k++) {
    const column *c = &t.col[picked[k]];
    const char *p = (const char *)base + c->offset;
    if (c->kind == STEP)
      printf("%lld", (long long)step);
    else if (c->kind == INTEGER)
      printf("%lld", (long long)*(const int64_t *)p);
    else if (isfinite(*(const double *)p))
      printf("%.17g", *(const double *)p);
    else
      printf("null");
    putchar(k + 1 < n ? '\t' : '\n');
  }
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The run in a few lines: steps, loss, the median step after the first two (warm-up), memory. */
static void summary(const char *file, const ff_metrics *m) {
  const ff_metrics_step *first = &m->steps[0], *last = &m->steps[m->n_steps - 1];
  int skipped = 0, from = m->n_steps > 2 ? 2 : 0, n = m->n_steps - from;
  double *t = malloc((size_t)n * sizeof *t), peak = 0;
  for (int i = 0; i < m->n_steps; i++) {
    skipped += !m->steps[i].loss_finite;
    peak = fmax(peak, m->steps[i].peak_memory_gib);
  }
  printf("%s: %d steps (%lld to %lld) on %lld rank%s\n", file, m->n_steps, (long long)first->step,
         (long long)last->step, (long long)last->ranks, last->ranks == 1 ? "" : "s");
  printf("  loss %.6g -> %.6g%s\n", first->loss, last->loss, skipped ? " (some not finite)" : "");
  if (skipped)
    printf("  steps with a non-finite loss: %d\n", skipped);
  if (t) {
    for (int i = 0; i < n; i++)
      t[i] = m->steps[from + i].step_seconds;
    qsort(t, (size_t)n, sizeof *t, by_value);
    double med = t[n / 2];
    printf("  step %.4g s (median of steps %lld to %lld), %.0f tokens/s\n", med,
           (long long)m->steps[from].step, (long long)last->step,
           med > 0 ? last->tokens_per_second * last->step_seconds / med : 0.0);
    if (last->predicted_iteration_seconds > 0)
      printf("  predicted %.4g s (%+.1f %%)\n", last->predicted_iteration_seconds,
             100 * (last->predicted_iteration_seconds - med) / med);
  }
  printf("  memory peak %.3f GiB%s\n", peak, last->ranks > 1 ? " (rank 0)" : "");
  const ff_metrics_step *v0 = NULL, *v1 = NULL; /* the first and last validations */
  for (int i = 0; i < m->n_steps; i++)
    if (m->steps[i].val_tokens > 0) {
      v0 = v0 ? v0 : &m->steps[i];
      v1 = &m->steps[i];
    }
  if (v0)
    printf("  validation loss %.6g (step %lld) -> %.6g (step %lld), perplexity %.6g, %lld tokens\n",
           v0->val_loss, (long long)v0->step, v1->val_loss, (long long)v1->step, v1->val_perplexity,
           (long long)v1->val_tokens);
  free(t);
}

int ffplan_cmd_metrics(int argc, char **argv) {
  const char *file = NULL, *keys = NULL;
  bool stages = false;
  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "--get") == 0) {
      if (i + 1 >= argc)
        return metrics_usage("--get needs KEY[,KEY...]");
      keys = argv[++i];
    } else if (strcmp(argv[i], "--stages") == 0) {
      stages = true;
    } else if (argv[i][0] == '-' && argv[i][1]) {
      fprintf(stderr, "ffplan metrics: unknown option %s (see ffplan --help)\n", argv[i]);
      return FF_ERR_INPUT;
    } else if (!file) {
      file = argv[i];
    } else {
      return metrics_usage("expected one RUN.jsonl");
    }
  }
  if (!file)
    return metrics_usage("expected a RUN.jsonl file");
  if (stages && !keys)
    return metrics_usage("--stages needs --get KEY[,KEY...]");
  table t = stages ? (table){stage_columns, (int)(sizeof stage_columns / sizeof *stage_columns)}
                   : (table){columns, (int)(sizeof columns / sizeof *columns)};
  int picked[64], n_picked = 0;
  if (keys && parse_keys(keys, t, picked, &n_picked) != FF_OK)
    return FF_ERR_INPUT;
  ff_diag d;
  ff_metrics m;
  ff_diag_init(&d, file);
  ff_status st = ff_metrics_read(file, &d, &m);
  ff_diag_print(&d, stderr);
  ff_diag_free(&d);
  if (st != FF_OK)
    return st;
  if (!keys)
    summary(file, &m);
  for (int i = 0; keys && i < m.n_steps; i++) {
    const ff_metrics_step *s = &m.steps[i];
    if (!stages)
      print_row(t, s, s->step, picked, n_picked);
    for (int j = 0; stages && j < s->n_stages; j++)
      print_row(t, &s->stages[j], s->step, picked, n_picked);
  }
  ff_metrics_free(&m);
  return fflush(stdout) == 0 ? FF_OK : FF_ERR_RUNTIME;
}
