/* ff_eval.c — evaluating a whole plan with the cost model: each rank's memory and per-micro-batch
 * time, each stage's time (its slowest TP rank), each pipeline's makespan by simulation, the data-
 * parallel gradient synchronisation that the pipelines' tails do not hide, the optimizer step,
 * and MFU/HFU. docs/cost-model.md describes every term. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ff_cost.h"

static ff_shard rank_shard(const ff_plan_stage *st, const ff_plan_rank *r) {
  ff_shard s = {(double)(r->heads.end - r->heads.first),
                (double)(r->kv_heads.end - r->kv_heads.first), (double)(r->ffn.end - r->ffn.first),
                0.0};
  if (st->embedding || st->lm_head)
    s.vocab = (double)(r->vocab.end - r->vocab.first);
  return s;
}

/* Parameters held by one rank of a stage. */
static double rank_params(const ff_model *m, const ff_plan_stage *st, ff_shard sh) {
  double h = (double)m->hidden;
  double p = (double)(st->layers.end - st->layers.first) * ff_cost_layer_params(m, sh);
  if (st->embedding)
    p += sh.vocab * h;
  if (st->lm_head) {
    p += h; /* final norm */
    if (!(m->tied_embeddings && st->embedding))
      p += sh.vocab * h;
  }
  return p;
}

static void stage_group(const ff_plan_stage *st, int *node, int *gpu) {
  for (int r = 0; r < st->n_ranks; r++) {
    node[r] = st->ranks[r].node;
    gpu[r] = st->ranks[r].gpu;
  }
}

/* Concurrent flows per node that share its NICs (cost-model.md §5.8): n_nodes entries each. */
typedef struct nic_flows {
  int *dp;      /* ranks whose gradient all-reduce leaves the node */
  int *out, *in; /* stage transfers leaving / entering the node, the busier direction */
} nic_flows;

/* Flows of the stage boundaries that cross nodes (ff_boundary_flows each: one per piece),
 * counted at both ends, per direction; each node keeps the busier direction. */
static void count_boundary_flows(const ff_plan *plan, nic_flows *f, int *fwd_out, int *fwd_in) {
  int n = plan->cluster.n_nodes;
  memset(fwd_out, 0, (size_t)n * sizeof *fwd_out);
  memset(fwd_in, 0, (size_t)n * sizeof *fwd_in);
  memset(f->out, 0, (size_t)n * sizeof *f->out); /* backward: leaving s + 1, entering s */
  memset(f->in, 0, (size_t)n * sizeof *f->in);
  for (int p = 0; p < plan->n_pipelines; p++)
    for (int s = 0; s + 1 < plan->pipelines[p].n_stages; s++) {
      const ff_plan_stage *x = &plan->pipelines[p].stages[s], *y = x + 1;
      int a = x->ranks[0].node, b = y->ranks[0].node;
      int flows = ff_boundary_flows(x->n_ranks, y->n_ranks);
      if (a == b)
        continue;
      fwd_out[a] += flows, fwd_in[b] += flows;
      f->out[b] += flows, f->in[a] += flows;
    }
  for (int x = 0; x < n; x++) {
    if (fwd_out[x] > f->out[x])
      f->out[x] = fwd_out[x];
    if (fwd_in[x] > f->in[x])
      f->in[x] = fwd_in[x];
  }
}

/* Per micro-batch transfer of b·s·h activations from stage a to stage b as ffrun moves them
 * (ff_comm_boundary: each element once, in pieces; between nodes the pieces share the NICs of
 * both nodes with the node's other boundary flows). The receiving group's gather is its own
 * (eval_stage). */
static double boundary_seconds(const ff_plan *plan, const ff_plan_stage *from,
                               const ff_plan_stage *to, double bytes, const nic_flows *f) {
  const ff_cluster *c = &plan->cluster;
  const ff_plan_rank *x = &from->ranks[0], *y = &to->ranks[0];
  ff_link link = ff_cluster_gpu_link(c, x->node, x->gpu, y->node, y->gpu);
  bool cross = x->node != y->node;
  if (cross)
    link = ff_cluster_shared_link(c, link, x->node, y->node, f->out[x->node], f->in[y->node]);
  return ff_comm_boundary(bytes, from->n_ranks, to->n_ranks, cross, link);
}

/* The rank in pipeline q that holds the same weights as (stage st, rank r) does, for the DP
 * group: the stage holding st's first layer (or the embedding / LM head for an empty stage) and
 * the TP rank whose heads contain r's first head. */
static const ff_plan_rank *dp_peer(const ff_plan *plan, int q, const ff_plan_stage *st,
                                   const ff_plan_rank *r, const ff_plan_stage **stage_out) {
  const ff_plan_pipeline *pl = &plan->pipelines[q];
  const ff_plan_stage *match = &pl->stages[0];
  for (int s = 0; s < pl->n_stages; s++) {
    const ff_plan_stage *cand = &pl->stages[s];
    if (st->layers.first == st->layers.end) {
      if ((st->lm_head && cand->lm_head) || (st->embedding && cand->embedding)) {
        match = cand;
        break;
      }
    } else if (cand->layers.first <= st->layers.first && st->layers.first < cand->layers.end) {
      match = cand;
      break;
    }
  }
  *stage_out = match;
  for (int t = 0; t < match->n_ranks; t++)
    if (match->ranks[t].heads.first <= r->heads.first && r->heads.first < match->ranks[t].heads.end)
      return &match->ranks[t];
  return &match->ranks[0];
}

ff_transfers ff_plan_transfers(const ff_plan *plan) {
  for (int p = 0; p < plan->n_pipelines; p++)
    for (int s = 0; s < plan->pipelines[p].n_stages; s++) {
      const ff_plan_stage *st = &plan->pipelines[p].stages[s];
      for (int t = 0; t < st->n_ranks; t++)
        if (plan->cluster.devices[plan->cluster.nodes[st->ranks[t].node].device].cpu)
          return FF_TRANSFERS_OVERLAPPED;
    }
  return FF_TRANSFERS_PAIRED;
}

static ff_status eval_alloc(const ff_plan *plan, ff_plan_eval *e) {
  memset(e, 0, sizeof *e);
  e->n_pipelines = plan->n_pipelines;
  e->n_ranks = plan->n_ranks;
  e->pipelines = calloc((size_t)plan->n_pipelines, sizeof *e->pipelines);
  e->ranks = calloc((size_t)(plan->n_ranks ? plan->n_ranks : 1), sizeof *e->ranks);
  e->rank_layers = calloc((size_t)(plan->n_ranks ? plan->n_ranks : 1), sizeof *e->rank_layers);
  if (!e->pipelines || !e->ranks || !e->rank_layers)
    return FF_ERR_RUNTIME;
  for (int p = 0; p < plan->n_pipelines; p++) {
    e->pipelines[p].stages = calloc((size_t)plan->pipelines[p].n_stages, sizeof(ff_stage_eval));
    if (!e->pipelines[p].stages)
      return FF_ERR_RUNTIME;
  }
  return FF_OK;
}

/* Memory and per-micro-batch time of every rank of one stage; the stage's own times. */
static void eval_stage(const ff_plan *plan, int p, int s, ff_plan_eval *e, int *node, int *gpu,
                       const nic_flows *f) {
  const ff_model *m = &plan->model;
  const ff_training *tr = &plan->training;
  const ff_plan_pipeline *pl = &plan->pipelines[p];
  const ff_plan_stage *st = &pl->stages[s];
  ff_stage_eval *se = &e->pipelines[p].stages[s];
  double b = (double)pl->micro_batch_size, sq = (double)m->seq_len, h = (double)m->hidden;
  double layers = (double)(st->layers.end - st->layers.first);
  double act_bytes = b * sq * h * ff_cost_wire_bytes(tr);
  stage_group(st, node, gpu);
  double tp_allreduce = ff_comm_allreduce(&plan->cluster, st->n_ranks, node, gpu, act_bytes);
  double tp_rows = st->n_ranks > 1 && (st->embedding || st->lm_head)
                       ? ff_comm_allreduce(&plan->cluster, st->n_ranks, node, gpu, b * sq * 4.0)
                       : 0.0;
  double gather = ff_comm_gather(&plan->cluster, st->n_ranks, node, gpu, act_bytes);
  se->gather_fwd_seconds = s > 0 ? gather : 0.0;
  se->gather_bwd_seconds = s + 1 < pl->n_stages ? gather : 0.0;
  se->in_flight = ff_sim_in_flight(tr->schedule, pl->n_stages, s, pl->micro_batches);
  int dp = plan->n_pipelines;
  const ff_device *prev_dev = NULL;
  ff_shard prev_sh;
  ff_layer_time prev_lt;
  memset(&prev_sh, 0, sizeof prev_sh);
  memset(&prev_lt, 0, sizeof prev_lt);
  for (int t = 0; t < st->n_ranks; t++) {
    const ff_plan_rank *r = &st->ranks[t];
    const ff_device *dev = &plan->cluster.devices[r->device];
    ff_rank_eval *re = &e->ranks[r->rank];
    ff_shard sh = rank_shard(st, r);
    /* Ranks of a group with the same shard on the same device take the same time. */
    if (t == 0 || dev != prev_dev || memcmp(&sh, &prev_sh, sizeof sh) != 0)
      prev_lt = ff_cost_layer_time(m, tr->precision, tr->attention, dev, sh, b, st->n_ranks,
                                   st->recompute, tp_allreduce);
    prev_dev = dev;
    prev_sh = sh;
    ff_layer_time lt = prev_lt;
    double fwd = layers * lt.fwd, bwd = layers * lt.bwd, rec = layers * lt.recompute;
    double tp_fwd = layers * lt.tp_fwd, tp_bwd = layers * lt.tp_bwd;
    for (int end = 0; end < 2; end++) {
      if (!(end == 0 ? st->embedding : st->lm_head))
        continue;
      ff_end_time et = end == 0 ? ff_cost_embedding_time(m, tr, dev, b)
                                : ff_cost_head_time(m, tr, dev, sh, b);
      fwd += et.fwd;
      bwd += et.bwd;
      if (st->n_ranks > 1) {
        tp_fwd += ff_cost_end_tp_fwd(et, tp_allreduce, tp_rows);
        tp_bwd += ff_cost_end_tp_bwd(et, tp_allreduce, tp_rows);
      }
    }
    re->compute_fwd_seconds = fwd;
    re->compute_bwd_seconds = bwd;
    re->recompute_seconds = rec;
    re->tp_seconds = tp_fwd + tp_bwd;
    re->fwd_seconds = fwd + tp_fwd;
    re->bwd_seconds = bwd + rec + tp_bwd;
    re->params = rank_params(m, st, sh);
    e->rank_layers[r->rank] = st->layers;
    double zero_d = tr->zero1 && dp > 1 ? (double)dp : 1.0;
    /* bf16: the matmuls read a bf16 copy of the fp32 master weights; fp32: the weights are the
     * master */
    bool bf16_copy = tr->precision == FF_PRECISION_BF16;
    re->memory_bytes[FF_MEM_WEIGHTS] = re->params * (bf16_copy ? 2.0 : 4.0);
    re->memory_bytes[FF_MEM_GRADIENTS] = re->params * 4.0;
    re->memory_bytes[FF_MEM_MASTER] = bf16_copy ? re->params * 4.0 / zero_d : 0.0;
    re->memory_bytes[FF_MEM_OPTIMIZER] = re->params * 8.0 / zero_d;
    double kept = ff_mem_layer_kept_bytes(m, sh, b, tr->precision, st->recompute);
    re->memory_bytes[FF_MEM_ACTIVATIONS] =
        layers * (double)se->in_flight * kept +
        ff_mem_stage_buffer_bytes(m, sh, b, tr->precision, st->recompute, layers > 0,
                                  (double)se->in_flight);
    re->memory_bytes[FF_MEM_LOGITS] =
        st->lm_head ? ff_mem_logits_bytes(m, sh, b, tr->precision) : 0.0;
    re->memory_bytes[FF_MEM_RESERVE] = dev->runtime_reserve_gib * FF_GIB;
    re->memory_total_bytes = 0.0;
    for (int i = 0; i < FF_MEM_COUNT; i++)
      re->memory_total_bytes += re->memory_bytes[i];
    re->capacity_bytes = dev->memory_gib * FF_GIB;
    double touched = tr->precision == FF_PRECISION_BF16 ? 30.0 : 28.0;
    re->optimizer_seconds = ff_time_memory(dev, re->params * touched / zero_d);
    if (re->fwd_seconds + re->bwd_seconds > se->fwd_seconds + se->bwd_seconds || t == 0) {
      se->fwd_seconds = re->fwd_seconds;
      se->bwd_seconds = re->bwd_seconds;
      se->slowest_rank = t;
    }
    double hw = layers * (3.0 * ff_flops_layer_forward(m, b) + ff_flops_layer_recompute(m, b, st->recompute));
    if (st->lm_head)
      hw += 3.0 * ff_flops_head_forward(m, b);
    se->hardware_flops = hw * (double)pl->micro_batches;
  }
  if (s + 1 < pl->n_stages) {
    se->send_fwd_seconds = boundary_seconds(plan, st, &pl->stages[s + 1], act_bytes, f);
    se->send_bwd_seconds = boundary_seconds(plan, &pl->stages[s + 1], st, act_bytes, f);
  }
}

/* Gradient all-reduce across pipelines for every rank of a stage; the stage waits for its
 * slowest rank. A DP group is computed once: its members that hold exactly the same layers and
 * heads (the usual case) get the same time without recomputing it. With `count` set, only count
 * into f->dp the ranks whose group leaves their node (every rank's all-reduce runs at the end of
 * the iteration, so they share the node's NICs); otherwise time the all-reduces over them. */
static void eval_stage_dp(const ff_plan *plan, int p, int s, ff_plan_eval *e, int *node, int *gpu,
                          const ff_plan_rank **peers, bool *done, nic_flows *f, bool count) {
  const ff_plan_stage *st = &plan->pipelines[p].stages[s];
  ff_stage_eval *se = &e->pipelines[p].stages[s];
  if (plan->n_pipelines <= 1)
    return;
  for (int t = 0; t < st->n_ranks; t++) {
    const ff_plan_rank *r = &st->ranks[t];
    ff_rank_eval *re = &e->ranks[r->rank];
    if (!done[r->rank]) {
      const ff_plan_stage *peer_stage[1];
      for (int q = 0; q < plan->n_pipelines; q++) {
        peers[q] = q == p ? r : dp_peer(plan, q, st, r, peer_stage);
        node[q] = peers[q]->node;
        gpu[q] = peers[q]->gpu;
      }
      bool leaves = false;
      for (int q = 1; q < plan->n_pipelines && !leaves; q++)
        leaves = node[q] != node[0];
      if (count)
        f->dp[r->node] += leaves;
      else
        re->dp_seconds = ff_comm_allreduce_shared(&plan->cluster, plan->n_pipelines, node, gpu,
                                                  re->params * 4.0, f->dp);
      done[r->rank] = true;
      for (int q = 0; q < plan->n_pipelines; q++) {
        const ff_plan_rank *x = peers[q];
        if (done[x->rank] || e->ranks[x->rank].params != re->params)
          continue;
        if (x->heads.first == r->heads.first && x->heads.end == r->heads.end &&
            e->rank_layers[x->rank].first == st->layers.first &&
            e->rank_layers[x->rank].end == st->layers.end) {
          if (count)
            f->dp[x->node] += leaves;
          else
            e->ranks[x->rank].dp_seconds = re->dp_seconds;
          done[x->rank] = true;
        }
      }
    }
    if (re->dp_seconds > se->dp_seconds)
      se->dp_seconds = re->dp_seconds;
  }
}

static ff_status eval_pipeline(const ff_plan *plan, int p, ff_plan_eval *e) {
  const ff_plan_pipeline *pl = &plan->pipelines[p];
  ff_pipeline_eval *pe = &e->pipelines[p];
  int n = pl->n_stages;
  double *buf = malloc((size_t)n * 6 * sizeof *buf);
  int64_t *peak = malloc((size_t)n * sizeof *peak);
  if (!buf || !peak) {
    free(buf), free(peak);
    return FF_ERR_RUNTIME;
  }
  double *f = buf, *b = buf + n, *sf = buf + 2 * n, *sb = buf + 3 * n, *fin = buf + 4 * n,
         *busy = buf + 5 * n;
  ff_stage_sim_inputs(pe, n, buf);
  pe->seconds = ff_sim_pipeline(plan->training.schedule, e->transfers, n, pl->micro_batches, f, b,
                                sf, sb, fin, busy, peak);
  if (pe->seconds < 0) {
    free(buf), free(peak);
    return FF_ERR_RUNTIME;
  }
  pe->end_seconds = pe->seconds;
  pe->bubble_seconds = 0.0;
  for (int s = 0; s < n; s++) {
    ff_stage_eval *se = &pe->stages[s];
    se->finish_seconds = fin[s];
    se->busy_seconds = busy[s];
    se->bubble_seconds = pe->seconds > busy[s] ? pe->seconds - busy[s] : 0.0; /* no −1e-14 */
    if (se->bubble_seconds > pe->bubble_seconds)
      pe->bubble_seconds = se->bubble_seconds;
    if (fin[s] + se->dp_seconds > pe->end_seconds)
      pe->end_seconds = fin[s] + se->dp_seconds;
  }
  free(buf), free(peak);
  return FF_OK;
}

static void eval_totals(const ff_plan *plan, ff_plan_eval *e) {
  const ff_model *m = &plan->model;
  double tokens = (double)plan->training.global_batch * (double)m->seq_len;
  e->model_flops_per_iteration = ff_flops_model_per_token(m) * tokens;
  e->critical_pipeline = 0;
  double second = 0.0;
  for (int p = 0; p < plan->n_pipelines; p++) {
    const ff_pipeline_eval *pe = &e->pipelines[p];
    if (pe->end_seconds > e->pipelines[e->critical_pipeline].end_seconds || p == 0) {
      if (p > 0)
        second = e->pipelines[e->critical_pipeline].end_seconds;
      e->critical_pipeline = p;
    } else if (pe->end_seconds > second) {
      second = pe->end_seconds;
    }
    if (pe->seconds > e->pipeline_seconds)
      e->pipeline_seconds = pe->seconds;
    for (int s = 0; s < plan->pipelines[p].n_stages; s++)
      e->hardware_flops_per_iteration += pe->stages[s].hardware_flops;
  }
  const ff_pipeline_eval *crit = &e->pipelines[e->critical_pipeline];
  e->critical_margin_seconds = plan->n_pipelines > 1 ? crit->end_seconds - second : 0.0;
  e->optimizer_seconds = 0.0;
  e->fits = true;
  for (int64_t r = 0; r < plan->n_ranks; r++) {
    const ff_rank_eval *re = &e->ranks[r];
    if (re->optimizer_seconds > e->optimizer_seconds)
      e->optimizer_seconds = re->optimizer_seconds;
    if (re->memory_total_bytes > e->peak_memory_bytes)
      e->peak_memory_bytes = re->memory_total_bytes;
    if (re->memory_total_bytes > re->capacity_bytes) {
      e->fits = false;
      e->ranks_over_memory++;
    }
  }
  e->iteration_seconds = crit->end_seconds + e->optimizer_seconds;
  e->dp_exposed_seconds = crit->end_seconds - crit->seconds;
  e->tokens_per_second = tokens / e->iteration_seconds;
  e->peak_flops_sum = 0.0;
  for (int p = 0; p < plan->n_pipelines; p++)
    for (int s = 0; s < plan->pipelines[p].n_stages; s++)
      for (int t = 0; t < plan->pipelines[p].stages[s].n_ranks; t++) {
        const ff_plan_rank *r = &plan->pipelines[p].stages[s].ranks[t];
        e->peak_flops_sum += ff_peak_flops(&plan->cluster.devices[r->device], plan->training.precision);
      }
  e->mfu = e->model_flops_per_iteration / (e->iteration_seconds * e->peak_flops_sum);
  e->hfu = e->hardware_flops_per_iteration / (e->iteration_seconds * e->peak_flops_sum);
  /* The critical pipeline's bottleneck stage explains the breakdown. */
  const ff_plan_pipeline *pl = &plan->pipelines[e->critical_pipeline];
  int worst = 0;
  for (int s = 1; s < pl->n_stages; s++)
    if (crit->stages[s].busy_seconds > crit->stages[worst].busy_seconds)
      worst = s;
  e->critical_stage = worst;
  const ff_stage_eval *se = &crit->stages[worst];
  const ff_rank_eval *re = &e->ranks[pl->stages[worst].ranks[se->slowest_rank].rank];
  double mb = (double)pl->micro_batches;
  e->compute_seconds = mb * (re->compute_fwd_seconds + re->compute_bwd_seconds + re->recompute_seconds);
  e->tp_seconds = mb * re->tp_seconds;
  e->pp_seconds = mb * ff_stage_p2p_seconds(se);
  e->bubble_seconds = se->bubble_seconds;
  e->dp_seconds = e->dp_exposed_seconds;
}

static void eval_binding(const ff_plan *plan, ff_plan_eval *e) {
  for (int p = 0; p < plan->n_pipelines; p++)
    for (int s = 0; s < plan->pipelines[p].n_stages; s++) {
      const ff_plan_stage *st = &plan->pipelines[p].stages[s];
      ff_stage_eval *se = &e->pipelines[p].stages[s];
      se->binding = 0;
      double compute = 0.0, comm = ff_stage_p2p_seconds(se);
      for (int t = 0; t < st->n_ranks; t++) {
        const ff_rank_eval *re = &e->ranks[st->ranks[t].rank];
        if (re->memory_total_bytes >= 0.95 * re->capacity_bytes)
          se->binding = 1;
        double c = re->compute_fwd_seconds + re->compute_bwd_seconds + re->recompute_seconds;
        if (c > compute)
          compute = c;
        if (re->tp_seconds > comm)
          comm = re->tp_seconds;
      }
      if (se->binding == 0 && comm > compute)
        se->binding = 2;
    }
}

double ff_stage_p2p_seconds(const ff_stage_eval *se) {
  return se->send_fwd_seconds + se->send_bwd_seconds + se->gather_fwd_seconds +
         se->gather_bwd_seconds;
}

void ff_stage_sim_inputs(const ff_pipeline_eval *pe, int n, double *buf) {
  for (int s = 0; s < n; s++) {
    const ff_stage_eval *se = &pe->stages[s];
    buf[s] = se->gather_fwd_seconds + se->fwd_seconds;
    buf[n + s] = se->gather_bwd_seconds + se->bwd_seconds;
    buf[2 * n + s] = se->send_fwd_seconds;
    buf[3 * n + s] = se->send_bwd_seconds;
  }
}

ff_status ff_evaluate_plan(const ff_plan *plan, ff_plan_eval *out) {
  ff_status st = eval_alloc(plan, out);
  int widest = plan->n_pipelines;
  for (int p = 0; p < plan->n_pipelines; p++)
    for (int s = 0; s < plan->pipelines[p].n_stages; s++)
      if (plan->pipelines[p].stages[s].n_ranks > widest)
        widest = plan->pipelines[p].stages[s].n_ranks;
  int *node = malloc((size_t)widest * sizeof *node), *gpu = malloc((size_t)widest * sizeof *gpu);
  const ff_plan_rank **peers = malloc((size_t)widest * sizeof *peers);
  size_t n_ranks = (size_t)(plan->n_ranks ? plan->n_ranks : 1);
  bool *done = calloc(n_ranks, sizeof *done);
  int *per_node = calloc(5 * (size_t)plan->cluster.n_nodes + 1, sizeof *per_node);
  if (st != FF_OK || !node || !gpu || !peers || !done || !per_node) {
    free(node), free(gpu), free(peers), free(done), free(per_node);
    ff_plan_eval_free(out);
    return FF_ERR_RUNTIME;
  }
  int n_nodes = plan->cluster.n_nodes;
  out->transfers = ff_plan_transfers(plan);
  nic_flows flows = {per_node, per_node + n_nodes, per_node + 2 * n_nodes};
  count_boundary_flows(plan, &flows, per_node + 3 * n_nodes, per_node + 4 * n_nodes);
  for (int p = 0; p < plan->n_pipelines; p++)
    for (int s = 0; s < plan->pipelines[p].n_stages; s++)
      eval_stage(plan, p, s, out, node, gpu, &flows);
  for (int pass = 0; pass < 2; pass++) { /* count the flows, then time the all-reduces */
    memset(done, 0, n_ranks * sizeof *done);
    for (int p = 0; p < plan->n_pipelines; p++)
      for (int s = 0; s < plan->pipelines[p].n_stages; s++)
        eval_stage_dp(plan, p, s, out, node, gpu, peers, done, &flows, pass == 0);
  }
  free(node), free(gpu), free(peers), free(done), free(per_node);
  for (int p = 0; p < plan->n_pipelines && st == FF_OK; p++)
    st = eval_pipeline(plan, p, out);
  if (st != FF_OK) {
    ff_plan_eval_free(out);
    return st;
  }
  eval_totals(plan, out);
  eval_binding(plan, out);
  return FF_OK;
}

void ff_plan_eval_free(ff_plan_eval *e) {
  if (e->pipelines)
    for (int p = 0; p < e->n_pipelines; p++)
      free(e->pipelines[p].stages);
  free(e->pipelines);
  free(e->ranks);
  free(e->rank_layers);
  memset(e, 0, sizeof *e);
}

static void set(ff_predicted *pr, int key, double v) {
  pr->value[key] = v;
  pr->has[key] = true;
}

void ff_plan_set_predicted(ff_plan *plan, const ff_plan_eval *e) {
  ff_predicted *pr = &plan->predicted;
  set(pr, FF_PLAN_PRED_ITERATION_SECONDS, e->iteration_seconds);
  set(pr, FF_PLAN_PRED_TOKENS_PER_SECOND, e->tokens_per_second);
  set(pr, FF_PLAN_PRED_MFU, e->mfu);
  set(pr, FF_PLAN_PRED_HFU, e->hfu);
  set(pr, FF_PLAN_PRED_PEAK_MEMORY_GIB, e->peak_memory_bytes / FF_GIB);
  set(pr, FF_PLAN_PRED_COMPUTE_SECONDS, e->compute_seconds);
  set(pr, FF_PLAN_PRED_TP_SECONDS, e->tp_seconds);
  set(pr, FF_PLAN_PRED_PP_SECONDS, e->pp_seconds);
  set(pr, FF_PLAN_PRED_DP_SECONDS, e->dp_seconds);
  set(pr, FF_PLAN_PRED_BUBBLE_SECONDS, e->bubble_seconds);
  set(pr, FF_PLAN_PRED_OPTIMIZER_SECONDS, e->optimizer_seconds);
  for (int p = 0; p < plan->n_pipelines; p++) {
    ff_plan_pipeline *pl = &plan->pipelines[p];
    set(&pl->predicted, FF_PIPE_PRED_SECONDS, e->pipelines[p].seconds);
    set(&pl->predicted, FF_PIPE_PRED_BUBBLE_SECONDS, e->pipelines[p].bubble_seconds);
    for (int s = 0; s < pl->n_stages; s++) {
      ff_plan_stage *st = &pl->stages[s];
      const ff_stage_eval *se = &e->pipelines[p].stages[s];
      double mem = 0.0;
      for (int t = 0; t < st->n_ranks; t++) {
        ff_plan_rank *r = &st->ranks[t];
        r->has_memory = true;
        r->memory_gib = e->ranks[r->rank].memory_total_bytes / FF_GIB;
        if (r->memory_gib > mem)
          mem = r->memory_gib;
      }
      set(&st->predicted, FF_STAGE_PRED_FORWARD_SECONDS, se->fwd_seconds);
      set(&st->predicted, FF_STAGE_PRED_BACKWARD_SECONDS, se->bwd_seconds);
      set(&st->predicted, FF_STAGE_PRED_MEMORY_GIB, mem);
    }
  }
}
