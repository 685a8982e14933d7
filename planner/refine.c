/* refine.c — refining a candidate: local moves and the GLPK integer program (milp.c) over the
 * classes of its pipelines (search_internal.h, docs/planner.md). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "milp.h"
#include "search_internal.h"

/* Above this many layers the integer program is not run: with layer counts in the thousands
 * GLPK's LP at a branch node can take minutes (10,000 layers on 32 GPUs did not finish in two),
 * and the local moves and exact layer split serve alone. */
#define ILP_MAX_LAYERS 1024
/* Nor above this many stage-kind-mode columns: the shipped and topology-suite clusters stay
 * under 2,000; the synthetic 1,024-GPU plans of 14 pipelines reach 15,000, where four programs
 * took 4.7 of 10 s of planning and gained nothing (docs/benchmarks.md, planning time). */
#define ILP_MAX_COLUMNS 8000

/* ---- local refinement ------------------------------------------------------------------- */

static bool try_move(ff_search_ctx *ctx, ff_candidate *best, ff_candidate *trial, int *budget) {
  if (*budget <= 0) {
    ff_candidate_free(trial);
    return false;
  }
  (*budget)--;
  double s = ff_candidate_score(ctx, trial);
  if (s < best->seconds * (1 - 1e-12)) {
    ff_candidate_free(best);
    *best = *trial;
    memset(trial, 0, sizeof *trial);
    return true;
  }
  ff_candidate_free(trial);
  return false;
}

static bool unit_in_use(const ff_candidate *c, int u) {
  for (int j = 0; j < c->n_pipes; j++)
    for (int k = 0; k < c->pipes[j].n_stages; k++)
      if (c->pipes[j].stages[k].unit == u)
        return true;
  return false;
}

/* A new stage of unit u before stage k of p (k = n_stages: after the last), holding one layer
 * taken from stage `donor` (an index before the insertion; -1: none) with its recompute. */
static ff_status insert_stage(ff_cand_pipe *p, int k, int u, int donor) {
  ff_cand_stage *st = malloc((size_t)(p->n_stages + 1) * sizeof *st);
  if (!st)
    return FF_ERR_RUNTIME;
  memcpy(st, p->stages, (size_t)k * sizeof *st);
  memcpy(st + k + 1, p->stages + k, (size_t)(p->n_stages - k) * sizeof *st);
  int from = donor < 0 ? (k < p->n_stages ? k + 1 : k - 1) : donor < k ? donor : donor + 1;
  st[k] = (ff_cand_stage){u, donor < 0 ? 0 : 1, st[from].recompute};
  if (donor >= 0)
    st[from].layers--;
  free(p->stages);
  p->stages = st;
  p->n_stages++;
  return FF_OK;
}

/* Move a layer between two stages of a pipeline (and of every pipeline built the same way),
 * lower a stage's recompute, swap the units of two stages, or move a micro-batch between
 * pipelines; the first
 * improvement is taken and the scan starts again. `best` changes on every improvement, so
 * nothing of it is held across a move. */
static int refine_locally(ff_search_ctx *ctx, ff_candidate *best, int budget) {
  int taken = -1;
restart:
  taken++;
  for (int j = 0; j < best->n_pipes && budget > 0; j++) {
    int n_stages = best->pipes[j].n_stages;
    for (int from = 0; from < n_stages && budget > 0; from++)
      for (int to = 0; to < n_stages && budget > 0; to++) {
        if (to == from)
          continue;
        int64_t lf = best->pipes[j].stages[from].layers, lt = best->pipes[j].stages[to].layers;
        if (lf <= 1)
          continue;
        ff_candidate trial;
        if (ff_candidate_copy(best, &trial) != FF_OK)
          return taken;
        for (int q = 0; q < trial.n_pipes; q++) {
          ff_cand_pipe *tp = &trial.pipes[q];
          if (tp->n_stages != n_stages || tp->stages[from].layers != lf ||
              tp->stages[to].layers != lt)
            continue;
          tp->stages[from].layers--;
          tp->stages[to].layers++;
        }
        if (try_move(ctx, best, &trial, &budget))
          goto restart;
      }
    for (int k = 0; k < n_stages && budget > 0; k++) {
      ff_recompute rc = best->pipes[j].stages[k].recompute;
      if (rc == FF_RECOMPUTE_NONE || ctx->training->recompute != FF_RECOMPUTE_AUTO)
        continue;
      ff_candidate trial;
      if (ff_candidate_copy(best, &trial) != FF_OK)
        return taken;
      trial.pipes[j].stages[k].recompute = (ff_recompute)(rc - 1);
      if (try_move(ctx, best, &trial, &budget))
        goto restart;
    }
  }
  /* Swap the units of two stages (Kernighan–Lin style): another device or node for each. */
  for (int j1 = 0; j1 < best->n_pipes && budget > 0; j1++)
    for (int k1 = 0; k1 < best->pipes[j1].n_stages && budget > 0; k1++)
      for (int j2 = j1; j2 < best->n_pipes && budget > 0; j2++)
        for (int k2 = j2 == j1 ? k1 + 1 : 0; k2 < best->pipes[j2].n_stages && budget > 0; k2++) {
          const ff_unit *u1 = &best->units[best->pipes[j1].stages[k1].unit];
          const ff_unit *u2 = &best->units[best->pipes[j2].stages[k2].unit];
          if (u1->device == u2->device && u1->tp == u2->tp && u1->node == u2->node)
            continue; /* the same kind of unit on the same node: nothing changes (units on
                       * two nodes of one group differ: they share other NICs) */
          ff_candidate trial;
          if (ff_candidate_copy(best, &trial) != FF_OK)
            return taken;
          int x = trial.pipes[j1].stages[k1].unit;
          trial.pipes[j1].stages[k1].unit = trial.pipes[j2].stages[k2].unit;
          trial.pipes[j2].stages[k2].unit = x;
          if (try_move(ctx, best, &trial, &budget))
            goto restart;
        }
  /* Give an idle unit a stage of its own at position k of a pipeline, with one layer from the
   * stage it displaces or its predecessor (whichever holds more; none at either end, where it
   * may hold only the embedding or the head): a boundary moves each element once
   * (cost-model.md §5.6), so a TP group the layouts left idle can pay at an end of a pipeline. */
  for (int u = 0; u < best->n_units && budget > 0; u++) {
    if (unit_in_use(best, u))
      continue;
    for (int j = 0; j < best->n_pipes && budget > 0; j++)
      for (int k = 0; k <= best->pipes[j].n_stages && budget > 0; k++)
        for (int moved = 0; moved <= 1 && budget > 0; moved++) {
          int n_stages = best->pipes[j].n_stages;
          const ff_cand_stage *st = best->pipes[j].stages;
          int donor = k == n_stages ? k - 1 : k; /* the displaced stage, or the last */
          if (k > 0 && k < n_stages && st[k - 1].layers > st[k].layers)
            donor = k - 1;
          bool at_end = k == 0 || k == n_stages;
          /* a donor keeps a layer, and so does the stage beside a new end stage: none stands
           * empty */
          if (moved ? st[donor].layers < 2 : !at_end || st[donor].layers < 1)
            continue;
          ff_candidate trial;
          if (ff_candidate_copy(best, &trial) != FF_OK)
            return taken;
          if (insert_stage(&trial.pipes[j], k, u, moved ? donor : -1) != FF_OK) {
            ff_candidate_free(&trial);
            return taken;
          }
          if (try_move(ctx, best, &trial, &budget))
            goto restart;
        }
  }
  for (int a = 0; a < best->n_pipes && budget > 0; a++)
    for (int b = 0; b < best->n_pipes && budget > 0; b++) {
      if (a == b || best->pipes[a].micro_batches <= 1)
        continue;
      ff_candidate trial;
      if (ff_candidate_copy(best, &trial) != FF_OK)
        return taken;
      trial.pipes[a].micro_batches--;
      trial.pipes[b].micro_batches++;
      if (try_move(ctx, best, &trial, &budget))
        goto restart;
      if (best->n_pipes > 8)
        break; /* on many pipelines, one partner per donor per round */
    }
  return taken;
}

/* ---- the integer program ---------------------------------------------------------------- */

/* Units of one kind for the integer program: the same unit, or units whose costs agree
 * (ff_unit_same_kind compares units at island boundaries only, so it is not reflexive on the
 * others). */
static bool ilp_same_kind(const ff_search_ctx *ctx, const ff_candidate *c, int a, int b) {
  return a == b || ff_unit_same_kind(ctx, &c->units[a], &c->units[b]);
}

/* Pipelines j and j2 are built alike: the same kind of unit at every position, the same layers
 * and recompute. Runs of such pipelines form one class of the program. */
static bool same_shape(const ff_search_ctx *ctx, const ff_candidate *c, int a, int b) {
  const ff_cand_pipe *x = &c->pipes[a], *y = &c->pipes[b];
  if (x->n_stages != y->n_stages)
    return false;
  for (int k = 0; k < x->n_stages; k++)
    if (!ilp_same_kind(ctx, c, x->stages[k].unit, y->stages[k].unit) ||
        x->stages[k].layers != y->stages[k].layers ||
        x->stages[k].recompute != y->stages[k].recompute)
      return false;
  return true;
}

/* Fill class `cl` (arrays allocated here, freed by the caller through `mem`) from the run of
 * pipelines starting at `first`. False on allocation failure. */
static bool ilp_class(ff_search_ctx *ctx, const ff_candidate *c, int first, int n_pipes, int lo,
                      int hi, ff_milp_class *cl, void **mem) {
  const ff_cand_pipe *cp = &c->pipes[first];
  int p = cp->n_stages, M = hi - lo + 1, Q = 0;
  int *rep = malloc((size_t)p * sizeof *rep), *kind_of = malloc((size_t)p * sizeof *kind_of);
  if (!rep || !kind_of) {
    free(rep), free(kind_of);
    return false;
  }
  for (int k = 0; k < p; k++) {
    int q = 0;
    while (q < Q && !ilp_same_kind(ctx, c, rep[q], cp->stages[k].unit))
      q++;
    if (q == Q)
      rep[Q++] = cp->stages[k].unit;
    kind_of[k] = q;
  }
  size_t doubles = (size_t)Q * M + 2 * (size_t)p * Q * M + (size_t)p * Q;
  size_t ints = (size_t)Q + 4 * (size_t)p;
  size_t i64s = 2 * (size_t)p + 2 * (size_t)n_pipes;
  char *block = calloc(1, doubles * sizeof(double) + i64s * sizeof(int64_t) + ints * sizeof(int));
  if (!block) {
    free(rep), free(kind_of);
    return false;
  }
  *mem = block;
  double *tau = (double *)block, *cap = tau + (size_t)Q * M, *fixed = cap + (size_t)p * Q * M;
  int64_t *warm_layers = (int64_t *)(block + doubles * sizeof(double));
  int64_t *layers = warm_layers + p, *warm_mb = layers + p, *mb = warm_mb + n_pipes;
  int *kind_count = (int *)(mb + n_pipes), *warm_kind = kind_count + Q, *warm_mode = warm_kind + p;
  int *kind = warm_mode + p, *mode = kind + p;
  int64_t m_est = cp->micro_batches;
  for (int q = 0; q < Q; q++) {
    ff_unit_cost uc = ff_unit_cost_of(ctx, &c->units[rep[q]], c->micro_batch_size, c->n_pipes);
    for (int k = 0; k < p; k++) {
      ff_stage_model sm = ff_stage_model_at(ctx, &uc, k, p, m_est);
      for (int m = 0; m < M; m++) {
        tau[q * M + m] = sm.tau[lo + m];
        cap[((size_t)k * Q + q) * M + m] = sm.cap[lo + m];
      }
      fixed[(size_t)k * Q + q] = sm.fixed_seconds;
    }
  }
  for (int k = 0; k < p; k++) {
    kind_count[kind_of[k]]++;
    warm_kind[k] = kind_of[k];
    warm_mode[k] = (int)cp->stages[k].recompute - lo;
    warm_layers[k] = cp->stages[k].layers;
  }
  for (int j = 0; j < n_pipes; j++)
    warm_mb[j] = c->pipes[first + j].micro_batches;
  *cl = (ff_milp_class){n_pipes, p, Q, M, kind_count, tau, cap, fixed, warm_kind, warm_mode,
                        warm_layers, warm_mb, kind, mode, layers, mb};
  free(rep), free(kind_of);
  return true;
}

/* Apply a class's solution to its pipelines: each position takes the pipeline's next unused unit
 * of the chosen kind, so units keep their order among their kind. */
static bool ilp_apply(const ff_search_ctx *ctx, ff_candidate *out, int first,
                      const ff_milp_class *cl, int lo) {
  int p = cl->n_stages;
  int *units = malloc((size_t)p * sizeof *units), *kind_of = malloc((size_t)p * sizeof *kind_of);
  int *ref = malloc((size_t)p * sizeof *ref); /* the first pipeline's units as they were */
  bool *used = malloc((size_t)p * sizeof *used);
  bool ok = units && kind_of && ref && used;
  for (int k = 0; ok && k < p; k++)
    ref[k] = out->pipes[first].stages[k].unit;
  for (int j = first; ok && j < first + cl->n_pipes; j++) {
    ff_cand_pipe *cp = &out->pipes[j];
    for (int k = 0; k < p; k++) {
      units[k] = cp->stages[k].unit, used[k] = false;
      /* a unit's kind is the warm kind of the first pipeline's stage of the same kind */
      kind_of[k] = -1;
      for (int s = 0; s < p && kind_of[k] < 0; s++)
        if (ilp_same_kind(ctx, out, units[k], ref[s]))
          kind_of[k] = cl->warm_kind[s];
    }
    for (int k = 0; k < p && ok; k++) {
      int pick = -1;
      for (int i = 0; i < p && pick < 0; i++)
        if (!used[i] && kind_of[i] == cl->kind[k])
          pick = i;
      if (pick < 0) {
        ok = false;
        break;
      }
      used[pick] = true;
      cp->stages[k].unit = units[pick];
      cp->stages[k].layers = cl->layers[k];
      cp->stages[k].recompute = (ff_recompute)(lo + cl->mode[k]);
    }
    cp->micro_batches = cl->micro_batches[j - first];
  }
  free(units), free(kind_of), free(ref), free(used);
  return ok;
}

/* Refine a candidate with the integer program; `out` is scored with the full cost model.
 * FF_ERR_INFEASIBLE when the program cannot be built or solved. */
static ff_status ilp_refine(ff_search_ctx *ctx, const ff_candidate *from, int64_t node_budget,
                            ff_candidate *out) {
  memset(out, 0, sizeof *out);
  out->seconds = INFINITY;
  if (ctx->model->layers > ILP_MAX_LAYERS)
    return FF_ERR_INFEASIBLE; /* see ILP_MAX_LAYERS */
  int lo = 0, hi = FF_SEARCH_MODES - 1;
  if (ctx->training->recompute != FF_RECOMPUTE_AUTO)
    lo = hi = (int)ctx->training->recompute;
  int D = from->n_pipes;
  ff_milp_class *classes = calloc((size_t)D, sizeof *classes);
  int *firsts = calloc((size_t)D, sizeof *firsts);
  void **mem = calloc((size_t)D, sizeof *mem);
  ff_status st = FF_ERR_RUNTIME;
  int n = 0;
  if (!classes || !firsts || !mem)
    goto done;
  int64_t N = 0;
  for (int j = 0; j < D; j++)
    N += from->pipes[j].micro_batches;
  for (int j = 0; j < D;) {
    int e = j + 1;
    while (e < D && same_shape(ctx, from, j, e))
      e++;
    firsts[n] = j;
    if (!ilp_class(ctx, from, j, e - j, lo, hi, &classes[n], &mem[n]))
      goto done;
    n++;
    j = e;
  }
  int64_t columns = 0; /* the program's size, bounded like its node count */
  for (int c = 0; c < n; c++)
    columns += (int64_t)classes[c].n_stages * classes[c].n_kinds * (2 * classes[c].n_modes + 1);
  if (columns > ILP_MAX_COLUMNS) {
    st = FF_ERR_INFEASIBLE;
    goto done;
  }
  ff_milp_problem prob = {classes, n, ctx->model->layers, N, node_budget, 0, 0, 0, 0};
  st = ff_milp_solve(&prob);
  if (st != FF_OK)
    goto done;
  st = ff_candidate_copy(from, out);
  for (int c = 0; st == FF_OK && c < n; c++)
    if (!ilp_apply(ctx, out, firsts[c], &classes[c], lo))
      st = FF_ERR_INFEASIBLE;
  if (st == FF_OK) {
    ff_candidate_score(ctx, out);
    st = isfinite(out->seconds) ? FF_OK : FF_ERR_INFEASIBLE;
  }
done:
  for (int c = 0; mem && c < n; c++)
    free(mem[c]);
  if (st != FF_OK)
    ff_candidate_free(out);
  free(classes), free(firsts), free(mem);
  return st;
}

/* ---- refinement ------------------------------------------------------------------------- */

/* Local moves on `c`; the result replaces `*best` when better. `c` is consumed. */
static void descend_and_keep(ff_search_ctx *ctx, ff_candidate *c, ff_candidate *best,
                             ff_search_origin *how) {
  /* a quarter of the budget: the program's solution starts near a local optimum already */
  int moves = refine_locally(ctx, c, ctx->opts.local_moves / 4);
  if (c->seconds < best->seconds * (1 - 1e-12)) {
    ff_candidate_free(best);
    *best = *c;
    memset(c, 0, sizeof *c);
    how->ilp = FF_PLAN_ILP_IMPROVED;
    how->local_moves = moves;
  }
  ff_candidate_free(c);
}

/* Refine one start: local moves from it; with the integer program on, the program from the start
 * and from where the local moves ended (when they moved), each followed by local moves. The best
 * path wins, so the program never makes a plan worse than the local moves alone. */
ff_status ff_refine_start(ff_search_ctx *ctx, const ff_candidate *start, ff_candidate *out,
                          ff_search_origin *how) {
  memset(how, 0, sizeof *how);
  how->ilp = ctx->opts.ilp ? FF_PLAN_ILP_NOT_RUN : FF_PLAN_ILP_OFF;
  if (ff_candidate_copy(start, out) != FF_OK)
    return FF_ERR_RUNTIME;
  int moves = refine_locally(ctx, out, ctx->opts.local_moves);
  how->local_moves = moves;
  if (!ctx->opts.ilp)
    return FF_OK;
  ff_candidate after_moves, c;
  if (ff_candidate_copy(out, &after_moves) != FF_OK)
    return FF_ERR_RUNTIME;
  const ff_candidate *froms[2] = {start, &after_moves};
  bool ran = false;
  for (int f = 0; f < (moves > 0 ? 2 : 1); f++) {
    if (ilp_refine(ctx, froms[f], ctx->opts.milp_node_budget, &c) == FF_OK) {
      ran = true;
      descend_and_keep(ctx, &c, out, how);
    }
  }
  if (ran && how->ilp == FF_PLAN_ILP_NOT_RUN)
    how->ilp = FF_PLAN_ILP_NO_GAIN;
  ff_candidate_free(&after_moves);
  return FF_OK;
}
