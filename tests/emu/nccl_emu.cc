/* nccl_emu.cc — the NCCL calls of nccl.h over MPI, for the emulated build of ffrun. */
#define OMPI_SKIP_MPICXX 1 /* the C API only */
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <cstring>
#include <vector>

#include "nccl.h"

struct ncclComm {
  MPI_Comm mpi;
};

namespace {

struct p2p {
  bool send;
  void *buf;
  size_t bytes;
  int peer;
  MPI_Comm mpi;
};

int group_depth;
std::vector<p2p> queued;

MPI_Datatype mpi_type(ncclDataType_t t) {
  return t == ncclFloat32 ? MPI_FLOAT : t == ncclFloat64 ? MPI_DOUBLE : MPI_CHAR;
}

size_t type_bytes(ncclDataType_t t) { return t == ncclFloat32 ? 4 : t == ncclFloat64 ? 8 : 1; }

MPI_Op mpi_op(ncclRedOp_t op) { return op == ncclMax ? MPI_MAX : MPI_SUM; }

ncclResult_t post(const std::vector<p2p> &ops) {
  std::vector<MPI_Request> req(ops.size());
  for (size_t i = 0; i < ops.size(); i++) {
    const p2p &o = ops[i];
    int rc = o.send ? MPI_Isend(o.buf, (int)o.bytes, MPI_BYTE, o.peer, 77, o.mpi, &req[i])
                    : MPI_Irecv(o.buf, (int)o.bytes, MPI_BYTE, o.peer, 77, o.mpi, &req[i]);
    if (rc != MPI_SUCCESS) return ncclInternalError;
  }
  return MPI_Waitall((int)req.size(), req.data(), MPI_STATUSES_IGNORE) == MPI_SUCCESS
             ? ncclSuccess
             : ncclInternalError;
}

} // namespace

const char *ncclGetErrorString(ncclResult_t result) {
  switch (result) {
  case ncclSuccess: return "no error";
  case ncclInternalError: return "internal error (emulated NCCL: an MPI call failed)";
  case ncclInvalidArgument: return "invalid argument";
  case ncclInvalidUsage: return "invalid usage";
  case ncclInProgress: return "operation in progress";
  }
  return "unknown result";
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  memset(id, 0, sizeof *id);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  memcpy(id->internal, &rank, sizeof rank); /* who made it: the ranks that share it are one comm */
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
  int color;
  memcpy(&color, id.internal, sizeof color);
  MPI_Comm m;
  if (MPI_Comm_split(MPI_COMM_WORLD, color, rank, &m) != MPI_SUCCESS) return ncclInternalError;
  int size = 0;
  MPI_Comm_size(m, &size);
  if (size != nranks) {
    MPI_Comm_free(&m);
    return ncclInvalidUsage;
  }
  *comm = new ncclComm{m};
  return ncclSuccess;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                           ncclConfig_t *) {
  MPI_Comm m;
  if (MPI_Comm_split(comm->mpi, color == NCCL_SPLIT_NOCOLOR ? MPI_UNDEFINED : color, key, &m) !=
      MPI_SUCCESS)
    return ncclInternalError;
  *newcomm = m == MPI_COMM_NULL ? nullptr : new ncclComm{m};
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t *async) {
  *async = ncclSuccess;
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t) { return ncclSuccess; }

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  MPI_Comm_free(&comm->mpi);
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) { return ncclCommDestroy(comm); }

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t) {
  return MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, (int)count, mpi_type(type),
                       mpi_op(op), comm->mpi) == MPI_SUCCESS
             ? ncclSuccess
             : ncclInternalError;
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t) {
  size_t bytes = count * type_bytes(type);
  std::vector<char> mine((const char *)send, (const char *)send + bytes); /* may lie in recv */
  return MPI_Allgather(mine.data(), (int)count, mpi_type(type), recv, (int)count, mpi_type(type),
                       comm->mpi) == MPI_SUCCESS
             ? ncclSuccess
             : ncclInternalError;
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t) {
  int size = 0;
  MPI_Comm_size(comm->mpi, &size);
  size_t bytes = count * type_bytes(type) * (size_t)size;
  std::vector<char> all((const char *)send, (const char *)send + bytes); /* recv may lie in it */
  return MPI_Reduce_scatter_block(all.data(), recv, (int)count, mpi_type(type), mpi_op(op),
                                  comm->mpi) == MPI_SUCCESS
             ? ncclSuccess
             : ncclInternalError;
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t type,
                           int root, ncclComm_t comm, cudaStream_t) {
  int rank = 0;
  MPI_Comm_rank(comm->mpi, &rank);
  if (rank == root && send != recv) memmove(recv, send, count * type_bytes(type));
  return MPI_Bcast(recv, (int)count, mpi_type(type), root, comm->mpi) == MPI_SUCCESS
             ? ncclSuccess
             : ncclInternalError;
}

ncclResult_t ncclGroupStart(void) {
  group_depth++;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
  if (group_depth == 0) return ncclInvalidUsage;
  if (--group_depth > 0) return ncclSuccess;
  std::vector<p2p> ops;
  ops.swap(queued);
  return post(ops);
}

ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t type, int peer,
                      ncclComm_t comm, cudaStream_t) {
  p2p o{true, const_cast<void *>(buf), count * type_bytes(type), peer, comm->mpi};
  if (group_depth > 0) {
    queued.push_back(o);
    return ncclSuccess;
  }
  return post({o});
}

ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t) {
  p2p o{false, buf, count * type_bytes(type), peer, comm->mpi};
  if (group_depth > 0) {
    queued.push_back(o);
    return ncclSuccess;
  }
  return post({o});
}
