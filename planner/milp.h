/* milp.h — the GLPK integer program that refines a candidate's layers per stage and micro-batches
 * per pipeline together (the surrogate time linearised), bounded by a node budget. */
#ifndef FF_MILP_H
#define FF_MILP_H

#include "search.h"

/* Per-stage surrogate inputs (seconds per layer, fixed seconds, most layers that fit) of one
 * pipeline of a candidate, for its current recompute choices. */
ff_status ff_search_stage_costs(ff_search_ctx *ctx, const ff_candidate *c, int pipe, double *tau,
                                double *fixed, double *cap);
int64_t ff_search_model_layers(const ff_search_ctx *ctx);
/* Solve, warm-started from `from`; `out` is scored with the full cost model. FF_ERR_INFEASIBLE
 * when the program finds nothing better than the warm start or cannot be built. */
ff_status ff_milp_refine(ff_search_ctx *ctx, const ff_candidate *from, int64_t node_budget,
                         ff_candidate *out);

#endif
