/* checkpoint.h — checkpoints of logical (unsharded) tensors in the safetensors format: every
 * parameter by its logical name, its two AdamW moments as "adam_m.NAME" and "adam_v.NAME", and
 * metadata (format "ff-checkpoint/1", step, seed, model name and digest). Written atomically
 * (temporary file, fsync, rename): a failed save leaves the previous checkpoint as it was.
 * Loading copies each rank's slice of the logical tensors, so a checkpoint resumes under any
 * sharding of the same model. The metadata carries the data section's length and an FNV-1a
 * checksum of every MiB of it; a truncated or damaged file is refused with the offset. */
#ifndef FF_EXEC_CHECKPOINT_H
#define FF_EXEC_CHECKPOINT_H

#include <stdbool.h>
#include <stdint.h>

#include "ff_diag.h"
#include "model.h"

typedef struct ff_ckpt_meta {
  int64_t step;          /* optimizer steps taken */
  uint64_t seed;
  char model_name[65];
  char model_digest[32]; /* ff_digest_json of the model */
} ff_ckpt_meta;

/* Save to DIR/step-NNNNNNNN.safetensors; the path written goes to path_out. This rank must hold
 * every tensor whole (the one-rank case). With `gradients`, the last step's gradients are saved
 * too, as "grad.NAME" (for checking the model against a reference implementation). */
ff_status ff_checkpoint_save(const char *dir, const ff_model_rank *mr, const ff_ckpt_meta *meta,
                             bool gradients, ff_diag *d, char *path_out, size_t cap);
/* Steps of the checkpoints in dir, newest first (at most max); 0 when none. */
int ff_checkpoint_list(const char *dir, long long *steps, int max);
/* The newest checkpoint in dir (by step); FF_ERR_INPUT when there is none. */
ff_status ff_checkpoint_latest(const char *dir, char *path, size_t cap);
/* Load this rank's slices of parameters and moments; meta receives the file's metadata. A
 * checkpoint of another model (digest) or with a missing or misshapen tensor is refused. */
ff_status ff_checkpoint_load(const char *file, ff_model_rank *mr, const char *model_digest,
                             ff_ckpt_meta *meta, ff_diag *d);

#endif
