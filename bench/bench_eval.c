/* bench_eval.c — how long the cost model takes to evaluate one full plan (per-rank memory and
 * time, per-stage times, the 1F1B simulation of every pipeline, DP synchronisation, optimizer,
 * MFU): ff_evaluate_plan + ff_plan_eval_free, for synthetic clusters of 8, 64, 1,024 and 8,192
 * GPUs (synth.h) and llama-2-7b. Target: a 64-GPU plan in under 20 us.
 *
 * Each plan is written to JSON and read back with ff_plan_from_json before it is timed (the plan
 * timed is the one the reader accepted), so the benchmark never times an invalid plan. Timing:
 * CLOCK_MONOTONIC around batches of back-to-back evaluations, at least --min-time seconds per
 * size; the table gives the median and the fastest batch's time per evaluation. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ff_cost.h"
#include "ff_format.h"
#include "synth.h"

#define TARGET_GPUS 64
#define TARGET_US 20.0
#define MAX_BATCHES 1000

typedef struct bench_size {
  int gpus, pipelines, stages, tp;
} bench_size;

/* 8: one node, TP 2 x 2 stages x 2 pipelines; then TP 8 (one node per stage) with 4 or 8 stages
 * (a pipeline spans one or two racks) and as many pipelines as the GPUs allow. */
static const bench_size sizes[] = {
    {8, 2, 2, 2},
    {64, 2, 4, 8},
    {1024, 32, 4, 8},
    {8192, 128, 8, 8},
};
enum { N_SIZES = sizeof sizes / sizeof sizes[0] };

typedef struct result {
  bench_size size;
  int nodes;
  int64_t mbs, micro_batches, global_batch, reps;
  int batches;
  double median_us, min_us, seconds;
  size_t json_bytes;
  double iteration_seconds, mfu;
  bool fits;
  char cluster_summary[512];
} result;

static volatile double sink; /* keeps the evaluations from being optimised away */

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Seconds for `reps` evaluations of plan, or a negative number when evaluation fails. */
static double run_batch(const ff_plan *plan, int64_t reps) {
  double acc = 0.0;
  double t0 = now();
  for (int64_t i = 0; i < reps; i++) {
    ff_plan_eval e;
    if (ff_evaluate_plan(plan, &e) != FF_OK)
      return -1.0;
    acc += e.iteration_seconds;
    ff_plan_eval_free(&e);
  }
  double t = now() - t0;
  sink += acc;
  return t;
}

static ff_status time_plan(const ff_plan *plan, double min_time, int min_batches, result *res) {
  /* Warm up caches and the allocator, then find a repetition count for one batch. */
  int64_t reps = 1;
  double t;
  for (;;) {
    t = run_batch(plan, reps);
    if (t < 0)
      return FF_ERR_RUNTIME;
    if (t >= 0.01 || reps >= (INT64_C(1) << 40))
      break;
    reps *= 2;
  }
  double per = t / (double)reps, batch_time = min_time / min_batches;
  reps = (int64_t)(batch_time / per) + 1;
  double samples[MAX_BATCHES], total = 0.0;
  int n = 0;
  while (n < MAX_BATCHES && (n < min_batches || total < min_time)) {
    t = run_batch(plan, reps);
    if (t < 0)
      return FF_ERR_RUNTIME;
    samples[n++] = t / (double)reps * 1e6;
    total += t;
  }
  qsort(samples, (size_t)n, sizeof *samples, cmp_double);
  res->median_us = n % 2 ? samples[n / 2] : 0.5 * (samples[n / 2 - 1] + samples[n / 2]);
  res->min_us = samples[0];
  res->reps = reps;
  res->batches = n;
  res->seconds = total;
  return FF_OK;
}

typedef struct bench_options {
  const char *profiles;
  uint64_t seed;
  synth_mix mix;
  int64_t mbs; /* 0: the training set's smallest */
  double min_time;
  int batches;
} bench_options;

/* Build, validate and time one size. */
static ff_status bench_one(const bench_options *o, bench_size sz, int64_t mbs, result *res,
                           ff_diag *d) {
  memset(res, 0, sizeof *res);
  res->size = sz;
  char *model = ff_path_join(o->profiles, "models/llama-2-7b.json");
  char *training = ff_path_join(o->profiles, "training/pretrain.json");
  ff_cluster c;
  ff_plan built, plan;
  bool have_built = false, have_plan = false;
  ff_status st = FF_ERR_RUNTIME;
  if (!model || !training)
    goto done;
  /* The training set's own global batch and micro-batch sizes decide the micro-batches. */
  ff_training t;
  st = ff_load_training(training, d, &t);
  if (st != FF_OK)
    goto done;
  int64_t base_batch = t.global_batch;
  if (mbs == 0)
    mbs = t.micro_batch_sizes[0];
  ff_training_free(&t);
  /* As many micro-batches as the shipped global batch gives each pipeline, but at least 4 per
   * stage so the pipeline bubble stays small (the global batch grows with the cluster then). */
  int64_t per_pipe = (base_batch + (int64_t)sz.pipelines * mbs - 1) / ((int64_t)sz.pipelines * mbs);
  int64_t m = per_pipe > 4 * (int64_t)sz.stages ? per_pipe : 4 * (int64_t)sz.stages;

  synth_options so = {.gpus = sz.gpus, .seed = o->seed, .mix = o->mix, .profiles_dir = o->profiles};
  st = synth_cluster(&so, d, &c);
  if (st != FF_OK)
    goto done;
  res->nodes = c.n_nodes;
  ff_summary_cluster(&c, res->cluster_summary, sizeof res->cluster_summary);
  synth_shape shape = {sz.pipelines, sz.stages, sz.tp, mbs, m};
  st = synth_plan(&c, model, training, &shape, d, &built); /* takes c */
  if (st != FF_OK)
    goto done;
  have_built = true;
  st = synth_plan_check(&built, d, &plan, &res->json_bytes);
  if (st != FF_OK)
    goto done;
  have_plan = true;
  res->mbs = plan.pipelines[0].micro_batch_size;
  res->micro_batches = plan.pipelines[0].micro_batches;
  res->global_batch = plan.training.global_batch;

  /* The plan as built and as read back must evaluate to the same figures. */
  ff_plan_eval a, b;
  st = ff_evaluate_plan(&built, &a);
  if (st != FF_OK)
    goto done;
  st = ff_evaluate_plan(&plan, &b);
  if (st != FF_OK) {
    ff_plan_eval_free(&a);
    goto done;
  }
  bool same = a.iteration_seconds == b.iteration_seconds && a.mfu == b.mfu &&
              a.peak_memory_bytes == b.peak_memory_bytes;
  res->iteration_seconds = b.iteration_seconds;
  res->mfu = b.mfu;
  res->fits = b.fits;
  ff_plan_eval_free(&a);
  ff_plan_eval_free(&b);
  if (!same) {
    ff_diag_error(d, NULL, "%d GPUs: the plan read back evaluates differently from the plan "
                  "built", sz.gpus);
    st = FF_ERR_RUNTIME;
    goto done;
  }
  st = time_plan(&plan, o->min_time, o->batches, res);
  if (st != FF_OK)
    ff_diag_error(d, NULL, "%d GPUs: ff_evaluate_plan failed", sz.gpus);
done:
  if (st == FF_ERR_RUNTIME && ff_diag_ok(d))
    ff_diag_error(d, NULL, "%d GPUs: out of memory", sz.gpus);
  if (have_plan)
    ff_plan_free(&plan);
  if (have_built)
    ff_plan_free(&built);
  free(model);
  free(training);
  return st;
}

static void print_header(void) {
  printf("| GPUs | nodes | pipelines | stages | TP | mbs | micro-batches | global batch "
         "| µs per evaluation (median) | fastest batch | target | predicted iteration, MFU |\n");
  printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n");
}

static void print_row(const result *r) {
  char target[64] = "—";
  if (r->size.gpus == TARGET_GPUS)
    snprintf(target, sizeof target, "< %.0f µs: %s", TARGET_US,
             r->median_us < TARGET_US ? "met" : "**missed**");
  printf("| %d | %d | %d | %d | %d | %lld | %lld | %lld | %.2f | %.2f | %s | %.2f s, %.1f%%%s |\n",
         r->size.gpus, r->nodes, r->size.pipelines, r->size.stages, r->size.tp,
         (long long)r->mbs, (long long)r->micro_batches, (long long)r->global_batch, r->median_us,
         r->min_us, target, r->iteration_seconds, 100.0 * r->mfu, r->fits ? "" : " (over memory)");
  fflush(stdout);
}

static void usage(FILE *out) {
  fprintf(out,
          "usage: bench_eval [--sizes LIST] [--mbs N] [--sweep-mbs] [--min-time SEC]\n"
          "                  [--batches K] [--seed S] [--mix node|rack] [--profiles DIR]\n"
          "\n"
          "Times ff_evaluate_plan + ff_plan_eval_free on a valid llama-2-7b plan over a synthetic\n"
          "cluster (bench/synth.h) of 8, 64, 1024 and 8192 GPUs, and prints a Markdown table.\n"
          "Target: a 64-GPU plan evaluated in under 20 us.\n"
          "\n"
          "options:\n"
          "  --sizes LIST    comma-separated subset of 8,64,1024,8192 (default all)\n"
          "  --mbs N         micro-batch size, one of pretrain.json's (default its smallest)\n"
          "  --sweep-mbs     also time the 64-GPU plan at every listed micro-batch size\n"
          "  --min-time SEC  timed seconds per size, at least (default 0.5)\n"
          "  --batches K     timed batches per size, at least (default 7)\n"
          "  --seed S        seed of the synthetic clusters (default 1)\n"
          "  --mix node|rack device types dealt per node (default) or per rack\n"
          "  --profiles DIR  the profiles directory (default %s)\n"
          "  -h, --help      show this help\n",
          synth_profiles_dir());
}

static int bad_usage(const char *what, const char *arg) {
  fprintf(stderr, "bench_eval: %s%s\n(see bench_eval --help)\n", what, arg);
  return 2;
}

static bool parse_num(const char *s, double lo, double hi, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !(v >= lo && v <= hi))
    return false;
  *out = v;
  return true;
}

int main(int argc, char **argv) {
  bench_options o = {synth_profiles_dir(), 1, SYNTH_MIX_NODE, 0, 0.5, 7};
  bool want[N_SIZES] = {true, true, true, true}, sweep = false;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    double v;
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      usage(stdout);
      return 0;
    } else if (strcmp(a, "--sweep-mbs") == 0) {
      sweep = true;
      continue;
    }
    if (a[0] != '-')
      return bad_usage("unexpected argument ", a);
    if (strcmp(a, "--sizes") && strcmp(a, "--mbs") && strcmp(a, "--min-time") &&
        strcmp(a, "--batches") && strcmp(a, "--seed") && strcmp(a, "--mix") &&
        strcmp(a, "--profiles"))
      return bad_usage("unknown option ", a);
    if (i + 1 >= argc)
      return bad_usage("a value is missing after ", a);
    const char *val = argv[++i];
    if (strcmp(a, "--sizes") == 0) {
      memset(want, 0, sizeof want);
      char buf[256];
      snprintf(buf, sizeof buf, "%s", val);
      for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
           tok = strtok_r(NULL, ",", &save)) {
        int k = 0;
        while (k < N_SIZES && !(parse_num(tok, 1, 1e9, &v) && (int)v == sizes[k].gpus))
          k++;
        if (k == N_SIZES)
          return bad_usage("--sizes: expected some of 8,64,1024,8192, got ", tok);
        want[k] = true;
      }
    } else if (strcmp(a, "--mbs") == 0) {
      if (!parse_num(val, 1, 65536, &v) || v != (double)(int64_t)v)
        return bad_usage("--mbs: expected a whole number from 1 to 65536, got ", val);
      o.mbs = (int64_t)v;
    } else if (strcmp(a, "--min-time") == 0) {
      if (!parse_num(val, 0.001, 3600, &o.min_time))
        return bad_usage("--min-time: expected seconds from 0.001 to 3600, got ", val);
    } else if (strcmp(a, "--batches") == 0) {
      if (!parse_num(val, 1, 100, &v) || v != (double)(int)v)
        return bad_usage("--batches: expected a whole number from 1 to 100, got ", val);
      o.batches = (int)v;
    } else if (strcmp(a, "--seed") == 0) {
      if (!parse_num(val, 0, 9007199254740992.0, &v) || v != (double)(uint64_t)v)
        return bad_usage("--seed: expected a whole number from 0 to 2^53, got ", val);
      o.seed = (uint64_t)v;
    } else if (strcmp(a, "--mix") == 0) {
      if (strcmp(val, "node") && strcmp(val, "rack"))
        return bad_usage("--mix: expected node or rack, got ", val);
      o.mix = strcmp(val, "rack") == 0 ? SYNTH_MIX_RACK : SYNTH_MIX_NODE;
    } else {
      o.profiles = val;
    }
  }

  ff_diag d;
  ff_diag_init(&d, "bench_eval");
  result res[N_SIZES];
  ff_status st = FF_OK;
  printf("ff_evaluate_plan + ff_plan_eval_free, llama-2-7b (profiles/models), pretrain.json with "
         "global_batch adjusted, recompute selective; synthetic clusters seed %llu, mix %s\n\n",
         (unsigned long long)o.seed, synth_mix_names[o.mix]);
  print_header();
  for (int k = 0; k < N_SIZES && st == FF_OK; k++) {
    if (!want[k])
      continue;
    st = bench_one(&o, sizes[k], o.mbs, &res[k], &d);
    if (st == FF_OK)
      print_row(&res[k]);
  }
  if (st == FF_OK && sweep) {
    ff_training t;
    char *training = ff_path_join(o.profiles, "training/pretrain.json");
    st = training ? ff_load_training(training, &d, &t) : FF_ERR_RUNTIME;
    free(training);
    if (st == FF_OK) {
      printf("\n64 GPUs at every micro-batch size of pretrain.json:\n\n");
      print_header();
      for (int i = 0; i < t.n_micro_batch_sizes && st == FF_OK; i++) {
        result r;
        st = bench_one(&o, sizes[1], t.micro_batch_sizes[i], &r, &d);
        if (st == FF_OK)
          print_row(&r);
      }
      ff_training_free(&t);
    }
  }
  if (st == FF_OK) {
    printf("\nclusters:\n");
    for (int k = 0; k < N_SIZES; k++)
      if (want[k])
        printf("  %s; plan JSON %zu bytes, %d batches x %lld evaluations in %.2f s\n",
               res[k].cluster_summary, res[k].json_bytes, res[k].batches,
               (long long)res[k].reps, res[k].seconds);
  } else {
    ff_diag_print(&d, stderr);
  }
  ff_diag_free(&d);
  return (int)st;
}
