/* split.c — the surrogate's exact splits: layers over the stages of a pipeline and micro-batches
 * over pipelines (search_internal.h, docs/planner.md). */
#include <math.h>
#include <stdlib.h>

#include "search_internal.h"

/* ---- layer split: minimise the slowest stage subject to memory --------------------------- */


/* Time of stage sm holding n layers in the cheapest recompute mode (lo..hi) that fits them;
 * INFINITY when none does. Nondecreasing in n. */
static double stage_time(const ff_stage_model *sm, int64_t n, int lo, int hi, int *mode) {
  for (int md = lo; md <= hi; md++)
    if (sm->cap[md] >= (double)n) {
      *mode = md;
      return (double)n * sm->tau[md] + sm->fixed_seconds;
    }
  *mode = hi;
  return INFINITY;
}

typedef struct heap_item {
  double next; /* the stage's time with one more layer */
  int stage;
} heap_item;

static bool heap_less(heap_item a, heap_item b) {
  return a.next < b.next || (a.next == b.next && a.stage < b.stage);
}

static void heap_sift_down(heap_item *h, int n, int i) {
  for (;;) {
    int l = 2 * i + 1, r = l + 1, m = i;
    if (l < n && heap_less(h[l], h[m]))
      m = l;
    if (r < n && heap_less(h[r], h[m]))
      m = r;
    if (m == i)
      return;
    heap_item t = h[i];
    h[i] = h[m];
    h[m] = t;
    i = m;
  }
}

/* Optimal layers (and recompute modes) per stage: minimise the slowest stage subject to memory.
 * Each stage's time is nondecreasing in its layers, so handing out layers one at a time to the
 * stage that would be fastest with one more is optimal for the min-max (a heap keeps it
 * O(layers·log p)). Middle stages start with one layer; the end stages, which hold the
 * embedding or the LM head, may hold none. False when the layers do not fit. */
bool ff_split_layers(const ff_stage_model *sms, int p, int64_t layers, int lo, int hi,
                         int64_t *out, int *modes, double *stage_seconds) {
  heap_item *h = malloc((size_t)p * sizeof *h);
  if (!h)
    return false;
  int64_t given = 0;
  for (int k = 0; k < p; k++) {
    out[k] = p == 1 ? 0 : (sms[k].end ? 0 : 1);
    given += out[k];
  }
  bool ok = given <= layers;
  for (int k = 0; k < p && ok; k++)
    ok = isfinite(stage_time(&sms[k], out[k], lo, hi, &modes[k]));
  int n = 0;
  for (int k = 0; k < p && ok; k++) {
    h[n] = (heap_item){stage_time(&sms[k], out[k] + 1, lo, hi, &modes[k]), k};
    n++;
  }
  for (int i = n / 2 - 1; i >= 0; i--)
    heap_sift_down(h, n, i);
  while (ok && given < layers) {
    if (!isfinite(h[0].next)) {
      ok = false; /* every stage is full */
      break;
    }
    int k = h[0].stage;
    out[k]++;
    given++;
    h[0].next = stage_time(&sms[k], out[k] + 1, lo, hi, &modes[k]);
    heap_sift_down(h, n, 0);
  }
  free(h);
  if (!ok)
    return false;
  for (int k = 0; k < p; k++)
    stage_seconds[k] = stage_time(&sms[k], out[k], lo, hi, &modes[k]);
  return true;
}

/* ---- micro-batch split: minimise the slowest closed-form pipeline time -------------------- */

void ff_split_micro_batches(const double *slow, const double *sum, int n, int64_t total,
                                int64_t *out) {
  double T_lo = 0, T_hi = 0;
  for (int j = 0; j < n; j++) {
    double t = (double)(total - 1) * slow[j] + sum[j];
    if (t > T_hi)
      T_hi = t;
  }
  for (int it = 0; it < 80; it++) {
    double mid = 0.5 * (T_lo + T_hi);
    double count = 0;
    for (int j = 0; j < n; j++)
      count += mid >= sum[j] ? floor((mid - sum[j]) / slow[j]) + 1 : 0;
    if (count >= (double)total)
      T_hi = mid;
    else
      T_lo = mid;
  }
  int64_t have = 0;
  for (int j = 0; j < n; j++) {
    double m = T_hi >= sum[j] ? floor((T_hi - sum[j]) / slow[j]) + 1 : 1;
    out[j] = m < 1 ? 1 : (int64_t)m;
    have += out[j];
  }
  while (have > total) { /* take from the pipeline that finishes last */
    int worst = -1;
    double worst_t = -1;
    for (int j = 0; j < n; j++) {
      if (out[j] <= 1)
        continue;
      double t = (double)(out[j] - 1) * slow[j] + sum[j];
      if (t > worst_t) {
        worst_t = t;
        worst = j;
      }
    }
    if (worst < 0)
      break;
    out[worst]--;
    have--;
  }
  while (have < total) { /* only when every pipeline was clamped to 1: give to the fastest */
    int best = 0;
    for (int j = 1; j < n; j++)
      if ((double)out[j] * slow[j] + sum[j] < (double)out[best] * slow[best] + sum[best])
        best = j;
    out[best]++;
    have++;
  }
}
