/* dist_internal.h — what the parts of the training loop share: the one-per-process state of a
 * rank's training (dist), the segments its gradients are summed in, and the functions one part
 * calls in another. dist.c: roles, TP hooks, setup, metrics and the loop; dist_grads.c: the
 * segments and the gradient sums; dist_stages.c: one step's schedule and the transfers between
 * stages; dist_ckpt.c: checkpoints gathered on rank 0. */
#ifndef FF_EXEC_DIST_INTERNAL_H
#define FF_EXEC_DIST_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "comm.h"
#include "data.h"
#include "ff_cost.h"
#include "model.h"
#include "train.h"

typedef struct seg {
  int desc;             /* index into the global list of logical tensors */
  int tensor;           /* my tensor index, or -1 when I do not hold the segment */
  bool cols;            /* the segment runs along columns */
  int64_t a, b;         /* its range along that dimension, logical */
  ff_group *group;      /* the holders across pipelines (NULL: I am not one, or alone) */
  float weight;         /* 1 / holders of the segment in my pipeline */
  bool norm_owner;      /* I count it in the global gradient norm (pipeline 0, lowest TP) */
  int owner;            /* world rank that sends it for checkpoints */
  int cache;            /* its group's index in the group cache (-1: no group) */
  int bucket;           /* its layer; the layer count for the final norm and LM head; -1 for
                           the embedding: gradients become final bucket by bucket, highest first */
} seg;

/* One sum started during the backward: the segments of one bucket that share one group, summed
 * in one call. Every member of the group holds all of them, so every member makes the same list,
 * and lists ordered by (bucket descending, group ascending) are started in the same order by
 * every rank. */
typedef struct dp_sum {
  int bucket, cache;
  int first, count;   /* its segments: sum_segs[first, first + count), in reverse global order */
  bool in_place;      /* back to back in every member's block: summed where they are */
  int64_t start, n;   /* in place: the range of sums_on; else: where they are packed */
  ff_request *req;    /* NULL until started in the step */
} dp_sum;

typedef struct group_cache {
  char *key;
  ff_group *group;
} group_cache;

/* The kinds of phase an emulated device times apart (the last micro-batch's backward also
 * checks and starts the gradient sums; a validation's forward has no head gradient). */
enum { FF_PHASE_FORWARD, FF_PHASE_BACKWARD, FF_PHASE_LAST_BACKWARD, FF_PHASE_OPTIMIZER,
       FF_PHASE_VALIDATION, FF_PHASE_KINDS };

typedef struct dist {
  const ff_plan *plan;
  const ff_kernels *k;
  const ff_comm_backend *c;
  const ff_train_opts *o;
  int rank, p, s, t;
  const ff_plan_pipeline *pl;
  const ff_plan_stage *st;
  int64_t first_seq;
  ff_group *world, *tp;
  ff_tp_ops tp_ops;
  ff_model_rank mr;
  ff_data data;
  ff_data val; /* --eval-data (n = 0: none) */
  int64_t val_batches;
  seg *segs;
  int n_segs;
  struct tensor_desc *tds;
  int n_tds;
  group_cache *cache; /* every holder set met, in the order every rank meets them */
  int n_cache, cap_cache;
  /* activations between stages: device to device in batches (p2p_device), or staged in host
   * memory: send_fwd, send_bwd per slot, with the requests of their transfers (and of the
   * stamps an emulated link sends after them, the times in stamp_fwd, stamp_bwd), and recv_buf:
   * two buffers per direction received (dist_stages.c), receives posted ahead into them */
  bool p2p_device;
  ff_p2p *p2p_ops;
  float *send_fwd, *send_bwd, *recv_buf;
  ff_request **req_fwd, **req_bwd; /* per slot × 2 × receivers: pieces, then stamps */
  double *stamp_fwd, *stamp_bwd;   /* per slot × receivers */
  int n_prev, n_next;
  int recv_width;                  /* max(n_prev, n_next): the senders of a direction, at most */
  ff_request **req_recv;           /* per receive buffer (4) × 2 × recv_width */
  double *stamp_recv;              /* per receive buffer × recv_width: when each piece left */
  double posted_at[4];             /* when each receive buffer's receives were posted */
  double *link_free;               /* per direction × recv_width: when each emulated link is free */
  const float *recv_ready;         /* the buffer the next forward or backward reads */
  char model_digest[32];
  FILE *metrics;
  /* seconds of the current step, by kind (compute, p2p, tp, dp, optimizer) */
  double t_compute, t_p2p, t_tp, t_dp, t_opt;
  double tp_device_seen; /* the communication backend's collective_seconds at the last look */
  double matmul_seen, attention_seen; /* the backend's op_seconds at the last report */
  ff_plan_eval eval; /* the cost model's predictions, for the metrics */
  bool have_eval;
  double throttle;   /* > 1: an emulated slower device (see ff_throttle) */
  /* The emulation counts processor time (the CPU backend): c_comm is what this step's
   * communication inside compute (TP collectives, gradient sums started in the backward) took
   * of it, so that compute is charged its own processor time only. */
  bool throttle_cpu;
  double c_comm;
  /* The least processor time each kind of phase has taken on this rank (FF_PHASE_*): the
   * emulated device takes throttle × that, a fixed speed, as a real device's is. */
  double phase_cpu[FF_PHASE_KINDS];
  /* A backend whose memory the host cannot touch (CUDA) works through host copies: tp_stage
   * for the TP collectives (page-locked, tokens × max(hidden, ...) floats), host_block for the
   * gradient sums and checkpoints (n_params floats). Both NULL on the CPU backend. */
  float *tp_stage, *host_block;
  /* The gradient sums, started bucket by bucket (a layer's tensors, the head's, the embedding's)
   * as the last micro-batch's backward finishes them, and waited for at the end of the step. They
   * work on `sums_on`: the gradient block itself when the communication backend takes its memory
   * (the CPU backend; NCCL on the GPU), else its host copy host_block. Sums whose segments are not
   * back to back there are packed into `packed` (same memory kind); packed_at[segment] is where
   * (-1: not packed). */
  bool dp_device;
  float *sums_on, *packed;
  int64_t *packed_at;
  dp_sum *sums;
  int n_sums;
  int *sum_segs;
  float *kv_full;     /* shared kv heads: a whole wk/wv gradient (memory of sums_on's kind) */
  const char *nonfinite; /* this step's first tensor whose own gradient was not finite */
  int64_t step;       /* the step being run (the NaN test hook fires on its first bucket) */
  bool first_bucket;
} dist;

typedef struct tensor_desc {
  char name[48];
  int64_t layer;  /* -1 for embedding and head tensors */
  int kind;       /* 0 layer, 1 embedding stage, 2 LM-head stage */
  int which;      /* 0 replicated, 1 rows by heads, 2 rows by kv heads, 3 cols by heads,
                     4 rows by ffn, 5 cols by ffn, 6 rows by vocab */
  int64_t extent; /* of the sharded dimension (or the vector length) */
} tensor_desc;

/* Where a segment of tensor t starts in its block, how many rows of how many floats it has, and
 * the row stride there. */
typedef struct seg_shape {
  int64_t start, rows, width, stride;
} seg_shape;

static inline double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The processor time the throttle counts (0 when it counts none: see dist.throttle_cpu). */
static inline double cpu_now(const dist *d) { return d->throttle_cpu ? ff_cpu_seconds() : 0; }

/* The processor time an emulated device is charged for a phase of this kind that took `cpu`:
 * the least any phase of the kind has taken, so that a phase slowed by other work on the
 * machine (caches, preemption) does not make the device slower by throttle × the delay. */
static inline double phase_cpu(dist *d, int kind, double cpu) {
  double *best = &d->phase_cpu[kind];
  if (!(*best > 0) || cpu < *best)
    *best = cpu;
  return *best;
}

/* dist.c */
void ff_dist_device_tp(dist *d);
/* block (backend memory) readable by the host: itself on the CPU, else copied to host_block */
float *ff_dist_host_block_get(dist *d, float *block);

/* dist_grads.c */
ff_status ff_dist_build_segments(dist *d);
ff_status ff_dist_setup_sums(dist *d);
/* Wait for the step's sums and return this rank's share of the squared gradient norm. */
double ff_dist_finish_gradients(dist *d);
/* A segment of a tensor between its place in a block and a packed buffer (out: to the buffer);
 * returns its floats. */
int64_t ff_dist_pack(const ff_tensor *t, const seg *sg, float *base, float *buf, bool out);
int64_t ff_dist_seg_pack(const dist *d, const seg *sg, float *base, float *buf, bool out);

/* dist_stages.c */
/* The floats of an activation crossing a stage boundary (one micro-batch). */
int64_t ff_dist_boundary_floats(const dist *d);
/* One optimizer step; returns the loss (see there). */
double ff_dist_train_step(dist *d, int64_t step, double *norm_out, double *lr_out, int *bad);
/* Validation: the forwards of global batches 0 .. batches − 1 of d->val through the plan, as
 * training runs them but without gradients; returns the mean token loss (on every rank). */
double ff_dist_validate(dist *d, int64_t batches);

/* dist_ckpt.c */
ff_status ff_dist_save(dist *d, int64_t step, float *buf, float *whole);
ff_status ff_dist_resume(dist *d, int64_t *done);
/* Every rank takes its slices of a Hugging Face Llama directory's weights (--init-from). */
ff_status ff_dist_init_from(dist *d);

#endif
