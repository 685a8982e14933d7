/* ff_sim.c — the pipeline simulator: 1F1B and GPipe with the executor's blocking stage
 * exchanges, and the closed forms.
 *
 * Each stage runs a fixed program, the one ffrun's run_schedule runs (executor/dist.c): its
 * forwards and backwards in 1F1B order (min(p−i−1, m) warm-up forwards on stage i, then one
 * forward and one backward at a time, then the remaining backwards) or GPipe order (all
 * forwards, then all backwards), and between two of them an exchange: one batch of sends and
 * receives with a neighbouring stage, as Megatron-LM pairs them (after a steady-state forward its
 * output leaves while the gradient the next backward needs arrives; after that backward its input
 * gradient leaves while the next forward's input arrives). An exchange holds its stage until every
 * transfer in it is done, and a transfer starts when both its sender and its receiver have
 * reached it: start = max(both posts), end = start + its time. So a slow link holds both of its
 * stages, and a stage that reaches a send early waits for its neighbour.
 *
 * Stages advance from a worklist: a stage runs until an exchange whose partner has not posted
 * yet, and is queued again when that partner posts (only then: a partner that has not reached
 * the transfer finds the post when it does). Each operation is done once and each visit
 * either does one or stops: O(p·m) time. A stage cannot post the next transfer of a direction
 * before the previous one completed, so four slots per boundary and direction hold every post
 * still needed: memory O(p), whatever m. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ff_cost.h"

int64_t ff_sim_in_flight(ff_schedule schedule, int p, int i, int64_t m) {
  if (schedule == FF_SCHEDULE_GPIPE)
    return m;
  int64_t n = p - i;
  return n < m ? n : m;
}

enum { FWD = 0, BWD = 1, SENDER = 0, RECEIVER = 1, SLOTS = 4 };

/* One transfer of an exchange, seen from one stage: micro-batch j crosses boundary k (between
 * stages k and k + 1) in direction dir; this stage is its sender or receiver. */
typedef struct xfer {
  int32_t k;
  int16_t dir, side;
  int64_t j;
} xfer;

/* The next thing a stage does: a forward or backward of micro-batch j, or an exchange. */
typedef struct item {
  enum { COMPUTE_FWD, COMPUTE_BWD, EXCHANGE } kind;
  int n;
  int64_t j;
  xfer x[2];
} item;

/* Where a stage is in its program: phase 0 warm-up, 1 the first steady input, 2 steady state,
 * 3 cool-down, 4 done; n counts the phase's rounds, sub the step within a round. */
typedef struct cursor {
  int phase, sub;
  int64_t n, w; /* w: the stage's warm-up forwards */
} cursor;

/* When each side posted a transfer (one slot of a boundary and direction). */
typedef struct post {
  int64_t j;
  double at[2];
  bool has[2];
} post;

typedef struct sim {
  ff_schedule schedule;
  ff_transfers transfers;
  int p;
  int64_t m;
  const double *fwd, *bwd, *send_fwd, *send_bwd;
  ff_sim_observer observe;
  void *ctx;
  post *posts; /* [boundary][dir][slot] */
  cursor *cur;
  item *it;
  bool *has_item, *posted, *queued;
  int *stack, top;
  int64_t barrier; /* stages stop before starting steady round `barrier` (INT64_MAX: never) */
  double *free_at;
  int64_t *held, *peak, *done;
  /* overlapped transfers: when micro-batch j left across boundary k in direction dir
   * (sent[(k·2 + dir)·m + j], NaN until then), when the receive of j was posted
   * (posted_at[(i·2 + dir)·2 + j mod 2] on the receiving stage i: its two buffers), and when the
   * link of boundary k and direction dir is free again */
  double *sent, *posted_at, *link_free;
} sim;

static int64_t warmup(const sim *s, int i) {
  int64_t w = s->schedule == FF_SCHEDULE_GPIPE ? s->m : s->p - i - 1;
  return w < s->m ? w : s->m;
}

static inline void add(item *it, bool when, int k, int dir, int side, int64_t j) {
  if (when)
    it->x[it->n++] = (xfer){k, (int16_t)dir, (int16_t)side, j};
}

static inline void compute(item *it, int kind, int64_t j) {
  it->kind = kind, it->j = j, it->n = 0;
}

enum { ITEM, DONE, BARRIER };

/* Produce stage i's next item, skipping exchanges with nothing in them: ITEM; DONE at the end of
 * its program; BARRIER at the start of steady round s->barrier. */
static int next_item(const sim *s, int i, cursor *c, item *it) {
  int64_t m = s->m, w = c->w;
  bool prev = i > 0, next = i < s->p - 1;
  for (;;) {
    it->kind = EXCHANGE, it->n = 0;
    switch (c->phase) {
    case 0: /* warm-up forward n: receive its input, run it, send its output */
      if (c->n >= w) {
        c->phase = 1;
        continue;
      }
      if (c->sub == 0) {
        add(it, prev, i - 1, FWD, RECEIVER, c->n);
        c->sub = 1;
      } else if (c->sub == 1) {
        compute(it, COMPUTE_FWD, c->n);
        c->sub = 2;
      } else {
        add(it, next, i, FWD, SENDER, c->n);
        c->sub = 0, c->n++;
      }
      break;
    case 1: /* the first steady forward's input */
      add(it, prev && m > w, i - 1, FWD, RECEIVER, w);
      c->phase = 2, c->n = 0, c->sub = 0;
      break;
    case 2: /* round n: forward w + n, exchange, backward n, exchange */
      if (c->n >= m - w) {
        c->phase = 3, c->n = m - w, c->sub = 0;
        continue;
      }
      if (c->sub == 0 && c->n >= s->barrier)
        return BARRIER;
      if (c->sub == 0) {
        compute(it, COMPUTE_FWD, w + c->n);
      } else if (c->sub == 1) {
        add(it, next, i, FWD, SENDER, w + c->n);
        add(it, next, i, BWD, RECEIVER, c->n);
      } else if (c->sub == 2) {
        compute(it, COMPUTE_BWD, c->n);
      } else {
        add(it, prev, i - 1, BWD, SENDER, c->n);
        add(it, prev && c->n + 1 < m - w, i - 1, FWD, RECEIVER, w + c->n + 1);
      }
      if (++c->sub == 4)
        c->sub = 0, c->n++;
      break;
    case 3: /* cool-down backward n: receive its gradient, run it, send the input's gradient */
      if (c->n >= m) {
        c->phase = 4;
        continue;
      }
      if (c->sub == 0) {
        add(it, next, i, BWD, RECEIVER, c->n);
        c->sub = 1;
      } else if (c->sub == 1) {
        compute(it, COMPUTE_BWD, c->n);
        c->sub = 2;
      } else {
        add(it, prev, i - 1, BWD, SENDER, c->n);
        c->sub = 0, c->n++;
      }
      break;
    default:
      return DONE;
    }
    if (it->kind != EXCHANGE || it->n > 0)
      return ITEM;
  }
}

static post *slot_of(sim *s, const xfer *x) {
  post *q = &s->posts[((size_t)x->k * 2 + (size_t)x->dir) * SLOTS + (size_t)(x->j % SLOTS)];
  if (q->j != x->j)
    *q = (post){.j = x->j};
  return q;
}

static void push(sim *s, int i) {
  if (!s->queued[i]) {
    s->queued[i] = true;
    s->stack[s->top++] = i;
  }
}

/* An exchange with overlapped transfers: what stage i sends leaves now without holding it;
 * what it receives was posted when its buffer last came free, travels once both ends are ready
 * and the link is free, and holds the stage until it has arrived. False while something to
 * receive has not been sent yet. */
static bool exchange_overlapped(sim *s, int i, const item *it) {
  for (int t = 0; t < it->n; t++) {
    const xfer *x = &it->x[t];
    if (x->side != SENDER)
      continue;
    double *at = &s->sent[((size_t)x->k * 2 + (size_t)x->dir) * (size_t)s->m + (size_t)x->j];
    if (isnan(*at)) {
      *at = s->free_at[i];
      push(s, x->dir == FWD ? x->k + 1 : x->k); /* the receiver may be waiting for it */
    }
  }
  double end = s->free_at[i];
  for (int t = 0; t < it->n; t++) {
    const xfer *x = &it->x[t];
    if (x->side != RECEIVER)
      continue;
    size_t ch = (size_t)x->k * 2 + (size_t)x->dir;
    double sent = s->sent[ch * (size_t)s->m + (size_t)x->j];
    if (isnan(sent))
      return false;
    double posted = s->posted_at[((size_t)i * 2 + (size_t)x->dir) * 2 + (size_t)(x->j % 2)];
    double start = sent > posted ? sent : posted;
    if (s->link_free[ch] > start)
      start = s->link_free[ch];
    const double *cost = x->dir == FWD ? s->send_fwd : s->send_bwd;
    double arrive = start + (cost ? cost[x->k] : 0.0);
    s->link_free[ch] = arrive;
    if (arrive > end)
      end = arrive;
  }
  s->free_at[i] = end;
  return true;
}

/* Run stage i until it is done or waits on an exchange its partner has not reached. */
static void advance(sim *s, int i) {
  item *it = &s->it[i];
  for (;;) {
    if (!s->has_item[i]) {
      if (next_item(s, i, &s->cur[i], it) != ITEM)
        return;
      s->has_item[i] = true, s->posted[i] = false;
    }
    if (it->kind != EXCHANGE) {
      bool bwd = it->kind == COMPUTE_BWD;
      double start = s->free_at[i];
      s->free_at[i] += bwd ? s->bwd[i] : s->fwd[i];
      if (bwd)
        s->held[i]--, s->done[i]++;
      else if (++s->held[i] > s->peak[i])
        s->peak[i] = s->held[i];
      if (s->observe)
        s->observe(s->ctx, i, it->j, bwd, start, s->free_at[i]);
      if (s->transfers == FF_TRANSFERS_OVERLAPPED && (bwd ? i < s->p - 1 : i > 0))
        /* the op has used its received buffer: the receive two micro-batches on is posted */
        s->posted_at[((size_t)i * 2 + bwd) * 2 + (size_t)(it->j % 2)] = s->free_at[i];
      s->has_item[i] = false;
      continue;
    }
    if (s->transfers == FF_TRANSFERS_OVERLAPPED) {
      if (!exchange_overlapped(s, i, it))
        return; /* queued again when the sender has sent */
      s->has_item[i] = false;
      continue;
    }
    if (!s->posted[i]) {
      for (int t = 0; t < it->n; t++) {
        post *q = slot_of(s, &it->x[t]);
        q->at[it->x[t].side] = s->free_at[i], q->has[it->x[t].side] = true;
        if (q->has[1 - it->x[t].side]) /* the other end of boundary k waits for this post */
          push(s, it->x[t].k + (i == it->x[t].k ? 1 : 0));
      }
      s->posted[i] = true;
    }
    double end = s->free_at[i];
    for (int t = 0; t < it->n; t++) {
      const xfer *x = &it->x[t];
      post *q = slot_of(s, x);
      if (!q->has[1 - x->side])
        return; /* queued again when the partner posts */
      const double *cost = x->dir == FWD ? s->send_fwd : s->send_bwd;
      double start = q->at[0] > q->at[1] ? q->at[0] : q->at[1];
      double t_end = start + (cost ? cost[x->k] : 0.0);
      if (t_end > end)
        end = t_end;
    }
    s->free_at[i] = end;
    s->has_item[i] = false;
  }
}

static void run(sim *s) {
  for (int i = s->p - 1; i >= 0; i--)
    push(s, i);
  while (s->top > 0) {
    int i = s->stack[--s->top];
    s->queued[i] = false;
    advance(s, i);
  }
}

/* 1F1B's steady rounds repeat: stage i's round r (forward w_i + r, exchange, backward r,
 * exchange) pairs its exchanges with round r of stages i − 1 and i + 1, so when every stage
 * stands at the start of round r, every earlier exchange is done and no later one has begun: the
 * stages' free times are the whole state. Times are max-plus in the previous ones, so when that
 * state is the previous round's shifted by one Δ on every stage, every later round shifts by Δ
 * too, up to the last rounds (whose exchanges differ). Run round by round to such a pair, then
 * move every stage K rounds ahead at once. False when out of memory. */
static bool skip_steady_rounds(sim *s) {
  int p = s->p;
  int64_t rounds = s->m - s->cur[0].w; /* stage 0 has the most warm-up, the fewest rounds */
  if (rounds < 8)
    return true;
  double *before = malloc(2 * (size_t)p * sizeof *before), *now = before + p;
  if (!before)
    return false;
  for (int64_t b = 1; b + 2 < rounds; b++) {
    s->barrier = b;
    run(s);
    for (int i = 0; i < p; i++) {
      const cursor *c = &s->cur[i];
      if (s->has_item[i] || c->phase != 2 || c->sub != 0 || c->n != b) {
        free(before); /* not a clean cut (never expected): simulate every round */
        s->barrier = INT64_MAX;
        return true;
      }
      now[i] = s->free_at[i];
    }
    bool shifted = b >= 2;
    double delta = now[0] - before[0];
    for (int i = 0; shifted && i < p; i++) {
      double d = now[i] - before[i];
      shifted = delta > 0 && fabs(d - delta) <= 1e-12 * now[i];
    }
    if (shifted) {
      int64_t k = rounds - 2 - b;
      for (int i = 0; i < p; i++) {
        s->free_at[i] += (double)k * delta;
        s->cur[i].n += k;
        s->done[i] += k;
      }
      break;
    }
    memcpy(before, now, (size_t)p * sizeof *before);
  }
  free(before);
  s->barrier = INT64_MAX;
  return true;
}

double ff_sim_pipeline_observed(ff_schedule schedule, ff_transfers transfers, int p, int64_t m,
                                const double *fwd, const double *bwd, const double *send_fwd,
                                const double *send_bwd, double *finish, double *busy,
                                int64_t *peak, ff_sim_observer observe, void *ctx) {
  size_t n = (size_t)p, boundaries = n > 1 ? n - 1 : 1;
  sim s = {.schedule = schedule, .transfers = transfers, .p = p, .m = m, .fwd = fwd, .bwd = bwd,
           .send_fwd = send_fwd, .send_bwd = send_bwd, .observe = observe, .ctx = ctx};
  s.posts = malloc(boundaries * 2 * SLOTS * sizeof *s.posts);
  s.cur = calloc(n, sizeof *s.cur);
  s.it = calloc(n, sizeof *s.it);
  s.has_item = calloc(3 * n, sizeof *s.has_item);
  s.stack = malloc(n * sizeof *s.stack);
  s.free_at = calloc(n, sizeof *s.free_at);
  s.held = calloc(3 * n, sizeof *s.held);
  bool overlap = transfers == FF_TRANSFERS_OVERLAPPED;
  if (overlap) {
    size_t sent = boundaries * 2 * (size_t)m, posted = n * 4, links = boundaries * 2;
    s.sent = malloc((sent + posted + links) * sizeof *s.sent);
    if (s.sent) {
      s.posted_at = s.sent + sent, s.link_free = s.posted_at + posted;
      for (size_t q = 0; q < sent; q++)
        s.sent[q] = NAN;
      for (size_t q = 0; q < posted + links; q++)
        s.posted_at[q] = 0.0; /* the first two receives are posted as the step begins */
    }
  }
  double makespan = -1.0;
  if (!s.posts || !s.cur || !s.it || !s.has_item || !s.stack || !s.free_at || !s.held ||
      (overlap && !s.sent))
    goto out;
  s.posted = s.has_item + n, s.queued = s.has_item + 2 * n;
  s.peak = s.held + n, s.done = s.held + 2 * n;
  for (size_t q = 0; q < boundaries * 2 * SLOTS; q++)
    s.posts[q] = (post){.j = -1};
  for (int i = 0; i < p; i++)
    s.cur[i].w = warmup(&s, i);
  s.barrier = INT64_MAX;
  if (!observe && !overlap && schedule == FF_SCHEDULE_1F1B && !skip_steady_rounds(&s))
    goto out;
  run(&s);
  makespan = 0.0;
  for (int i = 0; i < p; i++) {
    if (s.done[i] != m) { /* a stage never finished: the programs do not match (a bug) */
      makespan = -1.0;
      goto out;
    }
    if (finish)
      finish[i] = s.free_at[i];
    if (busy)
      busy[i] = (double)m * (fwd[i] + bwd[i]);
    if (peak)
      peak[i] = s.peak[i];
    if (s.free_at[i] > makespan)
      makespan = s.free_at[i];
  }
out:
  free(s.posts), free(s.cur), free(s.it), free(s.has_item), free(s.stack), free(s.free_at);
  free(s.held), free(s.sent);
  return makespan;
}

double ff_sim_pipeline(ff_schedule schedule, ff_transfers transfers, int p, int64_t m,
                       const double *fwd, const double *bwd, const double *send_fwd,
                       const double *send_bwd, double *finish, double *busy, int64_t *peak) {
  return ff_sim_pipeline_observed(schedule, transfers, p, m, fwd, bwd, send_fwd, send_bwd, finish,
                                  busy, peak, NULL, NULL);
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
