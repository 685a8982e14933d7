/* comm_mpi.c — the MPI communication backend (host buffers; groups from MPI_Comm_split). MPI's
 * default error handler aborts the whole job, so a lost peer ends every rank instead of leaving
 * them waiting. */
#include <mpi.h>
#include <stdlib.h>

#include "comm.h"

struct ff_group {
  MPI_Comm comm;
};

struct ff_request {
  MPI_Request req;
};

static ff_group world_group = {MPI_COMM_NULL};

static ff_group *world(void) {
  world_group.comm = MPI_COMM_WORLD;
  return &world_group;
}

static int rank(const ff_group *g) {
  int r;
  MPI_Comm_rank(g->comm, &r);
  return r;
}

static int size(const ff_group *g) {
  int s;
  MPI_Comm_size(g->comm, &s);
  return s;
}

static ff_group *split(ff_group *parent, int color, int key) {
  MPI_Comm c;
  MPI_Comm_split(parent->comm, color < 0 ? MPI_UNDEFINED : color, key, &c);
  if (c == MPI_COMM_NULL)
    return NULL;
  ff_group *g = malloc(sizeof *g);
  if (!g)
    MPI_Abort(MPI_COMM_WORLD, 1);
  g->comm = c;
  return g;
}

static void release(ff_group *g) {
  if (g && g != &world_group) {
    MPI_Comm_free(&g->comm);
    free(g);
  }
}

/* MPI counts are ints: reduce in pieces of at most 2^30 elements. */
static void allreduce(ff_group *g, void *buf, int64_t n, MPI_Datatype type, size_t elem, MPI_Op op) {
  char *p = buf;
  while (n > 0) {
    int part = n > (1 << 30) ? (1 << 30) : (int)n;
    MPI_Allreduce(MPI_IN_PLACE, p, part, type, op, g->comm);
    p += (size_t)part * elem;
    n -= part;
  }
}

static void allreduce_sum(ff_group *g, float *buf, int64_t n) {
  allreduce(g, buf, n, MPI_FLOAT, sizeof(float), MPI_SUM);
}

static void allreduce_max(ff_group *g, float *buf, int64_t n) {
  allreduce(g, buf, n, MPI_FLOAT, sizeof(float), MPI_MAX);
}

static void allreduce_sum_f64(ff_group *g, double *buf, int64_t n) {
  allreduce(g, buf, n, MPI_DOUBLE, sizeof(double), MPI_SUM);
}

static void allgather(ff_group *g, const void *mine, void *all, size_t bytes) {
  MPI_Allgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, g->comm);
}

static void reduce_scatter_sum(ff_group *g, const float *send, float *recv, int64_t n) {
  MPI_Reduce_scatter_block(send, recv, (int)n, MPI_FLOAT, MPI_SUM, g->comm);
}

static void group_nothing(void) {}

static void bcast(ff_group *g, void *buf, size_t bytes, int root) {
  MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, g->comm);
}

static ff_request *isend(const void *buf, size_t bytes, int dst, int tag) {
  ff_request *r = malloc(sizeof *r);
  if (!r)
    MPI_Abort(MPI_COMM_WORLD, 1);
  MPI_Isend(buf, (int)bytes, MPI_BYTE, dst, tag, MPI_COMM_WORLD, &r->req);
  return r;
}

static void recv(void *buf, size_t bytes, int src, int tag) {
  MPI_Recv(buf, (int)bytes, MPI_BYTE, src, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
}

static void wait(ff_request *r) {
  if (!r)
    return;
  MPI_Wait(&r->req, MPI_STATUS_IGNORE);
  free(r);
}

static void abort_job(int status) { MPI_Abort(MPI_COMM_WORLD, status); }

static const ff_comm_backend mpi_backend = {
    "mpi", world, rank, size, split, release, allreduce_sum, allreduce_max, allreduce_sum_f64,
    allgather, reduce_scatter_sum, bcast, isend, recv, wait, group_nothing, group_nothing,
    abort_job};

const ff_comm_backend *ff_comm_mpi(void) { return &mpi_backend; }
