/* ffrun.c — the executor's command line.
 *
 * `ffrun --dry-run PLAN` reads a plan and prints the role every rank would have: pipeline, stage,
 * TP index, layer range, shards, node and GPU, and the compute backend the rank would use. Run
 * plainly it prints every rank; under mpirun (one process per plan rank) each process finds its
 * own role and rank 0 prints them in order, which checks that the launch matches the plan.
 * MPI is initialised only when the process was started by an MPI launcher. */
#include <errno.h>
#include <mpi.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "ff_blas_core.h"
#include "ff_format.h"
#include "ff_gpu.h"
#include "ff_kernels.h"
#include "ff_version.h"
#include "comm.h"
#include "dist.h"
#include "hf_export.h"
#include "profile.h"
#include "train.h"

#define ROLE_LINE 256

typedef enum backend { BACKEND_AUTO, BACKEND_CPU, BACKEND_CUDA } backend;
static const char *const backend_names[] = {"auto", "cpu", "cuda", NULL};

static void usage(FILE *out) {
  fprintf(out,
          "usage: ffrun PLAN (--data FILE | --text FILE) [options]   train a one-rank plan\n"
          "       mpirun -np N ffrun PLAN (--data FILE | --text FILE) [options]\n"
          "                                       train a plan of N ranks\n"
          "       ffrun --dry-run PLAN                                 print each rank's role\n"
          "       mpirun -np N ffrun profile -o CLUSTER [--model M] [--throttle R=F,...]\n"
          "                                       [--backend auto|cpu]\n"
          "                                       measure the machines into a cluster profile\n"
          "       mpirun -np N ffrun --dry-run PLAN\n"
          "       ffrun export CHECKPOINT -o DIR [--dtype fp32|bf16] [--max-shard-size SIZE]\n"
          "                                       [--plan PLAN]\n"
          "                                       a checkpoint as a Hugging Face Llama directory\n"
          "\n"
          "Executes a plan written by ffplan: each MPI rank takes its pipeline stage and tensor\n"
          "shard, on the CUDA backend where a GPU answers and on the CPU backend elsewhere; ranks\n"
          "talk through MPI (device buffers are staged through page-locked host memory).\n"
          "\n"
          "options:\n"
          "  --data FILE             llm.c token file (uint16 or uint32 tokens after a 1024-byte\n"
          "                          header; scripts/prepare-data writes them)\n"
          "  --text FILE             plain text read as bytes (models with vocab >= 256)\n"
          "  --steps N               train until step N (default: the plan's training.steps)\n"
          "  --checkpoint-dir D      write checkpoints (safetensors) to D: the initial model, the\n"
          "                          end, and ...\n"
          "  --checkpoint-every K    ... every K steps\n"
          "  --resume                continue from the newest checkpoint in D\n"
          "  --init-from DIR         start from a Hugging Face Llama directory's weights\n"
          "                          (config.json, model.safetensors or its sharded index);\n"
          "                          with --resume, a checkpoint in D is taken instead\n"
          "  --eval-data FILE        validation data, of --data's or --text's kind: its loss and\n"
          "                          perplexity after the last step and ...\n"
          "  --eval-every N          ... every N steps (metrics: val_loss, val_perplexity)\n"
          "  --eval-batches K        global batches per validation (default: those the file\n"
          "                          holds without repeating a token, at most 8)\n"
          "  --checkpoint-gradients  also save each checkpointed step's gradients (verification)\n"
          "  --on-save-error A       stop (default) or continue when a checkpoint cannot be written\n"
          "  --on-nan A              stop (default) or skip a step whose loss or gradient is not\n"
          "                          finite\n"
          "  --metrics FILE          one JSON line per step\n"
          "  --threads N             BLAS threads for this rank (default 1)\n"
          "  --throttle R=F,...      emulate slower devices: rank R's compute takes F x the\n"
          "                          processor time it used (it waits out the rest), whatever\n"
          "                          else runs on the machine (a test and demo device; a device\n"
          "                          type's emulated_slowdown does the same for its ranks)\n"
          "  --emulate-network       stage transfers between ranks on different nodes of the\n"
          "                          plan take the time of the plan's link between them\n"
          "                          (latency + bytes / bandwidth, one at a time per link and\n"
          "                          direction); every rank on one machine (a test and demo\n"
          "                          network, with the MPI path's overlapped transfers)\n"
          "  --quiet                 no progress lines\n"
          "  --dry-run               print the role of each rank and the backend it would use\n"
          "  --comm C                how ranks talk: auto (NCCL when every rank has a GPU of its\n"
          "                          own, else MPI), mpi, or nccl (fails when NCCL cannot start)\n"
          "  --backend B             auto (GPU when one answers, else CPU, with a notice), cpu,\n"
          "                          or cuda (fails when no GPU answers); matmuls on the GPU\n"
          "                          compute in the plan's training.precision\n"
          "  -h, --help              show this help\n"
          "  --version               show the version\n"
          "\n"
          "exit status: 0 ok, 1 runtime failure, 2 bad input or usage\n");
}

/* Decide the backend; *note explains a fallback. Returns false when cuda was demanded but no
 * GPU answers. */
static bool choose_backend(backend want, backend *got, char *note, size_t cap) {
  const char *why = NULL;
  int gpus = ff_gpu_count(&why);
  char core[160];
  ff_blas_core_describe(core, sizeof core);
  note[0] = '\0';
  if (want == BACKEND_CPU) {
    *got = BACKEND_CPU;
    snprintf(note, cap, "OpenBLAS core %s", core);
    return true;
  }
  if (gpus > 0) {
    ff_gpu_info info;
    *got = BACKEND_CUDA;
    if (ff_gpu_query(0, &info) == 0)
      snprintf(note, cap, "%d GPU%s, first: %s, %.0f GiB, sm_%d%d", gpus, gpus == 1 ? "" : "s",
               info.name, info.memory_gib, info.cc_major, info.cc_minor);
    return true;
  }
  *got = BACKEND_CPU;
  snprintf(note, cap, "no GPU answers: %s; OpenBLAS core %s", why ? why : "unknown reason", core);
  return want == BACKEND_AUTO;
}

static void range_text(ff_span s, char *out, size_t cap) {
  snprintf(out, cap, "%lld-%lld", (long long)s.first, (long long)s.end);
}

/* One rank's role; ranges are half-open, written first-end. */
static void role_line(const ff_plan *plan, int p, int s, int t, char *out, size_t cap) {
  const ff_plan_stage *st = &plan->pipelines[p].stages[s];
  const ff_plan_rank *r = &st->ranks[t];
  char layers[48], heads[48], kv[48], ffn[48], vocab[48] = "-";
  range_text(st->layers, layers, sizeof layers);
  range_text(r->heads, heads, sizeof heads);
  range_text(r->kv_heads, kv, sizeof kv);
  range_text(r->ffn, ffn, sizeof ffn);
  if (st->embedding || st->lm_head)
    range_text(r->vocab, vocab, sizeof vocab);
  const char *holds = st->embedding && st->lm_head ? "emb+head"
                      : st->embedding              ? "emb"
                      : st->lm_head                ? "head"
                                                   : "-";
  char stage[24], tp[24];
  snprintf(stage, sizeof stage, "%d/%d", s, plan->pipelines[p].n_stages);
  snprintf(tp, sizeof tp, "%d/%d", t, st->n_ranks);
  snprintf(out, cap, "%6lld %4d %-7s %-7s %-9s %-8s %-9s %-9s %-13s %-13s %-9s %-12s %4d %s",
           (long long)r->rank, p, stage, tp, layers, holds,
           heads, kv, ffn, vocab, ff_recompute_names[st->recompute],
           plan->cluster.nodes[r->node].name, r->gpu, plan->cluster.devices[r->device].name);
}

static void print_header(void) {
  printf("#%5s %4s %-7s %-7s %-9s %-8s %-9s %-9s %-13s %-13s %-9s %-12s %4s %s\n", "rank",
         "pipe", "stage", "tp", "layers", "holds", "heads", "kv", "ffn", "vocab", "recompute",
         "node", "gpu", "device");
}

static void print_preamble(const ff_plan *plan, backend got, const char *note) {
  char summary[1024];
  ff_summary_plan(plan, summary, sizeof summary);
  printf("# %s\n", summary);
  printf("# backend: %s%s%s%s\n", backend_names[got], note[0] ? " (" : "", note,
         note[0] ? ")" : "");
  print_header();
}

static bool launched_by_mpi(void) {
  return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK") ||
         getenv("PMI_SIZE");
}

static int dry_run_mpi(const ff_plan *plan, backend got, const char *note) {
  int world_rank = 0, world_size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  if (world_size != plan->n_ranks) {
    if (world_rank == 0)
      fprintf(stderr, "ffrun: the plan has %lld ranks but %d processes were started (use "
              "mpirun -np %lld)\n", (long long)plan->n_ranks, world_size,
              (long long)plan->n_ranks);
    return FF_ERR_INPUT;
  }
  char line[ROLE_LINE] = {0};
  int p, s, t;
  if (ff_plan_find_rank(plan, world_rank, &p, &s, &t))
    role_line(plan, p, s, t, line, sizeof line);
  char *all = NULL;
  if (world_rank == 0) {
    all = calloc((size_t)world_size, ROLE_LINE);
    if (!all)
      MPI_Abort(MPI_COMM_WORLD, FF_ERR_RUNTIME);
  }
  MPI_Gather(line, ROLE_LINE, MPI_CHAR, all, ROLE_LINE, MPI_CHAR, 0, MPI_COMM_WORLD);
  if (world_rank == 0) {
    print_preamble(plan, got, note);
    for (int r = 0; r < world_size; r++)
      printf("%s\n", all + (size_t)r * ROLE_LINE);
    printf("# %d MPI processes, one per plan rank\n", world_size);
    free(all);
  }
  return 0;
}

static int dry_run(const ff_plan *plan, backend got, const char *note) {
  char line[ROLE_LINE];
  print_preamble(plan, got, note);
  for (int p = 0; p < plan->n_pipelines; p++)
    for (int s = 0; s < plan->pipelines[p].n_stages; s++)
      for (int t = 0; t < plan->pipelines[p].stages[s].n_ranks; t++) {
        role_line(plan, p, s, t, line, sizeof line);
        printf("%s\n", line);
      }
  return 0;
}

typedef struct cli {
  bool dry;
  const char *plan_file;
  int backend;
  int comm; /* ff_comm_choice */
  int threads;
  ff_train_opts train;
} cli;

static const char *value(int argc, char **argv, int *i) {
  if (*i + 1 >= argc) {
    fprintf(stderr, "ffrun: %s needs a value\n", argv[*i]);
    return NULL;
  }
  return argv[++*i];
}

/* "RANK=FACTOR,RANK=FACTOR": emulated slowdowns by world rank. */
static int parse_throttle(const char *v, ff_train_opts *o) {
  static double table[4096];
  const char *p = v;
  while (*p) {
    char *end;
    long rank = strtol(p, &end, 10);
    if (end == p || *end != '=' || rank < 0 || rank >= 4096)
      goto bad;
    double f = strtod(end + 1, &end);
    if (!(f >= 1 && f <= 1000) || (*end && *end != ','))
      goto bad;
    table[rank] = f;
    if (rank + 1 > o->n_throttle)
      o->n_throttle = (int)rank + 1;
    p = *end ? end + 1 : end;
  }
  o->throttle_by_rank = table;
  return 0;
bad:
  fprintf(stderr, "ffrun: --throttle expects RANK=FACTOR[,RANK=FACTOR...] with ranks below 4096 "
          "and factors from 1 to 1000, got \"%s\"\n", v);
  return 1;
}

/* 0 to go on, else the exit status (help and version exit 0 through *done). */
static int parse(int argc, char **argv, cli *c, bool *done) {
  memset(c, 0, sizeof *c);
  c->threads = 1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = NULL;
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      usage(stdout);
      *done = true;
      return 0;
    } else if (strcmp(a, "--version") == 0) {
      printf("ffrun %s (%s backend built)\n", FF_VERSION, ff_gpu_built() ? "cpu and cuda" : "cpu");
      *done = true;
      return 0;
    } else if (strcmp(a, "--dry-run") == 0) {
      c->dry = true;
    } else if (strcmp(a, "--resume") == 0) {
      c->train.resume = true;
    } else if (strcmp(a, "--quiet") == 0) {
      c->train.quiet = true;
    } else if (strcmp(a, "--emulate-network") == 0) {
      c->train.emulate_network = true;
    } else if (strcmp(a, "--checkpoint-gradients") == 0) {
      c->train.checkpoint_gradients = true;
    } else if (strcmp(a, "--on-save-error") == 0 || strcmp(a, "--on-nan") == 0) {
      if (!(v = value(argc, argv, &i)))
        return FF_ERR_INPUT;
      bool save = strcmp(a, "--on-save-error") == 0;
      if (strcmp(v, "stop") != 0 && strcmp(v, save ? "continue" : "skip") != 0) {
        fprintf(stderr, "ffrun: %s expects stop or %s, got \"%s\"\n", a, save ? "continue" : "skip", v);
        return FF_ERR_INPUT;
      }
      if (save)
        c->train.continue_on_save_error = strcmp(v, "continue") == 0;
      else
        c->train.skip_nonfinite = strcmp(v, "skip") == 0;
    } else if (strcmp(a, "--throttle") == 0) {
      if (!(v = value(argc, argv, &i)) || parse_throttle(v, &c->train) != 0)
        return FF_ERR_INPUT;
    } else if (strcmp(a, "--comm") == 0) {
      if (!(v = value(argc, argv, &i)))
        return FF_ERR_INPUT;
      const char *names[] = {"auto", "mpi", "nccl"};
      c->comm = -1;
      for (int k = 0; k < 3; k++)
        if (strcmp(v, names[k]) == 0)
          c->comm = k;
      if (c->comm < 0) {
        fprintf(stderr, "ffrun: --comm \"%s\" is not one of: auto, mpi, nccl\n", v);
        return FF_ERR_INPUT;
      }
    } else if (strcmp(a, "--backend") == 0 || strcmp(a, "--data") == 0 || strcmp(a, "--text") == 0 ||
               strcmp(a, "--steps") == 0 || strcmp(a, "--checkpoint-dir") == 0 ||
               strcmp(a, "--checkpoint-every") == 0 || strcmp(a, "--metrics") == 0 ||
               strcmp(a, "--threads") == 0 || strcmp(a, "--init-from") == 0 ||
               strcmp(a, "--eval-data") == 0 || strcmp(a, "--eval-every") == 0 ||
               strcmp(a, "--eval-batches") == 0) {
      if (!(v = value(argc, argv, &i)))
        return FF_ERR_INPUT;
      if (strcmp(a, "--backend") == 0) {
        c->backend = -1;
        for (int k = 0; backend_names[k]; k++)
          if (strcmp(v, backend_names[k]) == 0)
            c->backend = k;
        if (c->backend < 0) {
          fprintf(stderr, "ffrun: --backend \"%s\" is not one of: auto, cpu, cuda\n", v);
          return FF_ERR_INPUT;
        }
      } else if (strcmp(a, "--data") == 0 || strcmp(a, "--text") == 0) {
        c->train.data_file = v;
        c->train.text = strcmp(a, "--text") == 0;
      } else if (strcmp(a, "--checkpoint-dir") == 0) {
        c->train.checkpoint_dir = v;
      } else if (strcmp(a, "--metrics") == 0) {
        c->train.metrics_file = v;
      } else if (strcmp(a, "--init-from") == 0) {
        c->train.init_from = v;
      } else if (strcmp(a, "--eval-data") == 0) {
        c->train.eval_file = v;
      } else {
        char *end;
        long long n = strtoll(v, &end, 10);
        if (*end || n < (strcmp(a, "--checkpoint-every") == 0 ? 0 : 1) || n > 1000000000) {
          fprintf(stderr, "ffrun: %s expects a positive integer, got \"%s\"\n", a, v);
          return FF_ERR_INPUT;
        }
        if (strcmp(a, "--steps") == 0)
          c->train.steps = n;
        else if (strcmp(a, "--checkpoint-every") == 0)
          c->train.checkpoint_every = n;
        else if (strcmp(a, "--eval-every") == 0)
          c->train.eval_every = n;
        else if (strcmp(a, "--eval-batches") == 0)
          c->train.eval_batches = n;
        else
          c->threads = (int)n;
      }
    } else if (a[0] == '-') {
      fprintf(stderr, "ffrun: unknown option %s (see ffrun --help)\n", a);
      return FF_ERR_INPUT;
    } else if (!c->plan_file) {
      c->plan_file = a;
    } else {
      fprintf(stderr, "ffrun: expected one PLAN, got also %s\n", a);
      return FF_ERR_INPUT;
    }
  }
  if (!c->plan_file) {
    usage(stderr);
    return FF_ERR_INPUT;
  }
  if (!c->dry && !c->train.data_file) {
    fprintf(stderr, "ffrun: training needs --data FILE or --text FILE (or use --dry-run)\n");
    return FF_ERR_INPUT;
  }
  if ((c->train.eval_every || c->train.eval_batches) && !c->train.eval_file) {
    fprintf(stderr, "ffrun: --eval-every and --eval-batches need --eval-data FILE\n");
    return FF_ERR_INPUT;
  }
  if ((c->train.resume || c->train.checkpoint_every) && !c->train.checkpoint_dir) {
    fprintf(stderr, "ffrun: --resume and --checkpoint-every need --checkpoint-dir\n");
    return FF_ERR_INPUT;
  }
  return 0;
}

/* mkdir -p: the checkpoint directory and its parents; an existing directory is fine (every rank
 * may race to create it). */
static bool make_dirs(const char *dir) {
  char path[4096];
  if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path) {
    errno = ENAMETOOLONG;
    return false;
  }
  for (char *p = path + 1;; p++) {
    bool end = *p == '\0';
    if (*p == '/' || end) {
      *p = '\0';
      struct stat st;
      if (mkdir(path, 0777) != 0 && errno != EEXIST)
        return false;
      if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return false;
      }
      if (end)
        return true;
      *p = '/';
    }
  }
}

/* The CUDA backend's fatal-error hook: end the whole job, not just this rank. */
static void abort_job(int status) {
  int mpi_up = 0, mpi_down = 0;
  MPI_Initialized(&mpi_up);
  MPI_Finalized(&mpi_down);
  if (mpi_up && !mpi_down)
    MPI_Abort(MPI_COMM_WORLD, status);
  exit(status);
}

/* The GPU the plan gives world rank `rank` (its index on the node), folded onto the GPUs this
 * machine has: a plan of several ranks can be tried on one GPU. */
static int gpu_of_rank(const ff_plan *plan, int rank, int gpus) {
  int p, s, t;
  if (!ff_plan_find_rank(plan, rank, &p, &s, &t) || gpus <= 0)
    return 0;
  return plan->pipelines[p].stages[s].ranks[t].gpu % gpus;
}

/* The compute backend this rank trains on, or NULL when --backend cuda cannot be had. */
static const ff_kernels *compute_backend(cli *c, const ff_plan *plan, backend got, int rank) {
  if (got != BACKEND_CUDA) { /* a test hook: the CPU taking the GPU's copying paths */
    const char *staged = getenv("FF_TEST_STAGED_CPU");
    return staged && strcmp(staged, "1") == 0 ? ff_kernels_cpu_staged(c->threads)
                                              : ff_kernels_cpu(c->threads);
  }
  int gpu = gpu_of_rank(plan, rank, ff_gpu_count(NULL));
  ff_kernel_math math = plan->training.precision == FF_PRECISION_FP32 ? FF_MATH_FP32 : FF_MATH_BF16;
  char why[256];
  const ff_kernels *k = ff_kernels_cuda(gpu, math, abort_job, why, sizeof why);
  if (k) {
    static const ff_kernel_attention attention[] = {
        [FF_ATTENTION_AUTO] = FF_KERNEL_ATTENTION_AUTO,
        [FF_ATTENTION_TENSOR] = FF_KERNEL_ATTENTION_TENSOR,
        [FF_ATTENTION_FUSED] = FF_KERNEL_ATTENTION_FUSED,
        [FF_ATTENTION_GEMM] = FF_KERNEL_ATTENTION_GEMM};
    ff_kernels_cuda_attention(attention[plan->training.attention]); /* the kernel the plan timed */
    if (!c->train.quiet && rank == 0)
      fprintf(stderr, "ffrun: training on the CUDA backend (GPU %d on rank 0; matmuls in %s on "
              "cuBLASLt; weights, activations and optimizer state in fp32)\n", gpu,
              math == FF_MATH_BF16 ? "bf16 with fp32 accumulation" : "fp32");
    return k;
  }
  if (c->backend == BACKEND_CUDA) {
    fprintf(stderr, "ffrun: --backend cuda, but the CUDA backend cannot start: %s\n", why);
    return NULL;
  }
  if (!c->train.quiet && rank == 0)
    fprintf(stderr, "ffrun: the CUDA backend cannot start (%s); using the CPU backend\n", why);
  return ff_kernels_cpu(c->threads);
}

/* Whether every rank trains on a GPU no other rank of its host uses (NCCL refuses two ranks on
 * one GPU): the PCI bus ids of the ranks of each host, compared. */
static bool every_rank_owns_a_gpu(const ff_kernels *k) {
  char mine[32] = "";
  ff_gpu_info info;
  int dev = k->host_memory ? -1 : ff_gpu_current();
  if (dev >= 0 && ff_gpu_query(dev, &info) == 0)
    snprintf(mine, sizeof mine, "%s", info.pci_bus_id);
  MPI_Comm host;
  int ranks_here = 1;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host);
  MPI_Comm_size(host, &ranks_here);
  char *all = calloc((size_t)ranks_here, sizeof mine);
  if (!all)
    MPI_Abort(MPI_COMM_WORLD, 1); /* the others wait in the allgather below */
  MPI_Allgather(mine, (int)sizeof mine, MPI_CHAR, all, (int)sizeof mine, MPI_CHAR, host);
  int me = 0, shared = 0;
  MPI_Comm_rank(host, &me);
  for (int r = 0; r < ranks_here; r++)
    shared += r != me && strcmp(all + (size_t)r * sizeof mine, mine) == 0;
  int own = mine[0] != '\0' && shared == 0;
  free(all);
  MPI_Comm_free(&host);
  MPI_Allreduce(MPI_IN_PLACE, &own, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return own != 0;
}

/* The communication backend, chosen alike on every rank: NCCL needs every rank on the CUDA
 * backend with a GPU of its own; MPI works everywhere. NULL when --comm nccl cannot be had. */
static const ff_comm_backend *communication(const cli *c, const ff_kernels *k, int rank) {
  bool own_gpu = every_rank_owns_a_gpu(k);
  if (c->comm == FF_COMM_MPI || (c->comm == FF_COMM_AUTO && !own_gpu)) {
    const char *test = getenv("FF_TEST_DEVICE_COMM"); /* test hook: see ff_comm_mpi_device */
    bool staged = strcmp(k->name, "cpu-staged") == 0; /* never with real device memory */
    return test && strcmp(test, "1") == 0 && staged ? ff_comm_mpi_device() : ff_comm_mpi();
  }
  if (!own_gpu) {
    if (rank == 0)
      fprintf(stderr, "ffrun: --comm nccl needs every rank on the CUDA backend with a GPU no "
              "other rank of its host uses\n");
    return NULL;
  }
  char why[256];
  const ff_comm_backend *nccl = ff_comm_nccl(k, why, sizeof why);
  if (nccl)
    return nccl;
  if (rank == 0)
    fprintf(stderr, "ffrun: NCCL cannot start: %s%s\n", why,
            c->comm == FF_COMM_AUTO ? "; using MPI" : "");
  return c->comm == FF_COMM_AUTO ? ff_comm_mpi() : NULL;
}

static int train(cli *c, const ff_plan *plan, backend got, int *argc, char ***argv) {
  if (c->train.checkpoint_dir && !make_dirs(c->train.checkpoint_dir)) {
    fprintf(stderr, "ffrun: --checkpoint-dir %s: cannot create it: %s\n", c->train.checkpoint_dir,
            strerror(errno));
    return FF_ERR_INPUT;
  }
  if (!launched_by_mpi()) {
    if (plan->n_ranks != 1) {
      fprintf(stderr, "ffrun: %s has %lld ranks: start it with mpirun -np %lld\n", c->plan_file,
              (long long)plan->n_ranks, (long long)plan->n_ranks);
      return FF_ERR_INPUT;
    }
    const ff_kernels *k = compute_backend(c, plan, got, 0);
    return k ? ff_train(plan, k, ff_comm_self(), &c->train) : FF_ERR_RUNTIME;
  }
  int threads = 0; /* the NCCL watchdog is a second thread; only the main one calls MPI */
  MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &threads);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0)
    c->train.quiet = true; /* one progress line per step, from rank 0 */
  const ff_kernels *k = compute_backend(c, plan, got, rank);
  if (!k)
    MPI_Abort(MPI_COMM_WORLD, FF_ERR_RUNTIME);
  const ff_comm_backend *comm = communication(c, k, rank);
  if (!comm)
    MPI_Abort(MPI_COMM_WORLD, FF_ERR_RUNTIME);
  const char *check = getenv("FF_CHECK_COMM_ORDER"); /* debug: compare every rank's order */
  if (check && strcmp(check, "1") == 0)
    comm = ff_comm_checked(comm);
  int rc = ff_train(plan, k, comm, &c->train);
  if (rc != FF_OK && rc < 128) /* a failure; a signal stop (128 + signal) ends every rank alike */
    MPI_Abort(MPI_COMM_WORLD, rc);
  comm->finalize();
  MPI_Finalize();
  return rc;
}

/* ffrun profile -o FILE [--model M] [--throttle R=F,...] [--quiet] */
static int profile_main(int argc, char **argv) {
  ff_train_opts o;
  memset(&o, 0, sizeof o);
  const char *out = NULL, *model = NULL;
  bool use_gpu = true;
  for (int i = 2; i < argc; i++) {
    const char *v;
    if (strcmp(argv[i], "-o") == 0 && (v = value(argc, argv, &i)))
      out = v;
    else if (strcmp(argv[i], "--backend") == 0 && (v = value(argc, argv, &i))) {
      if (strcmp(v, "auto") && strcmp(v, "cpu")) {
        fprintf(stderr, "ffrun profile: --backend \"%s\" is not one of: auto, cpu\n", v);
        return FF_ERR_INPUT;
      }
      use_gpu = strcmp(v, "auto") == 0;
    }
    else if (strcmp(argv[i], "--model") == 0 && (v = value(argc, argv, &i)))
      model = v;
    else if (strcmp(argv[i], "--throttle") == 0 && (v = value(argc, argv, &i))) {
      if (parse_throttle(v, &o) != 0)
        return FF_ERR_INPUT;
    } else if (strcmp(argv[i], "--quiet") == 0)
      o.quiet = true;
    else {
      fprintf(stderr, "ffrun profile: unexpected argument \"%s\" (usage: ffrun profile -o FILE "
              "[--model M] [--throttle R=F,...] [--backend auto|cpu])\n", argv[i]);
      return FF_ERR_INPUT;
    }
  }
  if (!out) {
    fprintf(stderr, "ffrun profile: -o FILE is required\n");
    return FF_ERR_INPUT;
  }
  return ff_profile(argc, argv, &o, out, model, use_gpu);
}

int main(int argc, char **argv) {
  ff_blas_core_select(argv); /* before anything else: it may start the program again */
#ifdef __linux__
  /* Emulated devices and links sleep to the microsecond; Linux's default timer slack (50 µs per
   * sleep) would add itself to every emulated phase and wait. */
  prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
#endif
  if (argc > 1 && strcmp(argv[1], "profile") == 0)
    return profile_main(argc, argv);
  if (argc > 1 && strcmp(argv[1], "export") == 0)
    return ff_export_main(argc, argv);
  cli c;
  bool done = false;
  int rc = parse(argc, argv, &c, &done);
  if (rc != 0 || done)
    return rc;
  ff_plan plan;
  ff_diag d;
  ff_diag_init(&d, c.plan_file);
  ff_status st = ff_load_plan(c.plan_file, &d, &plan);
  if (st != FF_OK) {
    ff_diag_print(&d, stderr);
    ff_diag_free(&d);
    return st;
  }
  ff_diag_free(&d);
  if (plan.training.zero1) { /* the plan would count on memory this executor does not free */
    fprintf(stderr, "%s: inputs.training.zero1: is true, but ffrun keeps the whole optimizer state "
            "on every rank (no ZeRO-1), so the plan's memory would not hold; plan with \"zero1\": "
            "false\n", c.plan_file);
    ff_plan_free(&plan);
    return FF_ERR_INPUT;
  }
  if (plan.training.attention == FF_ATTENTION_MEGATRON) { /* a description, not a kernel */
    fprintf(stderr, "%s: inputs.training.attention: is \"megatron\", which describes Megatron-LM's "
            "attention for `ffplan simulate`; ffrun runs auto, tensor, fused or gemm\n",
            c.plan_file);
    ff_plan_free(&plan);
    return FF_ERR_INPUT;
  }
  if (plan.training.wire != FF_WIRE_FP32) { /* ffrun's activations stay fp32 between kernels */
    fprintf(stderr, "%s: inputs.training.wire: is \"%s\", which describes another framework for "
            "`ffplan simulate`; ffrun sends activations in fp32\n", c.plan_file,
            ff_wire_names[plan.training.wire]);
    ff_plan_free(&plan);
    return FF_ERR_INPUT;
  }
  backend got;
  char note[512];
  if (!choose_backend((backend)c.backend, &got, note, sizeof note)) {
    fprintf(stderr, "ffrun: --backend cuda, but %s\n", note);
    rc = FF_ERR_RUNTIME;
  } else if (!c.dry) {
    const char *world_rank = getenv("OMPI_COMM_WORLD_RANK");
    bool first = !world_rank || strcmp(world_rank, "0") == 0;
    if (c.backend == BACKEND_AUTO && got == BACKEND_CPU && !c.train.quiet && first)
      fprintf(stderr, "ffrun: no GPU answers, using the CPU backend\n");
    rc = train(&c, &plan, got, &argc, &argv);
  } else if (launched_by_mpi()) {
    MPI_Init(&argc, &argv);
    rc = dry_run_mpi(&plan, got, note);
    MPI_Finalize();
  } else {
    if (c.backend == BACKEND_AUTO && got == BACKEND_CPU)
      fprintf(stderr, "ffrun: no GPU answers, using the CPU backend\n");
    rc = dry_run(&plan, got, note);
  }
  ff_plan_free(&plan);
  return rc;
}
