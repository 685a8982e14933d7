/* cmd_simulate.c — `ffplan simulate PLAN [--json]`: the cost model's account of a plan, per
 * rank, stage and pipeline, with the critical path; exit 3 when a rank's memory overflows. */
#include <stdio.h>
#include <string.h>

#include "ff_cost.h"
#include "ffplan_cmds.h"

static const char *const binding_names[] = {"compute", "memory", "link"};

static void print_rank_memory(const ff_plan *plan, const ff_plan_rank *r, const ff_rank_eval *re) {
  printf("      rank %-5lld %-12s gpu %-3d %-16s", (long long)r->rank, plan->cluster.nodes[r->node].name,
         r->gpu, plan->cluster.devices[r->device].name);
  printf(" fwd %.3f bwd %.3f (recompute %.3f, TP %.3f) ms/mb | DP %.3f opt %.3f ms |", re->fwd_seconds * 1e3,
         re->bwd_seconds * 1e3, re->recompute_seconds * 1e3, re->tp_seconds * 1e3,
         re->dp_seconds * 1e3, re->optimizer_seconds * 1e3);
  printf(" mem %7.2f / %6.2f GiB%s\n", re->memory_total_bytes / FF_GIB,
         re->capacity_bytes / FF_GIB, re->memory_total_bytes > re->capacity_bytes ? "  OVER" : "");
}

static void print_text(const ff_plan *plan, const ff_plan_eval *e) {
  char summary[1024];
  ff_summary_plan(plan, summary, sizeof summary);
  printf("%s\n", summary);
  printf("iteration %.4f s | %.0f tokens/s | MFU %.1f %% | HFU %.1f %% | model %.4g FLOP/iteration "
         "| peak memory %.2f GiB%s\n",
         e->iteration_seconds, e->tokens_per_second, 100.0 * e->mfu, 100.0 * e->hfu,
         e->model_flops_per_iteration, e->peak_memory_bytes / FF_GIB,
         e->fits ? "" : " | DOES NOT FIT");
  printf("breakdown (critical stage): compute %.4f s, TP %.4f s, PP %.4f s, bubble %.4f s, "
         "DP exposed %.4f s, optimizer %.4f s\n",
         e->compute_seconds, e->tp_seconds, e->pp_seconds, e->bubble_seconds, e->dp_seconds,
         e->optimizer_seconds);
  const ff_stage_eval *cs = &e->pipelines[e->critical_pipeline].stages[e->critical_stage];
  printf("critical path: pipeline %d, stage %d (bound by %s)", e->critical_pipeline,
         e->critical_stage, binding_names[cs->binding]);
  if (plan->n_pipelines > 1)
    printf(", %.4f s slower than the next slowest pipeline", e->critical_margin_seconds);
  printf("\n");
  printf("per rank: forward and backward ms per micro-batch (backward includes recompute and TP),\n"
         "DP gradient all-reduce and optimizer ms per iteration, memory against capacity\n");
  for (int p = 0; p < plan->n_pipelines; p++) {
    const ff_plan_pipeline *pl = &plan->pipelines[p];
    const ff_pipeline_eval *pe = &e->pipelines[p];
    printf("\npipeline %d: batch %lld = %lld x %lld, %d stage%s, %.4f s (+%.4f s DP sync not hidden)\n",
           p, (long long)pl->batch, (long long)pl->micro_batch_size, (long long)pl->micro_batches,
           pl->n_stages, pl->n_stages == 1 ? "" : "s", pe->seconds, pe->end_seconds - pe->seconds);
    for (int s = 0; s < pl->n_stages; s++) {
      const ff_plan_stage *st = &pl->stages[s];
      const ff_stage_eval *se = &pe->stages[s];
      printf("  stage %d: layers %lld-%lld%s%s, TP %d, recompute %s, in flight %lld | fwd %.4f "
             "bwd %.4f ms | send %.4f/%.4f ms gather %.4f/%.4f ms | busy %.4f s bubble %.4f s "
             "DP %.4f s | bound by %s\n",
             s, (long long)st->layers.first, (long long)st->layers.end,
             st->embedding ? " +embedding" : "", st->lm_head ? " +LM head" : "", st->n_ranks,
             ff_recompute_names[st->recompute], (long long)se->in_flight, se->fwd_seconds * 1e3,
             se->bwd_seconds * 1e3, se->send_fwd_seconds * 1e3, se->send_bwd_seconds * 1e3,
             se->gather_fwd_seconds * 1e3, se->gather_bwd_seconds * 1e3, se->busy_seconds,
             se->bubble_seconds, se->dp_seconds, binding_names[se->binding]);
      for (int t = 0; t < st->n_ranks; t++)
        print_rank_memory(plan, &st->ranks[t], &e->ranks[st->ranks[t].rank]);
    }
  }
}

static cJSON *memory_json(const ff_rank_eval *re) {
  cJSON *m = cJSON_CreateObject();
  for (int i = 0; i < FF_MEM_COUNT; i++)
    cJSON_AddNumberToObject(m, ff_mem_item_names[i], re->memory_bytes[i] / FF_GIB);
  cJSON_AddNumberToObject(m, "total", re->memory_total_bytes / FF_GIB);
  cJSON_AddNumberToObject(m, "capacity", re->capacity_bytes / FF_GIB);
  return m;
}

static cJSON *eval_json(const ff_plan *plan, const ff_plan_eval *e) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "iteration_seconds", e->iteration_seconds);
  cJSON_AddNumberToObject(o, "tokens_per_second", e->tokens_per_second);
  cJSON_AddNumberToObject(o, "mfu", e->mfu);
  cJSON_AddNumberToObject(o, "hfu", e->hfu);
  cJSON_AddNumberToObject(o, "model_flops_per_iteration", e->model_flops_per_iteration);
  cJSON_AddNumberToObject(o, "hardware_flops_per_iteration", e->hardware_flops_per_iteration);
  cJSON_AddNumberToObject(o, "peak_flops_per_second", e->peak_flops_sum);
  cJSON_AddNumberToObject(o, "peak_memory_gib", e->peak_memory_bytes / FF_GIB);
  cJSON_AddBoolToObject(o, "fits", e->fits);
  cJSON *crit = cJSON_AddObjectToObject(o, "critical");
  cJSON_AddNumberToObject(crit, "pipeline", e->critical_pipeline);
  cJSON_AddNumberToObject(crit, "stage", e->critical_stage);
  cJSON_AddStringToObject(crit, "bound_by", binding_names[e->pipelines[e->critical_pipeline].stages[e->critical_stage].binding]);
  cJSON_AddNumberToObject(crit, "margin_seconds", e->critical_margin_seconds);
  cJSON *bd = cJSON_AddObjectToObject(o, "breakdown");
  cJSON_AddNumberToObject(bd, "compute_seconds", e->compute_seconds);
  cJSON_AddNumberToObject(bd, "tp_seconds", e->tp_seconds);
  cJSON_AddNumberToObject(bd, "pp_seconds", e->pp_seconds);
  cJSON_AddNumberToObject(bd, "bubble_seconds", e->bubble_seconds);
  cJSON_AddNumberToObject(bd, "dp_seconds", e->dp_seconds);
  cJSON_AddNumberToObject(bd, "optimizer_seconds", e->optimizer_seconds);
  cJSON *pipes = cJSON_AddArrayToObject(o, "pipelines");
  for (int p = 0; p < plan->n_pipelines; p++) {
    const ff_pipeline_eval *pe = &e->pipelines[p];
    cJSON *pj = cJSON_CreateObject();
    cJSON_AddNumberToObject(pj, "seconds", pe->seconds);
    cJSON_AddNumberToObject(pj, "end_seconds", pe->end_seconds);
    cJSON_AddNumberToObject(pj, "bubble_seconds", pe->bubble_seconds);
    cJSON *stages = cJSON_AddArrayToObject(pj, "stages");
    for (int s = 0; s < plan->pipelines[p].n_stages; s++) {
      const ff_plan_stage *st = &plan->pipelines[p].stages[s];
      const ff_stage_eval *se = &pe->stages[s];
      cJSON *sj = cJSON_CreateObject();
      cJSON_AddNumberToObject(sj, "forward_seconds", se->fwd_seconds);
      cJSON_AddNumberToObject(sj, "backward_seconds", se->bwd_seconds);
      cJSON_AddNumberToObject(sj, "send_forward_seconds", se->send_fwd_seconds);
      cJSON_AddNumberToObject(sj, "send_backward_seconds", se->send_bwd_seconds);
      cJSON_AddNumberToObject(sj, "gather_forward_seconds", se->gather_fwd_seconds);
      cJSON_AddNumberToObject(sj, "gather_backward_seconds", se->gather_bwd_seconds);
      cJSON_AddNumberToObject(sj, "busy_seconds", se->busy_seconds);
      cJSON_AddNumberToObject(sj, "bubble_seconds", se->bubble_seconds);
      cJSON_AddNumberToObject(sj, "finish_seconds", se->finish_seconds);
      cJSON_AddNumberToObject(sj, "dp_seconds", se->dp_seconds);
      cJSON_AddNumberToObject(sj, "in_flight", (double)se->in_flight);
      cJSON_AddStringToObject(sj, "bound_by", binding_names[se->binding]);
      cJSON *ranks = cJSON_AddArrayToObject(sj, "ranks");
      for (int t = 0; t < st->n_ranks; t++) {
        const ff_rank_eval *re = &e->ranks[st->ranks[t].rank];
        cJSON *rj = cJSON_CreateObject();
        cJSON_AddNumberToObject(rj, "rank", (double)st->ranks[t].rank);
        cJSON_AddNumberToObject(rj, "forward_seconds", re->fwd_seconds);
        cJSON_AddNumberToObject(rj, "backward_seconds", re->bwd_seconds);
        cJSON_AddNumberToObject(rj, "recompute_seconds", re->recompute_seconds);
        cJSON_AddNumberToObject(rj, "tp_seconds", re->tp_seconds);
        cJSON_AddNumberToObject(rj, "dp_seconds", re->dp_seconds);
        cJSON_AddNumberToObject(rj, "optimizer_seconds", re->optimizer_seconds);
        cJSON_AddNumberToObject(rj, "parameters", re->params);
        cJSON_AddItemToObject(rj, "memory_gib", memory_json(re));
        cJSON_AddItemToArray(ranks, rj);
      }
      cJSON_AddItemToArray(stages, sj);
    }
    cJSON_AddItemToArray(pipes, pj);
  }
  return o;
}

static void report_overflow(const ff_plan *plan, const ff_plan_eval *e) {
  for (int p = 0; p < plan->n_pipelines; p++)
    for (int s = 0; s < plan->pipelines[p].n_stages; s++)
      for (int t = 0; t < plan->pipelines[p].stages[s].n_ranks; t++) {
        const ff_plan_rank *r = &plan->pipelines[p].stages[s].ranks[t];
        const ff_rank_eval *re = &e->ranks[r->rank];
        if (re->memory_total_bytes <= re->capacity_bytes)
          continue;
        fprintf(stderr, "ffplan simulate: rank %lld (pipeline %d stage %d, %s gpu %d, %s) needs "
                "%.2f GiB of %.2f GiB:", (long long)r->rank, p, s, plan->cluster.nodes[r->node].name,
                r->gpu, plan->cluster.devices[r->device].name, re->memory_total_bytes / FF_GIB,
                re->capacity_bytes / FF_GIB);
        for (int i = 0; i < FF_MEM_COUNT; i++)
          if (re->memory_bytes[i] > 0)
            fprintf(stderr, " %s %.2f", ff_mem_item_names[i], re->memory_bytes[i] / FF_GIB);
        fprintf(stderr, "\n");
      }
}

int ffplan_cmd_simulate(int argc, char **argv) {
  const char *file = NULL, *cluster_file = NULL;
  bool json = false;
  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "--json") == 0)
      json = true;
    else if (strcmp(argv[i], "--cluster") == 0 && i + 1 < argc)
      cluster_file = argv[++i];
    else if (argv[i][0] == '-' && argv[i][1]) {
      fprintf(stderr, "ffplan simulate: unknown option %s (see ffplan --help)\n", argv[i]);
      return FF_ERR_INPUT;
    } else if (!file)
      file = argv[i];
    else {
      fprintf(stderr, "ffplan simulate: expected one PLAN\n");
      return FF_ERR_INPUT;
    }
  }
  if (!file) {
    fprintf(stderr, "ffplan simulate: expected a PLAN file (see ffplan --help)\n");
    return FF_ERR_INPUT;
  }
  ff_plan plan;
  ff_diag d;
  ff_diag_init(&d, file);
  ff_status st = ff_load_plan(file, &d, &plan);
  ff_cluster other, own;
  bool swapped = false;
  if (st == FF_OK && cluster_file) { /* predict the plan on another profile of its cluster */
    if ((st = ff_load_cluster(cluster_file, &d, &other)) == FF_OK &&
        (st = ffplan_rebind(&plan, &other)) == FF_OK) {
      own = plan.cluster;
      plan.cluster = other;
      swapped = true;
    }
  }
  ff_diag_print(&d, stderr);
  ff_diag_free(&d);
  if (st != FF_OK) {
    if (cluster_file && !swapped)
      ff_plan_free(&plan);
    return st;
  }
  ff_plan_eval e;
  st = ff_evaluate_plan(&plan, &e);
  if (st != FF_OK) {
    fprintf(stderr, "ffplan simulate: out of memory evaluating %s\n", file);
    if (swapped) {
      ff_cluster_free(&plan.cluster);
      plan.cluster = own;
    }
    ff_plan_free(&plan);
    return st;
  }
  if (json) {
    cJSON *o = eval_json(&plan, &e);
    ff_buf b = {0};
    ff_json_write(o, &b);
    fwrite(b.data, 1, b.len, stdout);
    ff_buf_free(&b);
    cJSON_Delete(o);
  } else {
    print_text(&plan, &e);
  }
  int rc = FF_OK;
  if (!e.fits) {
    report_overflow(&plan, &e);
    rc = FF_ERR_INFEASIBLE;
  }
  ff_plan_eval_free(&e);
  if (swapped) {
    ff_cluster_free(&plan.cluster);
    plan.cluster = own;
  }
  ff_plan_free(&plan);
  return rc;
}
