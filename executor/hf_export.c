/* hf_export.c — an ffrun checkpoint as a Hugging Face Llama directory; see hf_export.h. */
#define _POSIX_C_SOURCE 200809L
#include "hf_export.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "ff_json.h"
#include "ff_kernels.h"
#include "hf_init.h"

#define MAX_TENSORS 8192

/* The checkpoint row written as file row `fr` of q_proj or k_proj: ff_hf_row's inverse. */
static int64_t ffrun_row(int64_t fr, bool rotary, int64_t D) {
  if (!rotary)
    return fr;
  int64_t head = fr / D, j = fr % D;
  return head * D + 2 * (j % (D / 2)) + j / (D / 2);
}

typedef struct shard {
  int first, end; /* tensors [first, end) of the layout */
  uint64_t bytes;
} shard;

static cJSON *config_json(const ff_model *m, bool bf16) {
  cJSON *c = cJSON_CreateObject();
  cJSON *arch = cJSON_AddArrayToObject(c, "architectures");
  cJSON_AddItemToArray(arch, cJSON_CreateString("LlamaForCausalLM"));
  cJSON_AddStringToObject(c, "model_type", "llama");
  cJSON_AddStringToObject(c, "hidden_act", "silu");
  cJSON_AddNumberToObject(c, "hidden_size", (double)m->hidden);
  cJSON_AddNumberToObject(c, "intermediate_size", (double)m->ffn_hidden);
  cJSON_AddNumberToObject(c, "num_hidden_layers", (double)m->layers);
  cJSON_AddNumberToObject(c, "num_attention_heads", (double)m->heads);
  cJSON_AddNumberToObject(c, "num_key_value_heads", (double)m->kv_heads);
  cJSON_AddNumberToObject(c, "head_dim", (double)(m->hidden / m->heads));
  cJSON_AddNumberToObject(c, "vocab_size", (double)m->vocab);
  cJSON_AddNumberToObject(c, "max_position_embeddings", (double)m->seq_len);
  cJSON_AddNumberToObject(c, "rms_norm_eps", m->norm_eps);
  cJSON_AddNumberToObject(c, "rope_theta", m->rope_theta);
  cJSON_AddNullToObject(c, "rope_scaling");
  cJSON_AddBoolToObject(c, "attention_bias", false);
  cJSON_AddBoolToObject(c, "mlp_bias", false);
  cJSON_AddBoolToObject(c, "tie_word_embeddings", m->tied_embeddings);
  cJSON_AddStringToObject(c, "torch_dtype", bf16 ? "bfloat16" : "float32");
  return c;
}

/* The model the checkpoint was written for: its metadata's model JSON (checked against the
 * digest beside it), or the plan's model when the checkpoint predates that field. */
static ff_status find_model(const ff_ckpt_view *v, const char *file, const char *plan_file,
                            ff_model *m, ff_plan *plan, bool *have_plan, ff_diag *d) {
  *have_plan = false;
  if (plan_file) {
    ff_diag pd;
    ff_diag_init(&pd, plan_file);
    ff_status st = ff_load_plan(plan_file, &pd, plan);
    if (st != FF_OK) {
      ff_diag_print(&pd, stderr);
      ff_diag_free(&pd);
      return st;
    }
    ff_diag_free(&pd);
    *have_plan = true;
    *m = plan->model;
  } else if (v->model_json) {
    cJSON *root = cJSON_Parse(v->model_json);
    ff_diag md;
    ff_diag_init(&md, file);
    ff_status st = root ? ff_model_from_json(root, "__metadata__.model_json", true, &md, m)
                        : FF_ERR_INPUT;
    cJSON_Delete(root);
    if (st != FF_OK) {
      ff_diag_error(d, "__metadata__.model_json", "not a model description (damaged?)");
      ff_diag_free(&md);
      return FF_ERR_INPUT;
    }
    ff_diag_free(&md);
  } else {
    ff_diag_error(d, "__metadata__.model_json", "is missing (a checkpoint of an older ffrun): "
                  "name the plan it was trained under with --plan PLAN");
    return FF_ERR_INPUT;
  }
  cJSON *mj = ff_model_to_json(m, false);
  char digest[32];
  ff_digest_json(mj, digest);
  cJSON_Delete(mj);
  if (strcmp(digest, v->meta.model_digest) != 0) {
    ff_diag_error(d, "__metadata__.model_digest", "is %s, but %s describes a model of digest %s",
                  v->meta.model_digest[0] ? v->meta.model_digest : "(none)",
                  plan_file ? plan_file : "its model_json", digest);
    if (*have_plan)
      ff_plan_free(plan);
    else
      ff_model_free(m);
    *have_plan = false;
    return FF_ERR_INPUT;
  }
  return FF_OK;
}

/* One shard file: the safetensors header (format "pt", as transformers expects), then the
 * tensors converted a row at a time. */
static ff_status write_shard(const char *path, const ff_ckpt_view *v, const ff_model_rank *layout,
                             const shard *sh, bool bf16, ff_diag *d) {
  size_t es = bf16 ? 2 : 4;
  cJSON *h = cJSON_CreateObject();
  cJSON *md = cJSON_AddObjectToObject(h, "__metadata__");
  cJSON_AddStringToObject(md, "format", "pt");
  uint64_t at = 0;
  for (int i = sh->first; i < sh->end; i++) {
    const ff_tensor *t = &layout->tensors[i];
    char name[160];
    ff_hf_name(t->name, name, sizeof name);
    cJSON *o = cJSON_AddObjectToObject(h, name);
    cJSON_AddStringToObject(o, "dtype", bf16 ? "BF16" : "F32");
    cJSON *shape = cJSON_AddArrayToObject(o, "shape");
    cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->rows));
    if (t->cols != 1)
      cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->cols));
    cJSON *off = cJSON_AddArrayToObject(o, "data_offsets");
    cJSON_AddItemToArray(off, cJSON_CreateNumber((double)at));
    at += (uint64_t)(t->rows * t->cols) * es;
    cJSON_AddItemToArray(off, cJSON_CreateNumber((double)at));
  }
  char *text = cJSON_PrintUnformatted(h);
  cJSON_Delete(h);
  ff_atomic_file *f = text ? ff_atomic_open(path, d) : NULL;
  if (!f) {
    free(text);
    return text ? FF_ERR_INPUT : FF_ERR_RUNTIME;
  }
  size_t hlen = strlen(text), padded = (hlen + 7) / 8 * 8;
  unsigned char len8[8];
  for (int i = 0; i < 8; i++)
    len8[i] = (unsigned char)((uint64_t)padded >> (8 * i));
  ff_atomic_write(f, len8, 8);
  ff_atomic_write(f, text, hlen);
  ff_atomic_write(f, "       ", padded - hlen);
  free(text);
  int64_t D = layout->model->hidden / layout->model->heads, widest = 1;
  for (int i = sh->first; i < sh->end; i++)
    widest = layout->tensors[i].cols > widest ? layout->tensors[i].cols : widest;
  const ff_kernels *cpu = ff_kernels_cpu(1);
  uint16_t *row = malloc((size_t)widest * sizeof *row);
  if (!row) {
    ff_atomic_discard(f);
    return FF_ERR_RUNTIME;
  }
  for (int i = sh->first; i < sh->end; i++) {
    const ff_tensor *t = &layout->tensors[i];
    char hf[160];
    ff_hf_name(t->name, hf, sizeof hf);
    bool rotary = strstr(hf, "q_proj") || strstr(hf, "k_proj");
    const unsigned char *src = ff_checkpoint_tensor(v, t->name, t->rows, t->cols);
    for (int64_t fr = 0; fr < t->rows; fr++) {
      const unsigned char *s = src + (size_t)ffrun_row(fr, rotary, D) * (size_t)t->cols * 4;
      if (!bf16) {
        ff_atomic_write(f, s, (size_t)t->cols * 4);
        continue;
      }
      /* rounded as bf16 plans round (to nearest, ties to even: torch's .to(torch.bfloat16));
       * the tensor's data is 4-byte aligned (ff_checkpoint_tensor) */
      cpu->to_bf16(row, (const float *)(const void *)s, t->cols);
      ff_atomic_write(f, row, (size_t)t->cols * 2);
    }
    ff_drop_pages(src, (size_t)(t->rows * t->cols) * 4);
  }
  free(row);
  return ff_atomic_commit(f, d);
}

/* The checkpoint file to export: FILE itself, or the newest in a directory whose data reads
 * back intact (the newer ones skipped with the reason, as --resume does). */
static ff_status open_checkpoint(const char *arg, char *path, size_t cap, ff_ckpt_view *v,
                                 bool quiet, ff_diag *d) {
  struct stat sb;
  if (stat(arg, &sb) != 0) {
    ff_diag_error(d, NULL, "%s: cannot open: %s", arg, strerror(errno));
    return FF_ERR_INPUT;
  }
  if (!S_ISDIR(sb.st_mode)) {
    snprintf(path, cap, "%s", arg);
    ff_diag cd;
    ff_diag_init(&cd, arg);
    ff_status st = ff_checkpoint_open(arg, v, &cd);
    if (st != FF_OK)
      ff_diag_print(&cd, stderr);
    ff_diag_free(&cd);
    return st;
  }
  static long long steps[4096];
  int n = ff_checkpoint_list(arg, steps, 4096);
  for (int i = 0; i < n; i++) {
    snprintf(path, cap, "%s/step-%08lld.safetensors", arg, steps[i]);
    ff_diag cd;
    ff_diag_init(&cd, path);
    ff_status st = ff_checkpoint_open(path, v, &cd);
    if (st == FF_OK) {
      ff_diag_free(&cd);
      return FF_OK;
    }
    if (!quiet || i + 1 == n) {
      ff_diag_print(&cd, stderr);
      if (i + 1 < n)
        fprintf(stderr, "ffrun export: %s cannot be used; trying the one before it\n", path);
    }
    ff_diag_free(&cd);
    if (st == FF_ERR_RUNTIME)
      return st;
  }
  ff_diag_error(d, NULL, "%s: %s", arg, n ? "no checkpoint in it reads back intact"
                                          : "holds no checkpoint (step-NNNNNNNN.safetensors)");
  return FF_ERR_INPUT;
}

/* Old files of an export's names that the new one did not write: a model.safetensors would be
 * read before a new index, and stale shards or index only mislead. */
static void remove_stale(const char *dir, char (*names)[64], int n_names) {
  for (int n = 1; n > 0;) { /* 64 at a time, until none is left */
    DIR *dp = opendir(dir);
    if (!dp)
      return;
    struct dirent *e;
    static char doomed[64][4400];
    n = 0;
    while ((e = readdir(dp)) && n < 64) {
      int a, b, at = 0;
      bool ours = strcmp(e->d_name, "model.safetensors") == 0 ||
                  strcmp(e->d_name, "model.safetensors.index.json") == 0 ||
                  (sscanf(e->d_name, "model-%5d-of-%5d.safetensors%n", &a, &b, &at) == 2 &&
                   at > 0 && e->d_name[at] == '\0');
      for (int i = 0; ours && i < n_names; i++)
        if (strcmp(e->d_name, names[i]) == 0)
          ours = false;
      if (ours)
        snprintf(doomed[n++], sizeof doomed[0], "%s/%s", dir, e->d_name);
    }
    closedir(dp);
    for (int i = 0; i < n; i++)
      if (remove(doomed[i]) != 0)
        return; /* it stays; do not look for it again */
  }
}

ff_status ff_hf_export(const ff_export_opts *o) {
  ff_diag d;
  ff_diag_init(&d, o->checkpoint);
  char file[4096];
  ff_ckpt_view v;
  ff_status st = open_checkpoint(o->checkpoint, file, sizeof file, &v, o->quiet, &d);
  if (st != FF_OK) {
    ff_diag_print(&d, stderr);
    ff_diag_free(&d);
    return st;
  }
  d.file = file; /* from here errors are of the file chosen */
  ff_diag od; /* errors writing the export */
  ff_diag_init(&od, "ffrun export");
  ff_model m;
  ff_plan plan;
  bool have_plan = false;
  st = find_model(&v, file, o->plan_file, &m, &plan, &have_plan, &d);
  bool have_model = st == FF_OK;
  ff_model_rank layout;
  bool have_layout = false;
  if (st == FF_OK) {
    ff_shard_spec spec = {0, m.layers, true, true, {0, m.heads}, {0, m.kv_heads}, {0, m.ffn_hidden},
                          {0, m.vocab}};
    st = ff_model_rank_init_layout(&layout, &m, &spec);
    have_layout = st == FF_OK;
    if (st == FF_OK && layout.n_tensors > MAX_TENSORS) {
      ff_diag_error(&d, "__metadata__.model_json", "a model of %d tensors; export writes at most %d",
                    layout.n_tensors, MAX_TENSORS);
      st = FF_ERR_INPUT;
    }
  }
  for (int i = 0; st == FF_OK && i < layout.n_tensors; i++) {
    const ff_tensor *t = &layout.tensors[i];
    if (!ff_checkpoint_tensor(&v, t->name, t->rows, t->cols)) {
      ff_diag_error(&d, t->name, "missing, or not an F32 tensor of shape [%lld, %lld]",
                    (long long)t->rows, (long long)t->cols);
      st = FF_ERR_INPUT;
    }
  }
  /* Shards: tensors in the layout's order, a new file where the next would pass the limit. */
  static shard shards[MAX_TENSORS];
  int n_shards = 0;
  uint64_t total = 0;
  size_t es = o->bf16 ? 2 : 4;
  for (int i = 0; st == FF_OK && i < layout.n_tensors; i++) {
    uint64_t b = (uint64_t)(layout.tensors[i].rows * layout.tensors[i].cols) * es;
    if (n_shards == 0 || (shards[n_shards - 1].bytes > 0 && shards[n_shards - 1].bytes + b > o->max_shard_bytes))
      shards[n_shards++] = (shard){i, i, 0};
    shards[n_shards - 1].end = i + 1;
    shards[n_shards - 1].bytes += b;
    total += b;
  }
  /* Everything is written into a directory of its own inside DIR, then moved in: a failure
   * leaves DIR as it was. */
  char stage[4096] = "";
  if (st == FF_OK && mkdir(o->out_dir, 0777) != 0 && errno != EEXIST) {
    ff_diag_error(&od, NULL, "%s: cannot create the directory: %s", o->out_dir, strerror(errno));
    st = FF_ERR_INPUT;
  }
  if (st == FF_OK) {
    snprintf(stage, sizeof stage, "%s/.ffrun-export.XXXXXX", o->out_dir);
    if (!mkdtemp(stage)) {
      ff_diag_error(&od, NULL, "%s: cannot write in the directory: %s", o->out_dir, strerror(errno));
      stage[0] = '\0';
      st = FF_ERR_INPUT;
    }
  }
  static char names[MAX_TENSORS + 2][64];
  int n_names = 0;
  cJSON *map = cJSON_CreateObject();
  for (int s = 0; st == FF_OK && s < n_shards; s++) {
    if (n_shards == 1)
      snprintf(names[n_names], sizeof names[0], "model.safetensors");
    else
      snprintf(names[n_names], sizeof names[0], "model-%05d-of-%05d.safetensors", s + 1, n_shards);
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", stage, names[n_names]);
    for (int i = shards[s].first; i < shards[s].end; i++) {
      char hf[160];
      ff_hf_name(layout.tensors[i].name, hf, sizeof hf);
      cJSON_AddStringToObject(map, hf, names[n_names]);
    }
    n_names++;
    st = write_shard(path, &v, &layout, &shards[s], o->bf16, &od);
  }
  if (st == FF_OK && n_shards > 1) {
    cJSON *index = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(index, "metadata");
    cJSON_AddNumberToObject(meta, "total_size", (double)total);
    cJSON_AddItemToObject(index, "weight_map", map);
    map = NULL;
    snprintf(names[n_names++], sizeof names[0], "model.safetensors.index.json");
    char path[4400];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", stage);
    st = ff_write_json_atomic(path, index, &od);
    cJSON_Delete(index);
  }
  cJSON_Delete(map);
  if (st == FF_OK) {
    cJSON *c = config_json(&m, o->bf16);
    snprintf(names[n_names++], sizeof names[0], "config.json");
    char path[4400];
    snprintf(path, sizeof path, "%s/config.json", stage);
    st = ff_write_json_atomic(path, c, &od);
    cJSON_Delete(c);
  }
  if (st == FF_OK) {
    for (int i = 0; st == FF_OK && i < n_names; i++) {
      char from[4400], to[4400];
      snprintf(from, sizeof from, "%s/%s", stage, names[i]);
      snprintf(to, sizeof to, "%s/%s", o->out_dir, names[i]);
      if (rename(from, to) != 0) {
        ff_diag_error(&od, NULL, "%s: cannot move into place: %s", to, strerror(errno));
        st = FF_ERR_RUNTIME;
      }
    }
    if (st == FF_OK) /* only once the new files are in place */
      remove_stale(o->out_dir, names, n_names);
    int fd = open(o->out_dir, O_RDONLY);
    if (fd >= 0) {
      fsync(fd);
      close(fd);
    }
  }
  if (stage[0]) { /* what is left of it (everything, after a failure) */
    for (int i = 0; i < n_names; i++) {
      char p[4400];
      snprintf(p, sizeof p, "%s/%s", stage, names[i]);
      remove(p);
    }
    rmdir(stage);
  }
  if (st == FF_OK && !o->quiet)
    fprintf(stderr, "ffrun export: step %lld of %s → %s: %d file%s, %.1f MB of %s weights\n",
            (long long)v.meta.step, file, o->out_dir, n_names, n_names == 1 ? "" : "s",
            (double)total / 1e6, o->bf16 ? "bf16" : "fp32");
  ff_diag_print(&d, stderr);
  ff_diag_print(&od, stderr);
  ff_diag_free(&d);
  ff_diag_free(&od);
  if (have_layout)
    ff_model_rank_free(&layout);
  if (have_plan)
    ff_plan_free(&plan);
  else if (have_model)
    ff_model_free(&m);
  ff_checkpoint_close(&v);
  return st;
}

/* The value after option argv[*i] (the caller has checked there is one). */
static const char *arg_value(char **argv, int *i) { return argv[++*i]; }

/* "5GB", "500MB", "64KiB", "1000": bytes (decimal units as transformers' max_shard_size; KiB,
 * MiB, GiB binary); 0 when not a positive size. */
static uint64_t parse_size(const char *v) {
  char *end;
  errno = 0;
  double x = strtod(v, &end);
  static const struct {
    const char *unit;
    double scale;
  } units[] = {{"", 1},      {"B", 1},        {"KB", 1e3},        {"MB", 1e6},
               {"GB", 1e9},  {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}};
  for (size_t i = 0; errno == 0 && end != v && x > 0 && i < sizeof units / sizeof units[0]; i++)
    if (strcmp(end, units[i].unit) == 0 && x * units[i].scale >= 1 && x * units[i].scale < 1e18)
      return (uint64_t)(x * units[i].scale);
  return 0;
}

/* ffrun export CHECKPOINT -o DIR [--dtype fp32|bf16] [--max-shard-size SIZE] [--plan PLAN] */
int ff_export_main(int argc, char **argv) {
  ff_export_opts o = {.max_shard_bytes = 5000000000ull};
  for (int i = 2; i < argc; i++) {
    const char *v;
    bool takes = strcmp(argv[i], "-o") == 0 || strcmp(argv[i], "--dtype") == 0 ||
                 strcmp(argv[i], "--max-shard-size") == 0 || strcmp(argv[i], "--plan") == 0;
    if (takes && i + 1 >= argc) {
      fprintf(stderr, "ffrun export: %s needs a value\n", argv[i]);
      return FF_ERR_INPUT;
    }
    if (strcmp(argv[i], "-o") == 0 && (v = arg_value(argv, &i)))
      o.out_dir = v;
    else if (strcmp(argv[i], "--dtype") == 0 && (v = arg_value(argv, &i))) {
      if (strcmp(v, "fp32") && strcmp(v, "bf16")) {
        fprintf(stderr, "ffrun export: --dtype \"%s\" is not one of: fp32, bf16\n", v);
        return FF_ERR_INPUT;
      }
      o.bf16 = strcmp(v, "bf16") == 0;
    } else if (strcmp(argv[i], "--max-shard-size") == 0 && (v = arg_value(argv, &i))) {
      if (!(o.max_shard_bytes = parse_size(v))) {
        fprintf(stderr, "ffrun export: --max-shard-size \"%s\": expected a size such as 5GB, "
                "500MB or 64KiB\n", v);
        return FF_ERR_INPUT;
      }
    } else if (strcmp(argv[i], "--plan") == 0 && (v = arg_value(argv, &i)))
      o.plan_file = v;
    else if (strcmp(argv[i], "--quiet") == 0)
      o.quiet = true;
    else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      printf("usage: ffrun export CHECKPOINT -o DIR [--dtype fp32|bf16] [--max-shard-size SIZE]\n"
             "                    [--plan PLAN] [--quiet]\n"
             "Writes a checkpoint (a file, or a checkpoint directory's newest intact one) as a\n"
             "Hugging Face Llama directory: config.json and model.safetensors, or shards of at\n"
             "most SIZE (default 5GB) with model.safetensors.index.json. --dtype: fp32 (default,\n"
             "the checkpoint's weights exactly) or bf16 (rounded to nearest even). --plan: the\n"
             "plan it was trained under, for checkpoints that do not record their model.\n");
      return 0;
    } else if (argv[i][0] != '-' && !o.checkpoint)
      o.checkpoint = argv[i];
    else {
      if (i < argc)
        fprintf(stderr, "ffrun export: unexpected argument \"%s\" (usage: ffrun export "
                "CHECKPOINT -o DIR [--dtype fp32|bf16] [--max-shard-size SIZE] [--plan PLAN])\n",
                argv[i]);
      return FF_ERR_INPUT;
    }
  }
  if (!o.checkpoint || !o.out_dir) {
    fprintf(stderr, "ffrun export: %s is required (usage: ffrun export CHECKPOINT -o DIR)\n",
            !o.checkpoint ? "CHECKPOINT (a checkpoint file or directory)" : "-o DIR");
    return FF_ERR_INPUT;
  }
  return ff_hf_export(&o);
}
