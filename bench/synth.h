/* synth.h — synthetic clusters and plans for benchmarks (bench/gen_cluster, bench/bench_eval).
 *
 * A synthetic cluster has N GPUs on nodes of 8 (the last node holds the remainder when N is not a
 * multiple of 8), of four device types copied inline from the shipped profiles:
 *
 *   type             node layout                           link inside the node
 *   H100-SXM5-80GB   one NVLink island of 8 (NVSwitch)     450 GB/s per direction, 2 us
 *   A100-SXM4-80GB   one NVLink island of 8 (NVSwitch)     300 GB/s per direction, 3 us
 *   L40S             no NVLink (island_gpus 1)             PCIe 4.0 via the host, 25 GB/s, 10 us
 *   RTX-4090         no NVLink (island_gpus 1)             PCIe 4.0 via the host, 20 GB/s, 10 us
 *
 * Consecutive nodes form racks of 4 (network.groups "rack-K": 200 Gbit/s InfiniBand, 25 GB/s per
 * direction, 5 us); every other pair of nodes uses the default link (100 Gbit/s Ethernet,
 * 12.5 GB/s, 20 us). The same figures as profiles/clusters/datacenter-mixed.json and flashflex-*.
 *
 * Device types are dealt evenly (round robin, so the counts differ by at most one) to nodes
 * (mix "node") or to whole racks (mix "rack") and then shuffled by a seeded generator
 * (splitmix64 + Fisher-Yates): the same N, seed and mix always give the same cluster, byte for
 * byte. Everything is built with the project's own structs, so a cluster here is exactly what
 * ff_cluster_from_json would have produced. */
#ifndef FF_BENCH_SYNTH_H
#define FF_BENCH_SYNTH_H

#include <stdint.h>

#include "ff_format.h"

#define SYNTH_GPUS_PER_NODE 8
#define SYNTH_NODES_PER_RACK 4
#define SYNTH_DEVICE_TYPES 4
#define SYNTH_MAX_GPUS ((int64_t)SYNTH_GPUS_PER_NODE << 20) /* ff-cluster/1 allows 2^20 nodes */

typedef enum synth_mix { SYNTH_MIX_NODE, SYNTH_MIX_RACK } synth_mix;
extern const char *const synth_mix_names[]; /* "node", "rack", NULL */

typedef struct synth_options {
  int64_t gpus;             /* 1 .. SYNTH_MAX_GPUS */
  uint64_t seed;
  synth_mix mix;
  const char *profiles_dir; /* holds devices/h100-sxm5.json etc.; NULL: synth_profiles_dir() */
  const char *name;         /* cluster name; NULL: "synth-N-sSEED" */
} synth_options;

/* The profiles/ directory of the source tree this program was built from. */
const char *synth_profiles_dir(void);

/* Build the cluster in memory. Problems (a missing profile, bad options) go to d; on error
 * *out is left empty. */
ff_status synth_cluster(const synth_options *opt, ff_diag *d, ff_cluster *out);

/* Write c canonically (device types inline) and read it back with the project's reader: FF_OK
 * only when the reader accepts it and reading gives the same bytes again. When text is not
 * NULL it receives the canonical text (caller frees with ff_buf_free). */
ff_status synth_cluster_check(const ff_cluster *c, ff_diag *d, ff_buf *text);

/* A plan shape: `pipelines` data-parallel replicas, each of `stages` stages whose tensor-
 * parallel group is `tp` consecutive GPUs of one node (tp must divide 8). */
typedef struct synth_shape {
  int pipelines, stages, tp;
  int64_t micro_batch_size; /* one of the training set's micro_batch_sizes */
  int64_t micro_batches;    /* per pipeline; global_batch becomes pipelines x mbs x this */
} synth_shape;

/* A valid plan over `cluster` (moved into the plan: the caller no longer frees it), with the
 * model and training settings copied from the given files. GPUs are used in order: rank r is
 * node r/8, GPU r%8, ranks numbered pipeline-major, then stage, then TP index; layers are split
 * evenly over the stages (the first stages take one more when it does not divide), heads, FFN
 * columns and vocabulary rows evenly over each TP group; embedding on stage 0, LM head on the
 * last stage, recompute "selective". training.global_batch is set to
 * pipelines x micro_batch_size x micro_batches. Every GPU of the cluster must be used. */
ff_status synth_plan(ff_cluster *cluster, const char *model_file, const char *training_file,
                     const synth_shape *shape, ff_diag *d, ff_plan *out);

/* Write plan to JSON (ff_plan_to_json + ff_json_write), parse the text and read it back with
 * ff_plan_from_json; FF_OK only when the reader accepts it and gives the same bytes. The plan
 * that was read is returned in *back (when not NULL) so callers time what the reader accepted. */
ff_status synth_plan_check(const ff_plan *plan, ff_diag *d, ff_plan *back, size_t *json_bytes);

#endif
