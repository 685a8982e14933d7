/* dist.c — the training loop of every plan, of one rank (comm_self.c) or many (under MPI):
 * every rank finds its role (pipeline, stage, TP index), builds its shard of the model, runs its
 * stage's 1F1B (or GPipe) order of forwards and backwards, exchanges activations and their
 * gradients with the neighbouring stages (dist_stages.c), and joins the gradient sums its
 * parameters take part in (dist_grads.c); checkpoints are gathered on rank 0 (dist_ckpt.c).
 * Here: roles, the TP hooks, setup, metrics and the loop.
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
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "dist.h"
#include "dist_internal.h"
#include "signals.h"

/* ---- TP hooks --------------------------------------------------------------------------- */

/* The TP collectives of the model code, on backend memory: through tp_stage when the host cannot
 * touch it (the MPI backend reads host memory only). The host time counts as TP; a collective
 * the host only enqueues (NCCL) adds its GPU time after the stream's next synchronisation
 * (device_tp). */
static void tp_collective(dist *d, float *buf, int64_t n, bool sum) {
  double t = now(), cpu = cpu_now(d);
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
  d->c_comm += cpu_now(d) - cpu;
}

/* After a synchronisation of the compute stream: the GPU time of the collectives enqueued on it
 * since the last call joins the step's TP time. */
void ff_dist_device_tp(dist *d) {
  double total = d->c->collective_seconds();
  d->t_tp += total - d->tp_device_seen;
  d->tp_device_seen = total;
}

static void tp_sum(void *ctx, float *buf, int64_t n) { tp_collective(ctx, buf, n, true); }
static void tp_max(void *ctx, float *buf, int64_t n) { tp_collective(ctx, buf, n, false); }

/* A block of backend memory (params, m, v) where the host can read it for a checkpoint: itself
 * on the CPU backend, else a copy in host_block. */
float *ff_dist_host_block_get(dist *d, float *block) {
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
  if (d->plan->n_ranks == 1) /* one rank runs where it is started: nothing to place */
    return FF_OK;
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
  bool one_host = true; /* the emulated network compares clocks across ranks */
  for (int64_t q = 1; q < d->plan->n_ranks; q++)
    one_host &= strcmp(all + q * sizeof mine, all) == 0;
  if (d->o->emulate_network && (!one_host || d->p2p_device)) {
    if (d->rank == 0)
      fprintf(stderr, "ffrun: --emulate-network needs every rank on one machine and the MPI "
              "path for stage transfers (%s)\n", one_host ? "--comm mpi" : "ranks on several hosts");
    st = FF_ERR_INPUT;
  } else if (named && strcmp(mine, want) != 0) {
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
  int64_t NC = ff_dist_boundary_floats(d);
  if (d->p2p_device) {
    d->p2p_ops = calloc((size_t)(2 * (d->n_next > d->n_prev ? d->n_next : d->n_prev) + 1),
                        sizeof *d->p2p_ops); /* a send and a receive with each neighbour */
  } else { /* page-locked on a GPU: the activations cross to and from the device through these */
    d->send_fwd = d->k->alloc_host((size_t)(slots * NC) * sizeof(float));
    d->send_bwd = d->k->alloc_host((size_t)(slots * NC) * sizeof(float));
    d->recv_buf = d->k->alloc_host((size_t)(4 * NC) * sizeof(float));
  }
  int w = d->recv_width = (d->n_next > d->n_prev ? d->n_next : d->n_prev) + 1;
  d->req_fwd = calloc((size_t)(slots * 2 * (d->n_next + 1)), sizeof *d->req_fwd);
  d->req_bwd = calloc((size_t)(slots * 2 * (d->n_prev + 1)), sizeof *d->req_bwd);
  d->req_recv = calloc((size_t)(4 * 2 * w), sizeof *d->req_recv);
  d->stamp_fwd = calloc((size_t)(slots * (d->n_next + 1) + slots * (d->n_prev + 1) + 6 * w),
                        sizeof *d->stamp_fwd);
  bool staged = d->p2p_device ? d->p2p_ops != NULL : d->send_fwd && d->send_bwd && d->recv_buf;
  if (!staged || !d->req_fwd || !d->req_bwd || !d->req_recv || !d->stamp_fwd)
    return FF_ERR_RUNTIME;
  d->stamp_bwd = d->stamp_fwd + slots * (d->n_next + 1);
  d->stamp_recv = d->stamp_bwd + slots * (d->n_prev + 1);
  d->link_free = d->stamp_recv + 4 * w;
  if (!d->k->host_memory) {
    if (!d->c->device_buffers) /* TP sums of device activations through the host */
      d->tp_stage = d->k->alloc_host((size_t)NC * sizeof(float));
    d->host_block = d->k->alloc_host((size_t)d->mr.n_params * sizeof(float));
    if ((!d->c->device_buffers && !d->tp_stage) || !d->host_block)
      return FF_ERR_RUNTIME;
  }
  ff_status st = ff_dist_build_segments(d);
  return st == FF_OK ? ff_dist_setup_sums(d) : st;
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

/* One metrics line and one progress line per step, from rank 0: the step's figures, rank 0's
 * own (compute, kernel kinds, memory) and every stage's (write_stages). */
static void report(dist *d, int64_t step, int64_t stop, double loss, double norm, double lr,
                   double seconds, const double *val) {
  ff_kernel_memory mem;
  d->k->memory(&mem);
  /* what the device holds: on a GPU the whole device's use, on the CPU this process's peak */
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  double resident_gib = (double)ru.ru_maxrss * 1024.0 / FF_GIB;
  double device_gib = mem.device_used_bytes > 0 ? (double)mem.device_used_bytes / FF_GIB
                                                : resident_gib;
  double mine[T_KINDS] = {d->t_compute, d->t_p2p, d->t_tp, d->t_dp, d->t_opt, seconds,
                          (double)mem.peak_bytes / FF_GIB, device_gib};
  double *all = malloc((size_t)d->plan->n_ranks * sizeof mine);
  if (!all)
    d->c->abort(1);
  d->c->allgather(d->world, mine, all, sizeof mine);
  double matmul, attention; /* this step's share of the backend's running totals */
  d->k->op_seconds(&matmul, &attention);
  double step_matmul = matmul - d->matmul_seen, step_attention = attention - d->attention_seen;
  d->matmul_seen = matmul, d->attention_seen = attention;
  double tokens = (double)(d->plan->training.global_batch * d->plan->model.seq_len);
  double flops = ff_flops_model_per_token(&d->plan->model) * tokens / seconds;
  if (d->rank == 0 && d->metrics) {
    double peak = d->have_eval ? d->eval.peak_flops_sum : 0.0;
    char loss_s[32] = "null", norm_s[32] = "null"; /* JSON has no NaN: a skipped step's */
    if (isfinite(loss))
      snprintf(loss_s, sizeof loss_s, "%.9g", loss);
    if (isfinite(norm))
      snprintf(norm_s, sizeof norm_s, "%.9g", norm);
    fprintf(d->metrics, "{\"step\": %lld, \"loss\": %s, \"lr\": %.9g, \"grad_norm\": %s, "
            "\"step_seconds\": %.6g, \"tokens_per_second\": %.6g, \"flops_per_second\": %.6g, "
            "\"mfu\": %.6g, \"ranks\": %lld, \"compute_seconds\": %.6g, \"other_seconds\": %.6g, "
            "\"matmul_seconds\": %.6g, \"attention_seconds\": %.6g, \"peak_memory_gib\": %.6g, "
            "\"memory_gib\": %.6g, \"device_used_gib\": %.6g, "
            "\"predicted\": {\"iteration_seconds\": %.6g, \"memory_gib\": %.6g}",
            (long long)step, loss_s, lr, norm_s, seconds, tokens / seconds, flops,
            peak > 0 ? flops / peak : 0.0, (long long)d->plan->n_ranks, d->t_compute,
            seconds > d->t_compute ? seconds - d->t_compute : 0.0, step_matmul, step_attention,
            resident_gib, mine[T_MEM_PEAK], device_gib,
            d->have_eval ? d->eval.iteration_seconds : 0.0,
            d->have_eval ? d->eval.ranks[0].memory_total_bytes / FF_GIB : 0.0);
    if (val) {
      char v_s[32] = "null", p_s[32] = "null";
      if (isfinite(*val))
        snprintf(v_s, sizeof v_s, "%.9g", *val);
      if (isfinite(exp(*val)))
        snprintf(p_s, sizeof p_s, "%.9g", exp(*val));
      fprintf(d->metrics, ", \"val_loss\": %s, \"val_perplexity\": %s, \"val_tokens\": %lld", v_s,
              p_s, (long long)(d->val_batches * d->plan->training.global_batch *
                               d->plan->model.seq_len));
    }
    write_stages(d, all);
    fprintf(d->metrics, "}\n");
    fflush(d->metrics);
  }
  if (d->rank == 0 && !d->o->quiet) {
    fprintf(stderr, "step %lld/%lld | loss %.4f | lr %.3g | grad norm %.3f | %.0f tokens/s | "
            "%.1f ms", (long long)step, (long long)stop, loss, lr, norm, tokens / seconds,
            seconds * 1e3);
    if (d->plan->n_ranks > 1)
      fprintf(stderr, " | %lld ranks", (long long)d->plan->n_ranks);
    if (val)
      fprintf(stderr, " | val loss %.4f | val ppl %.4g", *val, exp(*val));
    fputc('\n', stderr);
  }
  free(all);
}

/* A validation between steps, kept out of the step's figures: its times and the backend's
 * matmul and attention seconds are not the step's. */
static double validate_now(dist *d) {
  double saved[] = {d->t_compute, d->t_p2p, d->t_tp, d->t_dp, d->t_opt, d->c_comm};
  double matmul0, attention0, matmul1, attention1;
  d->k->op_seconds(&matmul0, &attention0);
  double loss = ff_dist_validate(d, d->val_batches);
  d->k->op_seconds(&matmul1, &attention1);
  d->matmul_seen += matmul1 - matmul0;
  d->attention_seen += attention1 - attention0;
  d->t_compute = saved[0], d->t_p2p = saved[1], d->t_tp = saved[2], d->t_dp = saved[3];
  d->t_opt = saved[4], d->c_comm = saved[5];
  return loss;
}

static void teardown(dist *d) {
  if (d->have_eval)
    ff_plan_eval_free(&d->eval);
  ff_model_rank_free(&d->mr);
  ff_data_free(&d->data);
  ff_data_free(&d->val);
  free(d->segs), free(d->tds);
  free(d->req_fwd), free(d->req_bwd), free(d->p2p_ops), free(d->req_recv), free(d->stamp_fwd);
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

ff_status ff_train(const ff_plan *plan, const ff_kernels *k, const ff_comm_backend *c,
                   const ff_train_opts *o) {
  static dist d; /* one per process, used by main() alone */
  memset(&d, 0, sizeof d);
  d.plan = plan, d.k = k, d.o = o, d.c = c;
  d.world = d.c->world();
  d.p2p_device = c->p2p_batch && c->device_buffers && !k->host_memory;
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
  d.throttle_cpu = d.throttle > 1 && strcmp(k->name, "cpu") == 0;
  ff_diag dg;
  ff_diag_init(&dg, o->data_file);
  st = ff_data_load(&d.data, o->data_file, o->text, plan->model.vocab, plan->model.seq_len, &dg);
  if (d.rank == 0)
    ff_diag_print(&dg, stderr);
  ff_diag_free(&dg);
  if (st == FF_OK && o->eval_file) {
    ff_diag_init(&dg, o->eval_file);
    st = ff_data_load(&d.val, o->eval_file, o->text, plan->model.vocab, plan->model.seq_len, &dg);
    if (d.rank == 0)
      ff_diag_print(&dg, stderr);
    ff_diag_free(&dg);
    int64_t per_batch = plan->training.global_batch * plan->model.seq_len;
    int64_t fit = (d.val.n - plan->model.seq_len) / per_batch; /* batches without a repeat */
    d.val_batches = o->eval_batches > 0 ? o->eval_batches : fit < 1 ? 1 : fit > 8 ? 8 : fit;
  }
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
  if (st == FF_OK && o->init_from)
    st = ff_dist_init_from(&d);
  if (st == FF_OK && o->resume && o->checkpoint_dir)
    st = ff_dist_resume(&d, &done);
  if (st == FF_OK && o->checkpoint_dir && done == 0)
    st = ff_dist_save(&d, 0, buf, whole);
  if (st == FF_OK && d.rank == 0 && o->metrics_file &&
      !(d.metrics = fopen(o->metrics_file, done ? "a" : "w"))) {
    fprintf(stderr, "%s: cannot open for writing metrics\n", o->metrics_file);
    d.c->abort(FF_ERR_INPUT);
  }
  int64_t stop = o->steps > 0 ? o->steps : plan->training.steps;
  for (int64_t step = done + 1; st == FF_OK && step <= stop; step++) {
    double norm, lr, start = now();
    int bad = 0;
    double loss = ff_dist_train_step(&d, step, &norm, &lr, &bad);
    double seconds = now() - start;
    bool validate = d.val.n > 0 && !bad && isfinite(loss) &&
                    (step == stop || (o->eval_every > 0 && step % o->eval_every == 0));
    double val = validate ? validate_now(&d) : NAN;
    report(&d, step, stop, loss, norm, lr, seconds, validate ? &val : NULL);
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
      ff_status saved = ff_dist_save(&d, step, buf, whole);
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
