/* model_layers.c — forward and backward of one micro-batch through a rank's layers, embedding
 * and LM head: the scheme described at the top of model.c. */
#define _POSIX_C_SOURCE 200809L
#include "model.h"
#include "model_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
  /* each rank adds the losses of the targets in its vocabulary shard */
  k->to_host(mr->host_loss, mr->loss, (size_t)N * sizeof *mr->host_loss);
  for (int i = 0; i < N; i++)
    *loss_sum += mr->host_loss[i];
  if (mr->no_grad)
    return;
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
    if (!mr->no_grad)
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
