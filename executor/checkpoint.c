/* checkpoint.c — safetensors checkpoints of logical tensors; see checkpoint.h. */
#define _POSIX_C_SOURCE 200809L
#include "checkpoint.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ff_json.h"

static const char *const moment_prefix[4] = {"", "adam_m.", "adam_v.", "grad."};

static float *block_of(const ff_model_rank *mr, int which) {
  return which == 0 ? mr->params : which == 1 ? mr->m : which == 2 ? mr->v : mr->grads;
}

static void shape_json(cJSON *o, const ff_tensor *t) {
  cJSON *shape = cJSON_AddArrayToObject(o, "shape");
  cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->rows));
  if (t->cols != 1)
    cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->cols));
}

#define CHECK_BLOCK (1u << 20)
#define STREAM_CHUNK ((size_t)64 << 20) /* bytes staged at a time: a multiple of CHECK_BLOCK */

/* The data section as a stream over the rank's blocks (parameters, the two moments and maybe
 * the gradients, one after the other), copied out a chunk at a time, so a save holds one chunk
 * beside the model instead of two copies of it. */
typedef struct data_stream {
  const ff_model_rank *mr;
  size_t block_bytes, total, at;
  unsigned char *chunk;
  char *head; /* the 8-byte length and the padded header, handed out first */
  size_t head_len;
} data_stream;

/* Bytes [from, from + n) of the data section into dst. */
static void read_data(const data_stream *s, size_t from, unsigned char *dst, size_t n) {
  while (n > 0) {
    int which = (int)(from / s->block_bytes);
    size_t off = from % s->block_bytes, take = s->block_bytes - off < n ? s->block_bytes - off : n;
    s->mr->k->to_host(dst, (const unsigned char *)block_of(s->mr, which) + off, take);
    dst += take;
    from += take;
    n -= take;
  }
}

/* FNV-1a of every 1 MiB of the data section, as hex, comma-separated: a damaged file is refused
 * with the offset of the first block that does not match. */
static char *block_checksums(const data_stream *s) {
  size_t blocks = (s->total + CHECK_BLOCK - 1) / CHECK_BLOCK;
  char *out = malloc(blocks * 17 + 1);
  if (!out)
    return NULL;
  out[0] = '\0';
  size_t j = 0, b = 0;
  for (size_t from = 0; from < s->total; from += STREAM_CHUNK) {
    size_t n = s->total - from < STREAM_CHUNK ? s->total - from : STREAM_CHUNK;
    read_data(s, from, s->chunk, n);
    for (size_t at = 0; at < n; at += CHECK_BLOCK, b++) {
      size_t len = n - at < CHECK_BLOCK ? n - at : CHECK_BLOCK;
      j += (size_t)snprintf(out + j, 18, "%s%016llx", b ? "," : "",
                            (unsigned long long)ff_fnv1a64(s->chunk + at, len));
    }
  }
  return out;
}

/* The header, then the data a chunk at a time. */
static bool next_piece(void *ctx, const char **data, size_t *len, ff_diag *d) {
  (void)d;
  data_stream *s = ctx;
  if (s->head) {
    *data = s->head;
    *len = s->head_len;
    s->head = NULL; /* still owned by the caller */
    return true;
  }
  size_t n = s->total - s->at < STREAM_CHUNK ? s->total - s->at : STREAM_CHUNK;
  read_data(s, s->at, s->chunk, n);
  s->at += n;
  *data = (const char *)s->chunk;
  *len = n;
  return true;
}

static cJSON *header_json(const ff_model_rank *mr, const ff_ckpt_meta *meta, int blocks,
                          const char *checksums, size_t data_bytes) {
  cJSON *h = cJSON_CreateObject();
  cJSON *md = cJSON_AddObjectToObject(h, "__metadata__");
  char num[32];
  cJSON_AddStringToObject(md, "format", "ff-checkpoint/1");
  snprintf(num, sizeof num, "%" PRId64, meta->step);
  cJSON_AddStringToObject(md, "step", num);
  snprintf(num, sizeof num, "%" PRIu64, meta->seed);
  cJSON_AddStringToObject(md, "seed", num);
  cJSON_AddStringToObject(md, "model", meta->model_name);
  cJSON_AddStringToObject(md, "model_digest", meta->model_digest);
  snprintf(num, sizeof num, "%zu", data_bytes);
  cJSON_AddStringToObject(md, "data_bytes", num);
  cJSON_AddStringToObject(md, "data_fnv1a64_per_mib", checksums);
  int64_t offset = 0;
  for (int which = 0; which < blocks; which++)
    for (int i = 0; i < mr->n_tensors; i++) {
      const ff_tensor *t = &mr->tensors[i];
      char name[64];
      snprintf(name, sizeof name, "%s%s", moment_prefix[which], t->name);
      cJSON *o = cJSON_AddObjectToObject(h, name);
      cJSON_AddStringToObject(o, "dtype", "F32");
      shape_json(o, t);
      cJSON *off = cJSON_AddArrayToObject(o, "data_offsets");
      cJSON_AddItemToArray(off, cJSON_CreateNumber((double)offset));
      offset += t->rows * t->cols * 4;
      cJSON_AddItemToArray(off, cJSON_CreateNumber((double)offset));
    }
  return h;
}

ff_status ff_checkpoint_save(const char *dir, const ff_model_rank *mr, const ff_ckpt_meta *meta,
                             bool gradients, ff_diag *d, char *path_out, size_t cap) {
  int blocks = gradients ? 4 : 3;
  for (int i = 0; i < mr->n_tensors; i++)
    if (mr->tensors[i].numel != mr->tensors[i].rows * mr->tensors[i].cols) {
      ff_diag_error(d, NULL, "tensor %s is sharded on this rank; a sharded save needs the "
                    "distributed executor", mr->tensors[i].name);
      return FF_ERR_INPUT;
    }
  size_t block_bytes = (size_t)mr->n_params * 4, data_bytes = block_bytes * (size_t)blocks;
  data_stream s = {mr, block_bytes, data_bytes, 0, NULL, NULL, 0};
  s.chunk = malloc(data_bytes < STREAM_CHUNK ? (data_bytes ? data_bytes : 1) : STREAM_CHUNK);
  char *sums = s.chunk ? block_checksums(&s) : NULL;
  cJSON *h = sums ? header_json(mr, meta, blocks, sums, data_bytes) : NULL;
  char *text = h ? cJSON_PrintUnformatted(h) : NULL;
  cJSON_Delete(h);
  free(sums);
  size_t hlen = text ? strlen(text) : 0, padded = (hlen + 7) / 8 * 8;
  char *head = text ? malloc(8 + padded) : NULL;
  if (!head) {
    free(text);
    free(s.chunk);
    ff_diag_error(d, NULL, "out of memory for a checkpoint");
    return FF_ERR_RUNTIME;
  }
  uint64_t len = padded;
  for (int i = 0; i < 8; i++)
    head[i] = (char)(unsigned char)(len >> (8 * i)); /* little-endian, as safetensors specifies */
  memcpy(head + 8, text, hlen);
  memset(head + 8 + hlen, ' ', padded - hlen);
  free(text);
  s.head = head;
  s.head_len = 8 + padded;
  snprintf(path_out, cap, "%s/step-%08" PRId64 ".safetensors", dir, meta->step);
  ff_status st = ff_write_pieces_atomic(path_out, next_piece, &s, d);
  free(head);
  free(s.chunk);
  return st;
}

static int cmp_desc(const void *a, const void *b) {
  long long x = *(const long long *)a, y = *(const long long *)b;
  return (x < y) - (x > y);
}

int ff_checkpoint_list(const char *dir, long long *steps, int max) {
  DIR *dp = opendir(dir);
  if (!dp)
    return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(dp)) && n < max) {
    long long step;
    char tail[32];
    if (sscanf(e->d_name, "step-%lld.%31s", &step, tail) == 2 && strcmp(tail, "safetensors") == 0)
      steps[n++] = step;
  }
  closedir(dp);
  qsort(steps, (size_t)n, sizeof *steps, cmp_desc);
  return n;
}

ff_status ff_checkpoint_latest(const char *dir, char *path, size_t cap) {
  long long steps[1];
  long long all[4096];
  int n = ff_checkpoint_list(dir, all, 4096);
  if (n == 0)
    return FF_ERR_INPUT;
  steps[0] = all[0];
  snprintf(path, cap, "%s/step-%08lld.safetensors", dir, steps[0]);
  return FF_OK;
}

static const char *meta_string(const cJSON *md, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(md, key);
  return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* The data section is as long as the header says and every MiB matches its checksum. */
static ff_status check_integrity(const cJSON *md, const unsigned char *file, size_t len,
                                 size_t hlen, ff_diag *d) {
  const char *bytes = meta_string(md, "data_bytes"), *sums = meta_string(md, "data_fnv1a64_per_mib");
  size_t start = 8 + hlen;
  if (!bytes || !sums) {
    ff_diag_error(d, "__metadata__", "no data_bytes and data_fnv1a64_per_mib: not written by ffrun, "
                  "or damaged");
    return FF_ERR_INPUT;
  }
  size_t want = (size_t)strtoull(bytes, NULL, 10);
  if (len - start != want) {
    ff_diag_error(d, NULL, "byte %zu: the file ends after %zu bytes of data, expected %zu (truncated)",
                  len, len - start, want);
    return FF_ERR_INPUT;
  }
  const char *p = sums;
  for (size_t off = 0; off < want; off += CHECK_BLOCK) {
    size_t n = want - off < CHECK_BLOCK ? want - off : CHECK_BLOCK;
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)ff_fnv1a64(file + start + off, n));
    if (strncmp(p, hex, 16) != 0) {
      ff_diag_error(d, NULL, "bytes %zu to %zu: checksum mismatch (the file is damaged)",
                    start + off, start + off + n);
      return FF_ERR_INPUT;
    }
    p += 16 + (p[16] == ',');
  }
  return FF_OK;
}

/* Copy this rank's slice of a logical (rows, cols) tensor from the file's bytes. */
static void copy_slice(float *dst, const unsigned char *src, const ff_tensor *t) {
  int64_t w = t->col_end - t->col_first;
  for (int64_t r = t->row_first; r < t->row_end; r++)
    memcpy(dst + (r - t->row_first) * w, src + ((size_t)r * (size_t)t->cols + (size_t)t->col_first) * 4,
           (size_t)w * 4);
}

static ff_status load_tensors(const cJSON *h, const unsigned char *data, size_t data_len,
                              ff_model_rank *mr, ff_diag *d) {
  float *host = malloc((size_t)mr->n_params * sizeof *host);
  if (!host)
    return FF_ERR_RUNTIME;
  for (int which = 0; which < 3; which++) {
    for (int i = 0; i < mr->n_tensors; i++) {
      const ff_tensor *t = &mr->tensors[i];
      char name[64];
      snprintf(name, sizeof name, "%s%s", moment_prefix[which], t->name);
      const cJSON *o = cJSON_GetObjectItemCaseSensitive(h, name);
      const cJSON *off = o ? cJSON_GetObjectItemCaseSensitive(o, "data_offsets") : NULL;
      const cJSON *shape = o ? cJSON_GetObjectItemCaseSensitive(o, "shape") : NULL;
      const cJSON *dtype = o ? cJSON_GetObjectItemCaseSensitive(o, "dtype") : NULL;
      int64_t want_dims = t->cols == 1 ? 1 : 2;
      bool ok = o && cJSON_GetArraySize(off) == 2 && cJSON_IsString(dtype) &&
                strcmp(dtype->valuestring, "F32") == 0 && cJSON_GetArraySize(shape) == want_dims &&
                cJSON_GetArrayItem(shape, 0)->valuedouble == (double)t->rows &&
                (want_dims == 1 || cJSON_GetArrayItem(shape, 1)->valuedouble == (double)t->cols);
      double a = ok ? cJSON_GetArrayItem(off, 0)->valuedouble : 0;
      double b = ok ? cJSON_GetArrayItem(off, 1)->valuedouble : 0;
      if (!ok || a < 0 || b > (double)data_len || b - a != (double)(t->rows * t->cols * 4)) {
        ff_diag_error(d, name, "missing, or not an F32 tensor of shape [%lld, %lld] within the file",
                      (long long)t->rows, (long long)t->cols);
        free(host);
        return FF_ERR_INPUT;
      }
      copy_slice(host + t->offset, data + (size_t)a, t);
    }
    mr->k->to_device(block_of(mr, which), host, (size_t)mr->n_params * sizeof *host);
  }
  free(host);
  return FF_OK;
}

ff_status ff_checkpoint_load(const char *file, ff_model_rank *mr, const char *model_digest,
                             ff_ckpt_meta *meta, ff_diag *d) {
  char *buf;
  size_t len;
  const char *saved = d->file;
  d->file = file;
  ff_status st = ff_read_file_any(file, d, &buf, &len);
  cJSON *h = NULL;
  if (st == FF_OK && len < 8) {
    ff_diag_error(d, NULL, "%zu bytes is too short for a safetensors file", len);
    st = FF_ERR_INPUT;
  }
  uint64_t hlen = 0;
  for (int i = 0; st == FF_OK && i < 8; i++)
    hlen |= (uint64_t)(unsigned char)buf[i] << (8 * i);
  if (st == FF_OK && (hlen > len - 8 || !(h = cJSON_ParseWithLength(buf + 8, (size_t)hlen)))) {
    ff_diag_error(d, NULL, "byte 8: the safetensors header (%llu bytes) is not readable JSON",
                  (unsigned long long)hlen);
    st = FF_ERR_INPUT;
  }
  const cJSON *md = h ? cJSON_GetObjectItemCaseSensitive(h, "__metadata__") : NULL;
  const char *fmt = md ? meta_string(md, "format") : NULL;
  const char *digest = md ? meta_string(md, "model_digest") : NULL;
  if (st == FF_OK && (!fmt || strcmp(fmt, "ff-checkpoint/1") != 0)) {
    ff_diag_error(d, "__metadata__.format", "expected \"ff-checkpoint/1\"");
    st = FF_ERR_INPUT;
  } else if (st == FF_OK && (!digest || strcmp(digest, model_digest) != 0)) {
    ff_diag_error(d, "__metadata__.model_digest", "this checkpoint is of model \"%s\" (%s); the "
                  "plan trains another model (%s)", meta_string(md, "model") ? meta_string(md, "model") : "?",
                  digest ? digest : "none", model_digest);
    st = FF_ERR_INPUT;
  }
  if (st == FF_OK)
    st = check_integrity(md, (const unsigned char *)buf, len, (size_t)hlen, d);
  if (st == FF_OK) {
    memset(meta, 0, sizeof *meta);
    const char *step = meta_string(md, "step"), *seed = meta_string(md, "seed");
    meta->step = step ? strtoll(step, NULL, 10) : 0;
    meta->seed = seed ? strtoull(seed, NULL, 10) : 0;
    snprintf(meta->model_name, sizeof meta->model_name, "%s", meta_string(md, "model") ? meta_string(md, "model") : "");
    snprintf(meta->model_digest, sizeof meta->model_digest, "%s", digest);
    st = load_tensors(h, (const unsigned char *)buf + 8 + hlen, len - 8 - (size_t)hlen, mr, d);
  }
  cJSON_Delete(h);
  free(buf);
  d->file = saved;
  return st;
}
