/* milp.c — refine a candidate with a mixed-integer program (GLPK).
 *
 * Pipelines built the same way (same stage count, same device type and TP degree per stage) form
 * a class that shares one layer split. For class c with n_c pipelines and stages k:
 *
 *   L[c,k]  integer layers, Σ_k L[c,k] = l, memory as the bound L[c,k] ≤ cap[c,k]
 *   S[c]    ≥ τ[c,k]·L[c,k] + e[c,k] for every k       (the slowest stage)
 *   Σ[c]    = Σ_k τ[c,k]·L[c,k] + e[c,k]                (all stages)
 *   z[c,v]  integer: how many of the class's pipelines run v micro-batches, v in a window
 *           around the warm start; Σ_v z[c,v] = n_c, Σ_c Σ_v v·z[c,v] = N
 *   w[c,v]  binary, z[c,v] ≤ n_c·w[c,v]
 *   T       ≥ (v−1)·S[c] + Σ[c] − BigM·(1 − w[c,v])     (1F1B closed form of each used v)
 *   minimise T.
 *
 * The product of micro-batches and stage time is linear because v is a constant in each
 * constraint. Size: Σ_c (stages + 2·window) integers — tens to hundreds, no per-GPU binaries.
 * The branch and bound stops after a fixed number of nodes (deterministic), and the warm start
 * is offered as the first incumbent. */
#include "milp.h"

#include <glpk.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define WINDOW 4

typedef struct milp_class {
  int first_pipe, n_pipes, n_stages;
  int64_t v_lo, v_hi;
  int col_L, col_S, col_Sum, col_z, col_w; /* first column of each block (1-based) */
} milp_class;

typedef struct cb_info {
  int64_t budget;
  const double *warm; /* column values, 1-based */
  bool offered;
} cb_info;

static void callback(glp_tree *tree, void *info) {
  cb_info *cb = info;
  if (glp_ios_reason(tree) == GLP_IHEUR && !cb->offered) {
    cb->offered = true;
    glp_ios_heur_sol(tree, cb->warm);
  }
  int active, total;
  glp_ios_tree_size(tree, &active, NULL, &total);
  if (total > cb->budget)
    glp_ios_terminate(tree);
}

static bool same_shape(const ff_candidate *c, int a, int b) {
  const ff_cand_pipe *x = &c->pipes[a], *y = &c->pipes[b];
  if (x->n_stages != y->n_stages)
    return false;
  for (int k = 0; k < x->n_stages; k++) {
    const ff_unit *u = &c->units[x->stages[k].unit], *v = &c->units[y->stages[k].unit];
    if (u->device != v->device || u->tp != v->tp || x->stages[k].layers != y->stages[k].layers ||
        x->stages[k].recompute != y->stages[k].recompute)
      return false;
  }
  return true;
}

/* Pipelines must be grouped in runs; the candidate's own order is kept. Classes are runs of
 * consecutive pipelines of the same shape, so the result maps back without reordering. */
static int make_classes(const ff_candidate *c, milp_class *cls) {
  int n = 0;
  for (int j = 0; j < c->n_pipes;) {
    int e = j + 1;
    while (e < c->n_pipes && same_shape(c, j, e))
      e++;
    cls[n] = (milp_class){0};
    cls[n].first_pipe = j;
    cls[n].n_pipes = e - j;
    cls[n].n_stages = c->pipes[j].n_stages;
    int64_t lo = c->pipes[j].micro_batches, hi = lo;
    for (int q = j; q < e; q++) {
      if (c->pipes[q].micro_batches < lo)
        lo = c->pipes[q].micro_batches;
      if (c->pipes[q].micro_batches > hi)
        hi = c->pipes[q].micro_batches;
    }
    cls[n].v_lo = lo - WINDOW < 1 ? 1 : lo - WINDOW;
    cls[n].v_hi = hi + WINDOW;
    n++;
    j = e;
  }
  return n;
}

ff_status ff_milp_refine(ff_search_ctx *ctx, const ff_candidate *from, int64_t node_budget,
                         ff_candidate *out) {
  ff_status st = FF_ERR_RUNTIME;
  int D = from->n_pipes;
  milp_class *cls = calloc((size_t)D, sizeof *cls);
  int n_cls = cls ? make_classes(from, cls) : 0;
  int p_max = 0;
  for (int j = 0; j < D; j++)
    if (from->pipes[j].n_stages > p_max)
      p_max = from->pipes[j].n_stages;
  double *tau = malloc((size_t)n_cls * (size_t)p_max * sizeof *tau);
  double *fixed = malloc((size_t)n_cls * (size_t)p_max * sizeof *fixed);
  double *cap = malloc((size_t)n_cls * (size_t)p_max * sizeof *cap);
  glp_prob *lp = NULL;
  double *warm = NULL;
  int *ia = NULL, *ja = NULL;
  double *ar = NULL;
  memset(out, 0, sizeof *out);
  out->seconds = INFINITY;
  if (!cls || !tau || !fixed || !cap)
    goto done;
  const int64_t layers = ff_search_model_layers(ctx);
  int64_t N = 0;
  for (int j = 0; j < D; j++)
    N += from->pipes[j].micro_batches;
  double big = 0;
  for (int c = 0; c < n_cls; c++) {
    double *t = tau + (size_t)c * p_max, *f = fixed + (size_t)c * p_max, *cp = cap + (size_t)c * p_max;
    if (ff_search_stage_costs(ctx, from, cls[c].first_pipe, t, f, cp) != FF_OK)
      goto done;
    double tmax = 0, fsum = 0;
    for (int k = 0; k < cls[c].n_stages; k++) {
      if (t[k] > tmax)
        tmax = t[k];
      fsum += f[k];
    }
    double bound = (double)(cls[c].v_hi) * ((double)layers * tmax + fsum) + (double)layers * tmax + fsum;
    if (bound > big)
      big = bound;
  }
  /* Columns. */
  lp = glp_create_prob();
  glp_set_obj_dir(lp, GLP_MIN);
  int col = 1;
  int col_T = col++;
  glp_add_cols(lp, 1);
  glp_set_col_bnds(lp, col_T, GLP_LO, 0, 0);
  glp_set_obj_coef(lp, col_T, 1.0);
  for (int c = 0; c < n_cls; c++) {
    milp_class *k = &cls[c];
    int nv = (int)(k->v_hi - k->v_lo + 1);
    int add = k->n_stages + 2 + 2 * nv;
    glp_add_cols(lp, add);
    k->col_L = col;
    for (int s = 0; s < k->n_stages; s++) {
      bool end = s == 0 || s == k->n_stages - 1;
      double ub = cap[(size_t)c * p_max + s];
      if (ub > (double)layers)
        ub = (double)layers;
      double lb = end ? 0 : 1;
      if (ub < lb)
        goto done; /* the warm start itself would not fit; nothing to refine */
      glp_set_col_kind(lp, col, GLP_IV);
      glp_set_col_bnds(lp, col, ub > lb ? GLP_DB : GLP_FX, lb, ub);
      col++;
    }
    k->col_S = col++;
    glp_set_col_bnds(lp, k->col_S, GLP_LO, 0, 0);
    k->col_Sum = col++;
    glp_set_col_bnds(lp, k->col_Sum, GLP_LO, 0, 0);
    k->col_z = col;
    for (int v = 0; v < nv; v++, col++) {
      glp_set_col_kind(lp, col, GLP_IV);
      glp_set_col_bnds(lp, col, GLP_DB, 0, k->n_pipes);
    }
    k->col_w = col;
    for (int v = 0; v < nv; v++, col++)
      glp_set_col_kind(lp, col, GLP_BV);
  }
  int n_cols = col - 1;
  /* Rows, as triplets. */
  size_t cap_nz = 16;
  for (int c = 0; c < n_cls; c++)
    cap_nz += (size_t)cls[c].n_stages * 6 + (size_t)(cls[c].v_hi - cls[c].v_lo + 1) * 8 + 8;
  ia = malloc(cap_nz * sizeof *ia);
  ja = malloc(cap_nz * sizeof *ja);
  ar = malloc(cap_nz * sizeof *ar);
  if (!ia || !ja || !ar)
    goto done;
  int nz = 0, row = 0;
#define NZ(r, c_, v_) (++nz, ia[nz] = (r), ja[nz] = (c_), ar[nz] = (v_))
  int row_total = ++row;
  glp_add_rows(lp, 1);
  glp_set_row_bnds(lp, row_total, GLP_FX, (double)N, (double)N);
  for (int c = 0; c < n_cls; c++) {
    milp_class *k = &cls[c];
    int nv = (int)(k->v_hi - k->v_lo + 1);
    const double *t = tau + (size_t)c * p_max, *f = fixed + (size_t)c * p_max;
    glp_add_rows(lp, 1); /* Σ L = layers */
    ++row;
    glp_set_row_bnds(lp, row, GLP_FX, (double)layers, (double)layers);
    for (int s = 0; s < k->n_stages; s++)
      NZ(row, k->col_L + s, 1.0);
    double fsum = 0;
    for (int s = 0; s < k->n_stages; s++) { /* S − τL ≥ e */
      glp_add_rows(lp, 1);
      ++row;
      glp_set_row_bnds(lp, row, GLP_LO, f[s], 0);
      NZ(row, k->col_S, 1.0);
      NZ(row, k->col_L + s, -t[s]);
      fsum += f[s];
    }
    glp_add_rows(lp, 1); /* Σ − Σ τL = Σ e */
    ++row;
    glp_set_row_bnds(lp, row, GLP_FX, fsum, fsum);
    NZ(row, k->col_Sum, 1.0);
    for (int s = 0; s < k->n_stages; s++)
      NZ(row, k->col_L + s, -t[s]);
    glp_add_rows(lp, 1); /* Σ z = n */
    ++row;
    glp_set_row_bnds(lp, row, GLP_FX, k->n_pipes, k->n_pipes);
    for (int v = 0; v < nv; v++) {
      NZ(row, k->col_z + v, 1.0);
      NZ(row_total, k->col_z + v, (double)(k->v_lo + v));
    }
    for (int v = 0; v < nv; v++) {
      glp_add_rows(lp, 1); /* z − n·w ≤ 0 */
      ++row;
      glp_set_row_bnds(lp, row, GLP_UP, 0, 0);
      NZ(row, k->col_z + v, 1.0);
      NZ(row, k->col_w + v, -(double)k->n_pipes);
      glp_add_rows(lp, 1); /* T − (v−1)S − Σ − BigM·w ≥ −BigM */
      ++row;
      glp_set_row_bnds(lp, row, GLP_LO, -big, 0);
      NZ(row, col_T, 1.0);
      NZ(row, k->col_S, -(double)(k->v_lo + v - 1));
      NZ(row, k->col_Sum, -1.0);
      NZ(row, k->col_w + v, -big);
    }
  }
#undef NZ
  glp_load_matrix(lp, nz, ia, ja, ar);
  /* The warm start: the candidate as it is. */
  warm = calloc((size_t)n_cols + 1, sizeof *warm);
  if (!warm)
    goto done;
  double T0 = 0;
  for (int c = 0; c < n_cls; c++) {
    milp_class *k = &cls[c];
    const double *t = tau + (size_t)c * p_max, *f = fixed + (size_t)c * p_max;
    const ff_cand_pipe *cp = &from->pipes[k->first_pipe];
    double S = 0, sum = 0;
    for (int s = 0; s < k->n_stages; s++) {
      warm[k->col_L + s] = (double)cp->stages[s].layers;
      double ts = t[s] * (double)cp->stages[s].layers + f[s];
      sum += ts;
      if (ts > S)
        S = ts;
    }
    warm[k->col_S] = S;
    warm[k->col_Sum] = sum;
    for (int q = k->first_pipe; q < k->first_pipe + k->n_pipes; q++) {
      int v = (int)(from->pipes[q].micro_batches - k->v_lo);
      warm[k->col_z + v] += 1;
      warm[k->col_w + v] = 1;
      double tq = (double)(from->pipes[q].micro_batches - 1) * S + sum;
      if (tq > T0)
        T0 = tq;
    }
  }
  warm[col_T] = T0;

  glp_smcp smcp;
  glp_init_smcp(&smcp);
  smcp.msg_lev = GLP_MSG_OFF;
  if (glp_simplex(lp, &smcp) != 0 || glp_get_status(lp) != GLP_OPT) {
    st = FF_ERR_INFEASIBLE;
    goto done;
  }
  glp_iocp iocp;
  glp_init_iocp(&iocp);
  iocp.msg_lev = GLP_MSG_OFF;
  iocp.br_tech = GLP_BR_MFV; /* the default Driebeck-Tomlin test costs a tableau row per variable */
  cb_info cb = {node_budget, warm, false};
  iocp.cb_func = callback;
  iocp.cb_info = &cb;
  int rc = glp_intopt(lp, &iocp);
  int status = glp_mip_status(lp);
  if ((rc != 0 && rc != GLP_ESTOP) || (status != GLP_OPT && status != GLP_FEAS)) {
    st = FF_ERR_INFEASIBLE;
    goto done;
  }
  if (ff_candidate_copy(from, out) != FF_OK)
    goto done;
  for (int c = 0; c < n_cls; c++) {
    milp_class *k = &cls[c];
    int nv = (int)(k->v_hi - k->v_lo + 1);
    int q = k->first_pipe;
    for (int v = nv - 1; v >= 0; v--) { /* larger micro-batch counts to earlier pipelines */
      int count = (int)llround(glp_mip_col_val(lp, k->col_z + v));
      for (int i = 0; i < count && q < k->first_pipe + k->n_pipes; i++, q++)
        out->pipes[q].micro_batches = k->v_lo + v;
    }
    for (q = k->first_pipe; q < k->first_pipe + k->n_pipes; q++)
      for (int s = 0; s < k->n_stages; s++)
        out->pipes[q].stages[s].layers = llround(glp_mip_col_val(lp, k->col_L + s));
  }
  ff_candidate_score(ctx, out);
  st = isfinite(out->seconds) ? FF_OK : FF_ERR_INFEASIBLE;
done:
  if (st != FF_OK)
    ff_candidate_free(out);
  if (lp)
    glp_delete_prob(lp);
  free(cls), free(tau), free(fixed), free(cap), free(warm), free(ia), free(ja), free(ar);
  return st;
}
