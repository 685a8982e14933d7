/* hf_export.h — `ffrun export`: an ffrun checkpoint as a Hugging Face Llama directory
 * (config.json, and model.safetensors or shards with model.safetensors.index.json) that
 * transformers' LlamaForCausalLM.from_pretrained loads. The inverse of --init-from: the same
 * names, q_proj and k_proj rows permuted back to Hugging Face's rotary layout, weights in fp32
 * (exactly the checkpoint's) or bf16 (rounded to nearest even). */
#ifndef FF_EXEC_HF_EXPORT_H
#define FF_EXEC_HF_EXPORT_H

#include <stdbool.h>
#include <stdint.h>

#include "ff_format.h"

typedef struct ff_export_opts {
  const char *checkpoint; /* a checkpoint file, or a directory: its newest intact one */
  const char *out_dir;    /* created if absent; files of an earlier export replaced */
  const char *plan_file;  /* the model, for checkpoints without __metadata__.model_json */
  bool bf16;
  uint64_t max_shard_bytes; /* a new shard where the next tensor would pass this */
  bool quiet;
} ff_export_opts;

/* Errors are printed, naming the file and what was expected; nothing in out_dir changes
 * unless every file was written. */
ff_status ff_hf_export(const ff_export_opts *o);

/* `ffrun export CHECKPOINT -o DIR [--dtype fp32|bf16] [--max-shard-size SIZE] [--plan PLAN]`:
 * argv[1] is "export"; returns the exit status. */
int ff_export_main(int argc, char **argv);

#endif
