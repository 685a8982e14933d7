/* bench_plan.c — how fast `ffplan plan` plans and how good its plans are.
 *
 *   bench_plan [--quality] [--timing] [--ablation] [--sizes 64,1024,8192]
 *
 * Timing: synthetic clusters from synth.c (4 device types, 8 GPUs per node, racks of 4 nodes,
 * device types dealt per rack) planned for Llama-2 7B, one core, wall-clock time of ff_search.
 * Quality: every shipped example cluster with Llama-2 7B, 13B and Llama 30B (training settings
 * profiles/training/flashflex.json): predicted tokens/s of the planner, the uniform
 * (Megatron-style) baseline and the FlashFlex-style baseline, and the planner's gap to its lower
 * bound. Ablation: the planner against itself with `--without ilp` and `--without partition`, on
 * the same shipped cases and on the topology suite (tests/data/topology/) with Llama-style models
 * at several global batches, recompute auto. Prints Markdown tables. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "search.h"
#include "synth.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int load_inputs(const char *model_file, const char *training_file, ff_model *m,
                       ff_training *t) {
  ff_diag d;
  ff_diag_init(&d, NULL);
  int ok = ff_load_model(model_file, &d, m) == FF_OK && ff_load_training(training_file, &d, t) == FF_OK;
  ff_diag_print(&d, stderr);
  ff_diag_free(&d);
  return ok;
}

static void timing(const int64_t *sizes, int n) {
  printf("| GPUs | nodes | model | global batch | pipelines | ranks used | plans scored | "
         "planning time (s) | target (s) | predicted iteration (s) | MFU |\n");
  printf("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (int i = 0; i < n; i++) {
    ff_diag d;
    ff_diag_init(&d, NULL);
    synth_options so = {sizes[i], 1, SYNTH_MIX_RACK, NULL, NULL};
    ff_cluster c;
    ff_model m;
    ff_training t;
    if (synth_cluster(&so, &d, &c) != FF_OK ||
        !load_inputs(FF_BENCH_PROFILES_DIR "/models/llama-2-7b.json",
                     FF_BENCH_PROFILES_DIR "/training/pretrain.json", &m, &t)) {
      ff_diag_print(&d, stderr);
      exit(1);
    }
    ff_diag_free(&d);
    t.global_batch = sizes[i] >= 4096 ? sizes[i] / 2 : 512; /* enough micro-batches to spread */
    ff_search_opts opts;
    ff_search_opts_default(&opts);
    ff_search_result res;
    double start = now();
    ff_status st = ff_search(&c, &m, &t, &opts, &res);
    double took = now() - start;
    double target = sizes[i] <= 64 ? 1 : sizes[i] <= 1024 ? 10 : 60;
    if (st == FF_OK) {
      printf("| %lld | %d | llama-2-7b | %lld | %d | %lld | %lld | %.2f | < %.0f | %.4f | %.1f %% |\n",
             (long long)sizes[i], c.n_nodes, (long long)t.global_batch, res.plan.n_pipelines,
             (long long)res.plan.n_ranks, (long long)res.candidates, took, target,
             res.plan.predicted.value[FF_PLAN_PRED_ITERATION_SECONDS],
             100 * res.plan.predicted.value[FF_PLAN_PRED_MFU]);
      ff_search_result_free(&res);
    } else {
      printf("| %lld | %d | llama-2-7b | %lld | - | - | - | %.2f | < %.0f | no plan | - |\n",
             (long long)sizes[i], c.n_nodes, (long long)t.global_batch, took, target);
    }
    fflush(stdout);
    ff_cluster_free(&c);
    ff_model_free(&m);
  }
}

static double plan_tps(const ff_cluster *c, const ff_model *m, const ff_training *t, ff_baseline b,
                       double *gap) {
  ff_search_opts opts;
  ff_search_opts_default(&opts);
  opts.baseline = b;
  ff_search_result res;
  if (ff_search(c, m, t, &opts, &res) != FF_OK)
    return 0;
  double tps = res.plan.predicted.value[FF_PLAN_PRED_TOKENS_PER_SECOND];
  if (gap)
    *gap = res.plan.search.gap;
  ff_search_result_free(&res);
  return tps;
}

/* The shipped clusters and models of the quality and ablation tables. */
static const char *const clusters[] = {"flashflex-a", "flashflex-b", "flashflex-c",
                                         "datacenter-mixed", "a100-pcie-2x8", "a100-pcie-4x8",
                                         "h100-8"};
static const char *const models[] = {"llama-2-7b", "llama-2-13b", "llama-30b"};

static void load_or_die(const char *cf, const char *mf, const char *tf, ff_cluster *c,
                        ff_model *m, ff_training *t) {
  ff_diag d;
  ff_diag_init(&d, NULL);
  if (ff_load_cluster(cf, &d, c) != FF_OK || !load_inputs(mf, tf, m, t)) {
    ff_diag_print(&d, stderr);
    exit(1);
  }
  ff_diag_free(&d);
}

/* Shipped cluster ci with model mi and profiles/training/flashflex.json. */
static void load_shipped(size_t ci, size_t mi, ff_cluster *c, ff_model *m, ff_training *t) {
  char cf[512], mf[512];
  snprintf(cf, sizeof cf, FF_BENCH_PROFILES_DIR "/clusters/%s.json", clusters[ci]);
  snprintf(mf, sizeof mf, FF_BENCH_PROFILES_DIR "/models/%s.json", models[mi]);
  load_or_die(cf, mf, FF_BENCH_PROFILES_DIR "/training/flashflex.json", c, m, t);
}

static void quality(void) {
  printf("| cluster | model | planner tokens/s | uniform tokens/s | FlashFlex-style tokens/s | "
         "vs uniform | vs FlashFlex-style | gap to lower bound |\n");
  printf("|---|---|---:|---:|---:|---:|---:|---:|\n");
  for (size_t ci = 0; ci < sizeof clusters / sizeof *clusters; ci++)
    for (size_t mi = 0; mi < sizeof models / sizeof *models; mi++) {
      ff_cluster c;
      ff_model m;
      ff_training t;
      load_shipped(ci, mi, &c, &m, &t);
      double gap = 0;
      double best = plan_tps(&c, &m, &t, FF_BASELINE_NONE, &gap);
      double uni = plan_tps(&c, &m, &t, FF_BASELINE_UNIFORM, NULL);
      double ffx = plan_tps(&c, &m, &t, FF_BASELINE_FLASHFLEX, NULL);
      char u[32] = "does not fit", f[32] = "does not fit", ru[32] = "-", rf[32] = "-";
      if (uni > 0) {
        snprintf(u, sizeof u, "%.0f", uni);
        snprintf(ru, sizeof ru, "%.2fx", best / uni);
      }
      if (ffx > 0) {
        snprintf(f, sizeof f, "%.0f", ffx);
        snprintf(rf, sizeof rf, "%.2fx", best / ffx);
      }
      printf("| %s | %s | %.0f | %s | %s | %s | %s | %.0f %% |\n", clusters[ci], models[mi], best,
             u, f, ru, rf, 100 * gap);
      fflush(stdout);
      ff_cluster_free(&c);
      ff_model_free(&m);
    }
}

static double plan_seconds(const ff_cluster *c, const ff_model *m, const ff_training *t, bool ilp,
                           bool partition) {
  ff_search_opts opts;
  ff_search_opts_default(&opts);
  opts.ilp = ilp;
  opts.partition = partition;
  ff_search_result res;
  if (ff_search(c, m, t, &opts, &res) != FF_OK)
    return INFINITY;
  double s = res.plan.predicted.value[FF_PLAN_PRED_ITERATION_SECONDS];
  ff_search_result_free(&res);
  return s;
}

/* One row: the planner, then each ablation with its change; `all` prints rows where nothing
 * changes too. Returns whether the row differed. */
static bool ablation_row(const char *cluster, const char *model, const char *setting,
                         const ff_cluster *c, const ff_model *m, const ff_training *t, bool all) {
  double now = plan_seconds(c, m, t, true, true);
  double no_ilp = plan_seconds(c, m, t, false, true);
  double no_part = plan_seconds(c, m, t, true, false);
  bool differs = no_ilp != now || no_part != now;
  if (!differs && !all)
    return false;
  if (!isfinite(now)) {
    printf("| %s | %s | %s | no plan | - | - | - | - |\n", cluster, model, setting);
    return differs;
  }
  printf("| %s | %s | %s | %.4f | %.4f | %+.2f %% | %.4f | %+.2f %% |\n", cluster, model,
         setting, now, no_ilp, 100 * (no_ilp / now - 1), no_part, 100 * (no_part / now - 1));
  fflush(stdout);
  return differs;
}

static void ablation(void) {
  static const char *const suite[] = {"two-sites-wan", "racks-across-types", "nvlink-islands",
                                      "nvlink-pairs-18", "odd-sizes", "overrides-only",
                                      "slow-override-in-group"};
  static const char *const suite_models[] = {"topology 640M", "llama-2-7b", "llama-2-13b"};
  static const int64_t batches[] = {8, 12, 16, 24, 32, 64};
  printf("| cluster | model | training | planner (s) | --without ilp (s) | change | "
         "--without partition (s) | change |\n");
  printf("|---|---|---|---:|---:|---:|---:|---:|\n");
  for (size_t ci = 0; ci < sizeof clusters / sizeof *clusters; ci++)
    for (size_t mi = 0; mi < sizeof models / sizeof *models; mi++) {
      ff_cluster c;
      ff_model m;
      ff_training t;
      load_shipped(ci, mi, &c, &m, &t);
      ablation_row(clusters[ci], models[mi], "flashflex.json", &c, &m, &t, true);
      ff_cluster_free(&c);
      ff_model_free(&m);
    }
  int cases = 0, differing = 0;
  for (size_t ci = 0; ci < sizeof suite / sizeof *suite; ci++)
    for (size_t mi = 0; mi < sizeof suite_models / sizeof *suite_models; mi++)
      for (size_t bi = 0; bi < sizeof batches / sizeof *batches; bi++)
        for (int rc = 0; rc < 2; rc++) {
          char cf[512], mf[512], setting[96];
          snprintf(cf, sizeof cf, FF_BENCH_TOPOLOGY_DIR "/%s.json", suite[ci]);
          if (mi == 0)
            snprintf(mf, sizeof mf, FF_BENCH_TOPOLOGY_DIR "/model.json");
          else
            snprintf(mf, sizeof mf, FF_BENCH_PROFILES_DIR "/models/%s.json", suite_models[mi]);
          ff_cluster c;
          ff_model m;
          ff_training t;
          load_or_die(cf, mf, FF_BENCH_TOPOLOGY_DIR "/training.json", &c, &m, &t);
          t.global_batch = batches[bi];
          t.recompute = rc ? FF_RECOMPUTE_AUTO : FF_RECOMPUTE_NONE;
          t.micro_batch_sizes[t.n_micro_batch_sizes++] = 4; /* 1, 2 and 4 */
          snprintf(setting, sizeof setting, "batch %lld, recompute %s",
                   (long long)t.global_batch, ff_recompute_names[t.recompute]);
          cases++;
          differing += ablation_row(suite[ci], suite_models[mi], setting, &c, &m, &t, false);
          ff_cluster_free(&c);
          ff_model_free(&m);
        }
  printf("\nTopology suite: %d of %d cases differ under an ablation (the rest are equal).\n",
         differing, cases);
}

int main(int argc, char **argv) {
  int64_t sizes[8] = {64, 1024, 8192};
  int n_sizes = 3;
  int do_quality = 0, do_timing = 0, do_ablation = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--quality") == 0)
      do_quality = 1;
    else if (strcmp(argv[i], "--timing") == 0)
      do_timing = 1;
    else if (strcmp(argv[i], "--ablation") == 0)
      do_ablation = 1;
    else if (strcmp(argv[i], "--sizes") == 0 && i + 1 < argc) {
      n_sizes = 0;
      for (char *tok = strtok(argv[++i], ","); tok && n_sizes < 8; tok = strtok(NULL, ","))
        sizes[n_sizes++] = atoll(tok);
    } else {
      fprintf(stderr, "usage: bench_plan [--quality] [--timing] [--ablation] "
                      "[--sizes 64,1024,8192]\n");
      return 2;
    }
  }
  if (!do_quality && !do_timing && !do_ablation)
    do_quality = do_timing = 1;
  if (do_timing)
    timing(sizes, n_sizes);
  if (do_timing && do_quality)
    printf("\n");
  if (do_quality)
    quality();
  if (do_ablation)
    ablation();
  return 0;
}
