/* milp.c — the planner's integer program (GLPK), over plain arrays (see milp.h).
 *
 * For class c (n_c pipelines of p stages; kinds q with counts n_q; recompute modes m):
 *
 *   y[k,q]    binary: position k is served by a unit of kind q;  Σ_q y[k,q] = 1,  Σ_k y[k,q] = n_q
 *   r[k,q,m]  binary: ... in recompute mode m;                   Σ_m r[k,q,m] = y[k,q]
 *   L[k,q,m]  integer layers, 0 ≤ L ≤ cap[k,q,m]·r[k,q,m]        (memory as a bound)
 *             Σ L = layers;  Σ_{q,m} L[k,q,m] ≥ 1 for a middle position
 *   t_k       = Σ_{q,m} τ[q,m]·L[k,q,m] + Σ_q e[k,q]·y[k,q]       (stage time per micro-batch)
 *   S[c]      ≥ t_k for every k;   Σ[c] = Σ_k t_k
 *   z[c,v]    integer: how many of the class's pipelines run v micro-batches, v in a window
 *             around the warm start; Σ_v z[c,v] = n_c,  Σ_c Σ_v v·z[c,v] = N
 *   w[c,v]    binary, z[c,v] ≤ n_c·w[c,v]
 *   T         ≥ (v−1)·S[c] + Σ[c] − M·(1 − w[c,v])                 (1F1B closed form of each used v)
 *   minimise T.
 *
 * Products of micro-batches and stage times stay linear because v is a constant in each row.
 * Size: Σ_c p·Q·(2·modes + 1) + 2·window integers: tens to a few hundred, no per-GPU variables
 * (units of one kind are interchangeable). The LP relaxation is solved first (GLPK's intopt needs
 * an optimal basis without presolve), the warm start is offered as the first incumbent, and the
 * branch and bound stops after a fixed number of nodes counted in the callback — never a
 * wall-clock limit, so the result is the same on every machine. */
#include "milp.h"

#include <glpk.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define WINDOW 4

typedef struct cols {
  int y, r, L, S, Sum, z, w; /* first column of each block (1-based) */
  int64_t v_lo, v_hi;
} cols;

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
  int total;
  glp_ios_tree_size(tree, NULL, NULL, &total);
  if (total > cb->budget)
    glp_ios_terminate(tree);
}

/* Index helpers: [k][q] and [k][q][m]. */
#define KQ(cl, k, q) ((k) * (cl)->n_kinds + (q))
#define KQM(cl, k, q, m) (((k) * (cl)->n_kinds + (q)) * (cl)->n_modes + (m))

typedef struct triplets {
  int *ia, *ja;
  double *ar;
  int n, cap;
} triplets;

static bool nz(triplets *t, int row, int col, double v) {
  if (t->n + 1 >= t->cap) {
    int cap = t->cap ? 2 * t->cap : 1024;
    int *ia = realloc(t->ia, (size_t)cap * sizeof *ia);
    if (!ia)
      return false;
    t->ia = ia;
    int *ja = realloc(t->ja, (size_t)cap * sizeof *ja);
    if (!ja)
      return false;
    t->ja = ja;
    double *ar = realloc(t->ar, (size_t)cap * sizeof *ar);
    if (!ar)
      return false;
    t->ar = ar;
    t->cap = cap;
  }
  t->n++;
  t->ia[t->n] = row, t->ja[t->n] = col, t->ar[t->n] = v;
  return true;
}

static int add_row(glp_prob *lp, int type, double lo, double hi) {
  int row = glp_add_rows(lp, 1);
  glp_set_row_bnds(lp, row, type, lo, hi);
  return row;
}

/* Columns of one class; false when a position can be served by no kind. */
static bool class_columns(glp_prob *lp, const ff_milp_class *cl, int64_t layers, cols *c) {
  int p = cl->n_stages, Q = cl->n_kinds, M = cl->n_modes;
  c->y = glp_add_cols(lp, p * Q);
  for (int i = 0; i < p * Q; i++)
    glp_set_col_kind(lp, c->y + i, GLP_BV);
  c->r = glp_add_cols(lp, p * Q * M);
  c->L = glp_add_cols(lp, p * Q * M);
  for (int k = 0; k < p; k++) {
    bool any = false;
    for (int q = 0; q < Q; q++)
      for (int m = 0; m < M; m++) {
        int i = KQM(cl, k, q, m);
        double ub = cl->cap[i] > (double)layers ? (double)layers : floor(cl->cap[i]);
        glp_set_col_kind(lp, c->r + i, GLP_BV);
        glp_set_col_kind(lp, c->L + i, GLP_IV);
        if (ub < 0) {
          glp_set_col_bnds(lp, c->r + i, GLP_FX, 0, 0);
          glp_set_col_bnds(lp, c->L + i, GLP_FX, 0, 0);
        } else {
          any = true;
          glp_set_col_bnds(lp, c->L + i, ub > 0 ? GLP_DB : GLP_FX, 0, ub);
        }
      }
    if (!any)
      return false;
  }
  c->S = glp_add_cols(lp, 2);
  c->Sum = c->S + 1;
  glp_set_col_bnds(lp, c->S, GLP_LO, 0, 0);
  glp_set_col_bnds(lp, c->Sum, GLP_LO, 0, 0);
  int64_t lo = cl->warm_micro_batches[0], hi = lo;
  for (int j = 1; j < cl->n_pipes; j++) {
    if (cl->warm_micro_batches[j] < lo)
      lo = cl->warm_micro_batches[j];
    if (cl->warm_micro_batches[j] > hi)
      hi = cl->warm_micro_batches[j];
  }
  c->v_lo = lo - WINDOW < 1 ? 1 : lo - WINDOW;
  c->v_hi = hi + WINDOW;
  int nv = (int)(c->v_hi - c->v_lo + 1);
  c->z = glp_add_cols(lp, nv);
  c->w = glp_add_cols(lp, nv);
  for (int v = 0; v < nv; v++) {
    glp_set_col_kind(lp, c->z + v, GLP_IV);
    glp_set_col_bnds(lp, c->z + v, GLP_DB, 0, cl->n_pipes);
    glp_set_col_kind(lp, c->w + v, GLP_BV);
  }
  return true;
}

/* Rows of one class (the micro-batch total's coefficients go to row_total). */
static bool class_rows(glp_prob *lp, triplets *t, const ff_milp_class *cl, const cols *c,
                       int64_t layers, int col_T, int row_total, double big) {
  int p = cl->n_stages, Q = cl->n_kinds, M = cl->n_modes;
  bool ok = true;
  int row = add_row(lp, GLP_FX, (double)layers, (double)layers); /* Σ L = layers */
  for (int i = 0; i < p * Q * M; i++)
    ok &= nz(t, row, c->L + i, 1.0);
  for (int k = 0; k < p; k++) {
    row = add_row(lp, GLP_FX, 1, 1); /* Σ_q y[k,q] = 1 */
    for (int q = 0; q < Q; q++)
      ok &= nz(t, row, c->y + KQ(cl, k, q), 1.0);
  }
  for (int q = 0; q < Q; q++) {
    row = add_row(lp, GLP_FX, cl->kind_count[q], cl->kind_count[q]); /* Σ_k y[k,q] = n_q */
    for (int k = 0; k < p; k++)
      ok &= nz(t, row, c->y + KQ(cl, k, q), 1.0);
  }
  for (int k = 0; k < p; k++)
    for (int q = 0; q < Q; q++) {
      row = add_row(lp, GLP_FX, 0, 0); /* Σ_m r = y */
      ok &= nz(t, row, c->y + KQ(cl, k, q), -1.0);
      for (int m = 0; m < M; m++) {
        int i = KQM(cl, k, q, m);
        ok &= nz(t, row, c->r + i, 1.0);
        double ub = cl->cap[i] > (double)layers ? (double)layers : floor(cl->cap[i]);
        if (ub > 0) { /* L ≤ ub·r */
          int r2 = add_row(lp, GLP_UP, 0, 0);
          ok &= nz(t, r2, c->L + i, 1.0) && nz(t, r2, c->r + i, -ub);
        }
      }
    }
  for (int k = 1; k + 1 < p; k++) { /* a middle stage holds a layer */
    row = add_row(lp, GLP_LO, 1, 0);
    for (int i = 0; i < Q * M; i++)
      ok &= nz(t, row, c->L + k * Q * M + i, 1.0);
  }
  int row_sum = add_row(lp, GLP_FX, 0, 0); /* Σ − Σ_k t_k = 0 */
  ok &= nz(t, row_sum, c->Sum, 1.0);
  for (int k = 0; k < p; k++) {
    row = add_row(lp, GLP_LO, 0, 0); /* S − t_k ≥ 0 */
    ok &= nz(t, row, c->S, 1.0);
    for (int q = 0; q < Q; q++) {
      double e = cl->fixed[KQ(cl, k, q)];
      if (e != 0)
        ok &= nz(t, row, c->y + KQ(cl, k, q), -e) && nz(t, row_sum, c->y + KQ(cl, k, q), -e);
      for (int m = 0; m < M; m++) {
        double tau = cl->tau[q * M + m];
        ok &= nz(t, row, c->L + KQM(cl, k, q, m), -tau) &&
              nz(t, row_sum, c->L + KQM(cl, k, q, m), -tau);
      }
    }
  }
  int nv = (int)(c->v_hi - c->v_lo + 1);
  row = add_row(lp, GLP_FX, cl->n_pipes, cl->n_pipes); /* Σ_v z = n_c */
  for (int v = 0; v < nv; v++) {
    ok &= nz(t, row, c->z + v, 1.0);
    ok &= nz(t, row_total, c->z + v, (double)(c->v_lo + v));
  }
  for (int v = 0; v < nv; v++) {
    row = add_row(lp, GLP_UP, 0, 0); /* z − n·w ≤ 0 */
    ok &= nz(t, row, c->z + v, 1.0) && nz(t, row, c->w + v, -(double)cl->n_pipes);
    row = add_row(lp, GLP_LO, -big, 0); /* T − (v−1)S − Σ − M·w ≥ −M */
    ok &= nz(t, row, col_T, 1.0) && nz(t, row, c->S, -(double)(c->v_lo + v - 1)) &&
          nz(t, row, c->Sum, -1.0) && nz(t, row, c->w + v, -big);
  }
  return ok;
}

/* Stage time per micro-batch, slowest stage and stage sum of an assignment. */
static void class_times(const ff_milp_class *cl, const int *kind, const int *mode,
                        const int64_t *layers, double *slowest, double *sum) {
  *slowest = 0, *sum = 0;
  for (int k = 0; k < cl->n_stages; k++) {
    double t = cl->tau[kind[k] * cl->n_modes + mode[k]] * (double)layers[k] +
               cl->fixed[KQ(cl, k, kind[k])];
    *sum += t;
    if (t > *slowest)
      *slowest = t;
  }
}

static void warm_class(const ff_milp_class *cl, const cols *c, double *warm, double *T) {
  for (int k = 0; k < cl->n_stages; k++) {
    int q = cl->warm_kind[k], m = cl->warm_mode[k];
    warm[c->y + KQ(cl, k, q)] = 1;
    warm[c->r + KQM(cl, k, q, m)] = 1;
    warm[c->L + KQM(cl, k, q, m)] = (double)cl->warm_layers[k];
  }
  double S, Sum;
  class_times(cl, cl->warm_kind, cl->warm_mode, cl->warm_layers, &S, &Sum);
  warm[c->S] = S;
  warm[c->Sum] = Sum;
  for (int j = 0; j < cl->n_pipes; j++) {
    int v = (int)(cl->warm_micro_batches[j] - c->v_lo);
    warm[c->z + v] += 1;
    warm[c->w + v] = 1;
    double tj = (double)(cl->warm_micro_batches[j] - 1) * S + Sum;
    if (tj > *T)
      *T = tj;
  }
}

static void read_class(glp_prob *lp, ff_milp_class *cl, const cols *c) {
  int Q = cl->n_kinds, M = cl->n_modes;
  for (int k = 0; k < cl->n_stages; k++) {
    int best_q = 0, best_m = 0;
    double best = -1;
    for (int q = 0; q < Q; q++)
      for (int m = 0; m < M; m++) {
        double v = glp_mip_col_val(lp, c->r + KQM(cl, k, q, m));
        if (v > best)
          best = v, best_q = q, best_m = m;
      }
    cl->kind[k] = best_q;
    cl->mode[k] = best_m;
    cl->layers[k] = llround(glp_mip_col_val(lp, c->L + KQM(cl, k, best_q, best_m)));
  }
  int j = 0, nv = (int)(c->v_hi - c->v_lo + 1);
  for (int v = nv - 1; v >= 0; v--) { /* larger micro-batch counts to earlier pipelines */
    int count = (int)llround(glp_mip_col_val(lp, c->z + v));
    for (int i = 0; i < count && j < cl->n_pipes; i++, j++)
      cl->micro_batches[j] = c->v_lo + v;
  }
  for (; j < cl->n_pipes; j++) /* unreachable for a feasible solution; keep the warm count */
    cl->micro_batches[j] = cl->warm_micro_batches[j];
}

/* Every coefficient the program would see is finite (caps may be negative: nothing fits). GLPK
 * aborts the process on a non-finite bound or coefficient, so such a class is refused here. */
static bool class_finite(const ff_milp_class *cl) {
  for (int i = 0; i < cl->n_kinds * cl->n_modes; i++)
    if (!isfinite(cl->tau[i]) || cl->tau[i] < 0)
      return false;
  for (int i = 0; i < cl->n_stages * cl->n_kinds * cl->n_modes; i++)
    if (isnan(cl->cap[i]))
      return false;
  for (int i = 0; i < cl->n_stages * cl->n_kinds; i++)
    if (!isfinite(cl->fixed[i]) || cl->fixed[i] < 0)
      return false;
  return true;
}

ff_status ff_milp_solve(ff_milp_problem *p) {
  for (int c = 0; c < p->n_classes; c++)
    if (!class_finite(&p->classes[c]))
      return FF_ERR_INFEASIBLE;
  ff_status st = FF_ERR_RUNTIME;
  cols *cs = calloc((size_t)p->n_classes + 1, sizeof *cs);
  triplets t = {0};
  double *warm = NULL;
  glp_prob *lp = glp_create_prob();
  if (!cs || !lp)
    goto done;
  glp_set_obj_dir(lp, GLP_MIN);
  int col_T = glp_add_cols(lp, 1);
  glp_set_col_bnds(lp, col_T, GLP_LO, 0, 0);
  glp_set_obj_coef(lp, col_T, 1.0);
  double big = 0;
  for (int c = 0; c < p->n_classes; c++) {
    const ff_milp_class *cl = &p->classes[c];
    if (!class_columns(lp, cl, p->layers, &cs[c])) {
      st = FF_ERR_INFEASIBLE;
      goto done;
    }
    double tau_max = 0, fixed_max = 0;
    for (int i = 0; i < cl->n_kinds * cl->n_modes; i++)
      tau_max = cl->tau[i] > tau_max ? cl->tau[i] : tau_max;
    for (int i = 0; i < cl->n_stages * cl->n_kinds; i++)
      fixed_max = cl->fixed[i] > fixed_max ? cl->fixed[i] : fixed_max;
    double bound = (double)(cs[c].v_hi + cl->n_stages) * ((double)p->layers * tau_max + fixed_max);
    if (bound > big)
      big = bound;
  }
  int row_total = add_row(lp, GLP_FX, (double)p->micro_batches, (double)p->micro_batches);
  for (int c = 0; c < p->n_classes; c++)
    if (!class_rows(lp, &t, &p->classes[c], &cs[c], p->layers, col_T, row_total, big))
      goto done;
  glp_load_matrix(lp, t.n, t.ia, t.ja, t.ar);
  int n_cols = glp_get_num_cols(lp);
  p->columns = n_cols;
  p->integer_columns = glp_get_num_int(lp);
  p->rows = glp_get_num_rows(lp);
  warm = calloc((size_t)n_cols + 1, sizeof *warm);
  if (!warm)
    goto done;
  double T0 = 0;
  for (int c = 0; c < p->n_classes; c++)
    warm_class(&p->classes[c], &cs[c], warm, &T0);
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
  cb_info cb = {p->node_budget, warm, false};
  iocp.cb_func = callback;
  iocp.cb_info = &cb;
  int rc = glp_intopt(lp, &iocp);
  int status = glp_mip_status(lp);
  if ((rc != 0 && rc != GLP_ESTOP) || (status != GLP_OPT && status != GLP_FEAS)) {
    st = FF_ERR_INFEASIBLE;
    goto done;
  }
  p->objective_seconds = 0;
  for (int c = 0; c < p->n_classes; c++) {
    ff_milp_class *cl = &p->classes[c];
    read_class(lp, cl, &cs[c]);
    double S, Sum;
    class_times(cl, cl->kind, cl->mode, cl->layers, &S, &Sum);
    for (int j = 0; j < cl->n_pipes; j++) {
      double tj = (double)(cl->micro_batches[j] - 1) * S + Sum;
      if (tj > p->objective_seconds)
        p->objective_seconds = tj;
    }
  }
  st = FF_OK;
done:
  if (lp)
    glp_delete_prob(lp);
  free(cs), free(warm), free(t.ia), free(t.ja), free(t.ar);
  return st;
}
