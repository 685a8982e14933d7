/* ff_format.c — what all formats share: format ids and enum names, detecting a file's format,
 * path helpers, digests, and loading a file of any format into its canonical text. */
#define _POSIX_C_SOURCE 200809L
#include "ff_format.h"

#include <stdio.h>
#include <stdlib.h>
#include <errno.h>
#include <string.h>
#include <unistd.h>
#include "ff_format_internal.h"

const char *const ff_format_ids[FF_FORMAT_COUNT] = {"ff-device/1", "ff-cluster/1", "ff-model/1",
                                                    "ff-training/1", "ff-plan/1"};
const char *const ff_dtype_names[] = {"bf16", "fp16", "tf32", "fp32", NULL};
const char *const ff_precision_names[] = {"bf16", "fp32", NULL};
const char *const ff_device_kind_names[] = {"gpu", "cpu", NULL};
const char *const ff_recompute_names[] = {"none", "selective", "full", "auto", NULL};
const char *const ff_schedule_names[] = {"1f1b", "gpipe", NULL};
const char *const ff_attention_names[] = {"auto", "tensor", "fused", "gemm", "megatron",
                                                 NULL};
const char *const ff_wire_names[] = {"fp32", "bf16", NULL};
const char *const ff_decay_names[] = {"cosine", "linear", "constant", NULL};
const char *const ff_plan_ilp_names[] = {"off", "not run", "no gain", "improved", NULL};

ff_format_kind ff_format_detect(const cJSON *root, ff_diag *d) {
  if (!cJSON_IsObject(root)) {
    ff_diag_error(d, "(top level)", "expected an object with a \"format\" key, got %s",
                  cJSON_IsArray(root) ? "an array" : "a scalar");
    return FF_FORMAT_UNKNOWN;
  }
  const cJSON *f = cJSON_GetObjectItemCaseSensitive(root, "format");
  char known[128];
  size_t j = 0;
  for (int i = 0; i < FF_FORMAT_COUNT; i++)
    j += (size_t)snprintf(known + j, sizeof known - j, "%s%s", i ? ", " : "", ff_format_ids[i]);
  if (!f) {
    ff_diag_error(d, "(top level)", "missing required key \"format\" (one of: %s)", known);
    return FF_FORMAT_UNKNOWN;
  }
  if (!cJSON_IsString(f)) {
    ff_diag_error(d, "format", "expected a string (one of: %s), got %s", known,
                  cJSON_IsNumber(f) ? "a number" : cJSON_IsBool(f) ? "a boolean"
                  : cJSON_IsNull(f) ? "null" : cJSON_IsArray(f) ? "an array" : "an object");
    return FF_FORMAT_UNKNOWN;
  }
  for (int i = 0; i < FF_FORMAT_COUNT; i++)
    if (strcmp(f->valuestring, ff_format_ids[i]) == 0)
      return (ff_format_kind)i;
  /* Same family, other major version: say so rather than "unknown". */
  for (int i = 0; i < FF_FORMAT_COUNT; i++) {
    size_t n = strlen(ff_format_ids[i]) - 1; /* "ff-plan/" */
    if (strncmp(f->valuestring, ff_format_ids[i], n) == 0) {
      ff_diag_error(d, "format", "\"%.40s\" is not supported (this version reads %s)",
                    f->valuestring, ff_format_ids[i]);
      return FF_FORMAT_UNKNOWN;
    }
  }
  ff_diag_error(d, "format", "\"%.40s\" is not a known format (one of: %s)", f->valuestring,
                known);
  return FF_FORMAT_UNKNOWN;
}

void ff_dirname(const char *file, char *out, size_t cap) {
  const char *slash = strrchr(file, '/');
  if (!slash)
    snprintf(out, cap, ".");
  else if (slash == file)
    snprintf(out, cap, "/");
  else
    snprintf(out, cap, "%.*s", (int)(slash - file), file);
}

char *ff_path_join(const char *dir, const char *rel) {
  size_t n = strlen(dir) + strlen(rel) + 2;
  char *p = malloc(n);
  if (!p)
    return NULL;
  if (rel[0] == '/' || !dir[0] || strcmp(dir, ".") == 0)
    snprintf(p, n, "%s", rel);
  else
    snprintf(p, n, "%s/%s", dir, rel);
  return p;
}

void ff_digest_json(const cJSON *v, char out[32]) {
  ff_buf b = {0};
  ff_json_write(v, &b);
  snprintf(out, 32, "fnv1a64:%016llx",
           (unsigned long long)ff_fnv1a64(b.data ? b.data : "", b.len));
  ff_buf_free(&b);
}

ff_status ff_load_referenced(const char *file, const char *path, const char *what, ff_diag *d) {
  if (access(file, R_OK) == 0)
    return FF_OK;
  int err = errno;
  ff_diag_error(d, path, "cannot read %s \"%s\": %s", what, file, strerror(err));
  return FF_ERR_INPUT;
}

typedef ff_status (*loader_fn)(const cJSON *root, const char *base_dir, ff_diag *d, void *out);

/* Parse `file`, check it declares `want`, and hand the tree to the format's reader. */
static ff_status load_as(const char *file, ff_format_kind want, ff_diag *d, void *out) {
  cJSON *root = NULL;
  const char *saved = d->file;
  d->file = file;
  ff_status st = ff_json_load(file, d, &root);
  if (st == FF_OK) {
    ff_format_kind kind = ff_format_detect(root, d);
    if (kind == FF_FORMAT_UNKNOWN) {
      st = FF_ERR_INPUT;
    } else if (kind != want) {
      ff_diag_error(d, "format", "this is a %s file, expected %s", ff_format_ids[kind],
                    ff_format_ids[want]);
      st = FF_ERR_INPUT;
    } else {
      char dir[4096];
      ff_dirname(file, dir, sizeof dir);
      switch (want) {
      case FF_FORMAT_DEVICE: st = ff_device_from_json(root, "", false, d, out); break;
      case FF_FORMAT_CLUSTER: st = ff_cluster_from_json(root, "", false, dir, d, out); break;
      case FF_FORMAT_MODEL: st = ff_model_from_json(root, "", false, d, out); break;
      case FF_FORMAT_TRAINING: st = ff_training_from_json(root, "", false, d, out); break;
      case FF_FORMAT_PLAN: st = ff_plan_from_json(root, dir, d, out); break;
      default: st = FF_ERR_INPUT;
      }
    }
  }
  cJSON_Delete(root);
  d->file = saved;
  return st;
}

ff_status ff_load_device(const char *file, ff_diag *d, ff_device *out) {
  return load_as(file, FF_FORMAT_DEVICE, d, out);
}
ff_status ff_load_cluster(const char *file, ff_diag *d, ff_cluster *out) {
  return load_as(file, FF_FORMAT_CLUSTER, d, out);
}
ff_status ff_load_model(const char *file, ff_diag *d, ff_model *out) {
  return load_as(file, FF_FORMAT_MODEL, d, out);
}
ff_status ff_load_training(const char *file, ff_diag *d, ff_training *out) {
  return load_as(file, FF_FORMAT_TRAINING, d, out);
}
ff_status ff_load_plan(const char *file, ff_diag *d, ff_plan *out) {
  return load_as(file, FF_FORMAT_PLAN, d, out);
}

ff_status ff_canonical_text(const char *file, ff_diag *d, ff_buf *out, ff_format_kind *kind) {
  cJSON *root = NULL;
  const char *saved = d->file;
  d->file = file;
  *kind = FF_FORMAT_UNKNOWN;
  ff_status st = ff_json_load(file, d, &root);
  if (st != FF_OK) {
    d->file = saved;
    return st;
  }
  *kind = ff_format_detect(root, d);
  cJSON_Delete(root);
  d->file = saved;
  if (*kind == FF_FORMAT_UNKNOWN)
    return FF_ERR_INPUT;
  cJSON *tree = NULL;
  union {
    ff_device device;
    ff_cluster cluster;
    ff_model model;
    ff_training training;
    ff_plan plan;
  } u;
  memset(&u, 0, sizeof u);
  st = load_as(file, *kind, d, &u);
  if (st != FF_OK)
    return st;
  switch (*kind) {
  case FF_FORMAT_DEVICE: tree = ff_device_to_json(&u.device, true); ff_device_free(&u.device); break;
  case FF_FORMAT_CLUSTER: tree = ff_cluster_to_json(&u.cluster, true, false); ff_cluster_free(&u.cluster); break;
  case FF_FORMAT_MODEL: tree = ff_model_to_json(&u.model, true); ff_model_free(&u.model); break;
  case FF_FORMAT_TRAINING: tree = ff_training_to_json(&u.training, true); ff_training_free(&u.training); break;
  case FF_FORMAT_PLAN: tree = ff_plan_to_json(&u.plan); ff_plan_free(&u.plan); break;
  default: break;
  }
  if (!tree) {
    ff_diag_error(d, NULL, "out of memory building the canonical form");
    return FF_ERR_RUNTIME;
  }
  ff_json_write(tree, out);
  cJSON_Delete(tree);
  if (out->failed) {
    ff_diag_error(d, NULL, "out of memory writing the canonical form");
    return FF_ERR_RUNTIME;
  }
  return FF_OK;
}
