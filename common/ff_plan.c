/* ff_plan.c — ff-plan/1: pipelines, stages and tensor shards with the inputs they were made for.
 *
 * The reader checks the plan's shapes and then its structure against its own inputs: global rank
 * numbering (pipeline-major, then stage, then TP index), each GPU used at most once, TP groups on
 * one node, contiguous and complete layer ranges, embedding and LM head placement, batch sums,
 * and shards (heads, kv heads, FFN columns, vocabulary rows) that tile their dimension. Whether a
 * plan fits in memory is the cost model's question, not the reader's. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>

#include "ff_format.h"
#include "ff_format_internal.h"

#define PLAN_MAX_PIPELINES (1 << 20)
#define PLAN_MAX_STAGES 100000
#define PLAN_MAX_TP 1024

static const char *const plan_pred_keys[] = {
    "iteration_seconds", "tokens_per_second", "mfu", "hfu", "peak_memory_gib",
    "compute_seconds", "tp_seconds", "pp_seconds", "dp_seconds", "bubble_seconds",
    "optimizer_seconds", NULL};
static const char *const pipe_pred_keys[] = {"seconds", "bubble_seconds", NULL};
static const char *const stage_pred_keys[] = {"forward_seconds", "backward_seconds", "memory_gib",
                                              NULL};

static bool read_predicted(ff_jobj *parent, const char *const *keys, ff_predicted *pred) {
  const cJSON *v = ff_jobj_get(parent, "predicted", false);
  if (!v)
    return true;
  char p[FF_PATH_MAX];
  ff_jobj_path(parent, "predicted", p, sizeof p);
  ff_jobj o;
  if (!ff_jobj_open(&o, parent->diag, v, p))
    return false;
  bool ok = true;
  for (int i = 0; keys[i]; i++) {
    bool fraction = strcmp(keys[i], "mfu") == 0 || strcmp(keys[i], "hfu") == 0;
    ff_interval iv = fraction ? FF_CLOSED(0, 1) : FF_CLOSED(0, 1e300);
    if (ff_jobj_get(&o, keys[i], false)) {
      pred->has[i] = ff_jobj_num(&o, keys[i], false, iv, &pred->value[i]);
      ok &= pred->has[i];
    }
  }
  ff_jobj_close(&o);
  return ok;
}

static void write_predicted(cJSON *parent, const char *const *keys, const ff_predicted *pred) {
  bool any = false;
  for (int i = 0; keys[i]; i++)
    any |= pred->has[i];
  if (!any)
    return;
  cJSON *o = cJSON_AddObjectToObject(parent, "predicted");
  for (int i = 0; keys[i]; i++)
    if (pred->has[i])
      cJSON_AddNumberToObject(o, keys[i], pred->value[i]);
}

/* ---- inputs ----------------------------------------------------------------------------- */

static bool read_input(ff_jobj *inputs, const char *key, const char *base_dir, ff_diag *d,
                       ff_format_kind kind, void *out) {
  const cJSON *v = ff_jobj_get(inputs, key, true);
  if (!v)
    return false;
  char p[FF_PATH_MAX];
  ff_jobj_path(inputs, key, p, sizeof p);
  if (cJSON_IsString(v)) {
    char *file = ff_path_join(base_dir ? base_dir : ".", v->valuestring);
    if (!file)
      return false;
    ff_status st = ff_load_referenced(file, p, "input file", d);
    if (st == FF_OK) {
      switch (kind) {
      case FF_FORMAT_MODEL: st = ff_load_model(file, d, out); break;
      case FF_FORMAT_TRAINING: st = ff_load_training(file, d, out); break;
      case FF_FORMAT_CLUSTER: st = ff_load_cluster(file, d, out); break;
      default: st = FF_ERR_INPUT; break;
      }
      if (st != FF_OK)
        ff_diag_error(d, p, "input file \"%s\" is not valid (errors above)", v->valuestring);
    }
    free(file);
    return st == FF_OK;
  }
  if (!cJSON_IsObject(v)) {
    ff_diag_error(d, p, "expected an inline %s object or a path to one", ff_format_ids[kind]);
    return false;
  }
  ff_status st = FF_ERR_INPUT;
  switch (kind) {
  case FF_FORMAT_MODEL: st = ff_model_from_json(v, p, true, d, out); break;
  case FF_FORMAT_TRAINING: st = ff_training_from_json(v, p, true, d, out); break;
  case FF_FORMAT_CLUSTER: st = ff_cluster_from_json(v, p, true, base_dir, d, out); break;
  default: break;
  }
  return st == FF_OK;
}

static bool digest_valid(const char *s) {
  if (strncmp(s, "fnv1a64:", 8) != 0 || strlen(s) != 24)
    return false;
  for (int i = 8; i < 24; i++)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
      return false;
  return true;
}

/* Digests, when present, must match the inputs: an input edited after planning is reported
 * (delete "digests" to accept the edit; writers add fresh ones). */
static bool read_digests(ff_jobj *inputs, ff_diag *d, const ff_plan *plan, bool inputs_ok) {
  const cJSON *v = ff_jobj_get(inputs, "digests", false);
  if (!v)
    return true;
  ff_jobj o;
  if (!ff_jobj_open(&o, d, v, "inputs.digests"))
    return false;
  bool ok = true;
  static const char *const keys[] = {"model", "training", "cluster"};
  for (int i = 0; i < 3; i++) {
    const cJSON *s = ff_jobj_get(&o, keys[i], true);
    if (!s) {
      ok = false;
      continue;
    }
    char p[FF_PATH_MAX];
    ff_jobj_path(&o, keys[i], p, sizeof p);
    if (!cJSON_IsString(s) || !digest_valid(s->valuestring)) {
      ff_diag_error(d, p, "expected \"fnv1a64:\" followed by 16 lower-case hex digits");
      ok = false;
      continue;
    }
    if (!inputs_ok)
      continue;
    cJSON *tree = i == 0   ? ff_model_to_json(&plan->model, false)
                  : i == 1 ? ff_training_to_json(&plan->training, false)
                           : ff_cluster_to_json(&plan->cluster, false, true);
    char want[32];
    ff_digest_json(tree, want);
    cJSON_Delete(tree);
    if (strcmp(want, s->valuestring) != 0) {
      ff_diag_error(d, p, "does not match inputs.%s (its digest is %s): the input was changed "
                    "after planning; re-plan, or delete \"digests\" to accept the change",
                    keys[i], want);
      ok = false;
    }
  }
  ff_jobj_close(&o);
  return ok;
}

/* ---- ranks and stages ------------------------------------------------------------------- */

typedef struct plan_ctx {
  ff_diag *d;
  ff_plan *plan;
  int64_t next_rank;
} plan_ctx;

static bool read_rank(plan_ctx *c, const cJSON *v, const char *p, bool wants_vocab,
                      ff_plan_rank *r) {
  ff_jobj o;
  const ff_cluster *cl = &c->plan->cluster;
  const ff_model *m = &c->plan->model;
  if (!ff_jobj_open(&o, c->d, v, p))
    return false;
  ff_name node, device;
  int64_t gpu = 0;
  bool ok = ff_jobj_int(&o, "rank", true, 0, INT32_MAX, &r->rank);
  if (ok && r->rank != c->next_rank) {
    char q[FF_PATH_MAX];
    ff_jobj_path(&o, "rank", q, sizeof q);
    ff_diag_error(c->d, q, "is %lld, expected %lld (ranks are numbered pipeline-major, then stage, "
                  "then TP index, from 0 without gaps)", (long long)r->rank,
                  (long long)c->next_rank);
    ok = false;
    c->next_rank = r->rank; /* report one break in the numbering, not every rank after it */
  }
  c->next_rank++;
  r->node = -1;
  r->device = -1;
  if (ff_jobj_name(&o, "node", true, node)) {
    r->node = ff_cluster_find_node(cl, node);
    if (r->node < 0) {
      char q[FF_PATH_MAX];
      ff_jobj_path(&o, "node", q, sizeof q);
      ff_diag_error(c->d, q, "\"%s\" is not a node of inputs.cluster", node);
      ok = false;
    }
  } else {
    ok = false;
  }
  int gpus = r->node >= 0 ? cl->nodes[r->node].gpus : PLAN_MAX_TP;
  ok &= ff_jobj_int(&o, "gpu", true, 0, gpus - 1, &gpu);
  r->gpu = (int)gpu;
  if (ff_jobj_name(&o, "device", true, device)) {
    r->device = ff_cluster_find_device(cl, device);
    if (r->node >= 0 && r->device != cl->nodes[r->node].device) {
      char q[FF_PATH_MAX];
      ff_jobj_path(&o, "device", q, sizeof q);
      ff_diag_error(c->d, q, "\"%s\" does not match node \"%s\", which has %s GPUs", device,
                    cl->nodes[r->node].name, cl->devices[cl->nodes[r->node].device].name);
      ok = false;
    }
  } else {
    ok = false;
  }
  int64_t s[2];
  if ((ok &= ff_jobj_span(&o, "heads", true, 0, m->heads, s)))
    r->heads = (ff_span){s[0], s[1]};
  if ((ok &= ff_jobj_span(&o, "kv_heads", true, 0, m->kv_heads, s)))
    r->kv_heads = (ff_span){s[0], s[1]};
  if ((ok &= ff_jobj_span(&o, "ffn", true, 0, m->ffn_hidden, s)))
    r->ffn = (ff_span){s[0], s[1]};
  if (wants_vocab) {
    if ((ok &= ff_jobj_span(&o, "vocab", true, 0, m->vocab, s)))
      r->vocab = (ff_span){s[0], s[1]};
  } else if (ff_jobj_get(&o, "vocab", false)) {
    char q[FF_PATH_MAX];
    ff_jobj_path(&o, "vocab", q, sizeof q);
    ff_diag_error(c->d, q, "only ranks of stages with the embedding or the LM head hold "
                  "vocabulary rows");
    ok = false;
  }
  if (ff_jobj_get(&o, "memory_gib", false)) {
    r->has_memory = ff_jobj_num(&o, "memory_gib", false, FF_CLOSED(0, 1e9), &r->memory_gib);
    ok &= r->has_memory;
  }
  ff_jobj_close(&o);
  return ok;
}

/* The ranks' shards of one dimension must tile [0, total) in TP order, none empty. */
static bool check_tiling(plan_ctx *c, const char *stage_path, const ff_plan_stage *s,
                         size_t offset, const char *key, int64_t total, const char *what) {
  int64_t expect = 0;
  for (int i = 0; i < s->n_ranks; i++) {
    const ff_span *span = (const ff_span *)((const char *)&s->ranks[i] + offset);
    char q[FF_PATH_MAX];
    snprintf(q, sizeof q, "%s.ranks[%d].%s", stage_path, i, key);
    if (span->first != expect) {
      ff_diag_error(c->d, q, "starts at %lld, expected %lld (the TP group's %s ranges must tile "
                    "[0, %lld) in order with no gap or overlap)", (long long)span->first,
                    (long long)expect, what, (long long)total);
      return false;
    }
    if (span->end == span->first) {
      ff_diag_error(c->d, q, "is empty; every rank of a TP group holds at least one of the %s",
                    what);
      return false;
    }
    expect = span->end;
  }
  if (expect != total) {
    char q[FF_PATH_MAX];
    snprintf(q, sizeof q, "%s.ranks[%d].%s", stage_path, s->n_ranks - 1, key);
    ff_diag_error(c->d, q, "ends at %lld; the TP group's %s ranges must cover [0, %lld)",
                  (long long)expect, what, (long long)total);
    return false;
  }
  return true;
}

static bool check_stage_shards(plan_ctx *c, const char *p, const ff_plan_stage *s, bool ends) {
  const ff_model *m = &c->plan->model;
  const ff_cluster *cl = &c->plan->cluster;
  bool ok = true;
  for (int i = 1; i < s->n_ranks; i++) {
    if (s->ranks[i].node != s->ranks[0].node) {
      char q[FF_PATH_MAX];
      snprintf(q, sizeof q, "%s.ranks[%d].node", p, i);
      ff_diag_error(c->d, q, "\"%s\" differs from ranks[0] (\"%s\"); a stage's TP group must sit "
                    "on one node", cl->nodes[s->ranks[i].node].name,
                    cl->nodes[s->ranks[0].node].name);
      return false;
    }
  }
  ok &= check_tiling(c, p, s, offsetof(ff_plan_rank, heads), "heads", m->heads, "heads");
  ok &= check_tiling(c, p, s, offsetof(ff_plan_rank, ffn), "ffn", m->ffn_hidden, "FFN columns");
  if (ends)
    ok &= check_tiling(c, p, s, offsetof(ff_plan_rank, vocab), "vocab", m->vocab,
                       "vocabulary rows");
  int64_t group = m->heads / m->kv_heads;
  for (int i = 0; ok && i < s->n_ranks; i++) {
    const ff_plan_rank *r = &s->ranks[i];
    int64_t first = r->heads.first / group, end = (r->heads.end + group - 1) / group;
    if (r->kv_heads.first != first || r->kv_heads.end != end) {
      char q[FF_PATH_MAX];
      snprintf(q, sizeof q, "%s.ranks[%d].kv_heads", p, i);
      ff_diag_error(c->d, q, "is [%lld, %lld], expected [%lld, %lld]: the kv heads that query "
                    "heads [%lld, %lld) use (%lld query heads per kv head)",
                    (long long)r->kv_heads.first, (long long)r->kv_heads.end, (long long)first,
                    (long long)end, (long long)r->heads.first, (long long)r->heads.end,
                    (long long)group);
      ok = false;
    }
  }
  return ok;
}

static bool read_stage(plan_ctx *c, const cJSON *v, const char *p, int index, int n_stages,
                       ff_plan_stage *s) {
  ff_jobj o;
  const ff_model *m = &c->plan->model;
  char q[FF_PATH_MAX];
  if (!ff_jobj_open(&o, c->d, v, p))
    return false;
  int64_t span[2];
  bool ok = ff_jobj_span(&o, "layers", true, 0, m->layers, span);
  if (ok)
    s->layers = (ff_span){span[0], span[1]};
  ok &= ff_jobj_bool(&o, "embedding", true, &s->embedding);
  ok &= ff_jobj_bool(&o, "lm_head", true, &s->lm_head);
  int recompute = 0;
  static const char *const stage_recompute[] = {"none", "selective", "full", NULL};
  const cJSON *rv = ff_jobj_get(&o, "recompute", true);
  if (rv && cJSON_IsString(rv) && strcmp(rv->valuestring, "auto") == 0) {
    ff_jobj_path(&o, "recompute", q, sizeof q);
    ff_diag_error(c->d, q, "\"auto\" is for training settings; a plan's stage says what it does: "
                  "none, selective or full");
    ok = false;
  } else if (rv) {
    ok &= ff_jobj_enum(&o, "recompute", true, stage_recompute, &recompute);
  } else {
    ok = false;
  }
  s->recompute = (ff_recompute)recompute;
  if (ok && s->embedding != (index == 0)) {
    ff_jobj_path(&o, "embedding", q, sizeof q);
    ff_diag_error(c->d, q, index == 0 ? "must be true: the first stage holds the embedding"
                                      : "must be false: only the first stage holds the embedding");
    ok = false;
  }
  if (ok && s->lm_head != (index == n_stages - 1)) {
    ff_jobj_path(&o, "lm_head", q, sizeof q);
    ff_diag_error(c->d, q, index == n_stages - 1
                               ? "must be true: the last stage holds the LM head"
                               : "must be false: only the last stage holds the LM head");
    ok = false;
  }
  if (ok && s->layers.first == s->layers.end && !s->embedding && !s->lm_head) {
    ff_jobj_path(&o, "layers", q, sizeof q);
    ff_diag_error(c->d, q, "is empty; only a stage with the embedding or the LM head may hold no "
                  "layers");
    ok = false;
  }
  ff_recompute want = c->plan->training.recompute;
  if (ok && want != FF_RECOMPUTE_AUTO && s->recompute != want) {
    ff_jobj_path(&o, "recompute", q, sizeof q);
    ff_diag_error(c->d, q, "is \"%s\" but inputs.training.recompute is \"%s\" (only \"auto\" "
                  "lets stages differ)", ff_recompute_names[s->recompute],
                  ff_recompute_names[want]);
    ok = false;
  }
  const cJSON *ranks = ff_jobj_array(&o, "ranks", true, 1, PLAN_MAX_TP);
  if (ranks) {
    s->ranks = calloc((size_t)cJSON_GetArraySize(ranks), sizeof *s->ranks);
    if (!s->ranks)
      return false;
    bool ranks_ok = true;
    int i = 0;
    for (const cJSON *e = ranks->child; e; e = e->next, i++) {
      ff_jobj_path(&o, "ranks", q, sizeof q);
      char r[FF_PATH_MAX];
      snprintf(r, sizeof r, "%s[%d]", q, i);
      /* Vocabulary rows belong on the first and last stage (where embedding and LM head must
       * be), whatever the stage's flags say: a wrong flag is reported once, above. */
      ranks_ok &= read_rank(c, e, r, index == 0 || index == n_stages - 1, &s->ranks[i]);
    }
    s->n_ranks = i;
    if (ranks_ok && ok)
      ranks_ok = check_stage_shards(c, p, s, index == 0 || index == n_stages - 1);
    ok &= ranks_ok;
  } else {
    ok = false;
  }
  ok &= read_predicted(&o, stage_pred_keys, &s->predicted);
  ff_jobj_close(&o);
  return ok;
}

static bool read_pipeline(plan_ctx *c, const cJSON *v, const char *p, ff_plan_pipeline *pl) {
  ff_jobj o;
  const ff_training *t = &c->plan->training;
  if (!ff_jobj_open(&o, c->d, v, p))
    return false;
  char q[FF_PATH_MAX];
  bool ok = ff_jobj_int(&o, "batch", true, 1, 1000000000, &pl->batch);
  bool mbs_ok = ff_jobj_int(&o, "micro_batch_size", true, 1, 65536, &pl->micro_batch_size);
  if (mbs_ok) {
    bool listed = false;
    for (int i = 0; i < t->n_micro_batch_sizes; i++)
      listed |= t->micro_batch_sizes[i] == pl->micro_batch_size;
    if (!listed) {
      char list[256];
      size_t j = 0;
      for (int i = 0; i < t->n_micro_batch_sizes && j < sizeof list; i++)
        j += (size_t)snprintf(list + j, sizeof list - j, "%s%lld", i ? ", " : "",
                              (long long)t->micro_batch_sizes[i]);
      ff_jobj_path(&o, "micro_batch_size", q, sizeof q);
      ff_diag_error(c->d, q, "%lld is not in inputs.training.micro_batch_sizes [%s]",
                    (long long)pl->micro_batch_size, list);
      mbs_ok = false;
    }
  }
  ok &= mbs_ok;
  ok &= ff_jobj_int(&o, "micro_batches", true, 1, 1000000000, &pl->micro_batches);
  if (ok && pl->micro_batch_size * pl->micro_batches != pl->batch) {
    ff_jobj_path(&o, "batch", q, sizeof q);
    ff_diag_error(c->d, q, "%lld is not micro_batch_size x micro_batches = %lld x %lld = %lld",
                  (long long)pl->batch, (long long)pl->micro_batch_size,
                  (long long)pl->micro_batches,
                  (long long)(pl->micro_batch_size * pl->micro_batches));
    ok = false;
  }
  const cJSON *stages = ff_jobj_array(&o, "stages", true, 1, PLAN_MAX_STAGES);
  if (stages) {
    int n = cJSON_GetArraySize(stages);
    pl->stages = calloc((size_t)n, sizeof *pl->stages);
    if (!pl->stages)
      return false;
    int64_t expect_first = 0;
    bool layers_ok = true;
    int i = 0;
    for (const cJSON *e = stages->child; e; e = e->next, i++) {
      ff_jobj_path(&o, "stages", q, sizeof q);
      char s[FF_PATH_MAX];
      snprintf(s, sizeof s, "%s[%d]", q, i);
      bool stage_ok = read_stage(c, e, s, i, n, &pl->stages[i]);
      pl->n_stages = i + 1;
      ok &= stage_ok;
      if (!stage_ok) {
        layers_ok = false;
        continue;
      }
      if (layers_ok && pl->stages[i].layers.first != expect_first) {
        ff_diag_error(c->d, s, "layers start at %lld, expected %lld (stages must hold contiguous "
                      "layer ranges in order)", (long long)pl->stages[i].layers.first,
                      (long long)expect_first);
        ok = layers_ok = false;
      }
      expect_first = pl->stages[i].layers.end;
    }
    if (layers_ok && expect_first != c->plan->model.layers) {
      ff_jobj_path(&o, "stages", q, sizeof q);
      ff_diag_error(c->d, q, "layers end at %lld, expected %lld (the model's layers)",
                    (long long)expect_first, (long long)c->plan->model.layers);
      ok = false;
    }
  } else {
    ok = false;
  }
  ok &= read_predicted(&o, pipe_pred_keys, &pl->predicted);
  ff_jobj_close(&o);
  return ok;
}

typedef struct gpu_use {
  int node, gpu;
  int64_t rank;
  int pipeline, stage, index;
} gpu_use;

static int cmp_gpu_use(const void *a, const void *b) {
  const gpu_use *x = a, *y = b;
  if (x->node != y->node)
    return x->node < y->node ? -1 : 1;
  if (x->gpu != y->gpu)
    return x->gpu < y->gpu ? -1 : 1;
  return x->rank < y->rank ? -1 : (x->rank > y->rank);
}

static bool check_gpus_unique(plan_ctx *c) {
  ff_plan *plan = c->plan;
  gpu_use *uses = malloc((size_t)(plan->n_ranks ? plan->n_ranks : 1) * sizeof *uses);
  if (!uses)
    return false;
  int64_t n = 0;
  for (int p = 0; p < plan->n_pipelines; p++)
    for (int s = 0; s < plan->pipelines[p].n_stages; s++)
      for (int r = 0; r < plan->pipelines[p].stages[s].n_ranks; r++) {
        const ff_plan_rank *rk = &plan->pipelines[p].stages[s].ranks[r];
        uses[n++] = (gpu_use){rk->node, rk->gpu, rk->rank, p, s, r};
      }
  qsort(uses, (size_t)n, sizeof *uses, cmp_gpu_use);
  bool ok = true;
  for (int64_t i = 1; i < n && ok; i++) {
    if (uses[i].node == uses[i - 1].node && uses[i].gpu == uses[i - 1].gpu) {
      char q[FF_PATH_MAX];
      snprintf(q, sizeof q, "pipelines[%d].stages[%d].ranks[%d].gpu", uses[i].pipeline,
               uses[i].stage, uses[i].index);
      ff_diag_error(c->d, q, "node \"%s\" gpu %d is already used by rank %lld (every GPU at most "
                    "once)", plan->cluster.nodes[uses[i].node].name, uses[i].gpu,
                    (long long)uses[i - 1].rank);
      ok = false;
    }
  }
  free(uses);
  return ok;
}

/* ---- search record ---------------------------------------------------------------------- */

static bool read_search(ff_jobj *top, ff_diag *d, ff_plan *plan) {
  const cJSON *v = ff_jobj_get(top, "search", false);
  if (!v)
    return true;
  ff_jobj o;
  if (!ff_jobj_open(&o, d, v, "search"))
    return false;
  plan->has_search = true;
  ff_plan_search *s = &plan->search;
  bool ok = ff_jobj_text(&o, "planner", true, 256, &s->planner);
  if (ff_jobj_get(&o, "candidates", false))
    ok &= s->has_candidates = ff_jobj_int(&o, "candidates", false, 0, INT64_C(1) << 53,
                                          &s->candidates);
  if (ff_jobj_get(&o, "lower_bound_seconds", false))
    ok &= s->has_lower_bound = ff_jobj_num(&o, "lower_bound_seconds", false,
                                           FF_CLOSED(0, 1e300), &s->lower_bound_seconds);
  if (ff_jobj_get(&o, "gap", false))
    ok &= s->has_gap = ff_jobj_num(&o, "gap", false, FF_CLOSED(0, 1e300), &s->gap);
  const cJSON *ov = ff_jobj_get(&o, "origin", false);
  if (ov) {
    ff_jobj oo;
    if (ff_jobj_open(&oo, d, ov, "search.origin")) {
      int ilp = 0;
      bool got = ff_jobj_text(&oo, "layout", true, 256, &s->layout);
      got &= ff_jobj_text(&oo, "node_order", true, 256, &s->node_order);
      got &= ff_jobj_enum(&oo, "integer_program", true, ff_plan_ilp_names, &ilp);
      got &= ff_jobj_int(&oo, "local_moves", true, 0, INT64_C(1) << 53, &s->local_moves);
      s->ilp = (ff_plan_ilp)ilp;
      s->has_origin = got;
      ok &= got;
      ff_jobj_close(&oo);
    } else {
      ok = false;
    }
  }
  const cJSON *arr = ff_jobj_array(&o, "runner_ups", false, 0, 1000);
  if (arr) {
    int n = cJSON_GetArraySize(arr);
    s->runner_ups = calloc((size_t)n ? (size_t)n : 1, sizeof *s->runner_ups);
    if (!s->runner_ups)
      return false;
    int i = 0;
    for (const cJSON *e = arr->child; e; e = e->next, i++) {
      char p[FF_PATH_MAX];
      snprintf(p, sizeof p, "search.runner_ups[%d]", i);
      s->n_runner_ups = i + 1;
      ff_jobj ro;
      if (!ff_jobj_open(&ro, d, e, p)) {
        ok = false;
        continue;
      }
      ok &= ff_jobj_num(&ro, "iteration_seconds", true, FF_CLOSED(0, 1e300),
                        &s->runner_ups[i].iteration_seconds);
      ok &= ff_jobj_text(&ro, "summary", true, 4096, &s->runner_ups[i].summary);
      ff_jobj_close(&ro);
    }
  } else if (ff_jobj_get(&o, "runner_ups", false)) {
    ok = false;
  }
  ff_jobj_close(&o);
  return ok;
}

/* ---- the plan --------------------------------------------------------------------------- */

ff_status ff_plan_from_json(const cJSON *v, const char *base_dir, ff_diag *d, ff_plan *out) {
  memset(out, 0, sizeof *out);
  int errors_before = d->errors;
  ff_jobj o;
  if (!ff_jobj_open(&o, d, v, ""))
    return FF_ERR_INPUT;
  bool ok = ff_format_key(&o, FF_FORMAT_PLAN, false);
  if (ff_jobj_get(&o, "name", false))
    ok &= out->has_name = ff_jobj_name(&o, "name", false, out->name);
  const cJSON *inputs = ff_jobj_get(&o, "inputs", true);
  bool inputs_ok = false;
  if (inputs) {
    ff_jobj io;
    if (ff_jobj_open(&io, d, inputs, "inputs")) {
      bool model_ok = read_input(&io, "model", base_dir, d, FF_FORMAT_MODEL, &out->model);
      bool training_ok =
          read_input(&io, "training", base_dir, d, FF_FORMAT_TRAINING, &out->training);
      bool cluster_ok = read_input(&io, "cluster", base_dir, d, FF_FORMAT_CLUSTER, &out->cluster);
      bool digests_ok = read_digests(&io, d, out, model_ok && training_ok && cluster_ok);
      ff_jobj_close(&io);
      inputs_ok = model_ok && training_ok && cluster_ok && digests_ok;
    }
  }
  ok &= inputs_ok;
  const cJSON *pipelines = ff_jobj_array(&o, "pipelines", true, 1, PLAN_MAX_PIPELINES);
  if (pipelines && inputs_ok) {
    plan_ctx c = {d, out, 0};
    int n = cJSON_GetArraySize(pipelines);
    out->pipelines = calloc((size_t)n, sizeof *out->pipelines);
    if (!out->pipelines) {
      ff_plan_free(out);
      return FF_ERR_RUNTIME;
    }
    int64_t batch_sum = 0;
    bool pipes_ok = true;
    int i = 0;
    for (const cJSON *e = pipelines->child; e; e = e->next, i++) {
      char p[FF_PATH_MAX];
      snprintf(p, sizeof p, "pipelines[%d]", i);
      pipes_ok &= read_pipeline(&c, e, p, &out->pipelines[i]);
      out->n_pipelines = i + 1;
      batch_sum += out->pipelines[i].batch;
    }
    out->n_ranks = c.next_rank;
    if (pipes_ok && batch_sum != out->training.global_batch) {
      ff_diag_error(d, "pipelines", "batches add up to %lld, expected inputs.training."
                    "global_batch = %lld", (long long)batch_sum,
                    (long long)out->training.global_batch);
      pipes_ok = false;
    }
    if (pipes_ok)
      pipes_ok = check_gpus_unique(&c);
    ok &= pipes_ok;
  } else {
    ok = false;
  }
  ok &= read_predicted(&o, plan_pred_keys, &out->predicted);
  ok &= read_search(&o, d, out);
  ff_jobj_close(&o);
  if (!ok || d->errors > errors_before) {
    ff_plan_free(out);
    return FF_ERR_INPUT;
  }
  return FF_OK;
}

static cJSON *span_json(ff_span s) {
  cJSON *a = cJSON_CreateArray();
  cJSON_AddItemToArray(a, cJSON_CreateNumber((double)s.first));
  cJSON_AddItemToArray(a, cJSON_CreateNumber((double)s.end));
  return a;
}

static cJSON *rank_json(const ff_plan *plan, const ff_plan_stage *s, const ff_plan_rank *r) {
  cJSON *e = cJSON_CreateObject();
  cJSON_AddNumberToObject(e, "rank", (double)r->rank);
  cJSON_AddStringToObject(e, "node", plan->cluster.nodes[r->node].name);
  cJSON_AddNumberToObject(e, "gpu", r->gpu);
  cJSON_AddStringToObject(e, "device", plan->cluster.devices[r->device].name);
  cJSON_AddItemToObject(e, "heads", span_json(r->heads));
  cJSON_AddItemToObject(e, "kv_heads", span_json(r->kv_heads));
  cJSON_AddItemToObject(e, "ffn", span_json(r->ffn));
  if (s->embedding || s->lm_head)
    cJSON_AddItemToObject(e, "vocab", span_json(r->vocab));
  if (r->has_memory)
    cJSON_AddNumberToObject(e, "memory_gib", r->memory_gib);
  return e;
}

cJSON *ff_plan_to_json(const ff_plan *plan) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "format", ff_format_ids[FF_FORMAT_PLAN]);
  if (plan->has_name)
    cJSON_AddStringToObject(o, "name", plan->name);
  cJSON *inputs = cJSON_AddObjectToObject(o, "inputs");
  cJSON *model = ff_model_to_json(&plan->model, false);
  cJSON *training = ff_training_to_json(&plan->training, false);
  cJSON *cluster = ff_cluster_to_json(&plan->cluster, false, true);
  char dm[32], dt[32], dc[32];
  ff_digest_json(model, dm);
  ff_digest_json(training, dt);
  ff_digest_json(cluster, dc);
  cJSON_AddItemToObject(inputs, "model", model);
  cJSON_AddItemToObject(inputs, "training", training);
  cJSON_AddItemToObject(inputs, "cluster", cluster);
  cJSON *digests = cJSON_AddObjectToObject(inputs, "digests");
  cJSON_AddStringToObject(digests, "model", dm);
  cJSON_AddStringToObject(digests, "training", dt);
  cJSON_AddStringToObject(digests, "cluster", dc);
  cJSON *pipes = cJSON_AddArrayToObject(o, "pipelines");
  for (int p = 0; p < plan->n_pipelines; p++) {
    const ff_plan_pipeline *pl = &plan->pipelines[p];
    cJSON *pe = cJSON_CreateObject();
    cJSON_AddNumberToObject(pe, "batch", (double)pl->batch);
    cJSON_AddNumberToObject(pe, "micro_batch_size", (double)pl->micro_batch_size);
    cJSON_AddNumberToObject(pe, "micro_batches", (double)pl->micro_batches);
    cJSON *stages = cJSON_AddArrayToObject(pe, "stages");
    for (int s = 0; s < pl->n_stages; s++) {
      const ff_plan_stage *st = &pl->stages[s];
      cJSON *se = cJSON_CreateObject();
      cJSON_AddItemToObject(se, "layers", span_json(st->layers));
      cJSON_AddBoolToObject(se, "embedding", st->embedding);
      cJSON_AddBoolToObject(se, "lm_head", st->lm_head);
      cJSON_AddStringToObject(se, "recompute", ff_recompute_names[st->recompute]);
      cJSON *ranks = cJSON_AddArrayToObject(se, "ranks");
      for (int r = 0; r < st->n_ranks; r++)
        cJSON_AddItemToArray(ranks, rank_json(plan, st, &st->ranks[r]));
      write_predicted(se, stage_pred_keys, &st->predicted);
      cJSON_AddItemToArray(stages, se);
    }
    write_predicted(pe, pipe_pred_keys, &pl->predicted);
    cJSON_AddItemToArray(pipes, pe);
  }
  write_predicted(o, plan_pred_keys, &plan->predicted);
  if (plan->has_search) {
    const ff_plan_search *s = &plan->search;
    cJSON *se = cJSON_AddObjectToObject(o, "search");
    cJSON_AddStringToObject(se, "planner", s->planner ? s->planner : "");
    if (s->has_candidates)
      cJSON_AddNumberToObject(se, "candidates", (double)s->candidates);
    if (s->has_lower_bound)
      cJSON_AddNumberToObject(se, "lower_bound_seconds", s->lower_bound_seconds);
    if (s->has_gap)
      cJSON_AddNumberToObject(se, "gap", s->gap);
    if (s->has_origin) {
      cJSON *og = cJSON_AddObjectToObject(se, "origin");
      cJSON_AddStringToObject(og, "layout", s->layout ? s->layout : "");
      cJSON_AddStringToObject(og, "node_order", s->node_order ? s->node_order : "");
      cJSON_AddStringToObject(og, "integer_program", ff_plan_ilp_names[s->ilp]);
      cJSON_AddNumberToObject(og, "local_moves", (double)s->local_moves);
    }
    cJSON *ru = cJSON_AddArrayToObject(se, "runner_ups");
    for (int i = 0; i < s->n_runner_ups; i++) {
      cJSON *e = cJSON_CreateObject();
      cJSON_AddNumberToObject(e, "iteration_seconds", s->runner_ups[i].iteration_seconds);
      cJSON_AddStringToObject(e, "summary", s->runner_ups[i].summary ? s->runner_ups[i].summary : "");
      cJSON_AddItemToArray(ru, e);
    }
  }
  return o;
}

void ff_plan_free(ff_plan *p) {
  ff_model_free(&p->model);
  ff_training_free(&p->training);
  ff_cluster_free(&p->cluster);
  for (int i = 0; i < p->n_pipelines; i++) {
    for (int s = 0; s < p->pipelines[i].n_stages; s++)
      free(p->pipelines[i].stages[s].ranks);
    free(p->pipelines[i].stages);
  }
  free(p->pipelines);
  free(p->search.planner);
  free(p->search.layout);
  free(p->search.node_order);
  for (int i = 0; i < p->search.n_runner_ups; i++)
    free(p->search.runner_ups[i].summary);
  free(p->search.runner_ups);
  memset(p, 0, sizeof *p);
}

bool ff_plan_find_rank(const ff_plan *plan, int64_t rank, int *pipeline, int *stage, int *tp) {
  for (int p = 0; p < plan->n_pipelines; p++)
    for (int s = 0; s < plan->pipelines[p].n_stages; s++)
      for (int t = 0; t < plan->pipelines[p].stages[s].n_ranks; t++)
        if (plan->pipelines[p].stages[s].ranks[t].rank == rank) {
          if (pipeline)
            *pipeline = p;
          if (stage)
            *stage = s;
          if (tp)
            *tp = t;
          return true;
        }
  return false;
}
