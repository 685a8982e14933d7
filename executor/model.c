/* model.c — the Llama decoder over one rank's layers and shard: the tensor table, initial
 * weights from a counter-based generator, and forward/backward of one micro-batch.
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

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- counter-based initial weights ------------------------------------------------------ */

static uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

double ff_init_normal(uint64_t seed, const char *name, int64_t index) {
  uint64_t key = splitmix64(seed) ^ ff_fnv1a64(name, strlen(name));
  uint64_t a = splitmix64(key ^ splitmix64((uint64_t)index * 2u));
  uint64_t b = splitmix64(key ^ splitmix64((uint64_t)index * 2u + 1u));
  double u1 = ((double)(a >> 11) + 0.5) / 9007199254740992.0; /* (0, 1) */
  double u2 = (double)(b >> 11) / 9007199254740992.0;
  return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
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

#define TENSORS_PER_LAYER 9

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

void ff_model_rank_init_weights(ff_model_rank *mr, uint64_t seed) {
  float *host = malloc((size_t)mr->n_params * sizeof *host);
  if (!host)
    return;
  for (int i = 0; i < mr->n_tensors; i++) {
    const ff_tensor *t = &mr->tensors[i];
    float *p = host + t->offset;
    int64_t w = t->col_end - t->col_first;
    for (int64_t r = t->row_first; r < t->row_end; r++)
      for (int64_t c = t->col_first; c < t->col_end; c++) {
        int64_t local = (r - t->row_first) * w + (c - t->col_first);
        p[local] = t->init_std == 0
                       ? 1.0f
                       : (float)(t->init_std * ff_init_normal(seed, t->name, r * t->cols + c));
      }
  }
  mr->k->to_device(mr->params, host, (size_t)mr->n_params * sizeof *host);
  free(host);
  ff_model_rank_weights_changed(mr);
}

void ff_model_rank_weights_changed(ff_model_rank *mr) {
  if (mr->params_half)
    mr->k->to_bf16(mr->params_half, mr->params, mr->n_params);
}

/* ---- allocation ------------------------------------------------------------------------- */

typedef struct dims {
  int64_t N, C, D, Hl, Kl, Fl, Vl;
} dims;

static dims model_dims(const ff_model_rank *mr, int64_t tokens) {
  const ff_shard_spec *s = &mr->spec;
  dims d = {tokens, mr->model->hidden, mr->model->hidden / mr->model->heads,
            s->heads.end - s->heads.first, s->kv_heads.end - s->kv_heads.first,
            s->ffn.end - s->ffn.first, s->vocab.end - s->vocab.first};
  return d;
}

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
  bool stored = bf16 ? mr->saved_block && mr->saved : mr->acts != NULL;
  if (!mr->params || !mr->grads || !mr->m || !mr->v || !mr->acts_block || !stored ||
      !halves_ok || !mr->tokens_in || !mr->targets_in || !mr->inputs || !mr->targets) {
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
  memset(mr, 0, sizeof *mr);
}

/* ---- forward and backward --------------------------------------------------------------- */

typedef struct layer_params {
  float *attn_norm, *wq, *wk, *wv, *wo, *mlp_norm, *w_gate, *w_up, *w_down;
} layer_params;

/* The nine tensors of local layer l, in table order, within `base` (params or grads). */
static layer_params layer_at(const ff_model_rank *mr, int64_t l, float *base) {
  int first = (mr->spec.embedding ? 1 : 0) + (int)l * TENSORS_PER_LAYER;
  const ff_tensor *t = &mr->tensors[first];
  layer_params p = {base + t[0].offset, base + t[1].offset, base + t[2].offset,
                    base + t[3].offset, base + t[4].offset, base + t[5].offset,
                    base + t[6].offset, base + t[7].offset, base + t[8].offset};
  return p;
}

static float *tensor_at(const ff_model_rank *mr, const char *name, float *base) {
  const ff_tensor *t = ff_model_rank_find(mr, name);
  return t ? base + t->offset : NULL;
}

/* The TP group's sum (or max) over a buffer; nothing for a group of one. */
static void tp_sum(const ff_model_rank *mr, float *buf, int64_t n) {
  if (mr->tp && mr->tp->size > 1)
    mr->tp->allreduce_sum(mr->tp->ctx, buf, n);
}

static void tp_max(const ff_model_rank *mr, float *buf, int64_t n) {
  if (mr->tp && mr->tp->size > 1)
    mr->tp->allreduce_max(mr->tp->ctx, buf, n);
}

static ff_layer_acts *acts_of(ff_model_rank *mr, int slot, int64_t l) {
  return &mr->acts[(int64_t)slot * mr->n_layers + l];
}

static float *slot_rows(float *base, int slot, int64_t tokens, int64_t C) {
  return base + (int64_t)slot * tokens * C;
}

/* bf16 storage: a tensor just made is rounded to bf16 in place, and the bf16 copy kept for the
 * backward, so that both passes see the same values (nothing without a saved copy: fp32). */
static void keep(const ff_model_rank *mr, uint16_t *saved, float *x, int64_t n) {
  if (!saved)
    return;
  mr->k->to_bf16(saved, x, n);
  mr->k->from_bf16(x, saved, n);
}

/* The bf16 copy of a weight tensor (w points into params). */
static const uint16_t *half_of(const ff_model_rank *mr, const float *w) {
  return mr->params_half + (w - mr->params);
}

/* out(N, Out) = inp(N, In) · wᵀ: on bf16 operands when inp16, the bf16 copy of inp, is given
 * (bf16 plans), else in fp32. */
static void mm_fwd(const ff_model_rank *mr, float *out, const float *inp, const uint16_t *inp16,
                   const float *w, int N, int In, int Out) {
  if (inp16)
    mr->k->matmul_fwd_bf16(out, inp16, half_of(mr, w), N, In, Out);
  else
    mr->k->matmul_fwd(out, inp, w, N, In, Out);
}

/* Its backward; on bf16 operands the output gradient is first rounded into dout16 (N·Out
 * halves of scratch), and with `add` the input gradient is added to dinp (bf16 operands only:
 * the fp32 path sums through a temporary). */
static void mm_bwd(const ff_model_rank *mr, float *dinp, float *dw, const float *dout,
                   uint16_t *dout16, const float *inp, const uint16_t *inp16, const float *w,
                   int N, int In, int Out, bool add) {
  if (!inp16) {
    mr->k->matmul_bwd(dinp, dw, dout, inp, w, N, In, Out);
    return;
  }
  mr->k->to_bf16(dout16, dout, (int64_t)N * Out);
  (add ? mr->k->matmul_bwd_bf16_acc : mr->k->matmul_bwd_bf16)(dinp, dw, dout16, inp16,
                                                              half_of(mr, w), N, In, Out);
}

/* The layer's fp32 activations for slot and layer: its own (fp32 storage) or the one work set
 * pointed at the saved row statistics (bf16 storage; *sv then names the bf16 copies). */
static ff_layer_acts *layer_acts(ff_model_rank *mr, int slot, int64_t l, ff_layer_saved **sv) {
  if (!mr->bf16_activations) {
    *sv = NULL;
    return acts_of(mr, slot, l);
  }
  *sv = &mr->saved[(int64_t)slot * mr->n_layers + l];
  mr->work.rstd1 = (*sv)->rstd1;
  mr->work.rstd2 = (*sv)->rstd2;
  mr->work.lse = (*sv)->lse;
  return &mr->work;
}

static void forward_layer(ff_model_rank *mr, ff_layer_acts *a, const ff_layer_saved *sv, int64_t l,
                          int64_t b, float *x_out);

/* The layer's activations for its backward: as saved (fp32 or bf16, which the backward reads as
 * it is), or, under full recompute, its forward run again from its kept input into the work set.
 * The recomputed values are the first forward's bit for bit: same kernels, same inputs, the
 * same bf16 rounding, and its tensor-parallel sums taken again by the whole group. */
static ff_layer_acts *load_layer(ff_model_rank *mr, int slot, int64_t l, int64_t b,
                                 ff_layer_saved **saved) {
  ff_layer_saved *sv;
  ff_layer_acts *a = layer_acts(mr, slot, l, &sv);
  *saved = sv;
  const ff_kernels *k = mr->k;
  dims d = model_dims(mr, b * mr->model->seq_len);
  int64_t NC = d.N * d.C;
  if (mr->recompute_full) {
    if (sv)
      k->from_bf16(a->x_in, sv->x_in, NC);
    forward_layer(mr, a, sv, l, b, mr->work_out);
  }
  return a; /* bf16 storage: the backward reads every kept tensor in bf16, as kept */
}

static void forward_layer(ff_model_rank *mr, ff_layer_acts *a, const ff_layer_saved *sv, int64_t l,
                          int64_t b, float *x_out) {
  const ff_kernels *k = mr->k;
  const ff_model *m = mr->model;
  dims d = model_dims(mr, b * m->seq_len);
  int B = (int)b, S = (int)m->seq_len, N = (int)d.N, C = (int)d.C, D = (int)d.D;
  int Hl = (int)d.Hl, Kl = (int)d.Kl, Fl = (int)d.Fl;
  layer_params w = layer_at(mr, l, mr->params);
  float *tmp = mr->scratch_a;
  int64_t NC = (int64_t)N * C;
  int64_t nf = (int64_t)N * Fl;
  /* bf16 storage: the residual stream (x_in, x_mid) is rounded in place and kept (keep), as the
   * fp32 adds and RMSNorms read it; every other tensor the layer keeps is written in bf16 by the
   * kernel that makes it, and the matmuls, attention and SwiGLU read it so, forward and
   * backward */
  float eps = (float)m->norm_eps;
  keep(mr, sv ? sv->x_in : NULL, a->x_in, NC);
  if (sv)
    k->rmsnorm_fwd_bf16(sv->h1, a->rstd1, a->x_in, w.attn_norm, N, C, eps);
  else
    k->rmsnorm_fwd(a->h1, a->rstd1, a->x_in, w.attn_norm, N, C, eps);
  float theta = (float)m->rope_theta;
  int q_first = (int)mr->spec.heads.first, kv_first = (int)mr->spec.kv_heads.first;
  int group = (int)(m->heads / m->kv_heads);
  if (sv) { /* q and k rotated into bf16 and v straight out of its matmul: attention reads them
             * so and writes its output so; the work set's fp32 q, k, v, att (contiguous) are its
             * room to work in */
    const uint16_t *h1 = sv->h1;
    k->matmul_fwd_bf16(a->q, h1, half_of(mr, w.wq), N, C, Hl * D);
    k->matmul_fwd_bf16(a->k, h1, half_of(mr, w.wk), N, C, Kl * D);
    k->matmul_fwd_bf16_rounded(sv->v, h1, half_of(mr, w.wv), N, C, Kl * D);
    k->rope_fwd_bf16(sv->q, a->q, B, S, Hl, D, theta);
    k->rope_fwd_bf16(sv->k, a->k, B, S, Kl, D, theta);
    k->attention_fwd_bf16(sv->att, a->lse, sv->q, sv->k, sv->v, B, S, Hl, Kl, D, q_first,
                          kv_first, group, a->q);
  } else {
    k->matmul_fwd(a->q, a->h1, w.wq, N, C, Hl * D);
    k->matmul_fwd(a->k, a->h1, w.wk, N, C, Kl * D);
    k->matmul_fwd(a->v, a->h1, w.wv, N, C, Kl * D);
    k->rope_fwd(a->q, B, S, Hl, D, theta);
    k->rope_fwd(a->k, B, S, Kl, D, theta);
    k->attention_fwd(a->att, a->lse, a->q, a->k, a->v, B, S, Hl, Kl, D, q_first, kv_first, group);
  }
  mm_fwd(mr, tmp, a->att, sv ? sv->att : NULL, w.wo, N, Hl * D, C);
  tp_sum(mr, tmp, NC); /* row-parallel Wo: the group sums its partial outputs */
  k->add(a->x_mid, a->x_in, tmp, NC);
  keep(mr, sv ? sv->x_mid : NULL, a->x_mid, NC);
  if (sv)
    k->rmsnorm_fwd_bf16(sv->h2, a->rstd2, a->x_mid, w.mlp_norm, N, C, eps);
  else
    k->rmsnorm_fwd(a->h2, a->rstd2, a->x_mid, w.mlp_norm, N, C, eps);
  if (sv) { /* gate and up, read only by SwiGLU, straight out of their matmuls in bf16 */
    k->matmul_fwd_bf16_rounded(sv->gate, sv->h2, half_of(mr, w.w_gate), N, C, Fl);
    k->matmul_fwd_bf16_rounded(sv->up, sv->h2, half_of(mr, w.w_up), N, C, Fl);
    k->swiglu_fwd_bf16(sv->act, sv->gate, sv->up, nf);
  } else {
    k->matmul_fwd(a->gate, a->h2, w.w_gate, N, C, Fl);
    k->matmul_fwd(a->up, a->h2, w.w_up, N, C, Fl);
    k->swiglu_fwd(a->act, a->gate, a->up, nf);
  }
  mm_fwd(mr, tmp, a->act, sv ? sv->act : NULL, w.w_down, N, Fl, C);
  tp_sum(mr, tmp, (int64_t)N * C); /* row-parallel W_down */
  k->add(x_out, a->x_mid, tmp, (int64_t)N * C);
}

/* dx: in, the gradient of the layer's output; out, of its input. sv: the layer's bf16 copies
 * (bf16 plans), the matmuls' inputs. */
static void backward_layer(ff_model_rank *mr, ff_layer_acts *a, const ff_layer_saved *sv,
                           int64_t l, int64_t b, float *dx) {
  const ff_kernels *k = mr->k;
  const ff_model *m = mr->model;
  dims d = model_dims(mr, b * m->seq_len);
  int B = (int)b, S = (int)m->seq_len, N = (int)d.N, C = (int)d.C, D = (int)d.D;
  int Hl = (int)d.Hl, Kl = (int)d.Kl, Fl = (int)d.Fl;
  int64_t NC = (int64_t)N * C;
  layer_params w = layer_at(mr, l, mr->params), g = layer_at(mr, l, mr->grads);
  float *dh = mr->scratch_b, *t = mr->scratch_c;
  int64_t wide = (int64_t)N * (Fl > Hl * D ? Fl : Hl * D);
  float *d1 = mr->scratch_a, *d2 = d1 + wide, *d3 = d2 + wide;
  uint16_t *o16 = mr->operand_half;
  /* x_out = x_mid + act·Wdᵀ: dx flows to x_mid unchanged */
  mm_bwd(mr, d1, g.w_down, dx, o16, a->act, sv ? sv->act : NULL, w.w_down, N, Fl, C, false);
  if (sv) { /* the gradients of gate and up straight to bf16, in d2's room (2·wide halves); the
             * second matmul adds its input gradient to the first's */
    uint16_t *dgate = (uint16_t *)d2, *dup = dgate + (int64_t)N * Fl;
    k->swiglu_bwd_bf16(dgate, dup, d1, sv->gate, sv->up, (int64_t)N * Fl);
    k->matmul_bwd_bf16(dh, g.w_gate, dgate, sv->h2, half_of(mr, w.w_gate), N, C, Fl);
    k->matmul_bwd_bf16_acc(dh, g.w_up, dup, sv->h2, half_of(mr, w.w_up), N, C, Fl);
  } else {
    k->swiglu_bwd(d2, d3, d1, a->gate, a->up, (int64_t)N * Fl); /* d gate, d up */
    k->matmul_bwd(dh, g.w_gate, d2, a->h2, w.w_gate, N, C, Fl);
    k->matmul_bwd(t, g.w_up, d3, a->h2, w.w_up, N, C, Fl);
    k->accumulate(dh, t, NC);
  }
  tp_sum(mr, dh, NC); /* column-parallel gate/up: the group sums the input gradient */
  if (sv) /* dx = d x_mid, reading x_mid as kept, in bf16 */
    k->rmsnorm_bwd_acc_bf16(dx, g.mlp_norm, dh, sv->x_mid, w.mlp_norm, a->rstd2, N, C);
  else
    k->rmsnorm_bwd_acc(dx, g.mlp_norm, dh, a->x_mid, w.mlp_norm, a->rstd2, N, C);
  /* x_mid = x_in + att·Woᵀ */
  int64_t nq = (int64_t)N * Hl * D, nk = (int64_t)N * Kl * D;
  float *datt = d1, *dq = d1 + nq, *dk = dq + nq, *dv = dk + nk;
  mm_bwd(mr, datt, g.wo, dx, o16, a->att, sv ? sv->att : NULL, w.wo, N, Hl * D, C, false);
  int q_first = (int)mr->spec.heads.first, kv_first = (int)mr->spec.kv_heads.first;
  int group = (int)(m->heads / m->kv_heads);
  if (sv) /* on the bf16 copies; the work set's q, k, v, att are free room */
    k->attention_bwd_bf16(dq, dk, dv, datt, sv->att, a->lse, sv->q, sv->k, sv->v, B, S, Hl, Kl, D,
                          q_first, kv_first, group, a->q);
  else
    k->attention_bwd(dq, dk, dv, datt, a->att, a->lse, a->q, a->k, a->v, B, S, Hl, Kl, D, q_first,
                     kv_first, group);
  float theta = (float)m->rope_theta;
  if (sv) { /* dq, dk rotated back straight into bf16; k's and v's input gradients added to q's
             * inside their matmuls */
    k->rope_bwd_bf16(o16, dq, B, S, Hl, D, theta);
    k->matmul_bwd_bf16(dh, g.wq, o16, sv->h1, half_of(mr, w.wq), N, C, Hl * D);
    k->rope_bwd_bf16(o16, dk, B, S, Kl, D, theta);
    k->matmul_bwd_bf16_acc(dh, g.wk, o16, sv->h1, half_of(mr, w.wk), N, C, Kl * D);
    mm_bwd(mr, dh, g.wv, dv, o16, a->h1, sv->h1, w.wv, N, C, Kl * D, true);
  } else {
    k->rope_bwd(dq, B, S, Hl, D, theta);
    k->rope_bwd(dk, B, S, Kl, D, theta);
    k->matmul_bwd(dh, g.wq, dq, a->h1, w.wq, N, C, Hl * D);
    k->matmul_bwd(t, g.wk, dk, a->h1, w.wk, N, C, Kl * D);
    k->accumulate(dh, t, NC);
    k->matmul_bwd(t, g.wv, dv, a->h1, w.wv, N, C, Kl * D);
    k->accumulate(dh, t, NC);
  }
  tp_sum(mr, dh, NC); /* column-parallel q/k/v */
  if (sv) /* dx = d x_in */
    k->rmsnorm_bwd_acc_bf16(dx, g.attn_norm, dh, sv->x_in, w.attn_norm, a->rstd1, N, C);
  else
    k->rmsnorm_bwd_acc(dx, g.attn_norm, dh, a->x_in, w.attn_norm, a->rstd1, N, C);
}

/* Final norm, LM head and loss over a vocabulary shard; leaves d x_final in dx. */
static void head_forward_backward(ff_model_rank *mr, const float *x_final, int64_t b,
                                  float grad_scale, float *dx, double *loss_sum) {
  const ff_kernels *k = mr->k;
  const ff_model *m = mr->model;
  dims d = model_dims(mr, b * m->seq_len);
  int N = (int)d.N, C = (int)d.C, V = (int)d.Vl;
  float *norm_w = tensor_at(mr, "final_norm", mr->params);
  float *norm_g = tensor_at(mr, "final_norm", mr->grads);
  const char *head = m->tied_embeddings ? "embed" : "lm_head";
  float *head_w = tensor_at(mr, head, mr->params), *head_g = tensor_at(mr, head, mr->grads);
  uint16_t *h16 = mr->head_half; /* bf16 plans: the LM head on bf16 operands too */
  if (h16)
    k->rmsnorm_fwd_bf16(h16, mr->rstd_final, x_final, norm_w, N, C, (float)m->norm_eps);
  else
    k->rmsnorm_fwd(mr->h_final, mr->rstd_final, x_final, norm_w, N, C, (float)m->norm_eps);
  mm_fwd(mr, mr->logits, mr->h_final, h16, head_w, N, C, V);
  k->ce_row_max(mr->row_max, mr->logits, N, V);
  tp_max(mr, mr->row_max, N);
  k->ce_row_sum(mr->row_sum, mr->logits, mr->row_max, N, V);
  tp_sum(mr, mr->row_sum, N);
  k->zero(mr->loss, (size_t)N * sizeof(float));
  uint16_t *dlogits16 = h16 ? h16 + (int64_t)N * C : NULL; /* bf16: the gradient goes there */
  if (dlogits16)
    k->ce_loss_grad_bf16(mr->loss, dlogits16, mr->logits, mr->targets_in, mr->row_max,
                         mr->row_sum, N, V, (int)mr->spec.vocab.first, grad_scale);
  else
    k->ce_loss_grad(mr->loss, mr->logits, mr->logits, mr->targets_in, mr->row_max, mr->row_sum,
                    N, V, (int)mr->spec.vocab.first, grad_scale);
  float *host_loss = malloc((size_t)N * sizeof *host_loss);
  if (host_loss) { /* each rank adds the losses of the targets in its vocabulary shard */
    k->to_host(host_loss, mr->loss, (size_t)N * sizeof *host_loss);
    for (int i = 0; i < N; i++)
      *loss_sum += host_loss[i];
    free(host_loss);
  }
  float *dh = mr->scratch_b;
  if (dlogits16)
    k->matmul_bwd_bf16(dh, head_g, dlogits16, h16, half_of(mr, head_w), N, C, V);
  else
    k->matmul_bwd(dh, head_g, mr->logits, mr->h_final, head_w, N, C, V);
  tp_sum(mr, dh, (int64_t)N * C); /* vocabulary-parallel head: sum the input gradient */
  k->rmsnorm_bwd(dx, norm_g, dh, x_final, norm_w, mr->rstd_final, N, C);
}

static void grads_final(ff_model_rank *mr, int first, int n) {
  if (mr->grads_final && mr->last_micro_batch && n > 0)
    mr->grads_final(mr->grads_ctx, first, n);
}

float *ff_model_rank_input(ff_model_rank *mr, int slot) {
  return !mr->n_layers          ? slot_rows(mr->x_final, slot, mr->tokens, mr->model->hidden)
         : mr->bf16_activations ? mr->work.x_in
                                : acts_of(mr, slot, 0)->x_in;
}

float *ff_model_rank_output(ff_model_rank *mr, int slot) {
  return slot_rows(mr->x_final, slot, mr->tokens, mr->model->hidden);
}

float *ff_model_rank_gradient(ff_model_rank *mr, int slot) {
  return slot_rows(mr->dx_final, slot, mr->tokens, mr->model->hidden);
}

void ff_model_rank_forward(ff_model_rank *mr, int slot, int64_t b, const int32_t *tokens,
                           const float *x_in, const int32_t *targets, float grad_scale,
                           float *x_out, double *loss_sum) {
  const ff_kernels *k = mr->k;
  int64_t N = b * mr->model->seq_len, C = mr->model->hidden;
  float *first = ff_model_rank_input(mr, slot);
  if (mr->spec.embedding) {
    int32_t *tok = mr->tokens_in + (int64_t)slot * mr->tokens;
    k->to_device(tok, tokens, (size_t)N * sizeof *tok);
    k->embedding_fwd(first, tok, tensor_at(mr, "embed", mr->params), (int)N, (int)C,
                     (int)mr->spec.vocab.first, (int)mr->spec.vocab.end);
    tp_sum(mr, first, N * C); /* vocabulary-parallel embedding: each rank holds some rows */
  } else if (x_in) {
    k->to_device(first, x_in, (size_t)(N * C) * sizeof(float));
  }
  float *last = slot_rows(mr->x_final, slot, mr->tokens, C);
  for (int64_t l = 0; l < mr->n_layers; l++) {
    ff_layer_saved *sv;
    ff_layer_acts *a = layer_acts(mr, slot, l, &sv);
    bool more = l + 1 < mr->n_layers;
    float *out = !more ? last : sv ? mr->work_out : acts_of(mr, slot, l + 1)->x_in;
    forward_layer(mr, a, sv, l, b, out);
    if (sv && more) { /* the output is the next layer's input */
      mr->work_out = mr->work.x_in;
      mr->work.x_in = out;
    }
  }
  if (mr->spec.lm_head) {
    k->to_device(mr->targets_in, targets, (size_t)N * sizeof *targets);
    head_forward_backward(mr, last, b, grad_scale, slot_rows(mr->dx_final, slot, mr->tokens, C),
                          loss_sum);
    int head_first = (int)(mr->spec.embedding + mr->n_layers * TENSORS_PER_LAYER);
    grads_final(mr, head_first, mr->n_tensors - head_first);
  } else if (x_out) {
    k->to_host(x_out, last, (size_t)(N * C) * sizeof(float));
  }
}

void ff_model_rank_backward(ff_model_rank *mr, int slot, int64_t b, const float *dx_in,
                            float *dx_out) {
  const ff_kernels *k = mr->k;
  int64_t N = b * mr->model->seq_len, C = mr->model->hidden;
  float *dx = slot_rows(mr->dx_final, slot, mr->tokens, C);
  if (!mr->spec.lm_head && dx_in)
    k->to_device(dx, dx_in, (size_t)(N * C) * sizeof(float));
  for (int64_t l = mr->n_layers - 1; l >= 0; l--) {
    ff_layer_saved *sv;
    ff_layer_acts *a = load_layer(mr, slot, l, b, &sv);
    backward_layer(mr, a, sv, l, b, dx);
    grads_final(mr, (int)(mr->spec.embedding + l * TENSORS_PER_LAYER), TENSORS_PER_LAYER);
  }
  if (mr->spec.embedding) {
    k->embedding_bwd(tensor_at(mr, "embed", mr->grads), dx, mr->tokens_in + (int64_t)slot * mr->tokens,
                     (int)N, (int)C, (int)mr->spec.vocab.first, (int)mr->spec.vocab.end);
    grads_final(mr, 0, 1);
  } else if (dx_out)
    k->to_host(dx_out, dx, (size_t)(N * C) * sizeof(float));
}

ff_status ff_model_rank_step_micro_batch(ff_model_rank *mr, const int32_t *inputs,
                                         const int32_t *targets, int64_t b, float grad_scale,
                                         double *loss_sum) {
  if (!mr->spec.embedding || !mr->spec.lm_head)
    return FF_ERR_INPUT; /* a partial stage runs under the distributed executor */
  if (b * mr->model->seq_len > mr->tokens)
    return FF_ERR_INPUT;
  ff_model_rank_forward(mr, 0, b, inputs, NULL, targets, grad_scale, NULL, loss_sum);
  ff_model_rank_backward(mr, 0, b, NULL, NULL);
  return FF_OK;
}
