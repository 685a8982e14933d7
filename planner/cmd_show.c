/* cmd_show.c — `ffplan show PLAN` (a compact table for people) and `ffplan check PLAN
 * [--cluster C] [--model M]` (a hand-edited plan validated against its inputs, or against the
 * given files, and against memory). Both evaluate the plan with the cost model rather than
 * trusting the predictions written in it. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ff_cost.h"
#include "ffplan_cmds.h"

static const char *const binding_names[] = {"compute", "memory", "link"};

/* ---- show ------------------------------------------------------------------------------- */

/* "2x16" when every rank holds the same count, else "7+7+6". */
static void split_text(const ff_plan_stage *st, size_t offset, char *out, size_t cap) {
  const ff_span *first = (const ff_span *)((const char *)&st->ranks[0] + offset);
  int64_t n0 = first->end - first->first;
  bool even = true;
  for (int t = 1; t < st->n_ranks; t++) {
    const ff_span *sp = (const ff_span *)((const char *)&st->ranks[t] + offset);
    even &= sp->end - sp->first == n0;
  }
  if (even) {
    if (st->n_ranks == 1)
      snprintf(out, cap, "%lld", (long long)n0);
    else
      snprintf(out, cap, "%dx%lld", st->n_ranks, (long long)n0);
    return;
  }
  size_t j = 0;
  out[0] = '\0';
  for (int t = 0; t < st->n_ranks && j + 1 < cap; t++) {
    const ff_span *sp = (const ff_span *)((const char *)&st->ranks[t] + offset);
    j += (size_t)snprintf(out + j, cap - j, "%s%lld", t ? "+" : "", (long long)(sp->end - sp->first));
  }
}

/* "node:0-3" for a TP group on consecutive GPUs, else "node:0,2". */
static void gpus_text(const ff_plan *plan, const ff_plan_stage *st, char *out, size_t cap) {
  const ff_plan_rank *r = st->ranks;
  bool consecutive = true;
  for (int t = 1; t < st->n_ranks; t++)
    consecutive &= r[t].gpu == r[0].gpu + t;
  const char *node = plan->cluster.nodes[r[0].node].name;
  if (st->n_ranks == 1)
    snprintf(out, cap, "%s:%d", node, r[0].gpu);
  else if (consecutive)
    snprintf(out, cap, "%s:%d-%d", node, r[0].gpu, r[st->n_ranks - 1].gpu);
  else {
    size_t j = (size_t)snprintf(out, cap, "%s:", node);
    for (int t = 0; t < st->n_ranks && j + 1 < cap; t++)
      j += (size_t)snprintf(out + j, cap - j, "%s%d", t ? "," : "", r[t].gpu);
  }
}

static bool same_shape(const ff_plan *plan, int a, int b) {
  const ff_plan_pipeline *x = &plan->pipelines[a], *y = &plan->pipelines[b];
  if (x->batch != y->batch || x->micro_batch_size != y->micro_batch_size || x->n_stages != y->n_stages)
    return false;
  for (int s = 0; s < x->n_stages; s++) {
    const ff_plan_stage *p = &x->stages[s], *q = &y->stages[s];
    if (p->layers.first != q->layers.first || p->layers.end != q->layers.end ||
        p->recompute != q->recompute || p->n_ranks != q->n_ranks ||
        p->ranks[0].device != q->ranks[0].device)
      return false;
    for (int t = 0; t < p->n_ranks; t++)
      if (p->ranks[t].heads.end != q->ranks[t].heads.end || p->ranks[t].ffn.end != q->ranks[t].ffn.end)
        return false;
  }
  return true;
}

static void show_header(const ff_plan *plan, const ff_plan_eval *e) {
  printf("plan%s%s: model %s on cluster %s, %lld ranks in %d pipeline%s, global batch %lld x %lld "
         "tokens\n", plan->has_name ? " " : "", plan->has_name ? plan->name : "", plan->model.name,
         plan->cluster.name, (long long)plan->n_ranks, plan->n_pipelines,
         plan->n_pipelines == 1 ? "" : "s", (long long)plan->training.global_batch,
         (long long)plan->model.seq_len);
  printf("predicted: %.4f s per iteration, %.0f tokens/s, MFU %.1f %%, HFU %.1f %%, peak memory "
         "%.2f GiB%s\n", e->iteration_seconds, e->tokens_per_second, 100 * e->mfu, 100 * e->hfu,
         e->peak_memory_bytes / FF_GIB, e->fits ? "" : ", DOES NOT FIT");
  if (plan->has_search) {
    printf("search: %s", plan->search.planner ? plan->search.planner : "?");
    if (plan->search.has_candidates)
      printf(", %lld plans scored", (long long)plan->search.candidates);
    if (plan->search.has_lower_bound)
      printf(", lower bound %.4f s", plan->search.lower_bound_seconds);
    if (plan->search.has_gap)
      printf(" (gap %.1f %%)", 100 * plan->search.gap);
    if (plan->search.has_origin)
      printf("\n  produced by: layout %s; node order %s; integer program %s; %lld local move%s",
             plan->search.layout, plan->search.node_order, ff_plan_ilp_names[plan->search.ilp],
             (long long)plan->search.local_moves, plan->search.local_moves == 1 ? "" : "s");
    for (int i = 0; i < plan->search.n_runner_ups; i++)
      printf("%s%.4f s: %s", i ? "; " : "\n  runner-ups: ", plan->search.runner_ups[i].iteration_seconds,
             plan->search.runner_ups[i].summary);
    printf("\n");
  }
  const ff_stage_eval *cs = &e->pipelines[e->critical_pipeline].stages[e->critical_stage];
  printf("critical path: pipeline %d, stage %d, bound by %s", e->critical_pipeline,
         e->critical_stage, binding_names[cs->binding]);
  if (plan->n_pipelines > 1 && e->critical_margin_seconds > 0)
    printf("; it ends %.4f s after the next pipeline", e->critical_margin_seconds);
  printf("\n");
}

#define SHOW_GPU_LISTS 4

static void show_group(const ff_plan *plan, const ff_plan_eval *e, int first, int count) {
  const ff_plan_pipeline *pl = &plan->pipelines[first];
  printf("\n");
  if (count == 1)
    printf("pipeline %d", first);
  else
    printf("pipelines %d-%d (%d of the same shape on different GPUs)", first, first + count - 1, count);
  printf(": batch %lld = %lld micro-batches of %lld, %d stage%s, %.4f s\n", (long long)pl->batch,
         (long long)pl->micro_batches, (long long)pl->micro_batch_size, pl->n_stages,
         pl->n_stages == 1 ? "" : "s", e->pipelines[first].seconds);
  printf("  %-5s %-9s %-8s %-3s %-13s %-17s %-9s %-19s %-13s %-7s %s\n", "stage", "layers", "holds",
         "TP", "heads", "ffn", "recompute", "time f/b ms", "memory GiB", "bound", "device and GPUs");
  for (int s = 0; s < pl->n_stages; s++) {
    const ff_plan_stage *st = &pl->stages[s];
    const ff_stage_eval *se = &e->pipelines[first].stages[s];
    double mem = 0, cap = 0;
    for (int q = first; q < first + count; q++)
      for (int t = 0; t < plan->pipelines[q].stages[s].n_ranks; t++) {
        const ff_rank_eval *re = &e->ranks[plan->pipelines[q].stages[s].ranks[t].rank];
        if (re->memory_total_bytes > mem) {
          mem = re->memory_total_bytes;
          cap = re->capacity_bytes;
        }
      }
    char layers[32], heads[64], ffn[96], times[48], memory[48];
    snprintf(layers, sizeof layers, "%lld-%lld", (long long)st->layers.first, (long long)st->layers.end);
    split_text(st, offsetof(ff_plan_rank, heads), heads, sizeof heads);
    split_text(st, offsetof(ff_plan_rank, ffn), ffn, sizeof ffn);
    snprintf(times, sizeof times, "%.2f/%.2f", se->fwd_seconds * 1e3, se->bwd_seconds * 1e3);
    snprintf(memory, sizeof memory, "%.2f/%.0f", mem / FF_GIB, cap / FF_GIB);
    const char *holds = st->embedding && st->lm_head ? "emb+head" : st->embedding ? "emb" : st->lm_head ? "head" : "-";
    printf("  %-5d %-9s %-8s %-3d %-13s %-17s %-9s %-19s %-13s %-7s %s", s, layers, holds, st->n_ranks,
           heads, ffn, ff_recompute_names[st->recompute], times, memory, binding_names[se->binding],
           plan->cluster.devices[st->ranks[0].device].name);
    for (int q = first; q < first + count && q < first + SHOW_GPU_LISTS; q++) {
      char gpus[128];
      gpus_text(plan, &plan->pipelines[q].stages[s], gpus, sizeof gpus);
      printf(" %s", gpus);
    }
    if (count > SHOW_GPU_LISTS)
      printf(" ... (+%d)", count - SHOW_GPU_LISTS);
    printf("\n");
  }
}

static void show_idle(const ff_plan *plan) {
  int64_t idle = plan->cluster.total_gpus - plan->n_ranks;
  if (idle > 0)
    printf("\n%lld GPU%s of the cluster %s idle\n", (long long)idle, idle == 1 ? "" : "s",
           idle == 1 ? "is" : "are");
}

int ffplan_load_and_eval(const char *file, ff_plan *plan, ff_plan_eval *e) {
  ff_diag d;
  ff_diag_init(&d, file);
  ff_status st = ff_load_plan(file, &d, plan);
  ff_diag_print(&d, stderr);
  ff_diag_free(&d);
  if (st != FF_OK)
    return st;
  if (ff_evaluate_plan(plan, e) != FF_OK) {
    fprintf(stderr, "%s: out of memory evaluating the plan\n", file);
    ff_plan_free(plan);
    return FF_ERR_RUNTIME;
  }
  return FF_OK;
}

int ffplan_cmd_show(int argc, char **argv) {
  if (argc != 1 || argv[0][0] == '-') {
    fprintf(stderr, "ffplan show: expected one PLAN (see ffplan --help)\n");
    return FF_ERR_INPUT;
  }
  ff_plan plan;
  ff_plan_eval e;
  int rc = ffplan_load_and_eval(argv[0], &plan, &e);
  if (rc != FF_OK)
    return rc;
  show_header(&plan, &e);
  for (int p = 0; p < plan.n_pipelines;) {
    int q = p + 1;
    while (q < plan.n_pipelines && same_shape(&plan, p, q))
      q++;
    show_group(&plan, &e, p, q - p);
    p = q;
  }
  show_idle(&plan);
  ff_plan_eval_free(&e);
  ff_plan_free(&plan);
  return FF_OK;
}

/* ---- check ------------------------------------------------------------------------------ */

static void rank_path(const ff_plan *plan, int64_t rank, char *out, size_t cap) {
  int p, s, t;
  if (ff_plan_find_rank(plan, rank, &p, &s, &t))
    snprintf(out, cap, "pipelines[%d].stages[%d].ranks[%d]", p, s, t);
  else
    snprintf(out, cap, "pipelines");
}

static void check_memory(const ff_plan *plan, const ff_plan_eval *e, ff_diag *d) {
  for (int64_t r = 0; r < plan->n_ranks; r++) {
    const ff_rank_eval *re = &e->ranks[r];
    if (re->memory_total_bytes <= re->capacity_bytes)
      continue;
    char path[FF_PATH_MAX], items[512];
    rank_path(plan, r, path, sizeof path);
    size_t j = 0;
    items[0] = '\0';
    for (int i = 0; i < FF_MEM_COUNT && j < sizeof items; i++)
      if (re->memory_bytes[i] > 0)
        j += (size_t)snprintf(items + j, sizeof items - j, "%s%s %.2f", j ? ", " : "",
                              ff_mem_item_names[i], re->memory_bytes[i] / FF_GIB);
    ff_diag_error(d, path, "rank %lld needs %.2f GiB but its device has %.2f GiB (%s GiB); use "
                  "more stages, recompute or a smaller micro-batch", (long long)r,
                  re->memory_total_bytes / FF_GIB, re->capacity_bytes / FF_GIB, items);
  }
}

/* Every rank's GPU exists, with the same device type, in the given cluster. */
static void check_against_cluster(const ff_plan *plan, const ff_cluster *c, ff_diag *d) {
  for (int p = 0; p < plan->n_pipelines; p++)
    for (int s = 0; s < plan->pipelines[p].n_stages; s++)
      for (int t = 0; t < plan->pipelines[p].stages[s].n_ranks; t++) {
        const ff_plan_rank *r = &plan->pipelines[p].stages[s].ranks[t];
        const char *node = plan->cluster.nodes[r->node].name;
        const char *device = plan->cluster.devices[r->device].name;
        char path[FF_PATH_MAX];
        snprintf(path, sizeof path, "pipelines[%d].stages[%d].ranks[%d]", p, s, t);
        int n = ff_cluster_find_node(c, node);
        if (n < 0)
          ff_diag_error(d, path, "node \"%s\" is not in the given cluster %s", node, c->name);
        else if (r->gpu >= c->nodes[n].gpus)
          ff_diag_error(d, path, "gpu %d does not exist on node \"%s\" of the given cluster (it has "
                        "%d)", r->gpu, node, c->nodes[n].gpus);
        else if (strcmp(c->devices[c->nodes[n].device].name, device) != 0)
          ff_diag_error(d, path, "node \"%s\" has %s GPUs in the given cluster, the plan says %s",
                        node, c->devices[c->nodes[n].device].name, device);
      }
}

static void check_against_model(const ff_plan *plan, const ff_model *m, ff_diag *d) {
  const ff_model *a = &plan->model;
  struct {
    const char *key;
    int64_t plan, given;
  } fields[] = {{"layers", a->layers, m->layers},       {"hidden", a->hidden, m->hidden},
                {"heads", a->heads, m->heads},          {"kv_heads", a->kv_heads, m->kv_heads},
                {"ffn_hidden", a->ffn_hidden, m->ffn_hidden}, {"vocab", a->vocab, m->vocab},
                {"seq_len", a->seq_len, m->seq_len}};
  for (size_t i = 0; i < sizeof fields / sizeof *fields; i++)
    if (fields[i].plan != fields[i].given) {
      char path[64];
      snprintf(path, sizeof path, "inputs.model.%s", fields[i].key);
      ff_diag_error(d, path, "is %lld but the given model %s has %lld", (long long)fields[i].plan,
                    m->name, (long long)fields[i].given);
    }
}

int ffplan_cmd_check(int argc, char **argv) {
  const char *file = NULL, *cluster_file = NULL, *model_file = NULL;
  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "--cluster") == 0 && i + 1 < argc)
      cluster_file = argv[++i];
    else if (strcmp(argv[i], "--model") == 0 && i + 1 < argc)
      model_file = argv[++i];
    else if (argv[i][0] != '-' && !file)
      file = argv[i];
    else {
      fprintf(stderr, "ffplan check: unexpected argument \"%s\" (usage: ffplan check PLAN "
              "[--cluster C] [--model M])\n", argv[i]);
      return FF_ERR_INPUT;
    }
  }
  if (!file) {
    fprintf(stderr, "ffplan check: expected a PLAN (see ffplan --help)\n");
    return FF_ERR_INPUT;
  }
  ff_plan plan;
  ff_plan_eval e;
  int rc = ffplan_load_and_eval(file, &plan, &e);
  if (rc != FF_OK)
    return rc;
  ff_diag d;
  ff_diag_init(&d, file);
  check_memory(&plan, &e, &d);
  ff_diag given;
  ff_diag_init(&given, NULL);
  if (cluster_file) {
    ff_cluster c;
    if (ff_load_cluster(cluster_file, &given, &c) == FF_OK) {
      check_against_cluster(&plan, &c, &d);
      ff_cluster_free(&c);
    }
  }
  if (model_file) {
    ff_model m;
    if (ff_load_model(model_file, &given, &m) == FF_OK) {
      check_against_model(&plan, &m, &d);
      ff_model_free(&m);
    }
  }
  ff_diag_print(&given, stderr);
  ff_diag_print(&d, stderr);
  rc = ff_diag_ok(&d) && ff_diag_ok(&given) ? FF_OK : FF_ERR_INPUT;
  if (rc == FF_OK) {
    char summary[1024];
    ff_summary_plan(&plan, summary, sizeof summary);
    printf("%s: ok: %s; every rank fits its device's memory (peak %.2f GiB)\n", file, summary,
           e.peak_memory_bytes / FF_GIB);
  }
  ff_diag_free(&d);
  ff_diag_free(&given);
  ff_plan_eval_free(&e);
  ff_plan_free(&plan);
  return rc;
}
