/* checkpoint.c — safetensors checkpoints of logical tensors; see checkpoint.h. */
#define _POSIX_C_SOURCE 200809L
#include "checkpoint.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

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
#define STREAM_CHUNK ((size_t)64 << 20) /* what a one-rank save copies out of the backend at once */

static cJSON *header_json(const ff_model_rank *layout, const ff_ckpt_meta *meta, int blocks,
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
  cJSON *mj = ff_model_to_json(layout->model, false); /* what `ffrun export` writes config.json from */
  char *mtext = mj ? cJSON_PrintUnformatted(mj) : NULL;
  cJSON_Delete(mj);
  if (!mtext) {
    cJSON_Delete(h);
    return NULL;
  }
  cJSON_AddStringToObject(md, "model_json", mtext);
  free(mtext);
  snprintf(num, sizeof num, "%zu", data_bytes);
  cJSON_AddStringToObject(md, "data_bytes", num);
  cJSON_AddStringToObject(md, "data_fnv1a64_per_mib", checksums);
  int64_t offset = 0;
  for (int which = 0; which < blocks; which++)
    for (int i = 0; i < layout->n_tensors; i++) {
      const ff_tensor *t = &layout->tensors[i];
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

/* The file is written front to back once: the header with every checksum still zero (each is
 * 16 hex digits, so the header's length does not change), then the data, hashed as it passes,
 * then the header again over the first, with the checksums filled in. */
struct ff_ckpt_writer {
  ff_atomic_file *f;
  const ff_model_rank *layout;
  ff_ckpt_meta meta;
  int blocks;
  size_t total, at;  /* data bytes expected, and appended so far */
  char *sums;        /* the checksums, comma-separated hex */
  size_t sums_len;
  uint64_t hash;     /* of the current MiB, `in_block` bytes into it */
  size_t in_block;
  size_t head_len;
  char path[4096];
};

/* The 8-byte length and the padded header, as safetensors lays them out; NULL when out of
 * memory. */
static char *make_head(const ff_ckpt_writer *w, size_t *len) {
  cJSON *h = header_json(w->layout, &w->meta, w->blocks, w->sums, w->total);
  char *text = h ? cJSON_PrintUnformatted(h) : NULL;
  cJSON_Delete(h);
  size_t hlen = text ? strlen(text) : 0, padded = (hlen + 7) / 8 * 8;
  char *head = text ? malloc(8 + padded) : NULL;
  if (head) {
    uint64_t n = padded;
    for (int i = 0; i < 8; i++)
      head[i] = (char)(unsigned char)(n >> (8 * i)); /* little-endian, as safetensors says */
    memcpy(head + 8, text, hlen);
    memset(head + 8 + hlen, ' ', padded - hlen);
    *len = 8 + padded;
  }
  free(text);
  return head;
}

static void end_block(ff_ckpt_writer *w) {
  w->sums_len += (size_t)snprintf(w->sums + w->sums_len, 18, "%s%016llx", w->sums_len ? "," : "",
                                  (unsigned long long)w->hash);
  w->hash = FF_FNV1A64_INIT;
  w->in_block = 0;
}

ff_ckpt_writer *ff_checkpoint_begin(const char *dir, const ff_model_rank *layout,
                                    const ff_ckpt_meta *meta, bool gradients, ff_diag *d) {
  ff_ckpt_writer *w = calloc(1, sizeof *w);
  size_t total = 0;
  for (int i = 0; i < layout->n_tensors; i++)
    total += (size_t)(layout->tensors[i].rows * layout->tensors[i].cols) * 4;
  int blocks = gradients ? 4 : 3;
  total *= (size_t)blocks;
  size_t n_sums = (total + CHECK_BLOCK - 1) / CHECK_BLOCK;
  char *sums = malloc(n_sums * 17 + 1);
  if (!w || !sums) {
    free(w), free(sums);
    ff_diag_error(d, NULL, "out of memory for a checkpoint");
    return NULL;
  }
  size_t j = 0;
  for (size_t i = 0; i < n_sums; i++) {
    if (i)
      sums[j++] = ',';
    memset(sums + j, '0', 16);
    j += 16;
  }
  sums[j] = '\0';
  *w = (ff_ckpt_writer){NULL, layout, *meta, blocks, total, 0, sums, 0, FF_FNV1A64_INIT, 0, 0, ""};
  snprintf(w->path, sizeof w->path, "%s/step-%08" PRId64 ".safetensors", dir, meta->step);
  char *head = make_head(w, &w->head_len);
  w->f = head ? ff_atomic_open(w->path, d) : NULL;
  if (!head)
    ff_diag_error(d, NULL, "out of memory for a checkpoint");
  if (w->f)
    ff_atomic_write(w->f, head, w->head_len);
  free(head);
  if (!w->f) {
    free(sums);
    free(w);
    return NULL;
  }
  return w;
}

void ff_checkpoint_append(ff_ckpt_writer *w, const void *data, size_t bytes) {
  const unsigned char *p = data;
  if (w->at > w->total || bytes > w->total - w->at) { /* past the header's promise: refused */
    w->at = w->total + 1;
    return;
  }
  ff_atomic_write(w->f, p, bytes);
  w->at += bytes;
  while (bytes > 0) {
    size_t take = CHECK_BLOCK - w->in_block < bytes ? CHECK_BLOCK - w->in_block : bytes;
    w->hash = ff_fnv1a64_update(w->hash, p, take);
    w->in_block += take;
    p += take;
    bytes -= take;
    if (w->in_block == CHECK_BLOCK)
      end_block(w);
  }
}

ff_status ff_checkpoint_end(ff_ckpt_writer *w, bool keep, ff_diag *d, char *path_out, size_t cap) {
  if (!w)
    return FF_ERR_RUNTIME;
  ff_status st = FF_ERR_RUNTIME;
  if (keep && w->at != w->total) {
    ff_diag_error(d, NULL, "%s: %s bytes of tensors were handed over than the header promises "
                  "(%zu)", w->path, w->at < w->total ? "fewer" : "more", w->total);
  } else if (keep) {
    if (w->in_block > 0)
      end_block(w);
    size_t len = 0;
    char *head = make_head(w, &len);
    if (head && len == w->head_len) {
      ff_atomic_write_at(w->f, head, len, 0);
      st = ff_atomic_commit(w->f, d);
      w->f = NULL;
      if (st == FF_OK)
        snprintf(path_out, cap, "%s", w->path);
    } else {
      ff_diag_error(d, NULL, head ? "%s: the header changed length once its checksums were known"
                                  : "%s: out of memory for a checkpoint's header", w->path);
    }
    free(head);
  }
  ff_atomic_discard(w->f);
  free(w->sums);
  free(w);
  return st;
}

ff_status ff_checkpoint_save(const char *dir, const ff_model_rank *mr, const ff_ckpt_meta *meta,
                             bool gradients, ff_diag *d, char *path_out, size_t cap) {
  for (int i = 0; i < mr->n_tensors; i++)
    if (mr->tensors[i].numel != mr->tensors[i].rows * mr->tensors[i].cols) {
      ff_diag_error(d, NULL, "tensor %s is sharded on this rank; a sharded save needs the "
                    "distributed executor", mr->tensors[i].name);
      return FF_ERR_INPUT;
    }
  size_t block_bytes = (size_t)mr->n_params * 4;
  unsigned char *chunk = malloc(block_bytes < STREAM_CHUNK ? (block_bytes ? block_bytes : 1)
                                                           : STREAM_CHUNK);
  ff_ckpt_writer *w = chunk ? ff_checkpoint_begin(dir, mr, meta, gradients, d) : NULL;
  if (!chunk)
    ff_diag_error(d, NULL, "out of memory for a checkpoint");
  for (int which = 0; w && which < (gradients ? 4 : 3); which++)
    for (size_t at = 0; at < block_bytes; at += STREAM_CHUNK) {
      size_t n = block_bytes - at < STREAM_CHUNK ? block_bytes - at : STREAM_CHUNK;
      mr->k->to_host(chunk, (const unsigned char *)block_of(mr, which) + at, n);
      ff_checkpoint_append(w, chunk, n);
    }
  free(chunk);
  return w ? ff_checkpoint_end(w, true, d, path_out, cap) : FF_ERR_RUNTIME;
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

void ff_drop_pages(const void *p, size_t n) {
  uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), from = (uintptr_t)p;
  uintptr_t lo = (from + page - 1) & ~(page - 1), hi = (from + n) & ~(page - 1);
  if (hi > lo)
    madvise((void *)lo, hi - lo, MADV_DONTNEED);
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
    ff_drop_pages(file + start + off, n); /* checking the whole file must not hold it */
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

static ff_status load_tensors(const ff_ckpt_view *v, ff_model_rank *mr, ff_diag *d) {
  float *host = malloc((size_t)mr->n_params * sizeof *host);
  if (!host)
    return FF_ERR_RUNTIME;
  for (int which = 0; which < 3; which++) {
    for (int i = 0; i < mr->n_tensors; i++) {
      const ff_tensor *t = &mr->tensors[i];
      char name[64];
      snprintf(name, sizeof name, "%s%s", moment_prefix[which], t->name);
      const unsigned char *src = ff_checkpoint_tensor(v, name, t->rows, t->cols);
      if (!src) {
        ff_diag_error(d, name, "missing, or not an F32 tensor of shape [%lld, %lld] within the file",
                      (long long)t->rows, (long long)t->cols);
        free(host);
        return FF_ERR_INPUT;
      }
      copy_slice(host + t->offset, src, t);
      ff_drop_pages(src, (size_t)(t->rows * t->cols) * 4);
    }
    mr->k->to_device(block_of(mr, which), host, (size_t)mr->n_params * sizeof *host);
  }
  free(host);
  return FF_OK;
}

ff_status ff_map_file(const char *file, ff_diag *d, char **buf, size_t *len) {
  *buf = NULL;
  *len = 0;
  int fd = open(file, O_RDONLY);
  struct stat sb;
  if (fd < 0 || fstat(fd, &sb) != 0) {
    ff_diag_error(d, NULL, "cannot open: %s", strerror(errno));
    if (fd >= 0)
      close(fd);
    return FF_ERR_INPUT;
  }
  if (!S_ISREG(sb.st_mode)) {
    ff_diag_error(d, NULL, "not a regular file, expected a safetensors file");
    close(fd);
    return FF_ERR_INPUT;
  }
  *len = (size_t)sb.st_size;
  void *p = *len ? mmap(NULL, *len, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
  close(fd);
  if (p == MAP_FAILED) {
    ff_diag_error(d, NULL, "cannot map %zu bytes: %s", *len, strerror(errno));
    *len = 0;
    return FF_ERR_RUNTIME;
  }
  *buf = p;
  return FF_OK;
}

ff_status ff_checkpoint_open(const char *file, ff_ckpt_view *v, ff_diag *d) {
  memset(v, 0, sizeof *v);
  const char *saved = d->file;
  d->file = file;
  ff_status st = ff_map_file(file, d, &v->buf, &v->len);
  if (st == FF_OK && v->len < 8) {
    ff_diag_error(d, NULL, "%zu bytes is too short for a safetensors file", v->len);
    st = FF_ERR_INPUT;
  }
  uint64_t hlen = 0;
  for (int i = 0; st == FF_OK && i < 8; i++)
    hlen |= (uint64_t)(unsigned char)v->buf[i] << (8 * i);
  if (st == FF_OK &&
      (hlen > v->len - 8 || !(v->header = cJSON_ParseWithLength(v->buf + 8, (size_t)hlen)))) {
    ff_diag_error(d, NULL, "byte 8: the safetensors header (%llu bytes) is not readable JSON",
                  (unsigned long long)hlen);
    st = FF_ERR_INPUT;
  }
  const cJSON *md = v->header ? cJSON_GetObjectItemCaseSensitive(v->header, "__metadata__") : NULL;
  const char *fmt = md ? meta_string(md, "format") : NULL;
  if (st == FF_OK && (!fmt || strcmp(fmt, "ff-checkpoint/1") != 0)) {
    ff_diag_error(d, "__metadata__.format", "expected \"ff-checkpoint/1\"");
    st = FF_ERR_INPUT;
  }
  if (st == FF_OK)
    st = check_integrity(md, (const unsigned char *)v->buf, v->len, (size_t)hlen, d);
  if (st == FF_OK) {
    const char *step = meta_string(md, "step"), *seed = meta_string(md, "seed");
    const char *name = meta_string(md, "model"), *digest = meta_string(md, "model_digest");
    v->meta.step = step ? strtoll(step, NULL, 10) : 0;
    v->meta.seed = seed ? strtoull(seed, NULL, 10) : 0;
    snprintf(v->meta.model_name, sizeof v->meta.model_name, "%s", name ? name : "");
    snprintf(v->meta.model_digest, sizeof v->meta.model_digest, "%s", digest ? digest : "");
    v->model_json = meta_string(md, "model_json");
    v->data = (const unsigned char *)v->buf + 8 + hlen;
    v->data_len = v->len - 8 - (size_t)hlen;
  }
  d->file = saved;
  if (st != FF_OK)
    ff_checkpoint_close(v);
  return st;
}

void ff_checkpoint_close(ff_ckpt_view *v) {
  cJSON_Delete(v->header);
  if (v->buf)
    munmap(v->buf, v->len);
  memset(v, 0, sizeof *v);
}

const unsigned char *ff_checkpoint_tensor(const ff_ckpt_view *v, const char *name, int64_t rows,
                                          int64_t cols) {
  const cJSON *o = cJSON_GetObjectItemCaseSensitive(v->header, name);
  const cJSON *off = o ? cJSON_GetObjectItemCaseSensitive(o, "data_offsets") : NULL;
  const cJSON *shape = o ? cJSON_GetObjectItemCaseSensitive(o, "shape") : NULL;
  const cJSON *dtype = o ? cJSON_GetObjectItemCaseSensitive(o, "dtype") : NULL;
  int want_dims = cols == 1 ? 1 : 2;
  bool ok = o && cJSON_GetArraySize(off) == 2 && cJSON_IsString(dtype) &&
            strcmp(dtype->valuestring, "F32") == 0 && cJSON_GetArraySize(shape) == want_dims &&
            cJSON_GetArrayItem(shape, 0)->valuedouble == (double)rows &&
            (want_dims == 1 || cJSON_GetArrayItem(shape, 1)->valuedouble == (double)cols);
  double a = ok ? cJSON_GetArrayItem(off, 0)->valuedouble : 0;
  double b = ok ? cJSON_GetArrayItem(off, 1)->valuedouble : 0;
  if (!ok || a < 0 || b > (double)v->data_len || b - a != (double)rows * (double)cols * 4 ||
      (uint64_t)a % 4 != 0) /* ffrun writes F32 tensors 4-byte aligned (the header padded to 8) */
    return NULL;
  return v->data + (size_t)a;
}

ff_status ff_checkpoint_load(const char *file, ff_model_rank *mr, const char *model_digest,
                             ff_ckpt_meta *meta, ff_diag *d) {
  ff_ckpt_view v;
  ff_status st = ff_checkpoint_open(file, &v, d);
  if (st != FF_OK)
    return st;
  const char *saved = d->file;
  d->file = file;
  if (strcmp(v.meta.model_digest, model_digest) != 0) {
    ff_diag_error(d, "__metadata__.model_digest", "this checkpoint is of model \"%s\" (%s); the "
                  "plan trains another model (%s)", v.meta.model_name[0] ? v.meta.model_name : "?",
                  v.meta.model_digest[0] ? v.meta.model_digest : "none", model_digest);
    st = FF_ERR_INPUT;
  }
  if (st == FF_OK) {
    *meta = v.meta;
    st = load_tensors(&v, mr, d);
    if (st == FF_OK)
      ff_model_rank_weights_changed(mr);
  }
  ff_checkpoint_close(&v);
  d->file = saved;
  return st;
}
