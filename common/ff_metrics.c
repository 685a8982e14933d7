/* ff_metrics.c — the strict reader of ffrun's metrics; see ff_metrics.h. */
#include "ff_metrics.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ff_json.h"

static const ff_interval seconds = {0, 1e9, false, false};
static const ff_interval amount = {0, 1e30, false, false};

/* A member that is a number, or null for "not finite" (losses and norms of a skipped step). */
static bool number_or_null(ff_jobj *o, const char *key, double *out, bool *finite) {
  const cJSON *v = ff_jobj_get(o, key, true);
  if (!v)
    return false;
  *finite = !cJSON_IsNull(v);
  if (!*finite) {
    *out = NAN;
    return true;
  }
  char path[FF_PATH_MAX];
  ff_jobj_path(o, key, path, sizeof path);
  return ff_json_as_num(o->diag, v, path, FF_CLOSED(-1e30, 1e30), out);
}

/* A stage's predicted figures, as ffrun writes them beside the measured ones. */
static void read_predicted_stage(ff_jobj *parent, ff_metrics_stage *s) {
  const cJSON *v = ff_jobj_get(parent, "predicted", false);
  char path[FF_PATH_MAX];
  ff_jobj_path(parent, "predicted", path, sizeof path);
  ff_jobj o;
  if (!v || !ff_jobj_open(&o, parent->diag, v, path))
    return;
  ff_jobj_num(&o, "compute_seconds", false, seconds, &s->predicted_compute_seconds);
  ff_jobj_num(&o, "p2p_seconds", false, seconds, &s->predicted_p2p_seconds);
  ff_jobj_num(&o, "tp_seconds", false, seconds, &s->predicted_tp_seconds);
  ff_jobj_num(&o, "dp_seconds", false, seconds, &s->predicted_dp_seconds);
  ff_jobj_num(&o, "bubble_seconds", false, seconds, &s->predicted_bubble_seconds);
  ff_jobj_num(&o, "memory_gib", false, amount, &s->predicted_memory_gib);
  ff_jobj_close(&o);
}

static bool read_stage(ff_diag *d, const cJSON *v, const char *path, ff_metrics_stage *s) {
  ff_jobj o;
  if (!ff_jobj_open(&o, d, v, path))
    return false;
  memset(s, 0, sizeof *s);
  s->pipeline = s->stage = -1;
  s->memory_gib = -1;
  s->predicted_compute_seconds = s->predicted_p2p_seconds = s->predicted_tp_seconds = -1;
  s->predicted_dp_seconds = s->predicted_bubble_seconds = s->predicted_memory_gib = -1;
  ff_jobj_int(&o, "pipeline", false, 0, 1 << 20, &s->pipeline);
  ff_jobj_int(&o, "stage", false, 0, 1 << 20, &s->stage);
  ff_jobj_num(&o, "compute_seconds", false, seconds, &s->compute_seconds);
  ff_jobj_num(&o, "p2p_seconds", false, seconds, &s->p2p_seconds);
  ff_jobj_num(&o, "tp_seconds", false, seconds, &s->tp_seconds);
  ff_jobj_num(&o, "dp_seconds", false, seconds, &s->dp_seconds);
  ff_jobj_num(&o, "bubble_seconds", false, seconds, &s->bubble_seconds);
  ff_jobj_num(&o, "memory_gib", false, amount, &s->memory_gib);
  ff_jobj_num(&o, "device_used_gib", false, amount, &s->device_used_gib);
  read_predicted_stage(&o, s);
  ff_jobj_close(&o);
  return ff_diag_ok(d);
}

/* The keys every line must have are what calibrate needs (step, step_seconds, stages); every
 * other key ffrun writes may be absent (metrics written by hand, or by older runs) but, when
 * present, must be what ffrun writes. Absent numbers read as 0 (memory_gib: -1). */
static bool read_step(ff_diag *d, const cJSON *root, ff_metrics_step *m) {
  ff_jobj o;
  if (!ff_jobj_open(&o, d, root, ""))
    return false;
  m->memory_gib = m->predicted_memory_gib = -1;
  m->loss = m->grad_norm = m->val_loss = m->val_perplexity = NAN;
  ff_jobj_int(&o, "step", true, 0, INT64_C(1) << 53, &m->step);
  if (ff_jobj_get(&o, "loss", false))
    number_or_null(&o, "loss", &m->loss, &m->loss_finite);
  ff_jobj_num(&o, "lr", false, FF_CLOSED(0, 1e9), &m->lr);
  if (ff_jobj_get(&o, "grad_norm", false))
    number_or_null(&o, "grad_norm", &m->grad_norm, &m->grad_norm_finite);
  ff_jobj_num(&o, "step_seconds", true, seconds, &m->step_seconds);
  ff_jobj_num(&o, "tokens_per_second", false, amount, &m->tokens_per_second);
  ff_jobj_num(&o, "flops_per_second", false, amount, &m->flops_per_second);
  ff_jobj_num(&o, "mfu", false, amount, &m->mfu);
  m->ranks = 1;
  ff_jobj_int(&o, "ranks", false, 1, 1 << 20, &m->ranks);
  ff_jobj_num(&o, "compute_seconds", false, seconds, &m->compute_seconds);
  ff_jobj_num(&o, "other_seconds", false, seconds, &m->other_seconds);
  ff_jobj_num(&o, "matmul_seconds", false, seconds, &m->matmul_seconds);
  ff_jobj_num(&o, "attention_seconds", false, seconds, &m->attention_seconds);
  ff_jobj_num(&o, "peak_memory_gib", false, amount, &m->peak_memory_gib);
  ff_jobj_num(&o, "memory_gib", false, amount, &m->memory_gib);
  ff_jobj_num(&o, "device_used_gib", false, amount, &m->device_used_gib);
  bool val_finite; /* null: a validation whose loss was not finite */
  if (ff_jobj_get(&o, "val_loss", false))
    number_or_null(&o, "val_loss", &m->val_loss, &val_finite);
  if (ff_jobj_get(&o, "val_perplexity", false))
    number_or_null(&o, "val_perplexity", &m->val_perplexity, &val_finite);
  ff_jobj_int(&o, "val_tokens", false, 1, INT64_C(1) << 53, &m->val_tokens);
  const cJSON *p = ff_jobj_get(&o, "predicted", false);
  ff_jobj po;
  if (p && ff_jobj_open(&po, d, p, "predicted")) {
    ff_jobj_num(&po, "iteration_seconds", false, seconds, &m->predicted_iteration_seconds);
    ff_jobj_num(&po, "memory_gib", false, amount, &m->predicted_memory_gib);
    ff_jobj_close(&po);
  }
  const cJSON *stages = ff_jobj_array(&o, "stages", true, 1, 1 << 16);
  if (stages) {
    m->n_stages = cJSON_GetArraySize(stages);
    m->stages = calloc((size_t)m->n_stages, sizeof *m->stages);
    if (!m->stages)
      ff_diag_error(d, "stages", "out of memory");
    int i = 0;
    for (const cJSON *s = stages->child; s && m->stages; s = s->next, i++) {
      char path[FF_PATH_MAX];
      snprintf(path, sizeof path, "stages[%d]", i);
      read_stage(d, s, path, &m->stages[i]);
    }
  }
  ff_jobj_close(&o);
  return ff_diag_ok(d);
}

void ff_metrics_free(ff_metrics *m) {
  for (int i = 0; m->steps && i < m->n_steps; i++)
    free(m->steps[i].stages);
  free(m->steps);
  m->steps = NULL;
  m->n_steps = 0;
}

ff_status ff_metrics_parse(const char *text, size_t len, const char *file, ff_diag *d,
                           ff_metrics *out) {
  memset(out, 0, sizeof *out);
  const char *given = d->file;
  char where[FF_PATH_MAX];
  int cap = 0, line_no = 0;
  ff_status st = FF_OK;
  for (size_t at = 0; at < len && st == FF_OK;) {
    const char *nl = memchr(text + at, '\n', len - at);
    size_t n = nl ? (size_t)(nl - (text + at)) : len - at;
    line_no++;
    snprintf(where, sizeof where, "%s:%d", file, line_no);
    d->file = where;
    if (out->n_steps == FF_METRICS_MAX_STEPS) {
      ff_diag_error(d, NULL, "more than %d steps", FF_METRICS_MAX_STEPS);
      st = FF_ERR_INPUT;
      break;
    }
    cJSON *root = NULL;
    if (n == 0) {
      ff_diag_error(d, NULL, "an empty line (expected one JSON object per step)");
      st = FF_ERR_INPUT;
    } else if (ff_json_parse(text + at, n, d, &root) != FF_OK) {
      st = FF_ERR_INPUT;
    } else {
      if (out->n_steps == cap) {
        cap = cap ? 2 * cap : 64;
        ff_metrics_step *grown = realloc(out->steps, (size_t)cap * sizeof *grown);
        if (!grown) {
          ff_diag_error(d, NULL, "out of memory");
          cJSON_Delete(root);
          st = FF_ERR_RUNTIME;
          break;
        }
        out->steps = grown;
      }
      ff_metrics_step *m = &out->steps[out->n_steps++];
      memset(m, 0, sizeof *m);
      if (!read_step(d, root, m))
        st = FF_ERR_INPUT;
      cJSON_Delete(root);
    }
    at += n + (nl ? 1 : 0);
  }
  d->file = given;
  if (st == FF_OK && out->n_steps == 0) {
    ff_diag_error(d, NULL, "no steps (expected one JSON object per line)");
    st = FF_ERR_INPUT;
  }
  if (st != FF_OK)
    ff_metrics_free(out);
  return st;
}

ff_status ff_metrics_read(const char *file, ff_diag *d, ff_metrics *out) {
  char *text;
  size_t len;
  memset(out, 0, sizeof *out);
  ff_status st = ff_read_file_limit(file, d, &text, &len, (size_t)1 << 34);
  if (st != FF_OK)
    return st;
  st = ff_metrics_parse(text, len, file, d, out);
  free(text);
  return st;
}
