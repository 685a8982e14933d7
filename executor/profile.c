/* profile.c — `ffrun profile -o cluster.json [--model M] [--throttle R=F,...]`: measure the
 * machines a job runs on and write them as an ff-cluster/1 profile that ffplan reads.
 *
 * Every rank identifies its host and processor (and its GPU, measuring on the CUDA backend where
 * one answers and --backend allows), measures GEMM throughput (the shapes of the
 * model's layers with --model, else a standard set), memory bandwidth and, with --model, the
 * forward and backward time of one layer; ranks of one host measure the link between them, and
 * host leaders the links between hosts (a round-robin tournament: n − 1 rounds of disjoint
 * pairs). Rank 0 groups ranks into nodes by (host, emulated slowdown) — ranks throttled alike on
 * one host form a virtual node of their own device type, which is how a heterogeneous cluster is
 * emulated on one machine — and writes the profile. */
#define _POSIX_C_SOURCE 200809L
#include "profile.h"

#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm.h"
#include "comm_mpi_ops.h"
#include "ff_gpu.h"
#include "ff_json.h"
#include "model.h"
#include "train.h"

#define N_SHAPES 5 /* the model's four, or four defaults, and the peak's */
#define N_GEMM (2 * N_SHAPES)
#define N_LAYER 2

typedef struct measure {
  char host[64], cpu[64];
  char gpu[96];     /* the GPU this rank measured on; empty: the CPU backend */
  double gpu_mem_gib;
  double mem_gib, slowdown, bandwidth_gbs;
  int n_gemm;
  int64_t gemm_shape[N_GEMM][3];
  double gemm_tflops[N_GEMM];
  char gemm_dtype[N_GEMM][8]; /* "fp32", or "bf16" for tensor-core matmuls on a GPU */
  double layer_fwd_ms[N_LAYER], layer_bwd_ms[N_LAYER]; /* micro-batch 1 and 2 */
  double link_gbs, link_us;                            /* to this rank's partner, if any */
} measure;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void read_identity(measure *m) {
  gethostname(m->host, sizeof m->host - 1);
  snprintf(m->cpu, sizeof m->cpu, "cpu");
  FILE *f = fopen("/proc/cpuinfo", "r");
  char line[512];
  while (f && fgets(line, sizeof line, f))
    if (strncmp(line, "model name", 10) == 0) {
      char *v = strchr(line, ':');
      if (v) {
        v += 1 + strspn(v + 1, " \t");
        v[strcspn(v, "\n")] = '\0';
        snprintf(m->cpu, sizeof m->cpu, "%s", v);
      }
      break;
    }
  if (f)
    fclose(f);
  m->mem_gib = 0;
  f = fopen("/proc/meminfo", "r");
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "MemTotal: %lf kB", &m->mem_gib) == 1) {
      m->mem_gib /= 1024.0 * 1024.0;
      break;
    }
  if (f)
    fclose(f);
}

/* Seconds per call of fn on backend k (its work waited for), times slowdown: the fastest of at
 * least three batches, each of calls for 5 ms or more, batches repeated until 60 ms have passed.
 * The fastest batch is the one least disturbed by other work on the machine; an average would
 * charge a device with whatever else ran beside it. An emulated slower device on the CPU backend
 * is timed as ffrun emulates it (ff_throttle): slowdown × the processor time of the call. */
#define TIME_IT(k, slowdown, call)                                                               \
  ({                                                                                             \
    call;                                                                                        \
    (k)->sync();                                                                                 \
    const bool cpu_ = (slowdown) > 1 && strcmp((k)->name, "cpu") == 0;                           \
    double best_ = INFINITY, start_ = now();                                                     \
    for (int batch_ = 0; batch_ < 3 || now() - start_ < 0.06; batch_++) {                       \
      int reps_ = 0;                                                                             \
      double t0_ = cpu_ ? ff_cpu_seconds() : now(), t_;                                          \
      do {                                                                                       \
        call;                                                                                    \
        (k)->sync();                                                                             \
        reps_++;                                                                                 \
        t_ = (cpu_ ? ff_cpu_seconds() : now()) - t0_;                                            \
      } while (t_ < 0.005);                                                                      \
      best_ = fmin(best_, t_ / reps_);                                                           \
    }                                                                                            \
    best_ * (slowdown);                                                                          \
  })

/* A barrier that sleeps while it waits: ranks waiting for another's turn to measure leave the
 * processor to it (MPI's own barrier polls, which takes a core from the rank measuring). */
static void idle_barrier(void) {
  MPI_Request req;
  MPI_Ibarrier(MPI_COMM_WORLD, &req);
  ff_mpi_patient_wait(1, &req);
}

static void measure_compute(measure *m, const ff_kernels *k, const ff_model *model) {
  int64_t shapes[N_SHAPES][3] = {{2048, 512, 512}, {2048, 2048, 512}, {8192, 512, 512},
                                 {512, 512, 512}};
  int n = N_SHAPES;
  if (model) { /* the layer's GEMMs for a micro-batch of one sequence */
    int64_t s = model->seq_len, h = model->hidden, D = model->hidden / model->heads;
    int64_t qkv = (model->heads + 2 * model->kv_heads) * D, f = model->ffn_hidden;
    int64_t own[4][3] = {{s, qkv, h}, {s, h, model->heads * D}, {s, 2 * f, h}, {s, h, f}};
    memcpy(shapes, own, sizeof own);
  }
  /* and one GEMM large enough to run at the device's peak, whatever the model: a small model's
   * own GEMMs measure launch latency, not the peak the profile's peak_tflops stands for */
  int64_t big = m->gpu[0] ? 8192 : 1024;
  shapes[N_SHAPES - 1][0] = shapes[N_SHAPES - 1][1] = shapes[N_SHAPES - 1][2] = big;
  size_t most = 0;
  for (int i = 0; i < n; i++) {
    size_t need = (size_t)(shapes[i][0] * shapes[i][2] + shapes[i][1] * shapes[i][2] + shapes[i][0] * shapes[i][1]);
    if (need > most)
      most = need;
  }
  float *buf = k->alloc(most * sizeof(float));
  /* a GPU measures its matmuls in fp32 and on bf16 operands (tensor cores), as bf16 plans run
   * them; a CPU in fp32 */
  int passes = m->gpu[0] ? 2 : 1;
  uint16_t *half = m->gpu[0] ? k->alloc(most * sizeof(uint16_t)) : NULL;
  m->n_gemm = 0;
  for (int pass = 0; pass < passes && buf; pass++) {
    if (m->gpu[0]) {
      char why[256];
      k = ff_kernels_cuda(0, pass == 0 ? FF_MATH_FP32 : FF_MATH_BF16, NULL, why, sizeof why);
    }
    for (int i = 0; i < n; i++) {
      int M = (int)shapes[i][0], N = (int)shapes[i][1], K = (int)shapes[i][2];
      float *a = buf, *w = a + (size_t)M * K, *c = w + (size_t)N * K;
      double t;
      if (pass == 1 && half) {
        k->to_bf16(half, buf, (int64_t)(M * K + N * K));
        t = TIME_IT(k, m->slowdown, k->matmul_fwd_bf16(c, half, half + (size_t)M * K, M, K, N));
      } else {
        t = TIME_IT(k, m->slowdown, k->matmul_fwd(c, a, w, M, K, N));
      }
      int g = m->n_gemm++;
      memcpy(m->gemm_shape[g], shapes[i], sizeof shapes[i]);
      m->gemm_tflops[g] = 2.0 * M * N * K / t / 1e12;
      snprintf(m->gemm_dtype[g], sizeof m->gemm_dtype[g], "%s", pass == 1 ? "bf16" : "fp32");
    }
  }
  k->release(buf);
  k->release(half);
  int64_t len = 16 << 20;
  float *x = k->alloc((size_t)len * 3 * sizeof(float));
  if (x) {
    double t = TIME_IT(k, m->slowdown, k->add(x, x + len, x + 2 * len, len));
    m->bandwidth_gbs = 3.0 * 4.0 * (double)len / t / 1e9;
    k->release(x);
  }
}

/* Forward and backward of one layer, for micro-batches of 1 and 2 sequences. */
static void measure_layer(measure *m, const ff_kernels *k, const ff_model *model) {
  for (int b = 1; b <= N_LAYER; b++) {
    ff_shard_spec spec = {0, 1, false, false, {0, model->heads}, {0, model->kv_heads},
                          {0, model->ffn_hidden}, {0, 0}};
    ff_model_rank mr;
    /* on a GPU the layer is timed as bf16 plans train: bf16 tensor-core matmuls (the math that
     * measure_compute's last pass left set) and activations kept in bf16 */
    if (ff_model_rank_init(&mr, model, k, &spec, b, 1, !k->host_memory, FF_RECOMPUTE_NONE) != FF_OK)
      return;
    ff_model_rank_init_weights(&mr, 1);
    int64_t nc = b * model->seq_len * model->hidden;
    float *x = calloc((size_t)nc * 2, sizeof *x);
    for (int64_t i = 0; x && i < nc; i++)
      x[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
    if (x) {
      m->layer_fwd_ms[b - 1] =
          1e3 * TIME_IT(k, m->slowdown, ff_model_rank_forward(&mr, 0, b, NULL, x, NULL, 1, x + nc, NULL));
      m->layer_bwd_ms[b - 1] =
          1e3 * TIME_IT(k, m->slowdown, ff_model_rank_backward(&mr, 0, b, x, x + nc));
    }
    free(x);
    ff_model_rank_free(&mr);
  }
}

/* Ping-pong between two world ranks: latency (8 B) and bandwidth (8 MiB), each the best of
 * several batches, for the reason TIME_IT gives. */
static void ping_pong(const ff_comm_backend *c, int peer, bool first, double *gbs, double *us) {
  static char buf[8 << 20];
  double best = INFINITY;
  for (int batch = 0; batch < 10; batch++) {
    int reps = 20;
    double t0 = now();
    for (int i = 0; i < reps; i++) {
      if (first) {
        c->wait(c->isend(buf, 8, peer, 1));
        c->recv(buf, 8, peer, 1);
      } else {
        c->recv(buf, 8, peer, 1);
        c->wait(c->isend(buf, 8, peer, 1));
      }
    }
    best = fmin(best, (now() - t0) / reps / 2);
  }
  *us = best * 1e6;
  best = INFINITY;
  for (int i = 0; i < 10; i++) {
    double t0 = now();
    if (first) {
      c->wait(c->isend(buf, sizeof buf, peer, 2));
      c->recv(buf, 8, peer, 3);
    } else {
      c->recv(buf, sizeof buf, peer, 2);
      c->wait(c->isend(buf, 8, peer, 3));
    }
    best = fmin(best, now() - t0);
  }
  *gbs = (double)sizeof buf / best / 1e9;
}

/* Ranks 2i and 2i+1 measure the link between them (on one host: its shared memory), the pairs of
 * one host taking turns, so that no pair's ranks wait for a processor that another pair polls on.
 * Then host leaders (the lowest rank of each host) meet in a round-robin tournament, n − 1 rounds
 * of disjoint pairs, keeping the slowest link seen as the network's. */
static void measure_links(const ff_comm_backend *c, ff_group *world, measure *all, measure *me,
                          int rank, int size, double *net_gbs, double *net_us) {
  me->link_gbs = me->link_us = 0;
  int peer = rank ^ 1, pair = rank / 2, turn = 0, turns = 0;
  for (int q = 0; 2 * q + 1 < size; q++)
    if (strcmp(all[2 * q].host, all[2 * pair].host) == 0)
      turn += q < pair;
  for (int q = 0; 2 * q + 1 < size; q++) {
    int on_host = 0; /* the pairs that share the host of pair q */
    for (int o = 0; 2 * o + 1 < size; o++)
      on_host += strcmp(all[2 * o].host, all[2 * q].host) == 0;
    turns = on_host > turns ? on_host : turns;
  }
  for (int t = 0; t < turns; t++) {
    if (t == turn && peer < size)
      ping_pong(c, peer, rank < peer, &me->link_gbs, &me->link_us);
    idle_barrier();
  }
  int leaders[256], n = 0;
  for (int r = 0; r < size && n < 256; r++) {
    bool first = true;
    for (int q = 0; q < r && first; q++)
      first = strcmp(all[q].host, all[r].host) != 0;
    if (first)
      leaders[n++] = r;
  }
  double gbs = INFINITY, us = 0;
  int slots = n % 2 ? n + 1 : n; /* circle method; slot n is a bye when n is odd */
  for (int round = 0; round + 1 < slots; round++)
    for (int i = 0; i < slots / 2; i++) {
      int a = i == 0 ? 0 : (round + i - 1) % (slots - 1) + 1;
      int b = (round + slots - 2 - i) % (slots - 1) + 1;
      if (a >= n || b >= n || a == b)
        continue;
      double g = 0, u = 0;
      if (rank == leaders[a] || rank == leaders[b])
        ping_pong(c, rank == leaders[a] ? leaders[b] : leaders[a], rank == leaders[a], &g, &u);
      double pair[2] = {rank == leaders[a] ? g : 0, rank == leaders[a] ? u : 0};
      c->allreduce_sum_f64(world, pair, 2);
      if (pair[0] > 0 && pair[0] < gbs)
        gbs = pair[0];
      if (pair[1] > us)
        us = pair[1];
    }
  *net_gbs = isfinite(gbs) ? gbs : 0;
  *net_us = us;
}

static double median(double *x, int n) {
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && x[j] < x[j - 1]; j--) {
      double t = x[j];
      x[j] = x[j - 1];
      x[j - 1] = t;
    }
  return n ? x[n / 2] : 0;
}

static void slug(const char *in, char *out, size_t cap) {
  size_t j = 0;
  for (size_t i = 0; in[i] && j + 1 < cap && j < 40; i++) {
    char ch = in[i];
    bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9');
    if (ok)
      out[j++] = ch;
    else if (j > 0 && out[j - 1] != '-')
      out[j++] = '-';
  }
  while (j > 0 && out[j - 1] == '-')
    j--;
  out[j] = '\0';
}

/* One device type (and one node) per (host, slowdown): the profile rank 0 writes. */
static cJSON *build_cluster(const measure *all, int size, const ff_model *model, double net_gbs,
                            double net_us) {
  cJSON *c = cJSON_CreateObject();
  cJSON_AddStringToObject(c, "format", "ff-cluster/1");
  cJSON_AddStringToObject(c, "name", "profiled");
  char desc[512];
  snprintf(desc, sizeof desc, "Measured by ffrun profile: %d ranks; links by ping-pong (8 B "
           "latency, 8 MiB bandwidth), the network figure the slowest pair of hosts.", size);
  cJSON_AddStringToObject(c, "description", desc);
  cJSON *types = cJSON_AddArrayToObject(c, "device_types"), *nodes = cJSON_AddArrayToObject(c, "nodes");
  bool *done = calloc((size_t)size, sizeof *done);
  int n_nodes = 0;
  for (int r = 0; done && r < size; r++) {
    if (done[r])
      continue;
    int members[4096], n = 0;
    for (int q = r; q < size && n < 4096; q++)
      if (!done[q] && strcmp(all[q].host, all[r].host) == 0 && all[q].slowdown == all[r].slowdown &&
          strcmp(all[q].gpu, all[r].gpu) == 0) {
        members[n++] = q;
        done[q] = true;
      }
    char host[64], name[65], node[65], gpu[64];
    bool on_gpu = all[r].gpu[0] != '\0';
    slug(all[r].host, host, sizeof host);
    slug(all[r].gpu, gpu, sizeof gpu);
    snprintf(name, sizeof name, "%s%s", on_gpu ? "" : "cpu-", on_gpu ? gpu : host);
    if (all[r].slowdown > 1)
      snprintf(name, sizeof name, "%s%s-x%g", on_gpu ? "" : "cpu-", on_gpu ? gpu : host,
               all[r].slowdown);
    snprintf(node, sizeof node, "%s%s", host, "");
    if (all[r].slowdown > 1)
      snprintf(node, sizeof node, "%s-x%g", host, all[r].slowdown);
    for (char *p = name; *p; p++)
      if (*p == '.')
        *p = '_';
    for (char *p = node; *p; p++)
      if (*p == '.')
        *p = '_';
    int on_host = 0; /* ranks sharing the host's memory */
    for (int q = 0; q < size; q++)
      on_host += strcmp(all[q].host, all[r].host) == 0;
    double v[4096], best32 = 0, best16 = 0, mem = INFINITY;
    for (int i = 0; i < n; i++) {
      const measure *x = &all[members[i]];
      v[i] = x->bandwidth_gbs;
      mem = fmin(mem, on_gpu ? x->gpu_mem_gib : x->mem_gib / on_host);
      for (int g = 0; g < x->n_gemm; g++) {
        if (strcmp(x->gemm_dtype[g], "bf16") == 0)
          best16 = fmax(best16, x->gemm_tflops[g]);
        else
          best32 = fmax(best32, x->gemm_tflops[g]);
      }
    }
    cJSON *d = cJSON_CreateObject();
    cJSON_AddStringToObject(d, "name", name);
    cJSON_AddStringToObject(d, "architecture", on_gpu ? all[r].gpu : all[r].cpu);
    cJSON_AddNumberToObject(d, "memory_gib", floor(mem * 100) / 100);
    cJSON_AddNumberToObject(d, "memory_bandwidth_gb_per_s", median(v, n));
    cJSON *peak = cJSON_AddObjectToObject(d, "peak_tflops");
    if (on_gpu)
      cJSON_AddNumberToObject(peak, "bf16", best16);
    cJSON_AddNumberToObject(peak, "fp16", on_gpu ? best16 : best32);
    cJSON_AddNumberToObject(peak, "fp32", best32);
    /* a GPU's context and cuBLAS workspace; calibrate refits it from a run */
    cJSON_AddNumberToObject(d, "runtime_reserve_gib", on_gpu ? 1.0 : 0.25);
    cJSON_AddStringToObject(d, "source", on_gpu ? "measured by ffrun profile on the CUDA backend "
                            "(peaks: the best measured GEMM, fp32 and bf16 tensor cores; fp16 "
                            "taken as bf16)" : "measured by ffrun profile (peaks: the best "
                            "measured fp32 GEMM of one core)");
    if (all[r].slowdown > 1)
      cJSON_AddNumberToObject(d, "emulated_slowdown", all[r].slowdown);
    if (!on_gpu) /* these ranks talk over MPI: the cost model overlaps their stage transfers */
      cJSON_AddStringToObject(d, "kind", "cpu");
    cJSON *meas = cJSON_AddObjectToObject(d, "measured");
    cJSON_AddStringToObject(meas, "source", "ffrun profile: the median over the node's ranks of "
                            "each GEMM's throughput and of a streaming kernel's bandwidth");
    cJSON_AddNumberToObject(meas, "memory_gb_per_s", median(v, n));
    cJSON *gemm = cJSON_AddArrayToObject(meas, "gemm");
    for (int g = 0; g < all[r].n_gemm; g++) {
      for (int i = 0; i < n; i++)
        v[i] = all[members[i]].gemm_tflops[g];
      cJSON *e = cJSON_CreateObject();
      cJSON_AddStringToObject(e, "dtype", all[r].gemm_dtype[g]);
      cJSON_AddNumberToObject(e, "m", (double)all[r].gemm_shape[g][0]);
      cJSON_AddNumberToObject(e, "n", (double)all[r].gemm_shape[g][1]);
      cJSON_AddNumberToObject(e, "k", (double)all[r].gemm_shape[g][2]);
      cJSON_AddNumberToObject(e, "tflops", median(v, n));
      cJSON_AddItemToArray(gemm, e);
    }
    cJSON *layers = cJSON_AddArrayToObject(meas, "layers");
    for (int b = 0; model && b < N_LAYER; b++) {
      double f[4096], g[4096];
      for (int i = 0; i < n; i++)
        f[i] = all[members[i]].layer_fwd_ms[b], g[i] = all[members[i]].layer_bwd_ms[b];
      cJSON *e = cJSON_CreateObject();
      cJSON_AddStringToObject(e, "model", model->name);
      cJSON_AddStringToObject(e, "precision", on_gpu ? "bf16" : "fp32");
      cJSON_AddNumberToObject(e, "micro_batch_size", b + 1);
      cJSON_AddNumberToObject(e, "tp", 1);
      cJSON_AddNumberToObject(e, "forward_ms", median(f, n));
      cJSON_AddNumberToObject(e, "backward_ms", median(g, n));
      cJSON_AddItemToArray(layers, e);
    }
    cJSON_AddItemToArray(types, d);
    cJSON *nd = cJSON_CreateObject();
    cJSON_AddStringToObject(nd, "name", node);
    cJSON_AddStringToObject(nd, "device", name);
    cJSON_AddNumberToObject(nd, "gpus", n);
    cJSON_AddNumberToObject(nd, "island_gpus", n);
    double lg = all[members[0]].link_gbs > 0 ? all[members[0]].link_gbs : net_gbs;
    double lu = all[members[0]].link_us > 0 ? all[members[0]].link_us : net_us;
    if (n > 1) {
      cJSON_AddNumberToObject(nd, "island_bandwidth_gb_per_s", lg > 0 ? lg : 1);
      cJSON_AddNumberToObject(nd, "island_latency_us", lu);
    }
    cJSON_AddItemToArray(nodes, nd);
    n_nodes++;
  }
  free(done);
  if (n_nodes > 1) {
    cJSON *net = cJSON_AddObjectToObject(c, "network");
    cJSON *def = cJSON_AddObjectToObject(net, "default");
    /* virtual nodes of one host talk through its shared memory: the pairs' figure */
    double g = net_gbs > 0 ? net_gbs : all[0].link_gbs, u = net_gbs > 0 ? net_us : all[0].link_us;
    cJSON_AddNumberToObject(def, "bandwidth_gb_per_s", g > 0 ? g : 1);
    cJSON_AddNumberToObject(def, "latency_us", u);
    cJSON_AddArrayToObject(net, "groups");
    cJSON_AddArrayToObject(net, "overrides");
  }
  return c;
}

int ff_profile(int argc, char **argv, const ff_train_opts *o, const char *out, const char *model_file,
               bool use_gpu) {
  MPI_Init(&argc, &argv);
  const ff_comm_backend *c = ff_comm_mpi();
  ff_group *world = c->world();
  int rank = c->rank(world), size = c->size(world);
  ff_model model, *mp = NULL;
  ff_diag d;
  ff_diag_init(&d, model_file);
  int bad = model_file && ff_load_model(model_file, &d, &model) != FF_OK;
  if (bad && rank == 0)
    ff_diag_print(&d, stderr);
  ff_diag_free(&d);
  if (bad) {
    MPI_Finalize();
    return FF_ERR_INPUT;
  }
  if (model_file)
    mp = &model;
  measure me, *all = calloc((size_t)size, sizeof *all);
  memset(&me, 0, sizeof me);
  read_identity(&me);
  me.slowdown = ff_throttle_factor(o, rank, NULL);
  const ff_kernels *k = ff_kernels_cpu(1);
  if (rank == 0 && !o->quiet)
    fprintf(stderr, "ffrun profile: %d ranks: compute%s\n", size, mp ? " and layers" : "");
  /* Ranks of one host share its processor: they measure one after another, so that each sees
   * the cores it would have alone (GPUs of one host do not share, but a turn each costs little). */
  c->allgather(world, &me, all, sizeof me);
  int turn = 0, turns = 0;
  for (int r = 0; r < size; r++)
    if (strcmp(all[r].host, me.host) == 0) {
      turns++;
      if (r < rank)
        turn++;
    }
  /* the GPU of this rank: its turn on the host, folded onto the GPUs there */
  int gpus = use_gpu ? ff_gpu_count(NULL) : 0;
  if (gpus > 0) {
    char why[256];
    ff_gpu_info info;
    const ff_kernels *g = ff_kernels_cuda(turn % gpus, FF_MATH_FP32, NULL, why, sizeof why);
    if (g && ff_gpu_query(turn % gpus, &info) == 0) {
      k = g;
      snprintf(me.gpu, sizeof me.gpu, "%s", info.name);
      me.gpu_mem_gib = info.memory_gib;
    } else if (!o->quiet) {
      fprintf(stderr, "ffrun profile: rank %d: the CUDA backend cannot start (%s); measuring the "
              "CPU\n", rank, g ? "the GPU cannot be queried" : why);
    }
  }
  float most_turns = (float)turns; /* the busiest host's count: every rank loops as long */
  c->allreduce_max(world, &most_turns, 1);
  for (int t = 0; t < (int)most_turns; t++) {
    if (t == turn) {
      measure_compute(&me, k, mp);
      if (mp)
        measure_layer(&me, k, mp);
    }
    idle_barrier(); /* the turn's end */
  }
  c->allgather(world, &me, all, sizeof me);
  double net_gbs = 0, net_us = 0;
  if (rank == 0 && !o->quiet)
    fprintf(stderr, "ffrun profile: links\n");
  measure_links(c, world, all, &me, rank, size, &net_gbs, &net_us);
  c->allgather(world, &me, all, sizeof me);
  int rc = FF_OK;
  if (rank == 0) {
    cJSON *tree = build_cluster(all, size, mp, net_gbs, net_us);
    ff_diag_init(&d, out);
    rc = ff_write_json_atomic(out, tree, &d);
    cJSON_Delete(tree);
    ff_diag_print(&d, stderr);
    ff_diag_free(&d);
    if (rc == FF_OK && !o->quiet)
      fprintf(stderr, "ffrun profile: wrote %s\n", out);
  }
  free(all);
  if (mp)
    ff_model_free(&model);
  MPI_Finalize();
  return rc;
}
