/* ff_format.h — the data of our five file formats (docs/formats.md) and their readers/writers.
 *
 * Each format has: a struct; ff_X_from_json (read and check a parsed JSON value, reporting every
 * problem to a diagnostics context with its JSON path); ff_X_to_json (the canonical cJSON tree,
 * keys in documented order, defaults written); and ff_X_free. ff_load_* read a file by name and
 * resolve relative references (a cluster's device files, a hand-written plan's inputs) against
 * that file's directory. Readers never keep a partially checked object: on error the output is
 * freed and FF_ERR_INPUT returned. Nothing here knows about planners or executors. */
#ifndef FF_FORMAT_H
#define FF_FORMAT_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>

#include "ff_diag.h"
#include "ff_json.h"
#include "ff_status.h"

#define FF_NAME_MAX 64
typedef char ff_name[FF_NAME_MAX + 1];

typedef enum ff_format_kind {
  FF_FORMAT_UNKNOWN = -1,
  FF_FORMAT_DEVICE,
  FF_FORMAT_CLUSTER,
  FF_FORMAT_MODEL,
  FF_FORMAT_TRAINING,
  FF_FORMAT_PLAN,
  FF_FORMAT_COUNT
} ff_format_kind;

extern const char *const ff_format_ids[FF_FORMAT_COUNT]; /* "ff-device/1", ... */

typedef enum ff_dtype { FF_DTYPE_BF16, FF_DTYPE_FP16, FF_DTYPE_TF32, FF_DTYPE_FP32, FF_DTYPE_COUNT } ff_dtype;
typedef enum ff_precision { FF_PRECISION_BF16, FF_PRECISION_FP32 } ff_precision;
typedef enum ff_recompute {
  FF_RECOMPUTE_NONE,
  FF_RECOMPUTE_SELECTIVE,
  FF_RECOMPUTE_FULL,
  FF_RECOMPUTE_AUTO /* training settings only: the planner chooses per stage */
} ff_recompute;
typedef enum ff_schedule { FF_SCHEDULE_1F1B, FF_SCHEDULE_GPIPE } ff_schedule;
/* The attention kernel a GPU rank runs (docs/executor.md): auto is tensor under bf16 and fused
 * under fp32; tensor is flash-style on bf16 tensor cores (fused where it cannot run); fused is
 * flash-style in fp32 on CUDA cores; gemm is cuBLAS with the scores materialised. megatron is
 * no kernel of ffrun's: it describes Megatron-LM's default core attention, so that `ffplan
 * simulate` can predict runs of that framework (ffrun refuses such a plan). */
typedef enum ff_attention {
  FF_ATTENTION_AUTO,
  FF_ATTENTION_TENSOR,
  FF_ATTENTION_FUSED,
  FF_ATTENTION_GEMM,
  FF_ATTENTION_MEGATRON
} ff_attention;
/* The element activations and their gradients cross links in (TP all-reduces, stage boundaries):
 * fp32 is what ffrun sends under every precision; bf16 describes frameworks that send them in
 * the training precision (Megatron-LM, torchtitan), for `ffplan simulate` (ffrun refuses it). */
typedef enum ff_wire { FF_WIRE_FP32, FF_WIRE_BF16 } ff_wire;
typedef enum ff_decay { FF_DECAY_COSINE, FF_DECAY_LINEAR, FF_DECAY_CONSTANT } ff_decay;

extern const char *const ff_dtype_names[];      /* NULL-terminated */
extern const char *const ff_precision_names[];
extern const char *const ff_device_kind_names[]; /* "gpu", "cpu" */
extern const char *const ff_recompute_names[];
extern const char *const ff_schedule_names[];
extern const char *const ff_attention_names[];
extern const char *const ff_wire_names[];
extern const char *const ff_decay_names[];

/* ---- ff-device/1 ------------------------------------------------------------------------ */

typedef struct ff_gemm_measure {
  ff_dtype dtype;
  int64_t m, n, k;
  double tflops;
} ff_gemm_measure;

typedef struct ff_layer_measure {
  ff_name model;
  ff_precision precision;
  int64_t micro_batch_size, tp;
  double forward_ms, backward_ms;
} ff_layer_measure;

typedef struct ff_device {
  ff_name name;
  char *vendor, *architecture, *source; /* NULL when absent (source is required on read) */
  double memory_gib;
  double memory_bandwidth_gb_per_s;
  double peak_tflops[FF_DTYPE_COUNT]; /* 0: the device has no such unit */
  double runtime_reserve_gib;
  double emulated_slowdown; /* ≥ 1 on an emulated device (tests and demos), else 0 (absent) */
  bool cpu; /* "kind": "cpu": ranks train on the CPU backend and talk over MPI */
  bool has_measured;
  double measured_memory_gb_per_s; /* achieved streaming bandwidth, 0 when not measured */
  char *measured_source;           /* where the measurements come from, or NULL */
  ff_gemm_measure *gemm;
  int n_gemm;
  ff_layer_measure *layers;
  int n_layers;
  char *ref; /* the path a cluster named it by, kept so the cluster writes it back; or NULL */
} ff_device;

/* ---- ff-cluster/1 ----------------------------------------------------------------------- */

typedef struct ff_link {
  double bandwidth_gb_per_s;
  double latency_us;
} ff_link;

typedef struct ff_node {
  ff_name name;
  int device; /* index into ff_cluster.devices */
  int gpus, island_gpus;
  ff_link island; /* when island_gpus > 1 */
  ff_link intra;  /* when island_gpus < gpus */
  int group;      /* index into ff_cluster.groups, or -1 */
  int nics;       /* network interfaces the node's traffic leaving it shares (default 1) */
  double nic_bandwidth_gb_per_s; /* per NIC, per direction; 0: each runs at the link used */
} ff_node;

typedef struct ff_net_group {
  ff_name name;
  int *nodes;
  int n_nodes;
  ff_link link;
} ff_net_group;

typedef struct ff_net_override {
  int node_a, node_b;
  ff_link link;
} ff_net_override;

typedef struct ff_cluster {
  ff_name name;
  char *description;
  ff_device *devices;
  int n_devices;
  ff_node *nodes;
  int n_nodes;
  int *node_by_name; /* node indices sorted by name, for lookup */
  bool has_network;
  ff_link net_default;
  ff_net_group *groups;
  int n_groups;
  ff_net_override *overrides;
  int n_overrides;
  int64_t total_gpus;
} ff_cluster;

/* ---- ff-model/1 ------------------------------------------------------------------------- */

typedef struct ff_model {
  ff_name name;
  int64_t layers, hidden, heads, kv_heads, ffn_hidden, vocab, seq_len;
  double norm_eps, rope_theta;
  bool tied_embeddings;
  char *source;
} ff_model;

/* ---- ff-training/1 ---------------------------------------------------------------------- */

#define FF_MAX_MICRO_BATCH_SIZES 16

typedef struct ff_training {
  ff_name name;
  int64_t global_batch;
  int64_t micro_batch_sizes[FF_MAX_MICRO_BATCH_SIZES];
  int n_micro_batch_sizes;
  ff_precision precision;
  ff_recompute recompute;
  bool zero1;
  ff_schedule schedule;
  ff_attention attention;
  ff_wire wire;
  int64_t steps, seed;
  double lr, beta1, beta2, eps, weight_decay, grad_clip;
  int64_t warmup_steps;
  ff_decay decay;
  double min_lr;
} ff_training;

/* ---- ff-plan/1 -------------------------------------------------------------------------- */

typedef struct ff_span {
  int64_t first, end; /* [first, end) */
} ff_span;

/* Optional predicted figures: a fixed key table per level, each value present or not. */
enum { FF_PRED_MAX = 12 };
typedef struct ff_predicted {
  double value[FF_PRED_MAX];
  bool has[FF_PRED_MAX];
} ff_predicted;

enum { FF_PLAN_PRED_ITERATION_SECONDS, FF_PLAN_PRED_TOKENS_PER_SECOND, FF_PLAN_PRED_MFU,
       FF_PLAN_PRED_HFU, FF_PLAN_PRED_PEAK_MEMORY_GIB, FF_PLAN_PRED_COMPUTE_SECONDS,
       FF_PLAN_PRED_TP_SECONDS, FF_PLAN_PRED_PP_SECONDS, FF_PLAN_PRED_DP_SECONDS,
       FF_PLAN_PRED_BUBBLE_SECONDS, FF_PLAN_PRED_OPTIMIZER_SECONDS, FF_PLAN_PRED_COUNT };
enum { FF_PIPE_PRED_SECONDS, FF_PIPE_PRED_BUBBLE_SECONDS, FF_PIPE_PRED_COUNT };
enum { FF_STAGE_PRED_FORWARD_SECONDS, FF_STAGE_PRED_BACKWARD_SECONDS, FF_STAGE_PRED_MEMORY_GIB,
       FF_STAGE_PRED_COUNT };

typedef struct ff_plan_rank {
  int64_t rank;
  int node;   /* index into the plan's cluster nodes */
  int gpu;
  int device; /* index into the plan's cluster devices */
  ff_span heads, kv_heads, ffn, vocab; /* vocab only on embedding / LM-head stages */
  bool has_memory;
  double memory_gib;
} ff_plan_rank;

typedef struct ff_plan_stage {
  ff_span layers;
  bool embedding, lm_head;
  ff_recompute recompute;
  ff_plan_rank *ranks;
  int n_ranks;
  ff_predicted predicted;
} ff_plan_stage;

typedef struct ff_plan_pipeline {
  int64_t batch, micro_batch_size, micro_batches;
  ff_plan_stage *stages;
  int n_stages;
  ff_predicted predicted;
} ff_plan_pipeline;

typedef struct ff_runner_up {
  double iteration_seconds;
  char *summary;
} ff_runner_up;

/* Whether the integer program was on the path to the plan (docs/formats.md, search.origin). */
typedef enum ff_plan_ilp {
  FF_PLAN_ILP_OFF,      /* "off": not tried (--without ilp, a baseline) */
  FF_PLAN_ILP_NOT_RUN,  /* "not run": the program was too large to build */
  FF_PLAN_ILP_NO_GAIN,  /* "no gain": it ran; the local moves alone did as well */
  FF_PLAN_ILP_IMPROVED, /* "improved": the plan comes from its solution */
  FF_PLAN_ILP_COUNT
} ff_plan_ilp;
extern const char *const ff_plan_ilp_names[FF_PLAN_ILP_COUNT + 1];

typedef struct ff_plan_search {
  char *planner;
  bool has_origin; /* which start and refinement produced the plan */
  char *layout, *node_order;
  ff_plan_ilp ilp;
  int64_t local_moves;
  bool has_candidates;
  int64_t candidates;
  bool has_lower_bound, has_gap;
  double lower_bound_seconds, gap;
  ff_runner_up *runner_ups;
  int n_runner_ups;
} ff_plan_search;

typedef struct ff_plan {
  bool has_name;
  ff_name name;
  ff_model model;
  ff_training training;
  ff_cluster cluster;
  ff_plan_pipeline *pipelines;
  int n_pipelines;
  int64_t n_ranks;
  ff_predicted predicted;
  bool has_search;
  ff_plan_search search;
} ff_plan;

/* ---- functions -------------------------------------------------------------------------- */

/* Which format a parsed file declares; reports a missing, unknown or unsupported "format". */
ff_format_kind ff_format_detect(const cJSON *root, ff_diag *d);

/* base_dir resolves relative paths inside the value (NULL: the current directory).
 * `inline_ok` lets the "format" key be absent (objects nested in a cluster or plan). */
ff_status ff_device_from_json(const cJSON *v, const char *path, bool inline_ok, ff_diag *d,
                              ff_device *out);
ff_status ff_cluster_from_json(const cJSON *v, const char *path, bool inline_ok,
                               const char *base_dir, ff_diag *d, ff_cluster *out);
ff_status ff_model_from_json(const cJSON *v, const char *path, bool inline_ok, ff_diag *d,
                             ff_model *out);
ff_status ff_training_from_json(const cJSON *v, const char *path, bool inline_ok, ff_diag *d,
                                ff_training *out);
ff_status ff_plan_from_json(const cJSON *v, const char *base_dir, ff_diag *d, ff_plan *out);

ff_status ff_load_device(const char *file, ff_diag *d, ff_device *out);
ff_status ff_load_cluster(const char *file, ff_diag *d, ff_cluster *out);
ff_status ff_load_model(const char *file, ff_diag *d, ff_model *out);
ff_status ff_load_training(const char *file, ff_diag *d, ff_training *out);
ff_status ff_load_plan(const char *file, ff_diag *d, ff_plan *out);

/* Canonical trees. `with_format` adds the "format" key (standalone files); `inline_devices`
 * writes a cluster's device types as objects even where they were read from paths. */
cJSON *ff_device_to_json(const ff_device *dev, bool with_format);
cJSON *ff_cluster_to_json(const ff_cluster *c, bool with_format, bool inline_devices);
cJSON *ff_model_to_json(const ff_model *m, bool with_format);
cJSON *ff_training_to_json(const ff_training *t, bool with_format);
cJSON *ff_plan_to_json(const ff_plan *p);

/* Where global rank `rank` sits in the plan: its pipeline, stage and TP index (written to the
 * non-NULL outputs); false when no rank of the plan has that number. */
bool ff_plan_find_rank(const ff_plan *plan, int64_t rank, int *pipeline, int *stage, int *tp);

void ff_device_free(ff_device *dev);
void ff_cluster_free(ff_cluster *c);
void ff_model_free(ff_model *m);
void ff_training_free(ff_training *t);
void ff_plan_free(ff_plan *p);

/* Deep copies (the copy owns its memory; free with the matching ff_*_free). */
ff_status ff_model_copy(const ff_model *src, ff_model *dst);
ff_status ff_cluster_copy(const ff_cluster *src, ff_cluster *dst);

/* Cluster queries. */
int ff_cluster_find_node(const ff_cluster *c, const char *name);   /* -1 if none */
int ff_cluster_find_device(const ff_cluster *c, const char *name); /* -1 if none */
/* The link between two distinct nodes: the pair's override, else their group's link, else the
 * default. ff_cluster_base_link is the same without the override (for callers that index the
 * overrides themselves, such as the planner's device graph). */
ff_link ff_cluster_node_link(const ff_cluster *c, int node_a, int node_b);
ff_link ff_cluster_base_link(const ff_cluster *c, int node_a, int node_b);

/* Digest of an input: "fnv1a64:" + 16 hex digits of its canonical form (without "format"). */
void ff_digest_json(const cJSON *v, char out[32]);

/* Directory part of a path ("." when none), into out. */
void ff_dirname(const char *file, char *out, size_t cap);
/* Join dir and a relative path (absolute paths are kept as they are). Caller frees. */
char *ff_path_join(const char *dir, const char *rel);

/* Canonical text of any parsed file of ours (what `ffplan fmt` writes). */
ff_status ff_canonical_text(const char *file, ff_diag *d, ff_buf *out, ff_format_kind *kind);

/* Parameters of the whole model: embedding, layers, final norm, and the LM head unless tied. */
int64_t ff_model_parameters(const ff_model *m);
/* One line describing a loaded file of any format, for `ffplan validate`. */
void ff_summary_device(const ff_device *dev, char *out, size_t cap);
void ff_summary_cluster(const ff_cluster *c, char *out, size_t cap);
void ff_summary_model(const ff_model *m, char *out, size_t cap);
void ff_summary_training(const ff_training *t, char *out, size_t cap);
void ff_summary_plan(const ff_plan *p, char *out, size_t cap);
/* Read any of our files (format from its "format" key) and describe it in one line. */
ff_status ff_validate_file(const char *file, ff_diag *d, char *summary, size_t cap);

#endif
