/* comm_mpi.c — the MPI communication backend (host buffers; groups from MPI_Comm_split). MPI's
 * default error handler aborts the whole job, so a lost peer ends every rank instead of leaving
 * them waiting. */
#include <mpi.h>
#include <stdlib.h>

#include "comm.h"
#include "comm_mpi_ops.h"

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

int ff_mpi_rank(MPI_Comm c) {
  int r;
  MPI_Comm_rank(c, &r);
  return r;
}

int ff_mpi_size(MPI_Comm c) {
  int s;
  MPI_Comm_size(c, &s);
  return s;
}

static int rank(const ff_group *g) { return ff_mpi_rank(g->comm); }
static int size(const ff_group *g) { return ff_mpi_size(g->comm); }

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
void ff_mpi_allreduce(MPI_Comm c, void *buf, int64_t n, MPI_Datatype type, size_t elem, MPI_Op op) {
  char *p = buf;
  while (n > 0) {
    int part = n > (1 << 30) ? (1 << 30) : (int)n;
    MPI_Allreduce(MPI_IN_PLACE, p, part, type, op, c);
    p += (size_t)part * elem;
    n -= part;
  }
}

static void allreduce(ff_group *g, void *buf, int64_t n, MPI_Datatype type, size_t elem, MPI_Op op) {
  ff_mpi_allreduce(g->comm, buf, n, type, elem, op);
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

ff_request *ff_mpi_isend(const void *buf, size_t bytes, int dst, int tag) {
  ff_request *r = malloc(sizeof *r);
  if (!r)
    MPI_Abort(MPI_COMM_WORLD, 1);
  MPI_Isend(buf, (int)bytes, MPI_BYTE, dst, tag, MPI_COMM_WORLD, &r->req);
  return r;
}

void ff_mpi_recv(void *buf, size_t bytes, int src, int tag) {
  MPI_Recv(buf, (int)bytes, MPI_BYTE, src, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
}

void ff_mpi_wait(ff_request *r) {
  if (!r)
    return;
  MPI_Wait(&r->req, MPI_STATUS_IGNORE);
  free(r);
}

static void abort_job(int status) { MPI_Abort(MPI_COMM_WORLD, status); }

static const ff_comm_backend mpi_backend = {
    "mpi", false, world, rank, size, split, release, allreduce_sum, allreduce_max, allreduce_sum_f64,
    allgather, reduce_scatter_sum, bcast, ff_mpi_isend, ff_mpi_recv, ff_mpi_wait, group_nothing,
    group_nothing,
    abort_job};

const ff_comm_backend *ff_comm_mpi(void) { return &mpi_backend; }
