/* ffrun.c — the executor's command line.
 *
 * `ffrun --dry-run PLAN` reads a plan and prints the role every rank would have: pipeline, stage,
 * TP index, layer range, shards, node and GPU, and the compute backend the rank would use. Run
 * plainly it prints every rank; under mpirun (one process per plan rank) each process finds its
 * own role and rank 0 prints them in order, which checks that the launch matches the plan.
 * MPI is initialised only when the process was started by an MPI launcher. */
#include <mpi.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ff_format.h"
#include "ff_gpu.h"
#include "ff_version.h"

#define ROLE_LINE 256

typedef enum backend { BACKEND_AUTO, BACKEND_CPU, BACKEND_CUDA } backend;
static const char *const backend_names[] = {"auto", "cpu", "cuda", NULL};

static void usage(FILE *out) {
  fprintf(out,
          "usage: ffrun --dry-run PLAN [--backend auto|cpu|cuda]\n"
          "       mpirun -np N ffrun --dry-run PLAN\n"
          "\n"
          "Executes a plan written by ffplan: each MPI rank takes its pipeline stage and tensor\n"
          "shard. This version prints each rank's role (--dry-run); training follows.\n"
          "\n"
          "options:\n"
          "  --dry-run           print the role of each rank and the backend it would use\n"
          "  --backend B         auto (GPU when one answers, else CPU), cpu, or cuda\n"
          "  -h, --help          show this help\n"
          "  --version           show the version\n"
          "\n"
          "exit status: 0 ok, 1 runtime failure, 2 bad input or usage\n");
}

/* Decide the backend; *note explains a fallback. Returns false when cuda was demanded but no
 * GPU answers. */
static bool choose_backend(backend want, backend *got, char *note, size_t cap) {
  const char *why = NULL;
  int gpus = ff_gpu_count(&why);
  note[0] = '\0';
  if (want == BACKEND_CPU) {
    *got = BACKEND_CPU;
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
  snprintf(note, cap, "no GPU answers: %s", why ? why : "unknown reason");
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

/* Plan rank -> (pipeline, stage, tp index). Plans number ranks in this order by construction. */
static bool find_role(const ff_plan *plan, int64_t rank, int *p, int *s, int *t) {
  for (*p = 0; *p < plan->n_pipelines; (*p)++)
    for (*s = 0; *s < plan->pipelines[*p].n_stages; (*s)++)
      for (*t = 0; *t < plan->pipelines[*p].stages[*s].n_ranks; (*t)++)
        if (plan->pipelines[*p].stages[*s].ranks[*t].rank == rank)
          return true;
  return false;
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
  if (find_role(plan, world_rank, &p, &s, &t))
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

int main(int argc, char **argv) {
  bool dry = false;
  const char *plan_file = NULL;
  int want = BACKEND_AUTO;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
      usage(stdout);
      return 0;
    } else if (strcmp(argv[i], "--version") == 0) {
      printf("ffrun %s (%s backend built)\n", FF_VERSION, ff_gpu_built() ? "cpu and cuda" : "cpu");
      return 0;
    } else if (strcmp(argv[i], "--dry-run") == 0) {
      dry = true;
    } else if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc) {
      const char *b = argv[++i];
      want = -1;
      for (int k = 0; backend_names[k]; k++)
        if (strcmp(b, backend_names[k]) == 0)
          want = k;
      if (want < 0) {
        fprintf(stderr, "ffrun: --backend \"%s\" is not one of: auto, cpu, cuda\n", b);
        return FF_ERR_INPUT;
      }
    } else if (argv[i][0] == '-') {
      fprintf(stderr, "ffrun: unknown option %s (see ffrun --help)\n", argv[i]);
      return FF_ERR_INPUT;
    } else if (!plan_file) {
      plan_file = argv[i];
    } else {
      fprintf(stderr, "ffrun: expected one PLAN, got also %s\n", argv[i]);
      return FF_ERR_INPUT;
    }
  }
  if (!plan_file) {
    usage(stderr);
    return FF_ERR_INPUT;
  }
  if (!dry) {
    fprintf(stderr, "ffrun: this version does not train yet; use --dry-run to print each rank's "
            "role\n");
    return FF_ERR_INPUT;
  }
  ff_plan plan;
  ff_diag d;
  ff_diag_init(&d, plan_file);
  ff_status st = ff_load_plan(plan_file, &d, &plan);
  if (st != FF_OK) {
    ff_diag_print(&d, stderr);
    ff_diag_free(&d);
    return st;
  }
  ff_diag_free(&d);
  backend got;
  char note[512];
  int rc;
  if (!choose_backend((backend)want, &got, note, sizeof note)) {
    fprintf(stderr, "ffrun: --backend cuda, but %s\n", note);
    rc = FF_ERR_RUNTIME;
  } else if (launched_by_mpi()) {
    MPI_Init(&argc, &argv);
    rc = dry_run_mpi(&plan, got, note);
    MPI_Finalize();
  } else {
    if (want == BACKEND_AUTO && got == BACKEND_CPU)
      fprintf(stderr, "ffrun: no GPU answers, using the CPU backend\n");
    rc = dry_run(&plan, got, note);
  }
  ff_plan_free(&plan);
  return rc;
}
