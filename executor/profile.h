/* profile.h — `ffrun profile`: measure this job's machines into an ff-cluster/1 profile. */
#ifndef FF_EXEC_PROFILE_H
#define FF_EXEC_PROFILE_H

#include <stdbool.h>

#include "train.h"

/* Under an MPI launcher (or alone); rank 0 writes `out`. use_gpu: measure on the CUDA backend
 * where a GPU answers (else the CPU). Returns an exit status. */
int ff_profile(int argc, char **argv, const ff_train_opts *o, const char *out, const char *model_file,
               bool use_gpu);

#endif
