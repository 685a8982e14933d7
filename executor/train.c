/* train.c — the pieces of a training step that the loop (dist.c) and the tests share; see
 * train.h. */
#define _POSIX_C_SOURCE 200809L
#include "train.h"

#include <math.h>
#include <stdlib.h>
#include <time.h>

#include "model.h"

double ff_throttle_factor(const ff_train_opts *o, int rank, const ff_device *device) {
  if (rank < o->n_throttle && o->throttle_by_rank[rank] > 0)
    return o->throttle_by_rank[rank];
  return device && device->emulated_slowdown > 1 ? device->emulated_slowdown : 1.0;
}

double ff_throttle(double factor, double wall, double cpu) {
  if (factor <= 1)
    return wall;
  double target = factor * cpu, wait = target - wall;
  if (wait <= 0)
    return wall;
  struct timespec ts = {(time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9)};
  while (nanosleep(&ts, &ts) != 0)
    ;
  return target;
}

double ff_cpu_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The first of the tensors whose gradient holds a non-finite value; grads is the block the
 * tensors' offsets count from, minus `from` floats (a copy of part of it). */
static const char *first_nonfinite(const float *grads, int64_t from, const ff_tensor *t,
                                   int n_tensors) {
  for (int i = 0; i < n_tensors; i++)
    for (int64_t j = 0; j < t[i].numel; j++)
      if (!isfinite(grads[t[i].offset - from + j]))
        return t[i].name;
  return NULL;
}

const char *ff_nonfinite_gradient(const ff_kernels *k, float *grads, const void *tensors,
                                  int n_tensors, int64_t step) {
  const ff_tensor *t = tensors;
  if (n_tensors <= 0)
    return NULL;
  const char *inject = getenv("FF_INJECT_NAN_STEP");
  if (inject && step > 0 && strtoll(inject, NULL, 10) == step) {
    float nan = NAN;
    k->to_device(grads + t[n_tensors - 1].offset, &nan, sizeof nan);
  }
  if (k->host_memory)
    return first_nonfinite(grads, 0, t, n_tensors);
  /* device memory: one reduction says whether anything is wrong; only then copy and look */
  int64_t from = t[0].offset, n = t[n_tensors - 1].offset + t[n_tensors - 1].numel - from;
  if (isfinite(k->sum_squares(grads + from, n)))
    return NULL;
  float *host = malloc((size_t)n * sizeof *host);
  if (!host)
    return t[0].name; /* cannot look closer; the step is skipped all the same */
  k->to_host(host, grads + from, (size_t)n * sizeof *host);
  const char *name = first_nonfinite(host, from, t, n_tensors);
  free(host);
  return name ? name : t[0].name;
}

double ff_learning_rate(const ff_training *t, int64_t step, int64_t total_steps) {
  if (t->warmup_steps > 0 && step <= t->warmup_steps)
    return t->lr * (double)step / (double)t->warmup_steps;
  if (t->decay == FF_DECAY_CONSTANT || total_steps <= t->warmup_steps)
    return t->lr;
  double progress = (double)(step - t->warmup_steps) / (double)(total_steps - t->warmup_steps);
  if (progress > 1)
    progress = 1;
  if (t->decay == FF_DECAY_LINEAR)
    return t->lr + (t->min_lr - t->lr) * progress;
  return t->min_lr + 0.5 * (t->lr - t->min_lr) * (1.0 + cos(M_PI * progress));
}
