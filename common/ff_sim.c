/* ff_sim.c — the pipeline simulator: 1F1B and GPipe by event simulation, and the closed forms.
 *
 * Each stage executes its operations in a fixed order (for 1F1B on stage i of p: min(p−i−1, m)
 * warm-up forwards, then alternating forward/backward, then the remaining backwards). An
 * operation starts when its stage is free and its input has arrived: the forward of micro-batch j
 * on stage i needs stage i−1's forward of j plus the boundary transfer; the backward needs stage
 * i+1's backward of j plus the transfer back. A worklist of stages whose next operation may have
 * become ready visits every operation a constant number of times: O(p·m). */
#include <stdlib.h>
#include <string.h>

#include "ff_cost.h"

typedef struct op {
  bool backward;
  int64_t micro_batch;
} op;

/* The k-th operation (0 ≤ k < 2m) of stage i. */
static op stage_op(ff_schedule schedule, int p, int i, int64_t m, int64_t k) {
  if (schedule == FF_SCHEDULE_GPIPE)
    return k < m ? (op){false, k} : (op){true, k - m};
  int64_t warmup = ff_sim_in_flight(schedule, p, i, m) - 1;
  if (warmup > m)
    warmup = m;
  if (k < warmup)
    return (op){false, k};
  int64_t steady_end = 2 * m - warmup;
  if (k < steady_end) {
    int64_t t = k - warmup;
    return t % 2 == 0 ? (op){false, warmup + t / 2} : (op){true, t / 2};
  }
  return (op){true, m - warmup + (k - steady_end)};
}

int64_t ff_sim_in_flight(ff_schedule schedule, int p, int i, int64_t m) {
  if (schedule == FF_SCHEDULE_GPIPE)
    return m;
  int64_t n = p - i;
  return n < m ? n : m;
}

double ff_sim_pipeline(ff_schedule schedule, int p, int64_t m, const double *fwd,
                       const double *bwd, const double *send_fwd, const double *send_bwd,
                       double *finish, double *busy, int64_t *peak) {
  size_t cells = (size_t)p * (size_t)m;
  double *fdone = malloc(2 * cells * sizeof *fdone);
  int64_t *next = calloc((size_t)p, sizeof *next);
  int64_t *held = calloc((size_t)p, sizeof *held);
  double *free_at = calloc((size_t)p, sizeof *free_at);
  int *stack = malloc((size_t)p * sizeof *stack);
  bool *queued = calloc((size_t)p, sizeof *queued);
  if (!fdone || !next || !held || !free_at || !stack || !queued) {
    free(fdone), free(next), free(held), free(free_at), free(stack), free(queued);
    return -1.0;
  }
  double *bdone = fdone + cells;
  for (size_t c = 0; c < 2 * cells; c++)
    fdone[c] = -1.0;
  if (peak)
    memset(peak, 0, (size_t)p * sizeof *peak);
  int top = 0;
  for (int i = p - 1; i >= 0; i--) {
    stack[top++] = i;
    queued[i] = true;
  }
  while (top > 0) {
    int i = stack[--top];
    queued[i] = false;
    while (next[i] < 2 * m) {
      op o = stage_op(schedule, p, i, m, next[i]);
      size_t at = (size_t)i * (size_t)m + (size_t)o.micro_batch;
      double ready;
      if (!o.backward) {
        if (i == 0) {
          ready = 0.0;
        } else {
          double dep = fdone[at - (size_t)m];
          if (dep < 0)
            break;
          ready = dep + (send_fwd ? send_fwd[i - 1] : 0.0);
        }
      } else if (i == p - 1) {
        ready = fdone[at]; /* its own forward, done earlier in this stage's order */
      } else {
        double dep = bdone[at + (size_t)m];
        if (dep < 0)
          break;
        ready = dep + (send_bwd ? send_bwd[i] : 0.0);
      }
      double start = free_at[i] > ready ? free_at[i] : ready;
      double end = start + (o.backward ? bwd[i] : fwd[i]);
      free_at[i] = end;
      if (o.backward) {
        bdone[at] = end;
        held[i]--;
      } else {
        fdone[at] = end;
        held[i]++;
        if (peak && held[i] > peak[i])
          peak[i] = held[i];
      }
      next[i]++;
      /* Neighbours may have been waiting for this operation. */
      int neighbour = o.backward ? i - 1 : i + 1;
      if (neighbour >= 0 && neighbour < p && !queued[neighbour]) {
        stack[top++] = neighbour;
        queued[neighbour] = true;
      }
    }
  }
  double makespan = 0.0;
  for (int i = 0; i < p; i++) {
    if (finish)
      finish[i] = free_at[i];
    if (busy)
      busy[i] = (double)m * (fwd[i] + bwd[i]);
    if (free_at[i] > makespan)
      makespan = free_at[i];
  }
  free(fdone), free(next), free(held), free(free_at), free(stack), free(queued);
  return makespan;
}

double ff_sim_closed_form(int p, int64_t m, const double *fwd, const double *bwd) {
  double sum = 0.0, max = 0.0;
  for (int i = 0; i < p; i++) {
    double t = fwd[i] + bwd[i];
    sum += t;
    if (t > max)
      max = t;
  }
  return (double)(m - 1) * max + sum;
}

double ff_sim_gpipe_closed_form(int p, int64_t m, const double *fwd, const double *bwd) {
  double sum_f = 0.0, max_f = 0.0, sum_b = 0.0, max_b = 0.0;
  for (int i = 0; i < p; i++) {
    sum_f += fwd[i];
    sum_b += bwd[i];
    if (fwd[i] > max_f)
      max_f = fwd[i];
    if (bwd[i] > max_b)
      max_b = bwd[i];
  }
  return sum_f + (double)(m - 1) * max_f + sum_b + (double)(m - 1) * max_b;
}
