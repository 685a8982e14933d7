/* gen_cluster.c — write a synthetic ff-cluster/1 file of N GPUs: 4 device types, 8 GPUs per
 * node, racks of 4 nodes with faster links inside a rack than between racks (synth.h has every
 * figure). Built with the project's structs and canonical writer, checked by reading it back,
 * written atomically. Exit status: 0 written, 1 runtime failure, 2 bad arguments or profiles. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ff_format.h"
#include "synth.h"

static void usage(FILE *out) {
  fprintf(out,
          "usage: gen_cluster --gpus N [--seed S] [--mix node|rack] [--name NAME]\n"
          "                   [--profiles DIR] -o FILE\n"
          "\n"
          "Writes a synthetic ff-cluster/1 file (device types inline) for planner tests and\n"
          "benchmarks: N GPUs on nodes of 8 (the last node holds the remainder), of four device\n"
          "types copied from the shipped profiles:\n"
          "  H100-SXM5-80GB  one NVLink island per node   450 GB/s per direction, 2 us\n"
          "  A100-SXM4-80GB  one NVLink island per node   300 GB/s, 3 us\n"
          "  L40S            no NVLink, PCIe via host     25 GB/s, 10 us\n"
          "  RTX-4090        no NVLink, PCIe via host     20 GB/s, 10 us\n"
          "Consecutive nodes form racks of 4 (network.groups rack-K: 25 GB/s, 5 us); nodes in\n"
          "different racks use the default link (12.5 GB/s, 20 us). Types are dealt evenly and\n"
          "shuffled by the seed: the same arguments always give the same bytes.\n"
          "\n"
          "options:\n"
          "  --gpus N        GPUs in the cluster, 1 to %lld (required); readers refuse files\n"
          "                  over 64 MiB, which this reaches near 3 million GPUs\n"
          "  --seed S        seed of the type placement, 0 to 2^64-1 (default 1)\n"
          "  --mix node      deal device types to single nodes (default): racks are mixed\n"
          "  --mix rack      deal device types to whole racks: every rack is of one type\n"
          "  --name NAME     the cluster's name (default synth-N-sS)\n"
          "  --profiles DIR  where devices/*.json are (default %s)\n"
          "  -o FILE         output file; - writes to stdout (required)\n"
          "  -h, --help      show this help\n"
          "\n"
          "exit status: 0 written, 1 runtime failure, 2 bad arguments or profiles\n",
          (long long)SYNTH_MAX_GPUS, synth_profiles_dir());
}

static int bad_usage(const char *fmt, const char *arg) {
  fprintf(stderr, "gen_cluster: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\n(see gen_cluster --help)\n");
  return 2;
}

/* A whole decimal number, nothing else. */
static bool parse_u64(const char *s, uint64_t *out) {
  if (!s || s[0] < '0' || s[0] > '9')
    return false;
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end)
    return false;
  *out = (uint64_t)v;
  return true;
}

int main(int argc, char **argv) {
  synth_options opt = {.gpus = 0, .seed = 1, .mix = SYNTH_MIX_NODE};
  const char *out_file = NULL;
  bool have_gpus = false;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      usage(stdout);
      return 0;
    }
    bool takes_value = strcmp(a, "--gpus") == 0 || strcmp(a, "--seed") == 0 ||
                       strcmp(a, "--mix") == 0 || strcmp(a, "--name") == 0 ||
                       strcmp(a, "--profiles") == 0 || strcmp(a, "-o") == 0;
    if (!takes_value)
      return bad_usage(a[0] == '-' ? "unknown option %s" : "unexpected argument %s", a);
    if (i + 1 >= argc)
      return bad_usage("%s needs a value", a);
    const char *v = argv[++i];
    if (strcmp(a, "--gpus") == 0) {
      uint64_t n;
      if (!parse_u64(v, &n) || n < 1 || n > (uint64_t)SYNTH_MAX_GPUS) {
        fprintf(stderr, "gen_cluster: --gpus %s: expected a whole number from 1 to %lld\n", v,
                (long long)SYNTH_MAX_GPUS);
        return 2;
      }
      opt.gpus = (int64_t)n;
      have_gpus = true;
    } else if (strcmp(a, "--seed") == 0) {
      if (!parse_u64(v, &opt.seed))
        return bad_usage("--seed %s: expected a whole number from 0 to 2^64-1", v);
    } else if (strcmp(a, "--mix") == 0) {
      if (strcmp(v, "node") == 0)
        opt.mix = SYNTH_MIX_NODE;
      else if (strcmp(v, "rack") == 0)
        opt.mix = SYNTH_MIX_RACK;
      else
        return bad_usage("--mix %s: expected node or rack", v);
    } else if (strcmp(a, "--name") == 0) {
      if (!ff_name_valid(v))
        return bad_usage("--name %s: expected 1 to 64 characters of A-Z a-z 0-9 . _ -", v);
      opt.name = v;
    } else if (strcmp(a, "--profiles") == 0) {
      opt.profiles_dir = v;
    } else {
      if (!v[0])
        return bad_usage("-o%s: expected a file name (or - for stdout)", "");
      out_file = v;
    }
  }
  if (!have_gpus)
    return bad_usage("--gpus N is required%s", "");
  if (!out_file)
    return bad_usage("-o FILE is required (- writes to stdout)%s", "");

  ff_diag d;
  ff_diag_init(&d, "gen_cluster");
  ff_cluster c;
  ff_buf text = {0};
  ff_status st = synth_cluster(&opt, &d, &c);
  if (st == FF_OK) {
    st = synth_cluster_check(&c, &d, &text);
    if (st == FF_OK) {
      d.file = out_file;
      st = ff_write_file_atomic(out_file, text.data, text.len, &d);
    }
    if (st == FF_OK && strcmp(out_file, "-") != 0) {
      char summary[512];
      ff_summary_cluster(&c, summary, sizeof summary);
      printf("%s: %s\n", out_file, summary);
    }
    ff_cluster_free(&c);
  }
  ff_buf_free(&text);
  if (st != FF_OK)
    ff_diag_print(&d, stderr);
  ff_diag_free(&d);
  return (int)st;
}
