/* test_formats.c — the five formats of docs/formats.md: each reads, writes canonically and reads
 * back to the same bytes; defaults are filled in; cluster queries; plan inputs by path and inline;
 * the plan writer's inlined device types and digests; parameter counts of shipped models; plan
 * shapes at the edges of what the reader must accept; format detection. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ff_format.h"

/* ---- helpers ------------------------------------------------------------------------------ */

#define assert_contains(haystack, needle)                                                     \
  do {                                                                                         \
    const char *h_ = (haystack), *n_ = (needle);                                               \
    if (!strstr(h_, n_))                                                                       \
      fail_msg("expected to find\n  %s\nin\n  %s", n_, h_);                                   \
  } while (0)

static cJSON *parse_ok(const char *text) {
  ff_diag d;
  ff_diag_init(&d, "t.json");
  cJSON *root = NULL;
  if (ff_json_parse(text, strlen(text), &d, &root) != FF_OK)
    fail_msg("JSON rejected: %s", ff_diag_text(&d));
  ff_diag_free(&d);
  return root;
}

static char *write_tree(cJSON *tree) {
  assert_non_null(tree);
  ff_buf b = {0};
  ff_json_write(tree, &b);
  cJSON_Delete(tree);
  assert_false(b.failed);
  return b.data;
}

static char *read_text_file(const char *file) {
  ff_diag d;
  ff_diag_init(&d, file);
  char *text = NULL;
  size_t len = 0;
  if (ff_read_file(file, &d, &text, &len) != FF_OK)
    fail_msg("%s", ff_diag_text(&d));
  ff_diag_free(&d);
  return text;
}

/* Read `text` as the format its "format" key names (relative paths against base_dir), and write
 * it canonically. Fails the test, with the reader's messages, when the text is not valid. */
static char *canonical(const char *text, const char *base_dir) {
  cJSON *root = parse_ok(text);
  ff_diag d;
  ff_diag_init(&d, "t.json");
  ff_format_kind kind = ff_format_detect(root, &d);
  if (kind == FF_FORMAT_UNKNOWN)
    fail_msg("%s", ff_diag_text(&d));
  ff_status st = FF_ERR_INPUT;
  cJSON *tree = NULL;
  switch (kind) {
  case FF_FORMAT_DEVICE: {
    ff_device x;
    if ((st = ff_device_from_json(root, "", false, &d, &x)) == FF_OK) {
      tree = ff_device_to_json(&x, true);
      ff_device_free(&x);
    }
    break;
  }
  case FF_FORMAT_CLUSTER: {
    ff_cluster x;
    if ((st = ff_cluster_from_json(root, "", false, base_dir, &d, &x)) == FF_OK) {
      tree = ff_cluster_to_json(&x, true, false);
      ff_cluster_free(&x);
    }
    break;
  }
  case FF_FORMAT_MODEL: {
    ff_model x;
    if ((st = ff_model_from_json(root, "", false, &d, &x)) == FF_OK) {
      tree = ff_model_to_json(&x, true);
      ff_model_free(&x);
    }
    break;
  }
  case FF_FORMAT_TRAINING: {
    ff_training x;
    if ((st = ff_training_from_json(root, "", false, &d, &x)) == FF_OK) {
      tree = ff_training_to_json(&x, true);
      ff_training_free(&x);
    }
    break;
  }
  case FF_FORMAT_PLAN: {
    ff_plan x;
    if ((st = ff_plan_from_json(root, base_dir, &d, &x)) == FF_OK) {
      tree = ff_plan_to_json(&x);
      ff_plan_free(&x);
    }
    break;
  }
  default: break;
  }
  if (st != FF_OK)
    fail_msg("rejected:\n%s", ff_diag_text(&d));
  assert_int_equal(d.errors, 0);
  ff_diag_free(&d);
  cJSON_Delete(root);
  return write_tree(tree);
}

/* read -> write -> read -> write gives the same bytes twice; returns the first writing. When
 * `already_canonical`, the input itself must be those bytes. */
static char *round_trip(const char *text, const char *base_dir, bool already_canonical) {
  char *first = canonical(text, base_dir);
  char *second = canonical(first, base_dir);
  assert_string_equal(second, first);
  if (already_canonical)
    assert_string_equal(first, text);
  free(second);
  return first;
}

/* ---- round trips -------------------------------------------------------------------------- */

static const char device_full[] =
    "{\n"
    "  \"format\": \"ff-device/1\",\n"
    "  \"name\": \"GPU-X_80GB.v2\",\n"
    "  \"vendor\": \"Acme\",\n"
    "  \"architecture\": \"Ada Lovelace\",\n"
    "  \"memory_gib\": 79.5,\n"
    "  \"memory_bandwidth_gb_per_s\": 3350,\n"
    "  \"peak_tflops\": {\n"
    "    \"bf16\": 989.4,\n"
    "    \"fp16\": 989.4,\n"
    "    \"tf32\": 494.7,\n"
    "    \"fp32\": 66.9\n"
    "  },\n"
    "  \"runtime_reserve_gib\": 2.5,\n"
    "  \"source\": \"Acme datasheet (2024) \\\"X\\\" — Ümlaut ✓, https://example.com/x?a=1&b=2\",\n"
    "  \"measured\": {\n"
    "    \"gemm\": [\n"
    "      {\"dtype\": \"bf16\", \"m\": 4096, \"n\": 4096, \"k\": 4096, \"tflops\": 701.25},\n"
    "      {\"dtype\": \"fp32\", \"m\": 1, \"n\": 2147483647, \"k\": 8, \"tflops\": 0.001},\n"
    "      {\"dtype\": \"bf16\", \"m\": 4096, \"n\": 4096, \"k\": 8192, \"tflops\": 1e-05}\n"
    "    ],\n"
    "    \"layers\": [\n"
    "      {\"model\": \"llama-2-7b\", \"precision\": \"bf16\", \"micro_batch_size\": 1, \"tp\": 8, "
    "\"forward_ms\": 1.5, \"backward_ms\": 3.25},\n"
    "      {\"model\": \"llama-2-7b\", \"precision\": \"bf16\", \"micro_batch_size\": 2, \"tp\": 8, "
    "\"forward_ms\": 0.3333333333333333, \"backward_ms\": 1000000000}\n"
    "    ]\n"
    "  }\n"
    "}\n";

static void device_reads_and_writes_back_byte_identical(void **state) {
  (void)state;
  free(round_trip(device_full, NULL, true));
  /* non-canonical spelling of the same device: one line, other number forms */
  char *out = round_trip("{\"format\":\"ff-device/1\",\"name\":\"D\",\"memory_gib\":8.0e0,"
                         "\"memory_bandwidth_gb_per_s\":1E3,\"peak_tflops\":{\"fp32\":10,"
                         "\"fp16\":20.000},\"source\":\"s\",\"measured\":{}}",
                         NULL, false);
  assert_string_equal(out, "{\n"
                           "  \"format\": \"ff-device/1\",\n"
                           "  \"name\": \"D\",\n"
                           "  \"memory_gib\": 8,\n"
                           "  \"memory_bandwidth_gb_per_s\": 1000,\n"
                           "  \"peak_tflops\": {\n"
                           "    \"fp16\": 20,\n"
                           "    \"fp32\": 10\n"
                           "  },\n"
                           "  \"runtime_reserve_gib\": 1,\n"
                           "  \"source\": \"s\",\n"
                           "  \"measured\": {\n"
                           "    \"gemm\": [],\n"
                           "    \"layers\": []\n"
                           "  }\n"
                           "}\n");
  free(out);
}

static const char cluster_full[] =
    "{\n"
    "  \"format\": \"ff-cluster/1\",\n"
    "  \"name\": \"mixed\",\n"
    "  \"description\": \"one PCIe node, two NVLink nodes in a rack; 10 Gbit/s Ethernet\",\n"
    "  \"device_types\": [\n"
    "    {\n"
    "      \"name\": \"GPU-A\",\n"
    "      \"memory_gib\": 24,\n"
    "      \"memory_bandwidth_gb_per_s\": 936,\n"
    "      \"peak_tflops\": {\n"
    "        \"fp16\": 71,\n"
    "        \"fp32\": 35.6\n"
    "      },\n"
    "      \"runtime_reserve_gib\": 1,\n"
    "      \"source\": \"test\"\n"
    "    },\n"
    "    {\n"
    "      \"name\": \"GPU-B\",\n"
    "      \"vendor\": \"Acme\",\n"
    "      \"memory_gib\": 80,\n"
    "      \"memory_bandwidth_gb_per_s\": 2039,\n"
    "      \"peak_tflops\": {\n"
    "        \"bf16\": 312,\n"
    "        \"fp16\": 312,\n"
    "        \"tf32\": 156,\n"
    "        \"fp32\": 19.5\n"
    "      },\n"
    "      \"runtime_reserve_gib\": 2,\n"
    "      \"source\": \"test\"\n"
    "    }\n"
    "  ],\n"
    "  \"nodes\": [\n"
    "    {\"name\": \"a0\", \"device\": \"GPU-A\", \"gpus\": 8, \"island_gpus\": 1, "
    "\"intra_bandwidth_gb_per_s\": 20, \"intra_latency_us\": 10},\n"
    "    {\"name\": \"b0\", \"device\": \"GPU-B\", \"gpus\": 8, \"island_gpus\": 8, "
    "\"island_bandwidth_gb_per_s\": 300, \"island_latency_us\": 3},\n"
    "    {\"name\": \"b1\", \"device\": \"GPU-B\", \"gpus\": 8, \"island_gpus\": 4, "
    "\"island_bandwidth_gb_per_s\": 300, \"island_latency_us\": 3, "
    "\"intra_bandwidth_gb_per_s\": 32, \"intra_latency_us\": 8},\n"
    "    {\"name\": \"one\", \"device\": \"GPU-A\", \"gpus\": 1, \"island_gpus\": 1}\n"
    "  ],\n"
    "  \"network\": {\n"
    "    \"default\": {\n"
    "      \"bandwidth_gb_per_s\": 1.25,\n"
    "      \"latency_us\": 50\n"
    "    },\n"
    "    \"groups\": [\n"
    "      {\"name\": \"rack1\", \"nodes\": [\"b0\", \"b1\"], \"bandwidth_gb_per_s\": 25, "
    "\"latency_us\": 5}\n"
    "    ],\n"
    "    \"overrides\": [\n"
    "      {\"nodes\": [\"one\", \"a0\"], \"bandwidth_gb_per_s\": 12.5, \"latency_us\": 0}\n"
    "    ]\n"
    "  }\n"
    "}\n";

static void cluster_reads_and_writes_back_byte_identical(void **state) {
  (void)state;
  free(round_trip(cluster_full, NULL, true));
  /* one node needs no network, and none is written */
  free(round_trip("{\n"
                  "  \"format\": \"ff-cluster/1\",\n"
                  "  \"name\": \"single\",\n"
                  "  \"device_types\": [\"../devices/t4.json\"],\n"
                  "  \"nodes\": [\n"
                  "    {\"name\": \"n\", \"device\": \"T4\", \"gpus\": 4, \"island_gpus\": 1, "
                  "\"intra_bandwidth_gb_per_s\": 16, \"intra_latency_us\": 10}\n"
                  "  ]\n"
                  "}\n",
                  "profiles/clusters", true));
}

static const char model_full[] = "{\n"
                                 "  \"format\": \"ff-model/1\",\n"
                                 "  \"name\": \"llama-2-70b\",\n"
                                 "  \"layers\": 80,\n"
                                 "  \"hidden\": 8192,\n"
                                 "  \"heads\": 64,\n"
                                 "  \"kv_heads\": 8,\n"
                                 "  \"ffn_hidden\": 28672,\n"
                                 "  \"vocab\": 32000,\n"
                                 "  \"seq_len\": 4096,\n"
                                 "  \"norm\": \"rmsnorm\",\n"
                                 "  \"norm_eps\": 1e-06,\n"
                                 "  \"activation\": \"swiglu\",\n"
                                 "  \"rope_theta\": 500000,\n"
                                 "  \"tied_embeddings\": true,\n"
                                 "  \"source\": \"test\"\n"
                                 "}\n";

static void model_reads_and_writes_back_byte_identical(void **state) {
  (void)state;
  free(round_trip(model_full, NULL, true));
}

static const char training_full[] = "{\n"
                                    "  \"format\": \"ff-training/1\",\n"
                                    "  \"name\": \"pretrain-512\",\n"
                                    "  \"global_batch\": 512,\n"
                                    "  \"micro_batch_sizes\": [1, 2, 4, 65536],\n"
                                    "  \"precision\": \"fp32\",\n"
                                    "  \"recompute\": \"selective\",\n"
                                    "  \"zero1\": true,\n"
                                    "  \"schedule\": \"gpipe\",\n"
                                    "  \"attention\": \"gemm\",\n"
                                    "  \"steps\": 1000,\n"
                                    "  \"seed\": 9007199254740992,\n"
                                    "  \"optimizer\": {\n"
                                    "    \"lr\": 0.0003,\n"
                                    "    \"beta1\": 0,\n"
                                    "    \"beta2\": 0.999,\n"
                                    "    \"eps\": 1e-08,\n"
                                    "    \"weight_decay\": 0,\n"
                                    "    \"grad_clip\": 0\n"
                                    "  },\n"
                                    "  \"lr_schedule\": {\n"
                                    "    \"warmup_steps\": 1000,\n"
                                    "    \"decay\": \"linear\",\n"
                                    "    \"min_lr\": 3e-05\n"
                                    "  }\n"
                                    "}\n";

static void training_reads_and_writes_back_byte_identical(void **state) {
  (void)state;
  free(round_trip(training_full, NULL, true));
}

/* ---- a plan builder ----------------------------------------------------------------------- */

#define VOCAB(r) ", \"vocab\": " r
#define RANK(r, gpu, heads, kv, ffn, vocab)                                                     \
  "{\"rank\": " #r ", \"node\": \"cpu0\", \"gpu\": " #gpu ", \"device\": \"CPU-CORE\", "       \
  "\"heads\": " heads ", \"kv_heads\": " kv ", \"ffn\": " ffn vocab "}"
#define STAGE(layers, emb, lm, recompute, ranks)                                                \
  "{\"layers\": " layers ", \"embedding\": " emb ", \"lm_head\": " lm ", \"recompute\": \""    \
  recompute "\", \"ranks\": [" ranks "]}"
#define PIPELINE(batch, mbs, mb, stages)                                                         \
  "{\"batch\": " #batch ", \"micro_batch_size\": " #mbs ", \"micro_batches\": " #mb            \
  ", \"stages\": [" stages "]}"

#define PLAN_DIR "profiles/plans"
#define TINY "\"../models/tiny.json\""
#define TINY_GQA "\"../models/tiny-gqa.json\""
#define TINY_TRAINING "\"../training/tiny.json\""
#define CPU_LOCAL "\"../clusters/cpu-local.json\""

/* A plan text: inputs as given (paths relative to profiles/plans, or inline objects). */
static char *plan_text(const char *name, const char *model, const char *training,
                       const char *cluster, const char *pipelines) {
  ff_buf b = {0};
  ff_buf_puts(&b, "{\"format\": \"ff-plan/1\", ");
  if (name)
    ff_buf_printf(&b, "\"name\": \"%s\", ", name);
  ff_buf_printf(&b, "\"inputs\": {\"model\": %s, \"training\": %s, \"cluster\": %s}, ", model,
                training, cluster);
  ff_buf_printf(&b, "\"pipelines\": [%s]}", pipelines);
  assert_false(b.failed);
  return b.data;
}

static ff_status read_plan(const char *text, ff_diag *d, ff_plan *plan) {
  cJSON *root = parse_ok(text);
  ff_diag_init(d, "plan.json");
  ff_status st = ff_plan_from_json(root, PLAN_DIR, d, plan);
  cJSON_Delete(root);
  return st;
}

/* The plan must be accepted and round-trip; the caller frees *plan. */
static void accept_plan(const char *text, ff_plan *plan) {
  ff_diag d;
  if (read_plan(text, &d, plan) != FF_OK)
    fail_msg("plan rejected:\n%s", ff_diag_text(&d));
  assert_int_equal(d.errors, 0);
  ff_diag_free(&d);
  free(round_trip(text, PLAN_DIR, false));
}

/* The plan must be rejected with a message containing `want`. */
static void reject_plan(const char *text, const char *want) {
  ff_diag d;
  ff_plan plan;
  if (read_plan(text, &d, &plan) == FF_OK) {
    ff_plan_free(&plan);
    fail_msg("plan accepted, expected: %s", want);
  }
  assert_contains(ff_diag_text(&d), want);
  ff_diag_free(&d);
}

static const char one_rank_pipeline[] =
    PIPELINE(8, 2, 4,
             STAGE("[0, 4]", "true", "true", "none",
                   RANK(0, 0, "[0, 4]", "[0, 4]", "[0, 172]", VOCAB("[0, 256]"))));

static void plan_inputs_given_as_paths_are_read_and_written_inline(void **state) {
  (void)state;
  char *text = plan_text("tiny-1rank", TINY, TINY_TRAINING, CPU_LOCAL, one_rank_pipeline);
  ff_plan plan;
  accept_plan(text, &plan);
  assert_string_equal(plan.model.name, "tiny");
  assert_string_equal(plan.training.name, "tiny");
  assert_string_equal(plan.cluster.name, "cpu-local");
  assert_int_equal(plan.cluster.n_devices, 1);
  assert_string_equal(plan.cluster.devices[0].name, "CPU-CORE");
  assert_int_equal(plan.n_ranks, 1);
  ff_plan_free(&plan);
  /* the same plan as shipped, with everything inline, is exactly what the writer produces */
  char *written = canonical(text, PLAN_DIR);
  char *shipped = read_text_file("profiles/plans/tiny-1rank.json");
  assert_string_equal(written, shipped);
  free(round_trip(shipped, PLAN_DIR, true));
  free(shipped);
  free(written);
  free(text);
}

static void plan_inputs_given_inline_are_read(void **state) {
  (void)state;
  char *text = plan_text(
      NULL,
      "{\"name\": \"m\", \"layers\": 2, \"hidden\": 16, \"heads\": 2, \"ffn_hidden\": 32, "
      "\"vocab\": 10, \"seq_len\": 8}",
      "{\"format\": \"ff-training/1\", \"name\": \"t\", \"global_batch\": 4, "
      "\"micro_batch_sizes\": [2], \"precision\": \"bf16\", \"steps\": 3}",
      "{\"name\": \"c\", \"device_types\": [\"../devices/cpu-core.json\", {\"name\": \"G\", "
      "\"memory_gib\": 4, \"memory_bandwidth_gb_per_s\": 100, \"peak_tflops\": {\"fp16\": 1, "
      "\"fp32\": 1}, \"source\": \"s\"}], \"nodes\": [{\"name\": \"cpu0\", \"device\": "
      "\"CPU-CORE\", \"gpus\": 2, \"island_bandwidth_gb_per_s\": 5, \"island_latency_us\": 5}]}",
      PIPELINE(4, 2, 2,
               STAGE("[0, 2]", "true", "true", "selective",
                     RANK(0, 0, "[0, 1]", "[0, 1]", "[0, 16]", VOCAB("[0, 5]"))
                         "," RANK(1, 1, "[1, 2]", "[1, 2]", "[16, 32]", VOCAB("[5, 10]")))));
  ff_plan plan;
  accept_plan(text, &plan);
  assert_false(plan.has_name);
  assert_int_equal(plan.model.kv_heads, 2);
  assert_int_equal(plan.training.recompute, FF_RECOMPUTE_AUTO);
  assert_int_equal(plan.cluster.n_devices, 2);
  assert_int_equal(plan.cluster.nodes[0].island_gpus, 2);
  assert_int_equal(plan.pipelines[0].stages[0].recompute, FF_RECOMPUTE_SELECTIVE);
  assert_int_equal(plan.n_ranks, 2);
  ff_plan_free(&plan);
  free(text);
}

static void plan_writer_inlines_device_types_and_adds_digests_of_each_input(void **state) {
  (void)state;
  char *text = plan_text("p", TINY, TINY_TRAINING, CPU_LOCAL, one_rank_pipeline);
  ff_plan plan;
  accept_plan(text, &plan);
  ff_plan_free(&plan);
  char *written_text = canonical(text, PLAN_DIR);
  cJSON *written = parse_ok(written_text);
  free(written_text);
  const cJSON *inputs = cJSON_GetObjectItemCaseSensitive(written, "inputs");
  assert_non_null(inputs);
  /* device types of a cluster read from files are written as objects, without "format" */
  const cJSON *cluster = cJSON_GetObjectItemCaseSensitive(inputs, "cluster");
  assert_true(cJSON_IsObject(cluster));
  assert_null(cJSON_GetObjectItemCaseSensitive(cluster, "format"));
  const cJSON *devices = cJSON_GetObjectItemCaseSensitive(cluster, "device_types");
  assert_int_equal(cJSON_GetArraySize(devices), 1);
  const cJSON *dev = cJSON_GetArrayItem(devices, 0);
  assert_true(cJSON_IsObject(dev));
  assert_null(cJSON_GetObjectItemCaseSensitive(dev, "format"));
  assert_string_equal(cJSON_GetObjectItemCaseSensitive(dev, "name")->valuestring, "CPU-CORE");
  /* inputs are inline, without "format" */
  static const char *const keys[] = {"model", "training", "cluster"};
  const cJSON *digests = cJSON_GetObjectItemCaseSensitive(inputs, "digests");
  assert_non_null(digests);
  for (int i = 0; i < 3; i++) {
    const cJSON *input = cJSON_GetObjectItemCaseSensitive(inputs, keys[i]);
    assert_true(cJSON_IsObject(input));
    assert_null(cJSON_GetObjectItemCaseSensitive(input, "format"));
    char digest[32];
    ff_digest_json(input, digest);
    const cJSON *written_digest = cJSON_GetObjectItemCaseSensitive(digests, keys[i]);
    assert_true(cJSON_IsString(written_digest));
    assert_string_equal(written_digest->valuestring, digest);
    assert_int_equal(strlen(digest), 24);
    assert_memory_equal(digest, "fnv1a64:", 8);
  }
  /* the model digest is the FNV-1a of the model file's canonical text without "format" */
  ff_diag d;
  ff_diag_init(&d, NULL);
  ff_model m;
  assert_int_equal(ff_load_model("profiles/models/tiny.json", &d, &m), FF_OK);
  ff_buf b = {0};
  ff_json_write(cJSON_GetObjectItemCaseSensitive(inputs, "model"), &b);
  cJSON *model_tree = ff_model_to_json(&m, false);
  char *model_text = write_tree(model_tree);
  assert_string_equal(b.data, model_text);
  char want[32];
  snprintf(want, sizeof want, "fnv1a64:%016llx",
           (unsigned long long)ff_fnv1a64(model_text, strlen(model_text)));
  assert_string_equal(cJSON_GetObjectItemCaseSensitive(digests, "model")->valuestring, want);
  free(model_text);
  ff_buf_free(&b);
  ff_model_free(&m);
  ff_diag_free(&d);
  cJSON_Delete(written);
  free(text);
}

/* ---- defaults ----------------------------------------------------------------------------- */

static void model_defaults_are_filled_and_written(void **state) {
  (void)state;
  const char *text = "{\"format\": \"ff-model/1\", \"name\": \"m\", \"layers\": 2, \"hidden\": 64, "
                     "\"heads\": 8, \"ffn_hidden\": 100, \"vocab\": 1000, \"seq_len\": 128}";
  cJSON *root = parse_ok(text);
  ff_diag d;
  ff_diag_init(&d, "m.json");
  ff_model m;
  assert_int_equal(ff_model_from_json(root, "", false, &d, &m), FF_OK);
  assert_int_equal(m.kv_heads, 8);
  assert_true(m.norm_eps == 1e-5);
  assert_true(m.rope_theta == 10000);
  assert_false(m.tied_embeddings);
  assert_null(m.source);
  ff_model_free(&m);
  ff_diag_free(&d);
  cJSON_Delete(root);
  char *out = round_trip(text, NULL, false);
  assert_string_equal(out, "{\n"
                           "  \"format\": \"ff-model/1\",\n"
                           "  \"name\": \"m\",\n"
                           "  \"layers\": 2,\n"
                           "  \"hidden\": 64,\n"
                           "  \"heads\": 8,\n"
                           "  \"kv_heads\": 8,\n"
                           "  \"ffn_hidden\": 100,\n"
                           "  \"vocab\": 1000,\n"
                           "  \"seq_len\": 128,\n"
                           "  \"norm\": \"rmsnorm\",\n"
                           "  \"norm_eps\": 1e-05,\n"
                           "  \"activation\": \"swiglu\",\n"
                           "  \"rope_theta\": 10000,\n"
                           "  \"tied_embeddings\": false\n"
                           "}\n");
  free(out);
}

static void training_defaults_are_filled_and_written(void **state) {
  (void)state;
  const char *text = "{\"format\": \"ff-training/1\", \"name\": \"t\", \"global_batch\": 64, "
                     "\"micro_batch_sizes\": [1, 2], \"precision\": \"bf16\", \"steps\": 100}";
  cJSON *root = parse_ok(text);
  ff_diag d;
  ff_diag_init(&d, "t.json");
  ff_training t;
  assert_int_equal(ff_training_from_json(root, "", false, &d, &t), FF_OK);
  assert_int_equal(t.recompute, FF_RECOMPUTE_AUTO);
  assert_int_equal(t.schedule, FF_SCHEDULE_1F1B);
  assert_int_equal(t.attention, FF_ATTENTION_AUTO); /* and not written back: see want */
  assert_false(t.zero1);
  assert_int_equal(t.seed, 1234);
  assert_true(t.lr == 3e-4);
  assert_true(t.beta1 == 0.9);
  assert_true(t.beta2 == 0.95);
  assert_true(t.eps == 1e-8);
  assert_true(t.weight_decay == 0.1);
  assert_true(t.grad_clip == 1);
  assert_int_equal(t.warmup_steps, 0);
  assert_int_equal(t.decay, FF_DECAY_COSINE);
  assert_true(t.min_lr == 3e-05); /* lr/10 rounded to 15 digits: written as 3e-05 */
  ff_training_free(&t);
  ff_diag_free(&d);
  cJSON_Delete(root);
  char min_lr[32];
  ff_format_double(3e-05, min_lr);
  char want[1024];
  snprintf(want, sizeof want,
           "{\n"
           "  \"format\": \"ff-training/1\",\n"
           "  \"name\": \"t\",\n"
           "  \"global_batch\": 64,\n"
           "  \"micro_batch_sizes\": [1, 2],\n"
           "  \"precision\": \"bf16\",\n"
           "  \"recompute\": \"auto\",\n"
           "  \"zero1\": false,\n"
           "  \"schedule\": \"1f1b\",\n"
           "  \"steps\": 100,\n"
           "  \"seed\": 1234,\n"
           "  \"optimizer\": {\n"
           "    \"lr\": 0.0003,\n"
           "    \"beta1\": 0.9,\n"
           "    \"beta2\": 0.95,\n"
           "    \"eps\": 1e-08,\n"
           "    \"weight_decay\": 0.1,\n"
           "    \"grad_clip\": 1\n"
           "  },\n"
           "  \"lr_schedule\": {\n"
           "    \"warmup_steps\": 0,\n"
           "    \"decay\": \"cosine\",\n"
           "    \"min_lr\": %s\n"
           "  }\n"
           "}\n",
           min_lr);
  char *out = round_trip(text, NULL, false);
  assert_string_equal(out, want);
  free(out);
}

static void min_lr_defaults_to_a_tenth_of_the_given_lr(void **state) {
  (void)state;
  static const char *const texts[] = {
      /* lr given, no lr_schedule */
      "{\"format\": \"ff-training/1\", \"name\": \"t\", \"global_batch\": 1, "
      "\"micro_batch_sizes\": [1], \"precision\": \"fp32\", \"steps\": 1, "
      "\"optimizer\": {\"lr\": 0.001}}",
      /* lr given, lr_schedule without min_lr */
      "{\"format\": \"ff-training/1\", \"name\": \"t\", \"global_batch\": 1, "
      "\"micro_batch_sizes\": [1], \"precision\": \"fp32\", \"steps\": 10, "
      "\"optimizer\": {\"lr\": 0.001}, \"lr_schedule\": {\"warmup_steps\": 10}}",
  };
  for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
    cJSON *root = parse_ok(texts[i]);
    ff_diag d;
    ff_diag_init(&d, "t.json");
    ff_training t;
    assert_int_equal(ff_training_from_json(root, "", false, &d, &t), FF_OK);
    assert_true(t.lr == 0.001);
    assert_true(t.min_lr == 0.001 / 10);
    assert_true(t.beta1 == 0.9); /* the other optimizer defaults stay */
    ff_training_free(&t);
    ff_diag_free(&d);
    cJSON_Delete(root);
    free(round_trip(texts[i], NULL, false));
  }
}

static void device_runtime_reserve_defaults_to_one_gib(void **state) {
  (void)state;
  const char *text = "{\"format\": \"ff-device/1\", \"name\": \"D\", \"memory_gib\": 16, "
                     "\"memory_bandwidth_gb_per_s\": 900, \"peak_tflops\": {\"fp16\": 100, "
                     "\"fp32\": 15}, \"source\": \"s\"}";
  cJSON *root = parse_ok(text);
  ff_diag d;
  ff_diag_init(&d, "d.json");
  ff_device dev;
  assert_int_equal(ff_device_from_json(root, "", false, &d, &dev), FF_OK);
  assert_true(dev.runtime_reserve_gib == 1);
  assert_true(dev.peak_tflops[FF_DTYPE_BF16] == 0); /* absent: no such unit */
  assert_true(dev.peak_tflops[FF_DTYPE_TF32] == 0);
  assert_null(dev.vendor);
  assert_null(dev.architecture);
  assert_false(dev.has_measured);
  assert_null(dev.ref);
  ff_device_free(&dev);
  ff_diag_free(&d);
  cJSON_Delete(root);
  char *out = round_trip(text, NULL, false);
  assert_string_equal(out, "{\n"
                           "  \"format\": \"ff-device/1\",\n"
                           "  \"name\": \"D\",\n"
                           "  \"memory_gib\": 16,\n"
                           "  \"memory_bandwidth_gb_per_s\": 900,\n"
                           "  \"peak_tflops\": {\n"
                           "    \"fp16\": 100,\n"
                           "    \"fp32\": 15\n"
                           "  },\n"
                           "  \"runtime_reserve_gib\": 1,\n"
                           "  \"source\": \"s\"\n"
                           "}\n");
  free(out);
}

/* ---- clusters ----------------------------------------------------------------------------- */

static void cluster_device_types_may_be_inline_objects_or_paths(void **state) {
  (void)state;
  const char *text =
      "{\"format\": \"ff-cluster/1\", \"name\": \"c\", \"device_types\": ["
      "{\"format\": \"ff-device/1\", \"name\": \"INLINE-1\", \"memory_gib\": 8, "
      "\"memory_bandwidth_gb_per_s\": 100, \"peak_tflops\": {\"fp16\": 1, \"fp32\": 1}, "
      "\"source\": \"s\"}, "
      "\"../devices/a100-sxm4-80gb.json\", "
      "{\"name\": \"INLINE-2\", \"memory_gib\": 8, \"memory_bandwidth_gb_per_s\": 100, "
      "\"peak_tflops\": {\"fp16\": 1, \"fp32\": 1}, \"runtime_reserve_gib\": 0.5, "
      "\"source\": \"s\"}], "
      "\"nodes\": [{\"name\": \"x\", \"device\": \"INLINE-2\", \"gpus\": 2, \"island_gpus\": 1, "
      "\"intra_bandwidth_gb_per_s\": 16, \"intra_latency_us\": 10}, "
      "{\"name\": \"y\", \"device\": \"A100-SXM4-80GB\", \"gpus\": 1}, "
      "{\"name\": \"z\", \"device\": \"INLINE-1\", \"gpus\": 1}], "
      "\"network\": {\"default\": {\"bandwidth_gb_per_s\": 1, \"latency_us\": 1}}}";
  cJSON *root = parse_ok(text);
  ff_diag d;
  ff_diag_init(&d, "c.json");
  ff_cluster c;
  if (ff_cluster_from_json(root, "", false, "profiles/clusters", &d, &c) != FF_OK)
    fail_msg("%s", ff_diag_text(&d));
  assert_int_equal(c.n_devices, 3);
  assert_string_equal(c.devices[0].name, "INLINE-1");
  assert_null(c.devices[0].ref);
  assert_string_equal(c.devices[1].name, "A100-SXM4-80GB");
  assert_string_equal(c.devices[1].ref, "../devices/a100-sxm4-80gb.json");
  assert_string_equal(c.devices[2].name, "INLINE-2");
  assert_true(c.devices[2].runtime_reserve_gib == 0.5);
  assert_int_equal(c.nodes[0].device, 2);
  assert_int_equal(c.nodes[1].device, 1);
  assert_int_equal(c.nodes[2].device, 0);
  assert_int_equal(ff_cluster_find_device(&c, "INLINE-2"), 2);
  assert_int_equal(ff_cluster_find_device(&c, "A100"), -1);
  assert_int_equal(c.total_gpus, 4);
  /* written back: paths stay paths; inline devices lose "format"; or everything inline */
  char *as_read = write_tree(ff_cluster_to_json(&c, true, false));
  char *all_inline = write_tree(ff_cluster_to_json(&c, false, true));
  cJSON *a = parse_ok(as_read), *b = parse_ok(all_inline);
  const cJSON *da = cJSON_GetObjectItemCaseSensitive(a, "device_types");
  const cJSON *db = cJSON_GetObjectItemCaseSensitive(b, "device_types");
  assert_true(cJSON_IsObject(cJSON_GetArrayItem(da, 0)));
  assert_null(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(da, 0), "format"));
  assert_true(cJSON_IsString(cJSON_GetArrayItem(da, 1)));
  assert_string_equal(cJSON_GetArrayItem(da, 1)->valuestring, "../devices/a100-sxm4-80gb.json");
  assert_true(cJSON_IsObject(cJSON_GetArrayItem(db, 1)));
  assert_string_equal(
      cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(db, 1), "name")->valuestring,
      "A100-SXM4-80GB");
  assert_string_equal(cJSON_GetObjectItemCaseSensitive(a, "format")->valuestring, "ff-cluster/1");
  assert_null(cJSON_GetObjectItemCaseSensitive(b, "format"));
  cJSON_Delete(a);
  cJSON_Delete(b);
  free(as_read);
  free(all_inline);
  ff_cluster_free(&c);
  ff_diag_free(&d);
  cJSON_Delete(root);
  free(round_trip(text, "profiles/clusters", false));
}

static void node_link_is_override_then_group_then_default_and_symmetric(void **state) {
  (void)state;
  const char *text =
      "{\"format\": \"ff-cluster/1\", \"name\": \"links\", \"device_types\": "
      "[\"../devices/t4.json\"], \"nodes\": ["
      "{\"name\": \"a\", \"device\": \"T4\", \"gpus\": 1}, "
      "{\"name\": \"b\", \"device\": \"T4\", \"gpus\": 1}, "
      "{\"name\": \"c\", \"device\": \"T4\", \"gpus\": 1}, "
      "{\"name\": \"d\", \"device\": \"T4\", \"gpus\": 1}, "
      "{\"name\": \"e\", \"device\": \"T4\", \"gpus\": 1}, "
      "{\"name\": \"f\", \"device\": \"T4\", \"gpus\": 1}], "
      "\"network\": {\"default\": {\"bandwidth_gb_per_s\": 1.25, \"latency_us\": 50}, "
      "\"groups\": [{\"name\": \"g1\", \"nodes\": [\"a\", \"b\", \"c\"], "
      "\"bandwidth_gb_per_s\": 100, \"latency_us\": 2}, "
      "{\"name\": \"g2\", \"nodes\": [\"e\", \"d\"], \"bandwidth_gb_per_s\": 50, "
      "\"latency_us\": 4}], "
      "\"overrides\": [{\"nodes\": [\"b\", \"a\"], \"bandwidth_gb_per_s\": 200, "
      "\"latency_us\": 1}, "
      "{\"nodes\": [\"c\", \"d\"], \"bandwidth_gb_per_s\": 7, \"latency_us\": 9}, "
      "{\"nodes\": [\"f\", \"e\"], \"bandwidth_gb_per_s\": 3, \"latency_us\": 0}]}}";
  cJSON *root = parse_ok(text);
  ff_diag d;
  ff_diag_init(&d, "c.json");
  ff_cluster c;
  if (ff_cluster_from_json(root, "", false, "profiles/clusters", &d, &c) != FF_OK)
    fail_msg("%s", ff_diag_text(&d));
  enum { A, B, C, D, E, F };
  static const struct {
    int x, y;
    double bw, lat;
  } want[] = {
      {A, B, 200, 1},    /* override beats the group both are in */
      {A, C, 100, 2},    /* same group */
      {B, C, 100, 2},    /* same group */
      {D, E, 50, 4},     /* the other group */
      {C, D, 7, 9},      /* override between two groups */
      {A, D, 1.25, 50},  /* different groups: default */
      {A, F, 1.25, 50},  /* f is in no group: default */
      {E, F, 3, 0},      /* override with a node in no group */
      {B, E, 1.25, 50},
  };
  for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
    ff_link xy = ff_cluster_node_link(&c, want[i].x, want[i].y);
    ff_link yx = ff_cluster_node_link(&c, want[i].y, want[i].x);
    if (xy.bandwidth_gb_per_s != want[i].bw || xy.latency_us != want[i].lat)
      fail_msg("link %d-%d is %g GB/s %g us, expected %g GB/s %g us", want[i].x, want[i].y,
               xy.bandwidth_gb_per_s, xy.latency_us, want[i].bw, want[i].lat);
    assert_true(yx.bandwidth_gb_per_s == xy.bandwidth_gb_per_s);
    assert_true(yx.latency_us == xy.latency_us);
  }
  assert_int_equal(c.nodes[A].group, 0);
  assert_int_equal(c.nodes[E].group, 1);
  assert_int_equal(c.nodes[F].group, -1);
  ff_cluster_free(&c);
  ff_diag_free(&d);
  cJSON_Delete(root);
  free(round_trip(text, "profiles/clusters", false));
}

static void find_node_resolves_every_name_of_a_thousand_node_cluster(void **state) {
  (void)state;
  enum { N = 1000 };
  ff_buf b = {0};
  ff_buf_puts(&b, "{\"format\": \"ff-cluster/1\", \"name\": \"big\", \"device_types\": "
                  "[{\"name\": \"G\", \"memory_gib\": 8, \"memory_bandwidth_gb_per_s\": 100, "
                  "\"peak_tflops\": {\"fp16\": 1, \"fp32\": 1}, \"source\": \"s\"}], \"nodes\": [");
  /* names in a scrambled order, so that file order and name order differ */
  for (int i = 0; i < N; i++) {
    ff_buf_printf(&b, "%s{\"name\": \"node-%03d\", \"device\": \"G\", \"gpus\": %d",
                  i ? ", " : "", (i * 617) % N, 1 + i % 8);
    ff_buf_puts(&b, i % 8 ? ", \"island_bandwidth_gb_per_s\": 300, \"island_latency_us\": 3}" : "}");
  }
  ff_buf_puts(&b, "], \"network\": {\"default\": {\"bandwidth_gb_per_s\": 12.5, "
                  "\"latency_us\": 10}}}");
  assert_false(b.failed);
  cJSON *root = parse_ok(b.data);
  ff_diag d;
  ff_diag_init(&d, "big.json");
  ff_cluster c;
  if (ff_cluster_from_json(root, "", false, NULL, &d, &c) != FF_OK)
    fail_msg("%s", ff_diag_text(&d));
  assert_int_equal(c.n_nodes, N);
  int64_t gpus = 0;
  for (int i = 0; i < N; i++) {
    char name[32];
    snprintf(name, sizeof name, "node-%03d", (i * 617) % N);
    assert_int_equal(ff_cluster_find_node(&c, name), i);
    assert_string_equal(c.nodes[i].name, name);
    gpus += 1 + i % 8;
  }
  assert_int_equal(c.total_gpus, gpus);
  static const char *const absent[] = {"node-1000", "node-", "node-0000", "node-00", "",
                                       "NODE-001", "node-999x", "a", "zzzz", "node-0001"};
  for (size_t i = 0; i < sizeof absent / sizeof *absent; i++)
    assert_int_equal(ff_cluster_find_node(&c, absent[i]), -1);
  ff_cluster_free(&c);
  ff_diag_free(&d);
  cJSON_Delete(root);
  /* a large cluster round-trips as well */
  free(round_trip(b.data, NULL, false));
  ff_buf_free(&b);
}

/* ---- models ------------------------------------------------------------------------------- */

static void llama_2_parameter_counts_match_the_published_sizes(void **state) {
  (void)state;
  static const struct {
    const char *file;
    int64_t params;
  } cases[] = {
      {"profiles/models/llama-2-7b.json", INT64_C(6738415616)},
      {"profiles/models/llama-2-70b.json", INT64_C(68976648192)},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    ff_diag d;
    ff_diag_init(&d, cases[i].file);
    ff_model m;
    if (ff_load_model(cases[i].file, &d, &m) != FF_OK)
      fail_msg("%s", ff_diag_text(&d));
    assert_int_equal(ff_model_parameters(&m), cases[i].params);
    /* tied embeddings drop the LM head's vocab x hidden matrix */
    m.tied_embeddings = true;
    assert_int_equal(ff_model_parameters(&m), cases[i].params - m.vocab * m.hidden);
    ff_model_free(&m);
    ff_diag_free(&d);
  }
}

/* ---- plan shapes the reader must accept --------------------------------------------------- */

static void a_plan_of_one_rank_is_accepted(void **state) {
  (void)state;
  char *text = plan_text(NULL, TINY, TINY_TRAINING, CPU_LOCAL, one_rank_pipeline);
  ff_plan plan;
  accept_plan(text, &plan);
  assert_int_equal(plan.n_ranks, 1);
  assert_int_equal(plan.n_pipelines, 1);
  assert_int_equal(plan.pipelines[0].n_stages, 1);
  const ff_plan_stage *s = &plan.pipelines[0].stages[0];
  assert_true(s->embedding && s->lm_head);
  assert_int_equal(s->n_ranks, 1);
  assert_int_equal(s->ranks[0].vocab.end, 256);
  ff_plan_free(&plan);
  free(text);
}

static void stages_of_one_layer_and_tp_groups_of_one_gpu_are_accepted(void **state) {
  (void)state;
  char *text = plan_text(
      NULL, TINY, TINY_TRAINING, CPU_LOCAL,
      PIPELINE(8, 1, 8,
               STAGE("[0, 1]", "true", "false", "none",
                     RANK(0, 0, "[0, 4]", "[0, 4]", "[0, 172]", VOCAB("[0, 256]"))) ","
               STAGE("[1, 2]", "false", "false", "none",
                     RANK(1, 1, "[0, 4]", "[0, 4]", "[0, 172]", "")) ","
               STAGE("[2, 3]", "false", "false", "none",
                     RANK(2, 2, "[0, 2]", "[0, 2]", "[0, 86]", "") ","
                     RANK(3, 3, "[2, 4]", "[2, 4]", "[86, 172]", "")) ","
               STAGE("[3, 4]", "false", "true", "none",
                     RANK(4, 7, "[0, 4]", "[0, 4]", "[0, 172]", VOCAB("[0, 256]")))));
  ff_plan plan;
  accept_plan(text, &plan);
  assert_int_equal(plan.n_ranks, 5);
  assert_int_equal(plan.pipelines[0].n_stages, 4);
  for (int s = 0; s < 4; s++) {
    assert_int_equal(plan.pipelines[0].stages[s].layers.first, s);
    assert_int_equal(plan.pipelines[0].stages[s].layers.end, s + 1);
  }
  assert_int_equal(plan.pipelines[0].stages[2].n_ranks, 2);
  assert_int_equal(plan.pipelines[0].stages[3].ranks[0].gpu, 7);
  ff_plan_free(&plan);
  free(text);
}

static void one_head_per_rank_is_accepted(void **state) {
  (void)state;
  char *text = plan_text(
      NULL, TINY, TINY_TRAINING, CPU_LOCAL,
      PIPELINE(8, 4, 2,
               STAGE("[0, 4]", "true", "true", "none",
                     RANK(0, 0, "[0, 1]", "[0, 1]", "[0, 43]", VOCAB("[0, 64]")) ","
                     RANK(1, 1, "[1, 2]", "[1, 2]", "[43, 86]", VOCAB("[64, 128]")) ","
                     RANK(2, 2, "[2, 3]", "[2, 3]", "[86, 129]", VOCAB("[128, 192]")) ","
                     RANK(3, 3, "[3, 4]", "[3, 4]", "[129, 172]", VOCAB("[192, 256]")))));
  ff_plan plan;
  accept_plan(text, &plan);
  const ff_plan_stage *s = &plan.pipelines[0].stages[0];
  assert_int_equal(s->n_ranks, 4);
  for (int r = 0; r < 4; r++) {
    assert_int_equal(s->ranks[r].heads.first, r);
    assert_int_equal(s->ranks[r].heads.end, r + 1);
    assert_int_equal(s->ranks[r].kv_heads.first, r);
  }
  ff_plan_free(&plan);
  free(text);
}

static void gqa_kv_heads_shared_by_two_ranks_are_replicated_and_accepted(void **state) {
  (void)state;
  /* tiny-gqa: 4 query heads, 2 kv heads (2 query heads per kv head). Heads [0,1) [1,3) [3,4)
   * use kv heads [0,1) [0,2) [1,2): kv head 0 sits on ranks 0 and 1, kv head 1 on 1 and 2. */
  char *text = plan_text(
      NULL, TINY_GQA, TINY_TRAINING, CPU_LOCAL,
      PIPELINE(8, 2, 4,
               STAGE("[0, 4]", "true", "true", "none",
                     RANK(0, 0, "[0, 1]", "[0, 1]", "[0, 58]", VOCAB("[0, 86]")) ","
                     RANK(1, 1, "[1, 3]", "[0, 2]", "[58, 116]", VOCAB("[86, 172]")) ","
                     RANK(2, 2, "[3, 4]", "[1, 2]", "[116, 172]", VOCAB("[172, 256]")))));
  ff_plan plan;
  accept_plan(text, &plan);
  assert_int_equal(plan.model.kv_heads, 2);
  const ff_plan_stage *s = &plan.pipelines[0].stages[0];
  assert_int_equal(s->ranks[1].kv_heads.first, 0);
  assert_int_equal(s->ranks[1].kv_heads.end, 2);
  ff_plan_free(&plan);
  free(text);
  /* but a rank must hold every kv head its query heads use */
  text = plan_text(
      NULL, TINY_GQA, TINY_TRAINING, CPU_LOCAL,
      PIPELINE(8, 2, 4,
               STAGE("[0, 4]", "true", "true", "none",
                     RANK(0, 0, "[0, 1]", "[0, 1]", "[0, 58]", VOCAB("[0, 86]")) ","
                     RANK(1, 1, "[1, 3]", "[1, 2]", "[58, 116]", VOCAB("[86, 172]")) ","
                     RANK(2, 2, "[3, 4]", "[1, 2]", "[116, 172]", VOCAB("[172, 256]")))));
  reject_plan(text, "pipelines[0].stages[0].ranks[1].kv_heads: is [1, 2], expected [0, 2]");
  free(text);
}

static void a_last_stage_with_no_layers_holding_only_the_lm_head_is_accepted(void **state) {
  (void)state;
  char *text = plan_text(
      NULL, TINY, TINY_TRAINING, CPU_LOCAL,
      PIPELINE(8, 2, 4,
               STAGE("[0, 4]", "true", "false", "none",
                     RANK(0, 0, "[0, 4]", "[0, 4]", "[0, 172]", VOCAB("[0, 256]"))) ","
               STAGE("[4, 4]", "false", "true", "none",
                     RANK(1, 1, "[0, 2]", "[0, 2]", "[0, 86]", VOCAB("[0, 128]")) ","
                     RANK(2, 2, "[2, 4]", "[2, 4]", "[86, 172]", VOCAB("[128, 256]")))));
  ff_plan plan;
  accept_plan(text, &plan);
  const ff_plan_stage *last = &plan.pipelines[0].stages[1];
  assert_int_equal(last->layers.first, 4);
  assert_int_equal(last->layers.end, 4);
  assert_true(last->lm_head);
  assert_false(last->embedding);
  ff_plan_free(&plan);
  free(text);
  /* likewise a first stage holding only the embedding */
  text = plan_text(
      NULL, TINY, TINY_TRAINING, CPU_LOCAL,
      PIPELINE(8, 2, 4,
               STAGE("[0, 0]", "true", "false", "none",
                     RANK(0, 0, "[0, 4]", "[0, 4]", "[0, 172]", VOCAB("[0, 256]"))) ","
               STAGE("[0, 4]", "false", "true", "none",
                     RANK(1, 1, "[0, 4]", "[0, 4]", "[0, 172]", VOCAB("[0, 256]")))));
  accept_plan(text, &plan);
  ff_plan_free(&plan);
  free(text);
  /* but a middle stage may not be empty */
  text = plan_text(
      NULL, TINY, TINY_TRAINING, CPU_LOCAL,
      PIPELINE(8, 2, 4,
               STAGE("[0, 2]", "true", "false", "none",
                     RANK(0, 0, "[0, 4]", "[0, 4]", "[0, 172]", VOCAB("[0, 256]"))) ","
               STAGE("[2, 2]", "false", "false", "none",
                     RANK(1, 1, "[0, 4]", "[0, 4]", "[0, 172]", "")) ","
               STAGE("[2, 4]", "false", "true", "none",
                     RANK(2, 2, "[0, 4]", "[0, 4]", "[0, 172]", VOCAB("[0, 256]")))));
  reject_plan(text, "pipelines[0].stages[1].layers: is empty");
  free(text);
}

static void a_batch_of_one_sequence_is_accepted(void **state) {
  (void)state;
  char *text = plan_text(
      "batch-1", TINY,
      "{\"name\": \"one\", \"global_batch\": 1, \"micro_batch_sizes\": [1], "
      "\"precision\": \"fp32\", \"steps\": 1}",
      CPU_LOCAL,
      PIPELINE(1, 1, 1,
               STAGE("[0, 3]", "true", "false", "full",
                     RANK(0, 0, "[0, 4]", "[0, 4]", "[0, 172]", VOCAB("[0, 256]"))) ","
               STAGE("[3, 4]", "false", "true", "none",
                     RANK(1, 1, "[0, 4]", "[0, 4]", "[0, 172]", VOCAB("[0, 256]")))));
  ff_plan plan;
  accept_plan(text, &plan);
  assert_int_equal(plan.training.global_batch, 1);
  assert_int_equal(plan.pipelines[0].batch, 1);
  assert_int_equal(plan.pipelines[0].micro_batches, 1);
  assert_int_equal(plan.pipelines[0].stages[0].recompute, FF_RECOMPUTE_FULL);
  ff_plan_free(&plan);
  free(text);
}

static void two_pipelines_splitting_the_global_batch_are_accepted(void **state) {
  (void)state;
  char *text = plan_text(
      NULL, TINY, TINY_TRAINING, CPU_LOCAL,
      PIPELINE(6, 2, 3,
               STAGE("[0, 4]", "true", "true", "none",
                     RANK(0, 0, "[0, 4]", "[0, 4]", "[0, 172]", VOCAB("[0, 256]")))) ","
      PIPELINE(2, 1, 2,
               STAGE("[0, 1]", "true", "false", "none",
                     RANK(1, 5, "[0, 4]", "[0, 4]", "[0, 172]", VOCAB("[0, 256]"))) ","
               STAGE("[1, 4]", "false", "true", "none",
                     RANK(2, 4, "[0, 4]", "[0, 4]", "[0, 172]", VOCAB("[0, 256]")))));
  ff_plan plan;
  accept_plan(text, &plan);
  assert_int_equal(plan.n_pipelines, 2);
  assert_int_equal(plan.n_ranks, 3);
  int p = -1, s = -1, t = -1; /* ff_plan_find_rank: every rank's place, and none for a stranger */
  assert_true(ff_plan_find_rank(&plan, 0, &p, &s, &t));
  assert_true(p == 0 && s == 0 && t == 0);
  assert_true(ff_plan_find_rank(&plan, 2, &p, &s, &t));
  assert_true(p == 1 && s == 1 && t == 0);
  assert_true(ff_plan_find_rank(&plan, 1, NULL, &s, NULL) && s == 0);
  assert_false(ff_plan_find_rank(&plan, 3, &p, &s, &t));
  assert_false(ff_plan_find_rank(&plan, -1, NULL, NULL, NULL));
  ff_plan_free(&plan);
  free(text);
}

/* BUG (common/ff_format.c, load_as): a file loaded for a nested reference (a plan's input given as
 * a path, a cluster's device file) sets d->file to the joined path and, when the caller's d->file
 * was NULL, leaves it pointing at that path, which read_input / read_device_types free at once.
 * d->file then dangles: any later message (ff_diag_error) reads freed memory. The caller's file
 * name (here NULL, printed as "<input>") should be restored. */
static void reading_path_inputs_restores_the_callers_file_name(void **state) {
  (void)state;
  char *text = plan_text(NULL, TINY, TINY_TRAINING, CPU_LOCAL, one_rank_pipeline);
  cJSON *root = parse_ok(text);
  ff_diag d;
  ff_plan plan;
  ff_diag_init(&d, "plan.json");
  const char *name = d.file;
  assert_int_equal(ff_plan_from_json(root, PLAN_DIR, &d, &plan), FF_OK);
  assert_ptr_equal(d.file, name);
  ff_plan_free(&plan);
  ff_diag_free(&d);
  ff_diag_init(&d, NULL);
  assert_int_equal(ff_plan_from_json(root, PLAN_DIR, &d, &plan), FF_OK);
  bool restored = d.file == NULL; /* the bug: d.file points at a freed "profiles/plans/../..." */
  ff_plan_free(&plan);
  ff_diag_free(&d);
  /* the same for a cluster's device files */
  cJSON *cluster = parse_ok("{\"format\": \"ff-cluster/1\", \"name\": \"c\", \"device_types\": "
                            "[\"../devices/t4.json\"], \"nodes\": [{\"name\": \"n\", "
                            "\"device\": \"T4\", \"gpus\": 1}]}");
  ff_cluster c;
  ff_diag_init(&d, NULL);
  assert_int_equal(ff_cluster_from_json(cluster, "", false, "profiles/clusters", &d, &c), FF_OK);
  bool restored_cluster = d.file == NULL;
  ff_cluster_free(&c);
  ff_diag_free(&d);
  cJSON_Delete(cluster);
  cJSON_Delete(root);
  free(text);
  assert_true(restored);
  assert_true(restored_cluster);
}

/* ---- format detection --------------------------------------------------------------------- */

static ff_format_kind detect(const char *text, ff_diag *d) {
  cJSON *root = parse_ok(text);
  ff_diag_init(d, "f.json");
  ff_format_kind kind = ff_format_detect(root, d);
  cJSON_Delete(root);
  return kind;
}

static void format_detect_recognises_each_format_id(void **state) {
  (void)state;
  static const char *const ids[] = {"ff-device/1", "ff-cluster/1", "ff-model/1", "ff-training/1",
                                    "ff-plan/1"};
  static const ff_format_kind kinds[] = {FF_FORMAT_DEVICE, FF_FORMAT_CLUSTER, FF_FORMAT_MODEL,
                                         FF_FORMAT_TRAINING, FF_FORMAT_PLAN};
  for (int i = 0; i < FF_FORMAT_COUNT; i++) {
    assert_string_equal(ff_format_ids[kinds[i]], ids[i]);
    char text[128];
    snprintf(text, sizeof text, "{\"name\": \"x\", \"format\": \"%s\"}", ids[i]);
    ff_diag d;
    assert_int_equal(detect(text, &d), kinds[i]);
    assert_int_equal(d.errors, 0);
    ff_diag_free(&d);
  }
}

static void format_detect_rejects_unknown_and_other_version_ids(void **state) {
  (void)state;
  static const struct {
    const char *text, *want;
  } cases[] = {
      {"{\"format\": \"ff-device/2\"}",
       "f.json: format: \"ff-device/2\" is not supported (this version reads ff-device/1)"},
      {"{\"format\": \"ff-cluster/0\"}",
       "f.json: format: \"ff-cluster/0\" is not supported (this version reads ff-cluster/1)"},
      {"{\"format\": \"ff-model/10\"}",
       "\"ff-model/10\" is not supported (this version reads ff-model/1)"},
      {"{\"format\": \"ff-training/1.1\"}",
       "\"ff-training/1.1\" is not supported (this version reads ff-training/1)"},
      {"{\"format\": \"ff-plan/2\"}", "\"ff-plan/2\" is not supported (this version reads ff-plan/1)"},
      {"{\"format\": \"ff-foo/1\"}",
       "f.json: format: \"ff-foo/1\" is not a known format (one of: ff-device/1, ff-cluster/1, "
       "ff-model/1, ff-training/1, ff-plan/1)"},
      {"{\"format\": \"FF-PLAN/1\"}", "\"FF-PLAN/1\" is not a known format"},
      {"{\"format\": \"ff-devices/1\"}", "\"ff-devices/1\" is not a known format"},
      {"{\"format\": \"\"}", "\"\" is not a known format"},
      {"{\"format\": 1}", "f.json: format: expected a string (one of: ff-device/1"},
      {"{\"name\": \"x\"}", "f.json: (top level): missing required key \"format\" (one of: "},
      {"[]", "f.json: (top level): expected an object with a \"format\" key, got an array"},
      {"\"ff-plan/1\"", "f.json: (top level): expected an object with a \"format\" key, got a scalar"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    ff_diag d;
    assert_int_equal(detect(cases[i].text, &d), FF_FORMAT_UNKNOWN);
    assert_int_equal(d.errors, 1);
    assert_contains(ff_diag_text(&d), cases[i].want);
    ff_diag_free(&d);
  }
}

static void loading_a_file_of_another_format_names_both_formats(void **state) {
  (void)state;
  ff_diag d;
  ff_diag_init(&d, NULL);
  ff_model m;
  assert_int_equal(ff_load_model("profiles/devices/t4.json", &d, &m), FF_ERR_INPUT);
  assert_contains(ff_diag_text(&d),
                  "profiles/devices/t4.json: format: this is a ff-device/1 file, expected "
                  "ff-model/1");
  ff_diag_free(&d);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(device_reads_and_writes_back_byte_identical),
      cmocka_unit_test(cluster_reads_and_writes_back_byte_identical),
      cmocka_unit_test(model_reads_and_writes_back_byte_identical),
      cmocka_unit_test(training_reads_and_writes_back_byte_identical),
      cmocka_unit_test(plan_inputs_given_as_paths_are_read_and_written_inline),
      cmocka_unit_test(plan_inputs_given_inline_are_read),
      cmocka_unit_test(plan_writer_inlines_device_types_and_adds_digests_of_each_input),
      cmocka_unit_test(model_defaults_are_filled_and_written),
      cmocka_unit_test(training_defaults_are_filled_and_written),
      cmocka_unit_test(min_lr_defaults_to_a_tenth_of_the_given_lr),
      cmocka_unit_test(device_runtime_reserve_defaults_to_one_gib),
      cmocka_unit_test(cluster_device_types_may_be_inline_objects_or_paths),
      cmocka_unit_test(node_link_is_override_then_group_then_default_and_symmetric),
      cmocka_unit_test(find_node_resolves_every_name_of_a_thousand_node_cluster),
      cmocka_unit_test(llama_2_parameter_counts_match_the_published_sizes),
      cmocka_unit_test(a_plan_of_one_rank_is_accepted),
      cmocka_unit_test(stages_of_one_layer_and_tp_groups_of_one_gpu_are_accepted),
      cmocka_unit_test(one_head_per_rank_is_accepted),
      cmocka_unit_test(gqa_kv_heads_shared_by_two_ranks_are_replicated_and_accepted),
      cmocka_unit_test(a_last_stage_with_no_layers_holding_only_the_lm_head_is_accepted),
      cmocka_unit_test(a_batch_of_one_sequence_is_accepted),
      cmocka_unit_test(two_pipelines_splitting_the_global_batch_are_accepted),
      cmocka_unit_test(reading_path_inputs_restores_the_callers_file_name),
      cmocka_unit_test(format_detect_recognises_each_format_id),
      cmocka_unit_test(format_detect_rejects_unknown_and_other_version_ids),
      cmocka_unit_test(loading_a_file_of_another_format_names_both_formats),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
