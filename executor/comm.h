/* comm.h — the communication backends' one interface, a table of functions like the kernels':
 * collectives over groups, point-to-point transfers inside the world group, and splitting groups.
 * comm_mpi.c works on host buffers; comm_nccl.c runs collectives on device buffers through NCCL
 * and everything else through MPI; comm_self.c is the one rank of a job started without mpirun. Every rank issues its collectives in the same global order: the callers
 * walk lists that every rank computes identically from the plan. */
#ifndef FF_EXEC_COMM_H
#define FF_EXEC_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ff_kernels.h"

typedef struct ff_group ff_group;
typedef struct ff_request ff_request;

/* One transfer of a batch (p2p_batch): `bytes` of buf to or from world rank `peer`. The tag tells
 * MPI's messages apart; NCCL matches the transfers between two ranks in the order issued. */
typedef struct ff_p2p {
  void *buf;
  size_t bytes;
  int peer, tag;
  bool send;
} ff_p2p;

typedef struct ff_comm_backend {
  const char *name;
  bool device_buffers; /* collectives take device buffers (NCCL); else host buffers only */
  ff_group *(*world)(void);
  int (*rank)(const ff_group *g);
  int (*size)(const ff_group *g);
  /* A subgroup: ranks calling with the same color (>= 0) form one, ordered by key; color < 0
   * gives NULL. Every rank of the parent must call, with the same `device`: whether the group
   * will carry collectives on device buffers (NCCL makes a communicator for it only then, and
   * only for groups of more than one rank). */
  ff_group *(*split)(ff_group *parent, int color, int key, bool device);
  void (*release)(ff_group *g);
  void (*allreduce_sum)(ff_group *g, float *buf, int64_t n);
  void (*allreduce_max)(ff_group *g, float *buf, int64_t n);
  void (*allreduce_sum_f64)(ff_group *g, double *buf, int64_t n);
  /* A sum in place that is started, not finished: buf must not be touched until wait(request)
   * returns. On a device buffer the sum follows the compute work issued before the call, runs on
   * its own stream beside the work issued after it, and wait makes the compute work issued after
   * the wait follow the sum (the host does not block). */
  ff_request *(*iallreduce_sum)(ff_group *g, float *buf, int64_t n);
  /* Let started operations move on while the caller computes; true when r has finished (it must
   * still be waited for). */
  bool (*test)(ff_request *r);
  void (*allgather)(ff_group *g, const void *mine, void *all, size_t bytes);
  /* recv(n) = the group's sum of the block of send(n · size) that belongs to this rank */
  void (*reduce_scatter_sum)(ff_group *g, const float *send, float *recv, int64_t n);
  void (*bcast)(ff_group *g, void *buf, size_t bytes, int root);
  /* Point to point between world ranks; isend and irecv do not block (wait on the request
   * before the buffer is reused or read), recv does. */
  ff_request *(*isend)(const void *buf, size_t bytes, int dst, int tag);
  ff_request *(*irecv)(void *buf, size_t bytes, int src, int tag);
  void (*recv)(void *buf, size_t bytes, int src, int tag);
  void (*wait)(ff_request *r);
  /* Transfers between world ranks on device buffers, started together as one group so that none
   * waits for another (two ranks may send to each other in one batch; a send alone waits for its
   * receive to be posted, as NCCL's do). Work issued after it on the compute stream reads the
   * received buffers and may overwrite the sent ones. NULL where the backend has none: device
   * activations then go through host memory and isend/recv. */
  void (*p2p_batch)(const ff_p2p *ops, int n);
  /* GPU seconds spent in the device collectives issued on the compute stream so far (measured
   * with events; complete for those issued before the stream was last synchronised); 0 where
   * collectives run on the host, whose time the caller measures itself. */
  double (*collective_seconds)(void);
  /* End the job from any rank: every rank exits with a non-zero status. */
  void (*abort)(int status);
  /* Release what the backend holds (communicators, threads) before MPI_Finalize; every rank
   * calls it after its last collective. */
  void (*finalize)(void);
} ff_comm_backend;

const ff_comm_backend *ff_comm_mpi(void);
/* A job of one process started without mpirun: every group is the rank alone (no MPI). */
const ff_comm_backend *ff_comm_self(void);
/* inner, with every collective and device transfer batch recorded; at finalize the records of
 * every two ranks are compared on the groups they share, and a difference in order ends every
 * rank with status 1 (comm_check.c; ffrun turns it on with FF_CHECK_COMM_ORDER=1). */
const ff_comm_backend *ff_comm_checked(const ff_comm_backend *inner);
/* The MPI backend declaring device_buffers: with the CPU backend's staged memory (which is host
 * memory all the same) it takes the executor's device-collective paths where no GPU is. A test
 * hook (FF_TEST_DEVICE_COMM=1). */
const ff_comm_backend *ff_comm_mpi_device(void);
/* NCCL for collectives on device buffers, MPI for the rest (after MPI_Init, on every rank
 * together; k must be the CUDA backend). NULL with the reason in why when NCCL cannot start
 * (several ranks on one GPU, a build without CUDA). */
const ff_comm_backend *ff_comm_nccl(const ff_kernels *k, char *why, size_t why_cap);

#endif
