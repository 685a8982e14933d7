/* comm_nccl.c — the NCCL communication backend, for ranks that each own a GPU.
 *
 * Collectives on device buffers run through NCCL: the TP all-reduces of activations on the
 * compute backend's stream, so they are ordered with the kernels around them and the host does
 * not wait (event pairs around them give their GPU time to the metrics); the started gradient sums (iallreduce_sum) on a stream of their own, after an event
 * of the compute stream, so they run beside the backward that follows them. Everything else —
 * host buffers (losses, timings, names), point-to-point transfers of the staged activations —
 * goes through MPI, which also bootstraps NCCL: rank 0's unique id travels by MPI_Bcast, and
 * subgroups that carry device collectives are made by ncclCommSplit beside MPI_Comm_split. A
 * buffer is "device" when CUDA says its pointer is device or managed memory.
 *
 * A dead peer must end the job, not hang it: a watchdog thread asks every communicator for its
 * asynchronous error once a second, follows each collective's completion event, and watches the
 * blocking calls (communicator creation, splits, the final destroy). On an error, or when
 * something has not finished within FF_NCCL_TIMEOUT_S seconds (default 600), it prints why and
 * exits the process non-zero, which makes mpirun end every rank. It does not abort the
 * communicators first: ncclCommAbort from one rank can itself wait on the others. */
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

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
#error "the NCCL backend needs NCCL 2.18 or newer (ncclCommSplit)"
#endif

enum {
  PENDING = 4096, /* collectives per stream whose completion the watchdog follows */
  TIMED = 1024,   /* compute-stream collectives timed by event pairs, not yet read */
};

struct ff_group {
  MPI_Comm mpi;
  ncclComm_t nccl; /* NULL: no device collectives on this group (or a group of one) */
};

/* The collectives issued on one stream, oldest first: a ring of events recorded after each, with
 * when it was issued. They complete in order, so the oldest unfinished one says how long the
 * stream has been stuck. */
typedef struct ring {
  cudaStream_t stream;
  cudaEvent_t done[PENDING];
  double issued_at[PENDING];
  int head, pending;
} ring;

enum { COMPUTE, DP, RINGS };

/* One backend per process, like the CUDA backend it rides on. */
static struct nccl_state {
  ring rings[RINGS];
  ff_group world;
  ncclComm_t *comms; /* every communicator made, for the watchdog and the final destroy */
  int n_comms, cap_comms;
  int device, rank;
  double timeout_s;
  const char *blocking;  /* the blocking call under way (the watchdog times it), or NULL */
  double blocking_since;
  pthread_mutex_t lock;
  pthread_t watchdog;
  bool watching, stop, ready;
  /* event pairs around the collectives on the compute stream: their GPU time (main thread only) */
  cudaEvent_t timed_start[TIMED], timed_stop[TIMED];
  int timed_head, timed_pending;
  double timed_seconds;
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

/* Bracket a call that blocks until every rank has made it: the watchdog ends the job when it
 * takes longer than the timeout. */
static void blocking_begin(const char *what) {
  pthread_mutex_lock(&nc.lock);
  nc.blocking = what;
  nc.blocking_since = now();
  pthread_mutex_unlock(&nc.lock);
}

static void blocking_end(void) {
  pthread_mutex_lock(&nc.lock);
  nc.blocking = NULL;
  pthread_mutex_unlock(&nc.lock);
}

/* Drop the finished collectives of a ring; true when its oldest unfinished one is overdue. */
static bool ring_stuck(ring *r, double t) {
  while (r->pending > 0) {
    cudaError_t e = cudaEventQuery(r->done[r->head]);
    if (e == cudaErrorNotReady)
      break;
    if (e != cudaSuccess) {
      pthread_mutex_unlock(&nc.lock);
      die("a collective failed on the GPU", cudaGetErrorString(e));
    }
    r->head = (r->head + 1) % PENDING;
    r->pending--;
  }
  return r->pending > 0 && t - r->issued_at[r->head] > nc.timeout_s;
}

static void *watch(void *unused) {
  (void)unused;
  cudaSetDevice(nc.device); /* a new thread starts on device 0 */
  for (;;) {
    sleep(1);
    pthread_mutex_lock(&nc.lock);
    if (nc.stop) {
      pthread_mutex_unlock(&nc.lock);
      return NULL;
    }
    for (int i = 0; i < nc.n_comms; i++) {
      ncclResult_t async = ncclSuccess;
      if (ncclCommGetAsyncError(nc.comms[i], &async) == ncclSuccess && async != ncclSuccess &&
          async != ncclInProgress) {
        pthread_mutex_unlock(&nc.lock);
        die("asynchronous error", ncclGetErrorString(async));
      }
    }
    double t = now();
    const char *stuck = nc.blocking && t - nc.blocking_since > nc.timeout_s ? nc.blocking : NULL;
    for (int i = 0; i < RINGS && !stuck; i++)
      if (nc.rings[i].stream && ring_stuck(&nc.rings[i], t))
        stuck = "a collective";
    pthread_mutex_unlock(&nc.lock);
    if (stuck) {
      char why[160];
      snprintf(why, sizeof why, "%s has not finished after %.0f s (FF_NCCL_TIMEOUT_S)", stuck,
               nc.timeout_s);
      die("timeout", why);
    }
  }
  return NULL;
}

static void remember(ncclComm_t c) {
  pthread_mutex_lock(&nc.lock);
  if (nc.n_comms == nc.cap_comms) {
    int cap = nc.cap_comms ? 2 * nc.cap_comms : 64;
    ncclComm_t *more = realloc(nc.comms, (size_t)cap * sizeof *more);
    if (!more) {
      pthread_mutex_unlock(&nc.lock);
      die("split", "out of memory");
    }
    nc.comms = more;
    nc.cap_comms = cap;
  }
  nc.comms[nc.n_comms++] = c;
  pthread_mutex_unlock(&nc.lock);
}

/* Follow the collective just issued on a stream (when its ring is full, the watchdog has fallen
 * a second behind; the next ones are followed again once it catches up). */
static void issued(int which) {
  ring *r = &nc.rings[which];
  pthread_mutex_lock(&nc.lock);
  cudaError_t e = cudaSuccess;
  if (r->pending < PENDING) {
    int i = (r->head + r->pending) % PENDING;
    e = cudaEventRecord(r->done[i], r->stream);
    if (e == cudaSuccess) {
      r->issued_at[i] = now();
      r->pending++;
    }
  }
  pthread_mutex_unlock(&nc.lock);
  if (e != cudaSuccess)
    die("cudaEventRecord", cudaGetErrorString(e));
}

/* Fold the finished timed pairs into timed_seconds (the oldest first; with `all`, wait for each). */
static void timed_drain(bool all) {
  while (nc.timed_pending > 0) {
    cudaEvent_t stop = nc.timed_stop[nc.timed_head];
    cudaError_t e = all ? cudaEventSynchronize(stop) : cudaEventQuery(stop);
    if (e == cudaErrorNotReady)
      return;
    if (e != cudaSuccess)
      die("a collective failed on the GPU", cudaGetErrorString(e));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, nc.timed_start[nc.timed_head], stop));
    nc.timed_seconds += ms * 1e-3;
    nc.timed_head = (nc.timed_head + 1) % TIMED;
    nc.timed_pending--;
  }
}

/* Around a collective on the compute stream: begin returns its pair, end closes it. */
static int timed_begin(void) {
  if (nc.timed_pending == TIMED)
    timed_drain(true);
  int i = (nc.timed_head + nc.timed_pending) % TIMED;
  CUDA_CHECK(cudaEventRecord(nc.timed_start[i], nc.rings[COMPUTE].stream));
  return i;
}

static void timed_end(int i) {
  CUDA_CHECK(cudaEventRecord(nc.timed_stop[i], nc.rings[COMPUTE].stream));
  nc.timed_pending++;
  issued(COMPUTE);
}

static double collective_seconds(void) {
  timed_drain(false);
  return nc.timed_seconds;
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

static ff_group *split(ff_group *parent, int color, int key, bool device) {
  MPI_Comm m;
  MPI_Comm_split(parent->mpi, color < 0 ? MPI_UNDEFINED : color, key, &m);
  ncclComm_t n = NULL;
  if (parent->nccl && device) { /* every rank of the parent takes part; groups of one need none */
    int color_n = m != MPI_COMM_NULL && ff_mpi_size(m) > 1 ? color : NCCL_SPLIT_NOCOLOR;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.splitShare = 1; /* many small groups: share the parent's buffers and channels */
    blocking_begin("ncclCommSplit");
    NCCL_CHECK(ncclCommSplit(parent->nccl, color_n, key, &n, &config));
    blocking_end();
    if (n)
      remember(n);
  }
  if (m == MPI_COMM_NULL)
    return NULL;
  ff_group *g = malloc(sizeof *g);
  if (!g)
    die("split", "out of memory");
  g->mpi = m;
  g->nccl = n;
  return g;
}

/* The NCCL communicator stays until finalize: destroying it here could wait on peers that have
 * stopped on an error, and it is one of the watchdog's. */
static void release(ff_group *g) {
  if (!g || g == &nc.world)
    return;
  MPI_Comm_free(&g->mpi);
  free(g);
}

/* ---- collectives: device buffers through NCCL, host buffers through MPI ------------------ */

static void allreduce(ff_group *g, void *buf, int64_t n, MPI_Datatype mt, ncclDataType_t nt,
                      size_t elem, MPI_Op mop, ncclRedOp_t nop) {
  if (n <= 0)
    return;
  if (g->nccl && on_device(buf)) {
    int t = timed_begin();
    NCCL_CHECK(ncclAllReduce(buf, buf, (size_t)n, nt, nop, g->nccl, nc.rings[COMPUTE].stream));
    timed_end(t);
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

/* A device sum on the DP stream after everything the compute stream holds now; the request's
 * event marks its end. */
static ff_request *iallreduce_sum(ff_group *g, float *buf, int64_t n) {
  if (!g->nccl || !on_device(buf))
    return ff_mpi_iallreduce_sum(g->mpi, buf, n);
  ff_request *r = ff_mpi_request(1);
  cudaEvent_t ready, done;
  CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventRecord(ready, nc.rings[COMPUTE].stream));
  CUDA_CHECK(cudaStreamWaitEvent(nc.rings[DP].stream, ready, 0));
  CUDA_CHECK(cudaEventDestroy(ready)); /* released once the wait is done */
  if (n > 0)
    NCCL_CHECK(ncclAllReduce(buf, buf, (size_t)n, ncclFloat32, ncclSum, g->nccl,
                             nc.rings[DP].stream));
  issued(DP);
  CUDA_CHECK(cudaEventRecord(done, nc.rings[DP].stream));
  r->event = done;
  return r;
}

static bool test(ff_request *r) {
  if (!r || !r->event)
    return ff_mpi_test(r);
  cudaError_t e = cudaEventQuery((cudaEvent_t)r->event);
  if (e != cudaSuccess && e != cudaErrorNotReady)
    die("a gradient sum failed on the GPU", cudaGetErrorString(e));
  return e == cudaSuccess;
}

/* A device request: what the compute stream does next follows the sum; the host goes on. */
static void wait(ff_request *r) {
  if (!r || !r->event) {
    ff_mpi_wait(r);
    return;
  }
  CUDA_CHECK(cudaStreamWaitEvent(nc.rings[COMPUTE].stream, (cudaEvent_t)r->event, 0));
  CUDA_CHECK(cudaEventDestroy((cudaEvent_t)r->event));
  ff_mpi_request_release(r);
}

static void allgather(ff_group *g, const void *mine, void *all, size_t bytes) {
  if (g->nccl && on_device(all)) {
    int t = timed_begin();
    NCCL_CHECK(ncclAllGather(mine, all, bytes, ncclChar, g->nccl, nc.rings[COMPUTE].stream));
    timed_end(t);
    return;
  }
  MPI_Allgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, g->mpi);
}

static void reduce_scatter_sum(ff_group *g, const float *send, float *recv, int64_t n) {
  if (g->nccl && on_device(recv)) {
    int t = timed_begin();
    NCCL_CHECK(ncclReduceScatter(send, recv, (size_t)n, ncclFloat32, ncclSum, g->nccl,
                                 nc.rings[COMPUTE].stream));
    timed_end(t);
    return;
  }
  MPI_Reduce_scatter_block(send, recv, (int)n, MPI_FLOAT, MPI_SUM, g->mpi);
}

static void bcast(ff_group *g, void *buf, size_t bytes, int root) {
  if (g->nccl && on_device(buf)) {
    int t = timed_begin();
    NCCL_CHECK(ncclBroadcast(buf, buf, bytes, ncclChar, root, g->nccl, nc.rings[COMPUTE].stream));
    timed_end(t);
    return;
  }
  MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, g->mpi);
}

/* Activations between stages: NCCL sends and receives on the world communicator, grouped so
 * that none waits for another, on the compute stream after the kernels that made them and
 * before those that read them. The watchdog follows the batch like a collective. Host buffers
 * (isend, recv in the table below) go through MPI. */
static void p2p_batch(const ff_p2p *ops, int n) {
  if (n <= 0)
    return;
  cudaStream_t s = nc.rings[COMPUTE].stream;
  NCCL_CHECK(ncclGroupStart());
  for (int i = 0; i < n; i++) {
    if (ops[i].send)
      NCCL_CHECK(ncclSend(ops[i].buf, ops[i].bytes, ncclChar, ops[i].peer, nc.world.nccl, s));
    else
      NCCL_CHECK(ncclRecv(ops[i].buf, ops[i].bytes, ncclChar, ops[i].peer, nc.world.nccl, s));
  }
  NCCL_CHECK(ncclGroupEnd());
  issued(COMPUTE);
}

/* MPI_Abort ends every rank at once; the GPUs are released with the processes. */
static void abort_job(int status) { MPI_Abort(MPI_COMM_WORLD, status); }

/* After the last collective, on every rank: let the streams drain, destroy the communicators
 * (newest first: splits before their parents), stop the watchdog. */
static void finalize(void) {
  ff_mpi_request_pool_free();
  if (!nc.ready)
    return;
  blocking_begin("the final synchronisation");
  for (int i = 0; i < RINGS; i++)
    CUDA_CHECK(cudaStreamSynchronize(nc.rings[i].stream));
  pthread_mutex_lock(&nc.lock);
  int n = nc.n_comms;
  nc.n_comms = 0; /* the watchdog no longer asks them */
  pthread_mutex_unlock(&nc.lock);
  for (int i = n - 1; i >= 0; i--) {
    NCCL_CHECK(ncclCommFinalize(nc.comms[i]));
    NCCL_CHECK(ncclCommDestroy(nc.comms[i]));
  }
  blocking_end();
  pthread_mutex_lock(&nc.lock);
  nc.stop = true;
  pthread_mutex_unlock(&nc.lock);
  if (nc.watching)
    pthread_join(nc.watchdog, NULL);
  for (int i = 0; i < RINGS; i++)
    for (int j = 0; j < PENDING; j++)
      cudaEventDestroy(nc.rings[i].done[j]);
  for (int j = 0; j < TIMED; j++) {
    cudaEventDestroy(nc.timed_start[j]);
    cudaEventDestroy(nc.timed_stop[j]);
  }
  cudaStreamDestroy(nc.rings[DP].stream);
  free(nc.comms);
  nc.comms = NULL;
  nc.ready = false;
}

static const ff_comm_backend nccl_backend = {
    "nccl", true, world, rank, size, split, release, allreduce_sum, allreduce_max,
    allreduce_sum_f64, iallreduce_sum, test, allgather, reduce_scatter_sum, bcast, ff_mpi_isend,
    ff_mpi_irecv, ff_mpi_recv, wait, p2p_batch, collective_seconds, abort_job, finalize};

/* The per-rank preparations that can fail (events, the DP stream, the watchdog); NULL or why. */
static const char *prepare(void) {
  cudaGetDevice(&nc.device);
  nc.rings[COMPUTE].stream = (cudaStream_t)ff_kernels_cuda_stream();
  if (cudaStreamCreateWithFlags(&nc.rings[DP].stream, cudaStreamNonBlocking) != cudaSuccess)
    return "cudaStreamCreate failed";
  for (int i = 0; i < RINGS; i++)
    for (int j = 0; j < PENDING; j++)
      if (cudaEventCreateWithFlags(&nc.rings[i].done[j], cudaEventDisableTiming) != cudaSuccess)
        return "cudaEventCreate failed";
  for (int j = 0; j < TIMED; j++)
    if (cudaEventCreate(&nc.timed_start[j]) != cudaSuccess ||
        cudaEventCreate(&nc.timed_stop[j]) != cudaSuccess)
      return "cudaEventCreate failed";
  const char *t = getenv("FF_NCCL_TIMEOUT_S");
  nc.timeout_s = t && atof(t) > 0 ? atof(t) : 600;
  if (pthread_create(&nc.watchdog, NULL, watch, NULL) != 0)
    return "the watchdog thread cannot start";
  nc.watching = true;
  return NULL;
}

const ff_comm_backend *ff_comm_nccl(const ff_kernels *k, char *why, size_t why_cap) {
  if (nc.ready)
    return &nccl_backend;
  if (!k || k->host_memory || !ff_kernels_cuda_stream()) {
    snprintf(why, why_cap, "the NCCL backend needs the CUDA compute backend");
    return NULL;
  }
  int me = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  nc.rank = me;
  /* Every step that can fail on one rank is agreed on by all before the next collective one, so
   * no rank waits in NCCL for a rank that has given up. */
  const char *failed = prepare();
  ncclUniqueId id;
  ncclResult_t st = ncclSuccess;
  if (!failed && me == 0 && (st = ncclGetUniqueId(&id)) != ncclSuccess)
    failed = ncclGetErrorString(st);
  int ok = !failed;
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!ok) {
    snprintf(why, why_cap, "%s%s", failed ? "" : "another rank could not prepare NCCL",
             failed ? failed : "");
    return NULL; /* the caller ends the job or falls back to MPI; the watchdog has nothing to watch */
  }
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t world_comm = NULL;
  blocking_begin("ncclCommInitRank");
  st = ncclCommInitRank(&world_comm, n, id, me);
  blocking_end();
  ok = st == ncclSuccess;
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!ok) {
    snprintf(why, why_cap, "ncclCommInitRank failed%s%s (one GPU per rank is needed; use --comm "
             "mpi to share a GPU)", st != ncclSuccess ? ": " : " on another rank",
             st != ncclSuccess ? ncclGetErrorString(st) : "");
    if (world_comm)
      ncclCommAbort(world_comm); /* the others have their own and give up alike */
    return NULL;
  }
  nc.world.mpi = MPI_COMM_WORLD;
  nc.world.nccl = world_comm;
  remember(world_comm);
  nc.ready = true;
  return &nccl_backend;
}
