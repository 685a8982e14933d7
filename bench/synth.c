/* synth.c — synthetic clusters and plans for the benchmarks; see synth.h for what they hold. */
#define _POSIX_C_SOURCE 200809L
#include "synth.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef FF_BENCH_PROFILES_DIR
#define FF_BENCH_PROFILES_DIR "profiles"
#endif

const char *const synth_mix_names[] = {"node", "rack", NULL};

const char *synth_profiles_dir(void) { return FF_BENCH_PROFILES_DIR; }

/* The four device types, in device_types order, with their nodes' links. */
typedef struct synth_type {
  const char *file;  /* under PROFILES/devices/ */
  const char *name;  /* the profile's "name", checked after loading */
  const char *label; /* node name prefix */
  int island_gpus;   /* 8: the node is one NVLink island; 1: no NVLink */
  ff_link link;      /* island link (NVLink) or intra link (PCIe through the host) */
  const char *words; /* for the description */
} synth_type;

static const synth_type types[SYNTH_DEVICE_TYPES] = {
    {"h100-sxm5.json", "H100-SXM5-80GB", "h100", 8, {450, 2},
     "H100 SXM5 80GB nodes are one NVLink 4 island through NVSwitch (450 GB/s per direction, 2 us)"},
    {"a100-sxm4-80gb.json", "A100-SXM4-80GB", "a100", 8, {300, 3},
     "A100 SXM4 80GB nodes are one NVLink 3 island through NVSwitch (300 GB/s per direction, 3 us)"},
    {"l40s.json", "L40S", "l40s", 1, {25, 10},
     "L40S nodes have no NVLink (island_gpus 1): PCIe 4.0 through the host, 25 GB/s per direction, "
     "10 us"},
    {"rtx-4090.json", "RTX-4090", "rtx4090", 1, {20, 10},
     "RTX 4090 nodes have no NVLink (island_gpus 1): PCIe 4.0 through the host, 20 GB/s per "
     "direction, 10 us"},
};

static const ff_link rack_link = {25, 5};       /* 200 Gbit/s InfiniBand inside a rack */
static const ff_link default_link = {12.5, 20}; /* 100 Gbit/s Ethernet between racks */

/* ---- deterministic shuffling -------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *state) {
  uint64_t z = (*state += UINT64_C(0x9E3779B97F4A7C15));
  z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
  z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
  return z ^ (z >> 31);
}

/* Uniform in [0, n) without modulo bias. */
static uint64_t below(uint64_t *state, uint64_t n) {
  uint64_t limit = UINT64_MAX - UINT64_MAX % n, x;
  do
    x = splitmix64(state);
  while (x >= limit);
  return x % n;
}

/* ---- the cluster ------------------------------------------------------------------------- */

static const ff_cluster *sort_cluster; /* qsort has no context argument */

static int cmp_node_name(const void *a, const void *b) {
  return strcmp(sort_cluster->nodes[*(const int *)a].name,
                sort_cluster->nodes[*(const int *)b].name);
}

static int digits(int64_t n) {
  int k = 1;
  while (n >= 10) {
    n /= 10;
    k++;
  }
  return k;
}

static ff_status load_types(const char *dir, ff_diag *d, ff_cluster *c) {
  c->devices = calloc(SYNTH_DEVICE_TYPES, sizeof *c->devices);
  if (!c->devices)
    return FF_ERR_RUNTIME;
  for (int t = 0; t < SYNTH_DEVICE_TYPES; t++) {
    char *devdir = ff_path_join(dir, "devices");
    char *file = devdir ? ff_path_join(devdir, types[t].file) : NULL;
    free(devdir);
    if (!file)
      return FF_ERR_RUNTIME;
    ff_status st = ff_load_device(file, d, &c->devices[t]);
    c->n_devices = t + 1;
    if (st == FF_OK && strcmp(c->devices[t].name, types[t].name) != 0) {
      ff_diag_error(d, "name", "device profile %s is named \"%s\", expected \"%s\"", file,
                    c->devices[t].name, types[t].name);
      st = FF_ERR_INPUT;
    }
    free(file);
    if (st != FF_OK)
      return st;
  }
  return FF_OK;
}

ff_status synth_cluster(const synth_options *opt, ff_diag *d, ff_cluster *out) {
  memset(out, 0, sizeof *out);
  if (opt->gpus < 1 || opt->gpus > SYNTH_MAX_GPUS) {
    ff_diag_error(d, NULL, "--gpus %lld is out of range [1, %lld]", (long long)opt->gpus,
                  (long long)SYNTH_MAX_GPUS);
    return FF_ERR_INPUT;
  }
  ff_cluster *c = out;
  int n_nodes = (int)((opt->gpus + SYNTH_GPUS_PER_NODE - 1) / SYNTH_GPUS_PER_NODE);
  int n_racks = (n_nodes + SYNTH_NODES_PER_RACK - 1) / SYNTH_NODES_PER_RACK;
  int units = opt->mix == SYNTH_MIX_RACK ? n_racks : n_nodes;
  int *unit_type = malloc((size_t)units * sizeof *unit_type);
  ff_status st = FF_ERR_RUNTIME;
  if (!unit_type)
    goto fail;
  /* Deal the types evenly, then shuffle: balanced counts, seed-dependent placement. */
  uint64_t rng = opt->seed;
  for (int u = 0; u < units; u++)
    unit_type[u] = u % SYNTH_DEVICE_TYPES;
  for (int u = units - 1; u > 0; u--) {
    int j = (int)below(&rng, (uint64_t)u + 1);
    int tmp = unit_type[u];
    unit_type[u] = unit_type[j];
    unit_type[j] = tmp;
  }

  if (opt->name) {
    if (!ff_name_valid(opt->name)) {
      ff_diag_error(d, NULL, "--name \"%s\" is not a valid name (1 to 64 of A-Z a-z 0-9 . _ -)",
                    opt->name);
      st = FF_ERR_INPUT;
      goto fail;
    }
    snprintf(c->name, sizeof c->name, "%s", opt->name);
  } else {
    snprintf(c->name, sizeof c->name, "synth-%lld-s%llu", (long long)opt->gpus,
             (unsigned long long)opt->seed);
  }
  st = load_types(opt->profiles_dir ? opt->profiles_dir : synth_profiles_dir(), d, c);
  if (st != FF_OK)
    goto fail;
  st = FF_ERR_RUNTIME;

  c->nodes = calloc((size_t)n_nodes, sizeof *c->nodes);
  c->node_by_name = malloc((size_t)n_nodes * sizeof *c->node_by_name);
  if (!c->nodes || !c->node_by_name)
    goto fail;
  int width = digits(n_nodes - 1) < 3 ? 3 : digits(n_nodes - 1);
  int count[SYNTH_DEVICE_TYPES] = {0};
  for (int i = 0; i < n_nodes; i++) {
    ff_node *n = &c->nodes[i];
    int t = unit_type[opt->mix == SYNTH_MIX_RACK ? i / SYNTH_NODES_PER_RACK : i];
    int64_t left = opt->gpus - (int64_t)i * SYNTH_GPUS_PER_NODE;
    snprintf(n->name, sizeof n->name, "%s-%0*d", types[t].label, width, i);
    n->device = t;
    n->gpus = left < SYNTH_GPUS_PER_NODE ? (int)left : SYNTH_GPUS_PER_NODE;
    n->group = -1;
    n->nics = 1;
    if (types[t].island_gpus > 1) {
      n->island_gpus = n->gpus; /* the whole node, also a smaller last node */
      if (n->island_gpus > 1)
        n->island = types[t].link;
    } else {
      n->island_gpus = 1;
      if (n->gpus > 1)
        n->intra = types[t].link;
    }
    c->node_by_name[i] = i;
    c->total_gpus += n->gpus;
    count[t] += n->gpus;
  }
  c->n_nodes = n_nodes;
  sort_cluster = c;
  qsort(c->node_by_name, (size_t)n_nodes, sizeof *c->node_by_name, cmp_node_name);
  sort_cluster = NULL;

  if (n_nodes > 1) {
    c->has_network = true;
    c->net_default = default_link;
    c->groups = calloc((size_t)n_racks, sizeof *c->groups);
    if (!c->groups)
      goto fail;
    int rack_width = digits(n_racks - 1) < 3 ? 3 : digits(n_racks - 1);
    for (int r = 0; r < n_racks; r++) {
      ff_net_group *g = &c->groups[r];
      int first = r * SYNTH_NODES_PER_RACK;
      int members = n_nodes - first < SYNTH_NODES_PER_RACK ? n_nodes - first : SYNTH_NODES_PER_RACK;
      snprintf(g->name, sizeof g->name, "rack-%0*d", rack_width, r);
      g->nodes = malloc((size_t)members * sizeof *g->nodes);
      c->n_groups = r + 1;
      if (!g->nodes)
        goto fail;
      for (int k = 0; k < members; k++) {
        g->nodes[k] = first + k;
        c->nodes[first + k].group = r;
      }
      g->n_nodes = members;
      g->link = rack_link;
    }
  }

  /* The link assumptions, in words. */
  ff_buf desc = {0};
  ff_buf_printf(&desc, "Synthetic cluster from bench/gen_cluster (seed %llu, types dealt per %s): "
                "%lld GPUs on %d nodes of %d", (unsigned long long)opt->seed,
                synth_mix_names[opt->mix], (long long)opt->gpus, n_nodes, SYNTH_GPUS_PER_NODE);
  if (opt->gpus % SYNTH_GPUS_PER_NODE)
    ff_buf_printf(&desc, " (the last node holds %d)", (int)(opt->gpus % SYNTH_GPUS_PER_NODE));
  ff_buf_puts(&desc, ": ");
  for (int t = 0; t < SYNTH_DEVICE_TYPES; t++)
    ff_buf_printf(&desc, "%s%d x %s", t ? ", " : "", count[t], types[t].name);
  ff_buf_puts(&desc, ". ");
  for (int t = 0; t < SYNTH_DEVICE_TYPES; t++)
    ff_buf_printf(&desc, "%s. ", types[t].words);
  ff_buf_printf(&desc, "Racks of %d consecutive nodes (groups rack-*) share 200 Gbit/s InfiniBand "
                "(25 GB/s per direction, 5 us); nodes in different racks use 100 Gbit/s Ethernet "
                "(12.5 GB/s per direction, 20 us).", SYNTH_NODES_PER_RACK);
  if (desc.failed || !desc.data) {
    ff_buf_free(&desc);
    goto fail;
  }
  c->description = desc.data; /* ff_buf_free would only free data */
  free(unit_type);
  return FF_OK;

fail:
  if (st == FF_ERR_RUNTIME)
    ff_diag_error(d, NULL, "out of memory building a cluster of %lld GPUs", (long long)opt->gpus);
  free(unit_type);
  ff_cluster_free(out);
  return st;
}

ff_status synth_cluster_check(const ff_cluster *c, ff_diag *d, ff_buf *text) {
  ff_buf first = {0}, second = {0};
  ff_cluster back;
  cJSON *tree = ff_cluster_to_json(c, true, true), *root = NULL;
  ff_status st = FF_ERR_RUNTIME;
  if (!tree)
    goto done;
  ff_json_write(tree, &first);
  if (first.failed)
    goto done;
  if (first.len > FF_JSON_MAX_BYTES) {
    ff_diag_error(d, NULL, "the cluster's file would be %.1f MiB, over the %u MiB that readers "
                  "accept; use fewer GPUs", (double)first.len / 1048576.0, FF_JSON_MAX_BYTES >> 20);
    st = FF_ERR_INPUT;
    goto done;
  }
  st = ff_json_parse(first.data, first.len, d, &root);
  if (st != FF_OK)
    goto done;
  st = ff_cluster_from_json(root, "", false, NULL, d, &back);
  if (st != FF_OK)
    goto done;
  cJSON_Delete(tree);
  tree = ff_cluster_to_json(&back, true, true);
  ff_cluster_free(&back);
  st = FF_ERR_RUNTIME;
  if (!tree)
    goto done;
  ff_json_write(tree, &second);
  if (second.failed)
    goto done;
  if (first.len != second.len || memcmp(first.data, second.data, first.len) != 0) {
    ff_diag_error(d, NULL, "the cluster does not read back to the same bytes");
    st = FF_ERR_RUNTIME;
    goto done;
  }
  st = FF_OK;
  if (text) {
    *text = first;
    first = (ff_buf){0};
  }
done:
  if (st == FF_ERR_RUNTIME && ff_diag_ok(d))
    ff_diag_error(d, NULL, "out of memory writing the cluster");
  cJSON_Delete(tree);
  cJSON_Delete(root);
  ff_buf_free(&first);
  ff_buf_free(&second);
  return st;
}

/* ---- the plan ---------------------------------------------------------------------------- */

/* Part k of `total` split into n nearly equal contiguous parts (the first total%n get one more). */
static ff_span split(int64_t total, int64_t n, int64_t k) {
  int64_t base = total / n, extra = total % n;
  int64_t first = k * base + (k < extra ? k : extra);
  return (ff_span){first, first + base + (k < extra ? 1 : 0)};
}

ff_status synth_plan(ff_cluster *cluster, const char *model_file, const char *training_file,
                     const synth_shape *sh, ff_diag *d, ff_plan *out) {
  memset(out, 0, sizeof *out);
  out->cluster = *cluster; /* moved: ff_plan_free frees it from now on */
  memset(cluster, 0, sizeof *cluster);
  ff_status st = ff_load_model(model_file, d, &out->model);
  if (st == FF_OK)
    st = ff_load_training(training_file, d, &out->training);
  if (st != FF_OK)
    goto fail;
  const ff_model *m = &out->model;
  ff_training *t = &out->training;
  const ff_cluster *c = &out->cluster;
  int64_t n_ranks = (int64_t)sh->pipelines * sh->stages * sh->tp;
  st = FF_ERR_INPUT;
  if (sh->pipelines < 1 || sh->stages < 1 || sh->tp < 1 || sh->micro_batches < 1) {
    ff_diag_error(d, NULL, "pipelines, stages, tp and micro_batches must be at least 1");
    goto fail;
  }
  if (SYNTH_GPUS_PER_NODE % sh->tp != 0) {
    ff_diag_error(d, NULL, "tp %d does not divide %d GPUs per node", sh->tp, SYNTH_GPUS_PER_NODE);
    goto fail;
  }
  if (n_ranks != c->total_gpus) {
    ff_diag_error(d, NULL, "%d pipelines x %d stages x tp %d = %lld ranks, but the cluster has "
                  "%lld GPUs", sh->pipelines, sh->stages, sh->tp, (long long)n_ranks,
                  (long long)c->total_gpus);
    goto fail;
  }
  if (sh->stages > m->layers || sh->tp > m->heads) {
    ff_diag_error(d, NULL, "%d stages over %lld layers, tp %d over %lld heads: too fine",
                  sh->stages, (long long)m->layers, sh->tp, (long long)m->heads);
    goto fail;
  }
  bool listed = false;
  for (int i = 0; i < t->n_micro_batch_sizes; i++)
    listed |= t->micro_batch_sizes[i] == sh->micro_batch_size;
  if (!listed) {
    ff_diag_error(d, NULL, "micro-batch size %lld is not one of %s's micro_batch_sizes",
                  (long long)sh->micro_batch_size, training_file);
    goto fail;
  }
  t->global_batch = (int64_t)sh->pipelines * sh->micro_batch_size * sh->micro_batches;
  if (t->global_batch > 1000000000) {
    ff_diag_error(d, NULL, "global batch %lld is over 10^9", (long long)t->global_batch);
    goto fail;
  }

  st = FF_ERR_RUNTIME;
  out->pipelines = calloc((size_t)sh->pipelines, sizeof *out->pipelines);
  if (!out->pipelines)
    goto fail;
  out->n_pipelines = sh->pipelines;
  int64_t group = m->heads / m->kv_heads, rank = 0;
  for (int p = 0; p < sh->pipelines; p++) {
    ff_plan_pipeline *pl = &out->pipelines[p];
    pl->micro_batch_size = sh->micro_batch_size;
    pl->micro_batches = sh->micro_batches;
    pl->batch = sh->micro_batch_size * sh->micro_batches;
    pl->stages = calloc((size_t)sh->stages, sizeof *pl->stages);
    if (!pl->stages)
      goto fail;
    pl->n_stages = sh->stages;
    for (int s = 0; s < sh->stages; s++) {
      ff_plan_stage *stage = &pl->stages[s];
      stage->layers = split(m->layers, sh->stages, s);
      stage->embedding = s == 0;
      stage->lm_head = s == sh->stages - 1;
      stage->recompute = FF_RECOMPUTE_SELECTIVE;
      stage->ranks = calloc((size_t)sh->tp, sizeof *stage->ranks);
      if (!stage->ranks)
        goto fail;
      stage->n_ranks = sh->tp;
      for (int k = 0; k < sh->tp; k++, rank++) {
        ff_plan_rank *r = &stage->ranks[k];
        r->rank = rank;
        r->node = (int)(rank / SYNTH_GPUS_PER_NODE);
        r->gpu = (int)(rank % SYNTH_GPUS_PER_NODE);
        r->device = c->nodes[r->node].device;
        r->heads = split(m->heads, sh->tp, k);
        r->kv_heads = (ff_span){r->heads.first / group, (r->heads.end + group - 1) / group};
        r->ffn = split(m->ffn_hidden, sh->tp, k);
        if (stage->embedding || stage->lm_head)
          r->vocab = split(m->vocab, sh->tp, k);
      }
    }
  }
  out->n_ranks = rank;
  return FF_OK;

fail:
  if (st == FF_ERR_RUNTIME)
    ff_diag_error(d, NULL, "out of memory building a plan of %lld ranks",
                  (long long)((int64_t)sh->pipelines * sh->stages * sh->tp));
  ff_plan_free(out);
  return st;
}

ff_status synth_plan_check(const ff_plan *plan, ff_diag *d, ff_plan *back_out, size_t *json_bytes) {
  ff_buf first = {0}, second = {0};
  ff_plan back;
  bool have_back = false;
  cJSON *tree = ff_plan_to_json(plan), *root = NULL;
  ff_status st = FF_ERR_RUNTIME;
  if (!tree)
    goto done;
  ff_json_write(tree, &first);
  if (first.failed)
    goto done;
  if (json_bytes)
    *json_bytes = first.len;
  if (first.len > FF_JSON_MAX_BYTES) {
    ff_diag_error(d, NULL, "the plan's file would be %.1f MiB, over the %u MiB that readers "
                  "accept", (double)first.len / 1048576.0, FF_JSON_MAX_BYTES >> 20);
    st = FF_ERR_INPUT;
    goto done;
  }
  st = ff_json_parse(first.data, first.len, d, &root);
  if (st != FF_OK)
    goto done;
  st = ff_plan_from_json(root, NULL, d, &back);
  if (st != FF_OK)
    goto done;
  have_back = true;
  cJSON_Delete(tree);
  tree = ff_plan_to_json(&back);
  st = FF_ERR_RUNTIME;
  if (!tree)
    goto done;
  ff_json_write(tree, &second);
  if (second.failed)
    goto done;
  if (first.len != second.len || memcmp(first.data, second.data, first.len) != 0) {
    ff_diag_error(d, NULL, "the plan does not read back to the same bytes");
    goto done;
  }
  st = FF_OK;
  if (back_out) {
    *back_out = back;
    have_back = false;
  }
done:
  if (st == FF_ERR_RUNTIME && ff_diag_ok(d))
    ff_diag_error(d, NULL, "out of memory writing the plan");
  if (have_back)
    ff_plan_free(&back);
  cJSON_Delete(tree);
  cJSON_Delete(root);
  ff_buf_free(&first);
  ff_buf_free(&second);
  return st;
}
