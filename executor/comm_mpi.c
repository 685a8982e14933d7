/* comm_mpi.c — the MPI communication backend (host buffers; groups from MPI_Comm_split). MPI's
 * default error handler aborts the whole job, so a lost peer ends every rank instead of leaving
 * them waiting. */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <stdlib.h>
#include <time.h>

#include "comm.h"
#include "comm_mpi_ops.h"

struct ff_group {
  MPI_Comm comm;
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

static ff_group *split(ff_group *parent, int color, int key, bool device) {
  (void)device;
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

/* MPI counts are ints, so long messages and sums go in pieces: of 2^30 bytes (point to point) or
 * 2^30 elements (sums). The test hook FF_TEST_MPI_PIECE=N makes pieces of N instead, so that the
 * piecing is exercised on small models. */
static int64_t piece(void) {
  static int64_t size = 0;
  if (size == 0) {
    const char *test = getenv("FF_TEST_MPI_PIECE");
    long long n = test ? atoll(test) : 0;
    size = n > 0 && n < (1 << 30) ? n : (1 << 30);
  }
  return size;
}

void ff_mpi_allreduce(MPI_Comm c, void *buf, int64_t n, MPI_Datatype type, size_t elem, MPI_Op op) {
  char *p = buf;
  while (n > 0) {
    int part = n > piece() ? (int)piece() : (int)n;
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

/* Waits for n requests without holding the processor through a long wait. MPI polls while it
 * waits; where ranks share cores (an emulated cluster, other work on the machine) a rank polling
 * through a pipeline's bubble takes the processor from the ranks it waits for, and they from
 * each other. So: poll for 100 µs (a transfer or sum whose peer is there), then sleep 50 µs
 * between polls. Open MPI moves the operations on inside MPI_Testall. */
void ff_mpi_patient_wait(int n, MPI_Request *r) {
  int done = 0;
  MPI_Testall(n, r, &done, MPI_STATUSES_IGNORE);
  if (done)
    return;
  struct timespec t0, t, nap = {0, 50000};
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (bool polling = true; !done; MPI_Testall(n, r, &done, MPI_STATUSES_IGNORE)) {
    if (polling) {
      clock_gettime(CLOCK_MONOTONIC, &t);
      polling = (double)(t.tv_sec - t0.tv_sec) + (double)(t.tv_nsec - t0.tv_nsec) * 1e-9 < 1e-4;
    } else {
      nanosleep(&nap, NULL);
    }
  }
}

/* The sums of doubles (losses, norms, the bad-rank count) are where ranks wait for the slowest
 * pipeline: started, then waited for patiently. */
static void allreduce_sum_f64(ff_group *g, double *buf, int64_t n) {
  for (int64_t at = 0; at < n; at += piece()) {
    int part = n - at > piece() ? (int)piece() : (int)(n - at);
    MPI_Request r;
    MPI_Iallreduce(MPI_IN_PLACE, buf + at, part, MPI_DOUBLE, MPI_SUM, g->comm, &r);
    ff_mpi_patient_wait(1, &r);
  }
}

static void allgather(ff_group *g, const void *mine, void *all, size_t bytes) {
  MPI_Allgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, g->comm);
}

static void reduce_scatter_sum(ff_group *g, const float *send, float *recv, int64_t n) {
  MPI_Reduce_scatter_block(send, recv, (int)n, MPI_FLOAT, MPI_SUM, g->comm);
}

static void bcast(ff_group *g, void *buf, size_t bytes, int root) {
  MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, g->comm);
}

static ff_request *pool; /* released requests, for reuse */

ff_request *ff_mpi_request(int n) {
  int need = n > 1 ? n : 1; /* room for one even when a batch starts none */
  ff_request **at = &pool;
  while (*at && (*at)->cap < need)
    at = &(*at)->next;
  ff_request *r = *at;
  if (r) {
    *at = r->next;
  } else {
    r = calloc(1, sizeof *r);
    if (r && need > 1 && !(r->mpi = calloc((size_t)need, sizeof *r->mpi))) {
      free(r);
      r = NULL;
    }
    if (!r)
      MPI_Abort(MPI_COMM_WORLD, 1);
    r->cap = need;
    if (need == 1)
      r->mpi = &r->one;
  }
  r->n = n;
  r->event = NULL;
  r->next = NULL;
  return r;
}

void ff_mpi_request_release(ff_request *r) {
  r->next = pool;
  pool = r;
}

void ff_mpi_request_pool_free(void) {
  while (pool) {
    ff_request *r = pool;
    pool = r->next;
    if (r->mpi != &r->one)
      free(r->mpi);
    free(r);
  }
}

/* Messages go in pieces of piece() bytes; MPI keeps the pieces of one sender and tag in order. */
static int pieces(size_t bytes) {
  size_t p = (size_t)piece();
  return bytes == 0 ? 1 : (int)((bytes + p - 1) / p);
}

static size_t piece_bytes(size_t bytes, int i) {
  size_t p = (size_t)piece(), left = bytes - (size_t)i * p;
  return left < p ? left : p;
}

ff_request *ff_mpi_isend(const void *buf, size_t bytes, int dst, int tag) {
  int n = pieces(bytes);
  ff_request *r = ff_mpi_request(n);
  const char *p = buf;
  for (int i = 0; i < n; i++)
    MPI_Isend(p + (size_t)i * (size_t)piece(), (int)piece_bytes(bytes, i), MPI_BYTE, dst, tag,
              MPI_COMM_WORLD, &r->mpi[i]);
  return r;
}

ff_request *ff_mpi_irecv(void *buf, size_t bytes, int src, int tag) {
  int n = pieces(bytes);
  ff_request *r = ff_mpi_request(n);
  char *p = buf;
  for (int i = 0; i < n; i++)
    MPI_Irecv(p + (size_t)i * (size_t)piece(), (int)piece_bytes(bytes, i), MPI_BYTE, src, tag,
              MPI_COMM_WORLD, &r->mpi[i]);
  return r;
}

void ff_mpi_recv(void *buf, size_t bytes, int src, int tag) {
  ff_mpi_wait(ff_mpi_irecv(buf, bytes, src, tag));
}

void ff_mpi_wait(ff_request *r) {
  if (!r)
    return;
  ff_mpi_patient_wait(r->n, r->mpi);
  ff_mpi_request_release(r);
}

bool ff_mpi_test(ff_request *r) {
  int done = 1;
  if (r)
    MPI_Testall(r->n, r->mpi, &done, MPI_STATUSES_IGNORE);
  return done != 0;
}

/* A long sum goes in several started pieces of piece() elements. */
ff_request *ff_mpi_iallreduce_sum(MPI_Comm c, float *buf, int64_t n) {
  int64_t size = piece();
  int parts = n <= 0 ? 1 : (int)((n + size - 1) / size);
  ff_request *r = ff_mpi_request(parts);
  for (int i = 0; i < parts; i++) {
    int64_t left = n - (int64_t)i * size;
    int part = left < size ? (int)(left > 0 ? left : 0) : (int)size;
    MPI_Iallreduce(MPI_IN_PLACE, buf + (int64_t)i * size, part, MPI_FLOAT, MPI_SUM, c, &r->mpi[i]);
  }
  return r;
}

static ff_request *iallreduce_sum(ff_group *g, float *buf, int64_t n) {
  return ff_mpi_iallreduce_sum(g->comm, buf, n);
}

/* The test hook's stand-in for NCCL's grouped send and receive: every transfer of the batch
 * started, sends in synchronous mode (MPI_Issend completes only once its receive is matched, as
 * an NCCL send waits for its peer), then all waited for. A schedule that would deadlock NCCL,
 * two ranks each sending to the other before receiving, deadlocks here too. */
static void p2p_batch_sync(const ff_p2p *ops, int n) {
  int total = 0;
  for (int i = 0; i < n; i++)
    total += pieces(ops[i].bytes);
  ff_request *r = ff_mpi_request(total);
  int k = 0;
  for (int i = 0; i < n; i++) {
    char *p = ops[i].buf;
    for (int j = 0; j < pieces(ops[i].bytes); j++, k++) {
      char *at = p + (size_t)j * (size_t)piece();
      int len = (int)piece_bytes(ops[i].bytes, j);
      if (ops[i].send)
        MPI_Issend(at, len, MPI_BYTE, ops[i].peer, ops[i].tag, MPI_COMM_WORLD, &r->mpi[k]);
      else
        MPI_Irecv(at, len, MPI_BYTE, ops[i].peer, ops[i].tag, MPI_COMM_WORLD, &r->mpi[k]);
    }
  }
  ff_mpi_wait(r);
}

static void abort_job(int status) { MPI_Abort(MPI_COMM_WORLD, status); }

static void finalize(void) { ff_mpi_request_pool_free(); }

static double no_device_seconds(void) { return 0.0; }

static const ff_comm_backend mpi_backend = {
    "mpi", false, world, rank, size, split, release, allreduce_sum, allreduce_max, allreduce_sum_f64,
    iallreduce_sum, ff_mpi_test, allgather, reduce_scatter_sum, bcast, ff_mpi_isend, ff_mpi_irecv,
    ff_mpi_recv, ff_mpi_wait, NULL, no_device_seconds, abort_job, finalize};

const ff_comm_backend *ff_comm_mpi(void) { return &mpi_backend; }

/* The same operations under another name and flag, and NCCL's grouped transfers: MPI reads the
 * staged CPU backend's "device" memory directly, since it is host memory. */
const ff_comm_backend *ff_comm_mpi_device(void) {
  static ff_comm_backend device;
  device = mpi_backend;
  device.name = "mpi-device";
  device.device_buffers = true;
  device.p2p_batch = p2p_batch_sync;
  return &device;
}
