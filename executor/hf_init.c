/* hf_init.c — a Hugging Face Llama directory's weights into a rank's shard; see hf_init.h. */
#define _POSIX_C_SOURCE 200809L
#include "hf_init.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "checkpoint.h"
#include "ff_json.h"

enum { HF_MAX_FILES = 1024 };

/* An error about `file` (at JSON path `key`, or the file as a whole when NULL): the message is
 * named by that file rather than by the directory the diagnostics were opened for. */
#define hf_error(d, file_, key, ...)                                                            \
  do {                                                                                          \
    const char *hf_saved_ = (d)->file;                                                          \
    (d)->file = (file_);                                                                        \
    ff_diag_error((d), (key), __VA_ARGS__);                                                     \
    (d)->file = hf_saved_;                                                                      \
  } while (0)
#define HF_HEADER_MAX (100u << 20) /* bytes of JSON header: beyond it the file is not sane */

/* A JSON object from a file (read as every input is: ff_json_load), or NULL having said why,
 * naming the file. */
static cJSON *read_json(const char *path, ff_diag *d) {
  const char *saved = d->file;
  d->file = path;
  cJSON *j = NULL;
  if (ff_json_load(path, d, &j) == FF_OK && !cJSON_IsObject(j)) {
    ff_diag_error(d, NULL, "not a JSON object");
    cJSON_Delete(j);
    j = NULL;
  }
  d->file = saved;
  return j;
}

/* ---- config.json ------------------------------------------------------------------------ */

/* A numeric field, or `dflt` when absent (dflt NAN: required). false having said why. */
static bool number(const cJSON *c, const char *path, const char *key, double dflt, double *out,
                   ff_diag *d) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(c, key);
  if ((!v || cJSON_IsNull(v)) && !isnan(dflt)) {
    *out = dflt;
    return true;
  }
  if (!cJSON_IsNumber(v)) {
    hf_error(d, path, key, "%s, expected a number", v ? "is not a number" : "is missing");
    return false;
  }
  *out = v->valuedouble;
  return true;
}

static bool same(const char *path, const char *key, double got, double want, const char *field,
                 double tol, ff_diag *d) {
  if (fabs(got - want) <= tol * fabs(want))
    return true;
  hf_error(d, path, key, "is %.10g, but the plan's model has %s %.10g", got, field, want);
  return false;
}

ff_status ff_hf_check_config(const char *dir, const ff_model *m, ff_diag *d) {
  char path[4096];
  snprintf(path, sizeof path, "%s/config.json", dir);
  cJSON *c = read_json(path, d);
  if (!c)
    return FF_ERR_INPUT;
  bool ok = true;
  const cJSON *type = cJSON_GetObjectItemCaseSensitive(c, "model_type");
  if (type && !(cJSON_IsString(type) && strcmp(type->valuestring, "llama") == 0)) {
    hf_error(d, path, "model_type", "is not \"llama\", the architecture ffrun trains");
    ok = false;
  }
  const cJSON *act = cJSON_GetObjectItemCaseSensitive(c, "hidden_act");
  if (act && !(cJSON_IsString(act) && strcmp(act->valuestring, "silu") == 0)) {
    hf_error(d, path, "hidden_act", "is not \"silu\" (SwiGLU, the plan's activation)");
    ok = false;
  }
  const char *absent[] = {"rope_scaling", "attention_bias", "mlp_bias"};
  for (int i = 0; i < 3; i++) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(c, absent[i]);
    if (v && !cJSON_IsNull(v) && !cJSON_IsFalse(v)) {
      hf_error(d, path, absent[i], "is set, which ffrun's Llama does not have");
      ok = false;
    }
  }
  /* absent, num_key_value_heads is num_attention_heads (plain multi-head attention) */
  const cJSON *heads = cJSON_GetObjectItemCaseSensitive(c, "num_attention_heads");
  double kv_default = cJSON_IsNumber(heads) ? heads->valuedouble : (double)m->heads;
  const struct {
    const char *key, *field;
    double dflt, want, tol;
  } f[] = {
      {"hidden_size", "hidden", NAN, (double)m->hidden, 0},
      {"intermediate_size", "ffn_hidden", NAN, (double)m->ffn_hidden, 0},
      {"num_hidden_layers", "layers", NAN, (double)m->layers, 0},
      {"num_attention_heads", "heads", NAN, (double)m->heads, 0},
      {"num_key_value_heads", "kv_heads", kv_default, (double)m->kv_heads, 0},
      {"vocab_size", "vocab", NAN, (double)m->vocab, 0},
      {"head_dim", "hidden / heads", (double)(m->hidden / m->heads), (double)(m->hidden / m->heads), 0},
      {"rms_norm_eps", "norm_eps", 1e-6, m->norm_eps, 1e-6},
      {"rope_theta", "rope_theta", 10000, m->rope_theta, 1e-9},
  };
  for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
    double v;
    if (!number(c, path, f[i].key, f[i].dflt, &v, d))
      ok = false;
    else if (!same(path, f[i].key, v, f[i].want, f[i].field, f[i].tol, d))
      ok = false;
  }
  const cJSON *tied = cJSON_GetObjectItemCaseSensitive(c, "tie_word_embeddings");
  bool is_tied = cJSON_IsTrue(tied);
  if (tied && !cJSON_IsBool(tied)) {
    hf_error(d, path, "tie_word_embeddings", "expected true or false");
    ok = false;
  } else if (is_tied != m->tied_embeddings) {
    hf_error(d, path, "tie_word_embeddings", "is %s, but the plan's model has tied_embeddings "
                  "%s", is_tied ? "true" : "false", m->tied_embeddings ? "true" : "false");
    ok = false;
  }
  cJSON_Delete(c);
  return ok ? FF_OK : FF_ERR_INPUT;
}

/* ---- safetensors files ------------------------------------------------------------------ */

typedef struct st_file {
  char path[4096];
  unsigned char *buf; /* mapped read-only */
  size_t len, data_at;
  cJSON *header;
} st_file;

typedef struct hf_dir {
  const char *dir;
  cJSON *weight_map; /* the index's name → file, or NULL: one model.safetensors */
  cJSON *index;
  st_file files[HF_MAX_FILES];
  int n_files;
} hf_dir;

static void close_files(hf_dir *h) {
  for (int i = 0; i < h->n_files; i++) {
    if (h->files[i].buf)
      munmap(h->files[i].buf, h->files[i].len);
    cJSON_Delete(h->files[i].header);
  }
  cJSON_Delete(h->index);
}

/* The file, mapped and its header read (each file once), or NULL having said why. */
static st_file *open_file(hf_dir *h, const char *name, ff_diag *d) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", h->dir, name);
  for (int i = 0; i < h->n_files; i++)
    if (strcmp(h->files[i].path, path) == 0)
      return &h->files[i];
  if (strchr(name, '/') || h->n_files == HF_MAX_FILES) {
    hf_error(d, path, NULL, "not a shard file of the directory");
    return NULL;
  }
  st_file *f = &h->files[h->n_files];
  memset(f, 0, sizeof *f);
  snprintf(f->path, sizeof f->path, "%s", path);
  const char *saved = d->file;
  d->file = path;
  char *p;
  ff_status st = ff_map_file(path, d, &p, &f->len);
  d->file = saved;
  if (st != FF_OK)
    return NULL;
  f->buf = (unsigned char *)p;
  h->n_files++; /* from here close_files unmaps it */
  uint64_t hlen = 0;
  for (int i = 0; f->len >= 8 && i < 8; i++)
    hlen |= (uint64_t)f->buf[i] << (8 * i);
  if (f->len < 8 || hlen > f->len - 8 || hlen > HF_HEADER_MAX) {
    hf_error(d, path, NULL, "%s", f->len < 8 ? "shorter than a safetensors file's "
                  "8-byte header length" : hlen > HF_HEADER_MAX ? "its header length is over "
                  "100 MiB: not a safetensors file" : "its header runs past the end of the file "
                  "(truncated)");
    return NULL;
  }
  f->header = cJSON_ParseWithLength((const char *)f->buf + 8, (size_t)hlen);
  if (!cJSON_IsObject(f->header)) {
    hf_error(d, path, NULL, "byte 8: the header (%llu bytes) is not a JSON object",
                  (unsigned long long)hlen);
    return NULL;
  }
  f->data_at = 8 + (size_t)hlen;
  return f;
}

/* ---- the names, and the copy ------------------------------------------------------------ */

void ff_hf_name(const char *ours, char *out, size_t cap) {
  static const char *const map[][2] = {
      {"attn_norm", "input_layernorm.weight"}, {"wq", "self_attn.q_proj.weight"},
      {"wk", "self_attn.k_proj.weight"},       {"wv", "self_attn.v_proj.weight"},
      {"wo", "self_attn.o_proj.weight"},       {"mlp_norm", "post_attention_layernorm.weight"},
      {"w_gate", "mlp.gate_proj.weight"},      {"w_up", "mlp.up_proj.weight"},
      {"w_down", "mlp.down_proj.weight"},
  };
  int layer, at = 0;
  if (sscanf(ours, "layers.%d.%n", &layer, &at) == 1 && at > 0) {
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
      if (strcmp(ours + at, map[i][0]) == 0) {
        snprintf(out, cap, "model.layers.%d.%s", layer, map[i][1]);
        return;
      }
  }
  snprintf(out, cap, "%s", strcmp(ours, "embed") == 0        ? "model.embed_tokens.weight"
                           : strcmp(ours, "final_norm") == 0 ? "model.norm.weight"
                           : strcmp(ours, "lm_head") == 0    ? "lm_head.weight"
                                                             : ours);
}

static float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31u, mant = h & 1023u, bits;
  if (e == 31) {
    bits = sign | 0x7f800000u | mant << 13; /* infinity or NaN */
  } else if (e) {
    bits = sign | (e + 112) << 23 | mant << 13;
  } else { /* zero or subnormal: mant · 2^-24 exactly */
    float v = (float)mant * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

/* Element i of a tensor of the given dtype, as fp32. */
static float element(const unsigned char *p, int dtype, size_t i) {
  if (dtype == 4) {
    float f;
    memcpy(&f, p + 4 * i, sizeof f);
    return f;
  }
  uint16_t h = (uint16_t)(p[2 * i] | p[2 * i + 1] << 8);
  if (dtype == 2) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
  }
  return half_to_float(h);
}

int64_t ff_hf_row(int64_t r, bool rotary, int64_t D) {
  if (!rotary)
    return r;
  int64_t head = r / D, j = r % D;
  return head * D + (j % 2) * (D / 2) + j / 2;
}

static bool load_tensor(hf_dir *h, const ff_tensor *t, float *dst, int64_t D, ff_diag *d) {
  char name[160];
  ff_hf_name(t->name, name, sizeof name);
  const char *file = "model.safetensors";
  if (h->weight_map) {
    const cJSON *w = cJSON_GetObjectItemCaseSensitive(h->weight_map, name);
    if (!cJSON_IsString(w)) {
      char index[4200];
      snprintf(index, sizeof index, "%s/model.safetensors.index.json", h->dir);
      hf_error(d, index, "weight_map", "has no %s", name);
      return false;
    }
    file = w->valuestring;
  }
  st_file *f = open_file(h, file, d);
  if (!f)
    return false;
  const cJSON *o = cJSON_GetObjectItemCaseSensitive(f->header, name);
  if (!o) {
    hf_error(d, f->path, name, "is not in the file (the plan's model has it)");
    return false;
  }
  const cJSON *dt = cJSON_GetObjectItemCaseSensitive(o, "dtype");
  const cJSON *shape = cJSON_GetObjectItemCaseSensitive(o, "shape");
  const cJSON *off = cJSON_GetObjectItemCaseSensitive(o, "data_offsets");
  int size = !cJSON_IsString(dt)                    ? 0
             : strcmp(dt->valuestring, "F32") == 0  ? 4
             : strcmp(dt->valuestring, "BF16") == 0 ? 2
             : strcmp(dt->valuestring, "F16") == 0  ? 3 /* 2 bytes; 3 tells it from BF16 */
                                                    : 0;
  if (!size) {
    hf_error(d, f->path, name, "dtype %s%s%s is not one of F32, BF16, F16",
                  cJSON_IsString(dt) ? "\"" : "", cJSON_IsString(dt) ? dt->valuestring : "(none)",
                  cJSON_IsString(dt) ? "\"" : "");
    return false;
  }
  size_t bytes = size == 4 ? 4 : 2;
  int dims = t->cols == 1 ? 1 : 2;
  bool shape_ok = cJSON_GetArraySize(shape) == dims &&
                  cJSON_GetArrayItem(shape, 0)->valuedouble == (double)t->rows &&
                  (dims == 1 || cJSON_GetArrayItem(shape, 1)->valuedouble == (double)t->cols);
  if (!shape_ok) {
    hf_error(d, f->path, name, "shape is not [%lld%s%lld] (the plan's model)",
                  (long long)t->rows, dims == 2 ? ", " : "", dims == 2 ? (long long)t->cols : 0LL);
    return false;
  }
  size_t data_len = f->len - f->data_at;
  double a = cJSON_GetArraySize(off) == 2 ? cJSON_GetArrayItem(off, 0)->valuedouble : -1;
  double b = cJSON_GetArraySize(off) == 2 ? cJSON_GetArrayItem(off, 1)->valuedouble : -1;
  if (!(a >= 0 && b >= a && b <= (double)data_len &&
        b - a == (double)t->rows * (double)t->cols * (double)bytes)) {
    hf_error(d, f->path, name, "data_offsets [%.0f, %.0f] are not %lld bytes within the %zu bytes "
                  "of data (truncated?)", a, b,
                  (long long)(t->rows * t->cols * (int64_t)bytes), data_len);
    return false;
  }
  const unsigned char *src = f->buf + f->data_at + (size_t)a;
  bool rotary = strstr(name, "q_proj") || strstr(name, "k_proj");
  int64_t w = t->col_end - t->col_first;
  for (int64_t r = t->row_first; r < t->row_end; r++) {
    const unsigned char *row = src + (size_t)ff_hf_row(r, rotary, D) * (size_t)t->cols * bytes;
    float *out = dst + (r - t->row_first) * w;
    for (int64_t c = 0; c < w; c++)
      out[c] = element(row, size == 4 ? 4 : size == 2 ? 2 : 3, (size_t)(t->col_first + c));
  }
  /* loading holds no more of the files than one tensor (a column slice touches every page) */
  ff_drop_pages(src, (size_t)(b - a));
  return true;
}

ff_status ff_hf_load(const char *dir, ff_model_rank *mr, ff_diag *d) {
  hf_dir *h = calloc(1, sizeof *h);
  float *host = malloc((size_t)(mr->n_params ? mr->n_params : 1) * sizeof *host);
  if (!h || !host) {
    free(h);
    free(host);
    return FF_ERR_RUNTIME;
  }
  h->dir = dir;
  char index[4096];
  snprintf(index, sizeof index, "%s/model.safetensors.index.json", dir);
  bool ok = true;
  if (access(index, F_OK) == 0) {
    ok = (h->index = read_json(index, d)) != NULL;
    h->weight_map = ok ? cJSON_GetObjectItemCaseSensitive(h->index, "weight_map") : NULL;
    if (ok && !cJSON_IsObject(h->weight_map)) {
      hf_error(d, index, "weight_map", "expected an object naming each tensor's file");
      ok = false;
    }
  }
  int64_t D = mr->model->hidden / mr->model->heads;
  for (int i = 0; ok && i < mr->n_tensors; i++)
    ok = load_tensor(h, &mr->tensors[i], host + mr->tensors[i].offset, D, d);
  if (ok) {
    mr->k->to_device(mr->params, host, (size_t)mr->n_params * sizeof *host);
    ff_model_rank_weights_changed(mr);
  }
  close_files(h);
  free(h);
  free(host);
  return ok ? FF_OK : FF_ERR_INPUT;
}
