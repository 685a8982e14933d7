/* dist_grads.c — data parallelism per element (see dist.c): every logical tensor cut into
 * segments at every shard boundary of every pipeline, a group for the holders of each segment,
 * and the sums of a step, started bucket by bucket as the backward finishes them (in one order
 * on every rank) and waited for before the optimizer, with the global gradient norm. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist_internal.h"

/* ---- slices of the logical tensors ---------------------------------------------------- */

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

ff_status ff_dist_build_segments(dist *d) {
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
int64_t ff_dist_pack(const ff_tensor *t, const seg *sg, float *base, float *buf, bool out) {
  seg_shape sh = shape_of(t, sg);
  move_seg(sh, base, buf, out);
  return sh.rows * sh.width;
}

int64_t ff_dist_seg_pack(const dist *d, const seg *sg, float *base, float *buf, bool out) {
  return ff_dist_pack(&d->mr.tensors[sg->tensor], sg, base, buf, out);
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
  double t0 = now(), cpu = cpu_now(d);
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
  d->c_comm += cpu_now(d) - cpu;
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
double ff_dist_finish_gradients(dist *d) {
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
  for (int i = 0; i < d->n_segs; i++) {
    if (d->segs[i].tensor < 0 || !d->segs[i].norm_owner)
      continue;
    seg_shape sh = shape_at(d, i);
    if (!d->dp_device || !contiguous(sh)) {
      sumsq += seg_sumsq(d, i);
      continue;
    }
    /* on a GPU each sum is a wait for the device: a run of segments that lie back to back in
     * the block is summed at once (one wait per step on one rank, not one per tensor) */
    int64_t end = sh.start + sh.rows * sh.width;
    for (int j = i + 1; j < d->n_segs && d->segs[j].tensor >= 0 && d->segs[j].norm_owner; j++) {
      seg_shape nx = shape_at(d, j);
      if (!contiguous(nx) || nx.start != end)
        break;
      end += nx.rows * nx.width;
      i = j;
    }
    sumsq += d->k->sum_squares(d->sums_on + sh.start, end - sh.start);
  }
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
  /* test hook (FF_TEST_SWAP_SUMS=RANK): that rank starts two sums of one bucket over different
   * groups in the other order, which the order checker (FF_CHECK_COMM_ORDER=1) must catch */
  const char *swap = getenv("FF_TEST_SWAP_SUMS");
  for (int q = 0; swap && atoi(swap) == d->rank && q + 1 < d->n_sums; q++)
    if (d->sums[q].bucket == d->sums[q + 1].bucket && d->sums[q].cache != d->sums[q + 1].cache) {
      dp_sum t = d->sums[q];
      d->sums[q] = d->sums[q + 1];
      d->sums[q + 1] = t;
      break;
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
ff_status ff_dist_setup_sums(dist *d) {
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
