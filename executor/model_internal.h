/* model_internal.h — what model.c (the tensor table, weights, allocation) and model_layers.c
 * (forward and backward) share: a shard's dimensions for a number of tokens. */
#ifndef FF_EXEC_MODEL_INTERNAL_H
#define FF_EXEC_MODEL_INTERNAL_H

#include "model.h"

/* a layer's tensors in the table, in order: attn_norm, wq, wk, wv, wo, mlp_norm, w_gate, w_up,
 * w_down */
#define TENSORS_PER_LAYER 9

/* N tokens, hidden C, head dimension D, and this shard's heads, kv heads, FFN columns and
 * vocabulary rows */
typedef struct dims {
  int64_t N, C, D, Hl, Kl, Fl, Vl;
} dims;

static inline dims model_dims(const ff_model_rank *mr, int64_t tokens) {
  const ff_shard_spec *s = &mr->spec;
  dims d = {tokens, mr->model->hidden, mr->model->hidden / mr->model->heads,
            s->heads.end - s->heads.first, s->kv_heads.end - s->kv_heads.first,
            s->ffn.end - s->ffn.first, s->vocab.end - s->vocab.first};
  return d;
}

#endif
