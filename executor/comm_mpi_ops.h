/* comm_mpi_ops.h — the MPI operations both communication backends use on host buffers (the MPI
 * backend for everything, the NCCL backend for what is not a device collective). */
#ifndef FF_EXEC_COMM_MPI_OPS_H
#define FF_EXEC_COMM_MPI_OPS_H

#include <mpi.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "comm.h"

/* A started operation: MPI requests (a sum over more elements than an int counts takes several),
 * or, in the NCCL backend, an event recorded after a collective on a device buffer. */
struct ff_request {
  int n, cap;  /* requests in use; room in mpi */
  MPI_Request *mpi;
  void *event; /* cudaEvent_t, NCCL backend only */
  MPI_Request one;
  ff_request *next; /* in the pool of released requests */
};

/* A request for n MPI requests, from a pool of released ones where one has room (a training
 * step allocates none once the first has run), and its release back to the pool. Main thread
 * only (MPI_THREAD_FUNNELED). ff_mpi_request_pool_free() empties the pool at the end. */
ff_request *ff_mpi_request(int n);
void ff_mpi_request_release(ff_request *r);
void ff_mpi_request_pool_free(void);

int ff_mpi_rank(MPI_Comm c);
int ff_mpi_size(MPI_Comm c);
/* In place over n elements of elem bytes, in pieces MPI's int counts can hold. */
void ff_mpi_allreduce(MPI_Comm c, void *buf, int64_t n, MPI_Datatype type, size_t elem, MPI_Op op);
/* Point to point between world ranks (see ff_comm_backend). */
ff_request *ff_mpi_isend(const void *buf, size_t bytes, int dst, int tag);
ff_request *ff_mpi_irecv(void *buf, size_t bytes, int src, int tag);
void ff_mpi_recv(void *buf, size_t bytes, int src, int tag);
void ff_mpi_wait(ff_request *r);
/* Waits for n requests, polling for 100 µs and then sleeping 50 µs between polls, so that a long
 * wait leaves the processor to the ranks being waited for. */
void ff_mpi_patient_wait(int n, MPI_Request *r);
bool ff_mpi_test(ff_request *r);
/* A started in-place sum over host memory, in pieces MPI's int counts can hold. */
ff_request *ff_mpi_iallreduce_sum(MPI_Comm c, float *buf, int64_t n);

#endif
