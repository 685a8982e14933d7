/* milp.h — the GLPK integer program that decides, for classes of pipelines built alike, which
 * kind of unit serves which stage position, each stage's layers and recompute mode, and the
 * micro-batches of every pipeline, minimising the 1F1B closed form of the slowest pipeline under
 * memory. It knows nothing of clusters or plans: its inputs are plain arrays (docs/planner.md,
 * "The integer program"). */
#ifndef FF_MILP_H
#define FF_MILP_H

#include <stdbool.h>
#include <stdint.h>

#include "ff_status.h"

/* One class: n_pipes pipelines of n_stages stages that hold the same kinds of unit. A unit's
 * kind decides its seconds per layer; its position decides its memory (micro-batches in
 * flight, the embedding on the first stage, the LM head on the last). Arrays are row-major in
 * the order of the bracketed dimensions. */
typedef struct ff_milp_class {
  int n_pipes, n_stages, n_kinds, n_modes;
  const int *kind_count;    /* [kinds]: how many stages each kind serves (sums to n_stages) */
  const double *tau;        /* [kinds][modes]: seconds per layer and micro-batch */
  const double *cap;        /* [stages][kinds][modes]: most layers that fit; < 0: none fit */
  const double *fixed;      /* [stages][kinds]: embedding / LM-head seconds per micro-batch */
  /* The warm start (the candidate as it is), offered as the first incumbent. */
  const int *warm_kind, *warm_mode; /* [stages] */
  const int64_t *warm_layers;       /* [stages] */
  const int64_t *warm_micro_batches; /* [pipes] */
  /* The solution, written by ff_milp_solve. */
  int *kind, *mode;           /* [stages] */
  int64_t *layers;            /* [stages] */
  int64_t *micro_batches;     /* [pipes]: nonincreasing */
} ff_milp_class;

typedef struct ff_milp_problem {
  ff_milp_class *classes;
  int n_classes;
  int64_t layers;         /* per pipeline */
  int64_t micro_batches;  /* over all pipelines */
  int64_t node_budget;    /* branch-and-bound nodes (deterministic; no wall-clock limit) */
  /* Filled by ff_milp_solve: */
  double objective_seconds; /* the closed form of the solution */
  int columns, integer_columns, rows;
} ff_milp_problem;

/* Solve. FF_OK with every class's solution filled; FF_ERR_INFEASIBLE when the program has no
 * solution within the node budget (the warm start is infeasible in it, e.g. a stage that does
 * not fit); FF_ERR_RUNTIME on allocation failure. */
ff_status ff_milp_solve(ff_milp_problem *p);

#endif
