/* cmd_plan.c — `ffplan plan --cluster C --model M --training T [-o PLAN] [--baseline B]`:
 * search for the best plan and write it canonically (atomically; nothing on failure). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ffplan_cmds.h"
#include "search.h"

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int usage_error(const char *msg) {
  fprintf(stderr, "ffplan plan: %s\nusage: ffplan plan --cluster C --model M --training T "
          "[-o PLAN] [--baseline uniform|flashflex] [--without ilp|partition]... [--quiet]\n", msg);
  return FF_ERR_INPUT;
}

int ffplan_cmd_plan(int argc, char **argv) {
  const char *cluster_file = NULL, *model_file = NULL, *training_file = NULL, *out = "-";
  ff_search_opts opts;
  ff_search_opts_default(&opts);
  bool quiet = false;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    bool has_value = i + 1 < argc;
    if (strcmp(a, "--cluster") == 0 && has_value)
      cluster_file = argv[++i];
    else if (strcmp(a, "--model") == 0 && has_value)
      model_file = argv[++i];
    else if (strcmp(a, "--training") == 0 && has_value)
      training_file = argv[++i];
    else if ((strcmp(a, "-o") == 0 || strcmp(a, "--output") == 0) && has_value)
      out = argv[++i];
    else if (strcmp(a, "--quiet") == 0 || strcmp(a, "-q") == 0)
      quiet = true;
    else if (strcmp(a, "--without") == 0 && has_value) {
      const char *v = argv[++i];
      if (strcmp(v, "ilp") == 0)
        opts.ilp = false;
      else if (strcmp(v, "partition") == 0)
        opts.partition = false;
      else
        return usage_error("--without expects ilp or partition");
    } else if (strcmp(a, "--baseline") == 0 && has_value) {
      const char *b = argv[++i];
      if (strcmp(b, "uniform") == 0)
        opts.baseline = FF_BASELINE_UNIFORM;
      else if (strcmp(b, "flashflex") == 0)
        opts.baseline = FF_BASELINE_FLASHFLEX;
      else
        return usage_error("--baseline expects uniform or flashflex");
    } else {
      char msg[300];
      snprintf(msg, sizeof msg, "unexpected argument \"%s\"", a);
      return usage_error(msg);
    }
  }
  if (!cluster_file || !model_file || !training_file)
    return usage_error("--cluster, --model and --training are required");
  ff_diag d;
  ff_diag_init(&d, NULL);
  ff_cluster cluster;
  ff_model model;
  ff_training training;
  bool have_c = ff_load_cluster(cluster_file, &d, &cluster) == FF_OK;
  bool have_m = ff_load_model(model_file, &d, &model) == FF_OK;
  bool have_t = ff_load_training(training_file, &d, &training) == FF_OK;
  ff_diag_print(&d, stderr);
  ff_diag_free(&d);
  if (!have_c || !have_m || !have_t) {
    if (have_c)
      ff_cluster_free(&cluster);
    if (have_m)
      ff_model_free(&model);
    return FF_ERR_INPUT;
  }
  /* The search simulates every candidate's pipelines micro-batch by micro-batch: bound the
   * micro-batches an iteration can have so that planning stays within seconds per plan. */
  int64_t smallest = training.micro_batch_sizes[0];
  for (int i = 1; i < training.n_micro_batch_sizes; i++)
    if (training.micro_batch_sizes[i] < smallest)
      smallest = training.micro_batch_sizes[i];
  if (training.global_batch / smallest > FF_PLAN_MAX_MICRO_BATCHES) {
    fprintf(stderr, "ffplan plan: %s: global_batch %lld with a smallest micro-batch size of %lld "
            "gives up to %lld micro-batches per iteration; the planner handles at most %d "
            "(docs/planner.md, Limits): use larger micro_batch_sizes or a smaller global_batch\n",
            training_file, (long long)training.global_batch, (long long)smallest,
            (long long)(training.global_batch / smallest), FF_PLAN_MAX_MICRO_BATCHES);
    ff_cluster_free(&cluster);
    ff_model_free(&model);
    return FF_ERR_INPUT;
  }
  int64_t stage_counts = model.layers < cluster.total_gpus ? model.layers : cluster.total_gpus;
  if (stage_counts * cluster.total_gpus > FF_PLAN_MAX_STAGE_GPU_PRODUCT) {
    fprintf(stderr, "ffplan plan: %s with %s: %lld GPUs and %lld layers mean up to %lld stage "
            "counts of %lld GPUs each to search (%lld); the planner handles at most %lld "
            "(docs/planner.md, Limits): plan a part of the cluster, or a model of fewer layers\n",
            cluster_file, model_file, (long long)cluster.total_gpus, (long long)model.layers,
            (long long)stage_counts, (long long)cluster.total_gpus,
            (long long)(stage_counts * cluster.total_gpus), FF_PLAN_MAX_STAGE_GPU_PRODUCT);
    ff_cluster_free(&cluster);
    ff_model_free(&model);
    return FF_ERR_INPUT;
  }
  opts.progress = !quiet && isatty(STDERR_FILENO);
  double start = now_seconds();
  ff_search_result res;
  ff_status st = ff_search(&cluster, &model, &training, &opts, &res);
  double took = now_seconds() - start;
  if (st == FF_ERR_INFEASIBLE) {
    fprintf(stderr, "ffplan plan: no plan fits: %s\n", res.infeasible_why);
  } else if (st != FF_OK) {
    fprintf(stderr, "ffplan plan: out of memory while searching\n");
  } else {
    cJSON *tree = ff_plan_to_json(&res.plan);
    ff_diag_init(&d, out);
    st = ff_write_json_atomic(out, tree, &d);
    cJSON_Delete(tree);
    ff_diag_print(&d, stderr);
    ff_diag_free(&d);
    if (st == FF_OK && !quiet) {
      const ff_predicted *pr = &res.plan.predicted;
      fprintf(stderr, "ffplan plan: %lld ranks in %d pipelines, predicted %.4f s per iteration, "
              "%.0f tokens/s, MFU %.1f %%; lower bound %.4f s (gap %.1f %%); %lld plans scored "
              "in %.2f s\n", (long long)res.plan.n_ranks, res.plan.n_pipelines,
              pr->value[FF_PLAN_PRED_ITERATION_SECONDS], pr->value[FF_PLAN_PRED_TOKENS_PER_SECOND],
              100 * pr->value[FF_PLAN_PRED_MFU], res.lower_bound_seconds, 100 * res.plan.search.gap,
              (long long)res.candidates, took);
      if (res.idle_gpus > 0)
        fprintf(stderr, "ffplan plan: %d GPU%s left idle: using %s slows the plan\n",
                res.idle_gpus, res.idle_gpus == 1 ? "" : "s", res.idle_gpus == 1 ? "it" : "them");
    }
    ff_search_result_free(&res);
  }
  ff_cluster_free(&cluster);
  ff_model_free(&model);
  ff_training_free(&training);
  return st;
}
