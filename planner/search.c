/* search.c — the planner's search (see search.h and docs/planner.md).
 *
 * Phase 1 enumerates configurations — device types left idle, a TP degree per device type, node
 * order (the device graph's canonical order, link clusters, METIS partitions: graph.c,
 * partition.c), layout (striped, blocked, one pipeline per part), pipeline count and micro-batch
 * size — and scores each with a cheap surrogate: per pipeline the layer split that minimises the
 * slowest stage under memory, the micro-batch split that minimises the closed-form pipeline time
 * (both exact: split.c; the unit and stage models they use: units.c), plus an estimate of the DP
 * all-reduce. Phase 2 scores the best surrogates with the full cost model and simulator, refines
 * the three best distinct plans not from METIS partitions and the three best from them with
 * local moves and the integer program (refine.c, milp.c), and keeps runner-ups. */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ff_version.h"
#include "partition.h"
#include "search_internal.h"

#define MAX_TYPES 64
#define MAX_TP_OPTIONS 11 /* 1, 2, 4, ..., 1024 */
#define SURROGATE_KEEP 24
/* Distinct plans refined from each of the two sets (not from METIS partitions; from them): a
 * descent from the best start does not always end in the best local optimum. Taken from the
 * two sets together, the METIS orders' starts crowded out the one that descended best
 * (flashflex-a 13B, −4.7 % without partitions). */
#define REFINE_STARTS 3
#define PARTITION_MAX_K 8 /* METIS partitions into 2..8 parts */
#define PARTITION_SEEDS 2
#define STRIPE_ORDERS_MAX_NODES 64 /* above it, no striped layouts over partition orders */


/* ---- candidates ------------------------------------------------------------------------- */

void ff_candidate_free(ff_candidate *c) {
  for (int j = 0; j < c->n_pipes; j++)
    free(c->pipes[j].stages);
  free(c->pipes);
  free(c->units);
  memset(c, 0, sizeof *c);
  c->seconds = INFINITY;
}

ff_status ff_candidate_copy(const ff_candidate *src, ff_candidate *dst) {
  *dst = *src;
  dst->units = malloc((size_t)src->n_units * sizeof *dst->units);
  dst->pipes = calloc((size_t)src->n_pipes, sizeof *dst->pipes);
  if (!dst->units || !dst->pipes) {
    free(dst->units), free(dst->pipes);
    memset(dst, 0, sizeof *dst);
    return FF_ERR_RUNTIME;
  }
  memcpy(dst->units, src->units, (size_t)src->n_units * sizeof *dst->units);
  for (int j = 0; j < src->n_pipes; j++) {
    dst->pipes[j] = src->pipes[j];
    dst->pipes[j].stages = malloc((size_t)src->pipes[j].n_stages * sizeof(ff_cand_stage));
    if (!dst->pipes[j].stages) {
      dst->n_pipes = j;
      ff_candidate_free(dst);
      return FF_ERR_RUNTIME;
    }
    memcpy(dst->pipes[j].stages, src->pipes[j].stages,
           (size_t)src->pipes[j].n_stages * sizeof(ff_cand_stage));
  }
  return FF_OK;
}

/* Split `total` into `parts` ranges as evenly as possible, the first ones one larger. */
static ff_span even_range(int64_t total, int parts, int index) {
  int64_t base = total / parts, extra = total % parts;
  int64_t first = (int64_t)index * base + (index < extra ? index : extra);
  return (ff_span){first, first + base + (index < extra ? 1 : 0)};
}

ff_status ff_candidate_to_plan(const ff_search_ctx *ctx, const ff_candidate *c, ff_plan *out) {
  const ff_model *m = ctx->model;
  memset(out, 0, sizeof *out);
  out->model = *m;
  out->training = *ctx->training;
  out->cluster = *ctx->cluster;
  out->pipelines = calloc((size_t)c->n_pipes, sizeof *out->pipelines);
  if (!out->pipelines)
    return FF_ERR_RUNTIME;
  out->n_pipelines = c->n_pipes;
  int64_t rank = 0, g = m->heads / m->kv_heads;
  for (int j = 0; j < c->n_pipes; j++) {
    const ff_cand_pipe *cp = &c->pipes[j];
    ff_plan_pipeline *pl = &out->pipelines[j];
    pl->micro_batch_size = c->micro_batch_size;
    pl->micro_batches = cp->micro_batches;
    pl->batch = c->micro_batch_size * cp->micro_batches;
    pl->stages = calloc((size_t)cp->n_stages, sizeof *pl->stages);
    if (!pl->stages)
      return FF_ERR_RUNTIME;
    pl->n_stages = cp->n_stages;
    int64_t layer = 0;
    for (int k = 0; k < cp->n_stages; k++) {
      const ff_unit *u = &c->units[cp->stages[k].unit];
      ff_plan_stage *st = &pl->stages[k];
      st->layers = (ff_span){layer, layer + cp->stages[k].layers};
      layer = st->layers.end;
      st->embedding = k == 0;
      st->lm_head = k == cp->n_stages - 1;
      st->recompute = cp->stages[k].recompute;
      st->ranks = calloc((size_t)u->tp, sizeof *st->ranks);
      if (!st->ranks)
        return FF_ERR_RUNTIME;
      st->n_ranks = u->tp;
      for (int t = 0; t < u->tp; t++) {
        ff_plan_rank *r = &st->ranks[t];
        r->rank = rank++;
        r->node = u->node;
        r->gpu = u->first_gpu + t;
        r->device = u->device;
        r->heads = even_range(m->heads, u->tp, t);
        r->kv_heads = (ff_span){r->heads.first / g, (r->heads.end + g - 1) / g};
        r->ffn = even_range(m->ffn_hidden, u->tp, t);
        if (st->embedding || st->lm_head)
          r->vocab = even_range(m->vocab, u->tp, t);
      }
    }
  }
  out->n_ranks = rank;
  return FF_OK;
}

/* Free what ff_candidate_to_plan allocated (the inputs are borrowed). */
static void free_borrowed_plan(ff_plan *p) {
  for (int j = 0; j < p->n_pipelines; j++) {
    for (int k = 0; k < p->pipelines[j].n_stages; k++)
      free(p->pipelines[j].stages[k].ranks);
    free(p->pipelines[j].stages);
  }
  free(p->pipelines);
  memset(p, 0, sizeof *p);
}

double ff_candidate_score(ff_search_ctx *ctx, ff_candidate *c) {
  ff_plan plan;
  ff_plan_eval e;
  c->seconds = INFINITY;
  if (ff_candidate_to_plan(ctx, c, &plan) != FF_OK) {
    free_borrowed_plan(&plan);
    return INFINITY;
  }
  ctx->scored++;
  if (ff_evaluate_plan(&plan, &e) == FF_OK) {
    if (e.fits)
      c->seconds = e.iteration_seconds;
    ff_plan_eval_free(&e);
  }
  free_borrowed_plan(&plan);
  return c->seconds;
}

/* ---- building candidates from a configuration ------------------------------------------- */

typedef enum layout { LAYOUT_STRIPED, LAYOUT_BLOCKED, LAYOUT_PARTS, LAYOUT_PREFIX } layout;
static const char *const layout_names[] = {"striped", "blocked", "one pipeline per part",
                                           "the first units, the rest idle"};

typedef struct config {
  int tp[MAX_TYPES];      /* per device type; 0: the type is left idle */
  int n_pipes;
  layout layout;
  int prefix_units; /* LAYOUT_PREFIX: one pipeline of this many units, the first of the order */
  const ff_node_order *order; /* the node order units follow (partition.h) */
  int64_t micro_batch_size;
  /* fixed splits, for the baselines: equal layers / layers by memory, equal batch */
  bool equal_layers, layers_by_memory, equal_batch;
  int uniform_mode;       /* -1 free; else the one recompute mode for every stage */
} config;

static void describe(const ff_search_ctx *ctx, const config *cf, const ff_candidate *c, char *out,
                     size_t cap) {
  int min_s = 1 << 30, max_s = 0;
  for (int j = 0; j < c->n_pipes; j++) {
    if (c->pipes[j].n_stages < min_s)
      min_s = c->pipes[j].n_stages;
    if (c->pipes[j].n_stages > max_s)
      max_s = c->pipes[j].n_stages;
  }
  size_t n = (size_t)snprintf(out, cap, "%d pipeline%s x %d", c->n_pipes,
                              c->n_pipes == 1 ? "" : "s", min_s);
  if (max_s != min_s)
    n += (size_t)snprintf(out + n, cap - n, "-%d", max_s);
  n += (size_t)snprintf(out + n, cap - n, " stages (%s over the %s), micro-batch %lld, TP",
                        layout_names[cf->layout], cf->order->what, (long long)c->micro_batch_size);
  for (int d = 0; d < ctx->cluster->n_devices && n < cap; d++) {
    bool present = false;
    for (int i = 0; i < ctx->cluster->n_nodes; i++)
      present |= ctx->cluster->nodes[i].device == d;
    if (!present)
      continue;
    if (cf->tp[d])
      n += (size_t)snprintf(out + n, cap - n, " %s:%d", ctx->cluster->devices[d].name, cf->tp[d]);
    else
      n += (size_t)snprintf(out + n, cap - n, " %s:idle", ctx->cluster->devices[d].name);
  }
}

/* Units in the configuration's node order; part_of[u] the part of unit u's node. */
static int make_units(const ff_search_ctx *ctx, const config *cf, ff_unit *units, int *part_of) {
  int n = 0;
  const ff_node_order *o = cf->order;
  for (int i = 0; i < o->n; i++) {
    int node = o->order[i];
    const ff_node *nd = &ctx->cluster->nodes[node];
    int tp = cf->tp[nd->device];
    if (tp <= 0)
      continue;
    for (int g = 0; g + tp <= nd->gpus; g += tp) {
      part_of[n] = o->part[i];
      units[n++] = (ff_unit){node, g, tp, nd->device};
    }
  }
  return n;
}

/* Stages of pipeline j and their units under the configuration's layout (part_of: see
 * make_units). Returns the stage count; with `units_out` NULL only counts. */
static int layout_pipeline(const config *cf, int n_units, const int *part_of, int j,
                           int *units_out) {
  int D = cf->n_pipes, n = 0;
  switch (cf->layout) {
  case LAYOUT_STRIPED:
    for (int u = j; u < n_units; u += D, n++)
      if (units_out)
        units_out[n] = u;
    return n;
  case LAYOUT_BLOCKED: {
    int first = 0;
    for (int q = 0; q < j; q++)
      first += n_units / D + (q < n_units % D ? 1 : 0);
    n = n_units / D + (j < n_units % D ? 1 : 0);
    for (int k = 0; k < n && units_out; k++)
      units_out[k] = first + k;
    return n;
  }
  case LAYOUT_PREFIX:
    for (int u = 0; u < cf->prefix_units && u < n_units; u++, n++)
      if (units_out)
        units_out[n] = u;
    return n;
  case LAYOUT_PARTS:
    for (int u = 0; u < n_units; u++)
      if (part_of[u] == j) {
        if (units_out)
          units_out[n] = u;
        n++;
      }
    return n;
  }
  return 0;
}

/* Form the pipelines of a configuration and split layers and micro-batches. Returns the
 * surrogate time, INFINITY when it does not fit or cannot be formed. */
static double build_candidate(ff_search_ctx *ctx, const config *cf, ff_unit *units, int n_units,
                              const int *part_of, ff_unit_cost *costs, ff_candidate *c) {
  const ff_model *m = ctx->model;
  const ff_training *t = ctx->training;
  int D = cf->n_pipes;
  int64_t N = t->global_batch / cf->micro_batch_size;
  memset(c, 0, sizeof *c);
  c->seconds = INFINITY;
  if (D < 1 || n_units < D || N < D || t->global_batch % cf->micro_batch_size != 0)
    return INFINITY;
  if (cf->equal_batch && N % D != 0)
    return INFINITY;
  int p_max = 0;
  for (int j = 0; j < D; j++) {
    int n = layout_pipeline(cf, n_units, part_of, j, NULL);
    if (n == 0)
      return INFINITY;
    if (n > p_max)
      p_max = n;
  }
  if (p_max > m->layers + 1)
    return INFINITY;
  c->units = malloc((size_t)n_units * sizeof *c->units);
  c->pipes = calloc((size_t)D, sizeof *c->pipes);
  if (!c->units || !c->pipes) {
    ff_candidate_free(c);
    return INFINITY;
  }
  memcpy(c->units, units, (size_t)n_units * sizeof *units);
  c->n_units = n_units;
  c->n_pipes = D;
  c->micro_batch_size = cf->micro_batch_size;
  int *stage_units = malloc((size_t)p_max * sizeof *stage_units);
  if (!stage_units) {
    ff_candidate_free(c);
    return INFINITY;
  }
  for (int j = 0; j < D; j++) {
    int n = layout_pipeline(cf, n_units, part_of, j, stage_units);
    c->pipes[j].stages = calloc((size_t)n, sizeof(ff_cand_stage));
    if (!c->pipes[j].stages) {
      free(stage_units);
      ff_candidate_free(c);
      return INFINITY;
    }
    c->pipes[j].n_stages = n;
    for (int k = 0; k < n; k++)
      c->pipes[j].stages[k].unit = stage_units[k];
  }
  free(stage_units);
  int64_t m_est = N / D;
  ff_stage_model *sms = malloc((size_t)p_max * sizeof *sms);
  double *slow = malloc((size_t)D * 3 * sizeof *slow);
  int64_t *layers = malloc((size_t)p_max * sizeof *layers);
  int *modes = malloc((size_t)p_max * sizeof *modes);
  double *times = malloc((size_t)D * (size_t)p_max * sizeof *times); /* [pipeline][stage] */
  int64_t *mb = malloc((size_t)D * sizeof *mb);
  int n_nodes = ctx->cluster->n_nodes;
  int *node_gpus = calloc(3 * (size_t)n_nodes, sizeof *node_gpus);
  double result = INFINITY;
  if (!sms || !slow || !layers || !modes || !times || !mb || !node_gpus)
    goto done;
  double *sum = slow + D, *dp = slow + 2 * D;
  /* What shares each node's NICs (cost-model.md §5.8): its GPUs in use, whose gradient sums
   * leave it when a peer is elsewhere, and the stage boundaries that cross it, in the busier
   * direction (sending first stage or sending last). */
  int *as_first = node_gpus + n_nodes, *as_second = node_gpus + 2 * n_nodes;
  for (int j = 0; j < D; j++)
    for (int k = 0; k < c->pipes[j].n_stages; k++) {
      const ff_unit *u = &units[c->pipes[j].stages[k].unit];
      node_gpus[u->node] += u->tp;
      if (k + 1 < c->pipes[j].n_stages) {
        const ff_unit *v = &units[c->pipes[j].stages[k + 1].unit];
        if (v->node != u->node) { /* one flow per piece (cost-model.md §5.6) */
          int flows = ff_boundary_flows(u->tp, v->tp);
          as_first[u->node] += flows, as_second[v->node] += flows;
        }
      }
    }
  for (int x = 0; x < n_nodes; x++)
    if (as_second[x] > as_first[x])
      as_first[x] = as_second[x];
  const int *boundary_flows = as_first;
  double act_bytes = (double)cf->micro_batch_size * (double)m->seq_len * (double)m->hidden *
                     ff_cost_wire_bytes(t);
  int lo = cf->uniform_mode >= 0 ? cf->uniform_mode : 0;
  int hi = cf->uniform_mode >= 0 ? cf->uniform_mode : FF_SEARCH_MODES - 1;
  if (t->recompute != FF_RECOMPUTE_AUTO)
    lo = hi = (int)t->recompute;
  double bpp_grad = 4.0;
  int reps[8], n_reps = 0;
  for (int j = 0; j < D; j++) {
    ff_cand_pipe *cp = &c->pipes[j];
    int p = cp->n_stages;
    double *stage_t = times + (size_t)j * p_max; /* this pipeline's stage times */
    /* Pipelines built like an earlier one (same stage count, device, TP degree and island size
     * per stage) reuse its split. */
    int twin = -1;
    for (int r = 0; r < n_reps && twin < 0; r++) {
      const ff_cand_pipe *q = &c->pipes[reps[r]];
      bool same = q->n_stages == p;
      for (int k = 0; same && k < p; k++) {
        const ff_unit *a = &units[q->stages[k].unit], *b = &units[cp->stages[k].unit];
        same = a->device == b->device && a->tp == b->tp &&
               ctx->cluster->nodes[a->node].island_gpus == ctx->cluster->nodes[b->node].island_gpus;
      }
      if (same)
        twin = reps[r];
    }
    if (twin >= 0) {
      for (int k = 0; k < p; k++)
        cp->stages[k] = (ff_cand_stage){cp->stages[k].unit, c->pipes[twin].stages[k].layers,
                                        c->pipes[twin].stages[k].recompute};
      memcpy(stage_t, times + (size_t)twin * p_max, (size_t)p * sizeof *stage_t);
    } else {
      if (n_reps < 8)
        reps[n_reps++] = j;
      else
        reps[j % 8] = j;
      ff_stage_models(ctx, cp, costs, m_est, sms);
      bool ok;
      if (cf->equal_layers || cf->layers_by_memory) {
        double weight_sum = 0;
        for (int k = 0; k < p; k++)
          weight_sum += cf->equal_layers ? 1.0 : costs[cp->stages[k].unit].capacity_bytes;
        int64_t given = 0;
        for (int k = 0; k < p; k++) {
          double w = cf->equal_layers ? 1.0 : costs[cp->stages[k].unit].capacity_bytes;
          layers[k] = (int64_t)floor((double)m->layers * w / weight_sum);
          given += layers[k];
        }
        for (int k = 0; given < m->layers; k = (k + 1) % p, given++)
          layers[k]++;
        ok = true;
        for (int k = 0; k < p && ok; k++) {
          if (layers[k] < (sms[k].end ? 0 : 1))
            ok = false;
          modes[k] = -1;
          for (int md = lo; md <= hi && modes[k] < 0; md++)
            if (sms[k].cap[md] >= (double)layers[k])
              modes[k] = md;
          if (modes[k] < 0)
            ok = false;
          else
            stage_t[k] = (double)layers[k] * sms[k].tau[modes[k]] + sms[k].fixed_seconds;
        }
      } else {
        ok = ff_split_layers(sms, p, m->layers, lo, hi, layers, modes, stage_t);
      }
      if (!ok)
        goto done;
      for (int k = 0; k < p; k++) {
        cp->stages[k].layers = layers[k];
        cp->stages[k].recompute = (ff_recompute)modes[k];
      }
    }
    dp[j] = 0;
    /* DP estimate: the stage's gradients over the slowest link to the next pipeline's peer. */
    if (D > 1) {
      for (int k = 0; k < p; k++) {
        const ff_unit *u = &units[cp->stages[k].unit];
        const ff_cand_pipe *np = &c->pipes[(j + 1) % D];
        const ff_unit *v = &units[np->stages[k < np->n_stages ? k : np->n_stages - 1].unit];
        ff_link l = ff_cluster_gpu_link(ctx->cluster, u->node, u->first_gpu, v->node, v->first_gpu);
        if (u->node != v->node)
          l = ff_cluster_shared_link(ctx->cluster, l, u->node, v->node, node_gpus[u->node],
                                     node_gpus[v->node]);
        double per_layer = costs[cp->stages[k].unit].state_bytes_per_layer /
                           ff_mem_bytes_per_param(t->precision, t->zero1, D) * bpp_grad;
        double bytes = (double)cp->stages[k].layers * per_layer;
        double tdp = ff_comm_allreduce_ring(D, bytes, l);
        if (tdp > dp[j])
          dp[j] = tdp;
      }
    }
  }
  /* Stage exchanges hold both of their stages (cost-model.md §6): each micro-batch's round on
   * stage k adds the exchange across the boundary before it and the one after it, and the fill
   * and drain cross every boundary twice. */
  for (int j = 0; j < D; j++) {
    int p = c->pipes[j].n_stages;
    double before = 0.0;
    slow[j] = sum[j] = 0.0;
    for (int k = 0; k < p; k++) {
      const ff_unit *u = &units[c->pipes[j].stages[k].unit];
      double after = 0.0;
      if (k + 1 < p) {
        const ff_unit *v = &units[c->pipes[j].stages[k + 1].unit];
        ff_link l = ff_cluster_gpu_link(ctx->cluster, u->node, u->first_gpu, v->node,
                                        v->first_gpu);
        bool cross = u->node != v->node; /* each element once, in pieces (cost-model.md §5.6) */
        if (cross)
          l = ff_cluster_shared_link(ctx->cluster, l, u->node, v->node, boundary_flows[u->node],
                                     boundary_flows[v->node]);
        after = ff_comm_boundary(act_bytes, u->tp, v->tp, cross, l);
      }
      /* the stage gathers what arrives from each neighbour in its own group */
      int arrivals = (k > 0) + (k + 1 < p);
      double tk = times[(size_t)j * p_max + k] +
                  arrivals * ff_comm_gather_node(ctx->cluster, u->node, u->first_gpu, u->tp,
                                                 act_bytes);
      if (tk + before + after > slow[j])
        slow[j] = tk + before + after;
      sum[j] += tk + 2.0 * after;
      before = after;
    }
  }
  if (cf->equal_batch) {
    for (int j = 0; j < D; j++)
      mb[j] = N / D;
  } else {
    ff_split_micro_batches(slow, sum, D, N, mb);
  }
  result = 0;
  for (int j = 0; j < D; j++) {
    c->pipes[j].micro_batches = mb[j];
    double tj = (double)(mb[j] - 1) * slow[j] + sum[j] + dp[j];
    if (tj > result)
      result = tj;
  }
done:
  free(sms), free(slow), free(layers), free(modes), free(times), free(mb), free(node_gpus);
  if (!isfinite(result))
    ff_candidate_free(c);
  return result;
}

/* ---- the keep-list ---------------------------------------------------------------------- */

typedef struct keep_list {
  ff_candidate *items;
  double *surrogate;
  config *configs;
  int n, cap;
} keep_list;

/* Insert c (taking ownership) if it is among the best `cap` by `score`; ties keep the earlier. */
static void keep_insert(keep_list *k, ff_candidate *c, double score, const config *cf) {
  if (!isfinite(score)) {
    ff_candidate_free(c);
    return;
  }
  int at = k->n;
  while (at > 0 && k->surrogate[at - 1] > score)
    at--;
  if (at >= k->cap) {
    ff_candidate_free(c);
    return;
  }
  if (k->n == k->cap) {
    ff_candidate_free(&k->items[k->cap - 1]);
    k->n--;
  }
  memmove(&k->items[at + 1], &k->items[at], (size_t)(k->n - at) * sizeof *k->items);
  memmove(&k->surrogate[at + 1], &k->surrogate[at], (size_t)(k->n - at) * sizeof *k->surrogate);
  memmove(&k->configs[at + 1], &k->configs[at], (size_t)(k->n - at) * sizeof *k->configs);
  k->items[at] = *c;
  k->surrogate[at] = score;
  k->configs[at] = *cf;
  k->n++;
  memset(c, 0, sizeof *c);
}

static bool keep_init(keep_list *k, int cap) {
  k->cap = cap;
  k->n = 0;
  k->items = calloc((size_t)cap + 1, sizeof *k->items);
  k->surrogate = calloc((size_t)cap + 1, sizeof *k->surrogate);
  k->configs = calloc((size_t)cap + 1, sizeof *k->configs);
  return k->items && k->surrogate && k->configs;
}

static void keep_free(keep_list *k) {
  for (int i = 0; i < k->n; i++)
    ff_candidate_free(&k->items[i]);
  free(k->items), free(k->surrogate), free(k->configs);
  memset(k, 0, sizeof *k);
}

/* ---- enumeration ------------------------------------------------------------------------ */

typedef struct type_info {
  int device;
  int tp_options[MAX_TP_OPTIONS];
  int n_tp;
  double speed;
} type_info;

static int type_infos(const ff_search_ctx *ctx, type_info *types) {
  const ff_cluster *c = ctx->cluster;
  int n = 0;
  for (int d = 0; d < c->n_devices && n < MAX_TYPES; d++) {
    int gcd = 0;
    for (int i = 0; i < c->n_nodes; i++) {
      if (c->nodes[i].device != d)
        continue;
      int a = gcd, b = c->nodes[i].gpus;
      while (b) {
        int r = a % b;
        a = b;
        b = r;
      }
      gcd = a;
    }
    if (gcd == 0)
      continue;
    type_info *ti = &types[n++];
    ti->device = d;
    ti->n_tp = 0;
    for (int t = 1; t <= gcd && t <= ctx->model->heads && ti->n_tp < MAX_TP_OPTIONS; t *= 2)
      if (gcd % t == 0)
        ti->tp_options[ti->n_tp++] = t;
    ti->speed = ff_peak_flops(&c->devices[d], ctx->training->precision);
  }
  return n;
}

typedef struct enum_state {
  ff_search_ctx *ctx;
  keep_list *keep;      /* the best surrogates over the canonical order */
  keep_list *keep_part; /* and over the partitions' orders, kept apart so that neither crowds
                         * out the other before the full model decides */
  keep_list *keep_subset; /* and over single parts (the rest idle) */
  keep_list *keep_metis, *keep_metis_subset; /* the same two over METIS partitions' orders:
                                              * apart, so the lists above are what a search
                                              * without them keeps */
  const ff_node_orders *orders; /* node orders of the device types in use */
  ff_unit *units;
  int *part_of;
  ff_unit_cost *costs;
  int64_t configs;
} enum_state;

/* Every micro-batch size for one configuration whose order, layout and pipeline count are set.
 * Returns the best surrogate, of orders other than METIS partitions only: it steers the TP
 * descent, which thus visits the same TP degrees with or without partitions (they add
 * candidates, never change the path). */
static double enumerate_batches(enum_state *es, config *cf, int n_units) {
  ff_search_ctx *ctx = es->ctx;
  double best = INFINITY;
  for (int mi = 0; mi < ctx->training->n_micro_batch_sizes; mi++) {
    cf->micro_batch_size = ctx->training->micro_batch_sizes[mi];
    if (ctx->training->global_batch % cf->micro_batch_size != 0)
      continue;
    ff_unit_costs(ctx, es->units, n_units, cf->micro_batch_size, cf->n_pipes, es->costs);
    ff_candidate c;
    es->configs++;
    double s = build_candidate(ctx, cf, es->units, n_units, es->part_of, es->costs, &c);
    if (s < best && !cf->order->metis)
      best = s;
    keep_list *to = cf->order == &es->orders->items[0] ? es->keep
                    : cf->order->subset ? (cf->order->metis ? es->keep_metis_subset
                                                            : es->keep_subset)
                    : cf->order->metis  ? es->keep_metis
                                        : es->keep_part;
    keep_insert(to, &c, s, cf);
  }
  return best;
}

/* Every node order, layout, pipeline count and micro-batch size for one TP assignment: striped
 * and blocked layouts over the canonical order for every stage count, striped over each
 * partition's order, and one pipeline per part. */
static double enumerate_shapes(enum_state *es, config *cf) {
  ff_search_ctx *ctx = es->ctx;
  double best = INFINITY;
  for (int oi = 0; oi < es->orders->n; oi++) {
    cf->order = &es->orders->items[oi];
    int n_units = make_units(ctx, cf, es->units, es->part_of);
    if (n_units == 0)
      continue;
    int last_D = -1;
    int p_limit = n_units < ctx->model->layers ? n_units : (int)ctx->model->layers;
    for (int p = 1; p <= p_limit; p++) {
      int D = n_units / p;
      if (D == last_D || D < 1)
        continue;
      last_D = D;
      for (int lay = LAYOUT_STRIPED; lay <= LAYOUT_BLOCKED; lay++) {
        if (lay == LAYOUT_BLOCKED && (D == 1 || (oi > 0 && !cf->order->subset)))
          continue; /* one pipeline: both layouts are the same; blocked ignores parts */
        if (oi > 0 && ctx->cluster->n_nodes > STRIPE_ORDERS_MAX_NODES)
          continue; /* large clusters: the partitions' orders serve the parts layout only */
        cf->layout = (layout)lay;
        cf->n_pipes = D;
        double s = enumerate_batches(es, cf, n_units);
        if (s < best)
          best = s;
      }
    }
    /* One pipeline over the first units of the order, the rest idle: a fast island and its
     * best-linked neighbours, without the slow remainder. */
    for (int p = 2; oi == 0 && !cf->equal_batch && p < n_units && p <= ctx->model->layers; p++) {
      cf->layout = LAYOUT_PREFIX;
      cf->n_pipes = 1;
      cf->prefix_units = p;
      double s = enumerate_batches(es, cf, n_units);
      if (s < best)
        best = s;
    }
    if (cf->order->n_parts > 1 && !cf->equal_layers) {
      cf->layout = LAYOUT_PARTS;
      cf->n_pipes = cf->order->n_parts;
      double s = enumerate_batches(es, cf, n_units);
      if (s < best)
        best = s;
    }
  }
  return best;
}

/* Every recompute mode in turn, one for every stage (the uniform baseline). */
static void enumerate_uniform_modes(enum_state *es, config *cf) {
  for (int md = 0; md < FF_SEARCH_MODES; md++) {
    cf->uniform_mode = md;
    enumerate_shapes(es, cf);
  }
}

/* TP per device type, each from its options up to max_tp: the whole product when it is small,
 * else coordinate descent from every type at TP 1. `mode`: one recompute mode for every stage, or
 * -1 for a free choice per stage. */
static void enumerate_tp_choices(enum_state *es, const config *base, const type_info *types,
                                 int n_types, int max_tp, int mode) {
  int n_opt[MAX_TYPES];
  int64_t product = 1;
  for (int i = 0; i < n_types; i++) {
    n_opt[i] = 0;
    while (n_opt[i] < types[i].n_tp && types[i].tp_options[n_opt[i]] <= max_tp)
      n_opt[i]++;
    if (base->tp[types[i].device])
      product *= n_opt[i];
  }
  if (product <= 16) {
    int idx[MAX_TYPES] = {0};
    for (;;) {
      config cf = *base;
      for (int i = 0; i < n_types; i++)
        if (cf.tp[types[i].device])
          cf.tp[types[i].device] = types[i].tp_options[idx[i]];
      cf.uniform_mode = mode;
      enumerate_shapes(es, &cf);
      int i = 0;
      while (i < n_types) {
        if (base->tp[types[i].device] && ++idx[i] < n_opt[i])
          break;
        idx[i] = 0;
        i++;
      }
      if (i == n_types)
        break;
    }
    return;
  }
  config cur = *base;
  for (int i = 0; i < n_types; i++)
    if (cur.tp[types[i].device])
      cur.tp[types[i].device] = 1;
  cur.uniform_mode = mode;
  double cur_best = enumerate_shapes(es, &cur);
  for (int pass = 0; pass < 3; pass++) {
    bool improved = false;
    for (int i = 0; i < n_types; i++) {
      int d = types[i].device;
      if (!cur.tp[d])
        continue;
      for (int k = 0; k < n_opt[i]; k++) {
        if (types[i].tp_options[k] == cur.tp[d])
          continue;
        config cf = cur;
        cf.tp[d] = types[i].tp_options[k];
        double s = enumerate_shapes(es, &cf);
        if (s < cur_best) {
          cur_best = s;
          cur = cf;
          improved = true;
        }
      }
    }
    if (!improved)
      break;
  }
}

/* TP per device type: the whole product when it is small, else coordinate descent from every
 * type at TP 1. */
static void enumerate_tp(enum_state *es, config *base, type_info *types, int n_types,
                         ff_baseline baseline) {
  if (baseline == FF_BASELINE_UNIFORM) {
    /* One TP degree everywhere: those every active type offers. */
    for (int t = 1; t <= 1024; t *= 2) {
      bool all = true;
      for (int i = 0; i < n_types; i++) {
        if (base->tp[types[i].device] == 0)
          continue;
        bool has = false;
        for (int k = 0; k < types[i].n_tp; k++)
          has |= types[i].tp_options[k] == t;
        all &= has;
      }
      if (!all)
        continue;
      config cf = *base;
      for (int i = 0; i < n_types; i++)
        if (cf.tp[types[i].device])
          cf.tp[types[i].device] = t;
      enumerate_uniform_modes(es, &cf);
    }
    return;
  }
  if (baseline == FF_BASELINE_FLASHFLEX) {
    /* FlashFlex's released planner splits each machine's share of a pipeline into TP groups of
     * 1, 2, 4 or 8 GPUs from a fixed table and always recomputes activations: the best over
     * TP degrees up to 8 per device type, full recompute (docs/planner.md, The baselines). */
    enumerate_tp_choices(es, base, types, n_types, 8, FF_RECOMPUTE_FULL);
    return;
  }
  enumerate_tp_choices(es, base, types, n_types, 1 << 30, -1);
}

/* ---- bounds and messages ---------------------------------------------------------------- */

static double lower_bound(const ff_search_ctx *ctx) {
  const ff_cluster *c = ctx->cluster;
  double flops = ff_flops_model_per_token(ctx->model) * (double)ctx->training->global_batch *
                 (double)ctx->model->seq_len;
  double speed = 0;
  for (int i = 0; i < c->n_nodes; i++) {
    const ff_device *dev = &c->devices[c->nodes[i].device];
    double eff = FF_COST_GEMM_EFFICIENCY;
    double peak = ff_peak_flops(dev, ctx->training->precision);
    for (int g = 0; g < dev->n_gemm; g++)
      if (dev->gemm[g].tflops * 1e12 / peak > eff)
        eff = dev->gemm[g].tflops * 1e12 / peak;
    speed += c->nodes[i].gpus * peak * (eff > 1 ? 1 : eff);
  }
  return flops / speed;
}

static void explain_infeasible(const ff_search_ctx *ctx, char *out, size_t cap) {
  const ff_model *m = ctx->model;
  const ff_training *t = ctx->training;
  double params = (double)ff_model_parameters(m);
  double states = params * ff_mem_bytes_per_param(t->precision, false, 1) / FF_GIB;
  double reach = 0;
  for (int i = 0; i < ctx->cluster->n_nodes; i++) {
    const ff_device *dev = &ctx->cluster->devices[ctx->cluster->nodes[i].device];
    reach += ctx->cluster->nodes[i].gpus * (dev->memory_gib - dev->runtime_reserve_gib);
  }
  if (t->global_batch % t->micro_batch_sizes[0] != 0) {
    snprintf(out, cap, "no micro-batch size in [%lld, ...] divides the global batch %lld",
             (long long)t->micro_batch_sizes[0], (long long)t->global_batch);
    return;
  }
  snprintf(out, cap,
           "model states need %.1f GiB per replica (%.2f B parameters at %.0f bytes each) plus "
           "activations; the largest memory one pipeline can reach is %.1f GiB (every GPU of the "
           "cluster, less runtime reserves). To make it fit: add GPUs, use recompute \"full\" or "
           "\"auto\", a smaller micro-batch size or a shorter sequence",
           states, params / 1e9, ff_mem_bytes_per_param(t->precision, false, 1), reach);
}

/* ---- the search ------------------------------------------------------------------------- */

void ff_search_opts_default(ff_search_opts *o) {
  memset(o, 0, sizeof *o);
  o->baseline = FF_BASELINE_NONE;
  o->milp_node_budget = 50;
  o->local_moves = 400;
  o->keep = 3;
  o->partition = true;
  o->ilp = true;
}

static ff_status finish_plan(ff_search_ctx *ctx, const ff_candidate *best, const keep_list *scored,
                             ff_search_result *res) {
  ff_plan borrowed;
  ff_status st = ff_candidate_to_plan(ctx, best, &borrowed);
  if (st != FF_OK) {
    free_borrowed_plan(&borrowed);
    return st;
  }
  ff_plan *p = &res->plan;
  *p = borrowed; /* take the pipelines; copy the inputs so the plan owns them */
  if (ff_model_copy(ctx->model, &p->model) != FF_OK ||
      ff_cluster_copy(ctx->cluster, &p->cluster) != FF_OK) {
    return FF_ERR_RUNTIME;
  }
  p->training = *ctx->training;
  ff_plan_eval e;
  if (ff_evaluate_plan(p, &e) != FF_OK)
    return FF_ERR_RUNTIME;
  ff_plan_set_predicted(p, &e);
  ff_plan_eval_free(&e);
  p->has_search = true;
  char name[2 * FF_NAME_MAX + 2];
  snprintf(name, sizeof name, "%s-%s", ctx->cluster->name, ctx->model->name);
  if (ff_name_valid(name) && strlen(name) <= FF_NAME_MAX) {
    p->has_name = true;
    snprintf(p->name, sizeof p->name, "%s", name);
  }
  char planner[128];
  snprintf(planner, sizeof planner, "ffplan %s%s", FF_VERSION,
           ctx->opts.baseline == FF_BASELINE_UNIFORM     ? " --baseline uniform"
           : ctx->opts.baseline == FF_BASELINE_FLASHFLEX ? " --baseline flashflex"
                                                         : "");
  p->search.planner = strdup(planner);
  p->search.has_origin = true;
  p->search.layout = strdup(res->origin.layout);
  p->search.node_order = strdup(res->origin.node_order);
  p->search.ilp = res->origin.ilp;
  p->search.local_moves = res->origin.local_moves;
  p->search.has_candidates = true;
  p->search.candidates = res->candidates;
  p->search.has_lower_bound = p->search.has_gap = true;
  p->search.lower_bound_seconds = res->lower_bound_seconds;
  p->search.gap = best->seconds / res->lower_bound_seconds - 1.0;
  int n = 0;
  p->search.runner_ups = calloc((size_t)ctx->opts.keep + 1, sizeof *p->search.runner_ups);
  if (!p->search.planner || !p->search.runner_ups || !p->search.layout || !p->search.node_order)
    return FF_ERR_RUNTIME;
  for (int i = 0; i < scored->n && n < ctx->opts.keep; i++) {
    const ff_candidate *c = &scored->items[i];
    if (!isfinite(c->seconds) || strcmp(c->summary, best->summary) == 0)
      continue;
    bool dup = false;
    for (int k = 0; k < n; k++)
      dup |= strcmp(p->search.runner_ups[k].summary, c->summary) == 0;
    if (dup)
      continue;
    p->search.runner_ups[n].iteration_seconds = c->seconds;
    p->search.runner_ups[n].summary = strdup(c->summary);
    if (!p->search.runner_ups[n].summary)
      return FF_ERR_RUNTIME;
    n++;
  }
  p->search.n_runner_ups = n;
  return FF_OK;
}

/* The starting configuration: the `idle` slowest device types left out, the baseline's rules. */
static config base_config(const type_info *types, int n_types, const int *by_speed, int idle,
                          ff_baseline baseline) {
  config base;
  memset(&base, 0, sizeof base);
  base.uniform_mode = -1;
  base.equal_layers = baseline == FF_BASELINE_UNIFORM;
  base.layers_by_memory = baseline == FF_BASELINE_FLASHFLEX;
  base.equal_batch = baseline != FF_BASELINE_NONE;
  for (int i = 0; i < n_types; i++)
    base.tp[types[i].device] = 1;
  for (int i = 0; i < idle; i++)
    base.tp[types[by_speed[i]].device] = 0;
  return base;
}

/* The node orders a search of `baseline` lays pipelines over: the uniform baseline (ranks in
 * order, as Megatron-LM is launched) the canonical order only, held in `one`; the others all. */
static const ff_node_orders *orders_for(ff_baseline baseline, const ff_node_orders *all,
                                        ff_node_orders *one) {
  *one = (ff_node_orders){all->items, 1};
  return baseline == FF_BASELINE_UNIFORM ? one : all;
}

ff_status ff_search(const ff_cluster *cluster, const ff_model *model, const ff_training *training,
                    const ff_search_opts *opts, ff_search_result *res) {
  memset(res, 0, sizeof *res);
  ff_search_ctx ctx = {.cluster = cluster, .model = model, .training = training, .opts = *opts};
  ff_status st = FF_ERR_RUNTIME;
  type_info types[MAX_TYPES];
  int n_types = type_infos(&ctx, types);
  keep_list keep = {0}, keep_part = {0}, keep_subset = {0}, keep_metis = {0},
            keep_metis_subset = {0}, scored = {0}, scored_base = {0}, scored_metis = {0},
            seeds[2] = {{0}}, seeds_metis[2] = {{0}};
  ff_unit *units = malloc((size_t)cluster->total_gpus * sizeof *units);
  ff_unit_cost *costs = malloc((size_t)cluster->total_gpus * sizeof *costs);
  int *part_of = malloc((size_t)cluster->total_gpus * sizeof *part_of);
  ff_node_orders orders[MAX_TYPES] = {{0}}; /* per number of idle device types */
  ff_candidate best = {0};
  best.seconds = INFINITY;
  if (!units || !costs || !part_of || !keep_init(&keep, SURROGATE_KEEP) ||
      !keep_init(&keep_part, SURROGATE_KEEP) || !keep_init(&keep_subset, SURROGATE_KEEP) ||
      !keep_init(&keep_metis, SURROGATE_KEEP) || !keep_init(&keep_metis_subset, SURROGATE_KEEP) ||
      !keep_init(&scored, SURROGATE_KEEP) || !keep_init(&scored_base, SURROGATE_KEEP) ||
      !keep_init(&scored_metis, SURROGATE_KEEP) ||
      ff_graph_build(cluster, training->precision, &ctx.graph) != FF_OK)
    goto done;
  res->lower_bound_seconds = lower_bound(&ctx);

  /* Device types by speed, slowest first: leaving the k slowest idle is a candidate too. */
  int by_speed[MAX_TYPES];
  for (int i = 0; i < n_types; i++)
    by_speed[i] = i;
  for (int i = 1; i < n_types; i++)
    for (int k = i; k > 0 && types[by_speed[k]].speed < types[by_speed[k - 1]].speed; k--) {
      int x = by_speed[k];
      by_speed[k] = by_speed[k - 1];
      by_speed[k - 1] = x;
    }
  enum_state es = {.ctx = &ctx, .keep = &keep, .keep_part = &keep_part,
                   .keep_subset = &keep_subset, .keep_metis = &keep_metis,
                   .keep_metis_subset = &keep_metis_subset, .units = units, .part_of = part_of,
                   .costs = costs};
  int max_idle = opts->baseline == FF_BASELINE_NONE ? n_types - 1 : 0;
  for (int idle = 0; idle <= max_idle; idle++) {
    config base = base_config(types, n_types, by_speed, idle, opts->baseline);
    bool active[MAX_TYPES] = {false};
    for (int d = 0; d < cluster->n_devices && d < MAX_TYPES; d++)
      active[d] = base.tp[d] > 0;
    bool metis = opts->partition && opts->baseline != FF_BASELINE_UNIFORM;
    if (ff_partition_orders(&ctx.graph, active, metis, PARTITION_MAX_K, PARTITION_SEEDS,
                            &orders[idle]) != FF_OK)
      goto done;
    ff_node_orders canonical_only;
    es.orders = orders_for(opts->baseline, &orders[idle], &canonical_only);
    enumerate_tp(&es, &base, types, n_types, opts->baseline);
    if (opts->progress)
      fprintf(stderr, "\rffplan: %lld configurations", (long long)es.configs);
  }
  /* The planner's space contains the baselines' plans: their best shapes are candidates too,
   * so the result is never worse than either baseline. */
  if (opts->baseline == FF_BASELINE_NONE) {
    if (!keep_init(&seeds[0], SURROGATE_KEEP) || !keep_init(&seeds[1], SURROGATE_KEEP) ||
        !keep_init(&seeds_metis[0], SURROGATE_KEEP) || !keep_init(&seeds_metis[1], SURROGATE_KEEP))
      goto done;
    for (int b = FF_BASELINE_UNIFORM; b <= FF_BASELINE_FLASHFLEX; b++) {
      /* One list for each baseline: neither crowds out the other. */
      es.keep = es.keep_part = es.keep_subset = &seeds[b - FF_BASELINE_UNIFORM];
      es.keep_metis = es.keep_metis_subset = &seeds_metis[b - FF_BASELINE_UNIFORM];
      config base = base_config(types, n_types, by_speed, 0, (ff_baseline)b);
      ff_node_orders canonical_only;
      es.orders = orders_for((ff_baseline)b, &orders[0], &canonical_only);
      enumerate_tp(&es, &base, types, n_types, (ff_baseline)b);
    }
  }
  if (opts->progress)
    fprintf(stderr, "\n");

  /* Phase 2: the full cost model on the best surrogates, ranked together (scored) and apart:
   * those not from METIS partitions (scored_base, as a search without partitions ranks them)
   * and those from them (scored_metis). */
  keep_list *lists[] = {&keep, &keep_part, &keep_subset, &seeds[0], &seeds[1], /* base */
                        &keep_metis, &keep_metis_subset, &seeds_metis[0], &seeds_metis[1]};
  for (int list = 0; list < 9; list++) {
    keep_list *from = lists[list];
    for (int i = 0; i < from->n; i++) {
      ff_candidate *c = &from->items[i];
      describe(&ctx, &from->configs[i], c, c->summary, sizeof c->summary);
      double s = ff_candidate_score(&ctx, c);
      ff_candidate copy;
      if (ff_candidate_copy(c, &copy) != FF_OK)
        goto done;
      keep_insert(&scored, &copy, s, &from->configs[i]);
      if (ff_candidate_copy(c, &copy) != FF_OK)
        goto done;
      keep_insert(list < 5 ? &scored_base : &scored_metis, &copy, s, &from->configs[i]);
    }
  }
  if (scored.n == 0) {
    explain_infeasible(&ctx, res->infeasible_why, sizeof res->infeasible_why);
    if (opts->baseline != FF_BASELINE_NONE) {
      char why[sizeof res->infeasible_why];
      snprintf(why, sizeof why, "no plan of the %s baseline's shape (%s) fits; without "
               "--baseline the planner may still find one. %s",
               opts->baseline == FF_BASELINE_UNIFORM ? "uniform" : "FlashFlex",
               opts->baseline == FF_BASELINE_UNIFORM
                   ? "one TP degree, one stage count, equal layers, equal batch"
                   : "TP 1 to 8 per device type, full recompute, layers by memory, equal batch",
               res->infeasible_why);
      snprintf(res->infeasible_why, sizeof res->infeasible_why, "%s", why);
    }
    st = FF_ERR_INFEASIBLE;
    goto done;
  }
  if (ff_candidate_copy(&scored.items[0], &best) != FF_OK)
    goto done;
  res->origin = (ff_search_origin){layout_names[scored.configs[0].layout],
                                   scored.configs[0].order->what, FF_PLAN_ILP_OFF, 0};
  if (opts->baseline == FF_BASELINE_NONE) {
    /* The REFINE_STARTS best distinct plans not from METIS partitions (exactly what a search
     * without them refines, so partitions can only help), then as many from them; each refined
     * on its own: a greedy descent from the best start does not always end in the best local
     * optimum. */
    double tried_seconds[2 * REFINE_STARTS];
    int n_tried = 0;
    keep_list *starts[2] = {&scored_base, &scored_metis};
    for (int set = 0; set < 2; set++)
      for (int i = 0, tried = 0; i < starts[set]->n && tried < REFINE_STARTS; i++) {
        const ff_candidate *from = &starts[set]->items[i];
        bool seen = false; /* the same plan reached from another order or list */
        for (int k = 0; k < n_tried && !seen; k++)
          seen = tried_seconds[k] == from->seconds;
        if (seen)
          continue;
        tried++;
        tried_seconds[n_tried++] = from->seconds;
        ff_candidate refined;
        ff_search_origin how;
        if (ff_refine_start(&ctx, from, &refined, &how) != FF_OK)
          goto done;
        if (refined.seconds < best.seconds) {
          ff_candidate_free(&best);
          best = refined;
          res->origin = how;
          res->origin.layout = layout_names[starts[set]->configs[i].layout];
          res->origin.node_order = starts[set]->configs[i].order->what;
        } else {
          ff_candidate_free(&refined);
        }
      }
  }
  res->candidates = ctx.scored;
  res->idle_gpus = (int)cluster->total_gpus;
  for (int j = 0; j < best.n_pipes; j++)
    for (int k = 0; k < best.pipes[j].n_stages; k++)
      res->idle_gpus -= best.units[best.pipes[j].stages[k].unit].tp;
  st = finish_plan(&ctx, &best, &scored, res);
  res->found = st == FF_OK;
  if (res->found) { /* the order's name dies with the search; point at the plan's copies */
    res->origin.layout = res->plan.search.layout;
    res->origin.node_order = res->plan.search.node_order;
  } else {
    memset(&res->origin, 0, sizeof res->origin);
  }
done:
  ff_candidate_free(&best);
  keep_free(&keep);
  keep_free(&keep_part);
  keep_free(&keep_subset);
  keep_free(&keep_metis);
  keep_free(&keep_metis_subset);
  keep_free(&scored_base);
  keep_free(&scored_metis);
  keep_free(&seeds[0]);
  keep_free(&seeds[1]);
  keep_free(&seeds_metis[0]);
  keep_free(&seeds_metis[1]);
  keep_free(&scored);
  free(units);
  free(costs);
  for (int i = 0; i < MAX_TYPES; i++)
    ff_node_orders_free(&orders[i]);
  free(part_of);
  ff_graph_free(&ctx.graph);
  if (st != FF_OK && st != FF_ERR_INFEASIBLE)
    ff_search_result_free(res);
  return st;
}

void ff_search_result_free(ff_search_result *r) {
  if (r->found)
    ff_plan_free(&r->plan);
  r->found = false;
}

