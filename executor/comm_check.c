/* comm_check.c — the order checker (FF_CHECK_COMM_ORDER=1): a communication backend that wraps
 * another, records every collective and device transfer batch this rank issues, in issue order,
 * with the group it went to, and at the end compares the records of every pair of ranks. NCCL
 * promises progress for operations on different communicators only when every rank issues them
 * in the same order (docs/executor.md, "Communication"); so for every two ranks, the operations
 * on the groups both belong to must form the same sequence. Groups are named by how they were
 * made (the parent's name, the how-manieth split of it, the color), which every member computes
 * alike since every member of a parent takes part in each split. A difference is printed (the
 * two ranks, the position, both operations) and every rank ends with status 1. */
#include <mpi.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"

enum { NAME = 64, LINE = 160 };

struct ff_group {
  ff_group *inner;
  char name[NAME];
  int splits; /* splits of this group so far */
};

static const ff_comm_backend *in;
static ff_group world_group;
static char *log_text; /* one line per operation: "group|operation" */
static size_t log_len, log_cap;

__attribute__((format(printf, 2, 3))) static void record(const ff_group *g, const char *fmt, ...) {
  char line[LINE];
  int n = snprintf(line, sizeof line, "%s|", g ? g->name : "world");
  va_list ap;
  va_start(ap, fmt);
  n += vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
  va_end(ap);
  if (n >= LINE - 1)
    n = LINE - 2;
  line[n++] = '\n';
  if (log_len + (size_t)n + 1 > log_cap) {
    size_t cap = log_cap ? 2 * log_cap : 1 << 16;
    while (cap < log_len + (size_t)n + 1)
      cap *= 2;
    char *grown = realloc(log_text, cap);
    if (!grown) {
      fprintf(stderr, "ffrun: out of memory for the order checker's record\n");
      in->abort(1);
    }
    log_text = grown, log_cap = cap;
  }
  memcpy(log_text + log_len, line, (size_t)n);
  log_len += (size_t)n;
  log_text[log_len] = '\0';
}

static ff_group *world(void) {
  world_group.inner = in->world();
  snprintf(world_group.name, sizeof world_group.name, "world");
  return &world_group;
}

static int rank(const ff_group *g) { return in->rank(g->inner); }
static int size(const ff_group *g) { return in->size(g->inner); }

static ff_group *split(ff_group *parent, int color, int key, bool device) {
  int index = parent->splits++;
  ff_group *inner = in->split(parent->inner, color, key, device);
  if (!inner)
    return NULL;
  ff_group *g = calloc(1, sizeof *g);
  if (!g)
    in->abort(1);
  g->inner = inner;
  snprintf(g->name, sizeof g->name, "%.40s/%d.%d", parent->name, index, color);
  return g;
}

static void release(ff_group *g) {
  if (g && g != &world_group) {
    in->release(g->inner);
    free(g);
  }
}

static void allreduce_sum(ff_group *g, float *buf, int64_t n) {
  record(g, "sum %lld floats", (long long)n);
  in->allreduce_sum(g->inner, buf, n);
}

static void allreduce_max(ff_group *g, float *buf, int64_t n) {
  record(g, "max %lld floats", (long long)n);
  in->allreduce_max(g->inner, buf, n);
}

static void allreduce_sum_f64(ff_group *g, double *buf, int64_t n) {
  record(g, "sum %lld doubles", (long long)n);
  in->allreduce_sum_f64(g->inner, buf, n);
}

static ff_request *iallreduce_sum(ff_group *g, float *buf, int64_t n) {
  record(g, "started sum %lld floats", (long long)n);
  return in->iallreduce_sum(g->inner, buf, n);
}

static bool test(ff_request *r) { return in->test(r); }
static void wait(ff_request *r) { in->wait(r); }

static void allgather(ff_group *g, const void *mine, void *all, size_t bytes) {
  record(g, "allgather %zu bytes", bytes);
  in->allgather(g->inner, mine, all, bytes);
}

static void reduce_scatter(ff_group *g, const float *send, float *recv, int64_t n) {
  record(g, "reduce-scatter %lld floats", (long long)n);
  in->reduce_scatter_sum(g->inner, send, recv, n);
}

static void bcast(ff_group *g, void *buf, size_t bytes, int root) {
  record(g, "broadcast %zu bytes from %d", bytes, root);
  in->bcast(g->inner, buf, bytes, root);
}

/* Host transfers go through MPI, whose tags match them whatever the order: not recorded. */
static ff_request *isend(const void *buf, size_t bytes, int dst, int tag) {
  return in->isend(buf, bytes, dst, tag);
}

static ff_request *irecv(void *buf, size_t bytes, int src, int tag) {
  return in->irecv(buf, bytes, src, tag);
}

static void recv(void *buf, size_t bytes, int src, int tag) { in->recv(buf, bytes, src, tag); }

/* A device batch, once per peer: the pair's transfers in it, in a canonical order, as both ends
 * see them ("a>b n" for n bytes from world rank a to b). */
static void p2p_batch(const ff_p2p *ops, int n) {
  int me = in->rank(in->world());
  for (int i = 0; i < n; i++) {
    bool first = true; /* record each peer once, at its first transfer in the batch */
    for (int j = 0; j < i && first; j++)
      first = ops[j].peer != ops[i].peer;
    if (!first)
      continue;
    int peer = ops[i].peer;
    char what[LINE] = "", item[48];
    for (int dir = 0; dir < 2; dir++) { /* from the lower rank first, then from the higher */
      int from = dir == 0 ? (me < peer ? me : peer) : (me < peer ? peer : me);
      for (int j = i; j < n; j++) {
        if (ops[j].peer != peer || ops[j].send != (from == me))
          continue;
        snprintf(item, sizeof item, " %d>%d %zu", from, from == me ? peer : me, ops[j].bytes);
        strncat(what, item, sizeof what - strlen(what) - 1);
      }
    }
    ff_group pair = {0};
    snprintf(pair.name, sizeof pair.name, "pair %d-%d", me < peer ? me : peer,
             me < peer ? peer : me);
    record(&pair, "transfers%s", what);
  }
  in->p2p_batch(ops, n);
}

static double collective_seconds(void) { return in->collective_seconds(); }
static void abort_job(int status) { in->abort(status); }

/* ---- the comparison, on rank 0 ------------------------------------------------------------ */

typedef struct ops_of {
  char **line; /* "group|operation" */
  int n;
} ops_of;

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The group of a record line: up to its '|', copied into out. */
static void group_of(const char *line, char *out) {
  size_t k = strcspn(line, "|");
  memcpy(out, line, k);
  out[k] = '\0';
}

/* Whether rank b's records name group g (b's sorted group names). */
static bool has_group(char **names, int n, const char *g) {
  const char *key = g;
  return bsearch(&key, names, (size_t)n, sizeof *names, cmp_str) != NULL;
}

/* The sorted distinct groups of a rank's records. */
static int groups_of(const ops_of *o, char ***out) {
  char **names = malloc((size_t)(o->n + 1) * sizeof *names);
  int n = 0;
  for (int i = 0; names && i < o->n; i++) {
    char g[LINE];
    group_of(o->line[i], g);
    names[n++] = strdup(g);
  }
  qsort(names, (size_t)n, sizeof *names, cmp_str);
  int k = 0;
  for (int i = 0; i < n; i++) {
    if (k > 0 && strcmp(names[k - 1], names[i]) == 0) {
      free(names[i]);
      continue;
    }
    names[k++] = names[i];
  }
  *out = names;
  return k;
}

/* Compare every pair of ranks on the groups they share; print the first difference of each
 * pair that differs. Returns the number of such pairs. */
static int compare(ops_of *all, int ranks) {
  char ***names = calloc((size_t)ranks, sizeof *names);
  int *n_names = calloc((size_t)ranks, sizeof *n_names);
  int bad = 0;
  for (int r = 0; names && n_names && r < ranks; r++)
    n_names[r] = groups_of(&all[r], &names[r]);
  for (int a = 0; names && n_names && a < ranks; a++)
    for (int b = a + 1; b < ranks; b++) {
      int i = 0, j = 0, k = 0;
      char ga[LINE], gb[LINE];
      for (;;) {
        while (i < all[a].n && (group_of(all[a].line[i], ga), !has_group(names[b], n_names[b], ga)))
          i++;
        while (j < all[b].n && (group_of(all[b].line[j], gb), !has_group(names[a], n_names[a], gb)))
          j++;
        if (i == all[a].n || j == all[b].n) {
          if (i != all[a].n || j != all[b].n) {
            fprintf(stderr, "ffrun: order check: ranks %d and %d differ after %d operations on "
                    "the groups they share: rank %d has no more, rank %d issues %s\n", a, b, k,
                    i == all[a].n ? a : b, i == all[a].n ? b : a,
                    i == all[a].n ? all[b].line[j] : all[a].line[i]);
            bad++;
          }
          break;
        }
        if (strcmp(all[a].line[i], all[b].line[j]) != 0) {
          fprintf(stderr, "ffrun: order check: ranks %d and %d differ at operation %d on the "
                  "groups they share: rank %d issues %s, rank %d issues %s\n", a, b, k + 1, a,
                  all[a].line[i], b, all[b].line[j]);
          bad++;
          break;
        }
        i++, j++, k++;
      }
    }
  for (int r = 0; names && r < ranks; r++) {
    for (int i = 0; names[r] && i < n_names[r]; i++)
      free(names[r][i]);
    free(names[r]);
  }
  free(names);
  free(n_names);
  return bad;
}

/* Every rank's record to rank 0, which compares them; every rank learns the verdict. */
static int check_all(void) {
  int me = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  if (!log_text)
    log_text = calloc(1, 1);
  long long mine = (long long)log_len, *lens = me == 0 ? calloc((size_t)ranks, sizeof *lens) : NULL;
  MPI_Gather(&mine, 1, MPI_LONG_LONG, lens, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
  int *counts = NULL, *displs = NULL;
  char *text = NULL;
  if (me == 0) {
    counts = calloc((size_t)ranks, sizeof *counts);
    displs = calloc((size_t)ranks, sizeof *displs);
    long long total = 0;
    for (int r = 0; counts && displs && lens && r < ranks; r++) {
      counts[r] = (int)lens[r];
      displs[r] = (int)total;
      total += lens[r];
    }
    text = malloc((size_t)total + 1);
    if (!counts || !displs || !lens || !text || total > 0x7fffffff) {
      fprintf(stderr, "ffrun: the order checker cannot gather the records\n");
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    text[total] = '\0';
  }
  MPI_Gatherv(log_text, (int)log_len, MPI_CHAR, text, counts, displs, MPI_CHAR, 0,
              MPI_COMM_WORLD);
  int bad = 0;
  if (me == 0) {
    ops_of *all = calloc((size_t)ranks, sizeof *all);
    for (int r = 0; all && r < ranks; r++) {
      char *p = text + displs[r], *end = p + counts[r];
      all[r].line = malloc(((size_t)counts[r] / 2 + 1) * sizeof *all[r].line);
      while (all[r].line && p < end) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        if (!nl)
          break;
        *nl = '\0';
        all[r].line[all[r].n++] = p;
        p = nl + 1;
      }
    }
    bad = all ? compare(all, ranks) : 1;
    if (bad == 0)
      fprintf(stderr, "ffrun: order check: %d ranks issued their collectives in one order\n",
              ranks);
    for (int r = 0; all && r < ranks; r++)
      free(all[r].line);
    free(all);
  }
  MPI_Bcast(&bad, 1, MPI_INT, 0, MPI_COMM_WORLD);
  free(lens), free(counts), free(displs), free(text);
  return bad;
}

static void finalize(void) {
  int bad = check_all();
  free(log_text);
  log_text = NULL, log_len = log_cap = 0;
  in->finalize();
  if (bad) {
    MPI_Finalize();
    exit(1);
  }
}

const ff_comm_backend *ff_comm_checked(const ff_comm_backend *inner) {
  static ff_comm_backend b;
  in = inner;
  b = (ff_comm_backend){
      .name = inner->name,
      .device_buffers = inner->device_buffers,
      .world = world,
      .rank = rank,
      .size = size,
      .split = split,
      .release = release,
      .allreduce_sum = allreduce_sum,
      .allreduce_max = allreduce_max,
      .allreduce_sum_f64 = allreduce_sum_f64,
      .iallreduce_sum = iallreduce_sum,
      .test = test,
      .allgather = allgather,
      .reduce_scatter_sum = reduce_scatter,
      .bcast = bcast,
      .isend = isend,
      .irecv = irecv,
      .recv = recv,
      .wait = wait,
      .p2p_batch = inner->p2p_batch ? p2p_batch : NULL,
      .collective_seconds = collective_seconds,
      .abort = abort_job,
      .finalize = finalize,
  };
  return &b;
}
