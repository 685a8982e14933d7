/* units.c — what a unit costs under the cost model, and the stage model the layer split and
 * the integer program use (search_internal.h). */
#include <math.h>
#include <string.h>

#include "search_internal.h"

/* ---- per-unit costs ---------------------------------------------------------------------- */


/* The slowest rank of an even split holds the rounded-up share. */
static ff_shard unit_shard(const ff_model *m, int tp) {
  ff_shard sh;
  sh.heads = (double)((m->heads + tp - 1) / tp);
  int64_t g = m->heads / m->kv_heads;
  sh.kv_heads = (double)((int64_t)sh.heads + g - 1) / (double)g + 1.0;
  if (sh.kv_heads > (double)m->kv_heads)
    sh.kv_heads = (double)m->kv_heads;
  if (m->kv_heads % tp == 0)
    sh.kv_heads = (double)(m->kv_heads / tp);
  sh.ffn = (double)((m->ffn_hidden + tp - 1) / tp);
  sh.vocab = (double)((m->vocab + tp - 1) / tp);
  return sh;
}

ff_unit_cost ff_unit_cost_of(const ff_search_ctx *ctx, const ff_unit *u, int64_t b,
                                   int dp) {
  const ff_model *m = ctx->model;
  const ff_training *t = ctx->training;
  const ff_device *dev = &ctx->cluster->devices[u->device];
  ff_unit_cost uc;
  memset(&uc, 0, sizeof uc);
  ff_shard sh = unit_shard(m, u->tp);
  double s = (double)m->seq_len, h = (double)m->hidden;
  int node[1024], gpu[1024];
  for (int i = 0; i < u->tp; i++) {
    node[i] = u->node;
    gpu[i] = u->first_gpu + i;
  }
  double tp_ar = ff_comm_allreduce(ctx->cluster, u->tp, node, gpu,
                                   (double)b * s * h * ff_cost_wire_bytes(t));
  double tp_rows = ff_comm_allreduce(ctx->cluster, u->tp, node, gpu, (double)b * s * 4.0);
  double bpp = ff_mem_bytes_per_param(t->precision, t->zero1, dp);
  for (int mode = 0; mode < FF_SEARCH_MODES; mode++) {
    ff_layer_time lt = ff_cost_layer_time(m, t->precision, t->attention, dev, sh, (double)b, u->tp,
                                          (ff_recompute)mode, tp_ar);
    uc.layer_seconds[mode] = lt.fwd + lt.bwd + lt.recompute + lt.tp_fwd + lt.tp_bwd;
    uc.act_bytes_per_layer[mode] =
        ff_mem_layer_kept_bytes(m, sh, (double)b, t->precision, (ff_recompute)mode);
    uc.buffer_bytes[mode] =
        ff_mem_stage_buffer_bytes(m, sh, (double)b, t->precision, (ff_recompute)mode, true, 0.0);
  }
  uc.slot_bytes = ff_mem_stage_buffer_bytes(m, sh, (double)b, t->precision, FF_RECOMPUTE_NONE,
                                            false, 1.0) -
                  ff_mem_stage_buffer_bytes(m, sh, (double)b, t->precision, FF_RECOMPUTE_NONE,
                                            false, 0.0);
  uc.state_bytes_per_layer = ff_cost_layer_params(m, sh) * bpp;
  uc.capacity_bytes = (dev->memory_gib - dev->runtime_reserve_gib) * FF_GIB;
  for (int end = 0; end < 2; end++) {
    ff_end_time et = end == 0 ? ff_cost_embedding_time(m, t, dev, (double)b)
                              : ff_cost_head_time(m, t, dev, sh, (double)b);
    double sec = et.fwd + et.bwd;
    if (u->tp > 1)
      sec += ff_cost_end_tp_fwd(et, tp_ar, tp_rows) + ff_cost_end_tp_bwd(et, tp_ar, tp_rows);
    *(end == 0 ? &uc.embed_seconds : &uc.head_seconds) = sec;
  }
  uc.embed_bytes = sh.vocab * h * bpp;
  uc.head_bytes =
      (sh.vocab * h + h) * bpp + ff_mem_logits_bytes(m, sh, (double)b, t->precision);
  uc.peak_flops = ff_peak_flops(dev, t->precision) * u->tp;
  return uc;
}

/* Two units cost the same when their device, TP degree and the links their group uses agree. */
bool ff_unit_same_kind(const ff_search_ctx *ctx, const ff_unit *a, const ff_unit *b) {
  if (a->device != b->device || a->tp != b->tp)
    return false;
  if (a->tp == 1)
    return true;
  const ff_node *x = &ctx->cluster->nodes[a->node], *y = &ctx->cluster->nodes[b->node];
  return x->island_gpus == y->island_gpus &&
         x->island.bandwidth_gb_per_s == y->island.bandwidth_gb_per_s &&
         x->island.latency_us == y->island.latency_us &&
         x->intra.bandwidth_gb_per_s == y->intra.bandwidth_gb_per_s &&
         x->intra.latency_us == y->intra.latency_us && a->first_gpu % x->island_gpus == 0 &&
         b->first_gpu % y->island_gpus == 0;
}

/* Costs of every unit, computed once per kind of unit (a few per cluster). */
void ff_unit_costs(const ff_search_ctx *ctx, const ff_unit *units, int n, int64_t b, int dp,
                       ff_unit_cost *out) {
  enum { CACHE = 16 };
  int seen[CACHE], n_seen = 0;
  for (int u = 0; u < n; u++) {
    int hit = -1;
    for (int k = n_seen - 1; k >= 0 && hit < 0; k--)
      if (ff_unit_same_kind(ctx, &units[seen[k]], &units[u]))
        hit = seen[k];
    if (hit >= 0) {
      out[u] = out[hit];
      continue;
    }
    out[u] = ff_unit_cost_of(ctx, &units[u], b, dp);
    if (n_seen == CACHE)
      memmove(seen, seen + 1, (CACHE - 1) * sizeof *seen), n_seen--;
    seen[n_seen++] = u;
  }
}

/* The layer-split model of a unit of cost `uc` at stage k of p (1F1B: the micro-batches in
 * flight there, the embedding on the first stage, the LM head on the last). */
ff_stage_model ff_stage_model_at(const ff_search_ctx *ctx, const ff_unit_cost *uc, int k, int p,
                                  int64_t m_est) {
  ff_stage_model sm;
  int64_t in_flight = ff_sim_in_flight(ctx->training->schedule, p, k, m_est);
  double fixed_bytes = 0;
  sm.fixed_seconds = 0;
  sm.end = k == 0 || k == p - 1;
  if (k == 0) {
    fixed_bytes += uc->embed_bytes;
    sm.fixed_seconds += uc->embed_seconds;
  }
  if (k == p - 1) {
    fixed_bytes += uc->head_bytes;
    sm.fixed_seconds += uc->head_seconds;
  }
  for (int md = 0; md < FF_SEARCH_MODES; md++) {
    sm.tau[md] = uc->layer_seconds[md];
    double per_layer = uc->state_bytes_per_layer + uc->act_bytes_per_layer[md] * (double)in_flight;
    double room = uc->capacity_bytes - fixed_bytes - uc->buffer_bytes[md] -
                  uc->slot_bytes * (double)in_flight;
    sm.cap[md] = room > 0 ? floor(room / per_layer) : -1;
  }
  return sm;
}

/* Per-stage models of one pipeline for the layer split. */
void ff_stage_models(const ff_search_ctx *ctx, const ff_cand_pipe *cp, const ff_unit_cost *costs,
                         int64_t m_est, ff_stage_model *sms) {
  for (int k = 0; k < cp->n_stages; k++)
    sms[k] = ff_stage_model_at(ctx, &costs[cp->stages[k].unit], k, cp->n_stages, m_est);
}
