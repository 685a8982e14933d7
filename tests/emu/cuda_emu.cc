/* cuda_emu.cc — the state and the scheduler of the CUDA emulation (cuda_emu.h): the threads of a
 * block are fibers (ucontext) on the calling thread. The scheduler resumes each unfinished fiber
 * in turn; a fiber runs until it finishes or waits at a barrier, which opens when the last of
 * its block (or warp) arrives. A round in which no fiber arrives anywhere or finishes means some
 * thread will never reach the barrier the others wait at: the program stops and says so. Under
 * AddressSanitizer every switch is announced to it, so it follows the fibers' stacks. */
#include "cuda_emu.h"

#include <ucontext.h>

#include <memory>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define EMU_START_SWITCH(save, bottom, size) __sanitizer_start_switch_fiber(save, bottom, size)
#define EMU_FINISH_SWITCH(save, bottom, size) __sanitizer_finish_switch_fiber(save, bottom, size)
#else
#define EMU_START_SWITCH(save, bottom, size) ((void)(save), (void)(bottom), (void)(size))
#define EMU_FINISH_SWITCH(save, bottom, size) ((void)(save), (void)(bottom), (void)(size))
#endif

dim3 threadIdx, blockIdx, blockDim, gridDim;
double emu_slots[32][32];
alignas(256) unsigned char smem[EMU_SHARED_BYTES];

namespace {

enum { STACK_BYTES = 256 * 1024 }; /* room for a kernel's locals, and the sanitizers' */

struct fiber {
  ucontext_t ctx;
  std::unique_ptr<char[]> stack{new char[STACK_BYTES]};
  bool done = false;
};

struct barrier {
  unsigned arrived = 0, generation = 0;
};

std::vector<fiber> fibers;
ucontext_t scheduler;
const void *scheduler_bottom;
size_t scheduler_size;
unsigned current, n_threads;
unsigned long progress; /* arrivals and finishes, so a stuck block shows */
barrier block_barrier, warp_barrier[32];
void (*grid_fn)(void *);
void *grid_arg;

void set_index(unsigned t) { threadIdx = dim3{t % blockDim.x, t / blockDim.x, 0}; }

/* From the running fiber back to the scheduler, until the scheduler resumes it. */
void yield() {
  void *fake = nullptr;
  EMU_START_SWITCH(&fake, scheduler_bottom, scheduler_size);
  swapcontext(&fibers[current].ctx, &scheduler);
  EMU_FINISH_SWITCH(fake, &scheduler_bottom, &scheduler_size);
}

void wait(barrier &b, unsigned participants) {
  unsigned generation = b.generation;
  progress++;
  if (++b.arrived == participants) {
    b.arrived = 0;
    b.generation++;
    return;
  }
  while (b.generation == generation) yield();
}

void entry() {
  EMU_FINISH_SWITCH(nullptr, &scheduler_bottom, &scheduler_size);
  grid_fn(grid_arg);
  fibers[current].done = true;
  progress++;
  EMU_START_SWITCH(nullptr, scheduler_bottom, scheduler_size); /* this fiber's frames are gone */
  swapcontext(&fibers[current].ctx, &scheduler);
}

/* A fiber made afresh at its entry (a function of its own: getcontext returns twice). */
__attribute__((noinline)) void make_fiber(fiber &f) {
  getcontext(&f.ctx);
  f.ctx.uc_stack.ss_sp = f.stack.get();
  f.ctx.uc_stack.ss_size = STACK_BYTES;
  f.ctx.uc_link = nullptr;
  f.done = false;
  makecontext(&f.ctx, entry, 0);
}

/* One block: every fiber made afresh, then turns until all have finished. */
void run_block() {
  for (unsigned t = 0; t < n_threads; t++) make_fiber(fibers[t]);
  block_barrier = barrier();
  for (barrier &b : warp_barrier) b = barrier();
  for (unsigned running = n_threads; running > 0;) {
    unsigned long before = progress;
    running = 0;
    for (unsigned t = 0; t < n_threads; t++) {
      if (fibers[t].done) continue;
      current = t;
      set_index(t);
      void *fake = nullptr;
      EMU_START_SWITCH(&fake, fibers[t].stack.get(), STACK_BYTES);
      swapcontext(&scheduler, &fibers[t].ctx);
      EMU_FINISH_SWITCH(fake, nullptr, nullptr);
      running += !fibers[t].done;
    }
    if (running > 0 && progress == before) {
      fprintf(stderr, "cuda_emu: block (%u, %u, %u): %u of %u threads wait at a barrier that "
              "the others never reach\n", blockIdx.x, blockIdx.y, blockIdx.z, running, n_threads);
      abort();
    }
  }
}

} // namespace

void emu_sync_block(void) { wait(block_barrier, n_threads); }
void emu_sync_warp(void) { wait(warp_barrier[(threadIdx.x + threadIdx.y * blockDim.x) / 32], 32); }

void emu_run_grid(dim3 grid, dim3 block, void (*fn)(void *), void *arg) {
  blockDim = block;
  gridDim = grid;
  n_threads = block.x * block.y;
  grid_fn = fn;
  grid_arg = arg;
  if (fibers.size() < n_threads) fibers.resize(n_threads);
  for (unsigned z = 0; z < grid.z; z++)
    for (unsigned y = 0; y < grid.y; y++)
      for (unsigned x = 0; x < grid.x; x++) {
        memset(smem, 0xff, sizeof smem); /* NaN as fp32 and as bf16 */
        blockIdx = dim3{x, y, z};
        run_block();
      }
}
