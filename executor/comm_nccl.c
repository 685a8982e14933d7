/* comm_nccl.c — the NCCL communication backend, for ranks that each own a GPU.
 *
 * Collectives on device buffers (the TP all-reduces of activations, between kernels) run through
 * NCCL on the compute backend's stream, so they are ordered with the kernels around them and the
 * host does not wait. Everything else — host buffers (losses, timings, names), point-to-point
 * transfers of the staged activations, the gradient sums on the host copy — goes through MPI,
 * which also bootstraps NCCL: rank 0's unique id travels by MPI_Bcast, subgroups are made by
 * ncclCommSplit beside MPI_Comm_split. A buffer is "device" when CUDA says its pointer is device
 * or managed memory.
 *
 * A dead peer must end the job, not hang it: a watchdog thread asks every communicator for its
 * asynchronous error once a second and, on an error or when a collective has not finished within
 * FF_NCCL_TIMEOUT_S seconds (default 600), prints why, aborts the communicators and exits the
 * process non-zero, which makes mpirun end every rank. */
#define _POSIX_C_SOURCE 200809L
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm.h"
#include "comm_mpi_ops.h"
#include "ff_kernels.h"

enum {
  MAX_COMMS = 256,
  PENDING = 4096, /* collectives whose completion the watchdog follows */
};

struct ff_group {
  MPI_Comm mpi;
  ncclComm_t nccl; /* NULL for a group of one */
};

/* One backend per process, like the CUDA backend it rides on. */
static struct nccl_state {
  cudaStream_t stream;
  ff_group world;
  ncclComm_t comms[MAX_COMMS]; /* every communicator made, for the watchdog */
  int n_comms;
  /* a ring of events recorded after each collective, with when it was issued: they complete in
   * order on the one stream, so the oldest unfinished one says how long the stream has been stuck */
  cudaEvent_t done[PENDING];
  double issued_at[PENDING];
  int head, pending;
  int device, rank;
  double timeout_s;
  pthread_mutex_t lock;
  pthread_t watchdog;
  bool ready;
} nc = {.lock = PTHREAD_MUTEX_INITIALIZER};

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* No MPI here: the watchdog thread may be the caller. */
static void die(const char *what, const char *why) {
  fprintf(stderr, "ffrun: rank %d: NCCL: %s: %s; ending the job\n", nc.rank, what, why);
  fflush(stderr);
  pthread_mutex_lock(&nc.lock);
  for (int i = 0; i < nc.n_comms; i++)
    ncclCommAbort(nc.comms[i]);
  nc.n_comms = 0;
  pthread_mutex_unlock(&nc.lock);
  _exit(1); /* from any thread; mpirun then ends the other ranks */
}

#define NCCL_CHECK(call)                                                                       \
  do {                                                                                         \
    ncclResult_t r_ = (call);                                                                  \
    if (r_ != ncclSuccess)                                                                     \
      die(#call, ncclGetErrorString(r_));                                                      \
  } while (0)

#define CUDA_CHECK(call)                                                                       \
  do {                                                                                         \
    cudaError_t e_ = (call);                                                                   \
    if (e_ != cudaSuccess)                                                                     \
      die(#call, cudaGetErrorString(e_));                                                      \
  } while (0)

static void *watch(void *unused) {
  (void)unused;
  cudaSetDevice(nc.device); /* a new thread starts on device 0 */
  for (;;) {
    sleep(1);
    pthread_mutex_lock(&nc.lock);
    for (int i = 0; i < nc.n_comms; i++) {
      ncclResult_t async = ncclSuccess;
      if (ncclCommGetAsyncError(nc.comms[i], &async) == ncclSuccess && async != ncclSuccess &&
          async != ncclInProgress) {
        pthread_mutex_unlock(&nc.lock);
        die("asynchronous error", ncclGetErrorString(async));
      }
    }
    while (nc.pending > 0 && cudaEventQuery(nc.done[nc.head]) == cudaSuccess) {
      nc.head = (nc.head + 1) % PENDING;
      nc.pending--;
    }
    bool stuck = nc.pending > 0 && now() - nc.issued_at[nc.head] > nc.timeout_s;
    pthread_mutex_unlock(&nc.lock);
    if (stuck) {
      char why[96];
      snprintf(why, sizeof why, "a collective has not finished after %.0f s (FF_NCCL_TIMEOUT_S)",
               nc.timeout_s);
      die("timeout", why);
    }
  }
  return NULL;
}

static void remember(ncclComm_t c) {
  pthread_mutex_lock(&nc.lock);
  if (nc.n_comms < MAX_COMMS)
    nc.comms[nc.n_comms++] = c;
  pthread_mutex_unlock(&nc.lock);
}

/* Follow the collective just issued (when the ring is full, the watchdog has fallen a second
 * behind; the next ones are followed again once it catches up). */
static void issued(void) {
  pthread_mutex_lock(&nc.lock);
  if (nc.pending < PENDING) {
    int i = (nc.head + nc.pending) % PENDING;
    cudaError_t e = cudaEventRecord(nc.done[i], nc.stream);
    if (e == cudaSuccess) {
      nc.issued_at[i] = now();
      nc.pending++;
    }
    pthread_mutex_unlock(&nc.lock);
    if (e != cudaSuccess)
      die("cudaEventRecord", cudaGetErrorString(e));
    return;
  }
  pthread_mutex_unlock(&nc.lock);
}

static bool on_device(const void *p) {
  struct cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError(); /* a plain host pointer on older runtimes */
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

/* ---- groups ----------------------------------------------------------------------------- */

static ff_group *world(void) { return &nc.world; }

static int rank(const ff_group *g) { return ff_mpi_rank(g->mpi); }
static int size(const ff_group *g) { return ff_mpi_size(g->mpi); }

static ff_group *split(ff_group *parent, int color, int key) {
  MPI_Comm m;
  MPI_Comm_split(parent->mpi, color < 0 ? MPI_UNDEFINED : color, key, &m);
  ncclComm_t n = NULL;
  if (parent->nccl)
    NCCL_CHECK(ncclCommSplit(parent->nccl, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &n, NULL));
  if (m == MPI_COMM_NULL)
    return NULL;
  ff_group *g = malloc(sizeof *g);
  if (!g)
    die("split", "out of memory");
  g->mpi = m;
  g->nccl = n;
  if (n)
    remember(n);
  return g;
}

static void release(ff_group *g) {
  if (!g || g == &nc.world)
    return;
  if (g->nccl) {
    pthread_mutex_lock(&nc.lock);
    for (int i = 0; i < nc.n_comms; i++)
      if (nc.comms[i] == g->nccl)
        nc.comms[i] = nc.comms[--nc.n_comms];
    pthread_mutex_unlock(&nc.lock);
    CUDA_CHECK(cudaStreamSynchronize(nc.stream));
    ncclCommDestroy(g->nccl);
  }
  MPI_Comm_free(&g->mpi);
  free(g);
}

/* ---- collectives: device buffers through NCCL, host buffers through MPI ------------------ */

static void allreduce(ff_group *g, void *buf, int64_t n, MPI_Datatype mt, ncclDataType_t nt,
                      size_t elem, MPI_Op mop, ncclRedOp_t nop) {
  if (n <= 0)
    return;
  if (g->nccl && on_device(buf)) {
    NCCL_CHECK(ncclAllReduce(buf, buf, (size_t)n, nt, nop, g->nccl, nc.stream));
    issued();
    return;
  }
  ff_mpi_allreduce(g->mpi, buf, n, mt, elem, mop);
}

static void allreduce_sum(ff_group *g, float *buf, int64_t n) {
  allreduce(g, buf, n, MPI_FLOAT, ncclFloat32, sizeof(float), MPI_SUM, ncclSum);
}

static void allreduce_max(ff_group *g, float *buf, int64_t n) {
  allreduce(g, buf, n, MPI_FLOAT, ncclFloat32, sizeof(float), MPI_MAX, ncclMax);
}

static void allreduce_sum_f64(ff_group *g, double *buf, int64_t n) {
  allreduce(g, buf, n, MPI_DOUBLE, ncclFloat64, sizeof(double), MPI_SUM, ncclSum);
}

static void allgather(ff_group *g, const void *mine, void *all, size_t bytes) {
  if (g->nccl && on_device(all)) {
    NCCL_CHECK(ncclAllGather(mine, all, bytes, ncclChar, g->nccl, nc.stream));
    issued();
    return;
  }
  MPI_Allgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, g->mpi);
}

static void reduce_scatter_sum(ff_group *g, const float *send, float *recv, int64_t n) {
  if (g->nccl && on_device(recv)) {
    NCCL_CHECK(ncclReduceScatter(send, recv, (size_t)n, ncclFloat32, ncclSum, g->nccl, nc.stream));
    issued();
    return;
  }
  MPI_Reduce_scatter_block(send, recv, (int)n, MPI_FLOAT, MPI_SUM, g->mpi);
}

static void bcast(ff_group *g, void *buf, size_t bytes, int root) {
  if (g->nccl && on_device(buf)) {
    NCCL_CHECK(ncclBroadcast(buf, buf, bytes, ncclChar, root, g->nccl, nc.stream));
    issued();
    return;
  }
  MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, g->mpi);
}

/* Point to point: the executor stages activations in host memory and MPI carries them
 * (ff_mpi_isend, ff_mpi_recv, ff_mpi_wait in the table below). */

static void group_start(void) { NCCL_CHECK(ncclGroupStart()); }
static void group_end(void) { NCCL_CHECK(ncclGroupEnd()); }

static void abort_job(int status) {
  pthread_mutex_lock(&nc.lock);
  for (int i = 0; i < nc.n_comms; i++)
    ncclCommAbort(nc.comms[i]);
  nc.n_comms = 0;
  pthread_mutex_unlock(&nc.lock);
  MPI_Abort(MPI_COMM_WORLD, status);
}

static const ff_comm_backend nccl_backend = {
    "nccl", true, world, rank, size, split, release, allreduce_sum, allreduce_max,
    allreduce_sum_f64, allgather, reduce_scatter_sum, bcast, ff_mpi_isend, ff_mpi_recv,
    ff_mpi_wait, group_start, group_end, abort_job};

const ff_comm_backend *ff_comm_nccl(const ff_kernels *k, char *why, size_t why_cap) {
  if (nc.ready)
    return &nccl_backend;
  nc.stream = (cudaStream_t)ff_kernels_cuda_stream();
  if (!k || k->host_memory || !nc.stream) {
    snprintf(why, why_cap, "the NCCL backend needs the CUDA compute backend");
    return NULL;
  }
  int me = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  nc.rank = me;
  ncclUniqueId id;
  ncclResult_t st = me == 0 ? ncclGetUniqueId(&id) : ncclSuccess;
  int ok = st == ncclSuccess;
  MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (!ok) {
    snprintf(why, why_cap, "ncclGetUniqueId failed on rank 0: %s", ncclGetErrorString(st));
    return NULL;
  }
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t world_comm = NULL;
  st = ncclCommInitRank(&world_comm, n, id, me);
  ok = st == ncclSuccess;
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!ok) {
    snprintf(why, why_cap, "ncclCommInitRank failed%s%s (one GPU per rank is needed; use --comm "
             "mpi to share a GPU)", st != ncclSuccess ? ": " : " on another rank",
             st != ncclSuccess ? ncclGetErrorString(st) : "");
    if (world_comm)
      ncclCommDestroy(world_comm);
    return NULL;
  }
  cudaGetDevice(&nc.device);
  for (int i = 0; i < PENDING; i++)
    if (cudaEventCreateWithFlags(&nc.done[i], cudaEventDisableTiming) != cudaSuccess) {
      snprintf(why, why_cap, "cudaEventCreate failed");
      return NULL;
    }
  const char *t = getenv("FF_NCCL_TIMEOUT_S");
  nc.timeout_s = t && atof(t) > 0 ? atof(t) : 600;
  nc.world.mpi = MPI_COMM_WORLD;
  nc.world.nccl = world_comm;
  remember(world_comm);
  if (pthread_create(&nc.watchdog, NULL, watch, NULL) == 0)
    pthread_detach(nc.watchdog);
  nc.ready = true;
  return &nccl_backend;
}
