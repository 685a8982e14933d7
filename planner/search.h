/* search.h — the planner's search: from a cluster, a model and training settings to the plan
 * with the shortest predicted iteration time that fits in every GPU's memory.
 *
 * The search works on *units*: a unit is the TP group of one stage, t GPUs of one node. It
 * enumerates TP degrees per device type, pipeline counts and layouts, micro-batch sizes and the
 * device types left idle; for each combination it forms pipelines from the units, splits layers
 * and micro-batches optimally for the pipeline time surrogate, scores the plan with the full
 * cost model and simulator, refines the best with a GLPK integer program (milp.c) and local
 * moves. docs/planner.md explains the algorithm, its complexity and its limits. */
#ifndef FF_SEARCH_H
#define FF_SEARCH_H

#include <stdbool.h>
#include <stdint.h>

#include "ff_cost.h"
#include "ff_format.h"

/* The most micro-batches an iteration may have (global_batch / smallest micro-batch size) for
 * ffplan plan: each candidate is simulated micro-batch by micro-batch (docs/planner.md, Limits). */
#define FF_PLAN_MAX_MICRO_BATCHES (1 << 20)
/* The most stage counts × GPUs for ffplan plan: the search tries up to min(layers, GPUs) stage
 * counts, each in time linear in the GPUs (docs/planner.md, Limits). */
#define FF_PLAN_MAX_STAGE_GPU_PRODUCT (1LL << 24)

typedef enum ff_baseline { FF_BASELINE_NONE, FF_BASELINE_UNIFORM, FF_BASELINE_FLASHFLEX } ff_baseline;

typedef struct ff_unit {
  int node, first_gpu, tp, device;
} ff_unit;

typedef struct ff_cand_stage {
  int unit;        /* index into the candidate's units */
  int64_t layers;  /* layers this stage holds */
  ff_recompute recompute;
} ff_cand_stage;

typedef struct ff_cand_pipe {
  ff_cand_stage *stages;
  int n_stages;
  int64_t micro_batches;
} ff_cand_pipe;

/* A candidate plan in the planner's terms, before it becomes an ff_plan. */
typedef struct ff_candidate {
  ff_unit *units;
  int n_units;
  ff_cand_pipe *pipes;
  int n_pipes;
  int64_t micro_batch_size;
  char summary[256];
  double seconds; /* predicted iteration time; INFINITY when it does not fit */
} ff_candidate;

typedef struct ff_search_opts {
  ff_baseline baseline;
  int64_t milp_node_budget; /* branch-and-bound nodes per integer program */
  int local_moves;          /* candidate evaluations spent on local refinement */
  int keep;                 /* runner-ups reported */
  bool progress;            /* a progress line on stderr */
  bool partition;           /* METIS partitions of the device graph as node orders */
  bool ilp;                 /* the GLPK integer program on the best candidates */
} ff_search_opts;

/* What produced the plan: the layout and node order of its start, whether the integer program
 * was on the path to it (ff_plan_search's values), and the local moves taken after. */
typedef struct ff_search_origin {
  const char *layout, *node_order;
  ff_plan_ilp ilp;
  int local_moves;
} ff_search_origin;

typedef struct ff_search_result {
  ff_plan plan;            /* the best plan, with predictions and the search record */
  bool found;
  int64_t candidates;      /* plans scored with the full cost model */
  double lower_bound_seconds;
  int idle_gpus;
  ff_search_origin origin; /* its strings are the plan's; zero when nothing was found */
  char infeasible_why[1024]; /* when nothing fits */
} ff_search_result;

void ff_search_opts_default(ff_search_opts *o);
/* Plan: takes copies of the inputs. FF_ERR_INFEASIBLE with result->infeasible_why when nothing
 * fits; FF_ERR_RUNTIME on allocation failure. */
ff_status ff_search(const ff_cluster *cluster, const ff_model *model, const ff_training *training,
                    const ff_search_opts *opts, ff_search_result *result);
void ff_search_result_free(ff_search_result *r);

/* Building and scoring candidates. */
typedef struct ff_search_ctx ff_search_ctx;
ff_status ff_candidate_to_plan(const ff_search_ctx *ctx, const ff_candidate *c, ff_plan *out);
double ff_candidate_score(ff_search_ctx *ctx, ff_candidate *c);
ff_status ff_candidate_copy(const ff_candidate *src, ff_candidate *dst);
void ff_candidate_free(ff_candidate *c);

#endif
