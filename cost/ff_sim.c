/* ff_sim.c — the pipeline simulator: 1F1B and GPipe by event simulation, and the closed forms.
 *
 * Each stage executes its operations in a fixed order (for 1F1B on stage i of p: min(p−i−1, m)
 * warm-up forwards, then alternating forward/backward, then the remaining backwards). An
 * operation starts when its stage is free and its input has arrived: the forward of micro-batch j
 * on stage i needs stage i−1's forward of j plus the boundary transfer; the backward needs stage
 * i+1's backward of j plus the transfer back. The operations of all stages are run in one fixed
 * global order that meets every dependency (see run_1f1b), so each is visited once: O(p·m), a
 * few instructions per operation. A finish time is read at most p + 1 rounds after it is written,
 * so each stage keeps its last W = min(m, p + 2) finish times in a ring: memory O(p·W), never
 * O(p·m) (a global batch of 10^9 sequences needs no more memory than one of 10^3). */
#include <stdlib.h>
#include <string.h>

#include "ff_cost.h"

int64_t ff_sim_in_flight(ff_schedule schedule, int p, int i, int64_t m) {
  if (schedule == FF_SCHEDULE_GPIPE)
    return m;
  int64_t n = p - i;
  return n < m ? n : m;
}

typedef struct sim {
  int p;
  int64_t m;
  const double *fwd, *bwd, *send_fwd, *send_bwd;
  int64_t w;             /* ring length: micro-batch j's finish times live in slot j mod w */
  double *fdone, *bdone; /* [stage][slot] finish times */
  double *free_at;
  int64_t *held, *peak;
} sim;

static size_t slot(const sim *s, int i, int64_t j) {
  return (size_t)i * (size_t)s->w + (size_t)(j % s->w);
}

static void run_forward(sim *s, int i, int64_t j) {
  double ready = i == 0 ? 0.0 : s->fdone[slot(s, i - 1, j)] + (s->send_fwd ? s->send_fwd[i - 1] : 0.0);
  double start = s->free_at[i] > ready ? s->free_at[i] : ready;
  s->free_at[i] = s->fdone[slot(s, i, j)] = start + s->fwd[i];
  if (++s->held[i] > s->peak[i])
    s->peak[i] = s->held[i];
}

static void run_backward(sim *s, int i, int64_t j) {
  double ready = i == s->p - 1 ? s->fdone[slot(s, i, j)]
                               : s->bdone[slot(s, i + 1, j)] + (s->send_bwd ? s->send_bwd[i] : 0.0);
  double start = s->free_at[i] > ready ? s->free_at[i] : ready;
  s->free_at[i] = s->bdone[slot(s, i, j)] = start + s->bwd[i];
  s->held[i]--;
}

/* Forwards stage i runs before its first backward (Megatron-LM's warm-up): min(p−i−1, m). With
 * this count, stage i−1 always has one more (or all m), which the order below relies on. */
static int64_t warmup(int p, int i, int64_t m) {
  int64_t w = p - i - 1;
  return w < m ? w : m;
}

/* 1F1B in an order that meets every dependency: warm-up forwards stage by stage; then rounds r
 * (stage i's r-th steady pair, forward of w_i + r then backward of r), each round from the last
 * stage to the first — a forward needs the previous stage's round r−1 (or its warm-up), a
 * backward the next stage's round r, done just before; then the cool-down backwards likewise. */
static void run_1f1b(sim *s) {
  int p = s->p;
  int64_t m = s->m, rounds = 0;
  for (int i = 0; i < p; i++) {
    int64_t w = warmup(p, i, m);
    for (int64_t j = 0; j < w; j++)
      run_forward(s, i, j);
    if (m - w > rounds)
      rounds = m - w;
  }
  for (int64_t r = 0; r < rounds; r++)
    for (int i = p - 1; i >= 0; i--) {
      int64_t w = warmup(p, i, m);
      if (r < m - w) {
        run_forward(s, i, w + r);
        run_backward(s, i, r);
      }
    }
  for (int64_t c = 0; c < p; c++)
    for (int i = p - 1; i >= 0; i--) {
      int64_t w = warmup(p, i, m);
      if (c < w)
        run_backward(s, i, m - w + c);
    }
}

/* GPipe: every stage runs all forwards, then all backwards, each in micro-batch order. Running
 * micro-batch j through all stages before j + 1 meets every dependency and gives each stage the
 * same operation order. The last stage's first backward starts after its last forward, so its
 * backwards never wait for a forward's finish time: the ring's slot may be reused. */
static void run_gpipe(sim *s) {
  for (int64_t j = 0; j < s->m; j++)
    for (int i = 0; i < s->p; i++)
      run_forward(s, i, j);
  for (int64_t j = 0; j < s->m; j++)
    for (int i = s->p - 1; i >= 0; i--)
      run_backward(s, i, j);
}

double ff_sim_pipeline(ff_schedule schedule, int p, int64_t m, const double *fwd,
                       const double *bwd, const double *send_fwd, const double *send_bwd,
                       double *finish, double *busy, int64_t *peak) {
  int64_t w = m < (int64_t)p + 2 ? m : (int64_t)p + 2;
  size_t cells = (size_t)p * (size_t)(w > 0 ? w : 1);
  double *times = malloc((2 * cells + (size_t)p) * sizeof *times);
  int64_t *counts = calloc(2 * (size_t)p, sizeof *counts);
  if (!times || !counts) {
    free(times), free(counts);
    return -1.0;
  }
  sim s = {.p = p, .m = m, .fwd = fwd, .bwd = bwd, .send_fwd = send_fwd, .send_bwd = send_bwd,
           .w = w > 0 ? w : 1, .fdone = times, .bdone = times + cells, .free_at = times + 2 * cells,
           .held = counts, .peak = counts + p};
  for (int i = 0; i < p; i++)
    s.free_at[i] = 0.0;
  if (schedule == FF_SCHEDULE_GPIPE)
    run_gpipe(&s);
  else
    run_1f1b(&s);
  double makespan = 0.0;
  for (int i = 0; i < p; i++) {
    if (finish)
      finish[i] = s.free_at[i];
    if (busy)
      busy[i] = (double)m * (fwd[i] + bwd[i]);
    if (peak)
      peak[i] = s.peak[i];
    if (s.free_at[i] > makespan)
      makespan = s.free_at[i];
  }
  free(times), free(counts);
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
