/* test_planner.c — the planner as a specification: it finds the optimum of a tiny instance that a
 * brute force enumerates completely; every plan it writes reads back valid and fits memory; it
 * is deterministic (also under a permuted node order); it explains infeasible inputs; and it is
 * never worse than the uniform (Megatron-style) and FlashFlex-style baselines on shipped clusters. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ff_cost.h"
#include "milp.h"
#include "search.h"

typedef struct inputs {
  ff_cluster cluster;
  ff_model model;
  ff_training training;
} inputs;

static void load(inputs *in, const char *cluster, const char *model, const char *training) {
  ff_diag d;
  ff_diag_init(&d, NULL);
  assert_int_equal(ff_load_cluster(cluster, &d, &in->cluster), FF_OK);
  assert_int_equal(ff_load_model(model, &d, &in->model), FF_OK);
  assert_int_equal(ff_load_training(training, &d, &in->training), FF_OK);
  ff_diag_free(&d);
}

static void unload(inputs *in) {
  ff_cluster_free(&in->cluster);
  ff_model_free(&in->model);
  ff_training_free(&in->training);
}

static double plan_seconds(const inputs *in, const ff_search_opts *opts, ff_search_result *res) {
  ff_status st = ff_search(&in->cluster, &in->model, &in->training, opts, res);
  if (st != FF_OK)
    return INFINITY;
  return res->plan.predicted.value[FF_PLAN_PRED_ITERATION_SECONDS];
}

/* ---- brute force over a tiny instance --------------------------------------------------- */

typedef struct bunit {
  int node, gpu, tp;
} bunit;

typedef struct brute {
  const inputs *in;
  bunit units[8];
  int n_units;
  int order[8];     /* a sequence of used units */
  int cut[8];       /* pipeline boundaries in the sequence */
  double best;
  int64_t evaluated;
} brute;

static ff_span even(int64_t total, int parts, int i) {
  int64_t base = total / parts, extra = total % parts;
  int64_t first = i * base + (i < extra ? i : extra);
  return (ff_span){first, first + base + (i < extra ? 1 : 0)};
}

/* Score one fully specified plan (inputs borrowed). */
static double score(const brute *b, int n_seq, int n_pipes, const int *pipe_len,
                    const int64_t *layers, int64_t mbs, const int64_t *mb) {
  ff_plan p;
  memset(&p, 0, sizeof p);
  p.model = b->in->model;
  p.training = b->in->training;
  p.cluster = b->in->cluster;
  ff_plan_pipeline pipes[8];
  ff_plan_stage stages[8];
  ff_plan_rank ranks[16];
  memset(pipes, 0, sizeof pipes), memset(stages, 0, sizeof stages), memset(ranks, 0, sizeof ranks);
  p.pipelines = pipes;
  p.n_pipelines = n_pipes;
  int s = 0, r = 0;
  int64_t g = p.model.heads / p.model.kv_heads;
  for (int j = 0; j < n_pipes; j++) {
    pipes[j].micro_batch_size = mbs;
    pipes[j].micro_batches = mb[j];
    pipes[j].batch = mbs * mb[j];
    pipes[j].stages = &stages[s];
    pipes[j].n_stages = pipe_len[j];
    int64_t first = 0;
    for (int k = 0; k < pipe_len[j]; k++, s++) {
      const bunit *u = &b->units[b->order[s]];
      ff_plan_stage *st = &stages[s];
      st->layers = (ff_span){first, first + layers[s]};
      first += layers[s];
      st->embedding = k == 0;
      st->lm_head = k == pipe_len[j] - 1;
      st->recompute = FF_RECOMPUTE_NONE;
      st->ranks = &ranks[r];
      st->n_ranks = u->tp;
      for (int t = 0; t < u->tp; t++, r++) {
        ranks[r].rank = r;
        ranks[r].node = u->node;
        ranks[r].gpu = u->gpu + t;
        ranks[r].device = p.cluster.nodes[u->node].device;
        ranks[r].heads = even(p.model.heads, u->tp, t);
        ranks[r].kv_heads = (ff_span){ranks[r].heads.first / g, (ranks[r].heads.end + g - 1) / g};
        ranks[r].ffn = even(p.model.ffn_hidden, u->tp, t);
        ranks[r].vocab = even(p.model.vocab, u->tp, t);
      }
    }
  }
  (void)n_seq;
  p.n_ranks = r;
  ff_plan_eval e;
  assert_int_equal(ff_evaluate_plan(&p, &e), FF_OK);
  double t = e.fits ? e.iteration_seconds : INFINITY;
  ff_plan_eval_free(&e);
  return t;
}

/* Every composition of `total` into `parts` (ends may be 0, middle ≥ 1 for layers). */
static bool next_composition(int64_t *x, int parts, int64_t total, bool layer_rules) {
  /* Enumerate in lexicographic order by treating x[0..parts-2] as counters. */
  for (int i = parts - 2; i >= 0; i--) {
    x[i]++;
    int64_t used = 0;
    for (int k = 0; k <= i; k++)
      used += x[k];
    if (used <= total) {
      for (int k = i + 1; k < parts - 1; k++)
        x[k] = layer_rules ? (k == 0 ? 0 : 1) : 1;
      int64_t rest = total;
      for (int k = 0; k < parts - 1; k++)
        rest -= x[k];
      x[parts - 1] = rest;
      return true;
    }
    x[i] = layer_rules ? (i == 0 ? 0 : 1) : 1;
  }
  return false;
}

static bool valid_split(const int64_t *x, int parts, bool layer_rules, int64_t total) {
  int64_t sum = 0;
  for (int k = 0; k < parts; k++) {
    int64_t min = layer_rules ? ((k == 0 || k == parts - 1) ? 0 : 1) : 1;
    if (parts == 1)
      min = layer_rules ? total : 1;
    if (x[k] < min)
      return false;
    sum += x[k];
  }
  return sum == total;
}

static void first_composition(int64_t *x, int parts, int64_t total, bool layer_rules) {
  for (int k = 0; k < parts - 1; k++)
    x[k] = layer_rules ? (k == 0 ? 0 : 1) : 1;
  int64_t rest = total;
  for (int k = 0; k < parts - 1; k++)
    rest -= x[k];
  x[parts - 1] = rest;
}

static void brute_layers_and_batches(brute *b, int n_seq, int n_pipes, const int *pipe_len) {
  const ff_training *t = &b->in->training;
  int64_t L = b->in->model.layers;
  for (int mi = 0; mi < t->n_micro_batch_sizes; mi++) {
    int64_t mbs = t->micro_batch_sizes[mi];
    if (t->global_batch % mbs)
      continue;
    int64_t N = t->global_batch / mbs;
    if (N < n_pipes)
      continue;
    /* Layers per pipeline independently; then micro-batches. Nested odometer over pipelines. */
    int64_t layers[8], per[8][8];
    for (int j = 0, s = 0; j < n_pipes; s += pipe_len[j], j++)
      first_composition(per[j], pipe_len[j], L, true);
    for (;;) {
      bool ok = true;
      for (int j = 0, s = 0; j < n_pipes; s += pipe_len[j], j++) {
        ok &= valid_split(per[j], pipe_len[j], true, L);
        for (int k = 0; k < pipe_len[j]; k++)
          layers[s + k] = per[j][k];
      }
      if (ok) {
        int64_t mb[8];
        first_composition(mb, n_pipes, N, false);
        do {
          if (!valid_split(mb, n_pipes, false, N))
            continue;
          double sec = score(b, n_seq, n_pipes, pipe_len, layers, mbs, mb);
          b->evaluated++;
          if (sec < b->best)
            b->best = sec;
        } while (n_pipes > 1 && next_composition(mb, n_pipes, N, false));
      }
      int j = n_pipes - 1;
      while (j >= 0 && !(pipe_len[j] > 1 && next_composition(per[j], pipe_len[j], L, true))) {
        first_composition(per[j], pipe_len[j], L, true);
        j--;
      }
      if (j < 0)
        break;
    }
  }
}

/* Every sequence of distinct units, cut into pipelines in every way. */
static void brute_sequences(brute *b, int depth, unsigned used) {
  if (depth > 0) {
    for (unsigned cuts = 0; cuts < (1u << (depth - 1)); cuts++) {
      int pipe_len[8], n_pipes = 0, len = 1;
      for (int i = 1; i < depth; i++) {
        if (cuts & (1u << (i - 1))) {
          pipe_len[n_pipes++] = len;
          len = 1;
        } else {
          len++;
        }
      }
      pipe_len[n_pipes++] = len;
      brute_layers_and_batches(b, depth, n_pipes, pipe_len);
    }
  }
  for (int u = 0; u < b->n_units; u++) {
    if (used & (1u << u))
      continue;
    bool clash = false; /* two units may not share a GPU */
    for (int v = 0; v < b->n_units; v++)
      if ((used & (1u << v)) && b->units[v].node == b->units[u].node &&
          b->units[v].gpu < b->units[u].gpu + b->units[u].tp &&
          b->units[u].gpu < b->units[v].gpu + b->units[v].tp)
        clash = true;
    if (clash)
      continue;
    b->order[depth] = u;
    brute_sequences(b, depth + 1, used | (1u << u));
  }
}

static void planner_finds_the_brute_force_optimum_of_a_tiny_instance(void **state) {
  (void)state;
  inputs in;
  load(&in, "tests/data/planner/tiny-mixed.json", "profiles/models/tiny.json",
       "tests/data/planner/tiny-train.json");
  brute b = {.in = &in, .best = INFINITY};
  /* Every TP group a node allows: single GPUs and, on the two-GPU node, the pair. */
  for (int n = 0; n < in.cluster.n_nodes; n++)
    for (int tp = 1; tp <= in.cluster.nodes[n].gpus; tp *= 2)
      for (int g = 0; g + tp <= in.cluster.nodes[n].gpus; g += tp)
        b.units[b.n_units++] = (bunit){n, g, tp};
  brute_sequences(&b, 0, 0);
  ff_search_opts opts;
  ff_search_opts_default(&opts);
  ff_search_result res;
  double planned = plan_seconds(&in, &opts, &res);
  printf("brute force: %lld plans, best %.6f s; planner %.6f s (gap %.2f %%)\n",
         (long long)b.evaluated, b.best, planned, 100 * (planned / b.best - 1));
  assert_true(b.evaluated > 1000);
  assert_true(planned <= b.best * (1 + 1e-9));
  ff_search_result_free(&res);
  unload(&in);
}

/* ---- properties of emitted plans ----------------------------------------------------------- */

static void round_trip_and_fit(const ff_plan *plan) {
  cJSON *tree = ff_plan_to_json(plan);
  ff_buf text = {0};
  ff_json_write(tree, &text);
  cJSON_Delete(tree);
  ff_diag d;
  ff_diag_init(&d, "planned");
  cJSON *root;
  assert_int_equal(ff_json_parse(text.data, text.len, &d, &root), FF_OK);
  ff_plan back;
  ff_status st = ff_plan_from_json(root, ".", &d, &back);
  if (st != FF_OK)
    fprintf(stderr, "%s", ff_diag_text(&d));
  assert_int_equal(st, FF_OK);
  ff_plan_eval e;
  assert_int_equal(ff_evaluate_plan(&back, &e), FF_OK);
  assert_true(e.fits);
  assert_true(fabs(e.iteration_seconds - plan->predicted.value[FF_PLAN_PRED_ITERATION_SECONDS]) <=
              1e-12 * e.iteration_seconds);
  ff_plan_eval_free(&e);
  ff_plan_free(&back);
  cJSON_Delete(root);
  ff_diag_free(&d);
  ff_buf_free(&text);
}

static const char *const clusters[] = {"flashflex-a", "flashflex-b", "flashflex-c", "a100-pcie-2x8",
                                       "a100-pcie-4x8", "h100-8", "datacenter-mixed"};
static const char *const models[] = {"llama-2-7b", "llama-2-13b", "llama-30b"};

static void every_plan_is_valid_fits_and_beats_both_baselines(void **state) {
  (void)state;
  for (size_t c = 0; c < sizeof clusters / sizeof *clusters; c++)
    for (size_t m = 0; m < sizeof models / sizeof *models; m++) {
      char cf[256], mf[256];
      snprintf(cf, sizeof cf, "profiles/clusters/%s.json", clusters[c]);
      snprintf(mf, sizeof mf, "profiles/models/%s.json", models[m]);
      inputs in;
      load(&in, cf, mf, "profiles/training/flashflex.json");
      ff_search_opts opts;
      ff_search_opts_default(&opts);
      ff_search_result best, uniform, flashflex;
      double t = plan_seconds(&in, &opts, &best);
      if (isfinite(t))
        round_trip_and_fit(&best.plan);
      opts.baseline = FF_BASELINE_UNIFORM;
      double u = plan_seconds(&in, &opts, &uniform);
      opts.baseline = FF_BASELINE_FLASHFLEX;
      double f = plan_seconds(&in, &opts, &flashflex);
      printf("%-17s %-12s planner %9.4f s  uniform %9.4f s  flashflex %9.4f s\n", clusters[c],
             models[m], t, u, f);
      /* Where a baseline fits, so does the planner, and it is at least as fast. */
      assert_true(!isfinite(u) || t <= u * (1 + 1e-9));
      assert_true(!isfinite(f) || t <= f * (1 + 1e-9));
      if (isfinite(u))
        round_trip_and_fit(&uniform.plan);
      if (isfinite(f))
        round_trip_and_fit(&flashflex.plan);
      ff_search_result_free(&best);
      ff_search_result_free(&uniform);
      ff_search_result_free(&flashflex);
      unload(&in);
    }
}

static char *plan_text(const ff_plan *p, bool pipelines_only) {
  cJSON *tree = ff_plan_to_json(p);
  if (pipelines_only) {
    cJSON_DeleteItemFromObject(tree, "inputs");
  }
  ff_buf b = {0};
  ff_json_write(tree, &b);
  cJSON_Delete(tree);
  return b.data;
}

static void same_inputs_give_the_same_bytes_and_node_order_does_not_matter(void **state) {
  (void)state;
  inputs in;
  load(&in, "profiles/clusters/datacenter-mixed.json", "profiles/models/llama-2-13b.json",
       "profiles/training/pretrain.json");
  ff_search_opts opts;
  ff_search_opts_default(&opts);
  ff_search_result a, b, c;
  assert_true(isfinite(plan_seconds(&in, &opts, &a)));
  assert_true(isfinite(plan_seconds(&in, &opts, &b)));
  char *ta = plan_text(&a.plan, false), *tb = plan_text(&b.plan, false);
  assert_string_equal(ta, tb);
  /* Reverse the nodes (and fix the name index and groups) and plan again. */
  ff_cluster *cl = &in.cluster;
  int n = cl->n_nodes;
  for (int i = 0; i < n / 2; i++) {
    ff_node x = cl->nodes[i];
    cl->nodes[i] = cl->nodes[n - 1 - i];
    cl->nodes[n - 1 - i] = x;
  }
  for (int i = 0; i < n; i++)
    cl->node_by_name[i] = n - 1 - cl->node_by_name[i];
  for (int g = 0; g < cl->n_groups; g++)
    for (int k = 0; k < cl->groups[g].n_nodes; k++)
      cl->groups[g].nodes[k] = n - 1 - cl->groups[g].nodes[k];
  for (int o = 0; o < cl->n_overrides; o++) {
    cl->overrides[o].node_a = n - 1 - cl->overrides[o].node_a;
    cl->overrides[o].node_b = n - 1 - cl->overrides[o].node_b;
  }
  assert_true(isfinite(plan_seconds(&in, &opts, &c)));
  char *pa = plan_text(&a.plan, true), *pc = plan_text(&c.plan, true);
  assert_string_equal(pa, pc);
  free(ta), free(tb), free(pa), free(pc);
  ff_search_result_free(&a);
  ff_search_result_free(&b);
  ff_search_result_free(&c);
  unload(&in);
}

static void an_impossible_model_is_explained(void **state) {
  (void)state;
  inputs in;
  load(&in, "profiles/clusters/h100-8.json", "profiles/models/llama-2-70b.json",
       "profiles/training/pretrain.json");
  in.training.recompute = FF_RECOMPUTE_NONE;
  in.cluster.nodes[0].gpus = 2; /* 2 x 80 GiB cannot hold 70B parameters' states */
  in.cluster.total_gpus = 2;
  ff_search_opts opts;
  ff_search_opts_default(&opts);
  ff_search_result res;
  assert_int_equal(ff_search(&in.cluster, &in.model, &in.training, &opts, &res), FF_ERR_INFEASIBLE);
  assert_non_null(strstr(res.infeasible_why, "model states need"));
  assert_non_null(strstr(res.infeasible_why, "To make it fit"));
  unload(&in);
}

/* Rewrite every network group of `c` as per-pair overrides with the group's link. */
static void groups_as_overrides(ff_cluster *c) {
  int n = 0;
  for (int g = 0; g < c->n_groups; g++)
    n += c->groups[g].n_nodes * (c->groups[g].n_nodes - 1) / 2;
  ff_net_override *ov = realloc(c->overrides, (size_t)(c->n_overrides + n) * sizeof *ov);
  assert_non_null(ov);
  c->overrides = ov;
  for (int g = 0; g < c->n_groups; g++)
    for (int a = 0; a < c->groups[g].n_nodes; a++)
      for (int b = a + 1; b < c->groups[g].n_nodes; b++)
        c->overrides[c->n_overrides++] =
            (ff_net_override){c->groups[g].nodes[a], c->groups[g].nodes[b], c->groups[g].link};
  for (int i = 0; i < c->n_nodes; i++)
    c->nodes[i].group = -1;
  for (int g = 0; g < c->n_groups; g++)
    free(c->groups[g].nodes);
  c->n_groups = 0;
}

/* Reverse the node list (and every reference to a node index). */
static void reverse_nodes(ff_cluster *c) {
  int n = c->n_nodes;
  for (int i = 0; i < n / 2; i++) {
    ff_node t = c->nodes[i];
    c->nodes[i] = c->nodes[n - 1 - i];
    c->nodes[n - 1 - i] = t;
  }
  for (int g = 0; g < c->n_groups; g++)
    for (int k = 0; k < c->groups[g].n_nodes; k++)
      c->groups[g].nodes[k] = n - 1 - c->groups[g].nodes[k];
  for (int i = 0; i < c->n_overrides; i++) {
    c->overrides[i].node_a = n - 1 - c->overrides[i].node_a;
    c->overrides[i].node_b = n - 1 - c->overrides[i].node_b;
  }
  for (int i = 0; i < n; i++)
    c->node_by_name[i] = n - 1 - c->node_by_name[i];
}

static void a_network_written_as_overrides_or_reordered_gets_the_same_plan(void **state) {
  (void)state;
  static const char *const files[] = {"tests/data/planner/two-sites.json",
                                      "profiles/clusters/datacenter-mixed.json"};
  for (size_t f = 0; f < sizeof files / sizeof *files; f++) {
    double seconds[4];
    for (int variant = 0; variant < 4; variant++) {
      inputs in;
      load(&in, files[f], "profiles/models/llama-2-7b.json", "profiles/training/flashflex.json");
      if (variant & 1)
        groups_as_overrides(&in.cluster);
      if (variant & 2)
        reverse_nodes(&in.cluster);
      ff_search_opts opts;
      ff_search_opts_default(&opts);
      ff_search_result res;
      seconds[variant] = plan_seconds(&in, &opts, &res);
      printf("%s, %s%s: %.6f s\n", files[f], variant & 1 ? "groups as overrides" : "as written",
             variant & 2 ? ", nodes reversed" : "", seconds[variant]);
      assert_true(isfinite(seconds[variant]));
      ff_search_result_free(&res);
      unload(&in);
    }
    for (int variant = 1; variant < 4; variant++)
      assert_true(fabs(seconds[variant] / seconds[0] - 1) <= 1e-3);
  }
}

/* The integer program against local moves alone, on clusters of the topology suite (bench_plan
 * --ablation has the whole table, with these rows): two sites over a WAN, where it moves layers
 * between the classes of a pipeline (27 % at batch 12, 7 % at batch 64), and nine NVLink pairs,
 * where it rebalances layers and micro-batches among classes of one device (2.6 %). The plan's
 * search record says the program produced it; without it, that it was off. */
static void the_integer_program_finds_a_plan_the_local_moves_miss(void **state) {
  (void)state;
  static const struct {
    const char *cluster, *model;
    int64_t global_batch;
    ff_recompute recompute;
    double min_gain;
  } cases[] = {
      {"tests/data/topology/two-sites-wan.json", "profiles/models/llama-2-13b.json", 12,
       FF_RECOMPUTE_AUTO, 0.20},
      {"tests/data/topology/two-sites-wan.json", "profiles/models/llama-2-13b.json", 64,
       FF_RECOMPUTE_AUTO, 0.05},
      {"tests/data/topology/nvlink-pairs-18.json", "profiles/models/llama-2-13b.json", 24,
       FF_RECOMPUTE_NONE, 0.02},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    inputs in;
    load(&in, cases[i].cluster, cases[i].model, "tests/data/topology/training.json");
    in.training.global_batch = cases[i].global_batch;
    in.training.recompute = cases[i].recompute;
    in.training.micro_batch_sizes[in.training.n_micro_batch_sizes++] = 4; /* 1, 2 and 4 */
    ff_search_opts opts;
    ff_search_opts_default(&opts);
    ff_search_result with, without;
    double t_with = plan_seconds(&in, &opts, &with);
    opts.ilp = false;
    double t_without = plan_seconds(&in, &opts, &without);
    printf("%s: %.4f s with the integer program, %.4f s without\n", cases[i].cluster, t_with,
           t_without);
    assert_true(isfinite(t_with) && isfinite(t_without));
    assert_true(t_with < t_without * (1 - cases[i].min_gain));
    assert_true(with.plan.search.has_origin && without.plan.search.has_origin);
    assert_int_equal(with.plan.search.ilp, FF_PLAN_ILP_IMPROVED);
    assert_int_equal(without.plan.search.ilp, FF_PLAN_ILP_OFF);
    assert_true(with.plan.search.layout[0] && with.plan.search.node_order[0]);
    ff_search_result_free(&with);
    ff_search_result_free(&without);
    unload(&in);
  }
}

/* The integer program on plain arrays: one class of one pipeline of two stages served by a
 * fast kind (1 s per layer) and a slow one (3 s per layer), 8 layers, one recompute mode, no
 * memory limit, 100 micro-batches: the 1F1B closed form 99·S + Σ is least with 6 layers on the
 * fast unit and 2 on the slow one (99·6 + 12 = 606 s; 7 + 1 gives 703, the warm start 4 + 4
 * gives 1,204). A non-finite coefficient
 * (which GLPK would abort the process on) is refused as infeasible. */
static void the_integer_program_solves_a_small_class_and_refuses_bad_numbers(void **state) {
  (void)state;
  const int kind_count[2] = {1, 1}, warm_kind[2] = {0, 1}, warm_mode[2] = {0, 0};
  double tau[2] = {1.0, 3.0};
  const double cap[4] = {100, 100, 100, 100}, fixed[4] = {0, 0, 0, 0};
  const int64_t warm_layers[2] = {4, 4}, warm_mb[1] = {100};
  int kind[2], mode[2];
  int64_t layers[2], mb[1];
  ff_milp_class cl = {1, 2, 2, 1, kind_count, tau, cap, fixed, warm_kind, warm_mode,
                      warm_layers, warm_mb, kind, mode, layers, mb};
  ff_milp_problem prob = {&cl, 1, 8, 100, 300, 0, 0, 0, 0};
  assert_int_equal(ff_milp_solve(&prob), FF_OK);
  assert_true(fabs(prob.objective_seconds - 606.0) < 1e-9);
  int fast = kind[0] == 0 ? 0 : 1;
  assert_int_equal(layers[fast], 6);
  assert_int_equal(layers[1 - fast], 2);
  assert_int_equal(mb[0], 100);
  tau[1] = NAN;
  assert_int_equal(ff_milp_solve(&prob), FF_ERR_INFEASIBLE);
  tau[1] = INFINITY;
  assert_int_equal(ff_milp_solve(&prob), FF_ERR_INFEASIBLE);
}

static void one_device_type_is_as_good_as_the_best_uniform_plan(void **state) {
  (void)state;
  static const char *const homogeneous[] = {"h100-8", "a100-pcie-2x8", "a100-pcie-4x8"};
  for (size_t c = 0; c < sizeof homogeneous / sizeof *homogeneous; c++) {
    char cf[256];
    snprintf(cf, sizeof cf, "profiles/clusters/%s.json", homogeneous[c]);
    inputs in;
    load(&in, cf, "profiles/models/llama-2-7b.json", "profiles/training/pretrain.json");
    ff_search_opts opts;
    ff_search_opts_default(&opts);
    ff_search_result best, uniform;
    double t = plan_seconds(&in, &opts, &best);
    opts.baseline = FF_BASELINE_UNIFORM;
    double u = plan_seconds(&in, &opts, &uniform);
    assert_true(isfinite(u));
    assert_true(t <= u * (1 + 1e-9));
    ff_search_result_free(&best);
    ff_search_result_free(&uniform);
    unload(&in);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(planner_finds_the_brute_force_optimum_of_a_tiny_instance),
      cmocka_unit_test(every_plan_is_valid_fits_and_beats_both_baselines),
      cmocka_unit_test(same_inputs_give_the_same_bytes_and_node_order_does_not_matter),
      cmocka_unit_test(an_impossible_model_is_explained),
      cmocka_unit_test(one_device_type_is_as_good_as_the_best_uniform_plan),
      cmocka_unit_test(a_network_written_as_overrides_or_reordered_gets_the_same_plan),
      cmocka_unit_test(the_integer_program_finds_a_plan_the_local_moves_miss),
      cmocka_unit_test(the_integer_program_solves_a_small_class_and_refuses_bad_numbers),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
