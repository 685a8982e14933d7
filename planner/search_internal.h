/* search_internal.h — the parts of the planner's search, shared between its files:
 * search.c (configurations, candidates, phases), units.c (what a unit costs, its stage model),
 * split.c (the exact layer and micro-batch splits), refine.c (local moves and the integer
 * program). Not an interface outside planner/. */
#ifndef FF_SEARCH_INTERNAL_H
#define FF_SEARCH_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "graph.h"
#include "search.h"

#define FF_SEARCH_MODES 3 /* recompute none, selective, full */

struct ff_search_ctx {
  const ff_cluster *cluster;
  const ff_model *model;
  const ff_training *training;
  ff_search_opts opts;
  ff_graph graph;  /* the device graph: links and the canonical node order */
  int64_t scored;  /* full evaluations */
};

/* ---- units.c ---------------------------------------------------------------------------- */

/* What one unit (a TP group of one device type) costs, per layer and per micro-batch of size b
 * with dp pipelines. */
typedef struct ff_unit_cost {
  double layer_seconds[FF_SEARCH_MODES]; /* fwd + bwd + recompute + TP, per layer, micro-batch */
  double state_bytes_per_layer;          /* weights, gradients, master, moments (per rank) */
  double act_bytes_per_layer[FF_SEARCH_MODES]; /* per micro-batch in flight */
  double buffer_bytes[FF_SEARCH_MODES];  /* the stage's buffers, less those per micro-batch */
  double slot_bytes;                     /* buffers per micro-batch in flight */
  double capacity_bytes;                 /* memory minus runtime reserve */
  double embed_seconds, head_seconds;    /* extra per micro-batch on the end stages */
  double embed_bytes, head_bytes;        /* extra state on the end stages (and logits) */
  double peak_flops;                     /* the unit's summed dense peak */
} ff_unit_cost;

ff_unit_cost ff_unit_cost_of(const ff_search_ctx *ctx, const ff_unit *u, int64_t b, int dp);
/* Two units cost the same: device, TP degree and the links their group uses agree. */
bool ff_unit_same_kind(const ff_search_ctx *ctx, const ff_unit *a, const ff_unit *b);
/* Costs of n units, computed once per kind. */
void ff_unit_costs(const ff_search_ctx *ctx, const ff_unit *units, int n, int64_t b, int dp,
                   ff_unit_cost *out);

/* The layer-split model of one stage. */
typedef struct ff_stage_model {
  double tau[FF_SEARCH_MODES];   /* seconds per layer */
  double cap[FF_SEARCH_MODES];   /* most layers that fit */
  double fixed_seconds;  /* embedding / head work */
  bool end;              /* holds the embedding or the LM head: may hold no layers */
} ff_stage_model;

/* A unit of cost `uc` at stage k of p with about m_est micro-batches (1F1B in flight). */
ff_stage_model ff_stage_model_at(const ff_search_ctx *ctx, const ff_unit_cost *uc, int k, int p,
                                 int64_t m_est);
/* The models of every stage of a pipeline. */
void ff_stage_models(const ff_search_ctx *ctx, const ff_cand_pipe *cp, const ff_unit_cost *costs,
                     int64_t m_est, ff_stage_model *sms);

/* ---- split.c ---------------------------------------------------------------------------- */

/* Layers (and the cheapest recompute mode lo..hi that fits) per stage minimising the slowest
 * stage under memory; false when the layers do not fit. */
bool ff_split_layers(const ff_stage_model *sms, int p, int64_t layers, int lo, int hi,
                     int64_t *out, int *modes, double *stage_seconds);
/* Micro-batches per pipeline minimising the slowest closed-form 1F1B time (m − 1)·slow + sum. */
void ff_split_micro_batches(const double *slow, const double *sum, int n, int64_t total,
                            int64_t *out);

/* ---- refine.c --------------------------------------------------------------------------- */

/* Refine one start with local moves and, when ctx->opts.ilp, the integer program; `out` is the
 * best plan found, `how` what produced it (layout and node order left to the caller). */
ff_status ff_refine_start(ff_search_ctx *ctx, const ff_candidate *start, ff_candidate *out,
                          ff_search_origin *how);

#endif
