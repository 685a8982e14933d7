/* train.h — what the training loop (dist.c, for one rank and many) is told and the pieces of a
 * step it shares with tests: the options, emulated slowdown, the non-finite gradient check, the
 * learning-rate schedule. */
#ifndef FF_EXEC_TRAIN_H
#define FF_EXEC_TRAIN_H

#include <stdbool.h>
#include <stdint.h>

#include "ff_format.h"
#include "ff_kernels.h"

typedef struct ff_train_opts {
  const char *data_file; /* NULL: the model must have vocab >= 256 and text_file is required */
  bool text;             /* data_file is plain text read as bytes */
  int64_t steps;         /* stop after this step (the learning-rate schedule still spans the
                            training settings' steps); 0: train all of them */
  const char *checkpoint_dir;
  int64_t checkpoint_every; /* 0: only at the end (when a directory is given) */
  bool resume;
  const char *init_from; /* a Hugging Face Llama directory's weights instead of random ones */
  /* validation: the loss over eval_batches global batches of eval_file (read as data_file is:
   * tokens, or text with `text`), after every eval_every-th step (0: none but) and the last */
  const char *eval_file;
  int64_t eval_every, eval_batches; /* eval_batches 0: as many as fit, at most 8 */
  bool checkpoint_gradients; /* save each step's gradients too (for verification) */
  const char *metrics_file;
  bool quiet;
  bool continue_on_save_error; /* --on-save-error continue (default: stop) */
  bool skip_nonfinite;         /* --on-nan skip (default: stop) */
  /* --throttle RANK=FACTOR: emulated slowdown per world rank (0 where not given) */
  double *throttle_by_rank;
  int n_throttle;
  /* --emulate-network: stage transfers between nodes take the plan's link time (one machine) */
  bool emulate_network;
} ff_train_opts;

/* --comm: how ranks talk. auto: NCCL when every rank trains on its own GPU, else MPI. */
typedef enum ff_comm_choice { FF_COMM_AUTO, FF_COMM_MPI, FF_COMM_NCCL } ff_comm_choice;

/* The emulated slowdown of a rank: --throttle for it, else its device type's
 * emulated_slowdown, else none (1). */
double ff_throttle_factor(const ff_train_opts *o, int rank, const ff_device *device);
/* An emulated device `factor` times slower than one core of this machine (factor > 1), for work
 * that took `wall` seconds and `cpu` seconds of this process's processor time: waits until
 * factor × cpu seconds have passed since the work began and returns the emulated time,
 * max(wall, factor × cpu). Counting processor time, not wall time, keeps the emulated device's
 * speed its own when other work shares the machine (time the process spent preempted is not the
 * device's); pass cpu = wall where the processor time is not the device's (a GPU's work). factor
 * <= 1: no wait; returns wall. A test and demo device only. */
double ff_throttle(double factor, double wall, double cpu);
/* This process's processor time, in seconds (all its threads). */
double ff_cpu_seconds(void);

/* The first of n_tensors consecutive tensors of a table (in table order) whose gradient (grads:
 * the block their offsets count from, backend memory of k) holds a NaN or an infinity, or NULL. A
 * test hook, the environment variable FF_INJECT_NAN_STEP=N, poisons the last one's gradient when
 * step is N (pass step 0 to check without it). */
const char *ff_nonfinite_gradient(const ff_kernels *k, float *grads, const void *tensors,
                                  int n_tensors, int64_t step);

/* Learning rate at step t (1-based) from the training settings. */
double ff_learning_rate(const ff_training *t, int64_t step, int64_t total_steps);

#endif
