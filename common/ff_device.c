/* ff_device.c — ff-device/1: one GPU type's datasheet numbers and optional measurements. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>

#include "ff_format.h"
#include "ff_format_internal.h"

#define DEVICE_TFLOPS_MAX 100000.0

static bool read_gemm(ff_diag *d, const cJSON *arr, const char *path, ff_device *dev) {
  int n = cJSON_GetArraySize(arr);
  dev->gemm = calloc((size_t)n ? (size_t)n : 1, sizeof *dev->gemm);
  if (!dev->gemm)
    return false;
  bool ok = true;
  int i = 0;
  for (const cJSON *e = arr->child; e; e = e->next, i++) {
    char p[FF_PATH_MAX];
    snprintf(p, sizeof p, "%s[%d]", path, i);
    ff_jobj o;
    if (!ff_jobj_open(&o, d, e, p)) {
      ok = false;
      continue;
    }
    ff_gemm_measure *g = &dev->gemm[i];
    int dtype = 0;
    ok &= ff_jobj_enum(&o, "dtype", true, ff_dtype_names, &dtype);
    g->dtype = (ff_dtype)dtype;
    ok &= ff_jobj_int(&o, "m", true, 1, INT32_MAX, &g->m);
    ok &= ff_jobj_int(&o, "n", true, 1, INT32_MAX, &g->n);
    ok &= ff_jobj_int(&o, "k", true, 1, INT32_MAX, &g->k);
    ok &= ff_jobj_num(&o, "tflops", true, FF_POSITIVE(DEVICE_TFLOPS_MAX), &g->tflops);
    ff_jobj_close(&o);
    for (int j = 0; ok && j < i; j++) {
      const ff_gemm_measure *h = &dev->gemm[j];
      if (h->dtype == g->dtype && h->m == g->m && h->n == g->n && h->k == g->k) {
        ff_diag_error(d, p, "repeats the shape of %s[%d] (dtype, m, n, k must be unique)", path, j);
        ok = false;
      }
    }
  }
  dev->n_gemm = n;
  return ok;
}

static bool read_layers(ff_diag *d, const cJSON *arr, const char *path, ff_device *dev) {
  int n = cJSON_GetArraySize(arr);
  dev->layers = calloc((size_t)n ? (size_t)n : 1, sizeof *dev->layers);
  if (!dev->layers)
    return false;
  bool ok = true;
  int i = 0;
  for (const cJSON *e = arr->child; e; e = e->next, i++) {
    char p[FF_PATH_MAX];
    snprintf(p, sizeof p, "%s[%d]", path, i);
    ff_jobj o;
    if (!ff_jobj_open(&o, d, e, p)) {
      ok = false;
      continue;
    }
    ff_layer_measure *l = &dev->layers[i];
    int precision = 0;
    ok &= ff_jobj_name(&o, "model", true, l->model);
    ok &= ff_jobj_enum(&o, "precision", true, ff_precision_names, &precision);
    l->precision = (ff_precision)precision;
    ok &= ff_jobj_int(&o, "micro_batch_size", true, 1, 65536, &l->micro_batch_size);
    ok &= ff_jobj_int(&o, "tp", true, 1, 1024, &l->tp);
    ok &= ff_jobj_num(&o, "forward_ms", true, FF_POSITIVE(1e9), &l->forward_ms);
    ok &= ff_jobj_num(&o, "backward_ms", true, FF_POSITIVE(1e9), &l->backward_ms);
    ff_jobj_close(&o);
    for (int j = 0; ok && j < i; j++) {
      const ff_layer_measure *m = &dev->layers[j];
      if (strcmp(m->model, l->model) == 0 && m->precision == l->precision &&
          m->micro_batch_size == l->micro_batch_size && m->tp == l->tp) {
        ff_diag_error(d, p,
                      "repeats %s[%d] (model, precision, micro_batch_size, tp must be unique)",
                      path, j);
        ok = false;
      }
    }
  }
  dev->n_layers = n;
  return ok;
}

ff_status ff_device_from_json(const cJSON *v, const char *path, bool inline_ok, ff_diag *d,
                              ff_device *out) {
  memset(out, 0, sizeof *out);
  int errors_before = d->errors;
  ff_jobj o;
  if (!ff_jobj_open(&o, d, v, path))
    return FF_ERR_INPUT;
  bool ok = ff_format_key(&o, FF_FORMAT_DEVICE, inline_ok);
  ok &= ff_jobj_name(&o, "name", true, out->name);
  if (ff_jobj_get(&o, "vendor", false))
    ok &= ff_jobj_text(&o, "vendor", false, 64, &out->vendor);
  if (ff_jobj_get(&o, "architecture", false))
    ok &= ff_jobj_text(&o, "architecture", false, 64, &out->architecture);
  ok &= ff_jobj_num(&o, "memory_gib", true, FF_POSITIVE(4096), &out->memory_gib);
  ok &= ff_jobj_num(&o, "memory_bandwidth_gb_per_s", true, FF_POSITIVE(100000),
                    &out->memory_bandwidth_gb_per_s);

  const cJSON *peak = ff_jobj_get(&o, "peak_tflops", true);
  if (peak) {
    ff_jobj po;
    char p[FF_PATH_MAX];
    ff_jobj_path(&o, "peak_tflops", p, sizeof p);
    if (ff_jobj_open(&po, d, peak, p)) {
      for (int t = 0; t < FF_DTYPE_COUNT; t++) {
        bool required = t == FF_DTYPE_FP16 || t == FF_DTYPE_FP32;
        if (ff_jobj_get(&po, ff_dtype_names[t], required))
          ok &= ff_jobj_num(&po, ff_dtype_names[t], required, FF_POSITIVE(DEVICE_TFLOPS_MAX),
                            &out->peak_tflops[t]);
        else if (required)
          ok = false;
      }
      ff_jobj_close(&po);
    } else {
      ok = false;
    }
  } else {
    ok = false;
  }

  out->runtime_reserve_gib = 1.0;
  if (ff_jobj_get(&o, "runtime_reserve_gib", false)) {
    ff_interval iv = {0, out->memory_gib > 0 ? out->memory_gib : 4096, false, true};
    ok &= ff_jobj_num(&o, "runtime_reserve_gib", false, iv, &out->runtime_reserve_gib);
  } else if (out->memory_gib > 0 && out->memory_gib <= out->runtime_reserve_gib) {
    out->runtime_reserve_gib = out->memory_gib / 2; /* a tiny device keeps half for itself */
  }
  ok &= ff_jobj_text(&o, "source", true, 4096, &out->source);
  if (ff_jobj_get(&o, "emulated_slowdown", false))
    ok &= ff_jobj_num(&o, "emulated_slowdown", false, FF_CLOSED(1, 1000), &out->emulated_slowdown);
  if (ff_jobj_get(&o, "kind", false)) {
    int kind = 0;
    ok &= ff_jobj_enum(&o, "kind", false, ff_device_kind_names, &kind);
    out->cpu = kind == 1;
  }

  const cJSON *measured = ff_jobj_get(&o, "measured", false);
  if (measured) {
    ff_jobj mo;
    char p[FF_PATH_MAX];
    ff_jobj_path(&o, "measured", p, sizeof p);
    out->has_measured = true;
    if (ff_jobj_open(&mo, d, measured, p)) {
      const cJSON *gemm = ff_jobj_array(&mo, "gemm", false, 0, 100000);
      char q[FF_PATH_MAX];
      if (gemm) {
        ff_jobj_path(&mo, "gemm", q, sizeof q);
        ok &= read_gemm(d, gemm, q, out);
      } else if (ff_jobj_get(&mo, "gemm", false)) {
        ok = false;
      }
      if (ff_jobj_get(&mo, "memory_gb_per_s", false))
        ok &= ff_jobj_num(&mo, "memory_gb_per_s", false, FF_POSITIVE(100000),
                          &out->measured_memory_gb_per_s);
      if (ff_jobj_get(&mo, "source", false))
        ok &= ff_jobj_text(&mo, "source", false, 4096, &out->measured_source);
      const cJSON *layers = ff_jobj_array(&mo, "layers", false, 0, 100000);
      if (layers) {
        ff_jobj_path(&mo, "layers", q, sizeof q);
        ok &= read_layers(d, layers, q, out);
      } else if (ff_jobj_get(&mo, "layers", false)) {
        ok = false;
      }
      ff_jobj_close(&mo);
    } else {
      ok = false;
    }
  }
  ff_jobj_close(&o);
  if (!ok || d->errors > errors_before) {
    ff_device_free(out);
    return FF_ERR_INPUT;
  }
  return FF_OK;
}

cJSON *ff_device_to_json(const ff_device *dev, bool with_format) {
  cJSON *o = cJSON_CreateObject();
  if (with_format)
    cJSON_AddStringToObject(o, "format", ff_format_ids[FF_FORMAT_DEVICE]);
  cJSON_AddStringToObject(o, "name", dev->name);
  if (dev->vendor)
    cJSON_AddStringToObject(o, "vendor", dev->vendor);
  if (dev->architecture)
    cJSON_AddStringToObject(o, "architecture", dev->architecture);
  cJSON_AddNumberToObject(o, "memory_gib", dev->memory_gib);
  cJSON_AddNumberToObject(o, "memory_bandwidth_gb_per_s", dev->memory_bandwidth_gb_per_s);
  cJSON *peak = cJSON_AddObjectToObject(o, "peak_tflops");
  for (int t = 0; t < FF_DTYPE_COUNT; t++)
    if (dev->peak_tflops[t] > 0)
      cJSON_AddNumberToObject(peak, ff_dtype_names[t], dev->peak_tflops[t]);
  cJSON_AddNumberToObject(o, "runtime_reserve_gib", dev->runtime_reserve_gib);
  if (dev->source)
    cJSON_AddStringToObject(o, "source", dev->source);
  if (dev->emulated_slowdown > 0)
    cJSON_AddNumberToObject(o, "emulated_slowdown", dev->emulated_slowdown);
  if (dev->cpu)
    cJSON_AddStringToObject(o, "kind", ff_device_kind_names[1]);
  if (dev->has_measured) {
    cJSON *m = cJSON_AddObjectToObject(o, "measured");
    if (dev->measured_source)
      cJSON_AddStringToObject(m, "source", dev->measured_source);
    if (dev->measured_memory_gb_per_s > 0)
      cJSON_AddNumberToObject(m, "memory_gb_per_s", dev->measured_memory_gb_per_s);
    cJSON *gemm = cJSON_AddArrayToObject(m, "gemm");
    for (int i = 0; i < dev->n_gemm; i++) {
      const ff_gemm_measure *g = &dev->gemm[i];
      cJSON *e = cJSON_CreateObject();
      cJSON_AddStringToObject(e, "dtype", ff_dtype_names[g->dtype]);
      cJSON_AddNumberToObject(e, "m", (double)g->m);
      cJSON_AddNumberToObject(e, "n", (double)g->n);
      cJSON_AddNumberToObject(e, "k", (double)g->k);
      cJSON_AddNumberToObject(e, "tflops", g->tflops);
      cJSON_AddItemToArray(gemm, e);
    }
    cJSON *layers = cJSON_AddArrayToObject(m, "layers");
    for (int i = 0; i < dev->n_layers; i++) {
      const ff_layer_measure *l = &dev->layers[i];
      cJSON *e = cJSON_CreateObject();
      cJSON_AddStringToObject(e, "model", l->model);
      cJSON_AddStringToObject(e, "precision", ff_precision_names[l->precision]);
      cJSON_AddNumberToObject(e, "micro_batch_size", (double)l->micro_batch_size);
      cJSON_AddNumberToObject(e, "tp", (double)l->tp);
      cJSON_AddNumberToObject(e, "forward_ms", l->forward_ms);
      cJSON_AddNumberToObject(e, "backward_ms", l->backward_ms);
      cJSON_AddItemToArray(layers, e);
    }
  }
  return o;
}

void ff_device_free(ff_device *dev) {
  free(dev->vendor);
  free(dev->architecture);
  free(dev->source);
  free(dev->measured_source);
  free(dev->gemm);
  free(dev->layers);
  free(dev->ref);
  memset(dev, 0, sizeof *dev);
}

ff_status ff_device_copy(const ff_device *src, ff_device *dst) {
  *dst = *src;
  dst->vendor = src->vendor ? strdup(src->vendor) : NULL;
  dst->architecture = src->architecture ? strdup(src->architecture) : NULL;
  dst->source = src->source ? strdup(src->source) : NULL;
  dst->ref = src->ref ? strdup(src->ref) : NULL;
  dst->measured_source = src->measured_source ? strdup(src->measured_source) : NULL;
  dst->gemm = NULL;
  dst->layers = NULL;
  if (src->n_gemm) {
    dst->gemm = malloc((size_t)src->n_gemm * sizeof *dst->gemm);
    if (dst->gemm)
      memcpy(dst->gemm, src->gemm, (size_t)src->n_gemm * sizeof *dst->gemm);
  }
  if (src->n_layers) {
    dst->layers = malloc((size_t)src->n_layers * sizeof *dst->layers);
    if (dst->layers)
      memcpy(dst->layers, src->layers, (size_t)src->n_layers * sizeof *dst->layers);
  }
  if ((src->vendor && !dst->vendor) || (src->architecture && !dst->architecture) ||
      (src->source && !dst->source) || (src->ref && !dst->ref) || (src->n_gemm && !dst->gemm) ||
      (src->measured_source && !dst->measured_source) ||
      (src->n_layers && !dst->layers)) {
    ff_device_free(dst);
    return FF_ERR_RUNTIME;
  }
  return FF_OK;
}
