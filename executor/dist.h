/* dist.h — training a plan, of one rank or many (see dist.c). */
#ifndef FF_EXEC_DIST_H
#define FF_EXEC_DIST_H

#include "comm.h"
#include "ff_format.h"
#include "ff_kernels.h"
#include "train.h"

/* Run this process's rank of the plan on compute backend k, talking through c (MPI initialised
 * for the MPI and NCCL backends; nothing for ff_comm_self). Returns an exit status. */
ff_status ff_train(const ff_plan *plan, const ff_kernels *k, const ff_comm_backend *c,
                   const ff_train_opts *o);

#endif
