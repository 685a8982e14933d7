/* ffplan.c — the planner's command line: one subcommand per job, each a function that returns
 * an exit status (0 ok, 1 runtime failure, 2 bad input or usage, 3 nothing fits).
 *
 *   ffplan validate FILE...     read any of our formats, report errors or a one-line summary
 *   ffplan fmt FILE [-o OUT]    write a file in canonical form (--check: only say if it is)
 *   ffplan simulate PLAN        the cost model's account of a plan (--json for tools)
 *
 *   ffplan plan --cluster C --model M --training T [-o PLAN]   search for the best plan
 *   ffplan show PLAN / check PLAN / diff A B                   review plans (cmd_show.c, cmd_diff.c)
 *   ffplan svg PLAN -o F.svg / hostfile PLAN                   drawings and launcher files (cmd_svg.c, cmd_hostfile.c)
 *   ffplan calibrate / metrics RUN.jsonl                       fit a profile to a run; read a run
 *                                                              (cmd_calibrate.c, cmd_metrics.c)
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ff_format.h"
#include "ff_version.h"
#include "cmd_review.h"
#include "ffplan_cmds.h"

static void usage(FILE *out) {
  fprintf(out,
          "usage: ffplan COMMAND [ARGS]\n"
          "\n"
          "Plans LLM training over a cluster of mixed GPUs (asymmetric data, pipeline and tensor\n"
          "parallelism) and works with the plans it writes.\n"
          "\n"
          "commands:\n"
          "  plan --cluster C --model M --training T [-o PLAN] [--baseline uniform|flashflex]\n"
          "                            search the plan with the shortest predicted iteration\n"
          "                            time that fits every GPU's memory (exit 3: none fits)\n"
          "  validate FILE...          check device, cluster, model, training or plan files\n"
          "                            (the format is read from each file's \"format\" key);\n"
          "                            prints one line per valid file, every error otherwise\n"
          "  fmt FILE [-o OUT]         write FILE in canonical form to OUT (default: stdout)\n"
          "  fmt --check FILE...       exit 1 if a file is not in canonical form\n"
          "  fmt --in-place FILE...    rewrite files in canonical form\n"
          "  simulate PLAN [--json] [--cluster C]\n"
          "                            predicted time, memory, MFU per rank, stage and pipeline,\n"
          "                            and the critical path (exit 3 if memory overflows); with\n"
          "                            --cluster, on that profile of the plan's cluster\n"
          "  show PLAN                 a compact table of the plan for people\n"
          "  check PLAN [--cluster C] [--model M]\n"
          "                            validate a (hand-edited) plan: structure, memory per rank,\n"
          "                            and the given cluster and model (exit 2 on any problem)\n"
          "  diff A B [--json]         what changed between two plans, in the plan's own words,\n"
          "                            and its predicted effect (exit 0 same, 1 different)\n"
          "  calibrate --plan PLAN --metrics RUN.jsonl --cluster C -o C2\n"
          "                            fit the cluster profile to what a run of the plan measured\n"
          "                            and print the prediction error before and after, per term\n"
          "  metrics RUN.jsonl [--get KEY[,KEY...]]\n"
          "                            check a run's metrics strictly and summarise them, or\n"
          "                            print the named keys of every step, tab-separated\n"
          "  svg PLAN -o FILE.svg [--timeline]\n"
          "                            draw the plan for review: pipelines, stages, TP groups,\n"
          "                            nodes and GPUs by device type, memory per stage;\n"
          "                            --timeline adds each pipeline's simulated schedule\n"
          "                            (-o - writes to standard output)\n"
          "  hostfile PLAN [--format openmpi|slurm] [-o FILE]\n"
          "                            place each rank on its node and GPU: an Open MPI\n"
          "                            rankfile (default) or a SLURM_HOSTFILE (default: stdout)\n"
          "\n"
          "options:\n"
          "  -h, --help                show this help\n"
          "  --version                 show the version\n"
          "\n"
          "exit status: 0 ok, 1 runtime failure (or fmt --check found a difference),\n"
          "             2 bad input or usage, 3 no feasible plan\n"
          "formats: docs/formats.md\n");
}

static int cmd_validate(int argc, char **argv) {
  if (argc < 1) {
    fprintf(stderr, "ffplan validate: expected at least one FILE (see ffplan --help)\n");
    return FF_ERR_INPUT;
  }
  int worst = FF_OK;
  for (int i = 0; i < argc; i++) {
    ff_diag d;
    char summary[1024];
    ff_diag_init(&d, argv[i]);
    ff_status st = ff_validate_file(argv[i], &d, summary, sizeof summary);
    if (st == FF_OK) {
      printf("%s: ok: %s\n", argv[i], summary);
    } else {
      ff_diag_print(&d, stderr);
      if (worst == FF_OK || st == FF_ERR_INPUT)
        worst = st;
    }
    ff_diag_free(&d);
  }
  return worst;
}

static int fmt_one(const char *file, const char *out_file, bool check) {
  ff_diag d;
  ff_buf text = {0};
  ff_format_kind kind;
  ff_diag_init(&d, file);
  ff_status st = ff_canonical_text(file, &d, &text, &kind);
  if (st == FF_OK && check) {
    char *current = NULL;
    size_t len = 0;
    st = ff_read_file(file, &d, &current, &len);
    if (st == FF_OK && (len != text.len || memcmp(current, text.data, len) != 0)) {
      fprintf(stderr, "%s: not in canonical form (run: ffplan fmt --in-place %s)\n", file, file);
      st = FF_ERR_RUNTIME;
    }
    free(current);
  } else if (st == FF_OK) {
    st = ff_write_file_atomic(out_file, text.data, text.len, &d);
  }
  ff_diag_print(&d, stderr);
  ff_diag_free(&d);
  ff_buf_free(&text);
  return st;
}

static int cmd_fmt(int argc, char **argv) {
  bool check = false, in_place = false;
  const char *out = "-";
  int n_files = 0;
  char **files = calloc((size_t)argc + 1, sizeof *files);
  if (!files)
    return FF_ERR_RUNTIME;
  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "--check") == 0) {
      check = true;
    } else if (strcmp(argv[i], "--in-place") == 0 || strcmp(argv[i], "-i") == 0) {
      in_place = true;
    } else if (strcmp(argv[i], "-o") == 0 && i + 1 < argc) {
      out = argv[++i];
    } else if (argv[i][0] == '-' && argv[i][1]) {
      fprintf(stderr, "ffplan fmt: unknown option %s (see ffplan --help)\n", argv[i]);
      free(files);
      return FF_ERR_INPUT;
    } else {
      files[n_files++] = argv[i];
    }
  }
  int worst = FF_OK;
  if (n_files == 0 || (!check && !in_place && n_files != 1) || (check && in_place)) {
    fprintf(stderr, "ffplan fmt: expected FILE [-o OUT], --check FILE... or --in-place FILE...\n");
    worst = FF_ERR_INPUT;
  }
  for (int i = 0; worst != FF_ERR_INPUT && i < n_files; i++) {
    int st = fmt_one(files[i], in_place ? files[i] : out, check);
    if (st != FF_OK && (worst == FF_OK || st == FF_ERR_INPUT))
      worst = st;
  }
  free(files);
  return worst;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return FF_ERR_INPUT;
  }
  const char *cmd = argv[1];
  if (strcmp(cmd, "-h") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "help") == 0) {
    usage(stdout);
    return 0;
  }
  if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0) {
    printf("ffplan %s\n", FF_VERSION);
    return 0;
  }
  for (int i = 2; i < argc; i++) {
    if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
      usage(stdout);
      return 0;
    }
  }
  if (strcmp(cmd, "validate") == 0)
    return cmd_validate(argc - 2, argv + 2);
  if (strcmp(cmd, "fmt") == 0)
    return cmd_fmt(argc - 2, argv + 2);
  if (strcmp(cmd, "show") == 0)
    return ffplan_cmd_show(argc - 2, argv + 2);
  if (strcmp(cmd, "check") == 0)
    return ffplan_cmd_check(argc - 2, argv + 2);
  if (strcmp(cmd, "diff") == 0)
    return ffplan_cmd_diff(argc - 2, argv + 2);
  if (strcmp(cmd, "plan") == 0)
    return ffplan_cmd_plan(argc - 2, argv + 2);
  if (strcmp(cmd, "calibrate") == 0)
    return ffplan_cmd_calibrate(argc - 2, argv + 2);
  if (strcmp(cmd, "metrics") == 0)
    return ffplan_cmd_metrics(argc - 2, argv + 2);
  if (strcmp(cmd, "svg") == 0)
    return ffplan_cmd_svg(argc - 2, argv + 2);
  if (strcmp(cmd, "hostfile") == 0)
    return ffplan_cmd_hostfile(argc - 2, argv + 2);
  if (strcmp(cmd, "simulate") == 0)
    return ffplan_cmd_simulate(argc - 2, argv + 2);
  fprintf(stderr, "ffplan: unknown command \"%s\" (see ffplan --help)\n", cmd);
  return FF_ERR_INPUT;
}
