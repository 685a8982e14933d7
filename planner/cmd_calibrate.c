/* cmd_calibrate.c — `ffplan calibrate --plan PLAN --metrics RUN.jsonl --cluster C -o C2`: fit a
 * cluster profile to what a run measured.
 *
 * The run's metrics hold, per step and stage, the measured compute, TP, p2p and DP seconds (the
 * first step is left out as warm-up). The plan is evaluated against C, and two kinds of factor are
 * fitted: per device type, measured compute over predicted compute (its GEMM figures, measured
 * layer times and peaks are scaled by it), and for the links, measured over predicted
 * communication per node and for the network (see fit()). Each term is the median over the
 * steps. Memory: each device type's runtime reserve absorbs the difference between the memory the
 * ranks held and the prediction. C2 is written with the device types inline;
 * the prediction error of each term is printed before and after. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ff_cost.h"
#include "ff_metrics.h"
#include "ffplan_cmds.h"

/* Time terms (seconds per step), then the rank's memory (GiB; the peak over the steps, and only
 * where the metrics carry it). */
enum { TERM_COMPUTE, TERM_TP, TERM_P2P, TERM_DP, TERM_MEMORY, TERM_COUNT };
static const char *const term_keys[TERM_COUNT] = {"compute_seconds", "tp_seconds", "p2p_seconds",
                                                  "dp_seconds", "memory_gib"};

typedef struct measured {
  double *stage;    /* [stage index over the plan][TERM_COUNT], median over steps */
  double iteration; /* median step seconds */
  bool have_memory; /* every line gave each stage's memory */
  int steps;
} measured;

static int stage_count(const ff_plan *p) {
  int n = 0;
  for (int q = 0; q < p->n_pipelines; q++)
    n += p->pipelines[q].n_stages;
  return n;
}

static int compare_doubles(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Median of column `col` of rows × width values (sorted in a scratch copy). */
static double column_median(const double *values, int rows, int width, int col, double *scratch) {
  for (int r = 0; r < rows; r++)
    scratch[r] = values[(size_t)r * width + col];
  qsort(scratch, (size_t)rows, sizeof *scratch, compare_doubles);
  return rows % 2 ? scratch[rows / 2] : 0.5 * (scratch[rows / 2 - 1] + scratch[rows / 2]);
}

/* Per stage and term, and for the step, the median over the steps after the first: one slow
 * step (a page fault, a neighbour on the machine) must not move the fitted factors. The metrics
 * are read strictly (ff_metrics.h); each line must describe every stage of this plan. */
static ff_status read_metrics(const char *file, const ff_plan *plan, measured *m) {
  ff_diag d;
  ff_diag_init(&d, file);
  ff_metrics mx;
  ff_status st = ff_metrics_read(file, &d, &mx);
  ff_diag_print(&d, stderr);
  ff_diag_free(&d);
  if (st != FF_OK)
    return st;
  int n = stage_count(plan), width = n * TERM_COUNT + 1;
  for (int i = 0; i < mx.n_steps; i++)
    if (mx.steps[i].n_stages != n) {
      fprintf(stderr, "%s:%d: stages: %d entries, but the plan has %d stages (expected a "
              "metrics line of a run of this plan)\n", file, i + 1, mx.steps[i].n_stages, n);
      ff_metrics_free(&mx);
      return FF_ERR_INPUT;
    }
  m->steps = mx.n_steps - 1; /* the first step warms up caches and the allocator */
  m->have_memory = true;
  m->iteration = 0;
  m->stage = calloc((size_t)n * TERM_COUNT, sizeof *m->stage);
  double *rows = malloc((size_t)(m->steps > 0 ? m->steps : 1) * width * sizeof *rows);
  double *scratch = malloc((size_t)(m->steps > 0 ? m->steps : 1) * sizeof *scratch);
  if (!m->stage || !rows || !scratch) {
    free(rows), free(scratch);
    ff_metrics_free(&mx);
    return FF_ERR_RUNTIME;
  }
  if (m->steps == 0) {
    fprintf(stderr, "%s: needs at least two steps (the first is left out)\n", file);
    free(rows), free(scratch);
    ff_metrics_free(&mx);
    return FF_ERR_INPUT;
  }
  for (int r = 0; r < m->steps; r++) {
    const ff_metrics_step *line = &mx.steps[r + 1];
    double *row = rows + (size_t)r * width;
    for (int i = 0; i < n; i++) {
      const ff_metrics_stage *sg = &line->stages[i];
      double *t = row + i * TERM_COUNT;
      t[TERM_COMPUTE] = sg->compute_seconds;
      t[TERM_TP] = sg->tp_seconds;
      t[TERM_P2P] = sg->p2p_seconds;
      t[TERM_DP] = sg->dp_seconds;
      /* memory: on a GPU, what the device holds, context included */
      t[TERM_MEMORY] = sg->device_used_gib > 0 ? sg->device_used_gib : sg->memory_gib;
      m->have_memory &= sg->memory_gib >= 0;
    }
    row[width - 1] = line->step_seconds;
  }
  for (int i = 0; i < n * TERM_COUNT; i++)
    m->stage[i] = column_median(rows, m->steps, width, i, scratch);
  for (int i = 0; i < n; i++) /* memory: the peak, not the median */
    for (int r = 0; r < m->steps; r++) {
      double x = rows[(size_t)r * width + i * TERM_COUNT + TERM_MEMORY];
      if (x > m->stage[i * TERM_COUNT + TERM_MEMORY])
        m->stage[i * TERM_COUNT + TERM_MEMORY] = x;
    }
  m->iteration = column_median(rows, m->steps, width, width - 1, scratch);
  free(scratch);
  free(rows);
  ff_metrics_free(&mx);
  return FF_OK;
}

/* The plan with its cluster replaced by c (nodes and device types matched by name). */
ff_status ffplan_rebind(ff_plan *p, const ff_cluster *c) {
  for (int q = 0; q < p->n_pipelines; q++)
    for (int s = 0; s < p->pipelines[q].n_stages; s++)
      for (int t = 0; t < p->pipelines[q].stages[s].n_ranks; t++) {
        ff_plan_rank *r = &p->pipelines[q].stages[s].ranks[t];
        int node = ff_cluster_find_node(c, p->cluster.nodes[r->node].name);
        int dev = ff_cluster_find_device(c, p->cluster.devices[r->device].name);
        if (node < 0 || dev < 0) {
          fprintf(stderr, "ffplan calibrate: node \"%s\" or device \"%s\" of the plan is not in the "
                  "given cluster\n", p->cluster.nodes[r->node].name, p->cluster.devices[r->device].name);
          return FF_ERR_INPUT;
        }
        r->node = node;
        r->device = dev;
      }
  return FF_OK;
}

/* Predicted per-stage terms (same units as the metrics: seconds per step). */
static void predicted_terms(const ff_plan *p, const ff_plan_eval *e, double *out) {
  int i = 0;
  for (int q = 0; q < p->n_pipelines; q++)
    for (int s = 0; s < p->pipelines[q].n_stages; s++, i++) {
      const ff_plan_pipeline *pl = &p->pipelines[q];
      const ff_stage_eval *se = &e->pipelines[q].stages[s];
      const ff_rank_eval *re = &e->ranks[pl->stages[s].ranks[0].rank];
      double mb = (double)pl->micro_batches;
      out[i * TERM_COUNT + TERM_COMPUTE] = mb * (re->compute_fwd_seconds + re->compute_bwd_seconds + re->recompute_seconds);
      out[i * TERM_COUNT + TERM_TP] = mb * re->tp_seconds;
      out[i * TERM_COUNT + TERM_P2P] = mb * ff_stage_p2p_seconds(se);
      out[i * TERM_COUNT + TERM_DP] = se->dp_seconds;
      out[i * TERM_COUNT + TERM_MEMORY] = re->memory_total_bytes / FF_GIB;
    }
}

static void scale_device(ff_device *d, double factor) { /* factor: measured / predicted time */
  for (int t = 0; t < FF_DTYPE_COUNT; t++)
    d->peak_tflops[t] /= factor;
  d->memory_bandwidth_gb_per_s /= factor;
  for (int g = 0; g < d->n_gemm; g++)
    d->gemm[g].tflops /= factor;
  for (int l = 0; l < d->n_layers; l++) {
    d->layers[l].forward_ms *= factor;
    d->layers[l].backward_ms *= factor;
  }
  free(d->ref); /* written inline from now on */
  d->ref = NULL;
}

/* α–β time scales by f when both α and 1/β do. */
static void scale_link(ff_link *l, double factor) {
  l->bandwidth_gb_per_s /= factor;
  l->latency_us *= factor;
}

static double clamp_factor(double f) { return isfinite(f) && f > 1e-3 ? (f < 1e3 ? f : 1e3) : 1.0; }

/* The node of the first rank of stage s of pipeline q. */
static int stage_node(const ff_plan *p, int q, int s) { return p->pipelines[q].stages[s].ranks[0].node; }

/* Whether the DP group of stage (q, s) reaches another node: the stages of the other pipelines
 * holding its first layer have a rank elsewhere. */
static bool dp_crosses_nodes(const ff_plan *p, int q, int s) {
  int64_t layer = p->pipelines[q].stages[s].layers.first;
  int home = stage_node(p, q, s);
  for (int r = 0; r < p->n_pipelines; r++)
    for (int t = 0; t < p->pipelines[r].n_stages; t++) {
      const ff_plan_stage *st = &p->pipelines[r].stages[t];
      if (layer < st->layers.first || layer >= st->layers.end)
        continue;
      for (int k = 0; k < st->n_ranks; k++)
        if (st->ranks[k].node != home)
          return true;
    }
  return false;
}

/* Memory: per device type, the runtime reserve moves by the median over its stages of measured
 * minus predicted memory (never below zero), so the prediction meets what the ranks held — the
 * backend's allocations, or on a GPU all the device held, its context included. */
static void fit_reserves(const ff_plan *p, const measured *m, const double *pred, ff_cluster *c) {
  int n = stage_count(p);
  double *gap = malloc((size_t)n * sizeof *gap);
  if (!gap)
    return;
  for (int d = 0; d < c->n_devices; d++) {
    int k = 0, i = 0;
    for (int q = 0; q < p->n_pipelines; q++)
      for (int s = 0; s < p->pipelines[q].n_stages; s++, i++)
        if (p->pipelines[q].stages[s].ranks[0].device == d)
          gap[k++] = m->stage[i * TERM_COUNT + TERM_MEMORY] - pred[i * TERM_COUNT + TERM_MEMORY];
    if (k == 0)
      continue;
    qsort(gap, (size_t)k, sizeof *gap, compare_doubles);
    double median = k % 2 ? gap[k / 2] : 0.5 * (gap[k / 2 - 1] + gap[k / 2]);
    double was = c->devices[d].runtime_reserve_gib, now = was + median > 0 ? was + median : 0;
    printf("  device %-24s runtime reserve %.3f -> %.3f GiB\n", c->devices[d].name, was, now);
    c->devices[d].runtime_reserve_gib = now;
  }
  free(gap);
}

/* Keep the smallest measured/predicted ratio seen for a link class. */
static void candidate(double *best, double measured_s, double predicted_s) {
  if (predicted_s > 1e-12 && measured_s > 0 && measured_s / predicted_s < *best)
    *best = measured_s / predicted_s;
}

/* Fit: per device type its compute factor; for the links, one factor per node (its island and
 * intra-node links, from the TP, DP and p2p terms that stay on it) and one for the network (from
 * the DP and p2p terms that leave a node). A stage's measured communication includes waiting for
 * its partners (skewed TP ranks, a neighbour stage), so each class takes the stage that waited
 * least — the smallest measured/predicted ratio — as the links' own. A class nothing measured
 * takes the smallest ratio over all communication. */
static void fit(const ff_plan *p, const measured *m, const double *pred, ff_cluster *c) {
  int i = 0;
  double *num = calloc((size_t)c->n_devices, sizeof *num), *den = calloc((size_t)c->n_devices, sizeof *den);
  double *node = malloc((size_t)c->n_nodes * sizeof *node);
  if (!num || !den || !node) {
    free(num), free(den), free(node);
    return;
  }
  for (int n = 0; n < c->n_nodes; n++)
    node[n] = INFINITY;
  double net = INFINITY, any = INFINITY;
  for (int q = 0; q < p->n_pipelines; q++)
    for (int s = 0; s < p->pipelines[q].n_stages; s++, i++) {
      const double *ms = m->stage + i * TERM_COUNT, *ps = pred + i * TERM_COUNT;
      int dev = p->pipelines[q].stages[s].ranks[0].device, home = stage_node(p, q, s);
      num[dev] += ms[TERM_COMPUTE];
      den[dev] += ps[TERM_COMPUTE];
      candidate(&node[home], ms[TERM_TP], ps[TERM_TP]);
      candidate(dp_crosses_nodes(p, q, s) ? &net : &node[home], ms[TERM_DP], ps[TERM_DP]);
      bool p2p_leaves = s + 1 < p->pipelines[q].n_stages && stage_node(p, q, s + 1) != home;
      candidate(p2p_leaves ? &net : &node[home], ms[TERM_P2P], ps[TERM_P2P]);
      for (int t = TERM_TP; t <= TERM_DP; t++)
        candidate(&any, ms[t], ps[t]);
    }
  for (int d = 0; d < c->n_devices; d++)
    if (den[d] > 0) {
      double f = clamp_factor(num[d] / den[d]);
      printf("  device %-24s compute x%.3f\n", c->devices[d].name, f);
      scale_device(&c->devices[d], f);
    }
  if (isfinite(any)) {
    for (int n = 0; n < c->n_nodes; n++) {
      double f = clamp_factor(isfinite(node[n]) ? node[n] : any);
      printf("  node %-26s communication x%.3f%s\n", c->nodes[n].name, f,
             isfinite(node[n]) ? "" : " (nothing measured on it: the smallest ratio)");
      scale_link(&c->nodes[n].island, f);
      scale_link(&c->nodes[n].intra, f);
    }
    double f = clamp_factor(isfinite(net) ? net : any);
    printf("  network                         communication x%.3f%s\n", f,
           isfinite(net) ? "" : " (nothing measured crosses nodes: the smallest ratio)");
    scale_link(&c->net_default, f);
    for (int g = 0; g < c->n_groups; g++)
      scale_link(&c->groups[g].link, f);
    for (int o = 0; o < c->n_overrides; o++)
      scale_link(&c->overrides[o].link, f);
  }
  if (m->have_memory)
    fit_reserves(p, m, pred, c);
  else
    printf("  memory                          not fitted: the metrics carry no per-stage memory\n");
  free(num), free(den), free(node);
}

static void print_errors(const ff_plan *p, const measured *m, const double *before,
                         const double *after, double it_before, double it_after) {
  printf("%-34s %12s %12s %12s %9s %9s\n", "term (seconds per step)", "measured", "before", "after",
         "err bef.", "err aft.");
  int i = 0;
  for (int q = 0; q < p->n_pipelines; q++)
    for (int s = 0; s < p->pipelines[q].n_stages; s++, i++)
      for (int t = 0; t < TERM_COUNT; t++) {
        double x = m->stage[i * TERM_COUNT + t], b = before[i * TERM_COUNT + t], a = after[i * TERM_COUNT + t];
        if (x == 0 && b == 0)
          continue;
        char name[64];
        if (t == TERM_MEMORY && !m->have_memory)
          continue;
        snprintf(name, sizeof name, "pipeline %d stage %d %s", q, s,
                 t == TERM_MEMORY ? "memory (GiB)" : "");
        if (t != TERM_MEMORY) /* "compute_seconds" -> "compute" */
          snprintf(name + strlen(name), sizeof name - strlen(name), "%.*s",
                   (int)(strlen(term_keys[t]) - 8), term_keys[t]);
        printf("%-34s %12.6f %12.6f %12.6f %8.1f%% %8.1f%%\n", name, x, b, a,
               x > 0 ? 100 * (b - x) / x : 0, x > 0 ? 100 * (a - x) / x : 0);
      }
  printf("%-34s %12.6f %12.6f %12.6f %8.1f%% %8.1f%%\n", "iteration", m->iteration, it_before,
         it_after, 100 * (it_before - m->iteration) / m->iteration,
         100 * (it_after - m->iteration) / m->iteration);
}

int ffplan_cmd_calibrate(int argc, char **argv) {
  const char *plan_file = NULL, *metrics_file = NULL, *cluster_file = NULL, *out = NULL;
  for (int i = 0; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--plan") == 0)
      plan_file = argv[i + 1];
    else if (strcmp(argv[i], "--metrics") == 0)
      metrics_file = argv[i + 1];
    else if (strcmp(argv[i], "--cluster") == 0)
      cluster_file = argv[i + 1];
    else if (strcmp(argv[i], "-o") == 0)
      out = argv[i + 1];
    else
      break;
  }
  if (!plan_file || !metrics_file || !cluster_file || !out || argc % 2) {
    fprintf(stderr, "usage: ffplan calibrate --plan PLAN --metrics RUN.jsonl --cluster C -o C2\n");
    return FF_ERR_INPUT;
  }
  ff_diag d;
  ff_diag_init(&d, NULL);
  ff_plan plan;
  ff_cluster c;
  bool have_plan = ff_load_plan(plan_file, &d, &plan) == FF_OK;
  bool have_c = ff_load_cluster(cluster_file, &d, &c) == FF_OK;
  ff_diag_print(&d, stderr);
  ff_diag_free(&d);
  measured m = {0};
  int rc = have_plan && have_c ? read_metrics(metrics_file, &plan, &m) : FF_ERR_INPUT;
  ff_plan bound = {0};
  if (rc == FF_OK) {
    bound = plan;
    bound.cluster = c; /* borrowed: the plan's own cluster is freed with the plan */
    rc = ffplan_rebind(&bound, &c);
  }
  int n = have_plan ? stage_count(&plan) : 0;
  double *before = calloc((size_t)n * TERM_COUNT + 1, sizeof *before);
  double *after = calloc((size_t)n * TERM_COUNT + 1, sizeof *after);
  ff_plan_eval e;
  double it_before = 0, it_after = 0;
  if (rc == FF_OK && ff_evaluate_plan(&bound, &e) == FF_OK) {
    predicted_terms(&bound, &e, before);
    it_before = e.iteration_seconds;
    ff_plan_eval_free(&e);
    printf("fitted factors (measured / predicted):\n");
    fit(&bound, &m, before, &c);
    bound.cluster = c;
    if (ff_evaluate_plan(&bound, &e) == FF_OK) {
      predicted_terms(&bound, &e, after);
      it_after = e.iteration_seconds;
      ff_plan_eval_free(&e);
    }
    print_errors(&bound, &m, before, after, it_before, it_after);
    cJSON *tree = ff_cluster_to_json(&c, true, false);
    ff_diag_init(&d, out);
    rc = ff_write_json_atomic(out, tree, &d);
    cJSON_Delete(tree);
    ff_diag_print(&d, stderr);
    ff_diag_free(&d);
  }
  free(before), free(after), free(m.stage);
  if (have_c)
    ff_cluster_free(&c);
  if (have_plan) {
    /* the plan's rank indices were rebound into c; its own cluster is still whole */
    ff_plan_free(&plan);
  }
  return rc;
}
