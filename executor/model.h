/* model.h — one rank's part of the Llama decoder: a range of layers, the embedding and/or the LM
 * head when its stage holds them, and this rank's shard of heads, kv heads, FFN columns and
 * vocabulary rows. The same code runs a whole model on one rank (every range full) and any
 * shard of it under a plan.
 *
 * Parameters, gradients and the two AdamW moments live in one allocation each (llm.c style),
 * with a table of named tensors pointing into them; every tensor knows which slice of the
 * logical (unsharded) tensor it holds, so initial weights and checkpoints are defined on the
 * logical tensors and do not depend on the sharding. */
#ifndef FF_EXEC_MODEL_H
#define FF_EXEC_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "ff_format.h"
#include "ff_kernels.h"

/* How this rank's copy of a tensor relates to the logical tensor (rows, cols): it holds rows
 * [row_first, row_end) and columns [col_first, col_end). */
typedef struct ff_tensor {
  char name[48];          /* logical name, e.g. "layers.3.wq" */
  int64_t rows, cols;     /* logical shape (a vector has cols = 1) */
  int64_t row_first, row_end, col_first, col_end;
  int64_t offset;         /* into the parameter block, in floats */
  int64_t numel;          /* local elements */
  bool decay;             /* AdamW weight decay applies (matrices, not norms) */
  bool replicated;        /* held whole by every rank of the TP group (norm weights) */
  float init_std;         /* 0: initialised to ones (norm weights) */
} ff_tensor;

typedef struct ff_shard_spec {
  int64_t layer_first, layer_end;
  bool embedding, lm_head;
  ff_span heads, kv_heads, ffn, vocab; /* vocab only when embedding or lm_head */
} ff_shard_spec;

/* Per-layer activations of one micro-batch, saved by forward for backward. */
typedef struct ff_layer_acts {
  float *x_in, *h1, *rstd1, *q, *k, *v, *att, *lse, *x_mid, *h2, *rstd2, *gate, *up, *act;
} ff_layer_acts;

/* The same, stored in bf16 (the row statistics rstd and lse stay fp32). */
typedef struct ff_layer_saved {
  uint16_t *x_in, *h1, *q, *k, *v, *att, *x_mid, *h2, *gate, *up, *act;
  float *rstd1, *rstd2, *lse;
} ff_layer_saved;

/* Collectives of the rank's tensor-parallel group, where the model needs them; NULL (or a group
 * of one) when the rank holds its layers whole. */
typedef struct ff_tp_ops {
  void *ctx;
  int size;
  void (*allreduce_sum)(void *ctx, float *buf, int64_t n);
  void (*allreduce_max)(void *ctx, float *buf, int64_t n);
} ff_tp_ops;

typedef struct ff_model_rank {
  const ff_model *model;
  const ff_kernels *k;
  const ff_tp_ops *tp;
  ff_shard_spec spec;
  int64_t n_layers;       /* layer_end - layer_first */
  ff_tensor *tensors;
  int n_tensors;
  int64_t n_params;       /* local floats */
  float *params, *grads, *m, *v;
  /* bf16 plans: every matmul runs on bf16 operands, reading the weights from params_half (params
   * rounded to bf16 whenever they change: ff_model_rank_weights_changed), its input from the
   * bf16 copy kept for the backward, and its output gradient rounded into operand_half (head:
   * head_half holds the final norm's output, then the logits' gradient). */
  bool bf16;
  uint16_t *params_half, *operand_half, *head_half;
  /* activations of up to n_slots micro-batches in flight, each of up to `tokens` tokens: fp32 in
   * acts, or with bf16_activations in saved (each saved tensor made in bf16, or rounded to bf16
   * as it is made, so forward and backward see the same values; the rest computed in fp32 in
   * the one layer's `work`).
   * With recompute_full a layer keeps only its input x_in; every other entry of acts or saved
   * points into one shared set, and the backward runs the layer's forward again into it. */
  int64_t tokens;
  int n_slots;
  bool bf16_activations;
  bool recompute_full;
  ff_layer_acts *acts;      /* [slot * n_layers + layer]; bf16: NULL */
  ff_layer_saved *saved;    /* [slot * n_layers + layer]; fp32: NULL */
  ff_layer_acts work;       /* bf16 or full recompute: the layer being computed */
  float *work_out;          /* the work set's output: the next layer's input, or discarded */
  float *acts_block;
  uint16_t *saved_block;
  float *x_final, *dx_final; /* per slot: the stage's output and (last stage) its gradient */
  int32_t *tokens_in;        /* backend memory, per slot: the input tokens (embedding stage) */
  int32_t *targets_in;       /* backend memory: the targets of the micro-batch (last stage) */
  float *h_final, *rstd_final, *logits, *row_max, *row_sum, *loss;
  float *scratch_a, *scratch_b, *scratch_c; /* backward temporaries */
  int32_t *inputs, *targets; /* host memory: where callers assemble a micro-batch */
  float *host_loss;          /* host memory: the head's per-token losses, read back each micro-batch */
  /* When set, called as this rank's gradients of tensors [first, first + n) become final for the
   * step, on the micro-batch run with last_micro_batch set: the head's (final norm and untied LM
   * head) after its forward, each layer's after its backward (last layer first), the
   * embedding's at the end of the backward. Tensors in that order are the table's in reverse. */
  void (*grads_final)(void *ctx, int first, int n);
  void *grads_ctx;
  bool last_micro_batch;
  /* forward only (validation): the head computes its loss but no gradient */
  bool no_grad;
} ff_model_rank;

/* Build the tensor table and allocate for `n_slots` micro-batches of `micro_batch` sequences in
 * flight (1 for a whole model on one rank; the 1F1B in-flight count of the stage otherwise).
 * bf16 (bf16 plans): the activations for backward kept in bf16 and the matmuls on bf16
 * operands, else fp32 throughout.
 * FF_RECOMPUTE_FULL keeps only each layer's input; `none` and `selective` keep the same (this
 * attention never stores its scores, which is all selective recompute would drop). What is
 * allocated is what ff_mem_rank_activations (cost/ff_cost.h) predicts. */
ff_status ff_model_rank_init(ff_model_rank *mr, const ff_model *model, const ff_kernels *k,
                             const ff_shard_spec *spec, int64_t micro_batch, int n_slots,
                             bool bf16, ff_recompute recompute);
/* The tensor table alone (no kernels, nothing allocated): the logical tensors of a shard in
 * table order, which is a checkpoint's order when the shard is the whole model. */
ff_status ff_model_rank_init_layout(ff_model_rank *mr, const ff_model *model,
                                    const ff_shard_spec *spec);
void ff_model_rank_free(ff_model_rank *mr);
/* Initial weights from (seed, tensor name, element index in the logical tensor) alone. */
void ff_model_rank_init_weights(ff_model_rank *mr, uint64_t seed);
/* The weights in params changed (an optimizer step, a checkpoint loaded): round them into the
 * bf16 copy the matmuls read (bf16 plans; nothing otherwise). init_weights and checkpoint loads
 * call it themselves. */
void ff_model_rank_weights_changed(ff_model_rank *mr);
const ff_tensor *ff_model_rank_find(const ff_model_rank *mr, const char *name);

/* Forward of one micro-batch of b sequences through this rank's stage, into activation `slot`.
 * The first stage reads `tokens`, the others the activation x_in (b·S, h, host memory) from the
 * previous stage, or with x_in NULL what is already at ff_model_rank_input; a middle stage
 * copies its output to x_out (host memory) when x_out is set, and it stays at
 * ff_model_rank_output either way. The last stage goes on through the final norm, LM head and
 * loss over `targets` (token losses added to *loss_sum, gradients scaled by grad_scale) and keeps
 * the gradient of its output for backward. */
void ff_model_rank_forward(ff_model_rank *mr, int slot, int64_t b, const int32_t *tokens,
                           const float *x_in, const int32_t *targets, float grad_scale,
                           float *x_out, double *loss_sum);
/* Backward of the micro-batch in `slot`: dx_in is the gradient of the stage's output (from the
 * next stage, host memory; NULL: already at ff_model_rank_gradient; ignored on the last stage);
 * the gradient of its input is left at ff_model_rank_gradient and copied to dx_out (host
 * memory) when set (not on the first stage). Weight gradients accumulate. */
void ff_model_rank_backward(ff_model_rank *mr, int slot, int64_t b, const float *dx_in,
                            float *dx_out);

/* Backend memory of a slot's stage boundary, where device-to-device transfers read and write
 * (the micro-batch's tokens·h floats): the stage's input before its forward (valid until the
 * forward; under bf16 storage one buffer for every slot), its output after the forward, and
 * the gradient of its output before the backward, which the backward replaces by the gradient
 * of its input. */
float *ff_model_rank_input(ff_model_rank *mr, int slot);
float *ff_model_rank_output(ff_model_rank *mr, int slot);
float *ff_model_rank_gradient(ff_model_rank *mr, int slot);

/* One micro-batch of b sequences on a whole model (embedding through loss) on one rank:
 * forward, then backward accumulating gradients. Token losses are summed into *loss_sum;
 * gradients are scaled by `grad_scale` (1 / tokens of the global batch). */
ff_status ff_model_rank_step_micro_batch(ff_model_rank *mr, const int32_t *inputs,
                                         const int32_t *targets, int64_t b, float grad_scale,
                                         double *loss_sum);

/* The counter-based generator behind initial weights: a standard normal for (seed, name, i). */
double ff_init_normal(uint64_t seed, const char *name, int64_t index);

#endif
