/* test_topology.c — the planner on cluster topologies, as a specification.
 *
 * 1. A plan depends on the links, not on how the cluster file writes them. Each cluster of
 *    tests/data/topology/ is rewritten in memory — nodes reversed or rotated, nodes renamed so that
 *    their sort order flips, network groups written out as per-pair overrides, overrides collapsed
 *    back into groups, all of it at once — and planned again: the predicted iteration time must
 *    agree within 0.1 % across the variants. Each variant's plan is also replayed on the cluster as
 *    written, which tells a different plan (the planner) from a different price (the cost model).
 * 2. On each cluster of at most 12 GPUs the planner is within 2 % of the optimum of its plan space
 *    (docs/planner.md, "The plan space"), which an exhaustive search finds.
 * 3. That search agrees with plain enumeration of every plan on tiny instances.
 *
 * The exhaustive search. A unit is a TP group of t GPUs of one node (t a power of two dividing the
 * node's GPU count, at most the heads, aligned); a plan is a set of disjoint units (other GPUs
 * idle) arranged into pipelines of ordered stages, a contiguous layer range per stage (end stages
 * may be empty, middle ones not, a lone stage holds all), micro-batches per pipeline (at least
 * one) summing to global_batch / micro_batch_size, one micro-batch size per plan, heads, FFN and
 * vocabulary split evenly, recompute as the training file says. A plan's time is what
 * ff_evaluate_plan says. Every plan is covered, up to symmetries that provably keep its time:
 *  - Inside a node, units are placed by what each NVLink island holds (the GPUs of an island are
 *    interchangeable, and so are its islands); nodes equal in device, GPU links and every link to
 *    every other node are interchangeable, and take their unit sets in non-decreasing order.
 *  - Units whose exchange maps every link (and same-node relation) among the chosen GPUs onto
 *    itself are twins: a stage takes the lowest free twin of its class, pipelines come in the
 *    order of their lowest unit, and pipelines that are twins stage by stage take their splits in
 *    one order. Pipelines are then an unordered set: exactly so where the chosen GPUs' links are
 *    an ultrametric (a ring's slowest link is then the same in any order); elsewhere every
 *    cyclic order of four or more pipelines is scored as well.
 * and a plan is skipped only when a lower bound shows it cannot beat the best plan found so far.
 * Pipelines see one another only through the data-parallel all-reduce (ZeRO-1 off) and through
 * the NICs of nodes they share (more flows, never faster links), and a plan's time is max over
 * pipelines (makespan, stage finish + DP all-reduce) + max optimizer step. Each pipeline is
 * scored alone (cached by what the cost model sees: devices, TP, links, which stages share a
 * node, layers and micro-batches), which gives its makespan, optimizer step, stage finishes and
 * gradient bytes, each no more than beside other pipelines; complete plans are scored whole.
 * The bounds are
 *  - max makespan + max optimizer step, and with several pipelines each stage's finish plus the
 *    least time its all-reduce can take: bytes over its fastest link (score_option), and, once
 *    the peer in another pipeline is known and the links are an ultrametric, over the link to
 *    that peer (pair_bound);
 *  - floors on a pipeline from the layer and LM-head times of its stages (option_floor), and on
 *    how many micro-batches the free units can still take (next_pipeline);
 *  - a look-ahead: the least time the free units can run their share in, as pipelines of their
 *    own (rest_bound).
 * Every plan scored in full asserts that the bound it passed holds, and every pipeline scored
 * asserts the floors, so a bound that the cost model stopped honouring fails the test instead of
 * pruning the optimum. The clusters are sized so that each search takes seconds on one core. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "ff_cost.h"
#include "search.h"

#define TOPOLOGY_DIR "tests/data/topology/"

typedef struct inputs {
  ff_cluster cluster;
  ff_model model;
  ff_training training;
} inputs;

static double seconds_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void load_cluster(const char *file, ff_cluster *out) {
  ff_diag d;
  ff_diag_init(&d, NULL);
  ff_status st = ff_load_cluster(file, &d, out);
  if (st != FF_OK)
    fprintf(stderr, "%s", ff_diag_text(&d));
  assert_int_equal(st, FF_OK);
  ff_diag_free(&d);
}

static void load(inputs *in, const char *cluster, const char *model, const char *training) {
  ff_diag d;
  ff_diag_init(&d, NULL);
  load_cluster(cluster, &in->cluster);
  assert_int_equal(ff_load_model(model, &d, &in->model), FF_OK);
  assert_int_equal(ff_load_training(training, &d, &in->training), FF_OK);
  ff_diag_free(&d);
}

static void unload(inputs *in) {
  ff_cluster_free(&in->cluster);
  ff_model_free(&in->model);
  ff_training_free(&in->training);
}

static double planned_seconds(const ff_cluster *c, const inputs *in, ff_search_result *res) {
  ff_search_opts opts;
  ff_search_opts_default(&opts);
  if (ff_search(c, &in->model, &in->training, &opts, res) != FF_OK)
    return INFINITY;
  return res->plan.predicted.value[FF_PLAN_PRED_ITERATION_SECONDS];
}

static bool same_link(ff_link a, ff_link b) {
  return a.bandwidth_gb_per_s == b.bandwidth_gb_per_s && a.latency_us == b.latency_us;
}

/* ---- one cluster, written in other words ------------------------------------------------- */

/* Renamed nodes carry this many prefix characters ("n07-"), stripped to find the original. */
#define RENAME_PREFIX 4

static cJSON *network_member(cJSON *tree, const char *key) {
  return cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(tree, "network"), key);
}

static void reverse_array(cJSON *array) {
  int n = cJSON_GetArraySize(array);
  cJSON *items[256];
  assert_true(n <= 256);
  for (int i = 0; i < n; i++)
    items[i] = cJSON_DetachItemFromArray(array, 0);
  for (int i = n - 1; i >= 0; i--)
    cJSON_AddItemToArray(array, items[i]);
}

static void rotate_array(cJSON *array, int by) {
  for (int i = 0; i < by; i++)
    cJSON_AddItemToArray(array, cJSON_DetachItemFromArray(array, 0));
}

/* Nodes, groups, their members and override pairs all in reverse order. */
static bool reverse_everything(cJSON *tree) {
  reverse_array(cJSON_GetObjectItemCaseSensitive(tree, "nodes"));
  cJSON *groups = network_member(tree, "groups"), *overrides = network_member(tree, "overrides"),
        *x;
  reverse_array(groups);
  cJSON_ArrayForEach(x, groups) reverse_array(cJSON_GetObjectItemCaseSensitive(x, "nodes"));
  reverse_array(overrides);
  cJSON_ArrayForEach(x, overrides) reverse_array(cJSON_GetObjectItemCaseSensitive(x, "nodes"));
  return true;
}

static bool rotate_nodes(cJSON *tree) {
  rotate_array(cJSON_GetObjectItemCaseSensitive(tree, "nodes"), 1);
  return true;
}

static int compare_strings(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Rename every member of `list` (objects with "name") so that the sort order flips: the k-th name
 * in sorted order gets the prefix of n − 1 − k. Returns how many, fills old[] and fresh[]. */
static int flip_names(cJSON *list, char old[][FF_NAME_MAX + 1], char fresh[][FF_NAME_MAX + 1]) {
  int n = cJSON_GetArraySize(list);
  const char *sorted[64];
  assert_true(n <= 64);
  for (int i = 0; i < n; i++)
    sorted[i] = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(list, i), "name")->valuestring;
  qsort(sorted, (size_t)n, sizeof *sorted, compare_strings);
  for (int k = 0; k < n; k++) {
    assert_true(strlen(sorted[k]) + RENAME_PREFIX <= FF_NAME_MAX);
    snprintf(old[k], FF_NAME_MAX + 1, "%s", sorted[k]);
    snprintf(fresh[k], FF_NAME_MAX + 1, "%c%02d-%s", 'n', n - 1 - k, sorted[k]);
  }
  for (int i = 0; i < n; i++) {
    cJSON *item = cJSON_GetArrayItem(list, i);
    const char *name = cJSON_GetObjectItemCaseSensitive(item, "name")->valuestring;
    for (int k = 0; k < n; k++)
      if (strcmp(old[k], name) == 0) {
        cJSON_ReplaceItemInObjectCaseSensitive(item, "name", cJSON_CreateString(fresh[k]));
        break;
      }
  }
  return n;
}

static void rename_references(cJSON *list, int n, char old[][FF_NAME_MAX + 1],
                              char fresh[][FF_NAME_MAX + 1]) {
  cJSON *item, *member;
  cJSON_ArrayForEach(item, list) {
    cJSON *names = cJSON_GetObjectItemCaseSensitive(item, "nodes");
    for (int i = 0; i < cJSON_GetArraySize(names); i++) {
      member = cJSON_GetArrayItem(names, i);
      for (int k = 0; k < n; k++)
        if (strcmp(old[k], member->valuestring) == 0) {
          cJSON_ReplaceItemInArray(names, i, cJSON_CreateString(fresh[k]));
          break;
        }
    }
  }
}

static bool rename_nodes_and_groups(cJSON *tree) {
  char old[64][FF_NAME_MAX + 1], fresh[64][FF_NAME_MAX + 1];
  int n = flip_names(cJSON_GetObjectItemCaseSensitive(tree, "nodes"), old, fresh);
  rename_references(network_member(tree, "groups"), n, old, fresh);
  rename_references(network_member(tree, "overrides"), n, old, fresh);
  flip_names(network_member(tree, "groups"), old, fresh);
  return true;
}

static cJSON *make_override(const char *a, const char *b, double bandwidth, double latency) {
  cJSON *o = cJSON_CreateObject();
  const char *pair[2] = {a, b};
  cJSON_AddItemToObject(o, "nodes", cJSON_CreateStringArray(pair, 2));
  cJSON_AddNumberToObject(o, "bandwidth_gb_per_s", bandwidth);
  cJSON_AddNumberToObject(o, "latency_us", latency);
  return o;
}

static bool has_override(cJSON *overrides, const char *a, const char *b) {
  cJSON *o;
  cJSON_ArrayForEach(o, overrides) {
    cJSON *pair = cJSON_GetObjectItemCaseSensitive(o, "nodes");
    const char *x = cJSON_GetArrayItem(pair, 0)->valuestring,
               *y = cJSON_GetArrayItem(pair, 1)->valuestring;
    if ((strcmp(x, a) == 0 && strcmp(y, b) == 0) || (strcmp(x, b) == 0 && strcmp(y, a) == 0))
      return true;
  }
  return false;
}

/* Every pair inside a group becomes an override with the group's link (pairs that already have
 * an override keep it: it took precedence); the groups go. */
static bool groups_as_overrides(cJSON *tree) {
  cJSON *groups = network_member(tree, "groups"), *overrides = network_member(tree, "overrides"),
        *g;
  if (cJSON_GetArraySize(groups) == 0)
    return false;
  cJSON_ArrayForEach(g, groups) {
    cJSON *names = cJSON_GetObjectItemCaseSensitive(g, "nodes");
    double bw = cJSON_GetObjectItemCaseSensitive(g, "bandwidth_gb_per_s")->valuedouble;
    double lat = cJSON_GetObjectItemCaseSensitive(g, "latency_us")->valuedouble;
    int n = cJSON_GetArraySize(names);
    for (int i = 0; i < n; i++)
      for (int j = i + 1; j < n; j++) {
        const char *a = cJSON_GetArrayItem(names, i)->valuestring;
        const char *b = cJSON_GetArrayItem(names, j)->valuestring;
        if (!has_override(overrides, a, b))
          cJSON_AddItemToArray(overrides, make_override(a, b, bw, lat));
      }
  }
  cJSON_ReplaceItemInObjectCaseSensitive(cJSON_GetObjectItemCaseSensitive(tree, "network"),
                                         "groups", cJSON_CreateArray());
  return true;
}

typedef struct override_view {
  int a, b;
  ff_link link;
} override_view;

static int node_index(cJSON *tree, const char *name) {
  int i = 0;
  cJSON *n;
  cJSON_ArrayForEach(n, cJSON_GetObjectItemCaseSensitive(tree, "nodes")) {
    if (strcmp(cJSON_GetObjectItemCaseSensitive(n, "name")->valuestring, name) == 0)
      return i;
    i++;
  }
  return -1;
}

static int find_root(int *parent, int x) {
  while (parent[x] != x)
    x = parent[x] = parent[parent[x]];
  return x;
}

/* Overrides that share one link and connect a set of ungrouped nodes each pair of which has an
 * override become a group with that link (the set's other overrides stay and still win). */
static bool overrides_as_groups(cJSON *tree) {
  cJSON *nodes = cJSON_GetObjectItemCaseSensitive(tree, "nodes");
  cJSON *groups = network_member(tree, "groups"), *overrides = network_member(tree, "overrides"),
        *x;
  int n = cJSON_GetArraySize(nodes), n_ov = 0, made = 0;
  bool grouped[64] = {false}, pair_covered[64][64];
  override_view ov[256];
  assert_true(n <= 64 && cJSON_GetArraySize(overrides) <= 256);
  memset(pair_covered, 0, sizeof pair_covered);
  cJSON_ArrayForEach(x, groups) {
    cJSON *m;
    cJSON_ArrayForEach(m, cJSON_GetObjectItemCaseSensitive(x, "nodes"))
        grouped[node_index(tree, m->valuestring)] = true;
  }
  cJSON_ArrayForEach(x, overrides) {
    cJSON *pair = cJSON_GetObjectItemCaseSensitive(x, "nodes");
    ov[n_ov] =
        (override_view){node_index(tree, cJSON_GetArrayItem(pair, 0)->valuestring),
                        node_index(tree, cJSON_GetArrayItem(pair, 1)->valuestring),
                        {cJSON_GetObjectItemCaseSensitive(x, "bandwidth_gb_per_s")->valuedouble,
                         cJSON_GetObjectItemCaseSensitive(x, "latency_us")->valuedouble}};
    pair_covered[ov[n_ov].a][ov[n_ov].b] = pair_covered[ov[n_ov].b][ov[n_ov].a] = true;
    n_ov++;
  }
  for (int o = 0; o < n_ov; o++) { /* each distinct link, in order of first appearance */
    int parent[64];
    for (int i = 0; i < n; i++)
      parent[i] = i;
    for (int k = 0; k < n_ov; k++)
      if (same_link(ov[k].link, ov[o].link) && !grouped[ov[k].a] && !grouped[ov[k].b])
        parent[find_root(parent, ov[k].a)] = find_root(parent, ov[k].b);
    for (int root = 0; root < n; root++) {
      int members[64], size = 0;
      for (int i = 0; i < n; i++)
        if (!grouped[i] && find_root(parent, i) == root)
          members[size++] = i;
      bool clique = size >= 2;
      for (int i = 0; i < size && clique; i++)
        for (int j = i + 1; j < size && clique; j++)
          clique = pair_covered[members[i]][members[j]];
      if (!clique)
        continue;
      cJSON *g = cJSON_CreateObject(), *names = cJSON_CreateArray();
      char name[32];
      snprintf(name, sizeof name, "collapsed-%d", made++);
      cJSON_AddStringToObject(g, "name", name);
      for (int i = 0; i < size; i++) {
        grouped[members[i]] = true;
        cJSON *node = cJSON_GetArrayItem(nodes, members[i]);
        cJSON_AddItemToArray(
            names, cJSON_CreateString(cJSON_GetObjectItemCaseSensitive(node, "name")->valuestring));
      }
      cJSON_AddItemToObject(g, "nodes", names);
      cJSON_AddNumberToObject(g, "bandwidth_gb_per_s", ov[o].link.bandwidth_gb_per_s);
      cJSON_AddNumberToObject(g, "latency_us", ov[o].link.latency_us);
      cJSON_AddItemToArray(groups, g);
      for (int k = n_ov - 1; k >= 0; k--) /* the group's own link needs no override any more */
        if (same_link(ov[k].link, ov[o].link) && grouped[ov[k].a] && grouped[ov[k].b] &&
            find_root(parent, ov[k].a) == root && find_root(parent, ov[k].b) == root) {
          cJSON_DeleteItemFromArray(overrides, k);
          ov[k].link.bandwidth_gb_per_s = -1; /* gone */
        }
      int kept = 0;
      for (int k = 0; k < n_ov; k++)
        if (ov[k].link.bandwidth_gb_per_s >= 0)
          ov[kept++] = ov[k];
      n_ov = kept;
      o = -1; /* the list changed: start over with the links left */
      break;
    }
  }
  return made > 0;
}

static bool groups_rebuilt(cJSON *tree) {
  return groups_as_overrides(tree) && overrides_as_groups(tree);
}

static bool all_at_once(cJSON *tree) {
  reverse_everything(tree);
  rename_nodes_and_groups(tree);
  groups_as_overrides(tree);
  return true;
}

typedef struct variant {
  const char *name;
  bool (*rewrite)(cJSON *tree); /* false: does not apply to this cluster */
  bool renames;
} variant;

static bool unchanged(cJSON *tree) {
  (void)tree;
  return true;
}

static const variant variants[] = {
    {"rewritten as is", unchanged, false},
    {"nodes reversed", reverse_everything, false},
    {"nodes rotated", rotate_nodes, false},
    {"names flipped", rename_nodes_and_groups, true},
    {"groups as overrides", groups_as_overrides, false},
    {"overrides as groups", overrides_as_groups, false},
    {"groups rebuilt", groups_rebuilt, false},
    {"all at once", all_at_once, true},
};

/* Read a tree as a cluster, as the loader reads a file (device types are inline). */
static void load_tree(const cJSON *tree, ff_cluster *out) {
  ff_diag d;
  ff_diag_init(&d, "rewritten cluster");
  ff_status st = ff_cluster_from_json(tree, "", false, NULL, &d, out);
  if (st != FF_OK)
    fprintf(stderr, "%s", ff_diag_text(&d));
  assert_int_equal(st, FF_OK);
  ff_diag_free(&d);
}

static const char *original_name(const char *name, bool renamed) {
  return renamed ? name + RENAME_PREFIX : name;
}

/* The variant's plan on the cluster as written: its ranks moved to the same nodes by name. */
static double replayed_on(const ff_cluster *base, ff_plan *plan, bool renamed) {
  for (int p = 0; p < plan->n_pipelines; p++)
    for (int s = 0; s < plan->pipelines[p].n_stages; s++) {
      ff_plan_stage *st = &plan->pipelines[p].stages[s];
      for (int r = 0; r < st->n_ranks; r++) {
        int node = ff_cluster_find_node(
            base, original_name(plan->cluster.nodes[st->ranks[r].node].name, renamed));
        assert_true(node >= 0);
        st->ranks[r].node = node;
        st->ranks[r].device = base->nodes[node].device;
      }
    }
  ff_cluster own = plan->cluster;
  plan->cluster = *base;
  ff_plan_eval e;
  assert_int_equal(ff_evaluate_plan(plan, &e), FF_OK);
  plan->cluster = own;
  double t = e.fits ? e.iteration_seconds : INFINITY;
  ff_plan_eval_free(&e);
  return t;
}

/* "a100-a:2 L0-3 | rtx-a:1 L3-6 x4; ..." — pipelines, stages (node:TP layers), micro-batches. */
static void describe_plan(const ff_plan *plan, bool renamed, char *out, size_t cap) {
  size_t len = 0;
  out[0] = '\0';
  for (int p = 0; p < plan->n_pipelines && len < cap; p++) {
    const ff_plan_pipeline *pl = &plan->pipelines[p];
    for (int s = 0; s < pl->n_stages && len < cap; s++) {
      const ff_plan_stage *st = &pl->stages[s];
      len += (size_t)snprintf(out + len, cap - len, "%s%s:%d/%d L%lld-%lld", s ? " | " : "",
                              original_name(plan->cluster.nodes[st->ranks[0].node].name, renamed),
                              st->ranks[0].gpu, st->n_ranks, (long long)st->layers.first,
                              (long long)st->layers.end);
    }
    if (len < cap)
      len +=
          (size_t)snprintf(out + len, cap - len, " x%lld(b%lld)%s", (long long)pl->micro_batches,
                           (long long)pl->micro_batch_size, p + 1 < plan->n_pipelines ? "; " : "");
  }
}

static void plans_do_not_depend_on_how_links_are_written(void **state) {
  const char *name = *state;
  char file[256];
  snprintf(file, sizeof file, TOPOLOGY_DIR "%s.json", name);
  inputs in;
  load(&in, file, TOPOLOGY_DIR "model.json", TOPOLOGY_DIR "training.json");
  ff_search_result res;
  double written = planned_seconds(&in.cluster, &in, &res), lo = written, hi = written;
  char text[1024];
  describe_plan(&res.plan, false, text, sizeof text);
  printf("%-22s %-20s %10.6f s                                     %s\n", name, "as written",
         written, text);
  ff_search_result_free(&res);
  assert_true(isfinite(written));
  for (size_t v = 0; v < sizeof variants / sizeof *variants; v++) {
    cJSON *tree = ff_cluster_to_json(&in.cluster, true, true);
    if (!variants[v].rewrite(tree)) {
      cJSON_Delete(tree);
      continue;
    }
    ff_cluster c;
    load_tree(tree, &c);
    cJSON_Delete(tree);
    double t = planned_seconds(&c, &in, &res);
    describe_plan(&res.plan, variants[v].renames, text, sizeof text);
    double replay =
        isfinite(t) ? replayed_on(&in.cluster, &res.plan, variants[v].renames) : INFINITY;
    printf("%-22s %-20s %10.6f s %+9.3f %% (replayed as written %10.6f s) %s\n", name,
           variants[v].name, t, 100 * (t / written - 1), replay, text);
    lo = t < lo ? t : lo;
    hi = t > hi ? t : hi;
    ff_search_result_free(&res);
    ff_cluster_free(&c);
  }
  printf("%-22s spread %.4f %%\n", name, 100 * (hi / lo - 1));
  unload(&in);
  assert_true(hi <= lo * 1.001);
}

/* ---- the exhaustive search (see the top of the file) ----------------------------------------- */

enum {
  BF_MAX_UNITS = 16,  /* units chosen at once: at most the GPUs */
  BF_MAX_STAGES = 10, /* layers + 2 */
  BF_MAX_GPUS = 16,
  BF_MAX_TP = 8,
  BF_MAX_LINKS = 64,
  BF_MAX_TYPES = 128,
  BF_MAX_NODES = 16,
  BF_MAX_TILINGS = 1024,
  BF_KEY = 2 + 3 * BF_MAX_STAGES,
};

typedef struct bf_unit {
  int node, first_gpu, tp;
  int type;       /* what the cost model sees of it (bf_type) */
  unsigned twins; /* bit mask of its twin class in the current unit set */
} bf_unit;

struct bf_option;

typedef struct bf_pipe {
  int n_stages;
  int unit[BF_MAX_STAGES];
  int64_t layers[BF_MAX_STAGES];
  int64_t micro_batches;
  const struct bf_option *option; /* what it was scored as, alone */
} bf_pipe;

typedef struct bf_type {
  int device, tp;
  uint8_t links[BF_MAX_TP * BF_MAX_TP]; /* link ids among its GPUs */
  double best_gpu_gb_per_s;             /* the fastest link of its GPUs to any other GPU */
  double best_node_gb_per_s; /* the fastest link of its node to any other node (0: one node) */
  double layer_seconds[FF_MAX_MICRO_BATCH_SIZES]; /* per micro-batch size: see layer_seconds() */
  double head_seconds[FF_MAX_MICRO_BATCH_SIZES];  /* the LM head's forward and backward */
} bf_type;

/* One way to run a sequence of units as a pipeline: a layer split and a micro-batch count. */
typedef struct bf_option {
  double seconds;           /* its makespan, alone */
  double seconds_dp;        /* a lower bound on makespan + DP tail beside other pipelines */
  double optimizer_seconds; /* its slowest optimizer step */
  uint16_t comp;            /* index into the layer compositions */
  uint8_t micro_batches;
  double pair_most;                    /* what pair_bound() can return for it at most */
  float finish_seconds[BF_MAX_STAGES]; /* when each stage ends its last backward (rounded down) */
  float dp_bytes[BF_MAX_STAGES]; /* gradient bytes of each stage's first rank (rounded down) */
} bf_option;

typedef struct bf_sequence { /* the options of a sequence of units, keyed by what the model sees */
  uint8_t key[BF_KEY];
  bool used;
  int n;
  bf_option *alone;  /* by micro-batches, then seconds + optimizer: the plan's only pipeline */
  bf_option *shared; /* by micro-batches, then seconds_dp + optimizer: one of several */
  int *with_m;       /* the options with m micro-batches are [with_m[m], with_m[m + 1]) */
} bf_sequence;

/* A sequence of free units that has options, as the search meets it from one free set. */
typedef struct bf_candidate {
  int n_stages;
  uint8_t unit[BF_MAX_STAGES];
  unsigned members;
  bf_sequence options;
} bf_candidate;

typedef struct bf_candidates {
  bool built;
  int n, cap;
  bf_candidate *list;
} bf_candidates;

typedef struct bf_bound { /* of a partial plan: each the largest over its pipelines */
  double seconds, seconds_dp, optimizer;
} bf_bound;

typedef struct bf_tiling { /* the units of one node */
  int n;
  int first_gpu[BF_MAX_GPUS], tp[BF_MAX_GPUS];
} bf_tiling;

typedef struct bf_search {
  const inputs *in;
  ff_link links[BF_MAX_LINKS];
  int n_links;
  bf_type types[BF_MAX_TYPES];
  int n_types;
  int64_t *comps[BF_MAX_STAGES + 1]; /* layer compositions per stage count, n_comps[k] × k */
  int n_comps[BF_MAX_STAGES + 1];
  int max_stages;
  int largest_node_gpus;
  double slowest_pair_gb_per_s; /* the least bandwidth pair_bound() may use */
  /* the current unit set and partial plan */
  bf_unit units[BF_MAX_UNITS];
  int n_units;
  unsigned all, used;
  bool order_matters; /* its links are no ultrametric: a ring's slowest link depends on order */
  double layers_per_second[BF_MAX_UNITS];       /* 1 / (forward + backward of one layer) per unit */
  uint8_t boundary[BF_MAX_UNITS][BF_MAX_UNITS]; /* link id between units' first GPUs */
  int mbs_index;
  int64_t mbs;
  bf_pipe pipes[BF_MAX_UNITS];
  int n_pipes;
  /* the best plan */
  double best;
  bf_unit best_units[BF_MAX_UNITS];
  bf_pipe best_pipes[BF_MAX_UNITS];
  int best_n_pipes;
  int64_t best_mbs;
  /* per free set of the current unit set: the sequences from it with the lowest free unit */
  bf_candidates *candidates;
  size_t n_candidate_sets;
  /* rest_bound() per (free units, micro-batches left) of the current unit set; NAN: not yet */
  double *rest_memo;
  int64_t rest_stride;
  /* options of the sequences met so far, by key (open addressing) */
  bf_sequence *seqs;
  size_t seqs_cap, seqs_used;
  /* counters */
  int64_t unit_sets, search_nodes, pieces_scored, pieces_too_big, sequence_hits, plans_scored,
      orders_scored;
  bool any_order_matters;
} bf_search;

static int link_id(bf_search *s, ff_link l) {
  for (int i = 0; i < s->n_links; i++)
    if (same_link(s->links[i], l))
      return i;
  assert_true(s->n_links < BF_MAX_LINKS);
  s->links[s->n_links] = l;
  return s->n_links++;
}

static double layer_seconds(const bf_search *s, const bf_unit *u, int64_t mbs);
static double head_seconds(const bf_search *s, const bf_unit *u, int64_t mbs);

static int type_id(bf_search *s, int node, int first_gpu, int tp) {
  const ff_cluster *c = &s->in->cluster;
  bf_type t;
  memset(&t, 0, sizeof t);
  t.device = c->nodes[node].device;
  t.tp = tp;
  for (int i = 0; i < tp; i++)
    for (int j = 0; j < tp; j++)
      if (i != j)
        t.links[i * BF_MAX_TP + j] =
            (uint8_t)link_id(s, ff_cluster_gpu_link(c, node, first_gpu + i, node, first_gpu + j));
  for (int n = 0; n < c->n_nodes; n++) {
    for (int i = 0; i < tp; i++)
      for (int g = 0; g < c->nodes[n].gpus; g++)
        if (n != node || g != first_gpu + i) {
          double bw = ff_cluster_gpu_link(c, node, first_gpu + i, n, g).bandwidth_gb_per_s;
          t.best_gpu_gb_per_s = bw > t.best_gpu_gb_per_s ? bw : t.best_gpu_gb_per_s;
        }
    if (n != node && ff_cluster_node_link(c, node, n).bandwidth_gb_per_s > t.best_node_gb_per_s)
      t.best_node_gb_per_s = ff_cluster_node_link(c, node, n).bandwidth_gb_per_s;
  }
  const bf_unit unit = {node, first_gpu, tp, 0, 0};
  for (int i = 0; i < s->in->training.n_micro_batch_sizes; i++) {
    t.layer_seconds[i] = layer_seconds(s, &unit, s->in->training.micro_batch_sizes[i]);
    t.head_seconds[i] = head_seconds(s, &unit, s->in->training.micro_batch_sizes[i]);
  }
  for (int i = 0; i < s->n_types; i++)
    if (memcmp(&s->types[i], &t, sizeof t) == 0)
      return i;
  assert_true(s->n_types < BF_MAX_TYPES);
  s->types[s->n_types] = t;
  return s->n_types++;
}

static ff_span even(int64_t total, int parts, int i) {
  int64_t base = total / parts, extra = total % parts;
  int64_t first = i * base + (i < extra ? i : extra);
  return (ff_span){first, first + base + (i < extra ? 1 : 0)};
}

/* A plan built from the search's terms, borrowing the inputs. */
typedef struct bf_plan {
  ff_plan plan;
  ff_plan_pipeline pipelines[BF_MAX_UNITS];
  ff_plan_stage stages[BF_MAX_UNITS];
  ff_plan_rank ranks[BF_MAX_GPUS];
} bf_plan;

/* Pipelines pipes[order[0..n)] built from `units`, ranks pipeline-major, shards as even as the
 * counts allow (the first ranks one larger), kv heads as the query heads need them. */
static void build_plan(const inputs *in, const bf_unit *units, const bf_pipe *pipes,
                       const int *order, int n_pipes, int64_t mbs, bf_plan *out) {
  memset(out, 0, sizeof *out);
  ff_plan *p = &out->plan;
  p->model = in->model;
  p->training = in->training;
  p->cluster = in->cluster;
  p->pipelines = out->pipelines;
  p->n_pipelines = n_pipes;
  int s = 0, r = 0;
  int64_t g = in->model.heads / in->model.kv_heads;
  for (int j = 0; j < n_pipes; j++) {
    const bf_pipe *src = &pipes[order[j]];
    out->pipelines[j] = (ff_plan_pipeline){.batch = mbs * src->micro_batches,
                                           .micro_batch_size = mbs,
                                           .micro_batches = src->micro_batches,
                                           .stages = &out->stages[s],
                                           .n_stages = src->n_stages};
    int64_t first = 0;
    for (int k = 0; k < src->n_stages; k++, s++) {
      const bf_unit *u = &units[src->unit[k]];
      assert_true(s < BF_MAX_UNITS && r + u->tp <= BF_MAX_GPUS);
      out->stages[s] = (ff_plan_stage){.layers = {first, first + src->layers[k]},
                                       .embedding = k == 0,
                                       .lm_head = k == src->n_stages - 1,
                                       .recompute = in->training.recompute,
                                       .ranks = &out->ranks[r],
                                       .n_ranks = u->tp};
      first += src->layers[k];
      for (int t = 0; t < u->tp; t++, r++) {
        ff_plan_rank *x = &out->ranks[r];
        x->rank = r;
        x->node = u->node;
        x->gpu = u->first_gpu + t;
        x->device = in->cluster.nodes[u->node].device;
        x->heads = even(in->model.heads, u->tp, t);
        x->kv_heads = (ff_span){x->heads.first / g, (x->heads.end + g - 1) / g};
        x->ffn = even(in->model.ffn_hidden, u->tp, t);
        x->vocab = even(in->model.vocab, u->tp, t);
      }
    }
  }
  p->n_ranks = r;
}

/* Score pipelines pipes[order[0..n)] built from `units` with the cost model. */
static void score_plan(const inputs *in, const bf_unit *units, const bf_pipe *pipes,
                       const int *order, int n_pipes, int64_t mbs, ff_plan_eval *e) {
  bf_plan p;
  build_plan(in, units, pipes, order, n_pipes, mbs, &p);
  assert_int_equal(ff_evaluate_plan(&p.plan, e), FF_OK);
}

static double plan_seconds(const inputs *in, const bf_unit *units, const bf_pipe *pipes,
                           const int *order, int n_pipes, int64_t mbs) {
  ff_plan_eval e;
  score_plan(in, units, pipes, order, n_pipes, mbs, &e);
  double t = e.fits ? e.iteration_seconds : INFINITY;
  ff_plan_eval_free(&e);
  return t;
}

/* Forward and backward of one layer, TP all-reduces included, on the unit's first rank (the one
 * with the largest shard) for one micro-batch: no stage of the unit runs l layers in less than
 * l times this. */
static double layer_seconds(const bf_search *s, const bf_unit *u, int64_t mbs) {
  const ff_model *m = &s->in->model;
  const ff_training *tr = &s->in->training;
  int node[BF_MAX_TP], gpu[BF_MAX_TP];
  for (int t = 0; t < u->tp; t++)
    node[t] = u->node, gpu[t] = u->first_gpu + t;
  double act = (double)mbs * (double)m->seq_len * (double)m->hidden * ff_cost_wire_bytes(tr);
  int64_t g = m->heads / m->kv_heads;
  ff_span heads = even(m->heads, u->tp, 0), ffn = even(m->ffn_hidden, u->tp, 0);
  ff_shard sh = {(double)(heads.end - heads.first),
                 (double)((heads.end + g - 1) / g - heads.first / g), (double)(ffn.end - ffn.first),
                 0.0};
  ff_layer_time lt = ff_cost_layer_time(
      m, tr->precision, tr->attention,
      &s->in->cluster.devices[s->in->cluster.nodes[u->node].device], sh, (double)mbs, u->tp,
      tr->recompute, ff_comm_allreduce(&s->in->cluster, u->tp, node, gpu, act));
  return lt.fwd + lt.bwd + lt.recompute + lt.tp_fwd + lt.tp_bwd;
}

/* The LM head's compute over the first rank's vocabulary rows (the largest share), as the cost
 * model counts it (cost-model.md §3.3), without its TP all-reduces: a floor. */
static double head_seconds(const bf_search *s, const bf_unit *u, int64_t mbs) {
  const ff_model *m = &s->in->model;
  const ff_device *dev = &s->in->cluster.devices[s->in->cluster.nodes[u->node].device];
  ff_span vocab = even(m->vocab, u->tp, 0);
  ff_shard sh = {0.0, 0.0, 0.0, (double)(vocab.end - vocab.first)};
  ff_end_time e = ff_cost_head_time(m, &s->in->training, dev, sh, (double)mbs);
  return e.fwd + e.bwd;
}

/* No pipeline runs faster than one micro-batch through every stage, nor than m micro-batches
 * through its slowest stage. */
static double option_floor(const bf_search *s, const bf_pipe *p) {
  double path = 0.0, slowest = 0.0;
  for (int k = 0; k < p->n_stages; k++) {
    const bf_type *t = &s->types[s->units[p->unit[k]].type];
    double stage = (double)p->layers[k] * t->layer_seconds[s->mbs_index] +
                   (k == p->n_stages - 1 ? t->head_seconds[s->mbs_index] : 0.0);
    path += stage;
    slowest = stage > slowest ? stage : slowest;
  }
  double busiest = (double)p->micro_batches * slowest;
  return path > busiest ? path : busiest;
}

/* ---- pipelines scored alone ---- */

/* A float no larger than x: bounds stored compactly stay bounds. */
static float rounded_down(double x) {
  float f = (float)x;
  return (double)f > x ? nextafterf(f, 0.0f) : f;
}

/* Score one layer split and micro-batch count of pipeline p alone. With other pipelines beside it,
 * each stage's gradients are all-reduced over at least two GPUs after the stage finishes (the
 * finish is its own: pipelines are simulated apart). A ring's slowest link is no faster than the
 * link from a member to its neighbour, and the hierarchical ring's inter-node part moves at least
 * bytes / (GPUs of the largest node) over a link from its node: so the all-reduce of B bytes
 * takes at least B / max(fastest GPU link, GPUs per node × fastest node link). */
static bool score_option(const bf_search *s, const bf_pipe *p, bf_option *o) {
  int order = 0, rank = 0;
  ff_plan_eval e;
  score_plan(s->in, s->units, p, &order, 1, s->mbs, &e);
  *o = (bf_option){.seconds = e.pipeline_seconds,
                   .seconds_dp = e.pipeline_seconds,
                   .optimizer_seconds = e.optimizer_seconds,
                   .micro_batches = (uint8_t)p->micro_batches};
  for (int k = 0; k < p->n_stages; k++) {
    const bf_type *t = &s->types[s->units[p->unit[k]].type];
    double bytes = 0.0, link = t->best_gpu_gb_per_s;
    for (int r = 0; r < t->tp; r++, rank++)
      bytes = 4.0 * e.ranks[rank].params > bytes ? 4.0 * e.ranks[rank].params : bytes;
    if (t->best_node_gb_per_s * s->largest_node_gpus > link)
      link = t->best_node_gb_per_s * s->largest_node_gpus;
    double finish = e.pipelines[0].stages[k].finish_seconds;
    double end = finish + bytes / (link * 1e9);
    o->seconds_dp = end > o->seconds_dp ? end : o->seconds_dp;
    o->finish_seconds[k] = rounded_down(finish);
    o->dp_bytes[k] = rounded_down(4.0 * e.ranks[rank - t->tp].params);
    double most =
        (double)o->finish_seconds[k] + (double)o->dp_bytes[k] / (s->slowest_pair_gb_per_s * 1e9);
    o->pair_most = most > o->pair_most ? most : o->pair_most;
  }
  /* The capacity bound of next_pipeline(): its bottleneck stage runs m micro-batches of at least
   * layers / Σ(1 / layer_seconds) each. */
  double rate = 0.0;
  for (int k = 0; k < p->n_stages; k++)
    rate += 1.0 / s->types[s->units[p->unit[k]].type].layer_seconds[s->mbs_index];
  assert_true(o->seconds >=
              (double)p->micro_batches * (double)s->in->model.layers / rate * (1 - 1e-9));
  assert_true(o->seconds >= option_floor(s, p) * (1 - 1e-9));
  bool fits = e.fits;
  ff_plan_eval_free(&e);
  return fits;
}

static void sequence_key(const bf_search *s, const bf_pipe *p, uint8_t *key) {
  memset(key, 0, BF_KEY);
  key[0] = (uint8_t)s->mbs_index;
  key[1] = (uint8_t)p->n_stages;
  for (int k = 0; k < p->n_stages; k++) {
    key[2 + 3 * k] = (uint8_t)s->units[p->unit[k]].type;
    key[3 + 3 * k] = k + 1 < p->n_stages ? s->boundary[p->unit[k]][p->unit[k + 1]] : 255;
    /* which earlier stage shares its node: stage transfers leaving a node share its NICs */
    int same = k;
    for (int j = 0; j < k && same == k; j++)
      if (s->units[p->unit[j]].node == s->units[p->unit[k]].node)
        same = j;
    key[4 + 3 * k] = (uint8_t)same;
  }
}

static bf_sequence *sequence_slot(bf_sequence *slots, size_t cap, const uint8_t *key) {
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < BF_KEY; i++)
    h = (h ^ key[i]) * 1099511628211ull;
  size_t i = (size_t)h & (cap - 1);
  while (slots[i].used && memcmp(slots[i].key, key, BF_KEY) != 0)
    i = (i + 1) & (cap - 1);
  return &slots[i];
}

static void sequences_grow(bf_search *s) {
  size_t cap = s->seqs_cap ? 2 * s->seqs_cap : 1 << 14;
  bf_sequence *slots = calloc(cap, sizeof *slots);
  assert_non_null(slots);
  for (size_t i = 0; i < s->seqs_cap; i++)
    if (s->seqs[i].used)
      *sequence_slot(slots, cap, s->seqs[i].key) = s->seqs[i];
  free(s->seqs);
  s->seqs = slots;
  s->seqs_cap = cap;
}

static int by_alone(const void *a, const void *b) {
  const bf_option *x = a, *y = b;
  double u = x->seconds + x->optimizer_seconds, v = y->seconds + y->optimizer_seconds;
  if (x->micro_batches != y->micro_batches)
    return x->micro_batches < y->micro_batches ? -1 : 1;
  return u < v ? -1 : u > v;
}

static int by_shared(const void *a, const void *b) {
  const bf_option *x = a, *y = b;
  double u = x->seconds_dp + x->optimizer_seconds, v = y->seconds_dp + y->optimizer_seconds;
  if (x->micro_batches != y->micro_batches)
    return x->micro_batches < y->micro_batches ? -1 : 1;
  return u < v ? -1 : u > v;
}

/* Every layer split and micro-batch count of the sequence in p that fits and could still beat
 * the best plan (the best only falls, so what is dropped here is never needed later). */
static bf_sequence sequence_options(bf_search *s, const bf_pipe *seq) {
  uint8_t key[BF_KEY];
  sequence_key(s, seq, key);
  if (2 * (s->seqs_used + 1) > s->seqs_cap)
    sequences_grow(s);
  bf_sequence *slot = sequence_slot(s->seqs, s->seqs_cap, key);
  bf_pipe p = *seq;
  int k = p.n_stages;
  if (slot->used) { /* the same sequence as the cost model sees it; now and then, check that */
    if ((++s->sequence_hits & 4095) == 0)
      for (int i = 0; i < slot->n; i++) {
        bf_option o, *x = &slot->alone[i];
        memcpy(p.layers, s->comps[k] + (size_t)x->comp * (size_t)k, (size_t)k * sizeof *p.layers);
        p.micro_batches = x->micro_batches;
        assert_true(score_option(s, &p, &o));
        assert_true(o.seconds == x->seconds && o.seconds_dp == x->seconds_dp &&
                    o.optimizer_seconds == x->optimizer_seconds);
      }
    return *slot;
  }
  int64_t N = s->in->training.global_batch / s->mbs;
  bf_option *list = malloc((size_t)s->n_comps[k] * (size_t)N * sizeof *list);
  assert_non_null(list);
  int n = 0;
  for (int c = 0; c < s->n_comps[k]; c++) {
    memcpy(p.layers, s->comps[k] + (size_t)c * (size_t)k, (size_t)k * sizeof *p.layers);
    for (int64_t m = 1; m <= N; m++) {
      p.micro_batches = m;
      if (option_floor(s, &p) >= s->best)
        break; /* and more micro-batches take no less */
      s->pieces_scored++;
      if (!score_option(s, &p, &list[n]))
        s->pieces_too_big++;
      else if (list[n].seconds + list[n].optimizer_seconds < s->best)
        list[n++].comp = (uint16_t)c;
    }
  }
  *slot = (bf_sequence){
      .used = true, .n = n, .alone = list, .shared = malloc(((size_t)n + 1) * sizeof *list)};
  assert_non_null(slot->shared);
  memcpy(slot->key, key, BF_KEY);
  memcpy(slot->shared, list, (size_t)n * sizeof *list);
  qsort(slot->alone, (size_t)n, sizeof *list, by_alone);
  qsort(slot->shared, (size_t)n, sizeof *list, by_shared);
  slot->with_m = calloc((size_t)N + 2, sizeof *slot->with_m);
  assert_non_null(slot->with_m);
  for (int i = 0, m = 0; m <= N + 1; m++) {
    while (i < n && slot->alone[i].micro_batches < m)
      i++;
    slot->with_m[m] = i;
  }
  s->seqs_used++;
  return *slot;
}

/* ---- whole plans ---- */

static void keep_if_best(bf_search *s, double t, const int *order) {
  if (!(t < s->best))
    return;
  s->best = t;
  memcpy(s->best_units, s->units, sizeof s->units);
  for (int j = 0; j < s->n_pipes; j++)
    s->best_pipes[j] = s->pipes[order[j]];
  s->best_n_pipes = s->n_pipes;
  s->best_mbs = s->mbs;
}

/* Every order of pipelines 1..n−1 behind pipeline 0, one of each mirror pair (a ring read
 * backwards crosses the same links). */
static void score_orders(bf_search *s, int *order, int k) {
  int n = s->n_pipes;
  if (k == n) {
    if (order[1] < order[n - 1]) {
      s->orders_scored++;
      keep_if_best(s, plan_seconds(s->in, s->units, s->pipes, order, n, s->mbs), order);
    }
    return;
  }
  for (int i = k; i < n; i++) {
    int x = order[k];
    order[k] = order[i], order[i] = x;
    score_orders(s, order, k + 1);
    order[i] = order[k], order[k] = x;
  }
}

static void score_complete_plan(bf_search *s, double bound) {
  int order[BF_MAX_UNITS];
  for (int j = 0; j < s->n_pipes; j++)
    order[j] = j;
  double t = plan_seconds(s->in, s->units, s->pipes, order, s->n_pipes, s->mbs);
  s->plans_scored++;
  assert_true(t >= bound * (1 - 1e-12)); /* the bound the search prunes with holds */
  keep_if_best(s, t, order);
  if (s->order_matters && s->n_pipes >= 4)
    score_orders(s, order, 1);
}

/* ---- the search over arrangements ---- */

static double bound_seconds(bf_bound b, bool several) {
  return (several ? b.seconds_dp : b.seconds) + b.optimizer;
}

static void next_pipeline(bf_search *s, int64_t left, bf_bound b);

/* Where the chosen units' links are an ultrametric, a ring's slowest link is the slowest pair among
 * its members, so the gradient all-reduce of a stage's first rank r, whose DP peer in pipeline b
 * is x (the first rank of b's stage holding r's first layer, or of b's embedding or LM-head stage
 * when r's stage has no layers: ff_eval.c), takes at least bytes / link(r, x) — flat, or
 * hierarchical inside one node — and bytes / (GPUs per node × link(r, x)) hierarchical across
 * nodes. Pipeline a then ends no earlier than the stage's finish plus that. */
static double pair_bound(const bf_search *s, const bf_pipe *a, const bf_pipe *b) {
  double worst = 0.0;
  int64_t first = 0;
  for (int k = 0; k < a->n_stages; first += a->layers[k], k++) {
    int peer = k == 0 ? 0 : b->n_stages - 1;
    if (a->layers[k] > 0) {
      int64_t at = 0;
      for (peer = 0; peer < b->n_stages && !(at <= first && first < at + b->layers[peer]); peer++)
        at += b->layers[peer];
    }
    const bf_unit *x = &s->units[a->unit[k]], *y = &s->units[b->unit[peer]];
    double bw = s->links[s->boundary[a->unit[k]][b->unit[peer]]].bandwidth_gb_per_s;
    if (x->node != y->node)
      bw *= s->largest_node_gpus;
    double end = (double)a->option->finish_seconds[k] + (double)a->option->dp_bytes[k] / (bw * 1e9);
    worst = end > worst ? end : worst;
  }
  return worst;
}

/* Every sequence of units of `free` that contains its lowest unit, each stage the lowest free
 * unit of its twin class (twins are interchangeable), kept when it has options. */
static void collect(bf_search *s, unsigned free, bf_pipe *p, unsigned members, bf_candidates *out) {
  if (members & (free & -free)) {
    bf_sequence q = sequence_options(s, p);
    if (q.n > 0) {
      if (out->n == out->cap) {
        out->cap = out->cap ? 2 * out->cap : 16;
        out->list = realloc(out->list, (size_t)out->cap * sizeof *out->list);
        assert_non_null(out->list);
      }
      bf_candidate *c = &out->list[out->n++];
      c->n_stages = p->n_stages;
      for (int k = 0; k < p->n_stages && k < BF_MAX_STAGES; k++)
        c->unit[k] = (uint8_t)p->unit[k];
      c->members = members;
      c->options = q;
    }
  }
  if (p->n_stages == s->max_stages)
    return;
  unsigned open = free & ~members;
  for (int u = 0; u < s->n_units; u++) {
    if (!(open & (1u << u)) || (unsigned)__builtin_ctz(open & s->units[u].twins) != (unsigned)u)
      continue;
    p->unit[p->n_stages++] = u;
    collect(s, free, p, members | (1u << u), out);
    p->n_stages--;
  }
}

static const bf_candidates *candidates_of(bf_search *s, unsigned free) {
  bf_candidates *c = &s->candidates[free];
  if (!c->built) {
    bf_pipe p;
    memset(&p, 0, sizeof p);
    collect(s, free, &p, 0, c);
    c->built = true;
  }
  return c;
}

/* A look-ahead: the free units must still run as pipelines of their own, beside at least one
 * other, taking the `left` micro-batches. Each such pipeline costs the plan at least its
 * seconds_dp + optimizer, so the least over every way to do that of the largest of these is a
 * lower bound — computed exactly (like the search, without the coupling between pipelines) once
 * per free set and count, up to the best time: a result at the best means "no better". Options
 * dropped earlier were no better than a best that has only fallen since, so they never matter. */
static double rest_bound(bf_search *s, unsigned free, int64_t left) {
  if (!free)
    return left == 0 ? 0.0 : INFINITY;
  if (left <= 0)
    return INFINITY;
  double *slot = &s->rest_memo[(size_t)free * (size_t)s->rest_stride + (size_t)left];
  if (isnan(*slot)) {
    double result = s->best;
    const bf_candidates *cs = candidates_of(s, free);
    for (int c = 0; c < cs->n; c++) {
      unsigned rest = free & ~cs->list[c].members;
      const bf_sequence *q = &cs->list[c].options;
      for (int64_t m = rest ? 1 : left; m <= left - (rest ? 1 : 0) && m < s->rest_stride; m++) {
        double more = rest ? rest_bound(s, rest, left - m) : 0.0;
        if (more >= result || q->with_m[m] == q->with_m[m + 1])
          continue;
        const bf_option *o = &q->shared[q->with_m[m]]; /* the best with m micro-batches */
        double own = o->seconds_dp + o->optimizer_seconds, v = more > own ? more : own;
        result = v < result ? v : result;
      }
    }
    *slot = result;
  }
  return *slot;
}

/* Pipelines whose stages are twins stage by stage can trade their layer splits and micro-batches
 * (exchanging their units is a symmetry): of each such group, take the splits in one order. */
static bool after_its_twin(const bf_search *s, const bf_pipe *p) {
  for (int q = s->n_pipes - 1; q >= 0; q--) {
    const bf_pipe *x = &s->pipes[q];
    bool twin = x->n_stages == p->n_stages;
    for (int k = 0; k < p->n_stages && twin; k++)
      twin = s->units[x->unit[k]].twins == s->units[p->unit[k]].twins;
    if (twin)
      return x->option->comp < p->option->comp ||
             (x->option->comp == p->option->comp &&
              x->option->micro_batches <= p->option->micro_batches);
  }
  return true;
}

/* Pipeline p run as option o beside the pipelines chosen so far: bound the plan, and go on. */
static void try_option(bf_search *s, bf_pipe *p, unsigned members, const bf_option *o, int64_t left,
                       bf_bound b, bool several) {
  bf_bound nb = {o->seconds > b.seconds ? o->seconds : b.seconds,
                 o->seconds_dp > b.seconds_dp ? o->seconds_dp : b.seconds_dp,
                 o->optimizer_seconds > b.optimizer ? o->optimizer_seconds : b.optimizer};
  if (bound_seconds(nb, several) >= s->best)
    return;
  int k = p->n_stages;
  memcpy(p->layers, s->comps[k] + (size_t)o->comp * (size_t)k, (size_t)k * sizeof *p->layers);
  p->micro_batches = o->micro_batches;
  p->option = o;
  if (!after_its_twin(s, p))
    return;
  for (int other = 0; other < s->n_pipes && !s->order_matters; other++) {
    if (o->pair_most + nb.optimizer >= s->best) {
      double ab = pair_bound(s, p, &s->pipes[other]);
      nb.seconds_dp = ab > nb.seconds_dp ? ab : nb.seconds_dp;
    }
    if (s->pipes[other].option->pair_most + nb.optimizer >= s->best) {
      double ba = pair_bound(s, &s->pipes[other], p);
      nb.seconds_dp = ba > nb.seconds_dp ? ba : nb.seconds_dp;
    }
  }
  if (bound_seconds(nb, several) >= s->best)
    return;
  s->used |= members;
  s->n_pipes++;
  next_pipeline(s, left - o->micro_batches, nb);
  s->n_pipes--;
  s->used &= ~members;
}

/* The sequence in p as the next pipeline, with every layer split and micro-batch count that may
 * still win: the last pipeline takes the micro-batches left, the others leave some. */
static void try_pipeline(bf_search *s, bf_pipe *p, unsigned members, const bf_sequence *q,
                         int64_t left, bf_bound b) {
  unsigned rest = s->all & ~(s->used | members);
  bool several = s->n_pipes > 0 || rest;
  const bf_option *options = several ? q->shared : q->alone;
  for (int64_t m = rest ? 1 : left; m <= (rest ? left - 1 : left); m++) {
    if (rest && rest_bound(s, rest, left - m) >= s->best)
      continue; /* the other free units cannot run the rest in time */
    for (int i = q->with_m[m]; i < q->with_m[m + 1]; i++) {
      const bf_option *o = &options[i];
      if ((several ? o->seconds_dp : o->seconds) + o->optimizer_seconds >= s->best)
        break; /* sorted: the rest are no better */
      try_option(s, p, members, o, left, b, several);
    }
  }
}

static void next_pipeline(bf_search *s, int64_t left, bf_bound b) {
  s->search_nodes++;
  unsigned free = s->all & ~s->used;
  if (!free) {
    if (left == 0)
      score_complete_plan(s, bound_seconds(b, s->n_pipes > 1));
    return;
  }
  if (left == 0)
    return;
  /* Capacity: a pipeline that beats the best has makespan < best − optimizer, and its slowest
   * stage, holding at least layers / Σ(1 / layer_seconds) of layer time, runs each of its
   * micro-batches; so the free units cannot take more than this many micro-batches. */
  double rate = 0.0;
  for (int u = 0; u < s->n_units; u++)
    if (free & (1u << u))
      rate += s->layers_per_second[u];
  if ((double)left > (s->best - b.optimizer) * rate / (double)s->in->model.layers * (1 + 1e-9))
    return;
  bf_pipe *p = &s->pipes[s->n_pipes];
  const bf_candidates *cs = candidates_of(s, free);
  for (int c = 0; c < cs->n; c++) {
    p->n_stages = cs->list[c].n_stages;
    for (int k = 0; k < p->n_stages; k++)
      p->unit[k] = cs->list[c].unit[k];
    try_pipeline(s, p, cs->list[c].members, &cs->list[c].options, left, b);
  }
}

/* ---- symmetry: twins, interchangeable nodes, island contents ---- */

/* Exchanging units a and b (GPU i of one for GPU i of the other) maps every link among the
 * chosen GPUs, and which of them share a node, onto itself. */
static bool are_twins(const bf_search *s, int a, int b) {
  const ff_cluster *c = &s->in->cluster;
  const bf_unit *x = &s->units[a], *y = &s->units[b];
  if (x->type != y->type || c->nodes[x->node].nics != c->nodes[y->node].nics ||
      c->nodes[x->node].nic_bandwidth_gb_per_s != c->nodes[y->node].nic_bandwidth_gb_per_s)
    return false;
  for (int i = 0; i < x->tp; i++)
    for (int j = 0; j < y->tp; j++)
      if (!same_link(ff_cluster_gpu_link(c, x->node, x->first_gpu + i, y->node, y->first_gpu + j),
                     ff_cluster_gpu_link(c, y->node, y->first_gpu + i, x->node, x->first_gpu + j)))
        return false;
  for (int w = 0; w < s->n_units; w++) {
    const bf_unit *z = &s->units[w];
    if (w == a || w == b)
      continue;
    if ((z->node == x->node) != (z->node == y->node))
      return false;
    for (int i = 0; i < x->tp; i++)
      for (int k = 0; k < z->tp; k++)
        if (!same_link(
                ff_cluster_gpu_link(c, x->node, x->first_gpu + i, z->node, z->first_gpu + k),
                ff_cluster_gpu_link(c, y->node, y->first_gpu + i, z->node, z->first_gpu + k)))
          return false;
  }
  return true;
}

/* Is the link order (slower = less bandwidth, then more latency) an ultrametric on the chosen
 * GPUs: the slower of x–y and y–z never faster than x–z? Then a ring through any of them has the
 * slowest pair among its members as its slowest link, whatever their order. */
static bool faster(ff_link a, ff_link b) {
  return a.bandwidth_gb_per_s != b.bandwidth_gb_per_s ? a.bandwidth_gb_per_s > b.bandwidth_gb_per_s
                                                      : a.latency_us < b.latency_us;
}

static bool links_are_ultrametric(const bf_search *s) {
  const ff_cluster *c = &s->in->cluster;
  int node[BF_MAX_GPUS], gpu[BF_MAX_GPUS], n = 0;
  for (int u = 0; u < s->n_units; u++)
    for (int t = 0; t < s->units[u].tp; t++)
      node[n] = s->units[u].node, gpu[n++] = s->units[u].first_gpu + t;
  for (int x = 0; x < n; x++)
    for (int y = 0; y < n; y++)
      for (int z = 0; z < n; z++) {
        if (x == y || y == z || x == z)
          continue;
        ff_link xy = ff_cluster_gpu_link(c, node[x], gpu[x], node[y], gpu[y]);
        ff_link yz = ff_cluster_gpu_link(c, node[y], gpu[y], node[z], gpu[z]);
        ff_link xz = ff_cluster_gpu_link(c, node[x], gpu[x], node[z], gpu[z]);
        if (faster(faster(xy, yz) ? yz : xy, xz))
          return false;
      }
  return true;
}

static void prepare_unit_set(bf_search *s) {
  s->all = s->n_units == 32 ? ~0u : (1u << s->n_units) - 1;
  for (int u = 0; u < s->n_units; u++)
    s->units[u].type = type_id(s, s->units[u].node, s->units[u].first_gpu, s->units[u].tp);
  for (int u = 0; u < s->n_units; u++) {
    s->units[u].twins = 1u << u;
    for (int v = 0; v < s->n_units; v++)
      if (v != u && are_twins(s, u, v))
        s->units[u].twins |= 1u << v;
    for (int v = 0; v < s->n_units; v++) {
      const bf_unit *x = &s->units[u], *y = &s->units[v];
      s->boundary[u][v] = (uint8_t)link_id(
          s, ff_cluster_gpu_link(&s->in->cluster, x->node, x->first_gpu, y->node, y->first_gpu));
    }
  }
  s->order_matters = !links_are_ultrametric(s);
  s->any_order_matters |= s->order_matters;
}

/* Nodes a and b may be exchanged: same device, GPU count, island size and links among their GPUs,
 * and the same link to every other node. */
static bool nodes_interchangeable(const ff_cluster *c, int a, int b) {
  const ff_node *x = &c->nodes[a], *y = &c->nodes[b];
  if (x->device != y->device || x->gpus != y->gpus || x->island_gpus != y->island_gpus ||
      x->nics != y->nics || x->nic_bandwidth_gb_per_s != y->nic_bandwidth_gb_per_s)
    return false;
  for (int i = 0; i < x->gpus; i++)
    for (int j = 0; j < x->gpus; j++)
      if (i != j &&
          !same_link(ff_cluster_gpu_link(c, a, i, a, j), ff_cluster_gpu_link(c, b, i, b, j)))
        return false;
  for (int n = 0; n < c->n_nodes; n++)
    if (n != a && n != b &&
        !same_link(ff_cluster_node_link(c, a, n), ff_cluster_node_link(c, b, n)))
      return false;
  return true;
}

/* What a tiling of a node holds per island (islands and the GPUs in one are interchangeable):
 * each island's unit sizes, largest first, islands sorted; then the units spanning islands. */
static void tiling_signature(const ff_node *node, const bf_tiling *t, char *out, size_t cap) {
  int islands = node->gpus / node->island_gpus;
  char parts[BF_MAX_GPUS + 1][64];
  const char *sorted[BF_MAX_GPUS + 1];
  for (int k = 0; k <= islands; k++) {
    parts[k][0] = '\0';
    for (int tp = BF_MAX_TP; tp >= 1; tp /= 2)
      for (int u = 0; u < t->n; u++) {
        bool spans = t->tp[u] > node->island_gpus;
        if (t->tp[u] == tp &&
            (k == islands ? spans : !spans && t->first_gpu[u] / node->island_gpus == k))
          snprintf(parts[k] + strlen(parts[k]), 64 - strlen(parts[k]), "%d,", tp);
      }
    sorted[k] = parts[k];
  }
  qsort(sorted, (size_t)islands, sizeof *sorted, compare_strings);
  out[0] = '\0';
  for (int k = 0; k <= islands; k++)
    snprintf(out + strlen(out), cap - strlen(out), "%s%s", k == islands ? "/" : "|", sorted[k]);
}

/* Every set of disjoint aligned units of a node (GPUs left idle allowed), left to right. */
static void tile_node(const ff_model *m, const ff_node *node, int gpu, bf_tiling *cur,
                      bf_tiling *out, int *n_out) {
  if (gpu == node->gpus) {
    assert_true(*n_out < BF_MAX_TILINGS);
    out[(*n_out)++] = *cur;
    return;
  }
  tile_node(m, node, gpu + 1, cur, out, n_out); /* idle */
  for (int tp = 1; tp <= node->gpus && tp <= m->heads && tp <= BF_MAX_TP; tp *= 2)
    if (node->gpus % tp == 0 && gpu % tp == 0) {
      cur->first_gpu[cur->n] = gpu;
      cur->tp[cur->n++] = tp;
      tile_node(m, node, gpu + tp, cur, out, n_out);
      cur->n--;
    }
}

/* One tiling per island content. */
static int node_tilings(const ff_cluster *c, const ff_model *m, int n, bf_tiling *out) {
  const ff_node *node = &c->nodes[n];
  /* The island structure is what the links say it is. */
  for (int i = 0; i < node->gpus; i++)
    for (int j = 0; j < node->gpus; j++)
      if (i != j)
        assert_true(
            same_link(ff_cluster_gpu_link(c, n, i, n, j),
                      i / node->island_gpus == j / node->island_gpus ? node->island : node->intra));
  bf_tiling cur = {0}, *all = malloc(BF_MAX_TILINGS * sizeof *all);
  assert_non_null(all);
  int n_all = 0, n_out = 0;
  tile_node(m, node, 0, &cur, all, &n_all);
  char seen[BF_MAX_TILINGS][96];
  for (int t = 0; t < n_all; t++) {
    char sig[96];
    tiling_signature(node, &all[t], sig, sizeof sig);
    bool dup = false;
    for (int k = 0; k < n_out && !dup; k++)
      dup = strcmp(seen[k], sig) == 0;
    if (!dup) {
      snprintf(seen[n_out], sizeof seen[n_out], "%s", sig);
      out[n_out++] = all[t];
    }
  }
  free(all);
  return n_out;
}

/* Layer compositions of the model over k stages: ends may be empty, middles not, one stage all. */
static void add_compositions(bf_search *s, int k, int i, int64_t left, int64_t *x) {
  if (i == k - 1) {
    x[i] = left;
    if (s->n_comps[k] % 256 == 0) {
      s->comps[k] =
          realloc(s->comps[k], ((size_t)s->n_comps[k] + 256) * (size_t)k * sizeof(int64_t));
      assert_non_null(s->comps[k]);
    }
    memcpy(s->comps[k] + (size_t)s->n_comps[k]++ * (size_t)k, x, (size_t)k * sizeof *x);
    return;
  }
  for (int64_t v = i == 0 ? 0 : 1; v <= left; v++) {
    x[i] = v;
    add_compositions(s, k, i + 1, left - v, x);
  }
}

static void make_compositions(bf_search *s) {
  int64_t L = s->in->model.layers, x[BF_MAX_STAGES];
  s->max_stages = (int)(L + 2 < BF_MAX_STAGES ? L + 2 : BF_MAX_STAGES);
  for (int k = 1; k <= s->max_stages; k++)
    add_compositions(s, k, 0, L, x);
}

static void forget_candidates(bf_search *s) {
  for (size_t i = 0; i < s->n_candidate_sets; i++)
    free(s->candidates[i].list);
  free(s->candidates);
  s->candidates = NULL;
  s->n_candidate_sets = 0;
}

/* Cluster-wide constants of the bounds: the most GPUs of a node, the least bandwidth of any
 * pair (times that many GPUs between nodes, as pair_bound() uses it). */
static void measure_cluster(bf_search *s) {
  const ff_cluster *c = &s->in->cluster;
  for (int n = 0; n < c->n_nodes; n++)
    if (c->nodes[n].gpus > s->largest_node_gpus)
      s->largest_node_gpus = c->nodes[n].gpus;
  s->slowest_pair_gb_per_s = INFINITY;
  for (int a = 0; a < c->n_nodes; a++)
    for (int b = 0; b < c->n_nodes; b++)
      for (int x = 0; x < c->nodes[a].gpus; x++)
        for (int y = 0; y < c->nodes[b].gpus; y++)
          if (a != b || x != y) {
            double bw = ff_cluster_gpu_link(c, a, x, b, y).bandwidth_gb_per_s;
            bw *= a != b ? s->largest_node_gpus : 1;
            s->slowest_pair_gb_per_s =
                bw < s->slowest_pair_gb_per_s ? bw : s->slowest_pair_gb_per_s;
          }
}

/* Every plan on the current unit set with micro-batch size index i. */
static void search_unit_set(bf_search *s, int i) {
  const ff_training *tr = &s->in->training;
  s->mbs_index = i;
  s->mbs = tr->micro_batch_sizes[i];
  if (tr->global_batch % s->mbs != 0)
    return;
  for (int u = 0; u < s->n_units; u++)
    s->layers_per_second[u] = 1.0 / s->types[s->units[u].type].layer_seconds[i];
  s->rest_stride = tr->global_batch / s->mbs + 1;
  size_t cells = ((size_t)1 << s->n_units) * (size_t)s->rest_stride;
  s->rest_memo = realloc(s->rest_memo, cells * sizeof *s->rest_memo);
  assert_non_null(s->rest_memo);
  for (size_t cell = 0; cell < cells; cell++)
    s->rest_memo[cell] = NAN;
  forget_candidates(s);
  s->n_candidate_sets = (size_t)1 << s->n_units;
  s->candidates = calloc(s->n_candidate_sets, sizeof *s->candidates);
  assert_non_null(s->candidates);
  next_pipeline(s, tr->global_batch / s->mbs, (bf_bound){0.0, 0.0, 0.0});
}

/* Search every plan of the space for one cluster; s->best starts at `bound` (INFINITY: none). */
static void exhaustive_search(bf_search *s, const inputs *in, double bound) {
  memset(s, 0, sizeof *s);
  s->in = in;
  s->best = bound;
  const ff_cluster *c = &in->cluster;
  assert_true(!in->training.zero1 && in->training.recompute != FF_RECOMPUTE_AUTO);
  assert_true(c->total_gpus <= BF_MAX_GPUS && c->n_nodes <= BF_MAX_NODES);
  assert_true(in->model.layers + 2 <= BF_MAX_STAGES); /* else pipelines could be longer */
  assert_true(in->training.global_batch / in->training.micro_batch_sizes[0] < 255); /* uint8_t */
  for (int n = 0; n < c->n_nodes; n++) /* every TP degree fits the search's unit types */
    for (int tp = 1; c->nodes[n].gpus % tp == 0 && tp <= in->model.heads; tp *= 2)
      assert_true(tp <= BF_MAX_TP);
  measure_cluster(s);
  make_compositions(s);
  bf_tiling *tilings[BF_MAX_NODES];
  int n_tilings[BF_MAX_NODES], pick[BF_MAX_NODES] = {0}, twin_before[BF_MAX_NODES];
  for (int n = 0; n < c->n_nodes; n++) {
    tilings[n] = malloc(BF_MAX_TILINGS * sizeof(bf_tiling));
    assert_non_null(tilings[n]);
    n_tilings[n] = node_tilings(c, &in->model, n, tilings[n]);
    twin_before[n] = -1; /* the previous node of its class: its pick must not be larger */
    for (int b = n - 1; b >= 0 && twin_before[n] < 0; b--)
      if (nodes_interchangeable(c, b, n))
        twin_before[n] = b;
  }
  for (int n = 0; n >= 0;) { /* odometer over the nodes' tilings */
    bool canonical = true;
    for (int k = 0; k < c->n_nodes; k++)
      canonical &= twin_before[k] < 0 || pick[twin_before[k]] <= pick[k];
    s->n_units = 0;
    for (int k = 0; k < c->n_nodes && canonical; k++)
      for (int u = 0; u < tilings[k][pick[k]].n; u++)
        s->units[s->n_units++] =
            (bf_unit){k, tilings[k][pick[k]].first_gpu[u], tilings[k][pick[k]].tp[u], 0, 0};
    if (canonical && s->n_units > 0) {
      s->unit_sets++;
      prepare_unit_set(s);
      for (int i = 0; i < in->training.n_micro_batch_sizes; i++)
        search_unit_set(s, i);
    }
    for (n = c->n_nodes - 1; n >= 0 && ++pick[n] == n_tilings[n]; n--)
      pick[n] = 0;
  }
  for (int n = 0; n < c->n_nodes; n++)
    free(tilings[n]);
}

static void search_free(bf_search *s) {
  for (int k = 0; k <= BF_MAX_STAGES; k++)
    free(s->comps[k]);
  for (size_t i = 0; i < s->seqs_cap; i++)
    if (s->seqs[i].used)
      free(s->seqs[i].alone), free(s->seqs[i].shared), free(s->seqs[i].with_m);
  free(s->seqs);
  free(s->rest_memo);
  forget_candidates(s);
}

static void describe_best(const bf_search *s, char *out, size_t cap) {
  size_t len = 0;
  out[0] = '\0';
  for (int j = 0; j < s->best_n_pipes && len < cap; j++) {
    const bf_pipe *p = &s->best_pipes[j];
    int64_t first = 0;
    for (int k = 0; k < p->n_stages && len < cap; k++) {
      const bf_unit *u = &s->best_units[p->unit[k]];
      len += (size_t)snprintf(out + len, cap - len, "%s%s:%d/%d L%lld-%lld", k ? " | " : "",
                              s->in->cluster.nodes[u->node].name, u->first_gpu, u->tp,
                              (long long)first, (long long)(first + p->layers[k]));
      first += p->layers[k];
    }
    if (len < cap)
      len += (size_t)snprintf(out + len, cap - len, " x%lld(b%lld)%s", (long long)p->micro_batches,
                              (long long)s->best_mbs, j + 1 < s->best_n_pipes ? "; " : "");
  }
}

/* The optimum is a plan like any other: written as ff-plan/1 it reads back valid (the reader
 * checks ranks, shards, layer ranges and batches) and scores the same. */
static void the_optimum_is_a_valid_plan(const bf_search *s) {
  int order[BF_MAX_UNITS];
  for (int j = 0; j < s->best_n_pipes; j++)
    order[j] = j;
  bf_plan *p = malloc(sizeof *p);
  assert_non_null(p);
  build_plan(s->in, s->best_units, s->best_pipes, order, s->best_n_pipes, s->best_mbs, p);
  cJSON *tree = ff_plan_to_json(&p->plan);
  ff_buf text = {0};
  ff_json_write(tree, &text);
  cJSON_Delete(tree);
  ff_diag d;
  ff_diag_init(&d, "exhaustive optimum");
  cJSON *root;
  assert_int_equal(ff_json_parse(text.data, text.len, &d, &root), FF_OK);
  ff_plan back;
  ff_status st = ff_plan_from_json(root, ".", &d, &back);
  if (st != FF_OK)
    fprintf(stderr, "%s", ff_diag_text(&d));
  assert_int_equal(st, FF_OK);
  ff_plan_eval e;
  assert_int_equal(ff_evaluate_plan(&back, &e), FF_OK);
  assert_true(e.fits && e.iteration_seconds == s->best);
  ff_plan_eval_free(&e);
  ff_plan_free(&back);
  cJSON_Delete(root);
  ff_diag_free(&d);
  ff_buf_free(&text);
  free(p);
}

static void planner_is_within_2_percent_of_the_exhaustive_optimum(void **state) {
  const char *name = *state;
  char file[256], text[1024];
  snprintf(file, sizeof file, TOPOLOGY_DIR "%s.json", name);
  inputs in;
  load(&in, file, TOPOLOGY_DIR "model.json", TOPOLOGY_DIR "training.json");
  /* Attention timed as a flash kernel, the landscape these clusters were built on. Timed as the
   * GEMM kernel (bf16's `auto` since it measured fastest on an H200) the planner misses the
   * optimum of racks-across-types by 6.0 %: the optimum trades two stages for a rack-local RTX
   * 4090 holding the LM head alone, a move the refinement does not make (docs/benchmarks.md). */
  in.training.attention = FF_ATTENTION_TENSOR;
  ff_search_result res;
  double planned = planned_seconds(&in.cluster, &in, &res);
  describe_plan(&res.plan, false, text, sizeof text);
  printf("%-22s planner     %10.6f s  %s\n", name, planned, text);
  ff_search_result_free(&res);
  bf_search *s = malloc(sizeof *s);
  assert_non_null(s);
  double start = seconds_now();
  exhaustive_search(s, &in, INFINITY);
  double took = seconds_now() - start;
  describe_best(s, text, sizeof text);
  printf("%-22s exhaustive  %10.6f s  %s\n", name, s->best, text);
  printf("%-22s searched %lld unit sets, %lld partial plans, %lld pipelines scored alone "
         "(%lld of them over memory; %lld sequences), %lld plans scored in full (%lld more "
         "pipeline orders; links %s) in %.2f s; planner gap %+.3f %%\n",
         name, (long long)s->unit_sets, (long long)s->search_nodes, (long long)s->pieces_scored,
         (long long)s->pieces_too_big, (long long)s->seqs_used, (long long)s->plans_scored,
         (long long)s->orders_scored, s->any_order_matters ? "not ultrametric" : "ultrametric",
         took, 100 * (planned / s->best - 1));
  if (isfinite(s->best))
    the_optimum_is_a_valid_plan(s);
  double best = s->best;
  int64_t pieces = s->pieces_scored, partial = s->search_nodes;
  search_free(s);
  free(s);
  unload(&in);
  assert_true(isfinite(best));
  assert_true(pieces >= 10000 && partial >= 1000); /* the search did search */
  assert_true(planned >=
              best * (1 - 1e-9)); /* nothing beats the optimum: else the search is wrong */
  assert_true(planned <= best * 1.02);
}

/* ---- the exhaustive search against plain enumeration ----------------------------------------- */

typedef struct plain {
  const inputs *in;
  bf_unit units[BF_MAX_UNITS];
  int n_units;
  int order[BF_MAX_UNITS];
  bf_pipe pipes[BF_MAX_UNITS];
  double best;
  int64_t scored;
} plain;

static bool first_composition(int64_t *x, int parts, int64_t total, int64_t min_middle,
                              int64_t min_end) {
  int64_t rest = total;
  for (int k = 0; k + 1 < parts; k++)
    rest -= x[k] = (k == 0 ? min_end : min_middle);
  x[parts - 1] = rest;
  return parts == 1 || rest >= min_end;
}

/* The next composition in lexicographic order, or false. */
static bool next_composition(int64_t *x, int parts, int64_t total, int64_t min_middle,
                             int64_t min_end) {
  for (int i = parts - 2; i >= 0; i--) {
    x[i]++;
    int64_t rest = total;
    for (int k = 0; k <= i; k++)
      rest -= x[k];
    for (int k = i + 1; k + 1 < parts; k++)
      rest -= x[k] = min_middle;
    if (rest >= min_end) {
      x[parts - 1] = rest;
      return true;
    }
  }
  return false;
}

/* Every layer split of every pipeline and every micro-batch split, for pipelines in order. */
static void plain_splits(plain *pl, int n_pipes, int pipe, int64_t mbs) {
  if (pipe < n_pipes) {
    bf_pipe *p = &pl->pipes[pipe];
    int64_t L = pl->in->model.layers;
    int64_t min_end = p->n_stages == 1 ? L : 0;
    if (!first_composition(p->layers, p->n_stages, L, 1, min_end))
      return;
    do
      plain_splits(pl, n_pipes, pipe + 1, mbs);
    while (p->n_stages > 1 && next_composition(p->layers, p->n_stages, L, 1, min_end));
    return;
  }
  int64_t mb[BF_MAX_UNITS], N = pl->in->training.global_batch / mbs;
  if (N < n_pipes || !first_composition(mb, n_pipes, N, 1, 1))
    return;
  int order[BF_MAX_UNITS] = {0};
  for (int j = 0; j < n_pipes; j++)
    order[j] = j;
  do {
    for (int j = 0; j < n_pipes; j++)
      pl->pipes[j].micro_batches = mb[j];
    double t = plan_seconds(pl->in, pl->units, pl->pipes, order, n_pipes, mbs);
    pl->scored++;
    if (t < pl->best)
      pl->best = t;
  } while (n_pipes > 1 && next_composition(mb, n_pipes, N, 1, 1));
}

/* Every sequence of disjoint units, cut into pipelines in every way: ordered pipelines. */
static void plain_sequences(plain *pl, int depth, unsigned used) {
  for (unsigned cuts = 0; depth > 0 && cuts < (1u << (depth - 1)); cuts++) {
    int n_pipes = 0, stage = 0;
    bool fits = true;
    for (int i = 0; i < depth; i++) {
      if (i > 0 && (cuts & (1u << (i - 1))))
        pl->pipes[n_pipes++].n_stages = stage, stage = 0;
      pl->pipes[n_pipes].unit[stage++] = pl->order[i];
      fits &= stage <= pl->in->model.layers + 2;
    }
    pl->pipes[n_pipes++].n_stages = stage;
    for (int i = 0; i < pl->in->training.n_micro_batch_sizes && fits; i++) {
      int64_t mbs = pl->in->training.micro_batch_sizes[i];
      if (pl->in->training.global_batch % mbs == 0)
        plain_splits(pl, n_pipes, 0, mbs);
    }
  }
  for (int u = 0; u < pl->n_units; u++) {
    const bf_unit *x = &pl->units[u];
    bool clash = false;
    for (int v = 0; v < pl->n_units && !clash; v++) {
      const bf_unit *y = &pl->units[v];
      clash = (used & (1u << v)) && x->node == y->node && x->first_gpu < y->first_gpu + y->tp &&
              y->first_gpu < x->first_gpu + x->tp;
    }
    if (clash)
      continue;
    pl->order[depth] = u;
    plain_sequences(pl, depth + 1, used | (1u << u));
  }
}

static void the_exhaustive_search_agrees_with_plain_enumeration(void **state) {
  const char *name = *state;
  char file[256];
  snprintf(file, sizeof file, TOPOLOGY_DIR "%s.json", name);
  inputs in;
  load(&in, file, "profiles/models/tiny.json", "tests/data/planner/tiny-train.json");
  plain *pl = calloc(1, sizeof *pl);
  assert_non_null(pl);
  pl->in = &in;
  pl->best = INFINITY;
  for (int n = 0; n < in.cluster.n_nodes; n++)
    for (int tp = 1; tp <= in.cluster.nodes[n].gpus && tp <= in.model.heads; tp *= 2)
      for (int g = 0; in.cluster.nodes[n].gpus % tp == 0 && g < in.cluster.nodes[n].gpus; g += tp)
        pl->units[pl->n_units++] = (bf_unit){n, g, tp, 0, 0};
  double start = seconds_now();
  plain_sequences(pl, 0, 0);
  double plain_took = seconds_now() - start;
  bf_search *s = malloc(sizeof *s);
  assert_non_null(s);
  start = seconds_now();
  exhaustive_search(s, &in, INFINITY);
  double took = seconds_now() - start;
  printf("%-22s plain enumeration: %lld plans, best %.9f s in %.2f s; exhaustive search: %lld "
         "pipelines and %lld plans scored (%lld more orders; links %s), best %.9f s in %.2f s\n",
         name, (long long)pl->scored, pl->best, plain_took, (long long)s->pieces_scored,
         (long long)s->plans_scored, (long long)s->orders_scored,
         s->any_order_matters ? "not ultrametric" : "ultrametric", s->best, took);
  char text[1024];
  describe_best(s, text, sizeof text);
  printf("%-22s optimum %s\n", name, text);
  double best = s->best, plain_best = pl->best;
  int64_t scored = pl->scored;
  search_free(s);
  free(s);
  free(pl);
  unload(&in);
  assert_true(scored > 10000);
  assert_true(isfinite(plain_best));
  assert_true(fabs(best - plain_best) <= 1e-12 * plain_best);
}

int main(int argc, char **argv) {
  static const char *const searched[] = {"two-sites-wan",  "racks-across-types",
                                         "nvlink-islands", "odd-sizes",
                                         "overrides-only", "slow-override-in-group"};
  static const char *const invariance_only[] = {"nvlink-pairs-18"};
  enum {
    N_SEARCHED = sizeof searched / sizeof *searched,
    N_ONLY = sizeof invariance_only / sizeof *invariance_only
  };
  char names[2 * N_SEARCHED + N_ONLY + 2][128];
  struct CMUnitTest tests[2 * N_SEARCHED + N_ONLY + 2];
  int n = 0;
  static const char *const tiny[] = {"tiny-ring", "tiny-islands"};
  for (int i = 0; i < 2; i++) {
    snprintf(names[n], sizeof names[n], "the_exhaustive_search_agrees_with_plain_enumeration/%s",
             tiny[i]);
    tests[n] = (struct CMUnitTest){names[n], the_exhaustive_search_agrees_with_plain_enumeration,
                                   NULL, NULL, (void *)tiny[i]};
    n++;
  }
  for (int i = 0; i < N_SEARCHED + N_ONLY; i++) {
    const char *c = i < N_SEARCHED ? searched[i] : invariance_only[i - N_SEARCHED];
    snprintf(names[n], sizeof names[n], "plans_do_not_depend_on_how_links_are_written/%s", c);
    tests[n] = (struct CMUnitTest){names[n], plans_do_not_depend_on_how_links_are_written, NULL,
                                   NULL, (void *)c};
    n++;
  }
  for (int i = 0; i < N_SEARCHED; i++) {
    snprintf(names[n], sizeof names[n], "planner_is_within_2_percent_of_the_exhaustive_optimum/%s",
             searched[i]);
    tests[n] = (struct CMUnitTest){names[n], planner_is_within_2_percent_of_the_exhaustive_optimum,
                                   NULL, NULL, (void *)searched[i]};
    n++;
  }
  if (argc > 1) /* a pattern such as "*odd-sizes" runs only the tests it matches */
    cmocka_set_test_filter(argv[1]);
  return _cmocka_run_group_tests("test_topology", tests, (size_t)n, NULL, NULL);
}
