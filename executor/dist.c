/* dist.c — training a plan of several ranks under MPI: every rank finds its role (pipeline,
 * stage, TP index), builds its shard of the model, runs its stage's 1F1B (or GPipe) order of
 * forwards and backwards, exchanges activations and their gradients with the neighbouring
 * stages, and joins the gradient sums its parameters take part in.
 *
 * Groups come from the plan, not from formulas. A stage's TP group is its ranks. Data
 * parallelism is per element of every logical tensor: the elements are cut into segments at
 * every shard boundary of every pipeline, and each segment is summed over the ranks that hold it
 * — so pipelines that split a layer differently (other stage, other TP degree, other head or FFN
 * split) still sum exactly the same logical gradient. Ranks that hold the same element inside
 * one pipeline (replicated norm weights, a kv head shared by two ranks' query heads) have equal
 * copies by then, so each contributes 1/k of its copy. Every rank walks the same global list of
 * segments, so collectives are issued in the same order everywhere by construction. */
#define _POSIX_C_SOURCE 200809L
#include "dist.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "checkpoint.h"
#include "comm.h"
#include "data.h"
#include "ff_cost.h"
#include "model.h"
#include "signals.h"

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
  seg *segs;
  int n_segs;
  struct tensor_desc *tds;
  int n_tds;
  group_cache *cache; /* every holder set met, in the order every rank meets them */
  int n_cache, cap_cache;
  /* activations between stages: device to device in batches (p2p_device), or staged in host
   * memory: send_fwd, send_bwd per slot, the request of each of their transfers, recv_buf */
  bool p2p_device;
  ff_p2p *p2p_ops;
  float *send_fwd, *send_bwd, *recv_buf;
  ff_request **req_fwd, **req_bwd; /* per slot × receivers */
  int n_prev, n_next;
  char model_digest[32];
  FILE *metrics;
  /* seconds of the current step, by kind (compute, p2p, tp, dp, optimizer) */
  double t_compute, t_p2p, t_tp, t_dp, t_opt;
  double tp_device_seen; /* the communication backend's collective_seconds at the last look */
  ff_plan_eval eval; /* the cost model's predictions, for the metrics */
  bool have_eval;
  double throttle;   /* > 1: an emulated slower device (see ff_throttle) */
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

static double now(void);

/* ---- TP hooks --------------------------------------------------------------------------- */

/* The TP collectives of the model code, on backend memory: through tp_stage when the host cannot
 * touch it (the MPI backend reads host memory only). The host time counts as TP; a collective
 * the host only enqueues (NCCL) adds its GPU time after the stream's next synchronisation
 * (device_tp). */
static void tp_collective(dist *d, float *buf, int64_t n, bool sum) {
  double t = now();
  float *host = d->tp_stage ? d->tp_stage : buf;
  if (d->tp_stage)
    d->k->to_host(host, buf, (size_t)n * sizeof *buf);
  if (sum)
    d->c->allreduce_sum(d->tp, host, n);
  else
    d->c->allreduce_max(d->tp, host, n);
  if (d->tp_stage)
    d->k->to_device(buf, host, (size_t)n * sizeof *buf);
  d->t_tp += now() - t;
}

/* After a synchronisation of the compute stream: the GPU time of the collectives enqueued on it
 * since the last call joins the step's TP time. */
static void device_tp(dist *d) {
  double total = d->c->collective_seconds();
  d->t_tp += total - d->tp_device_seen;
  d->tp_device_seen = total;
}

static void tp_sum(void *ctx, float *buf, int64_t n) { tp_collective(ctx, buf, n, true); }
static void tp_max(void *ctx, float *buf, int64_t n) { tp_collective(ctx, buf, n, false); }

/* A block of backend memory (params, m, v) where the host can read it for a checkpoint: itself
 * on the CPU backend, else a copy in host_block. */
static float *host_block_get(dist *d, float *block) {
  if (!d->host_block)
    return block;
  d->k->to_host(d->host_block, block, (size_t)d->mr.n_params * sizeof *block);
  return d->host_block;
}

/* ---- roles and slices ------------------------------------------------------------------- */

static void find_role(dist *d) {
  if (ff_plan_find_rank(d->plan, d->rank, &d->p, &d->s, &d->t)) {
    d->pl = &d->plan->pipelines[d->p];
    d->st = &d->pl->stages[d->s];
  }
}

/* Where a logical tensor of a layer (or the embedding / head) lives in pipeline q. */
static const ff_plan_stage *holder_stage(const ff_plan_pipeline *pl, int64_t layer, int kind) {
  if (kind == 1)
    return &pl->stages[0];
  if (kind == 2)
    return &pl->stages[pl->n_stages - 1];
  for (int s = 0; s < pl->n_stages; s++)
    if (pl->stages[s].layers.first <= layer && layer < pl->stages[s].layers.end)
      return &pl->stages[s];
  return NULL;
}

typedef struct tensor_desc {
  char name[48];
  int64_t layer;  /* -1 for embedding and head tensors */
  int kind;       /* 0 layer, 1 embedding stage, 2 LM-head stage */
  int which;      /* 0 replicated, 1 rows by heads, 2 rows by kv heads, 3 cols by heads,
                     4 rows by ffn, 5 cols by ffn, 6 rows by vocab */
  int64_t extent; /* of the sharded dimension (or the vector length) */
} tensor_desc;

static int64_t slice_first(const tensor_desc *td, const ff_plan_rank *r, int64_t D) {
  switch (td->which) {
  case 1: case 3: return r->heads.first * D;
  case 2: return r->kv_heads.first * D;
  case 4: case 5: return r->ffn.first;
  case 6: return r->vocab.first;
  default: return 0;
  }
}

static int64_t slice_end(const tensor_desc *td, const ff_plan_rank *r, int64_t D) {
  switch (td->which) {
  case 1: case 3: return r->heads.end * D;
  case 2: return r->kv_heads.end * D;
  case 4: case 5: return r->ffn.end;
  case 6: return r->vocab.end;
  default: return td->extent;
  }
}

/* Every logical tensor of the model, in the one global order. */
static int all_tensors(const ff_model *m, tensor_desc *out) {
  int n = 0;
  int64_t D = m->hidden / m->heads;
  out[n++] = (tensor_desc){"embed", -1, 1, 6, m->vocab};
  for (int64_t l = 0; l < m->layers; l++) {
    static const char *const names[] = {"attn_norm", "wq", "wk", "wv", "wo", "mlp_norm",
                                        "w_gate", "w_up", "w_down"};
    static const int which[] = {0, 1, 2, 2, 3, 0, 4, 4, 5};
    for (int i = 0; i < 9; i++) {
      tensor_desc *td = &out[n++];
      snprintf(td->name, sizeof td->name, "layers.%lld.%s", (long long)l, names[i]);
      td->layer = l;
      td->kind = 0;
      td->which = which[i];
      td->extent = which[i] == 0 ? m->hidden : which[i] == 1 || which[i] == 3 ? m->heads * D
                   : which[i] == 2 ? m->kv_heads * D : m->ffn_hidden;
    }
  }
  out[n++] = (tensor_desc){"final_norm", -1, 2, 0, m->hidden};
  if (!m->tied_embeddings)
    out[n++] = (tensor_desc){"lm_head", -1, 2, 6, m->vocab};
  return n;
}

/* ---- segments and their groups ---------------------------------------------------------- */

static ff_group *group_for(dist *d, const int *members, int n, bool mine, int *index) {
  char key[4096];
  size_t j = 0;
  for (int i = 0; i < n && j + 12 < sizeof key; i++)
    j += (size_t)snprintf(key + j, sizeof key - j, "%d,", members[i]);
  for (int i = 0; i < d->n_cache; i++)
    if (strcmp(d->cache[i].key, key) == 0) {
      *index = i;
      return d->cache[i].group;
    }
  if (d->n_cache == d->cap_cache) {
    int cap = d->cap_cache ? 2 * d->cap_cache : 64;
    group_cache *more = realloc(d->cache, (size_t)cap * sizeof *more);
    if (!more)
      d->c->abort(1);
    d->cache = more;
    d->cap_cache = cap;
  }
  /* every rank reaches this point for the same keys in the same order */
  ff_group *g = d->c->split(d->world, mine ? 0 : -1, d->rank,
                            d->c->device_buffers && !d->k->host_memory);
  d->cache[d->n_cache].key = strdup(key);
  d->cache[d->n_cache].group = g;
  if (!d->cache[d->n_cache].key)
    d->c->abort(1);
  *index = d->n_cache++;
  return g;
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* Cut one tensor into segments and append them (ranks: scratch for the holders). */
static void add_segments(dist *d, int desc, int *members, int64_t *cuts) {
  const tensor_desc *td = &d->tds[desc];
  const ff_plan *plan = d->plan;
  int64_t D = plan->model.hidden / plan->model.heads;
  int n_cuts = 0;
  for (int q = 0; q < plan->n_pipelines; q++) {
    const ff_plan_stage *st = holder_stage(&plan->pipelines[q], td->layer, td->kind);
    for (int t = 0; st && t < st->n_ranks; t++) {
      cuts[n_cuts++] = slice_first(td, &st->ranks[t], D);
      cuts[n_cuts++] = slice_end(td, &st->ranks[t], D);
    }
  }
  qsort(cuts, (size_t)n_cuts, sizeof *cuts, cmp_i64);
  const ff_tensor *mine = ff_model_rank_find(&d->mr, td->name);
  for (int c = 0; c + 1 < n_cuts; c++) {
    int64_t a = cuts[c], b = cuts[c + 1];
    if (a == b)
      continue;
    int n = 0, in_my_pipe = 0, owner = -1;
    bool member = false;
    for (int q = 0; q < plan->n_pipelines; q++) {
      const ff_plan_stage *st = holder_stage(&plan->pipelines[q], td->layer, td->kind);
      for (int t = 0; st && t < st->n_ranks; t++) {
        const ff_plan_rank *r = &st->ranks[t];
        if (slice_first(td, r, D) > a || slice_end(td, r, D) < b)
          continue;
        members[n++] = (int)r->rank;
        member |= r->rank == d->rank;
        in_my_pipe += q == d->p;
        if (q == 0 && owner < 0)
          owner = (int)r->rank;
      }
    }
    seg *sg = &d->segs[d->n_segs++];
    sg->desc = desc;
    sg->tensor = member && mine ? (int)(mine - d->mr.tensors) : -1;
    sg->cols = td->which == 3 || td->which == 5;
    sg->a = a;
    sg->b = b;
    sg->weight = in_my_pipe > 0 ? 1.0f / (float)in_my_pipe : 1.0f;
    sg->norm_owner = owner == d->rank;
    sg->owner = owner;
    sg->cache = -1;
    sg->group = n > 1 ? group_for(d, members, n, member, &sg->cache) : NULL;
    sg->bucket = td->kind == 0 ? (int)td->layer : td->kind == 2 ? (int)plan->model.layers : -1;
  }
}

static ff_status build_segments(dist *d) {
  const ff_model *m = &d->plan->model;
  int cap_t = (int)m->layers * 9 + 3;
  tensor_desc *tds = malloc((size_t)cap_t * sizeof *tds);
  int n_t = tds ? all_tensors(m, tds) : 0;
  int64_t ranks = d->plan->n_ranks;
  int *members = malloc((size_t)ranks * sizeof *members);
  int64_t *cuts = malloc((size_t)ranks * 2 * sizeof *cuts);
  d->segs = calloc((size_t)n_t * (size_t)(2 * ranks + 1), sizeof *d->segs);
  if (!tds || !members || !cuts || !d->segs) {
    free(tds), free(members), free(cuts);
    return FF_ERR_RUNTIME;
  }
  d->tds = tds;
  d->n_tds = n_t;
  for (int i = 0; i < n_t; i++)
    add_segments(d, i, members, cuts);
  free(members), free(cuts);
  return FF_OK;
}

/* ---- gradient synchronisation ----------------------------------------------------------- */

/* Where a segment of tensor t starts in its block, how many rows of how many floats it has, and
 * the row stride there. */
typedef struct seg_shape {
  int64_t start, rows, width, stride;
} seg_shape;

static seg_shape shape_of(const ff_tensor *t, const seg *sg) {
  int64_t stride = t->col_end - t->col_first;
  int64_t r0 = sg->cols ? t->row_first : sg->a, r1 = sg->cols ? t->row_end : sg->b;
  int64_t c0 = sg->cols ? sg->a : t->col_first, c1 = sg->cols ? sg->b : t->col_end;
  return (seg_shape){t->offset + (r0 - t->row_first) * stride + (c0 - t->col_first), r1 - r0,
                     c1 - c0, stride};
}

static bool contiguous(seg_shape sh) { return sh.width == sh.stride || sh.rows <= 1; }

/* A segment of shape sh in host block `base` to a packed buffer (out) or back. */
static void move_seg(seg_shape sh, float *base, float *packed, bool out) {
  for (int64_t r = 0; r < sh.rows; r++) {
    float *row = base + sh.start + r * sh.stride, *p = packed + r * sh.width;
    memcpy(out ? p : row, out ? row : p, (size_t)sh.width * sizeof *row);
  }
}

/* Copy a segment of tensor t (in host block `base`) in or out of a packed buffer. */
static int64_t pack(const ff_tensor *t, const seg *sg, float *base, float *buf, bool out) {
  seg_shape sh = shape_of(t, sg);
  move_seg(sh, base, buf, out);
  return sh.rows * sh.width;
}

static int64_t seg_pack(const dist *d, const seg *sg, float *base, float *buf, bool out) {
  return pack(&d->mr.tensors[sg->tensor], sg, base, buf, out);
}

/* Does the stage share kv heads between TP ranks (each then holds a partial gradient of them)? */
static bool shares_kv(const ff_plan_stage *st) {
  for (int i = 1; i < st->n_ranks; i++)
    if (st->ranks[i].kv_heads.first < st->ranks[i - 1].kv_heads.end)
      return true;
  return false;
}

static bool is_kv(const ff_tensor *t) {
  size_t len = strlen(t->name);
  return len >= 3 && (strcmp(t->name + len - 3, ".wk") == 0 || strcmp(t->name + len - 3, ".wv") == 0);
}

/* kv heads shared by two ranks' query heads: the TP group sums the whole tensor, each rank
 * having placed its rows. */
static void sum_shared_kv(dist *d, const ff_tensor *t) {
  int64_t full = t->rows * t->cols;
  float *g = d->sums_on + t->offset, *at = d->kv_full + t->row_first * t->cols;
  if (d->dp_device) {
    d->k->zero(d->kv_full, (size_t)full * sizeof(float));
    d->k->copy_rows(at, t->numel, g, t->numel, t->numel, 1);
  } else {
    memset(d->kv_full, 0, (size_t)full * sizeof(float));
    memcpy(at, g, (size_t)t->numel * sizeof(float));
  }
  d->c->allreduce_sum(d->tp, d->kv_full, full);
  if (d->dp_device)
    d->k->copy_rows(g, t->numel, at, t->numel, t->numel, 1);
  else
    memcpy(g, at, (size_t)t->numel * sizeof(float));
}

/* x[0, n) *= w, on the memory the sums work on. */
static void scale_range(dist *d, float *x, int64_t n, float w) {
  if (w == 1.0f)
    return;
  if (d->dp_device) {
    d->k->scale(x, w, n);
  } else {
    for (int64_t j = 0; j < n; j++)
      x[j] *= w;
  }
}

/* A segment between its place in sums_on and a packed copy (to the copy when out). */
static void move_rows(dist *d, seg_shape sh, float *packed, bool out) {
  float *at = d->sums_on + sh.start;
  if (!d->dp_device)
    move_seg(sh, d->sums_on, packed, out);
  else if (out)
    d->k->copy_rows(packed, sh.width, at, sh.stride, sh.width, sh.rows);
  else
    d->k->copy_rows(at, sh.stride, packed, sh.width, sh.width, sh.rows);
}

static seg_shape shape_at(const dist *d, int i) {
  return shape_of(&d->mr.tensors[d->segs[i].tensor], &d->segs[i]);
}

/* Start one sum: its segments weighted by 1/holders in my pipeline, where they are or packed. */
static void start_sum(dist *d, dp_sum *ds) {
  for (int j = 0; j < ds->count; j++) {
    int i = d->sum_segs[ds->first + j];
    seg_shape sh = shape_at(d, i);
    float *at = d->sums_on + sh.start;
    if (!ds->in_place) {
      at = d->packed + d->packed_at[i];
      move_rows(d, sh, at, true);
    }
    scale_range(d, at, sh.rows * sh.width, d->segs[i].weight);
  }
  float *buf = ds->in_place ? d->sums_on + ds->start : d->packed + ds->start;
  ds->req = d->c->iallreduce_sum(d->cache[ds->cache].group, buf, ds->n);
}

/* The bucket of a hook's tensors [first, ...) (see ff_model_rank.grads_final). */
static int bucket_of(const dist *d, int first) {
  int e = d->mr.spec.embedding ? 1 : 0;
  if (e && first == 0)
    return -1;
  if (first >= e + d->mr.n_layers * 9)
    return (int)d->plan->model.layers;
  return (int)(d->mr.spec.layer_first + (first - e) / 9);
}

/* The model's hook: tensors [first, first + n) of this rank have their final gradients for the
 * step. Look for a non-finite value before anything is summed (so the rank that produced it is
 * named), then start the bucket's sums, in the list's order. Buckets come highest first on every
 * rank, so every rank starts its sums in one global order, (bucket descending, group ascending),
 * and the members of any group start theirs alike: no two groups can wait on each other. */
static void grads_final(void *ctx, int first, int n) {
  dist *d = ctx;
  const ff_tensor *T = d->mr.tensors;
  if (!d->nonfinite) /* local work: counted as compute */
    d->nonfinite = ff_nonfinite_gradient(d->k, d->mr.grads, T + first, n,
                                         d->first_bucket ? d->step : 0);
  d->first_bucket = false;
  double t0 = now();
  if (d->sums_on != d->mr.grads) { /* the host copy of the bucket */
    int64_t a = T[first].offset, b = T[first + n - 1].offset + T[first + n - 1].numel;
    d->k->to_host(d->sums_on + a, d->mr.grads + a, (size_t)(b - a) * sizeof(float));
  }
  if (d->kv_full)
    for (int i = first; i < first + n; i++)
      if (is_kv(&T[i]))
        sum_shared_kv(d, &T[i]);
  int bucket = bucket_of(d, first);
  for (int i = 0; i < d->n_sums; i++) {
    if (d->sums[i].bucket == bucket && !d->sums[i].req)
      start_sum(d, &d->sums[i]);
    else if (d->sums[i].req) /* let the sums started before move on */
      d->c->test(d->sums[i].req);
  }
  d->t_dp += now() - t0;
}

/* Σ g² over a segment of the summed gradients. */
static double seg_sumsq(dist *d, int i) {
  seg *sg = &d->segs[i];
  seg_shape sh = shape_of(&d->mr.tensors[sg->tensor], sg);
  const float *at = d->sums_on + sh.start;
  if (d->dp_device) {
    if (contiguous(sh))
      return d->k->sum_squares(at, sh.rows * sh.width);
    float *to = d->packed + d->packed_at[i];
    if (!sg->group) /* packed only for the norm */
      d->k->copy_rows(to, sh.width, at, sh.stride, sh.width, sh.rows);
    return d->k->sum_squares(to, sh.rows * sh.width);
  }
  double sum = 0;
  for (int64_t r = 0; r < sh.rows; r++)
    for (int64_t c = 0; c < sh.width; c++)
      sum += (double)at[r * sh.stride + c] * at[r * sh.stride + c];
  return sum;
}

/* Wait for the step's sums, put packed segments back, and return this rank's share of Σ g²
 * (each element counted once over the world). */
static double finish_gradients(dist *d) {
  for (int k = 0; k < d->n_sums; k++) {
    dp_sum *ds = &d->sums[k];
    if (!ds->req) { /* a bucket the model never reported: a bug, not an input */
      fprintf(stderr, "ffrun: rank %d: internal error: the gradient sum of bucket %d never "
              "started\n", d->rank, ds->bucket);
      d->c->abort(1);
    }
    d->c->wait(ds->req);
    ds->req = NULL;
    if (!ds->in_place)
      for (int j = 0; j < ds->count; j++) {
        int i = d->sum_segs[ds->first + j];
        move_rows(d, shape_at(d, i), d->packed + d->packed_at[i], false);
      }
  }
  double sumsq = 0;
  for (int i = 0; i < d->n_segs; i++)
    if (d->segs[i].tensor >= 0 && d->segs[i].norm_owner)
      sumsq += seg_sumsq(d, i);
  if (d->sums_on != d->mr.grads)
    d->k->to_device(d->mr.grads, d->sums_on, (size_t)d->mr.n_params * sizeof(float));
  return sumsq;
}

static const dist *sort_dist; /* qsort has no context argument */

/* (bucket descending, group ascending, segment descending): the order sums start in. */
static int cmp_sum_order(const void *pa, const void *pb) {
  const seg *a = &sort_dist->segs[*(const int *)pa], *b = &sort_dist->segs[*(const int *)pb];
  if (a->bucket != b->bucket)
    return a->bucket > b->bucket ? -1 : 1;
  if (a->cache != b->cache)
    return a->cache < b->cache ? -1 : 1;
  return *(const int *)pa > *(const int *)pb ? -1 : 1;
}

/* Whether a sum's segments lie back to back in my block, in global order (which is block order). */
static bool back_to_back(const dist *d, const dp_sum *ds, int64_t *start) {
  int64_t next = -1;
  for (int j = ds->count - 1; j >= 0; j--) { /* ascending global order */
    seg_shape sh = shape_at(d, d->sum_segs[ds->first + j]);
    if (!contiguous(sh) || (next >= 0 && sh.start != next))
      return false;
    if (next < 0)
      *start = sh.start;
    next = sh.start + sh.rows * sh.width;
  }
  return true;
}

/* The list of sums, and whether each may run in place: only when its segments are back to back
 * in every member's block (members hold the same segments but may lay them out differently), so
 * the members of each group agree by a sum of their flags, group by group in cache order. */
static ff_status plan_sums(dist *d) {
  int mine = 0;
  for (int i = 0; i < d->n_segs; i++)
    mine += d->segs[i].tensor >= 0 && d->segs[i].group != NULL;
  d->sum_segs = malloc((size_t)(mine + 1) * sizeof *d->sum_segs);
  d->sums = calloc((size_t)mine + 1, sizeof *d->sums);
  float *flags = malloc((size_t)(mine + 1) * sizeof *flags);
  if (!d->sum_segs || !d->sums || !flags) {
    free(flags);
    return FF_ERR_RUNTIME;
  }
  int n = 0;
  for (int i = 0; i < d->n_segs; i++)
    if (d->segs[i].tensor >= 0 && d->segs[i].group)
      d->sum_segs[n++] = i;
  sort_dist = d;
  qsort(d->sum_segs, (size_t)n, sizeof *d->sum_segs, cmp_sum_order);
  for (int j = 0; j < n; j++) {
    const seg *sg = &d->segs[d->sum_segs[j]];
    dp_sum *last = d->n_sums ? &d->sums[d->n_sums - 1] : NULL;
    if (last && last->bucket == sg->bucket && last->cache == sg->cache) {
      last->count++;
      continue;
    }
    d->sums[d->n_sums++] = (dp_sum){sg->bucket, sg->cache, j, 1, false, 0, 0, NULL};
  }
  for (int g = 0; g < d->n_cache; g++) { /* the members of group g agree on in_place */
    if (!d->cache[g].group)
      continue;
    int k = 0;
    for (int q = 0; q < d->n_sums; q++)
      if (d->sums[q].cache == g)
        flags[k++] = back_to_back(d, &d->sums[q], &d->sums[q].start) ? 1.0f : 0.0f;
    d->c->allreduce_sum(d->cache[g].group, flags, k);
    k = 0;
    float members = (float)d->c->size(d->cache[g].group);
    for (int q = 0; q < d->n_sums; q++)
      if (d->sums[q].cache == g)
        d->sums[q].in_place = flags[k++] == members;
  }
  free(flags);
  return FF_OK;
}

/* Memory for the sums: where they run, the packing area, the shared-kv buffer, the lists. */
static ff_status setup_sums(dist *d) {
  d->dp_device = d->c->device_buffers && !d->k->host_memory;
  d->sums_on = d->dp_device || d->k->host_memory ? d->mr.grads : d->host_block;
  d->packed_at = malloc((size_t)(d->n_segs + 1) * sizeof *d->packed_at);
  if (!d->packed_at || plan_sums(d) != FF_OK)
    return FF_ERR_RUNTIME;
  for (int i = 0; i < d->n_segs; i++)
    d->packed_at[i] = -1;
  int64_t packed = 0, kv = 0;
  for (int k = 0; k < d->n_sums; k++) {
    dp_sum *ds = &d->sums[k];
    if (!ds->in_place)
      ds->start = packed;
    for (int j = 0; j < ds->count; j++) {
      int i = d->sum_segs[ds->first + j];
      seg_shape sh = shape_at(d, i);
      if (!ds->in_place)
        d->packed_at[i] = ds->start + ds->n;
      ds->n += sh.rows * sh.width;
    }
    if (!ds->in_place)
      packed += ds->n;
  }
  for (int i = 0; d->dp_device && i < d->n_segs; i++) { /* the norm on the device: contiguous */
    if (d->segs[i].tensor < 0 || d->segs[i].group || !d->segs[i].norm_owner)
      continue;
    seg_shape sh = shape_at(d, i);
    if (!contiguous(sh)) {
      d->packed_at[i] = packed;
      packed += sh.rows * sh.width;
    }
  }
  if (shares_kv(d->st))
    for (int i = 0; i < d->mr.n_tensors; i++)
      if (is_kv(&d->mr.tensors[i]) && d->mr.tensors[i].rows * d->mr.tensors[i].cols > kv)
        kv = d->mr.tensors[i].rows * d->mr.tensors[i].cols;
  if (packed > 0)
    d->packed = d->dp_device ? d->k->alloc((size_t)packed * sizeof(float))
                             : malloc((size_t)packed * sizeof(float));
  if (kv > 0)
    d->kv_full = d->dp_device ? d->k->alloc((size_t)kv * sizeof(float))
                              : malloc((size_t)kv * sizeof(float));
  if ((packed > 0 && !d->packed) || (kv > 0 && !d->kv_full))
    return FF_ERR_RUNTIME;
  d->mr.grads_final = grads_final;
  d->mr.grads_ctx = d;
  return FF_OK;
}

/* ---- stage boundaries ------------------------------------------------------------------- */

static ff_span chunk(int64_t total, int parts, int i) {
  int64_t base = total / parts, extra = total % parts;
  int64_t first = i * base + (i < extra ? i : extra);
  return (ff_span){first, first + base + (i < extra ? 1 : 0)};
}

/* A boundary moves each element once: the tensor is cut into one part per receiving rank
 * (chunk(n, n_b, r)), every sending rank holds the whole tensor and sends the part of its own
 * chunk (chunk(n, n_a, t)) that falls in each receiver's part, and the receivers then gather
 * their parts inside their stage (gather_parts). The piece from sender t to receiver r: */
static ff_span boundary_piece(int64_t n, int n_a, int t, int n_b, int r) {
  ff_span a = chunk(n, n_a, t), b = chunk(n, n_b, r);
  ff_span p = {a.first > b.first ? a.first : b.first, a.end < b.end ? a.end : b.end};
  if (p.end < p.first)
    p.end = p.first;
  return p;
}

/* Send my pieces of a full activation (held by every rank of my stage) to the ranks of the
 * neighbouring stage (an empty piece is not sent: its request stays NULL). The requests are
 * free (staging_free waited for them before the compute refilled buf). */
static void send_to(dist *d, const ff_plan_stage *to, const float *buf, int64_t n, int tag,
                    ff_request **reqs) {
  double t0 = now();
  for (int r = 0; r < to->n_ranks; r++) {
    ff_span p = boundary_piece(n, d->st->n_ranks, d->t, to->n_ranks, r);
    reqs[r] = p.end > p.first ? d->c->isend(buf + p.first, (size_t)(p.end - p.first) * sizeof *buf,
                                            (int)to->ranks[r].rank, tag)
                              : NULL;
  }
  d->t_p2p += now() - t0;
}

/* After my part of a boundary's tensor arrived: every rank of my stage broadcasts its part to
 * the others, in rank order, so each holds the whole tensor (buf: host memory on the host path,
 * backend memory on the device path). */
static void gather_parts(dist *d, float *buf, int64_t n) {
  if (d->st->n_ranks <= 1)
    return;
  for (int r = 0; r < d->st->n_ranks; r++) {
    ff_span part = chunk(n, d->st->n_ranks, r);
    d->c->bcast(d->tp, buf + part.first, (size_t)(part.end - part.first) * sizeof *buf, r);
  }
}

/* Time spent here counts as p2p: waiting for the previous stage is the pipeline's bubble too,
 * which the metrics separate by subtracting the cost of the transfer itself. */
static void recv_from(dist *d, const ff_plan_stage *from, float *buf, int64_t n, int tag) {
  double t0 = now();
  for (int r = 0; r < from->n_ranks; r++) {
    ff_span p = boundary_piece(n, from->n_ranks, r, d->st->n_ranks, d->t);
    if (p.end > p.first)
      d->c->recv(buf + p.first, (size_t)(p.end - p.first) * sizeof *buf, (int)from->ranks[r].rank,
                 tag);
  }
  gather_parts(d, buf, n);
  d->t_p2p += now() - t0;
}

/* MPI promises tags up to 32767 only. Messages from one rank to another with the same tag stay
 * in order, and both sides go through them in order, so tags may wrap around: activations and
 * their gradients take [0, 16384), checkpoint pieces [16384, 32768). */
static int p2p_tag(int64_t micro_batch, int backward) {
  return (int)((micro_batch * 2 + backward) % 16384);
}

static int checkpoint_tag(int segment, int block) {
  return 16384 + (int)(((int64_t)segment * 3 + block) % 16384);
}

/* ---- one step --------------------------------------------------------------------------- */

static int64_t warmup(int p, int s, int64_t m, ff_schedule sch) {
  if (sch == FF_SCHEDULE_GPIPE)
    return m;
  int64_t w = p - s - 1;
  return w < m ? w : m;
}

enum { FWD, BWD, NONE };

static int slot_of(const dist *d, int64_t j) { return (int)(j % d->mr.n_slots); }

/* Floats of the activation (or its gradient) that crosses a stage boundary: b·s·h. */
static int64_t boundary_floats(const dist *d) {
  return d->pl->micro_batch_size * d->plan->model.seq_len * d->plan->model.hidden;
}

/* Host path: the staging buffer of micro-batch j's output (dir FWD) or input gradient (BWD),
 * and the requests of its transfers to the neighbouring stage's ranks. */
static float *staging(const dist *d, int dir, int64_t j) {
  int64_t NC = boundary_floats(d);
  return (dir == FWD ? d->send_fwd : d->send_bwd) + (int64_t)slot_of(d, j) * NC;
}

static ff_request **staging_reqs(const dist *d, int dir, int64_t j) {
  return dir == FWD ? d->req_fwd + slot_of(d, j) * d->n_next
                    : d->req_bwd + slot_of(d, j) * d->n_prev;
}

/* Host path: the staging buffer of micro-batch j once its previous contents (sent n_slots
 * micro-batches ago) have left, for the compute to write; NULL when nothing is sent that way. */
static float *staging_free(dist *d, int dir, int64_t j) {
  bool sends = dir == FWD ? !d->st->lm_head : !d->st->embedding;
  if (d->p2p_device || !sends)
    return NULL;
  ff_request **reqs = staging_reqs(d, dir, j);
  for (int r = 0; r < (dir == FWD ? d->n_next : d->n_prev); r++) {
    d->c->wait(reqs[r]);
    reqs[r] = NULL;
  }
  return staging(d, dir, j);
}

/* Device path: the transfers of my pieces (boundary_piece) with the ranks of the neighbouring
 * stage, on backend memory: the forward's output or the backward's input gradient going out, my
 * part of the next input or output gradient coming in (gathered after the batch). */
static float *device_buf(dist *d, bool send, int dir, int64_t j) {
  return dir == FWD ? (send ? ff_model_rank_output(&d->mr, slot_of(d, j))
                            : ff_model_rank_input(&d->mr, slot_of(d, j)))
                    : ff_model_rank_gradient(&d->mr, slot_of(d, j));
}

static int device_ops(dist *d, ff_p2p *ops, int n, bool send, int dir, int64_t j) {
  /* forward: send to the next stage, receive from the previous; backward the other way */
  const ff_plan_stage *peer = &d->pl->stages[(dir == FWD) == send ? d->s + 1 : d->s - 1];
  int64_t NC = boundary_floats(d);
  float *buf = device_buf(d, send, dir, j);
  for (int r = 0; r < peer->n_ranks; r++) {
    ff_span p = send ? boundary_piece(NC, d->st->n_ranks, d->t, peer->n_ranks, r)
                     : boundary_piece(NC, peer->n_ranks, r, d->st->n_ranks, d->t);
    if (p.end > p.first)
      ops[n++] = (ff_p2p){buf + p.first, (size_t)(p.end - p.first) * sizeof(float),
                          (int)peer->ranks[r].rank, p2p_tag(j, dir), send};
  }
  return n;
}

/* Between compute steps: send the result of micro-batch send_j in direction send_dir (the
 * forward's output to the next stage, the backward's input gradient to the previous one) and
 * receive what micro-batch recv_j needs next (its input, or its output's gradient); either may
 * be NONE. On a device both go in one batch, so two neighbours that each send to the other
 * (1F1B's steady state) do not wait on each other, then the stage gathers what it received, and
 * the host waits for both. On the host path the send is started and the receive and the gather
 * block, into recv_buf. */
static void exchange(dist *d, int send_dir, int64_t send_j, int recv_dir, int64_t recv_j) {
  double t0 = now();
  int64_t NC = boundary_floats(d);
  if (d->p2p_device) {
    int n = 0;
    if (send_dir != NONE)
      n = device_ops(d, d->p2p_ops, n, true, send_dir, send_j);
    if (recv_dir != NONE)
      n = device_ops(d, d->p2p_ops, n, false, recv_dir, recv_j);
    d->c->p2p_batch(d->p2p_ops, n);
    if (recv_dir != NONE)
      gather_parts(d, device_buf(d, false, recv_dir, recv_j), NC);
    d->k->sync();
    d->tp_device_seen = d->c->collective_seconds(); /* the gather is p2p time, not TP */
    d->t_p2p += now() - t0;
    return;
  }
  d->t_p2p += now() - t0;
  if (send_dir != NONE)
    send_to(d, &d->pl->stages[send_dir == FWD ? d->s + 1 : d->s - 1], staging(d, send_dir, send_j),
            NC, p2p_tag(send_j, send_dir), staging_reqs(d, send_dir, send_j));
  if (recv_dir != NONE)
    recv_from(d, &d->pl->stages[recv_dir == FWD ? d->s - 1 : d->s + 1], d->recv_buf, NC,
              p2p_tag(recv_j, recv_dir));
}

/* After a forward or backward begun at t0 (with the step's TP and DP times then): let an
 * asynchronous backend finish, and count the time less the communication as compute. */
static void compute_done(dist *d, double t0, double tp0, double dp0) {
  d->k->sync();
  device_tp(d);
  double spent = now() - t0 - (d->t_tp - tp0) - (d->t_dp - dp0);
  ff_throttle(d->throttle, spent);
  d->t_compute += spent * (d->throttle > 1 ? d->throttle : 1);
}

/* The forward of micro-batch j, whose input (not on the first stage) has arrived. */
static void run_forward(dist *d, int64_t step, int64_t j, float grad_scale, double *loss) {
  const ff_plan *plan = d->plan;
  int64_t b = d->pl->micro_batch_size, S = plan->model.seq_len;
  int32_t *in = d->mr.inputs, *tg = d->mr.targets;
  if (d->st->embedding || d->st->lm_head)
    for (int64_t i = 0; i < b; i++)
      ff_data_sequence(&d->data, step, d->first_seq + j * b + i, plan->training.global_batch, S,
                       in + i * S, tg + i * S);
  const float *x_in = d->st->embedding || d->p2p_device ? NULL : d->recv_buf;
  float *out = staging_free(d, FWD, j);
  double t0 = now(), tp0 = d->t_tp, dp0 = d->t_dp;
  d->mr.last_micro_batch = j == d->pl->micro_batches - 1; /* the head's gradients are final */
  ff_model_rank_forward(&d->mr, slot_of(d, j), b, in, x_in, tg, grad_scale, out, loss);
  compute_done(d, t0, tp0, dp0);
}

/* The backward of micro-batch j, whose output's gradient (not on the last stage) has arrived. */
static void run_backward(dist *d, int64_t j) {
  const float *dx_in = d->st->lm_head || d->p2p_device ? NULL : d->recv_buf;
  float *out = staging_free(d, BWD, j);
  double t0 = now(), tp0 = d->t_tp, dp0 = d->t_dp;
  d->mr.last_micro_batch = j == d->pl->micro_batches - 1; /* gradients final, layer by layer */
  ff_model_rank_backward(&d->mr, slot_of(d, j), d->pl->micro_batch_size, dx_in, out);
  compute_done(d, t0, tp0, dp0);
}

/* The stage's operations in 1F1B (or GPipe) order, with its transfers paired as Megatron-LM
 * pairs them: after a steady-state forward its output leaves together with the arrival of the
 * gradient the next backward needs, and after that backward its input gradient leaves together
 * with the next forward's input. Returns this rank's loss sum. */
static double run_schedule(dist *d, int64_t step) {
  int64_t m = d->pl->micro_batches;
  int64_t w = warmup(d->pl->n_stages, d->s, m, d->plan->training.schedule);
  float scale = 1.0f / (float)(d->plan->training.global_batch * d->plan->model.seq_len);
  int from_prev = d->st->embedding ? NONE : FWD, to_next = d->st->lm_head ? NONE : FWD;
  int from_next = d->st->lm_head ? NONE : BWD, to_prev = d->st->embedding ? NONE : BWD;
  double loss = 0;
  for (int64_t j = 0; j < w; j++) {
    exchange(d, NONE, 0, from_prev, j);
    run_forward(d, step, j, scale, &loss);
    exchange(d, to_next, j, NONE, 0);
  }
  if (m > w)
    exchange(d, NONE, 0, from_prev, w);
  for (int64_t k = 0; k < m - w; k++) {
    run_forward(d, step, w + k, scale, &loss);
    exchange(d, to_next, w + k, from_next, k);
    run_backward(d, k);
    exchange(d, to_prev, k, k + 1 < m - w ? from_prev : NONE, w + k + 1);
  }
  for (int64_t j = m - w; j < m; j++) {
    exchange(d, NONE, 0, from_next, j);
    run_backward(d, j);
    exchange(d, to_prev, j, NONE, 0);
  }
  for (int i = 0; i < d->mr.n_slots * d->n_next; i++) {
    d->c->wait(d->req_fwd[i]);
    d->req_fwd[i] = NULL;
  }
  for (int i = 0; i < d->mr.n_slots * d->n_prev; i++) {
    d->c->wait(d->req_bwd[i]);
    d->req_bwd[i] = NULL;
  }
  return loss;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* One step. Returns the loss; *bad counts the ranks whose own gradients were not finite (then
 * no rank updates its weights), each of which has said which tensor. */
static double train_step(dist *d, int64_t step, double *norm_out, double *lr_out, int *bad) {
  const ff_training *t = &d->plan->training;
  d->t_compute = d->t_p2p = d->t_tp = d->t_dp = d->t_opt = 0;
  d->k->zero(d->mr.grads, (size_t)d->mr.n_params * sizeof(float));
  d->step = step;
  d->first_bucket = true;
  d->nonfinite = NULL;
  double sums[3] = {run_schedule(d, step - 1), 0, 0}; /* the gradient sums start in there */
  const char *mine = d->nonfinite;
  if (mine)
    fprintf(stderr, "ffrun: step %lld: the gradient of %s is not finite on rank %d (pipeline %d, "
            "stage %d)\n", (long long)step, mine, d->rank, d->p, d->s);
  sums[2] = mine ? 1 : 0;
  /* The loss and the bad-rank count are summed first: this collective is where a rank waits for
   * the slowest pipeline, and that wait is the step's bubble, not DP communication (the cost
   * model keeps the two apart, and so must the metrics it is calibrated from). */
  double both[2] = {sums[0], sums[2]};
  d->c->allreduce_sum_f64(d->world, both, 2);
  sums[0] = both[0];
  sums[2] = both[1];
  double t0 = now();
  sums[1] = finish_gradients(d);
  d->c->allreduce_sum_f64(d->world, &sums[1], 1);
  d->t_dp += now() - t0; /* with the time the sums took to start, in the backward */
  *bad = (int)sums[2];
  *lr_out = ff_learning_rate(t, step, t->steps);
  *norm_out = sqrt(sums[1]);
  if (*bad || !isfinite(sums[0]))
    return sums[0] / (double)(t->global_batch * d->plan->model.seq_len);
  t0 = now();
  double norm = sqrt(sums[1]);
  double clip = t->grad_clip > 0 && norm > t->grad_clip ? t->grad_clip / norm : 1.0;
  double lr = ff_learning_rate(t, step, t->steps);
  for (int i = 0; i < d->mr.n_tensors; i++) {
    const ff_tensor *x = &d->mr.tensors[i];
    d->k->adamw(d->mr.params + x->offset, d->mr.grads + x->offset, d->mr.m + x->offset,
                d->mr.v + x->offset, x->numel, (float)lr, (float)t->beta1, (float)t->beta2,
                (float)t->eps, x->decay ? (float)t->weight_decay : 0.0f, step, (float)clip);
  }
  ff_model_rank_weights_changed(&d->mr);
  ff_throttle(d->throttle, now() - t0);
  d->t_opt = now() - t0;
  return sums[0] / (double)(t->global_batch * d->plan->model.seq_len);
}

/* ---- checkpoints: gather the logical tensors on rank 0 ---------------------------------- */

/* Every segment's owner (its holder in pipeline 0) sends parameters and moments to rank 0, one
 * logical tensor after another in the checkpoint's order; rank 0 assembles each tensor in
 * `whole` (the largest tensor's size) and appends it to the file, so no rank ever holds more of
 * the model than its own shard and one tensor. Segments of a tensor go in the order of d->segs,
 * which every rank walks the same way: sends and receives pair up without deadlock. A rank 0
 * that cannot write goes on receiving, so the others are not left waiting. */
static ff_status save(dist *d, int64_t step, float *buf, float *whole) {
  ff_model_rank layout; /* the logical tensors in checkpoint order */
  ff_shard_spec spec = {0, d->plan->model.layers, true, true, {0, d->plan->model.heads},
                        {0, d->plan->model.kv_heads}, {0, d->plan->model.ffn_hidden},
                        {0, d->plan->model.vocab}};
  if (ff_model_rank_init_layout(&layout, &d->plan->model, &spec) != FF_OK)
    d->c->abort(FF_ERR_RUNTIME);
  int *desc_of = malloc((size_t)layout.n_tensors * sizeof *desc_of);
  if (!desc_of)
    d->c->abort(FF_ERR_RUNTIME);
  for (int i = 0; i < layout.n_tensors; i++) {
    desc_of[i] = -1;
    for (int j = 0; j < d->n_tds && desc_of[i] < 0; j++)
      if (strcmp(d->tds[j].name, layout.tensors[i].name) == 0)
        desc_of[i] = j;
    if (desc_of[i] < 0) {
      fprintf(stderr, "ffrun: internal error: %s has no segments\n", layout.tensors[i].name);
      d->c->abort(FF_ERR_RUNTIME);
    }
  }
  bool root = d->rank == 0;
  ff_ckpt_meta meta = {step, (uint64_t)d->plan->training.seed, "", ""};
  snprintf(meta.model_name, sizeof meta.model_name, "%s", d->plan->model.name);
  snprintf(meta.model_digest, sizeof meta.model_digest, "%s", d->model_digest);
  ff_diag dg;
  ff_diag_init(&dg, d->o->checkpoint_dir);
  ff_ckpt_writer *w = NULL;
  if (root) {
    mkdir(d->o->checkpoint_dir, 0755);
    w = ff_checkpoint_begin(d->o->checkpoint_dir, &layout, &meta, false, &dg);
  }
  float *blocks[3] = {d->mr.params, d->mr.m, d->mr.v};
  for (int b = 0; b < 3; b++) {
    float *mine = host_block_get(d, blocks[b]);
    for (int i = 0; i < layout.n_tensors; i++) {
      ff_tensor t = layout.tensors[i]; /* whole, at the start of `whole` */
      t.offset = 0;
      for (int k = 0; k < d->n_segs; k++) {
        seg *sg = &d->segs[k];
        if (sg->desc != desc_of[i])
          continue;
        int tag = checkpoint_tag(k, b);
        if (sg->owner == d->rank) {
          int64_t n = seg_pack(d, sg, mine, buf, true);
          if (!root)
            d->c->wait(d->c->isend(buf, (size_t)n * sizeof *buf, 0, tag));
        }
        if (!root)
          continue;
        if (sg->owner != 0)
          d->c->recv(buf, (size_t)(sg->b - sg->a) * (size_t)(sg->cols ? t.rows : t.cols) *
                              sizeof *buf, sg->owner, tag);
        pack(&t, sg, whole, buf, false);
      }
      if (w)
        ff_checkpoint_append(w, whole, (size_t)(t.rows * t.cols) * sizeof *whole);
    }
  }
  char path[4096];
  ff_status st = root ? ff_checkpoint_end(w, true, &dg, path, sizeof path) : FF_OK;
  if (root) {
    ff_diag_print(&dg, stderr);
    if (st == FF_OK && !d->o->quiet)
      fprintf(stderr, "checkpoint: %s\n", path);
  }
  ff_diag_free(&dg);
  free(desc_of);
  ff_model_rank_free(&layout);
  int ok = st == FF_OK;
  d->c->bcast(d->world, &ok, sizeof ok, 0);
  return ok ? FF_OK : FF_ERR_RUNTIME;
}

/* Every rank loads its slices from the newest checkpoint that reads back intact. */
static ff_status resume(dist *d, int64_t *done) {
  long long steps[4096];
  int n = ff_checkpoint_list(d->o->checkpoint_dir, steps, 4096);
  *done = 0;
  for (int i = 0; i < n; i++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/step-%08lld.safetensors", d->o->checkpoint_dir, steps[i]);
    ff_ckpt_meta meta;
    ff_diag dg;
    ff_diag_init(&dg, path);
    ff_status st = ff_checkpoint_load(path, &d->mr, d->model_digest, &meta, &dg);
    if (d->rank == 0)
      ff_diag_print(&dg, stderr);
    bool other_model = strstr(ff_diag_text(&dg), "model_digest") != NULL;
    ff_diag_free(&dg);
    float bad = st == FF_OK ? 0.0f : 1.0f; /* every rank must agree on the file */
    d->c->allreduce_sum(d->world, &bad, 1);
    if (bad == 0.0f) {
      *done = meta.step;
      if (d->rank == 0 && !d->o->quiet)
        fprintf(stderr, "ffrun: resumed from %s at step %lld\n", path, (long long)meta.step);
      return FF_OK;
    }
    if (other_model)
      return FF_ERR_INPUT;
    if (d->rank == 0)
      fprintf(stderr, "ffrun: %s cannot be used; trying an older checkpoint\n", path);
  }
  if (n > 0) {
    if (d->rank == 0)
      fprintf(stderr, "ffrun: no intact checkpoint in %s\n", d->o->checkpoint_dir);
    return FF_ERR_INPUT;
  }
  return FF_OK;
}

/* ---- setup and the loop ----------------------------------------------------------------- */

/* Every rank must have read the same plan: compare digests of its canonical form. */
static ff_status agree_on_plan(dist *d) {
  cJSON *tree = ff_plan_to_json(d->plan);
  char mine[32], *all = malloc((size_t)d->plan->n_ranks * 32);
  ff_digest_json(tree, mine);
  cJSON_Delete(tree);
  if (!all)
    return FF_ERR_RUNTIME;
  d->c->allgather(d->world, mine, all, 32);
  ff_status st = FF_OK;
  for (int64_t r = 0; r < d->plan->n_ranks; r++)
    if (strcmp(all + r * 32, all) != 0) {
      if (d->rank == 0)
        fprintf(stderr, "ffrun: rank %lld read a different plan (%s) than rank 0 (%s)\n",
                (long long)r, all + r * 32, all);
      st = FF_ERR_INPUT;
    }
  free(all);
  return st;
}

/* When the plan names this launch's hosts, every rank must run on the node the plan gives it.
 * Plans of emulated local clusters (node names that are no host of the launch) are run wherever
 * the launcher put them, with a notice. Device types are checked by the GPU backend. */
static ff_status check_placement(dist *d) {
  char mine[64] = {0}, *all = malloc((size_t)d->plan->n_ranks * sizeof mine);
  if (!all)
    return FF_ERR_RUNTIME;
  gethostname(mine, sizeof mine - 1);
  d->c->allgather(d->world, mine, all, sizeof mine);
  bool named = true; /* every node the plan uses is a host of this launch */
  for (int64_t r = 0; r < d->plan->n_ranks && named; r++) {
    int p = 0, s = 0, t = 0;
    ff_plan_find_rank(d->plan, r, &p, &s, &t); /* a valid plan numbers every rank */
    const ff_plan_rank *rk = &d->plan->pipelines[p].stages[s].ranks[t];
    bool found = false;
    for (int64_t q = 0; q < d->plan->n_ranks && !found; q++)
      found = strcmp(all + q * sizeof mine, d->plan->cluster.nodes[rk->node].name) == 0;
    named = found;
  }
  ff_status st = FF_OK;
  const char *want = d->plan->cluster.nodes[d->st->ranks[d->t].node].name;
  if (named && strcmp(mine, want) != 0) {
    fprintf(stderr, "ffrun: rank %d runs on host \"%s\" but the plan places it on node \"%s\" "
            "(use the plan's rankfile: ffplan hostfile)\n", d->rank, mine, want);
    st = FF_ERR_INPUT;
  } else if (!named && d->rank == 0 && !d->o->quiet) {
    fprintf(stderr, "ffrun: the plan's nodes are not the hosts of this launch (an emulated "
            "cluster); placement is not checked\n");
  }
  free(all);
  int ok = st == FF_OK, all_ok = 0;
  float f = ok ? 0.0f : 1.0f;
  d->c->allreduce_sum(d->world, &f, 1);
  all_ok = f == 0.0f;
  return all_ok ? FF_OK : FF_ERR_INPUT;
}

static ff_status setup(dist *d) {
  const ff_plan *plan = d->plan;
  find_role(d);
  for (int q = 0; q < d->p; q++)
    d->first_seq += plan->pipelines[q].batch;
  const ff_plan_rank *me = &d->st->ranks[d->t];
  ff_shard_spec spec = {d->st->layers.first, d->st->layers.end, d->st->embedding, d->st->lm_head,
                        me->heads, me->kv_heads, me->ffn, me->vocab};
  int64_t stage_id = 0;
  for (int q = 0; q < d->p; q++)
    stage_id += plan->pipelines[q].n_stages;
  d->tp = d->c->split(d->world, (int)(stage_id + d->s), d->t, d->c->device_buffers);
  d->tp_ops = (ff_tp_ops){d, d->st->n_ranks, tp_sum, tp_max};
  int slots = (int)ff_sim_in_flight(plan->training.schedule, d->pl->n_stages, d->s, d->pl->micro_batches);
  if (ff_model_rank_init(&d->mr, &plan->model, d->k, &spec, d->pl->micro_batch_size, slots,
                         plan->training.precision == FF_PRECISION_BF16, d->st->recompute) != FF_OK)
    return FF_ERR_RUNTIME;
  d->mr.tp = &d->tp_ops;
  ff_model_rank_init_weights(&d->mr, (uint64_t)plan->training.seed);
  cJSON *mj = ff_model_to_json(&plan->model, false);
  ff_digest_json(mj, d->model_digest);
  cJSON_Delete(mj);
  d->n_next = d->s + 1 < d->pl->n_stages ? d->pl->stages[d->s + 1].n_ranks : 0;
  d->n_prev = d->s > 0 ? d->pl->stages[d->s - 1].n_ranks : 0;
  int64_t NC = boundary_floats(d);
  d->p2p_device = d->c->p2p_batch && d->c->device_buffers && !d->k->host_memory;
  if (d->p2p_device) {
    d->p2p_ops = calloc((size_t)(2 * (d->n_next > d->n_prev ? d->n_next : d->n_prev) + 1),
                        sizeof *d->p2p_ops); /* a send and a receive with each neighbour */
  } else { /* page-locked on a GPU: the activations cross to and from the device through these */
    d->send_fwd = d->k->alloc_host((size_t)(slots * NC) * sizeof(float));
    d->send_bwd = d->k->alloc_host((size_t)(slots * NC) * sizeof(float));
    d->recv_buf = d->k->alloc_host((size_t)NC * sizeof(float));
  }
  d->req_fwd = calloc((size_t)(slots * (d->n_next + 1)), sizeof *d->req_fwd);
  d->req_bwd = calloc((size_t)(slots * (d->n_prev + 1)), sizeof *d->req_bwd);
  bool staged = d->p2p_device ? d->p2p_ops != NULL : d->send_fwd && d->send_bwd && d->recv_buf;
  if (!staged || !d->req_fwd || !d->req_bwd)
    return FF_ERR_RUNTIME;
  if (!d->k->host_memory) {
    if (!d->c->device_buffers) /* TP sums of device activations through the host */
      d->tp_stage = d->k->alloc_host((size_t)NC * sizeof(float));
    d->host_block = d->k->alloc_host((size_t)d->mr.n_params * sizeof(float));
    if ((!d->c->device_buffers && !d->tp_stage) || !d->host_block)
      return FF_ERR_RUNTIME;
  }
  ff_status st = build_segments(d);
  return st == FF_OK ? setup_sums(d) : st;
}

/* What each rank reports per step: seconds by kind, then its backend's memory in GiB. */
enum { T_COMPUTE, T_P2P, T_TP, T_DP, T_OPT, T_TOTAL, T_MEM_PEAK, T_MEM_DEVICE, T_KINDS };

/* Per-stage times of a step (from each stage's first rank) with the cost model's predictions. */
static void write_stages(dist *d, const double *all) {
  const ff_plan *plan = d->plan;
  fprintf(d->metrics, ", \"stages\": [");
  bool first = true;
  for (int p = 0; p < plan->n_pipelines; p++)
    for (int s = 0; s < plan->pipelines[p].n_stages; s++) {
      const ff_plan_pipeline *pl = &plan->pipelines[p];
      const double *x = all + plan->pipelines[p].stages[s].ranks[0].rank * T_KINDS;
      double busy = x[T_COMPUTE] + x[T_P2P] + x[T_TP] + x[T_DP] + x[T_OPT];
      fprintf(d->metrics, "%s{\"pipeline\": %d, \"stage\": %d, \"compute_seconds\": %.6g, "
              "\"p2p_seconds\": %.6g, \"tp_seconds\": %.6g, \"dp_seconds\": %.6g, "
              "\"bubble_seconds\": %.6g", first ? "" : ", ", p, s, x[T_COMPUTE], x[T_P2P],
              x[T_TP], x[T_DP], x[T_TOTAL] > busy ? x[T_TOTAL] - busy : 0.0);
      fprintf(d->metrics, ", \"memory_gib\": %.6g", x[T_MEM_PEAK]);
      if (x[T_MEM_DEVICE] > 0)
        fprintf(d->metrics, ", \"device_used_gib\": %.6g", x[T_MEM_DEVICE]);
      if (d->have_eval) {
        const ff_stage_eval *se = &d->eval.pipelines[p].stages[s];
        const ff_rank_eval *re = &d->eval.ranks[pl->stages[s].ranks[0].rank];
        double mb = (double)pl->micro_batches;
        fprintf(d->metrics, ", \"predicted\": {\"compute_seconds\": %.6g, \"p2p_seconds\": %.6g, "
                "\"tp_seconds\": %.6g, \"dp_seconds\": %.6g, \"bubble_seconds\": %.6g, "
                "\"memory_gib\": %.6g}",
                mb * (re->compute_fwd_seconds + re->compute_bwd_seconds + re->recompute_seconds),
                mb * ff_stage_p2p_seconds(se), mb * re->tp_seconds,
                se->dp_seconds, se->bubble_seconds, re->memory_total_bytes / FF_GIB);
      }
      fprintf(d->metrics, "}");
      first = false;
    }
  fprintf(d->metrics, "]");
}

static void report(dist *d, int64_t step, double loss, double norm, double lr, double seconds) {
  ff_kernel_memory mem;
  d->k->memory(&mem);
  /* what the device holds: on a GPU the whole device's use, on the CPU this process's peak */
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  double device_gib = mem.device_used_bytes > 0 ? (double)mem.device_used_bytes / FF_GIB
                                                : (double)ru.ru_maxrss * 1024.0 / FF_GIB;
  double mine[T_KINDS] = {d->t_compute, d->t_p2p, d->t_tp, d->t_dp, d->t_opt, seconds,
                          (double)mem.peak_bytes / FF_GIB, device_gib};
  double *all = malloc((size_t)d->plan->n_ranks * sizeof mine);
  if (!all)
    d->c->abort(1);
  d->c->allgather(d->world, mine, all, sizeof mine);
  double tokens = (double)(d->plan->training.global_batch * d->plan->model.seq_len);
  if (d->rank == 0 && d->metrics) {
    fprintf(d->metrics, "{\"step\": %lld, \"loss\": %.9g, \"lr\": %.9g, \"grad_norm\": %.9g, "
            "\"step_seconds\": %.6g, \"tokens_per_second\": %.6g, \"ranks\": %lld, "
            "\"predicted\": {\"iteration_seconds\": %.6g}", (long long)step, loss, lr, norm,
            seconds, tokens / seconds, (long long)d->plan->n_ranks,
            d->have_eval ? d->eval.iteration_seconds : 0.0);
    write_stages(d, all);
    fprintf(d->metrics, "}\n");
    fflush(d->metrics);
  }
  if (d->rank == 0 && !d->o->quiet)
    fprintf(stderr, "step %lld | loss %.4f | lr %.3g | grad norm %.3f | %.0f tokens/s | %lld ranks\n",
            (long long)step, loss, lr, norm, tokens / seconds, (long long)d->plan->n_ranks);
  free(all);
}

static void teardown(dist *d) {
  if (d->have_eval)
    ff_plan_eval_free(&d->eval);
  ff_model_rank_free(&d->mr);
  ff_data_free(&d->data);
  free(d->segs), free(d->tds);
  free(d->req_fwd), free(d->req_bwd), free(d->p2p_ops);
  free(d->packed_at), free(d->sums), free(d->sum_segs);
  if (d->k) {
    d->k->release_host(d->send_fwd);
    d->k->release_host(d->send_bwd);
    d->k->release_host(d->recv_buf);
    d->k->release_host(d->tp_stage);
    d->k->release_host(d->host_block);
    if (d->dp_device) {
      d->k->release(d->packed);
      d->k->release(d->kv_full);
    }
  }
  if (!d->dp_device)
    free(d->packed), free(d->kv_full);
  for (int i = 0; i < d->n_cache; i++) {
    d->c->release(d->cache[i].group);
    free(d->cache[i].key);
  }
  free(d->cache);
  d->c->release(d->tp);
  if (d->metrics)
    fclose(d->metrics);
}

ff_status ff_train_distributed(const ff_plan *plan, const ff_kernels *k, const ff_comm_backend *c,
                               const ff_train_opts *o) {
  static dist d; /* one per process, used by main() alone */
  memset(&d, 0, sizeof d);
  d.plan = plan, d.k = k, d.o = o, d.c = c;
  d.world = d.c->world();
  d.rank = d.c->rank(d.world);
  d.have_eval = ff_evaluate_plan(plan, &d.eval) == FF_OK;
  if (d.c->size(d.world) != plan->n_ranks) {
    if (d.rank == 0)
      fprintf(stderr, "ffrun: the plan has %lld ranks but %d processes were started (use mpirun "
              "-np %lld)\n", (long long)plan->n_ranks, d.c->size(d.world), (long long)plan->n_ranks);
    return FF_ERR_INPUT;
  }
  ff_status st = agree_on_plan(&d);
  if (st != FF_OK)
    return st;
  find_role(&d);
  if ((st = check_placement(&d)) != FF_OK)
    return st;
  d.throttle = ff_throttle_factor(o, d.rank, &plan->cluster.devices[d.st->ranks[d.t].device]);
  ff_diag dg;
  ff_diag_init(&dg, o->data_file);
  st = ff_data_load(&d.data, o->data_file, o->text, plan->model.vocab, plan->model.seq_len, &dg);
  if (d.rank == 0)
    ff_diag_print(&dg, stderr);
  ff_diag_free(&dg);
  if (st == FF_OK)
    st = setup(&d);
  /* checkpoints: the largest logical tensor bounds a segment sent (buf) and, on rank 0, the
   * tensor assembled (whole) */
  const ff_model *m = &plan->model;
  int64_t D = m->hidden / m->heads, widest = m->vocab * m->hidden;
  int64_t sizes[] = {m->heads * D * m->hidden, m->ffn_hidden * m->hidden, m->hidden};
  for (int i = 0; i < 3; i++)
    widest = sizes[i] > widest ? sizes[i] : widest;
  float *buf = NULL, *whole = NULL;
  if (st == FF_OK && o->checkpoint_dir) {
    buf = malloc((size_t)widest * sizeof *buf);
    whole = d.rank == 0 ? malloc((size_t)widest * sizeof *whole) : NULL;
    if (!buf || (d.rank == 0 && !whole))
      st = FF_ERR_RUNTIME;
  }
  int64_t done = 0;
  ff_signals_install(); /* before the first save: a write past a file-size limit is an error */
  if (st == FF_OK && o->resume && o->checkpoint_dir)
    st = resume(&d, &done);
  if (st == FF_OK && o->checkpoint_dir && done == 0)
    st = save(&d, 0, buf, whole);
  if (st == FF_OK && d.rank == 0 && o->metrics_file &&
      !(d.metrics = fopen(o->metrics_file, done ? "a" : "w")))
    d.c->abort(FF_ERR_INPUT);
  int64_t stop = o->steps > 0 ? o->steps : plan->training.steps;
  for (int64_t step = done + 1; st == FF_OK && step <= stop; step++) {
    double norm, lr, start = now();
    int bad = 0;
    double loss = train_step(&d, step, &norm, &lr, &bad);
    report(&d, step, loss, norm, lr, now() - start);
    if (bad || !isfinite(loss)) {
      if (d.rank == 0)
        fprintf(stderr, "ffrun: step %lld: %s is not finite; %s\n", (long long)step,
                bad ? "a gradient" : "the loss",
                o->skip_nonfinite ? "the step is skipped (--on-nan skip)" : "stopping (--on-nan stop)");
      if (!o->skip_nonfinite) {
        st = FF_ERR_RUNTIME;
        continue;
      } /* a skipped step goes on to the checkpoint and signal checks below */
    }
    float sig = (float)ff_signals_pending(); /* a signal to any rank stops every rank */
    d.c->allreduce_max(d.world, &sig, 1);
    bool last = step == stop || sig > 0;
    if (o->checkpoint_dir && (last || (o->checkpoint_every > 0 && step % o->checkpoint_every == 0))) {
      ff_status saved = save(&d, step, buf, whole);
      if (saved != FF_OK && o->continue_on_save_error) {
        if (d.rank == 0)
          fprintf(stderr, "ffrun: continuing without this checkpoint (--on-save-error continue)\n");
      } else {
        st = saved;
      }
    }
    if (sig > 0) {
      if (d.rank == 0)
        fprintf(stderr, "ffrun: stopped by %s after step %lld%s\n", ff_signal_name((int)sig),
                (long long)step, o->checkpoint_dir ? " with a final checkpoint" : "");
      if (st == FF_OK)
        st = (ff_status)(128 + (int)sig);
      break;
    }
  }
  free(buf);
  free(whole);
  teardown(&d);
  return st;
}
