/* dist_stages.c — one step of a rank: its stage's 1F1B (or GPipe) order of forwards and
 * backwards over the micro-batches, the activations and their gradients exchanged with the
 * neighbouring stages between them, then clipping and AdamW. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist_internal.h"

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

/* --emulate-network: whether a piece between me and rank `peer` of a neighbouring stage
 * crosses nodes of the plan's cluster, and so travels at the plan's link between them. */
static bool emulated(const dist *d, const ff_plan_rank *peer) {
  return d->o->emulate_network && peer->node != d->st->ranks[d->t].node;
}

/* Send my pieces of a full activation (held by every rank of my stage) to the ranks of the
 * neighbouring stage (an empty piece is not sent: its request stays NULL). An emulated piece is
 * followed by the time it left (stamps[r], same tag: MPI keeps the two in order). The requests
 * (reqs[r] the piece's, reqs[n + r] its stamp's) are free: staging_free waited for them before
 * the compute refilled buf. */
static void send_to(dist *d, const ff_plan_stage *to, const float *buf, int64_t n, int tag,
                    ff_request **reqs, double *stamps) {
  double t0 = now();
  for (int r = 0; r < to->n_ranks; r++) {
    ff_span p = boundary_piece(n, d->st->n_ranks, d->t, to->n_ranks, r);
    int dst = (int)to->ranks[r].rank;
    reqs[r] = reqs[to->n_ranks + r] = NULL;
    if (p.end <= p.first)
      continue;
    reqs[r] = d->c->isend(buf + p.first, (size_t)(p.end - p.first) * sizeof *buf, dst, tag);
    if (emulated(d, &to->ranks[r])) {
      stamps[r] = t0;
      reqs[to->n_ranks + r] = d->c->isend(&stamps[r], sizeof *stamps, dst, tag);
    }
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

/* MPI promises tags up to 32767 only. Messages from one rank to another with the same tag stay
 * in order, and both sides go through them in order, so tags may wrap around: activations and
 * their gradients take [0, 16384), checkpoint pieces [16384, 32768). */
static int p2p_tag(int64_t micro_batch, int backward) {
  return (int)((micro_batch * 2 + backward) % 16384);
}

enum { FWD, BWD, NONE };

/* ---- receives posted ahead (host path) ---------------------------------------------------
 * Each direction a stage receives (FWD: inputs from the previous stage; BWD: output gradients
 * from the next) has two buffers. Micro-batch j's pieces arrive in buffer j mod 2, whose receives
 * were posted when the operation that used j − 2 ended (j < 2: as the step began), so a transfer
 * moves while the stage computes; the stage waits only for what has not arrived when it needs it.
 * The cost model simulates exactly this (FF_TRANSFERS_OVERLAPPED, cost/ff_sim.c). */

static const ff_plan_stage *recv_peer(const dist *d, int dir) {
  return &d->pl->stages[dir == FWD ? d->s - 1 : d->s + 1];
}

static int recv_slot(int dir, int64_t j) { return dir * 2 + (int)(j % 2); }

static float *recv_buffer(const dist *d, int dir, int64_t j) {
  return d->recv_buf + (int64_t)recv_slot(dir, j) * ff_dist_boundary_floats(d);
}

/* Post the receives of micro-batch j in direction dir (with their stamps when emulated). */
static void post_recv(dist *d, int dir, int64_t j) {
  double t0 = now();
  const ff_plan_stage *from = recv_peer(d, dir);
  int64_t n = ff_dist_boundary_floats(d);
  int slot = recv_slot(dir, j), w = d->recv_width;
  float *buf = recv_buffer(d, dir, j);
  ff_request **reqs = d->req_recv + (size_t)slot * 2 * (size_t)w;
  for (int r = 0; r < from->n_ranks; r++) {
    ff_span p = boundary_piece(n, from->n_ranks, r, d->st->n_ranks, d->t);
    int src = (int)from->ranks[r].rank, tag = p2p_tag(j, dir);
    reqs[r] = reqs[w + r] = NULL;
    if (p.end <= p.first)
      continue;
    reqs[r] = d->c->irecv(buf + p.first, (size_t)(p.end - p.first) * sizeof *buf, src, tag);
    if (emulated(d, &from->ranks[r]))
      reqs[w + r] = d->c->irecv(&d->stamp_recv[slot * w + r], sizeof(double), src, tag);
  }
  d->posted_at[slot] = t0;
  d->t_p2p += now() - t0;
}

/* The stage is done with micro-batch j's buffer in direction dir: post j + 2 into it. */
static void repost_recv(dist *d, int dir, int64_t j) {
  if (!d->p2p_device && j + 2 < d->pl->micro_batches)
    post_recv(d, dir, j + 2);
}

/* Wait until micro-batch j has arrived in direction dir, then gather it in the stage; returns
 * its buffer. An emulated piece arrives at the plan's link time after both its send and its
 * receive were posted and the previous piece on the same link arrived (one transfer at a time
 * per sender, receiver and direction), however fast it really came. Time spent here counts as
 * p2p: waiting for the previous stage is the pipeline's bubble too, which the metrics separate
 * by subtracting the cost of the transfer itself. */
static float *finish_recv(dist *d, int dir, int64_t j) {
  double t0 = now();
  const ff_plan_stage *from = recv_peer(d, dir);
  const ff_plan_rank *me = &d->st->ranks[d->t];
  int64_t n = ff_dist_boundary_floats(d);
  int slot = recv_slot(dir, j), w = d->recv_width;
  ff_request **reqs = d->req_recv + (size_t)slot * 2 * (size_t)w;
  double arrive = 0.0;
  for (int r = 0; r < from->n_ranks; r++) {
    d->c->wait(reqs[r]);
    reqs[r] = NULL;
    if (!reqs[w + r])
      continue;
    d->c->wait(reqs[w + r]);
    reqs[w + r] = NULL;
    const ff_plan_rank *x = &from->ranks[r];
    ff_span p = boundary_piece(n, from->n_ranks, r, d->st->n_ranks, d->t);
    ff_link link = ff_cluster_gpu_link(&d->plan->cluster, x->node, x->gpu, me->node, me->gpu);
    double *free_at = &d->link_free[dir * w + r], start = d->stamp_recv[slot * w + r];
    if (d->posted_at[slot] > start)
      start = d->posted_at[slot];
    if (*free_at > start)
      start = *free_at;
    *free_at = start + ff_comm_p2p((double)(p.end - p.first) * sizeof(float), link);
    if (*free_at > arrive)
      arrive = *free_at;
  }
  if (arrive > now()) {
    struct timespec ts = {(time_t)arrive, (long)((arrive - (double)(time_t)arrive) * 1e9)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
      ;
  }
  float *buf = recv_buffer(d, dir, j);
  gather_parts(d, buf, n);
  d->t_p2p += now() - t0;
  return buf;
}

/* ---- one step --------------------------------------------------------------------------- */

static int64_t warmup(int p, int s, int64_t m, ff_schedule sch) {
  if (sch == FF_SCHEDULE_GPIPE)
    return m;
  int64_t w = p - s - 1;
  return w < m ? w : m;
}

static int slot_of(const dist *d, int64_t j) { return (int)(j % d->mr.n_slots); }

/* Floats of the activation (or its gradient) that crosses a stage boundary: b·s·h. */
int64_t ff_dist_boundary_floats(const dist *d) {
  return d->pl->micro_batch_size * d->plan->model.seq_len * d->plan->model.hidden;
}

/* Host path: the staging buffer of micro-batch j's output (dir FWD) or input gradient (BWD),
 * and the requests of its transfers to the neighbouring stage's ranks. */
static float *staging(const dist *d, int dir, int64_t j) {
  int64_t NC = ff_dist_boundary_floats(d);
  return (dir == FWD ? d->send_fwd : d->send_bwd) + (int64_t)slot_of(d, j) * NC;
}

/* ... each receiver's piece's request, then each one's stamp's */
static ff_request **staging_reqs(const dist *d, int dir, int64_t j) {
  return dir == FWD ? d->req_fwd + slot_of(d, j) * 2 * d->n_next
                    : d->req_bwd + slot_of(d, j) * 2 * d->n_prev;
}

static double *staging_stamps(const dist *d, int dir, int64_t j) {
  return dir == FWD ? d->stamp_fwd + slot_of(d, j) * d->n_next
                    : d->stamp_bwd + slot_of(d, j) * d->n_prev;
}

/* Host path: the staging buffer of micro-batch j once its previous contents (sent n_slots
 * micro-batches ago) have left, for the compute to write; NULL when nothing is sent that way. */
static float *staging_free(dist *d, int dir, int64_t j) {
  bool sends = dir == FWD ? !d->st->lm_head : !d->st->embedding;
  if (d->p2p_device || !sends)
    return NULL;
  ff_request **reqs = staging_reqs(d, dir, j);
  for (int r = 0; r < 2 * (dir == FWD ? d->n_next : d->n_prev); r++) {
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
  int64_t NC = ff_dist_boundary_floats(d);
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
 * the host waits for both. On the host path the send is started, and the receive, posted
 * earlier, is waited for and gathered. */
static void exchange(dist *d, int send_dir, int64_t send_j, int recv_dir, int64_t recv_j) {
  double t0 = now();
  int64_t NC = ff_dist_boundary_floats(d);
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
            NC, p2p_tag(send_j, send_dir), staging_reqs(d, send_dir, send_j),
            staging_stamps(d, send_dir, send_j));
  if (recv_dir != NONE)
    d->recv_ready = finish_recv(d, recv_dir, recv_j);
}

/* Where a forward or backward began: the clocks, and the step's communication times then. */
typedef struct mark {
  double t, cpu, tp, dp, comm;
} mark;

static mark mark_now(const dist *d) {
  return (mark){now(), cpu_now(d), d->t_tp, d->t_dp, d->c_comm};
}

/* After a forward or backward begun at m: let an asynchronous backend finish, and count the
 * time less the communication as compute (on an emulated slower device, its time: see
 * ff_throttle). */
static void compute_done(dist *d, mark m, int kind) {
  d->k->sync();
  ff_dist_device_tp(d);
  double spent = now() - m.t - (d->t_tp - m.tp) - (d->t_dp - m.dp);
  double cpu = d->throttle_cpu ? phase_cpu(d, kind, cpu_now(d) - m.cpu - (d->c_comm - m.comm))
                               : spent;
  d->t_compute += ff_throttle(d->throttle, spent, cpu);
}

/* The forward of micro-batch j of global batch `batch` of `data`, whose input (not on the first
 * stage) has arrived. */
static void run_forward(dist *d, const ff_data *data, int64_t batch, int64_t j, float grad_scale,
                        double *loss) {
  const ff_plan *plan = d->plan;
  int64_t b = d->pl->micro_batch_size, S = plan->model.seq_len;
  int32_t *in = d->mr.inputs, *tg = d->mr.targets;
  if (d->st->embedding || d->st->lm_head)
    for (int64_t i = 0; i < b; i++)
      ff_data_sequence(data, batch, d->first_seq + j * b + i, plan->training.global_batch, S,
                       in + i * S, tg + i * S);
  const float *x_in = d->st->embedding || d->p2p_device ? NULL : d->recv_ready;
  float *out = staging_free(d, FWD, j);
  mark m = mark_now(d);
  /* the head's gradients are final (none when validating) */
  d->mr.last_micro_batch = !d->mr.no_grad && j == d->pl->micro_batches - 1;
  ff_model_rank_forward(&d->mr, slot_of(d, j), b, in, x_in, tg, grad_scale, out, loss);
  compute_done(d, m, d->mr.no_grad ? FF_PHASE_VALIDATION : FF_PHASE_FORWARD);
  if (!d->st->embedding)
    repost_recv(d, FWD, j);
}

/* The backward of micro-batch j, whose output's gradient (not on the last stage) has arrived. */
static void run_backward(dist *d, int64_t j) {
  const float *dx_in = d->st->lm_head || d->p2p_device ? NULL : d->recv_ready;
  float *out = staging_free(d, BWD, j);
  mark m = mark_now(d);
  d->mr.last_micro_batch = j == d->pl->micro_batches - 1; /* gradients final, layer by layer */
  ff_model_rank_backward(&d->mr, slot_of(d, j), d->pl->micro_batch_size, dx_in, out);
  compute_done(d, m, d->mr.last_micro_batch ? FF_PHASE_LAST_BACKWARD : FF_PHASE_BACKWARD);
  if (!d->st->lm_head)
    repost_recv(d, BWD, j);
}

/* Every send started has left (its staging buffers are free again). */
static void wait_sends(dist *d) {
  for (int i = 0; i < d->mr.n_slots * 2 * d->n_next; i++) {
    d->c->wait(d->req_fwd[i]);
    d->req_fwd[i] = NULL;
  }
  for (int i = 0; i < d->mr.n_slots * 2 * d->n_prev; i++) {
    d->c->wait(d->req_bwd[i]);
    d->req_bwd[i] = NULL;
  }
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
  for (int64_t j = 0; j < 2 && j < m && !d->p2p_device; j++) { /* the first receives */
    if (from_prev != NONE)
      post_recv(d, FWD, j);
    if (from_next != NONE)
      post_recv(d, BWD, j);
  }
  for (int64_t j = 0; j < w; j++) {
    exchange(d, NONE, 0, from_prev, j);
    run_forward(d, &d->data, step, j, scale, &loss);
    exchange(d, to_next, j, NONE, 0);
  }
  if (m > w)
    exchange(d, NONE, 0, from_prev, w);
  for (int64_t k = 0; k < m - w; k++) {
    run_forward(d, &d->data, step, w + k, scale, &loss);
    exchange(d, to_next, w + k, from_next, k);
    run_backward(d, k);
    exchange(d, to_prev, k, k + 1 < m - w ? from_prev : NONE, w + k + 1);
  }
  for (int64_t j = m - w; j < m; j++) {
    exchange(d, NONE, 0, from_next, j);
    run_backward(d, j);
    exchange(d, to_prev, j, NONE, 0);
  }
  wait_sends(d);
  return loss;
}

double ff_dist_validate(dist *d, int64_t batches) {
  int64_t m = d->pl->micro_batches;
  int from_prev = d->st->embedding ? NONE : FWD, to_next = d->st->lm_head ? NONE : FWD;
  double loss = 0;
  d->mr.no_grad = true;
  for (int64_t t = 0; t < batches; t++) {
    for (int64_t j = 0; j < 2 && j < m && !d->p2p_device && from_prev != NONE; j++)
      post_recv(d, FWD, j);
    for (int64_t j = 0; j < m; j++) {
      exchange(d, NONE, 0, from_prev, j);
      run_forward(d, &d->val, t, j, 0.0f, &loss);
      exchange(d, to_next, j, NONE, 0);
    }
    wait_sends(d);
  }
  d->mr.no_grad = false;
  d->c->allreduce_sum_f64(d->world, &loss, 1);
  return loss / (double)(batches * d->plan->training.global_batch * d->plan->model.seq_len);
}

/* One step. Returns the loss; *bad counts the ranks whose own gradients were not finite (then
 * no rank updates its weights), each of which has said which tensor. */
double ff_dist_train_step(dist *d, int64_t step, double *norm_out, double *lr_out, int *bad) {
  const ff_training *t = &d->plan->training;
  d->t_compute = d->t_p2p = d->t_tp = d->t_dp = d->t_opt = d->c_comm = 0;
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
  sums[1] = ff_dist_finish_gradients(d);
  d->c->allreduce_sum_f64(d->world, &sums[1], 1);
  d->t_dp += now() - t0; /* with the time the sums took to start, in the backward */
  *bad = (int)sums[2];
  *lr_out = ff_learning_rate(t, step, t->steps);
  *norm_out = sqrt(sums[1]);
  if (*bad || !isfinite(sums[0]))
    return sums[0] / (double)(t->global_batch * d->plan->model.seq_len);
  t0 = now();
  double c0 = cpu_now(d);
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
  double wall = now() - t0;
  double cpu = d->throttle_cpu ? phase_cpu(d, FF_PHASE_OPTIMIZER, cpu_now(d) - c0) : wall;
  d->t_opt = ff_throttle(d->throttle, wall, cpu);
  return sums[0] / (double)(t->global_batch * d->plan->model.seq_len);
}
