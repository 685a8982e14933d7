/* model.c — the Llama decoder over one rank's layers and shard: the tensor table, initial
 * weights from a counter-based generator, allocation, and (model_layers.c) forward/backward of
 * one micro-batch.
 *
 * Forward of a layer, with N = b·S tokens and this rank's Hl heads, Kl kv heads, Fl FFN columns:
 *   h1 = rmsnorm(x_in) ; q,k,v = h1·Wq,k,vᵀ ; rope(q,k) ; att = attention(q,k,v)
 *   x_mid = x_in + att·Woᵀ ; h2 = rmsnorm(x_mid) ; act = silu(h2·Wgᵀ) ∘ (h2·Wuᵀ)
 *   x_out = x_mid + act·Wdᵀ
 * and the backward pass walks the same list in reverse. Where a tensor-parallel group would
 * all-reduce (after the row-parallel Wo and Wd, and the input gradients of the column-parallel
 * matmuls) this one-rank code holds the whole sums already. A bf16 plan keeps what the backward
 * needs in bf16: the residual stream is rounded in place as it is made (keep) and unpacked for
 * the backward (load_layer); every other kept tensor is written in bf16 by the kernel that
 * makes it and read so by the matmuls, attention and SwiGLU; the rest of the layer is computed
 * in fp32 in one work set. Every matmul runs on bf16 operands: a bf16 copy of the weights, the
 * kept bf16 inputs, output gradients rounded to bf16 (mm_fwd, mm_bwd), accumulating in fp32.
 * A stage with full recompute keeps only each layer's input, and load_layer runs the layer's
 * forward again into the work set. What is allocated here is what the cost model predicts (ff_mem_layer_kept_bytes,
 * ff_mem_stage_buffer_bytes): change one, change the other. */
#define _POSIX_C_SOURCE 200809L
#include "model.h"
#include "model_internal.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- counter-based initial weights ------------------------------------------------------ */

static uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* Element `index` of the tensor whose key is init_key(seed, name). */
static double init_normal_keyed(uint64_t key, int64_t index) {
  uint64_t a = splitmix64(key ^ splitmix64((uint64_t)index * 2u));
  uint64_t b = splitmix64(key ^ splitmix64((uint64_t)index * 2u + 1u));
  double u1 = ((double)(a >> 11) + 0.5) / 9007199254740992.0; /* (0, 1) */
  double u2 = (double)(b >> 11) / 9007199254740992.0;
  return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

static uint64_t init_key(uint64_t seed, const char *name) {
  return splitmix64(seed) ^ ff_fnv1a64(name, strlen(name));
}

double ff_init_normal(uint64_t seed, const char *name, int64_t index) {
  return init_normal_keyed(init_key(seed, name), index);
}

/* ---- the tensor table ------------------------------------------------------------------- */

typedef struct table_builder {
  ff_tensor *t;
  int n, cap;
  int64_t offset;
} table_builder;

static void add_tensor(table_builder *tb, const char *name, int64_t rows, int64_t cols,
                       int64_t r0, int64_t r1, int64_t c0, int64_t c1, float std, bool replicated) {
  if (tb->n == tb->cap)
    return;
  ff_tensor *t = &tb->t[tb->n++];
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, "%s", name);
  t->rows = rows;
  t->cols = cols;
  t->row_first = r0;
  t->row_end = r1;
  t->col_first = c0;
  t->col_end = c1;
  t->numel = (r1 - r0) * (c1 - c0);
  t->offset = tb->offset;
  tb->offset += t->numel;
  t->init_std = std;
  t->decay = std > 0;
  t->replicated = replicated;
}

static void build_layer_tensors(table_builder *tb, const ff_model *m, const ff_shard_spec *s,
                                int64_t layer) {
  int64_t C = m->hidden, D = m->hidden / m->heads, H = m->heads, K = m->kv_heads, F = m->ffn_hidden;
  float std = 0.02f, out_std = 0.02f / sqrtf(2.0f * (float)m->layers);
  char name[48];
#define T(suffix) (snprintf(name, sizeof name, "layers.%lld." suffix, (long long)layer), name)
  add_tensor(tb, T("attn_norm"), C, 1, 0, C, 0, 1, 0, true);
  add_tensor(tb, T("wq"), H * D, C, s->heads.first * D, s->heads.end * D, 0, C, std, false);
  add_tensor(tb, T("wk"), K * D, C, s->kv_heads.first * D, s->kv_heads.end * D, 0, C, std, false);
  add_tensor(tb, T("wv"), K * D, C, s->kv_heads.first * D, s->kv_heads.end * D, 0, C, std, false);
  add_tensor(tb, T("wo"), C, H * D, 0, C, s->heads.first * D, s->heads.end * D, out_std, false);
  add_tensor(tb, T("mlp_norm"), C, 1, 0, C, 0, 1, 0, true);
  add_tensor(tb, T("w_gate"), F, C, s->ffn.first, s->ffn.end, 0, C, std, false);
  add_tensor(tb, T("w_up"), F, C, s->ffn.first, s->ffn.end, 0, C, std, false);
  add_tensor(tb, T("w_down"), C, F, 0, C, s->ffn.first, s->ffn.end, out_std, false);
#undef T
}


static ff_status build_table(ff_model_rank *mr) {
  const ff_model *m = mr->model;
  const ff_shard_spec *s = &mr->spec;
  int cap = (int)mr->n_layers * TENSORS_PER_LAYER + 3;
  table_builder tb = {calloc((size_t)cap, sizeof(ff_tensor)), 0, cap, 0};
  if (!tb.t)
    return FF_ERR_RUNTIME;
  int64_t C = m->hidden, V = m->vocab;
  if (s->embedding)
    add_tensor(&tb, "embed", V, C, s->vocab.first, s->vocab.end, 0, C, 0.02f, false);
  for (int64_t l = s->layer_first; l < s->layer_end; l++)
    build_layer_tensors(&tb, m, s, l);
  if (s->lm_head) {
    add_tensor(&tb, "final_norm", C, 1, 0, C, 0, 1, 0, true);
    if (!m->tied_embeddings)
      add_tensor(&tb, "lm_head", V, C, s->vocab.first, s->vocab.end, 0, C, 0.02f, false);
  }
  mr->tensors = tb.t;
  mr->n_tensors = tb.n;
  mr->n_params = tb.offset;
  return FF_OK;
}

const ff_tensor *ff_model_rank_find(const ff_model_rank *mr, const char *name) {
  for (int i = 0; i < mr->n_tensors; i++)
    if (strcmp(mr->tensors[i].name, name) == 0)
      return &mr->tensors[i];
  return NULL;
}

/* Rows [r0, r1) of tensor t (global row numbers) into its place in host. */
static void init_rows(const ff_tensor *t, uint64_t key, float *host, int64_t r0, int64_t r1) {
  float *p = host + t->offset;
  int64_t w = t->col_end - t->col_first;
  for (int64_t r = r0; r < r1; r++)
    for (int64_t c = t->col_first; c < t->col_end; c++) {
      int64_t local = (r - t->row_first) * w + (c - t->col_first);
      p[local] = t->init_std == 0 ? 1.0f
                                  : (float)(t->init_std * init_normal_keyed(key, r * t->cols + c));
    }
}

enum { INIT_THREADS = 16 };

typedef struct init_part {
  const ff_model_rank *mr;
  uint64_t seed;
  float *host;
  int part, parts;
} init_part;

/* Part `part` of every tensor's rows: each element depends on its index alone, so the split
 * changes no value. */
static void *init_part_run(void *arg) {
  const init_part *ip = arg;
  for (int i = 0; i < ip->mr->n_tensors; i++) {
    const ff_tensor *t = &ip->mr->tensors[i];
    int64_t rows = t->row_end - t->row_first;
    int64_t r0 = t->row_first + rows * ip->part / ip->parts;
    int64_t r1 = t->row_first + rows * (ip->part + 1) / ip->parts;
    init_rows(t, init_key(ip->seed, t->name), ip->host, r0, r1);
  }
  return NULL;
}

void ff_model_rank_init_weights(ff_model_rank *mr, uint64_t seed) {
  float *host = malloc((size_t)mr->n_params * sizeof *host);
  if (!host)
    return;
  /* a billion-parameter shard takes a minute on one core: split it over the cores there are,
   * in parts of at least a million parameters */
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  int parts = (int)(mr->n_params / (1 << 20));
  parts = parts < 1 ? 1 : parts > INIT_THREADS ? INIT_THREADS : parts;
  parts = cores > 0 && parts > cores ? (int)cores : parts;
  init_part ip[INIT_THREADS];
  pthread_t th[INIT_THREADS];
  int started = 0;
  for (int q = 0; q < parts; q++)
    ip[q] = (init_part){mr, seed, host, q, parts};
  for (int q = 1; q < parts; q++) {
    if (pthread_create(&th[q], NULL, init_part_run, &ip[q]) != 0)
      break;
    started = q;
  }
  for (int q = started + 1; q < parts; q++) /* what no thread took, done here */
    init_part_run(&ip[q]);
  init_part_run(&ip[0]);
  for (int q = 1; q <= started; q++)
    pthread_join(th[q], NULL);
  mr->k->to_device(mr->params, host, (size_t)mr->n_params * sizeof *host);
  free(host);
  ff_model_rank_weights_changed(mr);
}

void ff_model_rank_weights_changed(ff_model_rank *mr) {
  if (mr->params_half)
    mr->k->to_bf16(mr->params_half, mr->params, mr->n_params);
}

/* ---- allocation ------------------------------------------------------------------------- */

static int64_t layer_acts_floats(dims d) {
  return d.N * d.C * 4 + d.N * 2 + d.N * d.Hl * d.D * 2 + d.N * d.Kl * d.D * 2 + d.N * d.Hl +
         d.N * d.Fl * 3;
}

static float *carve(float **at, int64_t n) {
  float *p = *at;
  *at += n;
  return p;
}

/* One layer's fp32 activations; the row statistics (rstd1, rstd2, lse) only with `stats` (a
 * work set under bf16 storage points them at the saved ones instead), x_in only with `x_in` (under
 * fp32 full recompute each layer keeps its own). */
static void carve_layer(ff_layer_acts *a, float **at, dims d, bool stats, bool x_in) {
  a->x_in = x_in ? carve(at, d.N * d.C) : NULL;
  a->h1 = carve(at, d.N * d.C);
  a->rstd1 = stats ? carve(at, d.N) : NULL;
  a->q = carve(at, d.N * d.Hl * d.D);
  a->k = carve(at, d.N * d.Kl * d.D);
  a->v = carve(at, d.N * d.Kl * d.D);
  a->att = carve(at, d.N * d.Hl * d.D);
  a->lse = stats ? carve(at, d.N * d.Hl) : NULL;
  a->x_mid = carve(at, d.N * d.C);
  a->h2 = carve(at, d.N * d.C);
  a->rstd2 = stats ? carve(at, d.N) : NULL;
  a->gate = carve(at, d.N * d.Fl);
  a->up = carve(at, d.N * d.Fl);
  a->act = carve(at, d.N * d.Fl);
}

/* The fp32 work set of a bf16 layer: the residual stream (x_in, x_mid), and q, k, v, att, which
 * hold q and k before RoPE and are the room attention may compute in; every other tensor the
 * layer keeps its kernels write in bf16, and the row statistics point at the saved ones. */
static int64_t bf16_work_floats(dims d) {
  return d.N * d.C * 2 + d.N * d.Hl * d.D * 2 + d.N * d.Kl * d.D * 2;
}

static void carve_bf16_work(ff_layer_acts *a, float **at, dims d) {
  memset(a, 0, sizeof *a);
  a->x_in = carve(at, d.N * d.C);
  a->q = carve(at, d.N * d.Hl * d.D); /* q, k, v, att contiguous: attention's room */
  a->k = carve(at, d.N * d.Kl * d.D);
  a->v = carve(at, d.N * d.Kl * d.D);
  a->att = carve(at, d.N * d.Hl * d.D);
  a->x_mid = carve(at, d.N * d.C);
}

/* bf16 values a layer saves (everything but the row statistics), and the fp32 ones. */
static int64_t layer_saved_halves(dims d) {
  return d.N * d.C * 4 + d.N * d.Hl * d.D * 2 + d.N * d.Kl * d.D * 2 + d.N * d.Fl * 3;
}

static int64_t layer_saved_floats(dims d) { return d.N * 2 + d.N * d.Hl; }

static uint16_t *carve_half(uint16_t **at, int64_t n) {
  uint16_t *p = *at;
  *at += n;
  return p;
}

/* A layer's bf16 copies and fp32 statistics; x_in only `with_x_in` (full recompute keeps each
 * layer's x_in apart and shares the rest). */
static void carve_saved(ff_layer_saved *s, uint16_t **half, float **full, dims d, bool with_x_in) {
  s->x_in = with_x_in ? carve_half(half, d.N * d.C) : NULL;
  s->h1 = carve_half(half, d.N * d.C);
  s->q = carve_half(half, d.N * d.Hl * d.D);
  s->k = carve_half(half, d.N * d.Kl * d.D);
  s->v = carve_half(half, d.N * d.Kl * d.D);
  s->att = carve_half(half, d.N * d.Hl * d.D);
  s->x_mid = carve_half(half, d.N * d.C);
  s->h2 = carve_half(half, d.N * d.C);
  s->gate = carve_half(half, d.N * d.Fl);
  s->up = carve_half(half, d.N * d.Fl);
  s->act = carve_half(half, d.N * d.Fl);
  s->rstd1 = carve(full, d.N);
  s->rstd2 = carve(full, d.N);
  s->lse = carve(full, d.N * d.Hl);
}

/* Floats of scratch_a: the widest backward temporaries (three FFN-wide, or d att, dq, dk, dv)
 * and the forward's matmul output; scratch_b and scratch_c hold N·C each. */
static int64_t scratch_a_floats(dims d) {
  int64_t wide = d.Fl > d.Hl * d.D ? d.Fl : d.Hl * d.D;
  int64_t n = d.C;
  if (3 * wide > n)
    n = 3 * wide;
  if (2 * d.Hl * d.D + 2 * d.Kl * d.D > n)
    n = 2 * d.Hl * d.D + 2 * d.Kl * d.D;
  return d.N * n;
}

/* bf16 plans: the operand scratch of a stage's layers (the widest matmul output gradient) and
 * of its LM head (the final norm's output and the logits' gradient), in halves. */
static int64_t operand_halves(dims d) {
  int64_t n = d.C;
  if (d.Fl > n)
    n = d.Fl;
  if (d.Hl * d.D > n)
    n = d.Hl * d.D;
  if (d.Kl * d.D > n)
    n = d.Kl * d.D;
  return d.N * n;
}

static int64_t head_halves(dims d) { return d.N * (d.C + d.Vl); }

/* A cleared rank of this model and shard with its tensor table. */
static ff_status init_table(ff_model_rank *mr, const ff_model *model, const ff_kernels *k,
                            const ff_shard_spec *spec) {
  memset(mr, 0, sizeof *mr);
  mr->model = model;
  mr->k = k;
  mr->spec = *spec;
  mr->n_layers = spec->layer_end - spec->layer_first;
  return build_table(mr) == FF_OK ? FF_OK : FF_ERR_RUNTIME;
}

ff_status ff_model_rank_init(ff_model_rank *mr, const ff_model *model, const ff_kernels *k,
                             const ff_shard_spec *spec, int64_t micro_batch, int n_slots,
                             bool bf16_plan, ff_recompute recompute) {
  if (model->tied_embeddings && spec->lm_head && !spec->embedding) {
    memset(mr, 0, sizeof *mr);
    return FF_ERR_INPUT; /* the caller explains: tied embeddings across stages */
  }
  if (init_table(mr, model, k, spec) != FF_OK)
    return FF_ERR_RUNTIME;
  mr->tokens = micro_batch * model->seq_len;
  mr->n_slots = n_slots < 1 ? 1 : n_slots;
  size_t pbytes = (size_t)mr->n_params * sizeof(float);
  mr->params = k->alloc(pbytes);
  mr->grads = k->alloc(pbytes);
  mr->m = k->alloc(pbytes);
  mr->v = k->alloc(pbytes);
  dims d = model_dims(mr, mr->tokens);
  int64_t slots = mr->n_slots, held = slots * mr->n_layers;
  bool layers = mr->n_layers > 0, bf16 = bf16_plan && layers;
  bool full = recompute == FF_RECOMPUTE_FULL && layers;
  mr->bf16 = bf16_plan;
  mr->bf16_activations = bf16;
  mr->recompute_full = full;
  /* Saved per layer and micro-batch: every activation the backward reads, in fp32 or bf16 (row
   * statistics fp32); with full recompute only the layer's input, the rest recomputed from it in
   * the one work set. A work set (with its output) exists under bf16 storage (the fp32 part of
   * a bf16 layer: carve_bf16_work) or fp32 full recompute (the whole layer with statistics of
   * its own, but no x_in: each layer keeps its own). */
  bool work = bf16 || full, work_stats = full && !bf16;
  int64_t kept_floats = bf16   ? (full ? layer_saved_floats(d) : held * layer_saved_floats(d))
                        : full ? held * d.N * d.C
                               : held * layer_acts_floats(d);
  int64_t kept_halves = !bf16 ? 0
                        : full ? held * d.N * d.C + layer_saved_halves(d) - d.N * d.C
                               : held * layer_saved_halves(d);
  /* the work set and its output (fp32 full: the layer less its x_in, plus the output) */
  int64_t work_floats = !work ? 0 : bf16 ? bf16_work_floats(d) + d.N * d.C : layer_acts_floats(d);
  int64_t total = kept_floats + work_floats + slots * d.N * d.C * 2 + d.N * d.C + d.N * 4 +
                  (spec->lm_head ? d.N * d.Vl : 0) + scratch_a_floats(d) + d.N * d.C * 2;
  mr->acts_block = k->alloc((size_t)total * sizeof(float));
  int64_t operands = (bf16 ? operand_halves(d) : 0) +
                     (bf16_plan && spec->lm_head ? head_halves(d) : 0);
  bool halves_ok = true;
  if (bf16_plan) {
    mr->params_half = k->alloc((size_t)mr->n_params * sizeof(uint16_t));
    mr->operand_half = k->alloc((size_t)operands * sizeof(uint16_t));
    halves_ok = mr->params_half && mr->operand_half;
    if (spec->lm_head && mr->operand_half)
      mr->head_half = mr->operand_half + (bf16 ? operand_halves(d) : 0);
  }
  if (bf16) {
    mr->saved_block = k->alloc((size_t)kept_halves * sizeof(uint16_t));
    mr->saved = calloc((size_t)held, sizeof *mr->saved);
  } else {
    mr->acts = calloc((size_t)(held ? held : 1), sizeof *mr->acts);
  }
  mr->tokens_in = k->alloc((size_t)(slots * d.N) * sizeof *mr->tokens_in);
  mr->targets_in = k->alloc((size_t)d.N * sizeof *mr->targets_in);
  mr->inputs = malloc((size_t)d.N * sizeof *mr->inputs);
  mr->targets = malloc((size_t)d.N * sizeof *mr->targets);
  mr->host_loss = malloc((size_t)d.N * sizeof *mr->host_loss);
  bool stored = bf16 ? mr->saved_block && mr->saved : mr->acts != NULL;
  if (!mr->params || !mr->grads || !mr->m || !mr->v || !mr->acts_block || !stored ||
      !halves_ok || !mr->tokens_in || !mr->targets_in || !mr->inputs || !mr->targets ||
      !mr->host_loss) {
    ff_model_rank_free(mr);
    return FF_ERR_RUNTIME;
  }
  float *at = mr->acts_block;
  uint16_t *half = mr->saved_block;
  if (bf16 && full) { /* one shared set; each layer and micro-batch keeps its own x_in */
    ff_layer_saved shared;
    carve_saved(&shared, &half, &at, d, false);
    for (int64_t i = 0; i < held; i++) {
      mr->saved[i] = shared;
      mr->saved[i].x_in = carve_half(&half, d.N * d.C);
    }
  } else if (bf16) {
    for (int64_t i = 0; i < held; i++)
      carve_saved(&mr->saved[i], &half, &at, d, true);
  }
  if (work) {
    if (bf16)
      carve_bf16_work(&mr->work, &at, d);
    else
      carve_layer(&mr->work, &at, d, work_stats, !work_stats);
    mr->work_out = carve(&at, d.N * d.C);
  }
  if (!bf16)
    for (int64_t i = 0; i < held; i++) {
      if (full) { /* the work set, but for its own x_in */
        mr->acts[i] = mr->work;
        mr->acts[i].x_in = carve(&at, d.N * d.C);
      } else {
        carve_layer(&mr->acts[i], &at, d, true, true);
      }
    }
  mr->x_final = carve(&at, slots * d.N * d.C);
  mr->dx_final = carve(&at, slots * d.N * d.C);
  mr->h_final = carve(&at, d.N * d.C);
  mr->rstd_final = carve(&at, d.N);
  mr->row_max = carve(&at, d.N);
  mr->row_sum = carve(&at, d.N);
  mr->loss = carve(&at, d.N);
  mr->logits = spec->lm_head ? carve(&at, d.N * d.Vl) : NULL;
  mr->scratch_a = carve(&at, scratch_a_floats(d));
  mr->scratch_b = carve(&at, d.N * d.C);
  mr->scratch_c = carve(&at, d.N * d.C);
  return FF_OK;
}

ff_status ff_model_rank_init_layout(ff_model_rank *mr, const ff_model *model,
                                    const ff_shard_spec *spec) {
  return init_table(mr, model, NULL, spec);
}

void ff_model_rank_free(ff_model_rank *mr) {
  if (mr->k) {
    mr->k->release(mr->params);
    mr->k->release(mr->grads);
    mr->k->release(mr->m);
    mr->k->release(mr->v);
    mr->k->release(mr->acts_block);
    mr->k->release(mr->saved_block);
    mr->k->release(mr->params_half);
    mr->k->release(mr->operand_half);
    mr->k->release(mr->tokens_in);
    mr->k->release(mr->targets_in);
  }
  free(mr->acts);
  free(mr->saved);
  free(mr->tensors);
  free(mr->inputs);
  free(mr->targets);
  free(mr->host_loss);
  memset(mr, 0, sizeof *mr);
}
