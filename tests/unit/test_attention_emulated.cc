/* test_attention_emulated.cc — the CUDA backend's attention kernels run on the CPU under
 * cuda_emu/ (a std::thread per CUDA thread, barriers for __syncthreads and __syncwarp, shuffles
 * through shared slots, WMMA on plain arrays), against the CPU backend's attention: forward (out,
 * lse) and backward (dq, dk, dv). Both kernels are run as the launchers run them:
 *   the fused fp32 kernels (ff_attention_kernels.cuh), the default, to 1e-5;
 *   the bf16 tensor-core kernels (ff_attention_tc_kernels.cuh, FF_ATTENTION=tensor), which round
 *   their inputs to bf16, to 1e-2;
 * each error relative to the largest reference value, as tests/device/check_kernels measures it.
 * The shapes cover a sequence shorter than a tile and not a multiple of one, every class of head
 * dimension each kernel takes, GQA and a TP shard whose heads start past zero. Outputs start as
 * NaN and shared memory is NaN before every block, so an element never written, or a read of
 * shared memory no thread wrote, fails.
 *
 * This checks the kernels' indexing, masking, online softmax and synchronisation without a GPU
 * (a missing barrier shows up as a wrong result); what only a GPU shows (speed, the code nvcc
 * makes of them) is tests/device/run.sh's. */
#include "cuda_emu.h"

#include <cuda_bf16.h>
#include <mma.h>

#include <memory>
#include <thread>
#include <vector>

#include "cuda/ff_attention_kernels.cuh"
#include "cuda/ff_attention_tc_kernels.cuh"
#include "ff_kernels.h"

thread_local dim3 threadIdx, blockIdx;
dim3 blockDim;
std::barrier<> *emu_block_barrier;
std::barrier<> *emu_warp_barrier[32];
float emu_slots[32][32];
alignas(256) unsigned char smem[256 * 1024];

/* Run body() as a grid of blocks of `threads` threads, one block at a time. */
template <typename F>
static void launch(dim3 grid, unsigned threads, size_t smem_bytes, F body) {
  if (smem_bytes > sizeof smem) {
    fprintf(stderr, "launch: %zu bytes of shared memory, the emulation has %zu\n", smem_bytes,
            sizeof smem);
    abort();
  }
  blockDim = dim3{threads, 1, 1};
  for (unsigned z = 0; z < grid.z; z++)
    for (unsigned y = 0; y < grid.y; y++)
      for (unsigned x = 0; x < grid.x; x++) {
        memset(smem, 0xff, sizeof smem); /* NaN as fp32 and as bf16 */
        std::barrier<> block((std::ptrdiff_t)threads);
        std::vector<std::unique_ptr<std::barrier<>>> warps;
        for (unsigned w = 0; w < threads / 32; w++) {
          warps.push_back(std::make_unique<std::barrier<>>(32));
          emu_warp_barrier[w] = warps.back().get();
        }
        emu_block_barrier = &block;
        std::vector<std::thread> team;
        for (unsigned t = 0; t < threads; t++)
          team.emplace_back([=] {
            threadIdx = dim3{t, 0, 0};
            blockIdx = dim3{x, y, z};
            body();
          });
        for (auto &th : team) th.join();
      }
}

static uint64_t rng = 0x243f6a8885a308d3ull;
static float uniform(void) { /* [-1, 1) */
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static std::vector<float> random(size_t n) {
  std::vector<float> v(n);
  for (auto &x : v) x = uniform();
  return v;
}

static int failures, checks;

/* max |got − want| / max |want|, with NaN anywhere a failure */
static void check(const char *what, const std::vector<float> &got, const std::vector<float> &want,
                  double tol) {
  double worst = 0, scale = 0;
  bool finite = true;
  for (size_t i = 0; i < want.size(); i++) {
    if (!std::isfinite(got[i]) || !std::isfinite(want[i])) finite = false;
    else worst = fmax(worst, fabs((double)got[i] - want[i]));
    scale = fmax(scale, fabs((double)want[i]));
  }
  double rel = scale > 0 ? worst / scale : worst;
  bool ok = finite && rel <= tol;
  checks++;
  failures += !ok;
  printf("%-52s %-4s rel error %.3e%s\n", what, ok ? "ok" : "FAIL", rel,
         finite ? "" : "  (non-finite values)");
}

template <int DT>
static void run_tc(int B, int S, int Hq, int Hkv, int q_first, int kv_first, int group,
                   const std::vector<float> &q, const std::vector<float> &k,
                   const std::vector<float> &v, const std::vector<float> &dout,
                   std::vector<float> &out, std::vector<float> &lse, std::vector<float> &dq,
                   std::vector<float> &dk, std::vector<float> &dv) {
  const int D = 16 * DT;
  float scale = 1.0f / sqrtf((float)D);
  unsigned tiles = (unsigned)((S + TC_TILE - 1) / TC_TILE);
  launch(dim3{tiles, (unsigned)Hq, (unsigned)B}, TC_THREADS, tc_fwd_smem(D), [&] {
    tc_fwd_kernel<DT>(out.data(), lse.data(), q.data(), k.data(), v.data(), S, Hq, Hkv, q_first,
                      kv_first, group, scale);
  });
  launch(dim3{tiles, (unsigned)Hq, (unsigned)B}, TC_THREADS, tc_dq_smem(D), [&] {
    tc_bwd_dq_kernel<DT>(dq.data(), dout.data(), out.data(), lse.data(), q.data(), k.data(),
                         v.data(), S, Hq, Hkv, q_first, kv_first, group, scale);
  });
  launch(dim3{tiles, (unsigned)Hkv, (unsigned)B}, TC_THREADS, tc_dkdv_smem(D), [&] {
    tc_bwd_dkdv_kernel<DT>(dk.data(), dv.data(), dout.data(), out.data(), lse.data(), q.data(),
                           k.data(), v.data(), S, Hq, Hkv, q_first, kv_first, group, scale);
  });
}

template <int DL>
static void run_fused(int B, int S, int Hq, int Hkv, int D, int q_first, int kv_first, int group,
                      const std::vector<float> &q, const std::vector<float> &k,
                      const std::vector<float> &v, const std::vector<float> &dout,
                      std::vector<float> &out, std::vector<float> &lse, std::vector<float> &dq,
                      std::vector<float> &dk, std::vector<float> &dv) {
  float scale = 1.0f / sqrtf((float)D);
  unsigned tiles = (unsigned)((S + FF_ATTN_TILE - 1) / FF_ATTN_TILE);
  unsigned threads = (unsigned)FF_ATTN_WARPS * (unsigned)FF_WARP;
  launch(dim3{tiles, (unsigned)Hq, (unsigned)B}, threads, ff_attn_fwd_smem(D), [&] {
    attention_fwd_kernel<DL>(out.data(), lse.data(), q.data(), k.data(), v.data(), S, Hq, Hkv, D,
                             q_first, kv_first, group, scale);
  });
  launch(dim3{tiles, (unsigned)Hq, (unsigned)B}, threads, ff_attn_dq_smem(D), [&] {
    attention_bwd_dq_kernel<DL>(dq.data(), dout.data(), out.data(), lse.data(), q.data(),
                                k.data(), v.data(), S, Hq, Hkv, D, q_first, kv_first, group, scale);
  });
  launch(dim3{tiles, (unsigned)Hkv, (unsigned)B}, threads, ff_attn_dkdv_smem(D), [&] {
    attention_bwd_dkdv_kernel<DL>(dk.data(), dv.data(), dout.data(), out.data(), lse.data(),
                                  q.data(), k.data(), v.data(), S, Hq, Hkv, D, q_first, kv_first,
                                  group, scale);
  });
}

/* The kernel pair the CUDA backend would launch: the tensor-core one when `tensor` (D a multiple
 * of 16 up to 128), else the fused fp32 one, templated on D / 32 lanes' share as its launcher
 * picks it. */
static void run(bool tensor, int B, int S, int Hq, int Hkv, int D, int q_first, int kv_first,
                int group, const std::vector<float> &q, const std::vector<float> &k,
                const std::vector<float> &v, const std::vector<float> &dout,
                std::vector<float> &out, std::vector<float> &lse, std::vector<float> &dq,
                std::vector<float> &dk, std::vector<float> &dv) {
#define ARGS B, S, Hq, Hkv, q_first, kv_first, group, q, k, v, dout, out, lse, dq, dk, dv
#define FARGS B, S, Hq, Hkv, D, q_first, kv_first, group, q, k, v, dout, out, lse, dq, dk, dv
  if (tensor) {
    switch (D / 16) {
    case 1: run_tc<1>(ARGS); break;
    case 2: run_tc<2>(ARGS); break;
    case 3: run_tc<3>(ARGS); break;
    case 4: run_tc<4>(ARGS); break;
    case 8: run_tc<8>(ARGS); break;
    default: abort(); /* not a shape this test uses */
    }
  } else if (D <= 32) {
    run_fused<1>(FARGS);
  } else if (D <= 64) {
    run_fused<2>(FARGS);
  } else if (D <= 128) {
    run_fused<4>(FARGS);
  } else {
    run_fused<8>(FARGS);
  }
#undef ARGS
#undef FARGS
}

/* Hq local query heads from global q_first over Hkv local kv heads from kv_first. */
static void check_attention(bool tensor, int B, int S, int Hq, int Hkv, int D, int q_first,
                            int kv_first, int group) {
  size_t nq = (size_t)B * S * Hq * D, nk = (size_t)B * S * Hkv * D, nl = (size_t)B * Hq * S;
  std::vector<float> q = random(nq), k = random(nk), v = random(nk), dout = random(nq);
  for (auto &x : q) x *= 3; /* scores of a few units: a softmax that is not flat */
  const ff_kernels *cpu = ff_kernels_cpu(1);
  std::vector<float> out(nq), lse(nl), dq(nq), dk(nk), dv(nk);
  cpu->attention_fwd(out.data(), lse.data(), q.data(), k.data(), v.data(), B, S, Hq, Hkv, D,
                     q_first, kv_first, group);
  cpu->attention_bwd(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(),
                     q.data(), k.data(), v.data(), B, S, Hq, Hkv, D, q_first, kv_first, group);
  std::vector<float> t_out(nq, NAN), t_lse(nl, NAN), t_dq(nq, NAN), t_dk(nk, NAN), t_dv(nk, NAN);
  run(tensor, B, S, Hq, Hkv, D, q_first, kv_first, group, q, k, v, dout, t_out, t_lse, t_dq, t_dk,
      t_dv);
  const char *what[5] = {"out", "lse", "dq", "dk", "dv"};
  const std::vector<float> *got[5] = {&t_out, &t_lse, &t_dq, &t_dk, &t_dv};
  const std::vector<float> *want[5] = {&out, &lse, &dq, &dk, &dv};
  for (int i = 0; i < 5; i++) {
    char name[96];
    snprintf(name, sizeof name, "%s B%d S%d Hq%d Hkv%d D%d q%d kv%d: %s",
             tensor ? "tensor" : "fused", B, S, Hq, Hkv, D, q_first, kv_first, what[i]);
    check(name, *got[i], *want[i], tensor ? 1e-2 : 1e-5);
  }
}

int main(void) {
  /* the fused fp32 kernels: 32-row tiles, head dimensions up to 256 */
  check_attention(false, 2, 77, 2, 2, 16, 0, 0, 1);   /* MHA, S not a multiple of the tile */
  check_attention(false, 1, 40, 3, 2, 16, 1, 0, 2);   /* GQA shard: heads 1-3 over kv 0-1 */
  check_attention(false, 1, 70, 2, 1, 64, 2, 1, 2);   /* heads 2-3 over kv head 1 */
  check_attention(false, 1, 33, 1, 1, 128, 0, 0, 1);
  check_attention(false, 1, 40, 1, 1, 200, 0, 0, 1);  /* D not a power of two, past 128 */
  /* the tensor-core kernels: 64-row tiles, D a multiple of 16 up to 128 */
  check_attention(true, 2, 77, 2, 2, 16, 0, 0, 1);    /* S past one tile, not a multiple */
  check_attention(true, 1, 40, 3, 2, 32, 1, 0, 2);    /* one partial tile, GQA shard */
  check_attention(true, 1, 70, 2, 1, 48, 2, 1, 2);    /* D 48: heads 2-3 over kv head 1 */
  check_attention(true, 1, 130, 2, 1, 64, 0, 0, 2);   /* three tiles, GQA */
  check_attention(true, 1, 96, 2, 2, 128, 0, 0, 1);   /* the largest D */
  printf("%d checks, %d failed\n", checks, failures);
  return failures ? 1 : 0;
}
