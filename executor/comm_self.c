/* comm_self.c — the communication backend of a job of one process, started without mpirun: every
 * group is this rank alone, so a sum is its own buffer, a gather a copy and a broadcast nothing.
 * It lets a one-rank plan run the same training loop as a plan of many (dist.c) without MPI.
 * Point-to-point transfers have no peer in a one-rank plan; asking for one is a bug. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"

struct ff_group {
  int unused;
};

struct ff_request {
  int unused;
};

static ff_group world_group, sub_group;
static ff_request done_request; /* every operation has finished when it returns */

static ff_group *world(void) { return &world_group; }
static int rank(const ff_group *g) { return (void)g, 0; }
static int size(const ff_group *g) { return (void)g, 1; }

static ff_group *split(ff_group *parent, int color, int key, bool device) {
  (void)parent, (void)key, (void)device;
  return color < 0 ? NULL : &sub_group;
}

static void release(ff_group *g) { (void)g; }
static void sum_f32(ff_group *g, float *buf, int64_t n) { (void)g, (void)buf, (void)n; }
static void sum_f64(ff_group *g, double *buf, int64_t n) { (void)g, (void)buf, (void)n; }

static ff_request *isum(ff_group *g, float *buf, int64_t n) {
  (void)g, (void)buf, (void)n;
  return &done_request;
}

static bool test(ff_request *r) { return (void)r, true; }
static void wait(ff_request *r) { (void)r; }

static void allgather(ff_group *g, const void *mine, void *all, size_t bytes) {
  (void)g;
  memmove(all, mine, bytes);
}

static void reduce_scatter(ff_group *g, const float *send, float *recv, int64_t n) {
  (void)g;
  memmove(recv, send, (size_t)n * sizeof *recv);
}

static void bcast(ff_group *g, void *buf, size_t bytes, int root) {
  (void)g, (void)buf, (void)bytes, (void)root;
}

static _Noreturn void no_peer(const char *what) {
  fprintf(stderr, "ffrun: internal error: %s in a job of one process\n", what);
  exit(1);
}

static ff_request *isend(const void *buf, size_t bytes, int dst, int tag) {
  (void)buf, (void)bytes, (void)dst, (void)tag;
  no_peer("a send");
}

static ff_request *irecv(void *buf, size_t bytes, int src, int tag) {
  (void)buf, (void)bytes, (void)src, (void)tag;
  no_peer("a receive");
}

static void recv(void *buf, size_t bytes, int src, int tag) {
  (void)buf, (void)bytes, (void)src, (void)tag;
  no_peer("a receive");
}

static double collective_seconds(void) { return 0.0; }
static _Noreturn void abort_job(int status) { exit(status); }
static void finalize(void) {}

const ff_comm_backend *ff_comm_self(void) {
  static const ff_comm_backend b = {
      .name = "self",
      .device_buffers = true, /* nothing leaves the device: sums stay where the gradients are */
      .world = world,
      .rank = rank,
      .size = size,
      .split = split,
      .release = release,
      .allreduce_sum = sum_f32,
      .allreduce_max = sum_f32,
      .allreduce_sum_f64 = sum_f64,
      .iallreduce_sum = isum,
      .test = test,
      .allgather = allgather,
      .reduce_scatter_sum = reduce_scatter,
      .bcast = bcast,
      .isend = isend,
      .irecv = irecv,
      .recv = recv,
      .wait = wait,
      .p2p_batch = NULL,
      .collective_seconds = collective_seconds,
      .abort = abort_job,
      .finalize = finalize,
  };
  return &b;
}
