/* test_cost.c — the cost model against published numbers (Korthikanti et al. MLSys'23 Fig. 1
 * activation memory, exact; Narayanan et al. / Korthikanti et al. MFU and HFU within 0.3 points)
 * and the pipeline simulator against closed forms and a brute-force reference. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ff_cost.h"

/* ---- activation memory, Korthikanti et al. Fig. 1 (s = 2048, t = 8), GiB per GPU ---------- */

typedef struct gpt_case {
  const char *name;
  double h, a, l, b;
  int p, v;
  double plain_gib, selective_sp_gib;
} gpt_case;

static const gpt_case fig1[] = {
    {"22B", 6144, 64, 48, 4, 1, 1, 59.25, 9.5625},
    {"175B", 12288, 96, 96, 1, 8, 3, 66.84375, 12.3515625},
    {"530B", 20480, 128, 105, 1, 35, 3, 114.0234375, 23.076171875},
    {"1T", 25600, 160, 128, 1, 64, 1, 131.25, 26.5625},
};

static double first_stage_gib(const gpt_case *c, bool sp, ff_recompute rc) {
  double per_layer = ff_mem_activation_layer_bytes(2048, c->b, c->h, c->a, 8, sp, rc);
  return per_layer * c->l * ff_mem_interleave_factor(c->p, c->v) / FF_GIB;
}

static void activation_memory_matches_korthikanti_figure_1_exactly(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof fig1 / sizeof *fig1; i++) {
    const gpt_case *c = &fig1[i];
    assert_true(first_stage_gib(c, false, FF_RECOMPUTE_NONE) == c->plain_gib);
    assert_true(first_stage_gib(c, true, FF_RECOMPUTE_SELECTIVE) == c->selective_sp_gib);
  }
}

static void activation_memory_orders_recompute_modes(void **state) {
  (void)state;
  double none = ff_mem_activation_layer_bytes(4096, 1, 4096, 32, 1, false, FF_RECOMPUTE_NONE);
  double sel = ff_mem_activation_layer_bytes(4096, 1, 4096, 32, 1, false, FF_RECOMPUTE_SELECTIVE);
  double full = ff_mem_activation_layer_bytes(4096, 1, 4096, 32, 1, false, FF_RECOMPUTE_FULL);
  assert_true(full < sel && sel < none);
  /* no parallelism: s·b·h·(34 + 5·a·s/h) */
  assert_true(none == 4096.0 * 4096.0 * (34.0 + 5.0 * 32.0 * 4096.0 / 4096.0));
  assert_true(full == 2.0 * 4096.0 * 4096.0);
}

/* ---- MFU from published iteration times (A100, 312 TFLOP/s, s 2048, V 51200, t 8) --------- */

static double mfu(double h, double l, double batch, double gpus, double seconds) {
  return batch * ff_flops_gpt_per_sequence(2048, l, h, 51200) / (seconds * gpus * 312e12);
}

static void mfu_matches_published_iteration_times(void **state) {
  (void)state;
  assert_true(fabs(100 * mfu(6144, 48, 4, 8, 1.10) - 41.7) < 0.3);
  assert_true(fabs(100 * mfu(12288, 96, 64, 64, 13.75) - 51.4) < 0.3);
  assert_true(fabs(100 * mfu(20480, 105, 280, 280, 37.83) - 56.0) < 0.3);
  assert_true(fabs(100 * mfu(25600, 128, 512, 512, 71.49) - 56.3) < 0.3);
  double hfu = 512 * ff_flops_gpt_selective_hardware_per_sequence(2048, 128, 25600, 51200) /
               (71.49 * 512 * 312e12);
  assert_true(fabs(100 * hfu - 57.0) < 0.3);
}

static void flops_reduce_to_the_gpt_formula_for_mha_and_4h_mlp(void **state) {
  (void)state;
  /* A Llama-shaped model whose matmul weights equal GPT's 12·h² (ffn = 8h/3, kv = heads) has
   * forward FLOPs 24·b·s·h² + 4·b·s²·h per layer. */
  ff_model m = {.layers = 48, .hidden = 6144, .heads = 48, .kv_heads = 48, .ffn_hidden = 16384,
                .vocab = 51200, .seq_len = 2048};
  double b = 4, s = 2048, h = 6144;
  assert_true(ff_flops_layer_forward(&m, b) == 24 * b * s * h * h + 4 * b * s * s * h);
  assert_true(ff_flops_head_forward(&m, b) == 2 * b * s * h * 51200);
  double per_seq = ff_flops_model_per_token(&m) * s;
  assert_true(fabs(per_seq / ff_flops_gpt_per_sequence(s, 48, h, 51200) - 1) < 1e-12);
}

/* ---- the pipeline simulator ----------------------------------------------------------------- */

static void equal_stages_take_m_plus_p_minus_1_slots(void **state) {
  (void)state;
  for (int p = 1; p <= 8; p++)
    for (int64_t m = 1; m <= 16; m++) {
      double f[8], b[8];
      for (int i = 0; i < p; i++)
        f[i] = 1.0, b[i] = 2.0;
      double t = ff_sim_pipeline(FF_SCHEDULE_1F1B, FF_TRANSFERS_PAIRED, p, m, f, b, NULL, NULL,
                                 NULL, NULL, NULL);
      assert_true(t == (double)(m + p - 1) * 3.0);
    }
}

static unsigned next_random(unsigned *x) {
  *x = *x * 1103515245u + 12345u;
  return (*x >> 8) & 0xffff;
}

/* Reference: each stage's program written out as ffrun's run_schedule loops run it (operations
 * and the exchanges between them), and every time relaxed until nothing changes: a compute step
 * starts when its stage is free; a transfer starts when both ends have posted it, and an exchange
 * ends when its stage is free and all of its transfers are done. No worklist, no slots. */
enum { BF_FWD, BF_BWD, BF_X };
typedef struct bf_item {
  int kind, n;
  int64_t j;
  int k[2], dir[2], side[2]; /* side 0 sends, 1 receives */
  int64_t xj[2];
} bf_item;

static void bf_x(bf_item *it, bool when, int k, int dir, int side, int64_t j) {
  if (when) {
    it->k[it->n] = k, it->dir[it->n] = dir, it->side[it->n] = side, it->xj[it->n] = j;
    it->n++;
  }
}

static int bf_program(ff_schedule sch, int p, int i, int64_t m, bf_item *out) {
  int64_t w = sch == FF_SCHEDULE_GPIPE ? m : (p - i - 1 < m ? p - i - 1 : m);
  bool prev = i > 0, next = i < p - 1;
  int n = 0;
  bf_item x;
#define BF_EMIT(it)                                                                                \
  do {                                                                                             \
    if ((it).kind != BF_X || (it).n > 0)                                                           \
      out[n++] = (it);                                                                             \
  } while (0)
  for (int64_t j = 0; j < w; j++) {
    x = (bf_item){.kind = BF_X};
    bf_x(&x, prev, i - 1, 0, 1, j);
    BF_EMIT(x);
    BF_EMIT(((bf_item){.kind = BF_FWD, .j = j}));
    x = (bf_item){.kind = BF_X};
    bf_x(&x, next, i, 0, 0, j);
    BF_EMIT(x);
  }
  x = (bf_item){.kind = BF_X};
  bf_x(&x, prev && m > w, i - 1, 0, 1, w);
  BF_EMIT(x);
  for (int64_t k = 0; k < m - w; k++) {
    BF_EMIT(((bf_item){.kind = BF_FWD, .j = w + k}));
    x = (bf_item){.kind = BF_X};
    bf_x(&x, next, i, 0, 0, w + k);
    bf_x(&x, next, i, 1, 1, k);
    BF_EMIT(x);
    BF_EMIT(((bf_item){.kind = BF_BWD, .j = k}));
    x = (bf_item){.kind = BF_X};
    bf_x(&x, prev, i - 1, 1, 0, k);
    bf_x(&x, prev && k + 1 < m - w, i - 1, 0, 1, w + k + 1);
    BF_EMIT(x);
  }
  for (int64_t j = m - w; j < m; j++) {
    x = (bf_item){.kind = BF_X};
    bf_x(&x, next, i, 1, 1, j);
    BF_EMIT(x);
    BF_EMIT(((bf_item){.kind = BF_BWD, .j = j}));
    x = (bf_item){.kind = BF_X};
    bf_x(&x, prev, i - 1, 1, 0, j);
    BF_EMIT(x);
  }
#undef BF_EMIT
  return n;
}

static double brute_force(ff_schedule sch, int p, int64_t m, const double *f, const double *b,
                          const double *sf, const double *sb) {
  static bf_item prog[8][6 * 32 + 2];
  static double posted[8][2][32][2];
  int len[8];
  for (int i = 0; i < p; i++)
    len[i] = bf_program(sch, p, i, m, prog[i]);
  memset(posted, 0, sizeof posted);
  double t = 0;
  for (int iter = 0; iter < 100000; iter++) {
    bool changed = false;
    t = 0;
    for (int i = 0; i < p; i++) {
      double free_at = 0;
      for (int q = 0; q < len[i]; q++) {
        const bf_item *it = &prog[i][q];
        if (it->kind != BF_X) {
          free_at += it->kind == BF_FWD ? f[i] : b[i];
          continue;
        }
        double end = free_at;
        for (int x = 0; x < it->n; x++) {
          double *mine = &posted[it->k[x]][it->dir[x]][it->xj[x]][it->side[x]];
          if (*mine != free_at)
            changed = true, *mine = free_at;
          double other = posted[it->k[x]][it->dir[x]][it->xj[x]][1 - it->side[x]];
          double start = free_at > other ? free_at : other;
          const double *cost = it->dir[x] == 0 ? sf : sb;
          double e = start + (cost ? cost[it->k[x]] : 0);
          if (e > end)
            end = e;
        }
        free_at = end;
      }
      if (free_at > t)
        t = free_at;
    }
    if (!changed)
      break;
  }
  return t;
}

static void random_pipelines_match_a_brute_force_schedule(void **state) {
  (void)state;
  unsigned seed = 12345;
  for (int trial = 0; trial < 400; trial++) {
    int p = 1 + (int)(next_random(&seed) % 8);
    int64_t m = 1 + (int64_t)(next_random(&seed) % 24);
    double f[8], b[8], sf[8], sb[8];
    for (int i = 0; i < p; i++) {
      f[i] = 0.5 + next_random(&seed) % 100 / 50.0;
      b[i] = f[i] * (1.5 + next_random(&seed) % 100 / 100.0);
      sf[i] = sb[i] = next_random(&seed) % 10 / 20.0;
    }
    for (int s = 0; s < 2; s++) {
      ff_schedule sch = s ? FF_SCHEDULE_GPIPE : FF_SCHEDULE_1F1B;
      double sim = ff_sim_pipeline(sch, FF_TRANSFERS_PAIRED, p, m, f, b, sf, sb, NULL, NULL, NULL);
      assert_true(fabs(sim - brute_force(sch, p, m, f, b, sf, sb)) < 1e-9);
    }
    double sim = ff_sim_pipeline(FF_SCHEDULE_1F1B, FF_TRANSFERS_PAIRED, p, m, f, b, NULL, NULL,
                                 NULL, NULL, NULL);
    assert_true(sim <= ff_sim_closed_form(p, m, f, b) + 1e-9);
    double gpipe = ff_sim_pipeline(FF_SCHEDULE_GPIPE, FF_TRANSFERS_PAIRED, p, m, f, b, NULL, NULL,
                                   NULL, NULL, NULL);
    assert_true(fabs(gpipe - ff_sim_gpipe_closed_form(p, m, f, b)) < 1e-9);
  }
}

/* Overlapped transfers computed directly from their definition (ff_cost.h), stage by stage in
 * program order: an operation starts when its stage is free and what it consumes has arrived;
 * micro-batch j arrives cost after the latest of its send (the end of the producing operation),
 * its receive's post (the end of the same stage's operation of that kind on j − 2, or 0) and the
 * previous arrival on its link. */
static double overlapped_reference(ff_schedule sch, int p, int64_t m, const double *f,
                                   const double *b, const double *sf, const double *sb) {
  enum { P = 8, M = 32 };
  double end[P][2][M], arr[P][2][M], free_at[P] = {0};
  int64_t idx[P] = {0};
  for (int i = 0; i < p; i++)
    for (int k = 0; k < 2; k++)
      for (int64_t j = 0; j < m; j++)
        end[i][k][j] = NAN;
  for (bool moved = true; moved;) {
    moved = false;
    for (int i = 0; i < p; i++) {
      for (; idx[i] < 2 * m; idx[i]++) {
        int64_t w = sch == FF_SCHEDULE_GPIPE ? m : (p - i - 1 < m ? p - i - 1 : m), n = idx[i];
        int bwd;
        int64_t j;
        if (n < w) {
          bwd = 0, j = n;
        } else if (n < w + 2 * (m - w)) {
          bwd = (int)((n - w) % 2), j = bwd ? (n - w) / 2 : w + (n - w) / 2;
        } else {
          bwd = 1, j = n - w - (m - w);
        }
        double start = free_at[i];
        int from = bwd ? i + 1 : i - 1;
        if (from >= 0 && from < p) {
          double sent = end[from][bwd][j];
          if (isnan(sent))
            break;
          double posted = j >= 2 ? end[i][bwd][j - 2] : 0.0;
          double t = sent > posted ? sent : posted;
          if (j > 0 && arr[i][bwd][j - 1] > t)
            t = arr[i][bwd][j - 1];
          arr[i][bwd][j] = t + (bwd ? sb[i] : sf[i - 1]);
          if (arr[i][bwd][j] > start)
            start = arr[i][bwd][j];
        }
        free_at[i] = end[i][bwd][j] = start + (bwd ? b[i] : f[i]);
        moved = true;
      }
    }
  }
  double t = 0;
  for (int i = 0; i < p; i++) {
    assert_int_equal(idx[i], 2 * m);
    t = free_at[i] > t ? free_at[i] : t;
  }
  return t;
}

/* Overlapped transfers (ffrun's MPI path) against their definition on random pipelines; never
 * slower than paired ones, equal without transfers; a worked GPipe case where every transfer but
 * the first of each direction hides behind compute. */
static void overlapped_transfers_match_their_definition(void **state) {
  (void)state;
  unsigned seed = 4242;
  for (int trial = 0; trial < 400; trial++) {
    int p = 1 + (int)(next_random(&seed) % 8);
    int64_t m = 1 + (int64_t)(next_random(&seed) % 32);
    double f[8], b[8], sf[8], sb[8], zero[8] = {0};
    for (int i = 0; i < p; i++) {
      f[i] = 0.5 + next_random(&seed) % 100 / 50.0;
      b[i] = f[i] * (1.5 + next_random(&seed) % 100 / 100.0);
      sf[i] = next_random(&seed) % 40 / 10.0; /* up to longer than any operation */
      sb[i] = next_random(&seed) % 40 / 10.0;
    }
    for (int s = 0; s < 2; s++) {
      ff_schedule sch = s ? FF_SCHEDULE_GPIPE : FF_SCHEDULE_1F1B;
      double over = ff_sim_pipeline(sch, FF_TRANSFERS_OVERLAPPED, p, m, f, b, sf, sb, NULL, NULL,
                                    NULL);
      assert_true(fabs(over - overlapped_reference(sch, p, m, f, b, sf, sb)) < 1e-9);
      assert_true(over <= ff_sim_pipeline(sch, FF_TRANSFERS_PAIRED, p, m, f, b, sf, sb, NULL, NULL,
                                          NULL) + 1e-9);
      double none = ff_sim_pipeline(sch, FF_TRANSFERS_OVERLAPPED, p, m, f, b, zero, zero, NULL,
                                    NULL, NULL);
      assert_true(fabs(none - ff_sim_pipeline(sch, FF_TRANSFERS_PAIRED, p, m, f, b, NULL, NULL,
                                              NULL, NULL, NULL)) < 1e-9);
    }
  }
  /* 2 stages, GPipe, 4 micro-batches of 1 s each way, transfers of 0.5 s: stage 1's forwards
   * run 1.5–5.5 (each input sent at 1, 2, 3, 4), its backwards 5.5–9.5; stage 0's backwards wait
   * for gradients arriving at 7, 8, 9, 10: done at 11 (paired exchanges: 14). */
  double f[2] = {1, 1}, b[2] = {1, 1}, c[1] = {0.5};
  assert_true(fabs(ff_sim_pipeline(FF_SCHEDULE_GPIPE, FF_TRANSFERS_OVERLAPPED, 2, 4, f, b, c, c,
                                   NULL, NULL, NULL) - 11.0) < 1e-12);
  assert_true(fabs(ff_sim_pipeline(FF_SCHEDULE_GPIPE, FF_TRANSFERS_PAIRED, 2, 4, f, b, c, c, NULL,
                                   NULL, NULL) - 14.0) < 1e-12);
}

static void count_ops(void *ctx, int stage, int64_t mb, bool backward, double start, double end) {
  (void)stage, (void)mb, (void)backward, (void)start, (void)end;
  ++*(int64_t *)ctx;
}

/* 1F1B skips its repeating steady rounds once two consecutive ones shift every stage by the same
 * time; with an observer every operation runs. Both give the same makespan, finish times and
 * peaks on random pipelines of up to 300 micro-batches, and 10^9 micro-batches take no time. */
static void skipping_steady_rounds_changes_nothing(void **state) {
  (void)state;
  unsigned seed = 777;
  for (int trial = 0; trial < 300; trial++) {
    int p = 1 + (int)(next_random(&seed) % 8);
    int64_t m = 1 + (int64_t)(next_random(&seed) % 300);
    double f[8], b[8], sf[8], sb[8], fin_a[8], fin_b[8];
    int64_t pk_a[8], pk_b[8], ops = 0;
    for (int i = 0; i < p; i++) {
      f[i] = 0.5 + next_random(&seed) % 100 / 50.0;
      b[i] = f[i] * (1.5 + next_random(&seed) % 100 / 100.0);
      sf[i] = next_random(&seed) % 10 / 20.0;
      sb[i] = next_random(&seed) % 10 / 20.0;
    }
    double fast = ff_sim_pipeline(FF_SCHEDULE_1F1B, FF_TRANSFERS_PAIRED, p, m, f, b, sf, sb, fin_a,
                                  NULL, pk_a);
    double full = ff_sim_pipeline_observed(FF_SCHEDULE_1F1B, FF_TRANSFERS_PAIRED, p, m, f, b, sf,
                                           sb, fin_b, NULL, pk_b, count_ops, &ops);
    assert_int_equal(ops, 2 * p * m);
    assert_true(fabs(fast / full - 1) < 1e-9);
    for (int i = 0; i < p; i++) {
      assert_true(fabs(fin_a[i] / fin_b[i] - 1) < 1e-9);
      assert_int_equal(pk_a[i], pk_b[i]);
    }
  }
  double f[4] = {1, 1.2, 0.9, 1.1}, b[4] = {2, 2.3, 1.8, 2.1}, x[3] = {0.1, 0.2, 0.1};
  double t = ff_sim_pipeline(FF_SCHEDULE_1F1B, FF_TRANSFERS_PAIRED, 4, 1000000000, f, b, x, x, NULL,
                             NULL, NULL);
  /* per round: the slowest stage's 3.5 s of compute plus exchanges of at most 0.2 s each side */
  assert_true(t > 1e9 * 3.5 && t < 1e9 * 3.9);
}

static void peak_in_flight_is_min_of_p_minus_i_and_m(void **state) {
  (void)state;
  for (int p = 1; p <= 8; p++)
    for (int64_t m = 1; m <= 12; m++) {
      double f[8], b[8];
      int64_t peak[8];
      for (int i = 0; i < p; i++)
        f[i] = 1.0 + i * 0.1, b[i] = 2.0 + (p - i) * 0.3;
      ff_sim_pipeline(FF_SCHEDULE_1F1B, FF_TRANSFERS_PAIRED, p, m, f, b, NULL, NULL, NULL, NULL, peak);
      for (int i = 0; i < p; i++) {
        assert_int_equal(peak[i], ff_sim_in_flight(FF_SCHEDULE_1F1B, p, i, m));
        assert_int_equal(peak[i], p - i < m ? p - i : m);
      }
      ff_sim_pipeline(FF_SCHEDULE_GPIPE, FF_TRANSFERS_PAIRED, p, m, f, b, NULL, NULL, NULL, NULL, peak);
      for (int i = 0; i < p; i++)
        assert_int_equal(peak[i], m);
    }
}

/* ---- whole plans: properties ---------------------------------------------------------------- */

static void shipped_plans_respect_physical_bounds(void **state) {
  (void)state;
  static const char *const plans[] = {"profiles/plans/tiny-1rank.json",
                                      "profiles/plans/tiny-asym.json",
                                      "profiles/plans/h100-8-llama-2-7b.json"};
  for (size_t i = 0; i < sizeof plans / sizeof *plans; i++) {
    ff_diag d;
    ff_plan plan;
    ff_plan_eval e;
    ff_diag_init(&d, plans[i]);
    assert_int_equal(ff_load_plan(plans[i], &d, &plan), FF_OK);
    assert_int_equal(ff_evaluate_plan(&plan, &e), FF_OK);
    assert_true(e.mfu > 0 && e.mfu <= 1 && e.hfu >= e.mfu && e.hfu <= 1);
    for (int p = 0; p < plan.n_pipelines; p++)
      for (int s = 0; s < plan.pipelines[p].n_stages; s++) {
        const ff_plan_stage *st = &plan.pipelines[p].stages[s];
        const ff_stage_eval *se = &e.pipelines[p].stages[s];
        double b = (double)plan.pipelines[p].micro_batch_size;
        double flops = (double)(st->layers.end - st->layers.first) * 3.0 *
                       ff_flops_layer_forward(&plan.model, b);
        double peak = 0;
        for (int t = 0; t < st->n_ranks; t++)
          peak += ff_peak_flops(&plan.cluster.devices[st->ranks[t].device], plan.training.precision);
        assert_true(se->fwd_seconds + se->bwd_seconds >= flops / peak);
      }
    ff_plan_eval_free(&e);
    ff_plan_free(&plan);
    ff_diag_free(&d);
  }
}

static void memory_grows_with_micro_batch_size_and_in_flight_count(void **state) {
  (void)state;
  ff_diag d;
  ff_plan plan;
  ff_diag_init(&d, "h100 plan");
  assert_int_equal(ff_load_plan("profiles/plans/h100-8-llama-2-7b.json", &d, &plan), FF_OK);
  ff_plan_eval small, big;
  assert_int_equal(ff_evaluate_plan(&plan, &small), FF_OK);
  for (int p = 0; p < plan.n_pipelines; p++) {
    plan.pipelines[p].micro_batch_size = 4;
    plan.pipelines[p].micro_batches /= 2;
  }
  assert_int_equal(ff_evaluate_plan(&plan, &big), FF_OK);
  for (int64_t r = 0; r < plan.n_ranks; r++)
    assert_true(big.ranks[r].memory_bytes[FF_MEM_ACTIVATIONS] >
                small.ranks[r].memory_bytes[FF_MEM_ACTIVATIONS]);
  /* Stage 0 holds 2 micro-batches in flight, stage 1 one, both 16 layers: stage 0 keeps each
   * layer's activations once more, and one more micro-batch's output, its gradient and tokens. */
  const ff_rank_eval *first = &small.ranks[0], *last = &small.ranks[2];
  const ff_plan_rank *r0 = &plan.pipelines[0].stages[0].ranks[0];
  ff_shard sh = {(double)(r0->heads.end - r0->heads.first),
                 (double)(r0->kv_heads.end - r0->kv_heads.first),
                 (double)(r0->ffn.end - r0->ffn.first), 0};
  double n = 2.0 * (double)plan.model.seq_len, h = (double)plan.model.hidden;
  double kept =
      ff_mem_layer_kept_bytes(&plan.model, sh, 2, FF_PRECISION_BF16, FF_RECOMPUTE_SELECTIVE);
  double diff = first->memory_bytes[FF_MEM_ACTIVATIONS] - last->memory_bytes[FF_MEM_ACTIVATIONS];
  assert_true(fabs(diff - (16 * kept + n * (2 * h + 1) * 4)) < 1e-9 * diff);
  ff_plan_eval_free(&small);
  ff_plan_eval_free(&big);
  ff_plan_free(&plan);
  ff_diag_free(&d);
}

/* Per token of a Llama-2-7B layer (h 4096, 32 heads, FFN 11008) ffrun keeps 4h + 2h + 2h + 3f =
 * 65792 values and 2 + 32 fp32 statistics; full recompute keeps the layer's input alone; and
 * selective keeps what none keeps (the attention stores no scores). */
static void kept_activations_count_what_ffrun_stores(void **state) {
  (void)state;
  ff_model m = {.layers = 32, .hidden = 4096, .heads = 32, .kv_heads = 32, .ffn_hidden = 11008,
                .vocab = 32000, .seq_len = 4096};
  ff_shard sh = {32, 32, 11008, 0};
  assert_true(ff_mem_layer_kept_bytes(&m, sh, 1, FF_PRECISION_BF16, FF_RECOMPUTE_NONE) ==
              4096.0 * (65792 * 2 + 34 * 4));
  assert_true(ff_mem_layer_kept_bytes(&m, sh, 1, FF_PRECISION_FP32, FF_RECOMPUTE_NONE) ==
              4096.0 * (65792 * 4 + 34 * 4));
  assert_true(ff_mem_layer_kept_bytes(&m, sh, 2, FF_PRECISION_BF16, FF_RECOMPUTE_SELECTIVE) ==
              ff_mem_layer_kept_bytes(&m, sh, 2, FF_PRECISION_BF16, FF_RECOMPUTE_NONE));
  assert_true(ff_mem_layer_kept_bytes(&m, sh, 1, FF_PRECISION_BF16, FF_RECOMPUTE_FULL) ==
              4096.0 * 4096 * 2);
  /* a TP half: half the heads and FFN columns, the residual stream whole */
  ff_shard half = {16, 16, 5504, 0};
  assert_true(ff_mem_layer_kept_bytes(&m, half, 1, FF_PRECISION_BF16, FF_RECOMPUTE_NONE) ==
              4096.0 * ((4 * 4096 + 4 * 2048 + 3 * 5504) * 2 + 18 * 4));
  assert_true(ff_mem_logits_bytes(&m, (ff_shard){0, 0, 0, 16000}, 2, FF_PRECISION_FP32) ==
              4.0 * 2 * 4096 * 16000);
  /* bf16: and the head's bf16 operands, the final norm's rows and the logits' gradient */
  assert_true(ff_mem_logits_bytes(&m, (ff_shard){0, 0, 0, 16000}, 2, FF_PRECISION_BF16) ==
              4.0 * 2 * 4096 * 16000 + 2.0 * 2 * 4096 * (4096 + 16000));
}

/* ffrun keeps fp32 weights (the master), gradients and moments in either precision, and under
 * bf16 the bf16 copy its matmuls read. */
static void ffrun_holds_18_bytes_per_parameter_in_bf16_and_16_in_fp32(void **state) {
  (void)state;
  assert_true(ff_mem_bytes_per_param(FF_PRECISION_BF16, false, 8) == 18);
  assert_true(ff_mem_bytes_per_param(FF_PRECISION_BF16, true, 8) == 6 + 12.0 / 8);
  assert_true(ff_mem_bytes_per_param(FF_PRECISION_FP32, false, 8) == 16);
  assert_true(ff_mem_bytes_per_param(FF_PRECISION_FP32, true, 4) == 8 + 8.0 / 4);
}

static void ring_allreduce_follows_the_alpha_beta_formula(void **state) {
  (void)state;
  ff_link l = {10, 5}; /* 10 GB/s, 5 us */
  double t = ff_comm_allreduce_ring(4, 1e9, l);
  assert_true(fabs(t - (6 * 5e-6 + 1.5 * 0.1)) < 1e-12);
  assert_true(ff_comm_allreduce_ring(1, 1e9, l) == 0);
  assert_true(fabs(ff_comm_p2p(1e9, l) - (5e-6 + 0.1)) < 1e-12);
}

/* Two pipelines of one TP-4 stage, one on each of two nodes (tests/data/cost/nic-dp.json): each
 * rank's gradient all-reduce has its peer on the other node, so the four ranks of a node share
 * its one NIC and each runs at a quarter of the 1.25 GB/s link — four times one rank's
 * all-reduce alone, as measured on such clusters (cost-model.md §5.8). Four NICs, or NICs
 * faster than the link, give each rank the link; slower NICs slow it further. */
static void gradient_sums_leaving_a_node_share_its_nics(void **state) {
  (void)state;
  ff_diag d;
  ff_diag_init(&d, NULL);
  ff_plan plan;
  assert_int_equal(ff_load_plan("tests/data/cost/nic-dp.json", &d, &plan), FF_OK);
  ff_diag_free(&d);
  ff_link link = ff_cluster_node_link(&plan.cluster, 0, 1);
  struct {
    int nics;
    double nic_gb_per_s, expect_gb_per_s;
  } cases[] = {{1, 0, link.bandwidth_gb_per_s / 4}, {4, 0, link.bandwidth_gb_per_s},
               {2, 0, link.bandwidth_gb_per_s / 2}, {8, 100, link.bandwidth_gb_per_s},
               {1, 0.5, 0.5 / 4}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    for (int n = 0; n < 2; n++) {
      plan.cluster.nodes[n].nics = cases[i].nics;
      plan.cluster.nodes[n].nic_bandwidth_gb_per_s = cases[i].nic_gb_per_s;
    }
    ff_plan_eval e;
    assert_int_equal(ff_evaluate_plan(&plan, &e), FF_OK);
    ff_link shared = {cases[i].expect_gb_per_s, link.latency_us};
    for (int r = 0; r < 8; r++) {
      double want = ff_comm_allreduce_ring(2, e.ranks[r].params * 4.0, shared);
      assert_true(fabs(e.ranks[r].dp_seconds / want - 1) < 1e-12);
    }
    ff_plan_eval_free(&e);
  }
  /* One flow alone is never faster than the link, however many and fast the NICs. */
  for (int n = 0; n < 2; n++) {
    plan.cluster.nodes[n].nics = 64;
    plan.cluster.nodes[n].nic_bandwidth_gb_per_s = 100;
  }
  ff_link one = ff_cluster_shared_link(&plan.cluster, link, 0, 1, 1, 1);
  assert_true(one.bandwidth_gb_per_s == link.bandwidth_gb_per_s);
  ff_plan_free(&plan);
}

static bool near(double got, double want) { return fabs(got / want - 1) < 1e-12; }

/* A stage boundary moves each element once (cost-model.md §5.6): pieces n_a + n_b − gcd; between
 * nodes the largest piece, S/max(n_a, n_b), over the shared link; inside a node S/min(n_a, n_b)
 * per link; then the receiving group's gather, one broadcast of S/n per member. */
static void a_boundary_moves_each_element_once(void **state) {
  (void)state;
  assert_int_equal(ff_boundary_flows(1, 1), 1);
  assert_int_equal(ff_boundary_flows(8, 8), 8);
  assert_int_equal(ff_boundary_flows(2, 4), 4);
  assert_int_equal(ff_boundary_flows(4, 2), 4);
  assert_int_equal(ff_boundary_flows(2, 3), 4);
  assert_int_equal(ff_boundary_flows(1, 8), 8);
  ff_link net = {1.25, 10}; /* 10 Gb/s, 10 us */
  double S = 32.0 * 1048576.0;
  /* two TP-8 groups on two nodes with one NIC: eight pieces of S/8 at 1/8 of the link each, so
   * one copy of S through the NIC; a copy per receiving rank would have taken 8x */
  ff_link shared = {net.bandwidth_gb_per_s / ff_boundary_flows(8, 8), net.latency_us};
  assert_true(near(ff_comm_boundary(S, 8, 8, true, shared), 10e-6 + S / 1.25e9));
  assert_true(near(ff_comm_boundary(S, 2, 4, true, net), 10e-6 + S / 4 / 1.25e9));
  ff_link nvl = {450, 2};
  assert_true(near(ff_comm_boundary(S, 1, 4, false, nvl), 2e-6 + S / 450e9));
  assert_true(near(ff_comm_boundary(S, 4, 2, false, nvl), 2e-6 + S / 2 / 450e9));
  ff_diag d;
  ff_diag_init(&d, NULL);
  ff_plan plan;
  assert_int_equal(ff_load_plan("profiles/plans/h100-8-llama-2-7b.json", &d, &plan), FF_OK);
  ff_diag_free(&d);
  int node[4] = {0, 0, 0, 0}, gpu[4] = {0, 1, 2, 3};
  assert_true(ff_comm_gather(&plan.cluster, 1, node, gpu, S) == 0.0);
  assert_true(near(ff_comm_gather(&plan.cluster, 4, node, gpu, S), 4 * 2e-6 + S / 450e9));
  assert_true(near(ff_comm_gather_node(&plan.cluster, 0, 0, 4, S), 4 * 2e-6 + S / 450e9));
  assert_true(ff_comm_gather_node(&plan.cluster, 0, 3, 1, S) == 0.0);
  ff_plan_free(&plan);
}

/* A device of 200 bf16 and 20 fp32 TFLOP/s and 1 TB/s, for the attention timings below. */
static ff_device attention_device(void) {
  ff_device dev = {.memory_bandwidth_gb_per_s = 1000};
  dev.peak_tflops[FF_DTYPE_BF16] = 200.0;
  dev.peak_tflops[FF_DTYPE_FP32] = 20.0;
  return dev;
}

/* The attention core as each kernel does it: auto resolves by precision; the flash kernels do
 * the causal half of the products, 2.5 times as many backward, at the flash efficiencies of the
 * math they run on; the GEMM kernel materialises fp32 scores (all s² of them in one chunk, the
 * keys up to each chunk's end in several) and passes over them 4 times forward and 10 backward. */
static void attention_is_timed_as_its_kernel_runs_it(void **state) {
  (void)state;
  assert_int_equal(ff_cost_attention_kernel(FF_ATTENTION_AUTO, FF_PRECISION_BF16),
                   FF_ATTENTION_GEMM);
  assert_int_equal(ff_cost_attention_kernel(FF_ATTENTION_AUTO, FF_PRECISION_FP32),
                   FF_ATTENTION_FUSED);
  assert_int_equal(ff_cost_attention_kernel(FF_ATTENTION_TENSOR, FF_PRECISION_FP32),
                   FF_ATTENTION_FUSED);
  assert_int_equal(ff_cost_attention_kernel(FF_ATTENTION_GEMM, FF_PRECISION_BF16),
                   FF_ATTENTION_GEMM);
  ff_model m = {.hidden = 1024, .heads = 16, .kv_heads = 16, .seq_len = 2048};
  ff_device dev = attention_device();
  double s = 2048, hd = 64, a = 16, b = 2, bw = 1000e9 * FF_COST_MEMORY_EFFICIENCY;
  double pairs = b * a * s * (s + 1) / 2;
  ff_attention_time t =
      ff_cost_attention_time(&m, FF_PRECISION_BF16, FF_ATTENTION_TENSOR, &dev, a, a, b);
  assert_true(near(t.fwd, 4 * pairs * hd / (200e12 * FF_COST_FLASH_EFFICIENCY_FWD)));
  assert_true(near(t.bwd, 10 * pairs * hd / (200e12 * FF_COST_FLASH_EFFICIENCY_BWD)));
  /* fused runs in fp32 on CUDA cores whatever the plan's precision */
  t = ff_cost_attention_time(&m, FF_PRECISION_BF16, FF_ATTENTION_FUSED, &dev, a, a, b);
  assert_true(near(t.fwd, 4 * pairs * hd / (20e12 * FF_COST_FLASH_EFFICIENCY_FWD)));
  /* gemm, one chunk (16·2048² floats fit 2²⁶): s² cells per head; its GEMMs are bound by the
   * pass over the scores here (by their FLOPs in the fp32 case below) */
  double cells = b * a * s * s, io = b * s * hd * 2 * (2 * a + 2 * a);
  double gemm = 2 * cells * hd / (200e12 * FF_COST_GEMM_EFFICIENCY), pass = 4 * cells / bw;
  assert_true(gemm < pass);
  gemm = pass;
  t = ff_cost_attention_time(&m, FF_PRECISION_BF16, FF_ATTENTION_GEMM, &dev, a, a, b);
  assert_true(near(t.fwd, 2 * gemm + 2 * pass + io / bw));
  assert_true(near(t.bwd, 5 * gemm + 5 * pass + 2 * io / bw));
  /* four chunks of 2048 rows at s = 8192 with 4 heads: 2048²·(1 + 2 + 3) + 2048·8192 cells */
  m.seq_len = 8192;
  s = 8192;
  a = 4;
  cells = b * a * (2048.0 * 2048 * 6 + 2048.0 * 8192);
  t = ff_cost_attention_time(&m, FF_PRECISION_FP32, FF_ATTENTION_GEMM, &dev, a, 1, b);
  gemm = 2 * cells * hd / (20e12 * FF_COST_GEMM_EFFICIENCY);
  pass = 4 * cells / bw;
  io = b * s * hd * 4 * (2 * a + 2);
  assert_true(gemm > pass);
  double want = 2 * gemm + 2 * pass + io / bw;
  assert_true(near(t.fwd, want));
  /* a shard without heads does no attention */
  t = ff_cost_attention_time(&m, FF_PRECISION_FP32, FF_ATTENTION_GEMM, &dev, 0, 0, b);
  assert_true(t.fwd == 0 && t.bwd == 0);
  /* where memory is slow the materialised scores cost more than the flash kernel's extra work */
  dev.memory_bandwidth_gb_per_s = 100;
  ff_attention_time flash =
      ff_cost_attention_time(&m, FF_PRECISION_BF16, FF_ATTENTION_TENSOR, &dev, a, 1, b);
  t = ff_cost_attention_time(&m, FF_PRECISION_BF16, FF_ATTENTION_GEMM, &dev, a, 1, b);
  assert_true(t.fwd > flash.fwd && t.bwd > flash.bwd);
}

/* Megatron-LM's core attention writes all s² scores of a head (the mask is applied, not
 * skipped) in the training precision and passes over them: forward two GEMMs, softmax (fused
 * under bf16; under fp32 the scale, masked_fill and PyTorch's softmax) and dropout with its
 * one-byte mask; backward four GEMMs, dropout, softmax (under fp32 its product first, then the
 * mask's and the scale's backward). */
static void megatron_attention_passes_over_every_score(void **state) {
  (void)state;
  assert_int_equal(ff_cost_attention_kernel(FF_ATTENTION_MEGATRON, FF_PRECISION_FP32),
                   FF_ATTENTION_MEGATRON);
  ff_model m = {.hidden = 1024, .heads = 16, .kv_heads = 16, .seq_len = 2048};
  ff_device dev = attention_device();
  double s = 2048, hd = 64, a = 16, b = 2, bw = 1000e9 * FF_COST_MEMORY_EFFICIENCY;
  double cells = b * a * s * s, mask = cells / bw;
  /* bf16: the GEMMs are bound by their pass over the 2-byte scores */
  double pass = 2 * cells / bw, gemm = 2 * cells * hd / (200e12 * FF_COST_GEMM_EFFICIENCY);
  assert_true(gemm < pass);
  double io = b * s * hd * 2 * (2 * a + 2 * a);
  ff_attention_time t =
      ff_cost_attention_time(&m, FF_PRECISION_BF16, FF_ATTENTION_MEGATRON, &dev, a, a, b);
  assert_true(near(t.fwd, 2 * pass + 4 * pass + mask + io / bw));
  assert_true(near(t.bwd, 4 * pass + 5 * pass + mask + 2 * io / bw));
  /* fp32: 4-byte scores, bound by the FLOPs on CUDA cores; unfused, the scale, the mask and
   * PyTorch's softmax (its backward's product first) make eight passes forward, twelve back */
  pass = 4 * cells / bw;
  gemm = 2 * cells * hd / (20e12 * FF_COST_GEMM_EFFICIENCY);
  assert_true(gemm > pass);
  io = b * s * hd * 4 * (2 * a + 2 * a);
  t = ff_cost_attention_time(&m, FF_PRECISION_FP32, FF_ATTENTION_MEGATRON, &dev, a, a, b);
  assert_true(near(t.fwd, 2 * gemm + 8 * pass + mask + io / bw));
  assert_true(near(t.bwd, 4 * gemm + 12 * pass + mask + 2 * io / bw));
  /* ffrun's GEMM kernel skips the masked half and keeps fewer passes: never slower */
  ff_attention_time own =
      ff_cost_attention_time(&m, FF_PRECISION_FP32, FF_ATTENTION_GEMM, &dev, a, a, b);
  assert_true(own.fwd < t.fwd && own.bwd < t.bwd);
}

/* The embedding and the LM head as ffrun runs them, and the head as Megatron-LM does
 * (cost-model.md §3.3): the lookup writes its rows in the wire's element and sums them over the
 * group once, forward; ffrun's head does its whole backward inside the forward, with the row max
 * and row sum and the input gradient summed there; Megatron's sums three row statistics forward
 * and the input gradient backward. */
static void the_ends_do_what_ffrun_and_megatron_do(void **state) {
  (void)state;
  ff_model m = {.hidden = 1024, .heads = 16, .kv_heads = 16, .seq_len = 2048, .vocab = 32000};
  ff_device dev = attention_device();
  ff_training t = {.precision = FF_PRECISION_BF16, .attention = FF_ATTENTION_AUTO};
  assert_true(ff_cost_wire_bytes(&t) == 4.0); /* ffrun's activations stay fp32 */
  double b = 2, n = b * 2048, h = 1024, v = 16000;
  ff_end_time e = ff_cost_embedding_time(&m, &t, &dev, b);
  assert_true(near(e.fwd, ff_time_memory(&dev, n * h * 4)));
  assert_true(near(e.bwd, ff_time_memory(&dev, 2 * n * h * 4)));
  assert_int_equal(e.ar_fwd, 1);
  assert_int_equal(e.ar_bwd + e.ar_small_fwd + e.ar_small_bwd, 0);
  t.wire = FF_WIRE_BF16;
  assert_true(ff_cost_wire_bytes(&t) == 2.0);
  assert_true(near(ff_cost_embedding_time(&m, &t, &dev, b).fwd, ff_time_memory(&dev, n * h * 2)));
  t.wire = FF_WIRE_FP32;
  ff_shard sh = {0, 0, 0, v};
  double gemm = ff_time_gemm(&dev, FF_PRECISION_BF16, n, v, h);
  double norm = ff_time_memory(&dev, 5 * n * h * 4), pass = ff_time_memory(&dev, n * v * 4);
  e = ff_cost_head_time(&m, &t, &dev, sh, b);
  assert_true(near(e.fwd, 3 * gemm + norm + 3.5 * pass));
  assert_true(e.bwd == 0.0);
  assert_int_equal(e.ar_fwd, 1);
  assert_int_equal(e.ar_small_fwd, 2);
  assert_int_equal(e.ar_bwd + e.ar_small_bwd, 0);
  assert_true(near(ff_cost_end_tp_fwd(e, 3.0, 0.5), 4.0));
  assert_true(ff_cost_end_tp_bwd(e, 3.0, 0.5) == 0.0);
  t.precision = FF_PRECISION_FP32;
  gemm = ff_time_gemm(&dev, FF_PRECISION_FP32, n, v, h);
  assert_true(near(ff_cost_head_time(&m, &t, &dev, sh, b).fwd, 3 * gemm + norm + 4 * pass));
  t.attention = FF_ATTENTION_MEGATRON;
  e = ff_cost_head_time(&m, &t, &dev, sh, b);
  double norm_fwd = ff_time_memory(&dev, 2 * n * h * 4);
  double norm_bwd = ff_time_memory(&dev, 3 * n * h * 4);
  assert_true(near(e.fwd, gemm + norm_fwd + 8 * pass));
  assert_true(near(e.bwd, 2 * gemm + norm_bwd + 2 * pass));
  assert_int_equal(e.ar_bwd, 1);
  assert_int_equal(e.ar_small_fwd, 3);
  assert_int_equal(e.ar_fwd + e.ar_small_bwd, 0);
  assert_true(near(ff_cost_end_tp_bwd(e, 3.0, 0.5), 3.0));
  assert_true(near(ff_cost_end_tp_fwd(e, 3.0, 0.5), 1.5));
  t.precision = FF_PRECISION_BF16; /* the fp32 copy of the logits: 1.5 passes each way */
  gemm = ff_time_gemm(&dev, FF_PRECISION_BF16, n, v, h);
  e = ff_cost_head_time(&m, &t, &dev, sh, b);
  assert_true(near(e.fwd, gemm + norm_fwd + 9.5 * pass));
  assert_true(near(e.bwd, 2 * gemm + norm_bwd + 3.5 * pass));
}

static void measured_layer_times_take_precedence(void **state) {
  (void)state;
  ff_diag d;
  ff_plan plan;
  ff_diag_init(&d, "h100 plan");
  assert_int_equal(ff_load_plan("profiles/plans/h100-8-llama-2-7b.json", &d, &plan), FF_OK);
  ff_plan_eval before, after;
  assert_int_equal(ff_evaluate_plan(&plan, &before), FF_OK);
  ff_device *dev = &plan.cluster.devices[0];
  ff_layer_measure measured = {.precision = FF_PRECISION_BF16, .micro_batch_size = 2, .tp = 2,
                               .forward_ms = 10.0, .backward_ms = 20.0};
  snprintf(measured.model, sizeof measured.model, "%s", plan.model.name);
  dev->layers = &measured;
  dev->n_layers = 1;
  assert_int_equal(ff_evaluate_plan(&plan, &after), FF_OK);
  /* Stage 1 (16 layers, no embedding): forward is 16 x 10 ms plus the LM head. */
  const ff_rank_eval *r = &after.ranks[2];
  assert_true(r->compute_fwd_seconds >= 0.160 && r->compute_fwd_seconds < 0.160 + 0.05);
  assert_true(after.ranks[2].compute_fwd_seconds != before.ranks[2].compute_fwd_seconds);
  dev->layers = NULL;
  dev->n_layers = 0;
  ff_plan_eval_free(&before);
  ff_plan_eval_free(&after);
  ff_plan_free(&plan);
  ff_diag_free(&d);
}

/* Without an entry of exactly its micro-batch size and TP degree, a layer is timed from the
 * nearest measured one of the same model and precision, scaled by the model: measured / modelled
 * of that entry times the modelled time of this layer, forward and backward apart. An entry of
 * the same TP degree is preferred (its all-reduces inside, none added); from TP 1 the reference
 * is the whole layer and the rank's all-reduces are added as modelled. */
static void measured_layer_times_carry_over_to_other_shapes(void **state) {
  (void)state;
  ff_model m = {.layers = 4, .hidden = 512, .heads = 8, .kv_heads = 4, .ffn_hidden = 1376,
                .vocab = 256, .seq_len = 256};
  snprintf(m.name, sizeof m.name, "carry");
  ff_device dev = {.memory_bandwidth_gb_per_s = 900};
  dev.peak_tflops[FF_DTYPE_FP32] = 20.0;
  const ff_precision fp32 = FF_PRECISION_FP32;
  ff_shard whole = {8, 4, 1376, 256}, half = {4, 2, 688, 256};
  double ar = 1e-4; /* one TP all-reduce */
  ff_layer_time w1 = ff_cost_layer_time(&m, fp32, FF_ATTENTION_AUTO, &dev, whole, 1, 1,
                                        FF_RECOMPUTE_NONE, 0);
  ff_layer_time w2 = ff_cost_layer_time(&m, fp32, FF_ATTENTION_AUTO, &dev, whole, 2, 1,
                                        FF_RECOMPUTE_NONE, 0);
  ff_layer_time h2 = ff_cost_layer_time(&m, fp32, FF_ATTENTION_AUTO, &dev, half, 2, 2,
                                        FF_RECOMPUTE_FULL, ar);
  ff_layer_measure table[] = {
      {.precision = FF_PRECISION_FP32, .micro_batch_size = 1, .tp = 1, .forward_ms = 3.0,
       .backward_ms = 9.0},
      {.precision = FF_PRECISION_BF16, .micro_batch_size = 2, .tp = 1, .forward_ms = 1.0,
       .backward_ms = 1.0}, /* another precision: never used for fp32 */
  };
  snprintf(table[0].model, sizeof table[0].model, "carry");
  snprintf(table[1].model, sizeof table[1].model, "carry");
  dev.layers = table;
  dev.n_layers = 2;
  ff_layer_time t = ff_cost_layer_time(&m, fp32, FF_ATTENTION_AUTO, &dev, whole, 1, 1,
                                       FF_RECOMPUTE_NONE, 0);
  assert_float_equal(t.fwd, 3e-3, 1e-15); /* the exact entry */
  assert_float_equal(t.bwd, 9e-3, 1e-15);
  t = ff_cost_layer_time(&m, fp32, FF_ATTENTION_AUTO, &dev, whole, 2, 1, FF_RECOMPUTE_NONE, 0);
  assert_float_equal(t.fwd, 3e-3 * w2.fwd / w1.fwd, 1e-12);
  assert_float_equal(t.bwd, 9e-3 * w2.bwd / w1.bwd, 1e-12);
  t = ff_cost_layer_time(&m, fp32, FF_ATTENTION_AUTO, &dev, half, 2, 2, FF_RECOMPUTE_FULL, ar);
  assert_float_equal(t.fwd, 3e-3 * h2.fwd / w1.fwd, 1e-12); /* from TP 1: the whole layer */
  assert_float_equal(t.bwd, 9e-3 * h2.bwd / w1.bwd, 1e-12);
  assert_float_equal(t.recompute, t.fwd, 0);
  assert_float_equal(t.tp_fwd, 2 * ar, 0); /* all-reduces modelled: none was measured */
  assert_float_equal(t.tp_bwd, 4 * ar, 0);
  table[1] = (ff_layer_measure){.precision = FF_PRECISION_FP32, .micro_batch_size = 1, .tp = 2,
                                .forward_ms = 2.0, .backward_ms = 5.0};
  snprintf(table[1].model, sizeof table[1].model, "carry");
  ff_layer_time h1 = ff_cost_layer_time(&m, fp32, FF_ATTENTION_AUTO, &(ff_device){
      .memory_bandwidth_gb_per_s = 900, .peak_tflops[FF_DTYPE_FP32] = 20.0}, half, 1, 2,
      FF_RECOMPUTE_FULL, ar);
  t = ff_cost_layer_time(&m, fp32, FF_ATTENTION_AUTO, &dev, half, 2, 2, FF_RECOMPUTE_FULL, ar);
  assert_float_equal(t.fwd, 2e-3 * h2.fwd / h1.fwd, 1e-12); /* the same degree first */
  assert_float_equal(t.bwd, 5e-3 * h2.bwd / h1.bwd, 1e-12);
  assert_float_equal(t.tp_fwd, 0, 0); /* inside the measurement */
  assert_float_equal(t.tp_bwd, 2 * ar, 0); /* the recompute's, as for an exact entry */
  snprintf(m.name, sizeof m.name, "other");
  t = ff_cost_layer_time(&m, fp32, FF_ATTENTION_AUTO, &dev, half, 2, 2, FF_RECOMPUTE_FULL, ar);
  assert_float_equal(t.fwd, h2.fwd, 0); /* another model's entries: the model alone */
}

/* GEMM efficiency from a device's table: the exact shape when listed; else linear in the log of
 * the geometric mean size between the nearest sizes, flat beyond the ends; bf16 training reads
 * fp16 entries on a device without bf16 ones. A measured streaming bandwidth replaces 0.8 of the
 * datasheet for memory-bound work, never above the datasheet. */
static void gemm_efficiency_is_interpolated_between_measured_sizes(void **state) {
  (void)state;
  ff_gemm_measure table[] = {
      {FF_DTYPE_FP16, 1024, 1024, 1024, 30.0},
      {FF_DTYPE_FP16, 4096, 4096, 4096, 80.0},
      {FF_DTYPE_FP16, 8192, 2048, 512, 50.0}, /* exact-shape entry, g = 2048 */
      {FF_DTYPE_FP32, 4096, 4096, 4096, 10.0},
  };
  ff_device dev = {.memory_bandwidth_gb_per_s = 1e5, .gemm = table, .n_gemm = 4};
  dev.peak_tflops[FF_DTYPE_FP16] = 100.0;
  dev.peak_tflops[FF_DTYPE_FP32] = 20.0;
  double flops = 2.0 * 2048 * 2048 * 2048;
  /* 2048³ lies halfway between 1024³ (0.3) and 4096³ (0.8) in ln g, but the 8192×2048×512
   * entry has the same g (2³³ both), so it is the nearest on both sides: 0.5. */
  double t = ff_time_gemm(&dev, FF_PRECISION_BF16, 2048, 2048, 2048);
  assert_true(fabs(t / (flops / (100e12 * 0.5)) - 1) < 1e-12);
  table[2].m = 16384; /* g = 2580: now 2048³ lies between 1024³ and it */
  double lg = log(2048.0), lo = log(1024.0), hi = log(16384.0 * 2048 * 512) / 3.0;
  double eff = 0.3 + (0.5 - 0.3) * (lg - lo) / (hi - lo);
  t = ff_time_gemm(&dev, FF_PRECISION_BF16, 2048, 2048, 2048);
  assert_true(fabs(t / (flops / (100e12 * eff)) - 1) < 1e-12);
  /* exact shape, and flat beyond both ends */
  t = ff_time_gemm(&dev, FF_PRECISION_BF16, 16384, 2048, 512);
  assert_true(fabs(t / (2.0 * 16384 * 2048 * 512 / 50e12) - 1) < 1e-12);
  t = ff_time_gemm(&dev, FF_PRECISION_BF16, 256, 256, 256);
  assert_true(fabs(t / (2.0 * 256 * 256 * 256 / 30e12) - 1) < 1e-12);
  t = ff_time_gemm(&dev, FF_PRECISION_BF16, 65536, 65536, 8192);
  assert_true(fabs(t / (2.0 * 65536 * 65536 * 8192 / 80e12) - 1) < 1e-12);
  /* fp32 training reads only fp32 entries */
  t = ff_time_gemm(&dev, FF_PRECISION_FP32, 1024, 1024, 1024);
  assert_true(fabs(t / (2.0 * 1024 * 1024 * 1024 / 10e12) - 1) < 1e-12);
  /* a bf16 entry, once there, is preferred for bf16 training; none here at this dtype: default */
  table[3].dtype = FF_DTYPE_BF16;
  t = ff_time_gemm(&dev, FF_PRECISION_BF16, 4096, 4096, 4096);
  assert_true(fabs(t / (2.0 * 4096 * 4096 * 4096 / 10e12) - 1) < 1e-12);
  dev.n_gemm = 0;
  t = ff_time_gemm(&dev, FF_PRECISION_BF16, 4096, 4096, 4096);
  assert_true(fabs(t / (2.0 * 4096 * 4096 * 4096 / (100e12 * FF_COST_GEMM_EFFICIENCY)) - 1) <
              1e-12);
  /* memory: 0.8 of the datasheet, a measurement, and never above the datasheet */
  dev.memory_bandwidth_gb_per_s = 1000;
  assert_true(fabs(ff_time_memory(&dev, 8e9) - 8e9 / 800e9) < 1e-15);
  dev.measured_memory_gb_per_s = 900;
  assert_true(fabs(ff_time_memory(&dev, 9e9) - 0.01) < 1e-15);
  dev.measured_memory_gb_per_s = 1200;
  assert_true(fabs(ff_time_memory(&dev, 1e9) - 1e-3) < 1e-15);
}

/* The largest model every reader bound allows: its parameter count is exact in int64 (checked
 * against 128-bit arithmetic), and bytes and FLOPs, computed in double, stay finite. */
static void sizes_of_the_largest_readable_model_cannot_overflow(void **state) {
  (void)state;
  ff_model m = {.layers = 100000, .hidden = 1 << 20, .heads = 1 << 20, .kv_heads = 1 << 20,
                .ffn_hidden = 1 << 24, .vocab = 1 << 24, .seq_len = 1 << 24};
  __int128 h = m.hidden, layer = 4 * h * h + 3 * h * m.ffn_hidden + 2 * h;
  __int128 want = 2 * (__int128)m.vocab * h + m.layers * layer + h;
  assert_true(want < INT64_MAX);
  assert_true((__int128)ff_model_parameters(&m) == want);
  double bytes =
      (double)ff_model_parameters(&m) * ff_mem_bytes_per_param(FF_PRECISION_BF16, false, 1);
  assert_true(isfinite(bytes) && bytes > 1e19);
  double flops = ff_flops_model_per_token(&m) * (double)m.seq_len * 1e9; /* a batch of 10^9 */
  assert_true(isfinite(flops) && flops > 0);
  /* A 1T-parameter model: 18 bytes per parameter in bf16, exactly as counted. */
  ff_model t = {.layers = 128, .hidden = 25600, .heads = 160, .kv_heads = 160, .ffn_hidden = 102400,
                .vocab = 128000, .seq_len = 2048};
  int64_t n = ff_model_parameters(&t);
  assert_true(n > 1000000000000LL);
  assert_true(ff_mem_bytes_per_param(FF_PRECISION_BF16, false, 1) * (double)n == 18.0 * (double)n);
}

/* The simulator keeps a ring of finish times, not one per micro-batch: 10^7 micro-batches of
 * equal stages take exactly (m − 1)·max + Σ, in a few megabytes. */
static void ten_million_micro_batches_simulate_exactly(void **state) {
  (void)state;
  double f[4] = {1, 1, 1, 1}, b[4] = {2, 2, 2, 2};
  int64_t m = 10000000;
  for (int sched = 0; sched < 2; sched++) {
    double t = ff_sim_pipeline(sched ? FF_SCHEDULE_GPIPE : FF_SCHEDULE_1F1B, FF_TRANSFERS_PAIRED, 4,
                               m, f, b, NULL, NULL, NULL, NULL, NULL);
    double want = sched ? ff_sim_gpipe_closed_form(4, m, f, b) : ff_sim_closed_form(4, m, f, b);
    assert_true(t == want);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(activation_memory_matches_korthikanti_figure_1_exactly),
      cmocka_unit_test(activation_memory_orders_recompute_modes),
      cmocka_unit_test(mfu_matches_published_iteration_times),
      cmocka_unit_test(flops_reduce_to_the_gpt_formula_for_mha_and_4h_mlp),
      cmocka_unit_test(equal_stages_take_m_plus_p_minus_1_slots),
      cmocka_unit_test(random_pipelines_match_a_brute_force_schedule),
      cmocka_unit_test(skipping_steady_rounds_changes_nothing),
      cmocka_unit_test(overlapped_transfers_match_their_definition),
      cmocka_unit_test(peak_in_flight_is_min_of_p_minus_i_and_m),
      cmocka_unit_test(shipped_plans_respect_physical_bounds),
      cmocka_unit_test(memory_grows_with_micro_batch_size_and_in_flight_count),
      cmocka_unit_test(kept_activations_count_what_ffrun_stores),
      cmocka_unit_test(ffrun_holds_18_bytes_per_parameter_in_bf16_and_16_in_fp32),
      cmocka_unit_test(ring_allreduce_follows_the_alpha_beta_formula),
      cmocka_unit_test(attention_is_timed_as_its_kernel_runs_it),
      cmocka_unit_test(megatron_attention_passes_over_every_score),
      cmocka_unit_test(the_ends_do_what_ffrun_and_megatron_do),
      cmocka_unit_test(measured_layer_times_take_precedence),
      cmocka_unit_test(measured_layer_times_carry_over_to_other_shapes),
      cmocka_unit_test(gemm_efficiency_is_interpolated_between_measured_sizes),
      cmocka_unit_test(gradient_sums_leaving_a_node_share_its_nics),
      cmocka_unit_test(a_boundary_moves_each_element_once),
      cmocka_unit_test(sizes_of_the_largest_readable_model_cannot_overflow),
      cmocka_unit_test(ten_million_micro_batches_simulate_exactly),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
