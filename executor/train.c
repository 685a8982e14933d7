/* train.c — the one-rank training loop; see train.h. Errors go to stderr with the file they
 * concern; the return value is an exit status (0, 1 runtime, 2 bad input). */
#define _POSIX_C_SOURCE 200809L
#include "train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>

#include "checkpoint.h"
#include "data.h"
#include "ff_cost.h"
#include "model.h"
#include "signals.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double ff_throttle_factor(const ff_train_opts *o, int rank, const ff_device *device) {
  if (rank < o->n_throttle && o->throttle_by_rank[rank] > 0)
    return o->throttle_by_rank[rank];
  return device && device->emulated_slowdown > 1 ? device->emulated_slowdown : 1.0;
}

void ff_throttle(double factor, double seconds) {
  if (factor <= 1 || seconds <= 0)
    return;
  double wait = (factor - 1) * seconds;
  struct timespec ts = {(time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9)};
  while (nanosleep(&ts, &ts) != 0)
    ;
}

/* The first of the tensors whose gradient holds a non-finite value; grads is the block the
 * tensors' offsets count from, minus `from` floats (a copy of part of it). */
static const char *first_nonfinite(const float *grads, int64_t from, const ff_tensor *t,
                                   int n_tensors) {
  for (int i = 0; i < n_tensors; i++)
    for (int64_t j = 0; j < t[i].numel; j++)
      if (!isfinite(grads[t[i].offset - from + j]))
        return t[i].name;
  return NULL;
}

const char *ff_nonfinite_gradient(const ff_kernels *k, float *grads, const void *tensors,
                                  int n_tensors, int64_t step) {
  const ff_tensor *t = tensors;
  if (n_tensors <= 0)
    return NULL;
  const char *inject = getenv("FF_INJECT_NAN_STEP");
  if (inject && step > 0 && strtoll(inject, NULL, 10) == step) {
    float nan = NAN;
    k->to_device(grads + t[n_tensors - 1].offset, &nan, sizeof nan);
  }
  if (k->host_memory)
    return first_nonfinite(grads, 0, t, n_tensors);
  /* device memory: one reduction says whether anything is wrong; only then copy and look */
  int64_t from = t[0].offset, n = t[n_tensors - 1].offset + t[n_tensors - 1].numel - from;
  if (isfinite(k->sum_squares(grads + from, n)))
    return NULL;
  float *host = malloc((size_t)n * sizeof *host);
  if (!host)
    return t[0].name; /* cannot look closer; the step is skipped all the same */
  k->to_host(host, grads + from, (size_t)n * sizeof *host);
  const char *name = first_nonfinite(host, from, t, n_tensors);
  free(host);
  return name ? name : t[0].name;
}

double ff_learning_rate(const ff_training *t, int64_t step, int64_t total_steps) {
  if (t->warmup_steps > 0 && step <= t->warmup_steps)
    return t->lr * (double)step / (double)t->warmup_steps;
  if (t->decay == FF_DECAY_CONSTANT || total_steps <= t->warmup_steps)
    return t->lr;
  double progress = (double)(step - t->warmup_steps) / (double)(total_steps - t->warmup_steps);
  if (progress > 1)
    progress = 1;
  if (t->decay == FF_DECAY_LINEAR)
    return t->lr + (t->min_lr - t->lr) * progress;
  return t->min_lr + 0.5 * (t->lr - t->min_lr) * (1.0 + cos(M_PI * progress));
}

typedef struct run {
  const ff_plan *plan;
  const ff_kernels *k;
  const ff_train_opts *o;
  ff_model_rank mr;
  ff_data data;
  char model_digest[32];
  int64_t total_steps; /* the schedule's length: training.steps */
  int64_t stop_at;     /* --steps, or training.steps */
  FILE *metrics;
  double predicted_seconds, predicted_memory_gib, peak_flops;
  double matmul_seconds, attention_seconds; /* the backend's totals at the last report */
  int32_t *inputs, *targets;
} run;

static int64_t global_tokens(const run *r) {
  return r->plan->training.global_batch * r->plan->model.seq_len;
}

/* One optimizer step: micro-batches, clipping, AdamW. Returns the loss; *bad names the tensor
 * whose gradient is not finite (then no update is made), or is NULL. */
static double train_step(run *r, int64_t step, double *grad_norm, double *lr, double *compute_s,
                         const char **bad) {
  const ff_plan_pipeline *pl = &r->plan->pipelines[0];
  const ff_training *t = &r->plan->training;
  int64_t S = r->plan->model.seq_len, b = pl->micro_batch_size;
  double loss_sum = 0, start = now();
  double throttle = ff_throttle_factor(r->o, 0, &r->plan->cluster.devices[pl->stages[0].ranks[0].device]);
  r->k->zero(r->mr.grads, (size_t)r->mr.n_params * sizeof(float));
  for (int64_t mb = 0; mb < pl->micro_batches; mb++) {
    for (int64_t i = 0; i < b; i++)
      ff_data_sequence(&r->data, step - 1, mb * b + i, t->global_batch, S, r->inputs + i * S,
                       r->targets + i * S);
    double t0 = now();
    ff_model_rank_step_micro_batch(&r->mr, r->inputs, r->targets, b,
                                   1.0f / (float)global_tokens(r), &loss_sum);
    r->k->sync();
    ff_throttle(throttle, now() - t0);
  }
  *compute_s = now() - start;
  *bad = ff_nonfinite_gradient(r->k, r->mr.grads, r->mr.tensors, r->mr.n_tensors, step);
  double sumsq = r->k->sum_squares(r->mr.grads, r->mr.n_params);
  *grad_norm = sqrt(sumsq);
  *lr = ff_learning_rate(t, step, r->total_steps);
  if (*bad || !isfinite(loss_sum))
    return loss_sum / (double)global_tokens(r);
  double clip = t->grad_clip > 0 && *grad_norm > t->grad_clip ? t->grad_clip / *grad_norm : 1.0;
  for (int i = 0; i < r->mr.n_tensors; i++) {
    const ff_tensor *x = &r->mr.tensors[i];
    r->k->adamw(r->mr.params + x->offset, r->mr.grads + x->offset, r->mr.m + x->offset,
                r->mr.v + x->offset, x->numel, (float)*lr, (float)t->beta1, (float)t->beta2,
                (float)t->eps, x->decay ? (float)t->weight_decay : 0.0f, step, (float)clip);
  }
  ff_model_rank_weights_changed(&r->mr);
  return loss_sum / (double)global_tokens(r);
}

static double peak_memory_gib(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_maxrss * 1024.0 / FF_GIB;
}

static void report(run *r, int64_t step, double loss, double norm, double lr, double seconds,
                   double compute_s) {
  double tokens = (double)global_tokens(r);
  double flops = ff_flops_model_per_token(&r->plan->model) * tokens / seconds;
  ff_kernel_memory mem;
  r->k->memory(&mem);
  double matmul_s, attention_s; /* this step's share of the backend's running totals */
  r->k->op_seconds(&matmul_s, &attention_s);
  double step_matmul_s = matmul_s - r->matmul_seconds;
  double step_attention_s = attention_s - r->attention_seconds;
  r->matmul_seconds = matmul_s;
  r->attention_seconds = attention_s;
  if (r->metrics) {
    fprintf(r->metrics,
            "{\"step\": %lld, \"loss\": %.9g, \"lr\": %.9g, \"grad_norm\": %.9g, "
            "\"step_seconds\": %.6g, \"tokens_per_second\": %.6g, \"flops_per_second\": %.6g, "
            "\"mfu\": %.6g, \"compute_seconds\": %.6g, \"other_seconds\": %.6g, "
            "\"matmul_seconds\": %.6g, \"attention_seconds\": %.6g, "
            "\"peak_memory_gib\": %.6g, \"memory_gib\": %.6g, \"device_used_gib\": %.6g, "
            "\"predicted\": {\"iteration_seconds\": %.6g, \"memory_gib\": %.6g}}\n",
            (long long)step, loss, lr, norm, seconds, tokens / seconds, flops,
            flops / r->peak_flops, compute_s, seconds - compute_s, step_matmul_s, step_attention_s,
            peak_memory_gib(),
            (double)mem.peak_bytes / FF_GIB,
            mem.device_used_bytes > 0 ? (double)mem.device_used_bytes / FF_GIB : peak_memory_gib(),
            r->predicted_seconds, r->predicted_memory_gib);
    fflush(r->metrics);
  }
  if (!r->o->quiet)
    fprintf(stderr, "step %lld/%lld | loss %.4f | lr %.3g | grad norm %.3f | %.0f tokens/s | "
            "%.1f ms\n", (long long)step, (long long)r->stop_at, loss, lr, norm,
            tokens / seconds, seconds * 1e3);
}

static ff_status save(run *r, int64_t step) {
  ff_ckpt_meta meta = {step, (uint64_t)r->plan->training.seed, "", ""};
  snprintf(meta.model_name, sizeof meta.model_name, "%s", r->plan->model.name);
  snprintf(meta.model_digest, sizeof meta.model_digest, "%s", r->model_digest);
  char path[4096];
  ff_diag d;
  ff_diag_init(&d, r->o->checkpoint_dir);
  mkdir(r->o->checkpoint_dir, 0755);
  ff_status st = ff_checkpoint_save(r->o->checkpoint_dir, &r->mr, &meta, r->o->checkpoint_gradients,
                                    &d, path, sizeof path);
  ff_diag_print(&d, stderr);
  ff_diag_free(&d);
  if (st == FF_OK && !r->o->quiet)
    fprintf(stderr, "checkpoint: %s\n", path);
  return st;
}

/* The newest checkpoint that reads back intact; damaged ones are reported and passed over. */
static ff_status resume(run *r, int64_t *done) {
  long long steps[4096];
  int n = ff_checkpoint_list(r->o->checkpoint_dir, steps, 4096);
  *done = 0;
  if (n == 0 && !r->o->quiet)
    fprintf(stderr, "ffrun: no checkpoint in %s; starting from step 0\n", r->o->checkpoint_dir);
  for (int i = 0; i < n; i++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/step-%08lld.safetensors", r->o->checkpoint_dir, steps[i]);
    ff_ckpt_meta meta;
    ff_diag d;
    ff_diag_init(&d, path);
    ff_status st = ff_checkpoint_load(path, &r->mr, r->model_digest, &meta, &d);
    ff_diag_print(&d, stderr);
    bool other_model = strstr(ff_diag_text(&d), "model_digest") != NULL;
    ff_diag_free(&d);
    if (st == FF_OK) {
      *done = meta.step;
      if (!r->o->quiet)
        fprintf(stderr, "ffrun: resumed from %s at step %lld\n", path, (long long)meta.step);
      return FF_OK;
    }
    if (other_model)
      return FF_ERR_INPUT; /* not damage: the directory holds another model's run */
    fprintf(stderr, "ffrun: %s cannot be used; trying an older checkpoint\n", path);
  }
  if (n > 0) {
    fprintf(stderr, "ffrun: no intact checkpoint in %s\n", r->o->checkpoint_dir);
    return FF_ERR_INPUT;
  }
  return FF_OK;
}

static ff_status setup(run *r) {
  const ff_plan *plan = r->plan;
  const ff_plan_stage *st = &plan->pipelines[0].stages[0];
  const ff_plan_rank *rk = &st->ranks[0];
  ff_shard_spec spec = {st->layers.first, st->layers.end, st->embedding, st->lm_head,
                        rk->heads, rk->kv_heads, rk->ffn, rk->vocab};
  cJSON *mj = ff_model_to_json(&plan->model, false);
  ff_digest_json(mj, r->model_digest);
  cJSON_Delete(mj);
  if (ff_model_rank_init(&r->mr, &plan->model, r->k, &spec, plan->pipelines[0].micro_batch_size, 1,
                         plan->training.precision == FF_PRECISION_BF16, st->recompute) != FF_OK) {
    fprintf(stderr, "ffrun: out of memory for the model's parameters and activations\n");
    return FF_ERR_RUNTIME;
  }
  ff_model_rank_init_weights(&r->mr, (uint64_t)plan->training.seed);
  int64_t S = plan->model.seq_len, b = plan->pipelines[0].micro_batch_size;
  r->inputs = malloc((size_t)(b * S) * sizeof *r->inputs);
  r->targets = malloc((size_t)(b * S) * sizeof *r->targets);
  if (!r->inputs || !r->targets)
    return FF_ERR_RUNTIME;
  ff_plan_eval e;
  if (ff_evaluate_plan(plan, &e) == FF_OK) {
    r->predicted_seconds = e.iteration_seconds;
    r->peak_flops = e.peak_flops_sum;
    r->predicted_memory_gib = e.ranks[0].memory_total_bytes / FF_GIB;
    ff_plan_eval_free(&e);
  }
  return FF_OK;
}

ff_status ff_train_one_rank(const ff_plan *plan, const ff_kernels *k, const ff_train_opts *o) {
  run r;
  memset(&r, 0, sizeof r);
  r.plan = plan;
  r.k = k;
  r.o = o;
  r.total_steps = plan->training.steps;
  r.stop_at = o->steps > 0 ? o->steps : plan->training.steps;
  ff_diag d;
  ff_diag_init(&d, o->data_file);
  ff_status st = ff_data_load(&r.data, o->data_file, o->text, plan->model.vocab,
                              plan->model.seq_len, &d);
  ff_diag_print(&d, stderr);
  ff_diag_free(&d);
  int64_t done = 0;
  ff_signals_install(); /* before the first save: a write past a file-size limit is an error */
  if (st == FF_OK)
    st = setup(&r);
  if (st == FF_OK && o->resume && o->checkpoint_dir)
    st = resume(&r, &done);
  if (st == FF_OK && o->checkpoint_dir && done == 0)
    st = save(&r, 0); /* the initial model: a fresh run is reproducible from its first file */
  if (st == FF_OK && o->metrics_file && !(r.metrics = fopen(o->metrics_file, done ? "a" : "w"))) {
    fprintf(stderr, "%s: cannot open for writing metrics\n", o->metrics_file);
    st = FF_ERR_INPUT;
  }
  for (int64_t step = done + 1; st == FF_OK && step <= r.stop_at; step++) {
    double norm, lr, compute_s, start = now();
    const char *bad = NULL;
    double loss = train_step(&r, step, &norm, &lr, &compute_s, &bad);
    report(&r, step, loss, norm, lr, now() - start, compute_s);
    if (bad || !isfinite(loss)) {
      fprintf(stderr, "ffrun: step %lld: %s%s is not finite (rank 0, pipeline 0, stage 0); %s\n",
              (long long)step, bad ? "the gradient of " : "the loss", bad ? bad : "",
              o->skip_nonfinite ? "the step is skipped (--on-nan skip)" : "stopping (--on-nan stop)");
      if (!o->skip_nonfinite) {
        st = FF_ERR_RUNTIME;
        continue;
      } /* a skipped step goes on to the checkpoint and signal checks below */
    }
    int sig = ff_signals_pending();
    bool last = step == r.stop_at || sig;
    if (o->checkpoint_dir && (last || (o->checkpoint_every > 0 && step % o->checkpoint_every == 0))) {
      ff_status saved = save(&r, step);
      if (saved != FF_OK && o->continue_on_save_error)
        fprintf(stderr, "ffrun: continuing without this checkpoint (--on-save-error continue)\n");
      else
        st = saved;
    }
    if (sig) {
      fprintf(stderr, "ffrun: stopped by %s after step %lld%s\n", ff_signal_name(sig),
              (long long)step, o->checkpoint_dir ? " with a final checkpoint" : "");
      if (st == FF_OK)
        st = (ff_status)(128 + sig);
      break;
    }
  }
  if (r.metrics)
    fclose(r.metrics);
  free(r.inputs);
  free(r.targets);
  ff_model_rank_free(&r.mr);
  ff_data_free(&r.data);
  return st;
}
