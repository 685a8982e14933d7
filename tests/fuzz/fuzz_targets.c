/* fuzz_targets.c — libFuzzer harnesses for every reader and for the plan checks, one per value of
 * FF_FUZZ_TARGET (see build.sh). Inputs that name other files (a cluster's device files, a plan's
 * inputs by path) are skipped: the harnesses exercise parsing and checking, not the file system.
 * The same file, compiled without libFuzzer and with replay.c, replays the committed corpus in
 * the test suite. */
#define _GNU_SOURCE /* memmem */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ff_cost.h"
#include "ff_format.h"

#define T_DEVICE 1
#define T_CLUSTER 2
#define T_MODEL 3
#define T_TRAINING 4
#define T_PLAN 5
#define T_TOKENS 6
#define T_CHECKPOINT 7
#define T_CHECK 8
#define T_DIFF 9
#define T_METRICS 10
#define T_CALIBRATE 11
#define T_SAFETENSORS 12

#if FF_FUZZ_TARGET == T_TOKENS || FF_FUZZ_TARGET == T_CHECKPOINT || FF_FUZZ_TARGET == T_SAFETENSORS
#include <errno.h>
#include <sys/stat.h>

#include "checkpoint.h"
#include "hf_init.h"
#include "data.h"
#include "model.h"
#endif
#if FF_FUZZ_TARGET == T_DIFF || FF_FUZZ_TARGET == T_CALIBRATE
#include "ffplan_cmds.h"
#endif
#if FF_FUZZ_TARGET == T_METRICS
#include "ff_metrics.h"
#endif

static bool names_files(const cJSON *root) {
  const cJSON *types = cJSON_GetObjectItemCaseSensitive(root, "device_types");
  for (const cJSON *e = types && cJSON_IsArray(types) ? types->child : NULL; e; e = e->next)
    if (cJSON_IsString(e))
      return true;
  const cJSON *inputs = cJSON_GetObjectItemCaseSensitive(root, "inputs");
  if (cJSON_IsObject(inputs)) {
    for (const cJSON *e = inputs->child; e; e = e->next)
      if (cJSON_IsString(e) && strcmp(e->string, "digests") != 0)
        return true;
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(inputs, "cluster");
    if (c && names_files(c))
      return true;
  }
  return false;
}

/* A temporary file for targets that read files; one per process, removed at exit. */
static char temp_path[64];
static void remove_temp_file(void) { remove(temp_path); }
#if FF_FUZZ_TARGET == T_SAFETENSORS
static char hf_dir[64];
static void remove_hf_dir(void) { rmdir(hf_dir); }
#endif

__attribute__((unused)) static const char *temp_file(const uint8_t *data, size_t size) {
  char *path = temp_path;
  if (!path[0]) {
    snprintf(path, sizeof temp_path, "/tmp/ff-fuzz-%d.bin", (int)getpid());
    atexit(remove_temp_file);
  }
  FILE *f = fopen(path, "wb");
  if (!f)
    return NULL;
  fwrite(data, 1, size, f);
  fclose(f);
  return path;
}

__attribute__((unused)) static void read_json(const uint8_t *data, size_t size) {
  ff_diag d;
  ff_diag_init(&d, "fuzz");
  cJSON *root = NULL;
  if (ff_json_parse((const char *)data, size, &d, &root) == FF_OK && !names_files(root)) {
#if FF_FUZZ_TARGET == T_DEVICE
    ff_device x;
    if (ff_device_from_json(root, "", false, &d, &x) == FF_OK) {
      cJSON *t = ff_device_to_json(&x, true);
      cJSON_Delete(t);
      ff_device_free(&x);
    }
#elif FF_FUZZ_TARGET == T_CLUSTER
    ff_cluster x;
    if (ff_cluster_from_json(root, "", false, "/nonexistent", &d, &x) == FF_OK) {
      cJSON_Delete(ff_cluster_to_json(&x, true, true));
      ff_cluster_free(&x);
    }
#elif FF_FUZZ_TARGET == T_MODEL
    ff_model x;
    if (ff_model_from_json(root, "", false, &d, &x) == FF_OK) {
      cJSON_Delete(ff_model_to_json(&x, true));
      ff_model_free(&x);
    }
#elif FF_FUZZ_TARGET == T_TRAINING
    ff_training x;
    if (ff_training_from_json(root, "", false, &d, &x) == FF_OK) {
      cJSON_Delete(ff_training_to_json(&x, true));
      ff_training_free(&x);
    }
#elif FF_FUZZ_TARGET == T_PLAN || FF_FUZZ_TARGET == T_CHECK
    ff_plan x;
    if (ff_plan_from_json(root, "/nonexistent", &d, &x) == FF_OK) {
#if FF_FUZZ_TARGET == T_CHECK
      ff_plan_eval e; /* what ffplan check and simulate compute */
      if (x.n_ranks <= 4096 && ff_evaluate_plan(&x, &e) == FF_OK)
        ff_plan_eval_free(&e);
#else
      cJSON_Delete(ff_plan_to_json(&x));
#endif
      ff_plan_free(&x);
    }
#endif
  }
  cJSON_Delete(root);
  ff_diag_free(&d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > (1 << 20))
    return 0;
#if FF_FUZZ_TARGET == T_TOKENS
  const char *path = temp_file(data, size);
  ff_diag d;
  ff_diag_init(&d, "fuzz");
  ff_data x;
  /* a byte vocabulary, and one past uint16 (uint16 files refused, uint32 tokens up to it) */
  if (path && ff_data_load(&x, path, 0, 256, 16, &d) == FF_OK)
    ff_data_free(&x);
  if (path && ff_data_load(&x, path, 0, 128256, 16, &d) == FF_OK)
    ff_data_free(&x);
  ff_diag_free(&d);
#elif FF_FUZZ_TARGET == T_CHECKPOINT
  static ff_model m = {.name = "tiny", .layers = 1, .hidden = 8, .heads = 2, .kv_heads = 2,
                       .ffn_hidden = 8, .vocab = 16, .seq_len = 4, .norm_eps = 1e-5, .rope_theta = 1e4};
  static ff_model_rank mr;
  if (!mr.params) {
    ff_shard_spec spec = {0, 1, true, true, {0, 2}, {0, 2}, {0, 8}, {0, 16}};
    if (ff_model_rank_init(&mr, &m, ff_kernels_cpu(1), &spec, 1, 1, false, FF_RECOMPUTE_NONE) !=
        FF_OK)
      abort();
  }
  const char *path = temp_file(data, size);
  ff_diag d;
  ff_diag_init(&d, "fuzz");
  ff_ckpt_meta meta;
  /* accept the digest the file claims, so the tensors behind it get read too */
  char digest[32] = "fnv1a64:0000000000000000";
  const uint8_t *at = size > 24 ? memmem(data, size, "fnv1a64:", 8) : NULL;
  if (at && (size_t)(at - data) + 24 <= size)
    memcpy(digest, at, 24);
  if (path)
    ff_checkpoint_load(path, &mr, digest, &meta, &d);
  ff_diag_free(&d);
#elif FF_FUZZ_TARGET == T_SAFETENSORS
  /* the input is a Hugging Face directory's model.safetensors, for a tiny untied model */
  static ff_model m = {.name = "tiny", .layers = 1, .hidden = 8, .heads = 2, .kv_heads = 1,
                       .ffn_hidden = 8, .vocab = 16, .seq_len = 4, .norm_eps = 1e-5, .rope_theta = 1e4};
  static ff_model_rank mr;
  static char file[96];
  if (!mr.params) {
    ff_shard_spec spec = {0, 1, true, true, {0, 2}, {0, 1}, {0, 8}, {0, 16}};
    if (ff_model_rank_init(&mr, &m, ff_kernels_cpu(1), &spec, 1, 1, false, FF_RECOMPUTE_NONE) !=
        FF_OK)
      abort();
    snprintf(hf_dir, sizeof hf_dir, "/tmp/ff-fuzz-hf-%d", (int)getpid());
    snprintf(file, sizeof file, "%s/model.safetensors", hf_dir);
    if (mkdir(hf_dir, 0700) != 0 && errno != EEXIST)
      abort();
    atexit(remove_hf_dir);
  }
  FILE *f = fopen(file, "wb");
  if (!f)
    return 0;
  fwrite(data, 1, size, f);
  fclose(f);
  ff_diag d;
  ff_diag_init(&d, "fuzz");
  ff_hf_load(hf_dir, &mr, &d);
  ff_diag_free(&d);
  remove(file);
#elif FF_FUZZ_TARGET == T_DIFF
  /* two plans, split at the first NUL byte */
  const uint8_t *cut = memchr(data, 0, size);
  if (!cut)
    return 0;
  static char a[64], b[64];
  if (!a[0]) {
    snprintf(a, sizeof a, "/tmp/ff-fuzz-a-%d.json", (int)getpid());
    snprintf(b, sizeof b, "/tmp/ff-fuzz-b-%d.json", (int)getpid());
    /* The diff goes to stdout; its messages to stderr, which libFuzzer also reports on: run
     * with -close_fd_mask=2 to silence them (build.sh's header). */
    if (!freopen("/dev/null", "w", stdout))
      abort();
  }
  for (int i = 0; i < 2; i++) {
    ff_diag d;
    ff_diag_init(&d, "fuzz");
    cJSON *root = NULL;
    size_t n = i == 0 ? (size_t)(cut - data) : size - (size_t)(cut - data) - 1;
    const uint8_t *p = i == 0 ? data : cut + 1;
    bool skip = ff_json_parse((const char *)p, n, &d, &root) != FF_OK || names_files(root);
    cJSON_Delete(root);
    ff_diag_free(&d);
    if (skip)
      return 0;
    FILE *f = fopen(i == 0 ? a : b, "wb");
    if (!f)
      return 0;
    fwrite(p, 1, n, f);
    fclose(f);
  }
  char *argv[] = {a, b, NULL};
  ffplan_cmd_diff(2, argv);
#elif FF_FUZZ_TARGET == T_METRICS
  ff_diag d;
  ff_diag_init(&d, "fuzz");
  ff_metrics m;
  if (ff_metrics_parse((const char *)data, size, "fuzz", &d, &m) == FF_OK)
    ff_metrics_free(&m);
  ff_diag_free(&d);
#elif FF_FUZZ_TARGET == T_CALIBRATE
  /* the input is a run's metrics for the shipped 6-rank plan on its shipped cluster (run from
   * the repository root); the fitted profile goes to a temporary file, the table to /dev/null */
  static char out[64];
  if (!out[0]) {
    snprintf(out, sizeof out, "/tmp/ff-fuzz-cal-%d.json", (int)getpid());
    if (!freopen("/dev/null", "w", stdout))
      abort();
  }
  const char *path = temp_file(data, size);
  if (!path)
    return 0;
  char *argv[] = {"--plan", "profiles/plans/tiny-asym.json", "--metrics", (char *)path,
                  "--cluster", "profiles/clusters/cpu-local.json", "-o", out, NULL};
  ffplan_cmd_calibrate(8, argv);
  remove(out);
#else
  read_json(data, size);
#endif
  return 0;
}
