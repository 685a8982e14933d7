/* cmd_hostfile.c — `ffplan hostfile PLAN [--format openmpi|slurm] [-o FILE]`: the launcher file
 * that places each rank of a plan on its node (and, for Open MPI, a slot numbered by its GPU):
 * an Open MPI rankfile or a SLURM_HOSTFILE, in rank order, with `#` comments on how to launch. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd_review.h"
#include "ff_format.h"

typedef enum hf_format { HF_OPENMPI, HF_SLURM } hf_format;

typedef struct hf_args {
  const char *plan_file, *out_file;
  hf_format format;
} hf_args;

static int hf_usage(const char *why) {
  fprintf(stderr,
          "ffplan hostfile: %s\n"
          "usage: ffplan hostfile PLAN [--format openmpi|slurm] [-o FILE]\n",
          why);
  return FF_ERR_INPUT;
}

static int parse_args(int argc, char **argv, hf_args *a) {
  *a = (hf_args){NULL, "-", HF_OPENMPI};
  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "--format") == 0 || strcmp(argv[i], "-o") == 0) {
      if (i + 1 >= argc) {
        fprintf(stderr, "ffplan hostfile: %s needs a value\n", argv[i]);
        return FF_ERR_INPUT;
      }
      if (argv[i][1] == 'o') {
        a->out_file = argv[++i];
      } else if (strcmp(argv[++i], "openmpi") == 0) {
        a->format = HF_OPENMPI;
      } else if (strcmp(argv[i], "slurm") == 0) {
        a->format = HF_SLURM;
      } else {
        fprintf(stderr, "ffplan hostfile: --format %s: expected openmpi or slurm\n", argv[i]);
        return FF_ERR_INPUT;
      }
    } else if (argv[i][0] == '-' && argv[i][1]) {
      fprintf(stderr, "ffplan hostfile: unknown option %s (see ffplan --help)\n", argv[i]);
      return FF_ERR_INPUT;
    } else if (!a->plan_file) {
      a->plan_file = argv[i];
    } else {
      return hf_usage("expected one PLAN");
    }
  }
  return a->plan_file ? FF_OK : hf_usage("expected a PLAN file");
}

/* The plan's ranks indexed by rank number (the reader guarantees 0..n-1, each once). */
static const ff_plan_rank **ranks_by_number(const ff_plan *plan) {
  const ff_plan_rank **by = calloc((size_t)plan->n_ranks + 1, sizeof *by);
  if (!by)
    return NULL;
  for (int p = 0; p < plan->n_pipelines; p++)
    for (int s = 0; s < plan->pipelines[p].n_stages; s++)
      for (int t = 0; t < plan->pipelines[p].stages[s].n_ranks; t++) {
        const ff_plan_rank *r = &plan->pipelines[p].stages[s].ranks[t];
        if (r->rank >= 0 && r->rank < plan->n_ranks)
          by[r->rank] = r;
      }
  return by;
}

/* Distinct nodes in order of first use: "a,b,c"; returns how many. */
static int used_nodes(const ff_plan *plan, const ff_plan_rank **by, ff_buf *list) {
  char *seen = calloc((size_t)plan->cluster.n_nodes + 1, 1);
  int n = 0;
  for (int64_t r = 0; seen && r < plan->n_ranks; r++) {
    if (!by[r] || seen[by[r]->node])
      continue;
    seen[by[r]->node] = 1;
    ff_buf_printf(list, "%s%s", n++ ? "," : "", plan->cluster.nodes[by[r]->node].name);
  }
  if (!seen)
    list->failed = true;
  free(seen);
  return n;
}

static void header_common(ff_buf *b, const ff_plan *plan, const char *what, int n_nodes) {
  ff_buf_printf(b, "# %s for plan %s (model %s, cluster %s): %lld rank%s on %d node%s\n", what,
                plan->has_name ? plan->name : "(unnamed)", plan->model.name, plan->cluster.name,
                (long long)plan->n_ranks, plan->n_ranks == 1 ? "" : "s", n_nodes,
                n_nodes == 1 ? "" : "s");
}

static void write_openmpi(ff_buf *b, const ff_plan *plan, const ff_plan_rank **by, const hf_args *a,
                          int n_nodes) {
  const char *file = strcmp(a->out_file, "-") == 0 ? "RANKFILE" : a->out_file;
  header_common(b, plan, "Open MPI rankfile", n_nodes);
  ff_buf_printf(b,
                "# written by ffplan hostfile; one line per rank, in rank order:\n"
                "#   rank N=HOST slot=GPU   (HOST: the rank's node, GPU: its GPU index there)\n"
                "# slot=K binds the rank to CPU core K of HOST (Open MPI's logical numbering), so\n"
                "# ranks of a node never share a core; it does not choose the GPU: ffrun opens\n"
                "# the rank's GPU as the plan says. Launch, with the plan at the same path on\n"
                "# every node:\n"
                "#   mpirun -np %lld --rankfile %s ffrun %s\n",
                (long long)plan->n_ranks, file, a->plan_file);
  for (int64_t r = 0; r < plan->n_ranks; r++)
    if (by[r])
      ff_buf_printf(b, "rank %lld=%s slot=%d\n", (long long)r,
                    plan->cluster.nodes[by[r]->node].name, by[r]->gpu);
}

static void write_slurm(ff_buf *b, const ff_plan *plan, const ff_plan_rank **by, const hf_args *a,
                        const char *nodes, int n_nodes) {
  const char *file = strcmp(a->out_file, "-") == 0 ? "HOSTFILE" : a->out_file;
  header_common(b, plan, "SLURM_HOSTFILE", n_nodes);
  ff_buf_printf(b,
                "# written by ffplan hostfile --format slurm; one node name per rank, in rank\n"
                "# order (comment lines aside): task N of the job step runs on line N's node.\n"
                "# Launch inside an allocation of these nodes (--nodelist=%s):\n"
                "#   export SLURM_HOSTFILE=%s\n"
                "#   srun --ntasks=%lld --distribution=arbitrary ffrun %s\n"
                "# Slurm binds GPUs by local task id, not by rank; ffrun instead maps each rank\n"
                "# to its GPU from the plan. So allocate whole nodes with all their GPUs (e.g.\n"
                "# --exclusive --gres=gpu:N) and leave out --gpus-per-task and --gpu-bind, so\n"
                "# that GPU i in the plan is GPU i on its node.\n",
                nodes, file, (long long)plan->n_ranks, a->plan_file);
  for (int64_t r = 0; r < plan->n_ranks; r++)
    if (by[r])
      ff_buf_printf(b, "%s\n", plan->cluster.nodes[by[r]->node].name);
}

static void print_hint(const ff_plan *plan, const hf_args *a) {
  bool to_stdout = strcmp(a->out_file, "-") == 0;
  if (a->format == HF_OPENMPI)
    fprintf(stderr, "ffplan hostfile: launch with: mpirun -np %lld --rankfile %s ffrun %s\n",
            (long long)plan->n_ranks, to_stdout ? "RANKFILE" : a->out_file, a->plan_file);
  else
    fprintf(stderr,
            "ffplan hostfile: launch with: SLURM_HOSTFILE=%s srun --ntasks=%lld "
            "--distribution=arbitrary ffrun %s\n",
            to_stdout ? "HOSTFILE" : a->out_file, (long long)plan->n_ranks, a->plan_file);
}

static int write_hostfile(const ff_plan *plan, const hf_args *a) {
  const ff_plan_rank **by = ranks_by_number(plan);
  ff_buf nodes = {0}, out = {0};
  int n_nodes = by ? used_nodes(plan, by, &nodes) : 0;
  ff_buf_puts(&nodes, "");
  ff_status st = FF_ERR_RUNTIME;
  if (by && !nodes.failed) {
    if (a->format == HF_OPENMPI)
      write_openmpi(&out, plan, by, a, n_nodes);
    else
      write_slurm(&out, plan, by, a, nodes.data, n_nodes);
  }
  if (!by || nodes.failed || out.failed) {
    fprintf(stderr, "ffplan hostfile: out of memory\n");
  } else {
    ff_diag d;
    ff_diag_init(&d, a->out_file);
    st = ff_write_file_atomic(a->out_file, out.data, out.len, &d);
    ff_diag_print(&d, stderr);
    ff_diag_free(&d);
    if (st == FF_OK)
      print_hint(plan, a);
  }
  ff_buf_free(&out);
  ff_buf_free(&nodes);
  free(by);
  return st;
}

int ffplan_cmd_hostfile(int argc, char **argv) {
  hf_args a;
  int rc = parse_args(argc, argv, &a);
  if (rc != FF_OK)
    return rc;
  ff_plan plan;
  ff_diag d;
  ff_diag_init(&d, a.plan_file);
  ff_status st = ff_load_plan(a.plan_file, &d, &plan);
  ff_diag_print(&d, stderr);
  ff_diag_free(&d);
  if (st != FF_OK)
    return st;
  rc = write_hostfile(&plan, &a);
  ff_plan_free(&plan);
  return rc;
}
