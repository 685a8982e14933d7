/* hf_init.h — initial weights from a Hugging Face Llama directory (`ffrun --init-from DIR`):
 * config.json, and model.safetensors or the shards model.safetensors.index.json names, in F32,
 * F16 or BF16. Each rank maps the files and copies only its own slices of its own tensors
 * (converted to fp32), so no rank holds the whole model. Hugging Face stores q_proj and k_proj
 * with each head's rotary pairs split in halves (row i and row i + D/2 of a head turn together);
 * ffrun turns interleaved pairs (rows 2i and 2i + 1), so those rows are read permuted. */
#ifndef FF_EXEC_HF_INIT_H
#define FF_EXEC_HF_INIT_H

#include "ff_diag.h"
#include "ff_format.h"
#include "model.h"

/* DIR/config.json against the plan's model: every field that shapes the computation must
 * match (errors name config.json and the field). */
ff_status ff_hf_check_config(const char *dir, const ff_model *m, ff_diag *d);
/* This rank's parameters from the directory's safetensors files (the AdamW moments are left as
 * they are: zero before the first step). Errors name the file and the tensor. */
ff_status ff_hf_load(const char *dir, ff_model_rank *mr, ff_diag *d);

/* The Hugging Face name of one of ffrun's logical tensors ("layers.3.wq" →
 * "model.layers.3.self_attn.q_proj.weight"). */
void ff_hf_name(const char *ours, char *out, size_t cap);
/* The file row of ffrun's row r of a tensor of heads of D rows: r itself unless `rotary` (q_proj,
 * k_proj), where ffrun's row 2i + p of a head is the file's row p·D/2 + i. */
int64_t ff_hf_row(int64_t r, bool rotary, int64_t D);

#endif
