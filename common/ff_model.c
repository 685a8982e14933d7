/* ff_model.c — ff-model/1 (a Llama-style decoder's shape) and ff-training/1 (the settings of a
 * training run), and the "format" key check that every reader shares. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>

#include "ff_format.h"
#include "ff_format_internal.h"

bool ff_format_key(ff_jobj *o, ff_format_kind kind, bool inline_ok) {
  const cJSON *f = ff_jobj_get(o, "format", !inline_ok);
  if (!f)
    return inline_ok;
  if (!cJSON_IsString(f) || strcmp(f->valuestring, ff_format_ids[kind]) != 0) {
    char p[FF_PATH_MAX];
    ff_jobj_path(o, "format", p, sizeof p);
    ff_diag_error(o->diag, p, "expected \"%s\"", ff_format_ids[kind]);
    return false;
  }
  return true;
}

static const char *const norm_names[] = {"rmsnorm", NULL};
static const char *const activation_names[] = {"swiglu", NULL};

ff_status ff_model_from_json(const cJSON *v, const char *path, bool inline_ok, ff_diag *d,
                             ff_model *out) {
  memset(out, 0, sizeof *out);
  int errors_before = d->errors;
  ff_jobj o;
  if (!ff_jobj_open(&o, d, v, path))
    return FF_ERR_INPUT;
  bool ok = ff_format_key(&o, FF_FORMAT_MODEL, inline_ok);
  int unused = 0;
  ok &= ff_jobj_name(&o, "name", true, out->name);
  ok &= ff_jobj_int(&o, "layers", true, 1, 100000, &out->layers);
  ok &= ff_jobj_int(&o, "hidden", true, 1, 1 << 20, &out->hidden);
  ok &= ff_jobj_int(&o, "heads", true, 1, 65536, &out->heads);
  bool have_heads = out->heads > 0;
  out->kv_heads = out->heads;
  if (ff_jobj_get(&o, "kv_heads", false))
    ok &= ff_jobj_int(&o, "kv_heads", false, 1, have_heads ? out->heads : 65536, &out->kv_heads);
  ok &= ff_jobj_int(&o, "ffn_hidden", true, 1, 1 << 24, &out->ffn_hidden);
  ok &= ff_jobj_int(&o, "vocab", true, 1, 1 << 24, &out->vocab);
  ok &= ff_jobj_int(&o, "seq_len", true, 1, 1 << 24, &out->seq_len);
  if (ff_jobj_get(&o, "norm", false))
    ok &= ff_jobj_enum(&o, "norm", false, norm_names, &unused);
  out->norm_eps = 1e-5;
  if (ff_jobj_get(&o, "norm_eps", false))
    ok &= ff_jobj_num(&o, "norm_eps", false, (ff_interval){0, 1, true, true}, &out->norm_eps);
  if (ff_jobj_get(&o, "activation", false))
    ok &= ff_jobj_enum(&o, "activation", false, activation_names, &unused);
  out->rope_theta = 10000;
  if (ff_jobj_get(&o, "rope_theta", false))
    ok &= ff_jobj_num(&o, "rope_theta", false, FF_POSITIVE(1e12), &out->rope_theta);
  if (ff_jobj_get(&o, "tied_embeddings", false))
    ok &= ff_jobj_bool(&o, "tied_embeddings", false, &out->tied_embeddings);
  if (ff_jobj_get(&o, "source", false))
    ok &= ff_jobj_text(&o, "source", false, 4096, &out->source);
  ff_jobj_close(&o);

  char p[FF_PATH_MAX];
  if (ok && out->hidden % out->heads != 0) {
    ff_jobj_path(&o, "hidden", p, sizeof p);
    ff_diag_error(d, p, "%lld is not divisible by heads (%lld)", (long long)out->hidden,
                  (long long)out->heads);
    ok = false;
  } else if (ok && (out->hidden / out->heads) % 2 != 0) {
    ff_jobj_path(&o, "hidden", p, sizeof p);
    ff_diag_error(d, p, "head dimension hidden/heads = %lld is odd; rotary embeddings need an "
                  "even head dimension", (long long)(out->hidden / out->heads));
    ok = false;
  }
  if (ok && out->heads % out->kv_heads != 0) {
    ff_jobj_path(&o, "kv_heads", p, sizeof p);
    ff_diag_error(d, p, "%lld does not divide heads (%lld)", (long long)out->kv_heads,
                  (long long)out->heads);
    ok = false;
  }
  if (!ok || d->errors > errors_before) {
    ff_model_free(out);
    return FF_ERR_INPUT;
  }
  return FF_OK;
}

cJSON *ff_model_to_json(const ff_model *m, bool with_format) {
  cJSON *o = cJSON_CreateObject();
  if (with_format)
    cJSON_AddStringToObject(o, "format", ff_format_ids[FF_FORMAT_MODEL]);
  cJSON_AddStringToObject(o, "name", m->name);
  cJSON_AddNumberToObject(o, "layers", (double)m->layers);
  cJSON_AddNumberToObject(o, "hidden", (double)m->hidden);
  cJSON_AddNumberToObject(o, "heads", (double)m->heads);
  cJSON_AddNumberToObject(o, "kv_heads", (double)m->kv_heads);
  cJSON_AddNumberToObject(o, "ffn_hidden", (double)m->ffn_hidden);
  cJSON_AddNumberToObject(o, "vocab", (double)m->vocab);
  cJSON_AddNumberToObject(o, "seq_len", (double)m->seq_len);
  cJSON_AddStringToObject(o, "norm", norm_names[0]);
  cJSON_AddNumberToObject(o, "norm_eps", m->norm_eps);
  cJSON_AddStringToObject(o, "activation", activation_names[0]);
  cJSON_AddNumberToObject(o, "rope_theta", m->rope_theta);
  cJSON_AddBoolToObject(o, "tied_embeddings", m->tied_embeddings);
  if (m->source)
    cJSON_AddStringToObject(o, "source", m->source);
  return o;
}

ff_status ff_model_copy(const ff_model *src, ff_model *dst) {
  *dst = *src;
  dst->source = NULL;
  if (src->source && !(dst->source = strdup(src->source)))
    return FF_ERR_RUNTIME;
  return FF_OK;
}

void ff_model_free(ff_model *m) {
  free(m->source);
  memset(m, 0, sizeof *m);
}

/* ---- ff-training/1 ---------------------------------------------------------------------- */

static bool read_micro_batch_sizes(ff_jobj *o, ff_diag *d, ff_training *t) {
  const cJSON *arr = ff_jobj_array(o, "micro_batch_sizes", true, 1, FF_MAX_MICRO_BATCH_SIZES);
  if (!arr)
    return false;
  char base[FF_PATH_MAX];
  ff_jobj_path(o, "micro_batch_sizes", base, sizeof base);
  bool ok = true;
  int i = 0;
  for (const cJSON *e = arr->child; e; e = e->next, i++) {
    char p[FF_PATH_MAX];
    snprintf(p, sizeof p, "%s[%d]", base, i);
    if (!ff_json_as_int(d, e, p, 1, 65536, &t->micro_batch_sizes[i])) {
      ok = false;
    } else if (i > 0 && ok && t->micro_batch_sizes[i] <= t->micro_batch_sizes[i - 1]) {
      ff_diag_error(d, p, "%lld is not larger than the size before it (expected a strictly "
                    "increasing list)", (long long)t->micro_batch_sizes[i]);
      ok = false;
    }
  }
  t->n_micro_batch_sizes = i;
  return ok;
}

static bool read_optimizer(ff_jobj *top, ff_diag *d, ff_training *t) {
  t->lr = 3e-4;
  t->beta1 = 0.9;
  t->beta2 = 0.95;
  t->eps = 1e-8;
  t->weight_decay = 0.1;
  t->grad_clip = 1.0;
  const cJSON *v = ff_jobj_get(top, "optimizer", false);
  if (!v)
    return true;
  ff_jobj o;
  char p[FF_PATH_MAX];
  ff_jobj_path(top, "optimizer", p, sizeof p);
  if (!ff_jobj_open(&o, d, v, p))
    return false;
  bool ok = true;
  const ff_interval beta = {0, 1, false, true};
  if (ff_jobj_get(&o, "lr", false))
    ok &= ff_jobj_num(&o, "lr", false, FF_POSITIVE(10), &t->lr);
  if (ff_jobj_get(&o, "beta1", false))
    ok &= ff_jobj_num(&o, "beta1", false, beta, &t->beta1);
  if (ff_jobj_get(&o, "beta2", false))
    ok &= ff_jobj_num(&o, "beta2", false, beta, &t->beta2);
  if (ff_jobj_get(&o, "eps", false))
    ok &= ff_jobj_num(&o, "eps", false, FF_POSITIVE(1), &t->eps);
  if (ff_jobj_get(&o, "weight_decay", false))
    ok &= ff_jobj_num(&o, "weight_decay", false, FF_CLOSED(0, 10), &t->weight_decay);
  if (ff_jobj_get(&o, "grad_clip", false))
    ok &= ff_jobj_num(&o, "grad_clip", false, FF_CLOSED(0, 1e6), &t->grad_clip);
  ff_jobj_close(&o);
  return ok;
}

static bool read_lr_schedule(ff_jobj *top, ff_diag *d, ff_training *t) {
  t->warmup_steps = 0;
  t->decay = FF_DECAY_COSINE;
  char tenth[32]; /* lr/10 to 15 digits, so the default reads as written: 3e-05, not 2.9999…e-05 */
  snprintf(tenth, sizeof tenth, "%.15g", t->lr / 10);
  t->min_lr = strtod(tenth, NULL);
  const cJSON *v = ff_jobj_get(top, "lr_schedule", false);
  if (!v)
    return true;
  ff_jobj o;
  char p[FF_PATH_MAX];
  ff_jobj_path(top, "lr_schedule", p, sizeof p);
  if (!ff_jobj_open(&o, d, v, p))
    return false;
  bool ok = true;
  int decay = 0;
  if (ff_jobj_get(&o, "warmup_steps", false))
    ok &= ff_jobj_int(&o, "warmup_steps", false, 0, t->steps > 0 ? t->steps : 1000000000,
                      &t->warmup_steps);
  if (ff_jobj_get(&o, "decay", false)) {
    ok &= ff_jobj_enum(&o, "decay", false, ff_decay_names, &decay);
    t->decay = (ff_decay)decay;
  }
  if (ff_jobj_get(&o, "min_lr", false))
    ok &= ff_jobj_num(&o, "min_lr", false, FF_CLOSED(0, t->lr), &t->min_lr);
  ff_jobj_close(&o);
  return ok;
}

ff_status ff_training_from_json(const cJSON *v, const char *path, bool inline_ok, ff_diag *d,
                                ff_training *out) {
  memset(out, 0, sizeof *out);
  int errors_before = d->errors;
  ff_jobj o;
  if (!ff_jobj_open(&o, d, v, path))
    return FF_ERR_INPUT;
  int choice = 0;
  bool ok = ff_format_key(&o, FF_FORMAT_TRAINING, inline_ok);
  ok &= ff_jobj_name(&o, "name", true, out->name);
  ok &= ff_jobj_int(&o, "global_batch", true, 1, 1000000000, &out->global_batch);
  ok &= read_micro_batch_sizes(&o, d, out);
  ok &= ff_jobj_enum(&o, "precision", true, ff_precision_names, &choice);
  out->precision = (ff_precision)choice;
  out->recompute = FF_RECOMPUTE_AUTO;
  if (ff_jobj_get(&o, "recompute", false)) {
    ok &= ff_jobj_enum(&o, "recompute", false, ff_recompute_names, &choice);
    out->recompute = (ff_recompute)choice;
  }
  if (ff_jobj_get(&o, "zero1", false))
    ok &= ff_jobj_bool(&o, "zero1", false, &out->zero1);
  if (ff_jobj_get(&o, "schedule", false)) {
    ok &= ff_jobj_enum(&o, "schedule", false, ff_schedule_names, &choice);
    out->schedule = (ff_schedule)choice;
  }
  if (ff_jobj_get(&o, "attention", false)) {
    ok &= ff_jobj_enum(&o, "attention", false, ff_attention_names, &choice);
    out->attention = (ff_attention)choice;
  }
  if (ff_jobj_get(&o, "wire", false)) {
    ok &= ff_jobj_enum(&o, "wire", false, ff_wire_names, &choice);
    out->wire = (ff_wire)choice;
    if (out->wire == FF_WIRE_BF16 && out->precision != FF_PRECISION_BF16) {
      char p[FF_PATH_MAX];
      ff_jobj_path(&o, "wire", p, sizeof p);
      ff_diag_error(d, p, "is \"bf16\", which needs \"precision\": \"bf16\"");
      ok = false;
    }
  }
  ok &= ff_jobj_int(&o, "steps", true, 1, 1000000000, &out->steps);
  out->seed = 1234;
  if (ff_jobj_get(&o, "seed", false))
    ok &= ff_jobj_int(&o, "seed", false, 0, INT64_C(9007199254740992), &out->seed);
  ok &= read_optimizer(&o, d, out);
  ok &= read_lr_schedule(&o, d, out);
  ff_jobj_close(&o);
  if (!ok || d->errors > errors_before) {
    ff_training_free(out);
    return FF_ERR_INPUT;
  }
  return FF_OK;
}

cJSON *ff_training_to_json(const ff_training *t, bool with_format) {
  cJSON *o = cJSON_CreateObject();
  if (with_format)
    cJSON_AddStringToObject(o, "format", ff_format_ids[FF_FORMAT_TRAINING]);
  cJSON_AddStringToObject(o, "name", t->name);
  cJSON_AddNumberToObject(o, "global_batch", (double)t->global_batch);
  cJSON *mbs = cJSON_AddArrayToObject(o, "micro_batch_sizes");
  for (int i = 0; i < t->n_micro_batch_sizes; i++)
    cJSON_AddItemToArray(mbs, cJSON_CreateNumber((double)t->micro_batch_sizes[i]));
  cJSON_AddStringToObject(o, "precision", ff_precision_names[t->precision]);
  cJSON_AddStringToObject(o, "recompute", ff_recompute_names[t->recompute]);
  cJSON_AddBoolToObject(o, "zero1", t->zero1);
  cJSON_AddStringToObject(o, "schedule", ff_schedule_names[t->schedule]);
  if (t->attention != FF_ATTENTION_AUTO) /* absent at its default: older plans keep their digests */
    cJSON_AddStringToObject(o, "attention", ff_attention_names[t->attention]);
  if (t->wire != FF_WIRE_FP32) /* likewise */
    cJSON_AddStringToObject(o, "wire", ff_wire_names[t->wire]);
  cJSON_AddNumberToObject(o, "steps", (double)t->steps);
  cJSON_AddNumberToObject(o, "seed", (double)t->seed);
  cJSON *opt = cJSON_AddObjectToObject(o, "optimizer");
  cJSON_AddNumberToObject(opt, "lr", t->lr);
  cJSON_AddNumberToObject(opt, "beta1", t->beta1);
  cJSON_AddNumberToObject(opt, "beta2", t->beta2);
  cJSON_AddNumberToObject(opt, "eps", t->eps);
  cJSON_AddNumberToObject(opt, "weight_decay", t->weight_decay);
  cJSON_AddNumberToObject(opt, "grad_clip", t->grad_clip);
  cJSON *sched = cJSON_AddObjectToObject(o, "lr_schedule");
  cJSON_AddNumberToObject(sched, "warmup_steps", (double)t->warmup_steps);
  cJSON_AddStringToObject(sched, "decay", ff_decay_names[t->decay]);
  cJSON_AddNumberToObject(sched, "min_lr", t->min_lr);
  return o;
}

void ff_training_free(ff_training *t) { memset(t, 0, sizeof *t); }
