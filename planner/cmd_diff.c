/* cmd_diff.c — `ffplan diff A B [--json]`: a semantic diff of two plans, like diff(1) in its exit
 * status (0 the same plan, 1 different, 2 bad input).
 *
 * It reports, in the plan's own words: what changed in the inputs the plans were made from
 * (model, training, cluster: a structural diff that matches named entries by name); what moved
 * in the plan (pipelines, batches, layer ranges between stages and the hardware of stages, shard
 * splits, ranks on other GPUs); and the predicted effect (iteration time, tokens/s, MFU, peak
 * memory per rank) from evaluating both plans with the cost model. Two plans that differ only by
 * a permutation of identical nodes (same device, GPUs, links and rack) are the same plan. */
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ff_cost.h"
#include "ffplan_cmds.h"

#define DIFF_RANK_LINES 20

typedef struct diff {
  cJSON *inputs; /* [{"path", "before", "after"}] */
  cJSON *plan;   /* ["pipeline 0: batch 64 → 72", ...] */
  cJSON *ranks;  /* [{"rank", "before", "after"}] */
  int64_t ranks_moved;
} diff;

/* ---- inputs: a structural JSON diff ----------------------------------------------------- */

static void compact(const cJSON *v, char *out, size_t cap) {
  if (!v) {
    snprintf(out, cap, "(absent)");
    return;
  }
  ff_buf b = {0};
  if (cJSON_IsArray(v) || cJSON_IsObject(v)) {
    char *s = cJSON_PrintUnformatted(v);
    ff_buf_puts(&b, s ? s : "?");
    cJSON_free(s);
  } else {
    ff_json_write(v, &b);
    if (b.len && b.data[b.len - 1] == '\n')
      b.data[--b.len] = '\0';
  }
  if (b.data && strlen(b.data) > 70)
    snprintf(out, cap, "%.67s...", b.data);
  else
    snprintf(out, cap, "%s", b.data ? b.data : "");
  ff_buf_free(&b);
}

static void add_input_change(diff *df, const char *path, const cJSON *a, const cJSON *b) {
  char before[96], after[96];
  compact(a, before, sizeof before);
  compact(b, after, sizeof after);
  cJSON *e = cJSON_CreateObject();
  cJSON_AddStringToObject(e, "path", path);
  cJSON_AddStringToObject(e, "before", before);
  cJSON_AddStringToObject(e, "after", after);
  cJSON_AddItemToArray(df->inputs, e);
}

static const cJSON *named(const cJSON *arr, const char *name) {
  for (const cJSON *e = arr->child; e; e = e->next) {
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(e, "name");
    if (cJSON_IsString(n) && strcmp(n->valuestring, name) == 0)
      return e;
  }
  return NULL;
}

static bool all_named(const cJSON *arr) {
  if (!arr->child)
    return false;
  for (const cJSON *e = arr->child; e; e = e->next)
    if (!cJSON_IsString(cJSON_GetObjectItemCaseSensitive(e, "name")))
      return false;
  return true;
}

static void json_diff(diff *df, const cJSON *a, const cJSON *b, const char *path);

static void diff_named_arrays(diff *df, const cJSON *a, const cJSON *b, const char *path) {
  char p[FF_PATH_MAX];
  for (const cJSON *e = a->child; e; e = e->next) {
    const char *name = cJSON_GetObjectItemCaseSensitive(e, "name")->valuestring;
    snprintf(p, sizeof p, "%s[%s]", path, name);
    const cJSON *f = named(b, name);
    if (f)
      json_diff(df, e, f, p);
    else
      add_input_change(df, p, e, NULL);
  }
  for (const cJSON *f = b->child; f; f = f->next) {
    const char *name = cJSON_GetObjectItemCaseSensitive(f, "name")->valuestring;
    if (!named(a, name)) {
      snprintf(p, sizeof p, "%s[%s]", path, name);
      add_input_change(df, p, NULL, f);
    }
  }
}

static void json_diff(diff *df, const cJSON *a, const cJSON *b, const char *path) {
  char p[FF_PATH_MAX];
  if (cJSON_IsObject(a) && cJSON_IsObject(b)) {
    for (const cJSON *e = a->child; e; e = e->next) {
      snprintf(p, sizeof p, "%s.%s", path, e->string);
      const cJSON *f = cJSON_GetObjectItemCaseSensitive(b, e->string);
      if (f)
        json_diff(df, e, f, p);
      else
        add_input_change(df, p, e, NULL);
    }
    for (const cJSON *f = b->child; f; f = f->next)
      if (!cJSON_GetObjectItemCaseSensitive(a, f->string)) {
        snprintf(p, sizeof p, "%s.%s", path, f->string);
        add_input_change(df, p, NULL, f);
      }
  } else if (cJSON_IsArray(a) && cJSON_IsArray(b) && all_named(a) && all_named(b)) {
    diff_named_arrays(df, a, b, path);
  } else if (cJSON_IsArray(a) && cJSON_IsArray(b) &&
             cJSON_GetArraySize(a) == cJSON_GetArraySize(b) && a->child &&
             (cJSON_IsObject(a->child) || cJSON_IsArray(a->child))) {
    int i = 0;
    for (const cJSON *e = a->child, *f = b->child; e && f; e = e->next, f = f->next, i++) {
      snprintf(p, sizeof p, "%s[%d]", path, i);
      json_diff(df, e, f, p);
    }
  } else if (!cJSON_Compare(a, b, true)) {
    add_input_change(df, path, a, b);
  }
}

static void diff_inputs(diff *df, const ff_plan *a, const ff_plan *b) {
  cJSON *x[3] = {ff_model_to_json(&a->model, false), ff_training_to_json(&a->training, false),
                 ff_cluster_to_json(&a->cluster, false, true)};
  cJSON *y[3] = {ff_model_to_json(&b->model, false), ff_training_to_json(&b->training, false),
                 ff_cluster_to_json(&b->cluster, false, true)};
  static const char *const names[] = {"model", "training", "cluster"};
  for (int i = 0; i < 3; i++) {
    json_diff(df, x[i], y[i], names[i]);
    cJSON_Delete(x[i]);
    cJSON_Delete(y[i]);
  }
}

/* ---- identical nodes -------------------------------------------------------------------- */

/* What makes two nodes interchangeable: device, GPUs, islands, links and rack. */
static void node_class(const ff_cluster *c, int n, char *out, size_t cap) {
  const ff_node *x = &c->nodes[n];
  snprintf(out, cap, "%s|%d|%d|%g|%g|%g|%g|%s", c->devices[x->device].name, x->gpus, x->island_gpus,
           x->island.bandwidth_gb_per_s, x->island.latency_us, x->intra.bandwidth_gb_per_s,
           x->intra.latency_us, x->group >= 0 ? c->groups[x->group].name : "");
  for (int o = 0; o < c->n_overrides; o++)
    if (c->overrides[o].node_a == n || c->overrides[o].node_b == n) {
      snprintf(out, cap, "override|%s", x->name); /* a node with its own links is unique */
      return;
    }
}

/* The plan with every node and GPU replaced by its order of first use among interchangeable
 * ones: equal strings mean the plans differ at most by a permutation of identical nodes. */
static char *abstract_plan(const ff_plan *p) {
  int n = p->cluster.n_nodes;
  int *label = malloc((size_t)n * sizeof *label), *gpu_map = NULL;
  char (*cls)[256] = malloc((size_t)n * sizeof *cls);
  int64_t total = p->cluster.total_gpus;
  int *offset = malloc(((size_t)n + 1) * sizeof *offset);
  ff_buf out = {0};
  if (!label || !cls || !offset)
    goto done;
  offset[0] = 0;
  for (int i = 0; i < n; i++) {
    label[i] = -1;
    node_class(&p->cluster, i, cls[i], sizeof cls[i]);
    offset[i + 1] = offset[i] + p->cluster.nodes[i].gpus;
  }
  gpu_map = malloc((size_t)(total ? total : 1) * sizeof *gpu_map);
  if (!gpu_map)
    goto done;
  for (int64_t g = 0; g < total; g++)
    gpu_map[g] = -1;
  int *used_in_node = calloc((size_t)n, sizeof *used_in_node);
  if (!used_in_node)
    goto done;
  for (int q = 0; q < p->n_pipelines; q++) {
    const ff_plan_pipeline *pl = &p->pipelines[q];
    ff_buf_printf(&out, "P%lld/%lld:", (long long)pl->micro_batch_size, (long long)pl->micro_batches);
    for (int s = 0; s < pl->n_stages; s++) {
      const ff_plan_stage *st = &pl->stages[s];
      ff_buf_printf(&out, "S%lld-%lld/%d:", (long long)st->layers.first, (long long)st->layers.end,
                    st->recompute);
      for (int t = 0; t < st->n_ranks; t++) {
        const ff_plan_rank *r = &st->ranks[t];
        if (label[r->node] < 0) {
          int same = 0;
          for (int i = 0; i < n; i++)
            same += label[i] >= 0 && strcmp(cls[i], cls[r->node]) == 0;
          label[r->node] = same;
        }
        int *slot = &gpu_map[offset[r->node] + r->gpu];
        if (*slot < 0)
          *slot = used_in_node[r->node]++;
        ff_buf_printf(&out, "R%s#%d.%d:%lld-%lld,%lld-%lld;", cls[r->node], label[r->node], *slot,
                      (long long)r->heads.first, (long long)r->heads.end, (long long)r->ffn.first,
                      (long long)r->ffn.end);
      }
    }
  }
  free(used_in_node);
done:
  free(label), free(cls), free(offset), free(gpu_map);
  return out.failed ? (free(out.data), NULL) : out.data;
}

/* ---- the plan: structure and ranks ------------------------------------------------------ */

static void stage_desc(const ff_plan *p, const ff_plan_stage *st, int index, char *out, size_t cap) {
  snprintf(out, cap, "stage %d (%dx%s on %s)", index, st->n_ranks,
           p->cluster.devices[st->ranks[0].device].name, p->cluster.nodes[st->ranks[0].node].name);
}

static int stage_of_layer(const ff_plan_pipeline *pl, int64_t layer) {
  for (int s = 0; s < pl->n_stages; s++)
    if (pl->stages[s].layers.first <= layer && layer < pl->stages[s].layers.end)
      return s;
  return -1;
}

static void add_line(diff *df, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add_line(diff *df, const char *fmt, ...) {
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  cJSON_AddItemToArray(df->plan, cJSON_CreateString(line));
}

/* Layers that sit in another stage, or in a stage on other hardware, as runs of layers. */
static void diff_layers(diff *df, const ff_plan *a, const ff_plan *b, int q) {
  const ff_plan_pipeline *x = &a->pipelines[q], *y = &b->pipelines[q];
  int64_t layers = a->model.layers < b->model.layers ? a->model.layers : b->model.layers;
  int64_t run_start = -1;
  int run_from = -1, run_to = -1;
  for (int64_t l = 0; l <= layers; l++) {
    int sa = l < layers ? stage_of_layer(x, l) : -2, sb = l < layers ? stage_of_layer(y, l) : -2;
    if (sa == run_from && sb == run_to)
      continue;
    if (run_start >= 0 && run_from >= 0 && run_to >= 0 && run_from != run_to) {
      char from[160], to[160];
      stage_desc(a, &x->stages[run_from], run_from, from, sizeof from);
      stage_desc(b, &y->stages[run_to], run_to, to, sizeof to);
      if (l - run_start == 1)
        add_line(df, "pipeline %d: layer %lld moved from %s to %s", q, (long long)run_start, from, to);
      else
        add_line(df, "pipeline %d: layers %lld-%lld moved from %s to %s", q, (long long)run_start,
                 (long long)(l - 1), from, to);
    }
    run_start = l;
    run_from = sa;
    run_to = sb;
  }
}

static void split_text(const ff_plan_stage *st, size_t offset, char *out, size_t cap) {
  size_t j = 0;
  out[0] = '\0';
  for (int t = 0; t < st->n_ranks && j + 1 < cap; t++) {
    const ff_span *sp = (const ff_span *)((const char *)&st->ranks[t] + offset);
    j += (size_t)snprintf(out + j, cap - j, "%s%lld", t ? "+" : "", (long long)(sp->end - sp->first));
  }
}

/* Stages at the same index: hardware, TP, recompute and shard splits. */
static void diff_stages(diff *df, const ff_plan *a, const ff_plan *b, int q) {
  const ff_plan_pipeline *x = &a->pipelines[q], *y = &b->pipelines[q];
  int n = x->n_stages < y->n_stages ? x->n_stages : y->n_stages;
  for (int s = 0; s < n; s++) {
    const ff_plan_stage *p = &x->stages[s], *r = &y->stages[s];
    const char *da = a->cluster.devices[p->ranks[0].device].name;
    const char *db = b->cluster.devices[r->ranks[0].device].name;
    if (p->n_ranks != r->n_ranks || strcmp(da, db) != 0)
      add_line(df, "pipeline %d stage %d: %dx%s -> %dx%s", q, s, p->n_ranks, da, r->n_ranks, db);
    if (p->recompute != r->recompute)
      add_line(df, "pipeline %d stage %d: recompute %s -> %s", q, s,
               ff_recompute_names[p->recompute], ff_recompute_names[r->recompute]);
    char ha[128], hb[128], fa[128], fb[128];
    split_text(p, offsetof(ff_plan_rank, heads), ha, sizeof ha);
    split_text(r, offsetof(ff_plan_rank, heads), hb, sizeof hb);
    split_text(p, offsetof(ff_plan_rank, ffn), fa, sizeof fa);
    split_text(r, offsetof(ff_plan_rank, ffn), fb, sizeof fb);
    if (p->n_ranks == r->n_ranks && (strcmp(ha, hb) != 0 || strcmp(fa, fb) != 0))
      add_line(df, "pipeline %d stage %d: split heads %s -> %s, ffn %s -> %s", q, s, ha, hb, fa, fb);
  }
}

static void diff_pipelines(diff *df, const ff_plan *a, const ff_plan *b) {
  if (a->n_pipelines != b->n_pipelines)
    add_line(df, "pipelines: %d -> %d", a->n_pipelines, b->n_pipelines);
  int n = a->n_pipelines < b->n_pipelines ? a->n_pipelines : b->n_pipelines;
  for (int q = 0; q < n; q++) {
    const ff_plan_pipeline *x = &a->pipelines[q], *y = &b->pipelines[q];
    if (x->batch != y->batch || x->micro_batch_size != y->micro_batch_size)
      add_line(df, "pipeline %d: batch %lld -> %lld (%lld x %lld -> %lld x %lld)", q,
               (long long)x->batch, (long long)y->batch, (long long)x->micro_batches,
               (long long)x->micro_batch_size, (long long)y->micro_batches,
               (long long)y->micro_batch_size);
    if (x->n_stages != y->n_stages)
      add_line(df, "pipeline %d: %d -> %d stages", q, x->n_stages, y->n_stages);
    diff_layers(df, a, b, q);
    diff_stages(df, a, b, q);
  }
}

static void find_rank(const ff_plan *p, int64_t rank, const ff_plan_rank **out) {
  *out = NULL;
  for (int q = 0; q < p->n_pipelines; q++)
    for (int s = 0; s < p->pipelines[q].n_stages; s++) {
      const ff_plan_stage *st = &p->pipelines[q].stages[s];
      if (st->ranks[0].rank <= rank && rank < st->ranks[0].rank + st->n_ranks) {
        *out = &st->ranks[rank - st->ranks[0].rank];
        return;
      }
    }
}

static void diff_ranks(diff *df, const ff_plan *a, const ff_plan *b) {
  if (a->n_ranks != b->n_ranks)
    add_line(df, "ranks: %lld -> %lld", (long long)a->n_ranks, (long long)b->n_ranks);
  int64_t n = a->n_ranks < b->n_ranks ? a->n_ranks : b->n_ranks;
  for (int64_t r = 0; r < n; r++) {
    const ff_plan_rank *x, *y;
    find_rank(a, r, &x);
    find_rank(b, r, &y);
    const char *na = a->cluster.nodes[x->node].name, *nb = b->cluster.nodes[y->node].name;
    if (strcmp(na, nb) == 0 && x->gpu == y->gpu)
      continue;
    df->ranks_moved++;
    cJSON *e = cJSON_CreateObject();
    cJSON_AddNumberToObject(e, "rank", (double)r);
    cJSON *before = cJSON_AddObjectToObject(e, "before");
    cJSON_AddStringToObject(before, "node", na);
    cJSON_AddNumberToObject(before, "gpu", x->gpu);
    cJSON *after = cJSON_AddObjectToObject(e, "after");
    cJSON_AddStringToObject(after, "node", nb);
    cJSON_AddNumberToObject(after, "gpu", y->gpu);
    cJSON_AddItemToArray(df->ranks, e);
  }
}

/* ---- effect and output ------------------------------------------------------------------ */

static cJSON *effect_json(const ff_plan_eval *x, const ff_plan_eval *y) {
  cJSON *o = cJSON_CreateObject();
  struct {
    const char *key;
    double a, b;
  } rows[] = {{"iteration_seconds", x->iteration_seconds, y->iteration_seconds},
              {"tokens_per_second", x->tokens_per_second, y->tokens_per_second},
              {"mfu", x->mfu, y->mfu},
              {"peak_memory_gib", x->peak_memory_bytes / FF_GIB, y->peak_memory_bytes / FF_GIB}};
  for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
    cJSON *e = cJSON_AddObjectToObject(o, rows[i].key);
    cJSON_AddNumberToObject(e, "before", rows[i].a);
    cJSON_AddNumberToObject(e, "after", rows[i].b);
  }
  cJSON *fits = cJSON_AddObjectToObject(o, "ranks_over_memory");
  cJSON_AddNumberToObject(fits, "before", (double)x->ranks_over_memory);
  cJSON_AddNumberToObject(fits, "after", (double)y->ranks_over_memory);
  return o;
}

static void print_text(const diff *df, bool same, bool permuted, const ff_plan_eval *x,
                       const ff_plan_eval *y) {
  if (same) {
    printf("same plan%s\n", permuted ? " (up to a permutation of identical nodes)" : "");
    return;
  }
  if (cJSON_GetArraySize(df->inputs) > 0) {
    printf("inputs:\n");
    for (const cJSON *e = df->inputs->child; e; e = e->next)
      printf("  %s: %s -> %s\n", cJSON_GetObjectItem(e, "path")->valuestring,
             cJSON_GetObjectItem(e, "before")->valuestring, cJSON_GetObjectItem(e, "after")->valuestring);
  }
  if (cJSON_GetArraySize(df->plan) > 0) {
    printf("plan:\n");
    for (const cJSON *e = df->plan->child; e; e = e->next)
      printf("  %s\n", e->valuestring);
  }
  int shown = 0;
  for (const cJSON *e = df->ranks->child; e && shown < DIFF_RANK_LINES; e = e->next, shown++) {
    const cJSON *b = cJSON_GetObjectItem(e, "before"), *a = cJSON_GetObjectItem(e, "after");
    printf("%s  rank %lld now on %s gpu %d (was %s gpu %d)\n", shown ? "" : "ranks:\n",
           (long long)cJSON_GetObjectItem(e, "rank")->valuedouble,
           cJSON_GetObjectItem(a, "node")->valuestring, (int)cJSON_GetObjectItem(a, "gpu")->valuedouble,
           cJSON_GetObjectItem(b, "node")->valuestring, (int)cJSON_GetObjectItem(b, "gpu")->valuedouble);
  }
  if (df->ranks_moved > DIFF_RANK_LINES)
    printf("  ... and %lld more ranks on other GPUs\n", (long long)(df->ranks_moved - DIFF_RANK_LINES));
  printf("predicted effect:\n");
  printf("  iteration %.4f s -> %.4f s (%+.1f %%)\n", x->iteration_seconds, y->iteration_seconds,
         100 * (y->iteration_seconds / x->iteration_seconds - 1));
  printf("  tokens/s %.0f -> %.0f (%+.1f %%)\n", x->tokens_per_second, y->tokens_per_second,
         100 * (y->tokens_per_second / x->tokens_per_second - 1));
  printf("  MFU %.1f %% -> %.1f %%\n", 100 * x->mfu, 100 * y->mfu);
  printf("  peak memory per rank %.2f GiB -> %.2f GiB\n", x->peak_memory_bytes / FF_GIB,
         y->peak_memory_bytes / FF_GIB);
  /* the peak is the largest rank, which may not be the one that no longer fits its GPU */
  if (!x->fits || !y->fits)
    printf("  ranks over their GPU's memory %lld -> %lld%s\n", (long long)x->ranks_over_memory,
           (long long)y->ranks_over_memory, y->fits ? "" : " (ffplan check names them)");
}

int ffplan_cmd_diff(int argc, char **argv) {
  const char *files[2] = {NULL, NULL};
  bool json = false;
  int n = 0;
  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "--json") == 0)
      json = true;
    else if (argv[i][0] != '-' && n < 2)
      files[n++] = argv[i];
    else {
      fprintf(stderr, "ffplan diff: unexpected argument \"%s\" (usage: ffplan diff A B [--json])\n", argv[i]);
      return FF_ERR_INPUT;
    }
  }
  if (n != 2) {
    fprintf(stderr, "ffplan diff: expected two plans (usage: ffplan diff A B [--json])\n");
    return FF_ERR_INPUT;
  }
  ff_plan a, b;
  ff_plan_eval ea, eb;
  int rc = ffplan_load_and_eval(files[0], &a, &ea);
  if (rc != FF_OK)
    return rc;
  if ((rc = ffplan_load_and_eval(files[1], &b, &eb)) != FF_OK) {
    ff_plan_eval_free(&ea);
    ff_plan_free(&a);
    return rc;
  }
  diff df = {cJSON_CreateArray(), cJSON_CreateArray(), cJSON_CreateArray(), 0};
  diff_inputs(&df, &a, &b);
  char *abs_a = abstract_plan(&a), *abs_b = abstract_plan(&b);
  bool same_structure = abs_a && abs_b && strcmp(abs_a, abs_b) == 0;
  bool same = same_structure && cJSON_GetArraySize(df.inputs) == 0;
  if (!same) {
    diff_pipelines(&df, &a, &b);
    diff_ranks(&df, &a, &b);
  }
  bool permuted = false;
  if (same) { /* same up to identical nodes: were any ranks actually moved? */
    diff_ranks(&df, &a, &b);
    permuted = df.ranks_moved > 0;
  }
  if (json) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "same", same);
    cJSON_AddBoolToObject(o, "permuted_identical_nodes", permuted);
    cJSON_AddItemToObject(o, "inputs", df.inputs);
    cJSON_AddItemToObject(o, "plan", df.plan);
    cJSON_AddItemToObject(o, "ranks", df.ranks);
    cJSON_AddItemToObject(o, "effect", effect_json(&ea, &eb));
    ff_buf out = {0};
    ff_json_write(o, &out);
    fwrite(out.data, 1, out.len, stdout);
    ff_buf_free(&out);
    cJSON_Delete(o);
  } else {
    print_text(&df, same, permuted, &ea, &eb);
    cJSON_Delete(df.inputs);
    cJSON_Delete(df.plan);
    cJSON_Delete(df.ranks);
  }
  free(abs_a), free(abs_b);
  ff_plan_eval_free(&ea);
  ff_plan_eval_free(&eb);
  ff_plan_free(&a);
  ff_plan_free(&b);
  return same ? 0 : 1;
}
