/* ff_summary.c — one-line descriptions of loaded files (what `ffplan validate` prints), and the
 * parameter count of a model, which those lines and the cost model share. */
#include <stdio.h>
#include <string.h>

#include "ff_format.h"

int64_t ff_model_parameters(const ff_model *m) {
  int64_t h = m->hidden, head_dim = m->hidden / m->heads;
  int64_t attention = h * h /* q */ + 2 * h * m->kv_heads * head_dim /* k, v */ + h * h /* o */;
  int64_t mlp = 3 * h * m->ffn_hidden; /* gate, up, down */
  int64_t layer = attention + mlp + 2 * h /* two RMSNorm weights */;
  int64_t embedding = m->vocab * h;
  return embedding + m->layers * layer + h /* final norm */ + (m->tied_embeddings ? 0 : embedding);
}

void ff_summary_device(const ff_device *dev, char *out, size_t cap) {
  double peak = dev->peak_tflops[FF_DTYPE_BF16] > 0 ? dev->peak_tflops[FF_DTYPE_BF16]
                                                    : dev->peak_tflops[FF_DTYPE_FP16];
  snprintf(out, cap, "device %s: %g GiB, %g GB/s, %g TFLOP/s %s dense%s", dev->name,
           dev->memory_gib, dev->memory_bandwidth_gb_per_s, peak,
           dev->peak_tflops[FF_DTYPE_BF16] > 0 ? "bf16" : "fp16 (no bf16)",
           dev->has_measured ? ", with measurements" : "");
}

void ff_summary_cluster(const ff_cluster *c, char *out, size_t cap) {
  size_t j = (size_t)snprintf(out, cap, "cluster %s: %d node%s, %lld GPUs (", c->name,
                              c->n_nodes, c->n_nodes == 1 ? "" : "s", (long long)c->total_gpus);
  for (int d = 0; d < c->n_devices && j < cap; d++) {
    long long gpus = 0;
    for (int i = 0; i < c->n_nodes; i++)
      if (c->nodes[i].device == d)
        gpus += c->nodes[i].gpus;
    j += (size_t)snprintf(out + j, cap - j, "%s%lld x %s", d ? ", " : "", gpus, c->devices[d].name);
  }
  if (j < cap)
    snprintf(out + j, cap - j, ")");
}

void ff_summary_model(const ff_model *m, char *out, size_t cap) {
  double params = (double)ff_model_parameters(m);
  snprintf(out, cap,
           "model %s: %.2f %s parameters, %lld layers, hidden %lld, %lld heads (%lld kv), "
           "ffn %lld, vocab %lld, seq %lld",
           m->name, params >= 1e9 ? params / 1e9 : params / 1e6, params >= 1e9 ? "B" : "M",
           (long long)m->layers,
           (long long)m->hidden, (long long)m->heads, (long long)m->kv_heads,
           (long long)m->ffn_hidden, (long long)m->vocab, (long long)m->seq_len);
}

void ff_summary_training(const ff_training *t, char *out, size_t cap) {
  char sizes[128];
  size_t j = 0;
  sizes[0] = '\0';
  for (int i = 0; i < t->n_micro_batch_sizes && j < sizeof sizes; i++)
    j += (size_t)snprintf(sizes + j, sizeof sizes - j, "%s%lld", i ? "/" : "",
                          (long long)t->micro_batch_sizes[i]);
  snprintf(out, cap,
           "training %s: global batch %lld, micro-batch sizes %s, %s, recompute %s, %s%s, "
           "%lld steps",
           t->name, (long long)t->global_batch, sizes, ff_precision_names[t->precision],
           ff_recompute_names[t->recompute], ff_schedule_names[t->schedule],
           t->zero1 ? ", ZeRO-1" : "", (long long)t->steps);
}

void ff_summary_plan(const ff_plan *p, char *out, size_t cap) {
  size_t j = (size_t)snprintf(out, cap, "plan%s%s: %lld rank%s, %d pipeline%s (stages ",
                              p->has_name ? " " : "", p->has_name ? p->name : "",
                              (long long)p->n_ranks, p->n_ranks == 1 ? "" : "s", p->n_pipelines,
                              p->n_pipelines == 1 ? "" : "s");
  for (int i = 0; i < p->n_pipelines && j < cap; i++) {
    if (i == 8) {
      j += (size_t)snprintf(out + j, cap - j, ", ...");
      break;
    }
    j += (size_t)snprintf(out + j, cap - j, "%s%d", i ? ", " : "", p->pipelines[i].n_stages);
  }
  if (j < cap)
    snprintf(out + j, cap - j, "), model %s, cluster %s, global batch %lld", p->model.name,
             p->cluster.name, (long long)p->training.global_batch);
}

ff_status ff_validate_file(const char *file, ff_diag *d, char *summary, size_t cap) {
  cJSON *root = NULL;
  const char *saved = d->file;
  d->file = file;
  summary[0] = '\0';
  ff_status st = ff_json_load(file, d, &root);
  ff_format_kind kind = st == FF_OK ? ff_format_detect(root, d) : FF_FORMAT_UNKNOWN;
  cJSON_Delete(root);
  d->file = saved;
  if (st != FF_OK)
    return st;
  if (kind == FF_FORMAT_UNKNOWN)
    return FF_ERR_INPUT;
  switch (kind) {
  case FF_FORMAT_DEVICE: {
    ff_device x;
    if ((st = ff_load_device(file, d, &x)) == FF_OK) {
      ff_summary_device(&x, summary, cap);
      ff_device_free(&x);
    }
    break;
  }
  case FF_FORMAT_CLUSTER: {
    ff_cluster x;
    if ((st = ff_load_cluster(file, d, &x)) == FF_OK) {
      ff_summary_cluster(&x, summary, cap);
      ff_cluster_free(&x);
    }
    break;
  }
  case FF_FORMAT_MODEL: {
    ff_model x;
    if ((st = ff_load_model(file, d, &x)) == FF_OK) {
      ff_summary_model(&x, summary, cap);
      ff_model_free(&x);
    }
    break;
  }
  case FF_FORMAT_TRAINING: {
    ff_training x;
    if ((st = ff_load_training(file, d, &x)) == FF_OK) {
      ff_summary_training(&x, summary, cap);
      ff_training_free(&x);
    }
    break;
  }
  case FF_FORMAT_PLAN: {
    ff_plan x;
    if ((st = ff_load_plan(file, d, &x)) == FF_OK) {
      ff_summary_plan(&x, summary, cap);
      ff_plan_free(&x);
    }
    break;
  }
  default: st = FF_ERR_INPUT;
  }
  return st;
}
