/* checkpoint.h — checkpoints of logical (unsharded) tensors in the safetensors format: every
 * parameter by its logical name, its two AdamW moments as "adam_m.NAME" and "adam_v.NAME", and
 * metadata (format "ff-checkpoint/1", step, seed, model name, digest and JSON). Written atomically
 * (temporary file, fsync, rename): a failed save leaves the previous checkpoint as it was.
 * Loading copies each rank's slice of the logical tensors, so a checkpoint resumes under any
 * sharding of the same model. The metadata carries the data section's length and an FNV-1a
 * checksum of every MiB of it; a truncated or damaged file is refused with the offset. */
#ifndef FF_EXEC_CHECKPOINT_H
#define FF_EXEC_CHECKPOINT_H

#include <stdbool.h>
#include <stdint.h>

#include <cjson/cJSON.h>

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
/* A checkpoint of the logical tensors `layout` lists (ff_model_rank_init_layout of the whole
 * model; it must outlive the writer), handed over in file order a piece at a time: parameters,
 * adam_m, adam_v (and with `gradients` the gradients), each block every tensor whole in table
 * order. Nothing holds more than the piece handed over, and nothing replaces
 * DIR/step-NNNNNNNN.safetensors until ff_checkpoint_end has every byte. begin returns NULL,
 * having said why in d, when no file can be started. */
typedef struct ff_ckpt_writer ff_ckpt_writer;
ff_ckpt_writer *ff_checkpoint_begin(const char *dir, const ff_model_rank *layout,
                                    const ff_ckpt_meta *meta, bool gradients, ff_diag *d);
void ff_checkpoint_append(ff_ckpt_writer *w, const void *data, size_t bytes);
/* With `keep`, finish the file (an error when it did not get exactly the bytes its header
 * promises) and copy its path to path_out; without, drop it. Frees w (NULL: FF_ERR_RUNTIME). */
ff_status ff_checkpoint_end(ff_ckpt_writer *w, bool keep, ff_diag *d, char *path_out, size_t cap);
/* Steps of the checkpoints in dir, newest first (at most max); 0 when none. */
int ff_checkpoint_list(const char *dir, long long *steps, int max);
/* The newest checkpoint in dir (by step); FF_ERR_INPUT when there is none. */
ff_status ff_checkpoint_latest(const char *dir, char *path, size_t cap);
/* A checkpoint mapped read-only, its header parsed and its data checked against the per-MiB
 * checksums; meta and model_json (the model's canonical JSON; NULL in checkpoints written
 * before it was recorded) from its metadata. Close it to unmap. */
typedef struct ff_ckpt_view {
  char *buf;
  size_t len;
  cJSON *header;
  const unsigned char *data; /* the data section, data_len bytes */
  size_t data_len;
  ff_ckpt_meta meta;
  const char *model_json; /* within header */
} ff_ckpt_view;
ff_status ff_checkpoint_open(const char *file, ff_ckpt_view *v, ff_diag *d);
void ff_checkpoint_close(ff_ckpt_view *v);
/* The little-endian F32 bytes of tensor `name` of logical shape (rows, cols); NULL when it is
 * missing, of another dtype or shape, or not within the data. */
const unsigned char *ff_checkpoint_tensor(const ff_ckpt_view *v, const char *name, int64_t rows,
                                          int64_t cols);
/* A file's bytes, mapped read-only (*buf NULL for an empty file); errors are named by d->file.
 * munmap(*buf, *len) when done. */
ff_status ff_map_file(const char *file, ff_diag *d, char **buf, size_t *len);
/* The whole pages within [p, p + n) of a read-only file mapping leave this process's resident
 * set; they stay in the page cache and read back from there. Reading a mapped file a piece at a
 * time then holds one piece, not the file (a checkpoint checked, loaded or exported). */
void ff_drop_pages(const void *p, size_t n);
/* Load this rank's slices of parameters and moments; meta receives the file's metadata. A
 * checkpoint of another model (digest) or with a missing or misshapen tensor is refused. The
 * file is mapped, not read into memory, so ranks on one host share its pages. */
ff_status ff_checkpoint_load(const char *file, ff_model_rank *mr, const char *model_digest,
                             ff_ckpt_meta *meta, ff_diag *d);

#endif
