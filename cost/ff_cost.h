/* ff_cost.h — the cost model: FLOPs, memory, time and communication of a plan's pieces, and the
 * pipeline simulator that turns them into an iteration time. One model serves the planner (to
 * choose), `ffplan simulate` (to explain) and `ffrun` (to print predictions beside measurements).
 * Every formula and its source is in docs/cost-model.md. Units: FLOPs, bytes, seconds. */
#ifndef FF_COST_H
#define FF_COST_H

#include <stdbool.h>
#include <stdint.h>

#include "ff_format.h"

/* Calibration defaults used when a device profile has no measurements (docs/cost-model.md). */
#define FF_COST_GEMM_EFFICIENCY 0.8   /* achieved / dense peak for large GEMMs */
#define FF_COST_MEMORY_EFFICIENCY 0.8 /* achieved / datasheet memory bandwidth */
/* Flash-style attention kernels (ffrun's tensor and fused ones): achieved / peak of the math
 * they run on, forward and backward, counting the FLOPs they do (FlashAttention-2's range). */
#define FF_COST_FLASH_EFFICIENCY_FWD 0.5
#define FF_COST_FLASH_EFFICIENCY_BWD 0.4
/* Floats of one score buffer of ffrun's GEMM attention (kernels/cuda/ff_attention_gemm_cuda.cu) */
#define FF_COST_GEMM_ATTENTION_SCORES 67108864.0
#define FF_GIB 1073741824.0

/* ---- FLOPs (Narayanan et al. SC'21, generalised to GQA and SwiGLU) ----------------------- */

/* Weights in one layer's matrix multiplications (q, k, v, o, gate, up, down). */
double ff_flops_layer_matmul_params(const ff_model *m);
/* Forward FLOPs of one layer for a micro-batch of b sequences: 2·b·s·P_matmul + 4·b·s²·h. */
double ff_flops_layer_forward(const ff_model *m, double b);
/* Extra forward work recomputed in backward: none 0, selective the attention core 4·b·s²·h,
 * full the whole forward. */
double ff_flops_layer_recompute(const ff_model *m, double b, ff_recompute rc);
/* LM head forward: 2·b·s·h·V. */
double ff_flops_head_forward(const ff_model *m, double b);
/* Model FLOPs per token (PaLM): 6·N + 12·l·h·s, N = parameters that take part in matmuls
 * (every layer weight and the LM head; not the input embedding lookup). */
double ff_flops_model_per_token(const ff_model *m);
/* The same for a GPT-style model given by shape: per sequence 72·s·l·h²·(1 + s/(6h) + V/(12lh))
 * (Narayanan et al., eq. 3); used for the published MFU checks. */
double ff_flops_gpt_per_sequence(double s, double l, double h, double V);

/* ---- memory (Korthikanti et al. MLSys'23, Table 2) --------------------------------------- */

/* Activation bytes of one transformer layer for micro-batch b, TP degree t (may be fractional
 * for an uneven shard: t = 1/share), a heads. `sequence_parallel` as in the paper. */
double ff_mem_activation_layer_bytes(double s, double b, double h, double a, double t,
                                     bool sequence_parallel, ff_recompute rc);
/* Korthikanti et al.'s factor for the first stage of an interleaved 1F1B schedule with v model
 * chunks per device: 1 + (p−1)/(p·v) when v > 1, else 1 (it holds p micro-batches of l/p
 * layers, i.e. l layers' worth). */
double ff_mem_interleave_factor(int p, int v);
/* Hardware FLOPs per sequence of a GPT-style model with selective recomputation as Korthikanti
 * et al. count them: 72·s·l·h²·(1 + s/(3h) + V/(12lh)). */
double ff_flops_gpt_selective_hardware_per_sequence(double s, double l, double h, double V);
/* Bytes per parameter of weights + gradients + master weights + Adam moments as ffrun holds
 * them: bf16 18 (the bf16 copy the matmuls read, fp32 master weights, gradients and two
 * moments), fp32 16 (weights, gradients, moments). With ZeRO-1 over d ranks, which ffrun does
 * not run, the master and moments are sharded: bf16 6 + 12/d, fp32 8 + 8/d. */
double ff_mem_bytes_per_param(ff_precision p, bool zero1, int dp);

typedef enum ff_mem_item {
  FF_MEM_WEIGHTS,      /* the weights the matmuls read: bf16, or fp32 (the master copy too) */
  FF_MEM_GRADIENTS,    /* fp32 gradients */
  FF_MEM_MASTER,       /* fp32 master weights (bf16 only) */
  FF_MEM_OPTIMIZER,    /* Adam first and second moments */
  FF_MEM_ACTIVATIONS,  /* kept activations × micro-batches in flight, and the stage's buffers */
  FF_MEM_LOGITS,       /* fp32 logits of one micro-batch on the LM-head stage */
  FF_MEM_RESERVE,      /* the device's runtime reserve */
  FF_MEM_COUNT
} ff_mem_item;
extern const char *const ff_mem_item_names[FF_MEM_COUNT];

/* ---- time and communication (α–β) ------------------------------------------------------- */

/* Seconds for C(m×n) = A(m×k)·B(k×n) on dev in the given precision: the larger of FLOPs over
 * achieved peak (measured efficiency of the nearest measured shape, else the default) and
 * operand bytes over memory bandwidth. */
double ff_time_gemm(const ff_device *dev, ff_precision prec, double m, double n, double k);
/* Seconds to stream `bytes` through device memory. */
double ff_time_memory(const ff_device *dev, double bytes);
/* Dense peak FLOP/s of dev for a training precision (bf16 falls back to fp16 without bf16). */
double ff_peak_flops(const ff_device *dev, ff_precision prec);

double ff_comm_p2p(double bytes, ff_link link);
/* Ring all-reduce of `bytes` over n ranks whose slowest ring link is `link`:
 * 2(n−1)·α + 2(n−1)/n · bytes/β. */
double ff_comm_allreduce_ring(int n, double bytes, ff_link link);
/* Link between two GPUs of a cluster: the island link inside an island, the node's intra link
 * between islands of a node, the network link between nodes. */
ff_link ff_cluster_gpu_link(const ff_cluster *c, int node_a, int gpu_a, int node_b, int gpu_b);
/* All-reduce over GPUs (node[i], gpu[i]): the cheaper of a flat ring over the slowest link it
 * crosses and a hierarchical one (reduce-scatter in each node, ring across nodes over the
 * slowest inter-node link, all-gather in each node). */
double ff_comm_allreduce(const ff_cluster *c, int n, const int *node, const int *gpu,
                         double bytes);
/* The network link from node a to node b as one of flows_a concurrent flows leaving a and
 * flows_b entering b: each node's NICs (nics × nic_bandwidth, or × the link's bandwidth when
 * the node gives none) are shared evenly; never faster than the link. */
ff_link ff_cluster_shared_link(const ff_cluster *c, ff_link link, int node_a, int node_b,
                               int flows_a, int flows_b);
/* ff_comm_allreduce where every network link a member crosses is shared as above; flows[x] is
 * the number of concurrent flows on node x (NULL: links not shared). */
double ff_comm_allreduce_shared(const ff_cluster *c, int n, const int *node, const int *gpu,
                                double bytes, const int *flows);
/* A stage boundary from a group of n_a ranks to one of n_b, as ffrun moves a tensor of `bytes`
 * (cost-model.md §5.6): each element crosses once, in pieces from the sender whose 1/n_a holds
 * it to the receiver whose 1/n_b does. ff_boundary_flows: the pieces, n_a + n_b − gcd(n_a, n_b).
 * ff_comm_boundary: the transfer over `link` (already shared at the NICs when the groups are on
 * different nodes, `cross`): the largest piece, bytes / max(n_a, n_b), between nodes; inside a
 * node every sender sends its 1/n_a and every receiver takes in its 1/n_b over its own link.
 * ff_comm_gather: the receiving group then gathers its parts, one broadcast of bytes/n per
 * member over the group's slowest ring link: n·α + bytes/β (0 for one rank); only the receiving
 * stage waits for it (ff_stage_eval's gather_*_seconds). */
int ff_boundary_flows(int n_a, int n_b);
double ff_comm_boundary(double bytes, int n_a, int n_b, bool cross, ff_link link);
double ff_comm_gather(const ff_cluster *c, int n, const int *node, const int *gpu, double bytes);
/* ff_comm_gather over the n GPUs first_gpu, first_gpu + 1, ... of one node. */
double ff_comm_gather_node(const ff_cluster *c, int node, int first_gpu, int n, double bytes);

/* ---- one layer of one rank's shard ------------------------------------------------------- */

typedef struct ff_shard {
  double heads, kv_heads, ffn, vocab; /* how many of each this rank holds */
} ff_shard;

typedef struct ff_layer_time {
  double fwd, bwd;       /* compute, per micro-batch */
  double recompute;      /* forward work repeated in backward */
  double tp_fwd, tp_bwd; /* TP all-reduces (2 forward; 2 backward, 4 with full recompute) */
} ff_layer_time;

/* Parameters of one layer held by a rank with this shard (norm weights replicated). */
double ff_cost_layer_params(const ff_model *m, ff_shard sh);
/* The kernel that runs attention for this setting and precision: auto is tensor under bf16 and
 * fused under fp32; tensor under fp32 runs fused (it needs bf16 math). */
ff_attention ff_cost_attention_kernel(ff_attention a, ff_precision prec);
/* The attention core (scores, softmax, weighted values) of a rank's shard for b sequences, as
 * kernel `a` runs it: forward and backward seconds (the backward recomputes the probabilities
 * in every kernel). */
typedef struct ff_attention_time {
  double fwd, bwd;
} ff_attention_time;
ff_attention_time ff_cost_attention_time(const ff_model *m, ff_precision prec, ff_attention a,
                                         const ff_device *dev, double heads, double kv_heads,
                                         double b);
/* One layer of a rank's shard for a micro-batch of b sequences in a TP group of `tp` ranks;
 * tp_allreduce is the time of one all-reduce of b·s·h activations over that group. A measured
 * layer time in the device profile for this model, precision, micro-batch size and TP degree
 * takes precedence (it includes the TP communication it incurred). */
ff_layer_time ff_cost_layer_time(const ff_model *m, ff_precision prec, ff_attention attn,
                                 const ff_device *dev, ff_shard sh, double b, int tp,
                                 ff_recompute rc, double tp_allreduce);

/* ---- the embedding and the LM head of a rank's shard (cost-model.md §3.3) --------------- */

/* Bytes per activation element on the wire (TP all-reduces, stage boundaries), training.wire:
 * 4 for fp32, what ffrun sends under every precision (its activations stay fp32 between kernels,
 * which lets every plan train exactly as one rank does); 2 for bf16 (frameworks that send them
 * in the training precision). */
double ff_cost_wire_bytes(const ff_training *t);

/* The embedding's or the LM head's work on one rank per micro-batch of b sequences: compute
 * seconds, and the TP all-reduces it issues when its group has more than one rank: `ar` of
 * b·s·h wire elements, `ar_small` of b·s floats (the loss's row statistics). ffrun runs the
 * head's backward inside its forward (the loss is known there), so its head has no backward. */
typedef struct ff_end_time {
  double fwd, bwd;
  int ar_fwd, ar_bwd, ar_small_fwd, ar_small_bwd;
} ff_end_time;
ff_end_time ff_cost_embedding_time(const ff_model *m, const ff_training *t, const ff_device *dev,
                                   double b);
ff_end_time ff_cost_head_time(const ff_model *m, const ff_training *t, const ff_device *dev,
                              ff_shard sh, double b);
/* The seconds of an end's TP all-reduces, given one all-reduce of b·s·h wire elements (ar) and
 * one of b·s floats (ar_small) over its group. */
double ff_cost_end_tp_fwd(ff_end_time e, double ar, double ar_small);
double ff_cost_end_tp_bwd(ff_end_time e, double ar, double ar_small);

/* ---- activation memory as ffrun allocates it (executor/model.c) -------------------------- */

/* Bytes one layer keeps for its backward per micro-batch of b sequences in flight, for a rank
 * with shard sh: with none or selective recompute (the same here: the attention never stores
 * its s×s scores) every tensor the backward reads, s·b·(4h + 2·a_r·d + 2·k_r·d + 3·f_r) values
 * of 2 (bf16) or 4 (fp32) bytes and s·b·(2 + a_r) fp32 row statistics; with full recompute the
 * layer's input alone, s·b·h values. */
double ff_mem_layer_kept_bytes(const ff_model *m, ff_shard sh, double b, ff_precision prec,
                               ff_recompute rc);
/* Bytes of a stage's buffers that do not grow with its layers: the work set a layer is computed
 * in (bf16 or full recompute, when the stage has layers), per micro-batch in flight its output
 * and output gradient and tokens, the final norm's and loss's rows, the backward's temporaries
 * and (bf16, with layers) the widest matmul output gradient in bf16. The logits are apart
 * (ff_mem_logits_bytes). */
double ff_mem_stage_buffer_bytes(const ff_model *m, ff_shard sh, double b, ff_precision prec,
                                 ff_recompute rc, bool has_layers, double in_flight);
/* fp32 logits of one micro-batch over the rank's vocabulary shard, on the LM-head stage, and
 * under bf16 the head's bf16 operands: the final norm's output and the logits' gradient. */
double ff_mem_logits_bytes(const ff_model *m, ff_shard sh, double b, ff_precision prec);

/* ---- the pipeline simulator ------------------------------------------------------------- */

/* How a stage's transfers to its neighbours run (docs/executor.md, "Stage boundaries"):
 * PAIRED, as ffrun's NCCL path runs them: an exchange between two operations is one batch whose
 * transfers start when both of their ends have reached them and hold both stages until done.
 * OVERLAPPED, as its MPI path (CPU ranks) runs them: sends leave without holding the sender; each
 * receive is posted when the buffer it fills comes free (two buffers per direction: the receive
 * of micro-batch j is posted when the operation that used j − 2 ends, or as the step begins),
 * travels once it is both sent and posted and the link (one transfer at a time per boundary and
 * direction) is free, and holds only the receiver, until it has arrived. */
typedef enum ff_transfers { FF_TRANSFERS_PAIRED, FF_TRANSFERS_OVERLAPPED } ff_transfers;

/* Event simulation of one pipeline of p stages and m micro-batches as ffrun runs it (cost/ff_sim.c,
 * docs/cost-model.md §6): 1F1B (Narayanan et al. SC'21; warm-up min(p−i−1, m) forwards on stage
 * i) or GPipe (all forwards, then all backwards), with the stage transfers between two operations
 * run as `transfers` says. fwd[i], bwd[i]: seconds per micro-batch on stage i; send_fwd[i],
 * send_bwd[i]: seconds to move activations / gradients across boundary i→i+1 (p−1 entries, may
 * be NULL for none). Returns the pipeline's makespan (−1 when out of memory); optional outputs:
 * finish[i] (when stage i ends its last operation), busy[i] (compute seconds), and peak[i] (most
 * micro-batches whose activations stage i holds at once). */
double ff_sim_pipeline(ff_schedule schedule, ff_transfers transfers, int p, int64_t m,
                       const double *fwd, const double *bwd, const double *send_fwd,
                       const double *send_bwd, double *finish, double *busy, int64_t *peak);
/* Called for each forward or backward, in the order the simulation runs them. */
typedef void (*ff_sim_observer)(void *ctx, int stage, int64_t micro_batch, bool backward,
                                double start, double end);
/* ff_sim_pipeline, telling observe (when not NULL) each operation's start and end. */
double ff_sim_pipeline_observed(ff_schedule schedule, ff_transfers transfers, int p, int64_t m,
                                const double *fwd, const double *bwd, const double *send_fwd,
                                const double *send_bwd, double *finish, double *busy,
                                int64_t *peak, ff_sim_observer observe, void *ctx);
/* (m−1)·max tᵢ + Σ tᵢ with tᵢ = fwd[i] + bwd[i]: exact for equal stages, an upper bound for
 * 1F1B otherwise; the planner's linear surrogate. */
double ff_sim_closed_form(int p, int64_t m, const double *fwd, const double *bwd);
/* GPipe without transfers, exactly: Σf + (m−1)·max f + Σb + (m−1)·max b. */
double ff_sim_gpipe_closed_form(int p, int64_t m, const double *fwd, const double *bwd);
/* Micro-batches stage i of p holds at its peak: 1F1B min(p−i, m), GPipe m. */
int64_t ff_sim_in_flight(ff_schedule schedule, int p, int i, int64_t m);

/* ---- evaluating a plan ------------------------------------------------------------------ */

typedef struct ff_rank_eval {
  double memory_bytes[FF_MEM_COUNT];
  double memory_total_bytes, capacity_bytes;
  double params;                    /* parameters this rank holds */
  double fwd_seconds, bwd_seconds;  /* per micro-batch: compute and TP communication */
  double compute_fwd_seconds, compute_bwd_seconds, recompute_seconds, tp_seconds;
  double dp_seconds, optimizer_seconds;
} ff_rank_eval;

typedef struct ff_stage_eval {
  double fwd_seconds, bwd_seconds;  /* per micro-batch: the slowest rank of the TP group */
  double send_fwd_seconds, send_bwd_seconds; /* to the next stage, per micro-batch */
  /* per micro-batch: the stage's gather of an arriving activation (0 on the first stage) and of
   * an arriving gradient (0 on the last), which only the receiving stage waits for (§5.6) */
  double gather_fwd_seconds, gather_bwd_seconds;
  double finish_seconds, busy_seconds, bubble_seconds;
  double dp_seconds;                /* gradient all-reduce across pipelines after the stage ends */
  double hardware_flops;            /* per iteration, recompute included */
  int64_t in_flight;
  int slowest_rank;                 /* index in the stage's ranks */
  int binding;                      /* 0 compute, 1 memory (does not fit), 2 link */
} ff_stage_eval;

typedef struct ff_pipeline_eval {
  double seconds;    /* the pipeline's makespan */
  double end_seconds; /* makespan + the DP synchronisation that is not hidden */
  double bubble_seconds;
  ff_stage_eval *stages;
} ff_pipeline_eval;

typedef struct ff_plan_eval {
  ff_transfers transfers; /* overlapped when a rank is on a CPU device (ffrun's MPI path) */
  double iteration_seconds, tokens_per_second, mfu, hfu;
  double model_flops_per_iteration, hardware_flops_per_iteration, peak_flops_sum;
  double pipeline_seconds, dp_exposed_seconds, optimizer_seconds;
  double compute_seconds, tp_seconds, pp_seconds, dp_seconds, bubble_seconds;
  double peak_memory_bytes;
  int critical_pipeline, critical_stage;
  double critical_margin_seconds; /* how much slower the critical pipeline is than the next */
  bool fits;
  int64_t ranks_over_memory;
  ff_pipeline_eval *pipelines;
  ff_rank_eval *ranks; /* by global rank */
  ff_span *rank_layers; /* each rank's layer range, by global rank */
  int n_pipelines;
  int64_t n_ranks;
} ff_plan_eval;

/* How ffrun will run the plan's stage transfers: overlapped (its MPI path) when a rank is on a
 * device of kind cpu, else paired (NCCL, every rank on a GPU). */
ff_transfers ff_plan_transfers(const ff_plan *plan);
/* Evaluate a plan: per-rank memory and time, per-stage times, 1F1B (or GPipe) simulation of each
 * pipeline, DP synchronisation, optimizer step, MFU and HFU. */
ff_status ff_evaluate_plan(const ff_plan *plan, ff_plan_eval *out);
void ff_plan_eval_free(ff_plan_eval *e);
/* A stage's stage-boundary time per micro-batch: its two transfers with the next stage and its
 * two gathers. */
double ff_stage_p2p_seconds(const ff_stage_eval *se);
/* The simulator's inputs for the n stages of pe in buf (4·n): forward and backward per
 * micro-batch, each after the gather of what it consumes, then send_fwd and send_bwd. */
void ff_stage_sim_inputs(const ff_pipeline_eval *pe, int n, double *buf);
/* Write the evaluation's figures into the plan's `predicted` fields. */
void ff_plan_set_predicted(ff_plan *plan, const ff_plan_eval *e);

#endif
