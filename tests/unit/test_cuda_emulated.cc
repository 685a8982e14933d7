/* test_cuda_emulated.cc — the CUDA backend's kernels run on the CPU under tests/emu/ (a fiber
 * per CUDA thread, barriers for __syncthreads and __syncwarp, shuffles through shared slots,
 * WMMA on plain arrays), launched with the shapes their launchers use, against the CPU
 * backend, as tests/device/check_kernels does on a GPU: every operation but the matmuls (cuBLAS)
 * and the GEMM attention. Each error is max |emulated − cpu| / max |cpu| (NaN anywhere fails):
 *   the operations of ff_ops_kernels.cuh and the fused fp32 attention (ff_attention_kernels.cuh,
 *   the default), to 1e-5, bf16 storage bit for bit, the sum of squares to 1e-9, and the forms
 *   that write bf16 bit for bit against their fp32 forms' results rounded;
 *   the bf16 tensor-core attention (ff_attention_tc_kernels.cuh, FF_ATTENTION=tensor), which
 *   rounds its inputs to bf16, to 1e-2.
 * The attention shapes cover a sequence shorter than a tile and not a multiple of one, every class
 * of head dimension each kernel takes, GQA and a TP shard whose heads start past zero. Outputs
 * start as NaN and dynamic shared memory is NaN before every block, so an element never written,
 * or a read of shared memory no thread wrote, fails.
 *
 * This checks the kernels' indexing, masking, reductions and synchronisation without a GPU (a
 * missing barrier shows up as a wrong result); what only a GPU shows (speed, the code nvcc makes
 * of them) is tests/device/run.sh's. */
#include "cuda_emu.h"

#include <cuda_bf16.h>
#include <mma.h>

#include <vector>

#include "cuda/ff_attention_kernels.cuh"
#include "cuda/ff_attention_tc_kernels.cuh"
#include "cuda/ff_ops_kernels.cuh"
#include "ff_kernels.h"

template <typename F> static void launch(dim3 grid, dim3 block, size_t smem_bytes, F body) {
  emu_launch(grid, block, smem_bytes, body);
}

static dim3 blocks(unsigned x, unsigned y = 1, unsigned z = 1) { return dim3{x, y, z}; }

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
  launch(blocks(tiles, Hq, B), blocks(TC_THREADS), tc_fwd_smem(D), [&] {
    tc_fwd_kernel<DT>(out.data(), lse.data(), q.data(), k.data(), v.data(), S, Hq, Hkv, q_first,
                      kv_first, group, scale);
  });
  launch(blocks(tiles, Hq, B), blocks(TC_THREADS), tc_dq_smem(D), [&] {
    tc_bwd_dq_kernel<DT>(dq.data(), dout.data(), out.data(), lse.data(), q.data(), k.data(),
                         v.data(), S, Hq, Hkv, q_first, kv_first, group, scale);
  });
  launch(blocks(tiles, Hkv, B), blocks(TC_THREADS), tc_dkdv_smem(D), [&] {
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
  launch(blocks(tiles, Hq, B), blocks(threads), ff_attn_fwd_smem(D), [&] {
    attention_fwd_kernel<DL>(out.data(), lse.data(), q.data(), k.data(), v.data(), S, Hq, Hkv, D,
                             q_first, kv_first, group, scale);
  });
  launch(blocks(tiles, Hq, B), blocks(threads), ff_attn_dq_smem(D), [&] {
    attention_bwd_dq_kernel<DL>(dq.data(), dout.data(), out.data(), lse.data(), q.data(),
                                k.data(), v.data(), S, Hq, Hkv, D, q_first, kv_first, group, scale);
  });
  launch(blocks(tiles, Hkv, B), blocks(threads), ff_attn_dkdv_smem(D), [&] {
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

/* ---- the other operations, launched as ff_kernels_cuda.cu launches them ----------------- */

static const ff_kernels *cpu;

static std::vector<float> nans(size_t n) { return std::vector<float>(n, NAN); }

/* bf16 outputs start as bf16 NaN. */
static std::vector<uint16_t> nan_halves(size_t n) { return std::vector<uint16_t>(n, 0xffff); }

/* A kernel's bf16-writing form against its fp32 form on the same inputs: the fp32 results
 * rounded by to_bf16, bit for bit. */
static void check_rounds(const char *what, const std::vector<uint16_t> &got,
                         const std::vector<float> &fp32) {
  std::vector<uint16_t> want(fp32.size());
  cpu->to_bf16(want.data(), fp32.data(), (int64_t)fp32.size());
  bool same = memcmp(got.data(), want.data(), want.size() * 2) == 0;
  checks++;
  failures += !same;
  printf("%-52s %-4s bit for bit\n", what, same ? "ok" : "FAIL");
}

/* One grid-stride kernel over n elements, as LAUNCH_1D does. */
template <typename F> static void launch_1d(int64_t n, F body) {
  launch(blocks(ff_grid_for(n, THREADS)), blocks(THREADS), 0, body);
}

static void check_embedding(int N, int C, int V, int vocab_first, int vocab_end) {
  std::vector<int32_t> tokens(N);
  for (int n = 0; n < N; n++) tokens[n] = (int32_t)((n * 37 + 11) % V); /* some outside the shard */
  int rows = vocab_end - vocab_first;
  std::vector<float> table = random((size_t)rows * C), out(N * (size_t)C), gout = nans(out.size());
  cpu->embedding_fwd(out.data(), tokens.data(), table.data(), N, C, vocab_first, vocab_end);
  launch(blocks(N), blocks(THREADS), 0, [&] {
    embedding_fwd_kernel(gout.data(), tokens.data(), table.data(), C, vocab_first, vocab_end);
  });
  char name[96];
  snprintf(name, sizeof name, "embedding_fwd N%d C%d shard %d-%d", N, C, vocab_first, vocab_end);
  check(name, gout, out, 1e-5);
  std::vector<float> dout = random(out.size()), dtable = random(table.size()), gdtable = dtable;
  cpu->embedding_bwd(dtable.data(), dout.data(), tokens.data(), N, C, vocab_first, vocab_end);
  launch(blocks((unsigned)((C + THREADS - 1) / THREADS), EMBED_BUCKETS), blocks(THREADS), 0, [&] {
    embedding_bwd_kernel(gdtable.data(), dout.data(), tokens.data(), N, C, vocab_first, vocab_end);
  });
  snprintf(name, sizeof name, "embedding_bwd N%d C%d shard %d-%d", N, C, vocab_first, vocab_end);
  check(name, gdtable, dtable, 1e-5);
}

static void check_rmsnorm(int N, int C) {
  std::vector<float> x = random((size_t)N * C), w = random(C), out(x.size()), rstd(N);
  std::vector<float> gout = nans(x.size()), grstd = nans(N);
  cpu->rmsnorm_fwd(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
  launch(blocks(N), blocks(THREADS), 0, [&] {
    rmsnorm_fwd_kernel(gout.data(), grstd.data(), x.data(), w.data(), C, 1e-5f);
  });
  char name[96];
  snprintf(name, sizeof name, "rmsnorm_fwd N%d C%d: out", N, C);
  check(name, gout, out, 1e-5);
  snprintf(name, sizeof name, "rmsnorm_fwd N%d C%d: rstd", N, C);
  check(name, grstd, rstd, 1e-5);
  std::vector<uint16_t> ghalf = nan_halves(x.size());
  std::vector<float> grstd16 = nans(N);
  launch(blocks(N), blocks(THREADS), 0, [&] {
    rmsnorm_fwd_kernel(ghalf.data(), grstd16.data(), x.data(), w.data(), C, 1e-5f);
  });
  snprintf(name, sizeof name, "rmsnorm_fwd N%d C%d: bf16 out", N, C);
  check_rounds(name, ghalf, gout);
  snprintf(name, sizeof name, "rmsnorm_fwd N%d C%d: rstd with bf16 out", N, C);
  check(name, grstd16, grstd, 0);
  std::vector<float> dout = random(x.size()), dx(x.size()), gdx = nans(x.size());
  std::vector<float> dw = random(C), gdw = dw;
  cpu->rmsnorm_bwd(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), N, C);
  launch(blocks(N), blocks(THREADS), 0, [&] {
    rmsnorm_bwd_inp_kernel(gdx.data(), dout.data(), x.data(), w.data(), rstd.data(), C);
  });
  launch(blocks((unsigned)((C + FF_WARP - 1) / FF_WARP)), blocks(FF_WARP, RMS_W_ROWS), 0, [&] {
    rmsnorm_bwd_w_kernel(gdw.data(), dout.data(), x.data(), rstd.data(), N, C);
  });
  snprintf(name, sizeof name, "rmsnorm_bwd N%d C%d: dinp", N, C);
  check(name, gdx, dx, 1e-5);
  /* the adding form (rmsnorm_bwd_acc): onto a copy of its own result, twice that */
  std::vector<float> twice = gdx, want2(x.size());
  launch(blocks(N), blocks(THREADS), 0, [&] {
    rmsnorm_bwd_inp_kernel<true>(twice.data(), dout.data(), x.data(), w.data(), rstd.data(), C);
  });
  for (size_t i = 0; i < want2.size(); i++) want2[i] = gdx[i] + gdx[i];
  snprintf(name, sizeof name, "rmsnorm_bwd N%d C%d: dinp added", N, C);
  check(name, twice, want2, 0);
  /* on a bf16 input (rmsnorm_bwd_acc_bf16): the fp32 kernels on the widened values */
  std::vector<uint16_t> x16(x.size());
  std::vector<float> xw(x.size());
  cpu->to_bf16(x16.data(), x.data(), (int64_t)x.size());
  cpu->from_bf16(xw.data(), x16.data(), (int64_t)x.size());
  std::vector<float> a32 = dout, a16 = dout, w32 = random(C), w16 = w32;
  launch(blocks(N), blocks(THREADS), 0, [&] {
    rmsnorm_bwd_inp_kernel<true>(a32.data(), dout.data(), xw.data(), w.data(), rstd.data(), C);
  });
  launch(blocks(N), blocks(THREADS), 0, [&] {
    rmsnorm_bwd_inp_kernel<true>(a16.data(), dout.data(), x16.data(), w.data(), rstd.data(), C);
  });
  launch(blocks((unsigned)((C + FF_WARP - 1) / FF_WARP)), blocks(FF_WARP, RMS_W_ROWS), 0, [&] {
    rmsnorm_bwd_w_kernel(w32.data(), dout.data(), xw.data(), rstd.data(), N, C);
  });
  launch(blocks((unsigned)((C + FF_WARP - 1) / FF_WARP)), blocks(FF_WARP, RMS_W_ROWS), 0, [&] {
    rmsnorm_bwd_w_kernel(w16.data(), dout.data(), x16.data(), rstd.data(), N, C);
  });
  snprintf(name, sizeof name, "rmsnorm_bwd N%d C%d: bf16 input, dinp", N, C);
  check(name, a16, a32, 0);
  snprintf(name, sizeof name, "rmsnorm_bwd N%d C%d: bf16 input, dw", N, C);
  check(name, w16, w32, 0);
  snprintf(name, sizeof name, "rmsnorm_bwd N%d C%d: dw", N, C);
  check(name, gdw, dw, 1e-5);
}

static void check_rope(int B, int S, int H, int D) {
  std::vector<float> x = random((size_t)B * S * H * D), want = x, got = x;
  int64_t pairs = (int64_t)B * S * H * (D / 2);
  cpu->rope_fwd(want.data(), B, S, H, D, 10000.0f);
  launch_1d(pairs, [&] { rope_kernel(got.data(), S, H, D, 10000.0f, 1.0f, pairs); });
  check("rope_fwd", got, want, 1e-5);
  cpu->rope_bwd(want.data(), B, S, H, D, 10000.0f);
  launch_1d(pairs, [&] { rope_kernel(got.data(), S, H, D, 10000.0f, -1.0f, pairs); });
  check("rope_bwd (after rope_fwd)", got, want, 1e-5);
  /* rope_fwd_bf16: the rotation written out in bf16, x untouched */
  std::vector<float> x2 = random(x.size()), rot = x2, keep = x2;
  std::vector<uint16_t> h = nan_halves(x.size());
  launch_1d(pairs, [&] { rope_kernel(rot.data(), S, H, D, 10000.0f, 1.0f, pairs); });
  launch_1d(pairs, [&] { rope_out_kernel(h.data(), x2.data(), S, H, D, 10000.0f, 1.0f, pairs); });
  check_rounds("rope_fwd_bf16", h, rot);
  check("rope_fwd_bf16 leaves its input", x2, keep, 0);
  launch_1d(pairs, [&] { rope_kernel(rot.data(), S, H, D, 10000.0f, -1.0f, pairs); });
  launch_1d(pairs, [&] { rope_out_kernel(h.data(), x2.data(), S, H, D, 10000.0f, -1.0f, pairs); });
  std::vector<float> back = keep;
  launch_1d(pairs, [&] { rope_kernel(back.data(), S, H, D, 10000.0f, -1.0f, pairs); });
  check_rounds("rope_bwd_bf16", h, back);
}

static void check_elementwise(int64_t n) {
  std::vector<float> gate = random(n), up = random(n), dout = random(n);
  std::vector<float> out(n), gout = nans(n), dg(n), du(n), gdg = nans(n), gdu = nans(n);
  cpu->swiglu_fwd(out.data(), gate.data(), up.data(), n);
  launch_1d(n, [&] { swiglu_fwd_kernel(gout.data(), gate.data(), up.data(), n); });
  check("swiglu_fwd", gout, out, 1e-5);
  cpu->swiglu_bwd(dg.data(), du.data(), dout.data(), gate.data(), up.data(), n);
  launch_1d(n, [&] {
    swiglu_bwd_kernel(gdg.data(), gdu.data(), dout.data(), gate.data(), up.data(), n);
  });
  check("swiglu_bwd: dgate", gdg, dg, 1e-5);
  check("swiglu_bwd: dup", gdu, du, 1e-5);
  /* the bf16 forms, on bf16 gate and up: the fp32 forms' results on the same values, rounded */
  std::vector<uint16_t> g16(n), u16(n);
  cpu->to_bf16(g16.data(), gate.data(), n);
  cpu->to_bf16(u16.data(), up.data(), n);
  std::vector<float> gw(n), uw(n), fw = nans(n), dgw = nans(n), duw = nans(n);
  cpu->from_bf16(gw.data(), g16.data(), n);
  cpu->from_bf16(uw.data(), u16.data(), n);
  launch_1d(n, [&] { swiglu_fwd_kernel(fw.data(), gw.data(), uw.data(), n); });
  launch_1d(n, [&] {
    swiglu_bwd_kernel(dgw.data(), duw.data(), dout.data(), gw.data(), uw.data(), n);
  });
  std::vector<uint16_t> gh = nan_halves(n), ghg = nan_halves(n), ghu = nan_halves(n);
  launch_1d(n, [&] { swiglu_fwd_kernel(gh.data(), g16.data(), u16.data(), n); });
  check_rounds("swiglu_fwd: bf16 in and out", gh, fw);
  launch_1d(n, [&] {
    swiglu_bwd_kernel(ghg.data(), ghu.data(), dout.data(), g16.data(), u16.data(), n);
  });
  check_rounds("swiglu_bwd: bf16 in and out, dgate", ghg, dgw);
  check_rounds("swiglu_bwd: bf16 in and out, dup", ghu, duw);
  std::vector<float> sum(n), gsum = nans(n);
  cpu->add(sum.data(), gate.data(), up.data(), n);
  launch_1d(n, [&] { add_kernel(gsum.data(), gate.data(), up.data(), n); });
  check("add", gsum, sum, 0);
  std::vector<float> acc = dout, gacc = dout;
  cpu->accumulate(acc.data(), gate.data(), n);
  launch_1d(n, [&] { accumulate_kernel(gacc.data(), gate.data(), n); });
  check("accumulate", gacc, acc, 0);
  cpu->scale(acc.data(), 0.37f, n);
  launch_1d(n, [&] { scale_kernel(gacc.data(), 0.37f, n); });
  check("scale", gacc, acc, 0);
}

/* A vocabulary shard of V columns from vocab_first; targets inside and outside it. */
static void check_cross_entropy(int N, int V, int vocab_first) {
  std::vector<float> logits = random((size_t)N * V);
  for (auto &z : logits) z *= 8;
  std::vector<int32_t> targets(N);
  for (int n = 0; n < N; n++) targets[n] = vocab_first - 3 + (n * 131) % (V + 6);
  std::vector<float> mx(N), sm(N), loss = random(N), dl(logits.size());
  std::vector<float> gmx = nans(N), gsm = nans(N), gloss = loss, gdl = logits; /* in place */
  float scale = 1.0f / (float)N;
  cpu->ce_row_max(mx.data(), logits.data(), N, V);
  cpu->ce_row_sum(sm.data(), logits.data(), mx.data(), N, V);
  cpu->ce_loss_grad(loss.data(), dl.data(), logits.data(), targets.data(), mx.data(), sm.data(), N,
                    V, vocab_first, scale);
  launch(blocks(N), blocks(THREADS), 0, [&] { ce_row_max_kernel(gmx.data(), logits.data(), V); });
  launch(blocks(N), blocks(THREADS), 0, [&] {
    ce_row_sum_kernel(gsm.data(), logits.data(), gmx.data(), V);
  });
  launch(blocks(N), blocks(THREADS), 0, [&] {
    ce_loss_grad_kernel(gloss.data(), gdl.data(), gdl.data(), targets.data(), gmx.data(),
                        gsm.data(), V, vocab_first, scale);
  });
  char name[96];
  snprintf(name, sizeof name, "cross-entropy N%d V%d from %d: row max", N, V, vocab_first);
  check(name, gmx, mx, 1e-5);
  snprintf(name, sizeof name, "cross-entropy N%d V%d from %d: row sum", N, V, vocab_first);
  check(name, gsm, sm, 1e-5);
  snprintf(name, sizeof name, "cross-entropy N%d V%d from %d: loss", N, V, vocab_first);
  check(name, gloss, loss, 1e-5);
  snprintf(name, sizeof name, "cross-entropy N%d V%d from %d: dlogits (in place)", N, V,
           vocab_first);
  check(name, gdl, dl, 1e-5);
  /* the bf16 gradient (ce_loss_grad_bf16): the fp32 one rounded, the loss the same */
  std::vector<float> loss2 = random(N), loss3 = loss2;
  std::vector<uint16_t> dl16 = nan_halves(logits.size());
  std::vector<float> dlf = nans(logits.size());
  launch(blocks(N), blocks(THREADS), 0, [&] {
    ce_loss_grad_kernel(loss2.data(), dlf.data(), logits.data(), targets.data(), gmx.data(),
                        gsm.data(), V, vocab_first, scale);
  });
  launch(blocks(N), blocks(THREADS), 0, [&] {
    ce_loss_grad_kernel(loss3.data(), dl16.data(), logits.data(), targets.data(), gmx.data(),
                        gsm.data(), V, vocab_first, scale);
  });
  snprintf(name, sizeof name, "cross-entropy N%d V%d from %d: bf16 dlogits", N, V, vocab_first);
  check_rounds(name, dl16, dlf);
  snprintf(name, sizeof name, "cross-entropy N%d V%d from %d: loss with bf16", N, V, vocab_first);
  check(name, loss3, loss2, 0);
}

static void check_optimizer(int64_t n) {
  std::vector<float> p = random(n), g = random(n), m = random(n), v = random(n);
  for (auto &x : v) x = fabsf(x);
  std::vector<float> gp = p, gm = m, gv = v;
  cpu->adamw(p.data(), g.data(), m.data(), v.data(), n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 0.5f);
  ff_adamw_factors f = ff_adamw_factors_of(3e-4f, 0.9f, 0.95f, 0.1f, 3);
  launch_1d(n, [&] {
    adamw_kernel(gp.data(), g.data(), gm.data(), gv.data(), n, 0.9f, 0.95f, 1e-8f, f.decay,
                 f.step_size, f.bc2_sqrt, 0.5f);
  });
  check("adamw: param", gp, p, 1e-5);
  check("adamw: m", gm, m, 1e-5);
  check("adamw: v", gv, v, 1e-5);

  std::vector<double> partial(SUMSQ_BLOCKS + 1, NAN);
  launch(blocks(SUMSQ_BLOCKS), blocks(THREADS), 0, [&] {
    sumsq_partial_kernel(partial.data(), g.data(), n);
  });
  launch(blocks(1), blocks(THREADS), 0, [&] { sumsq_final_kernel(partial.data(), SUMSQ_BLOCKS); });
  double want = cpu->sum_squares(g.data(), n), got = partial[SUMSQ_BLOCKS];
  double rel = fabs(got - want) / want;
  bool ok = std::isfinite(got) && rel <= 1e-9;
  checks++;
  failures += !ok;
  printf("%-52s %-4s rel error %.3e\n", "sum_squares (double)", ok ? "ok" : "FAIL", rel);
}

/* bf16 storage: bit for bit, NaN and ties included. */
static void check_bf16(int64_t n) {
  std::vector<float> x = random(n);
  x[0] = NAN, x[1] = INFINITY, x[2] = -0.0f, x[3] = __uint_as_float(0x3f808000u); /* a tie */
  std::vector<uint16_t> want(n), got(n, 0xdead);
  cpu->to_bf16(want.data(), x.data(), n);
  launch_1d(n, [&] { to_bf16_kernel(got.data(), x.data(), n); });
  bool same = memcmp(got.data(), want.data(), (size_t)n * 2) == 0;
  std::vector<float> back(n), gback = nans(n);
  cpu->from_bf16(back.data(), want.data(), n);
  launch_1d(n, [&] { from_bf16_kernel(gback.data(), want.data(), n); });
  same = same && memcmp(back.data(), gback.data(), (size_t)n * 4) == 0;
  checks++;
  failures += !same;
  printf("%-52s %-4s bit for bit\n", "to_bf16, from_bf16", same ? "ok" : "FAIL");
}

/* The tensor-core kernels on bf16 q, k, v and out, as bf16 plans run them, against the same
 * kernels on those values widened to fp32: the same bits in shared memory, so the same results,
 * the forward's output rounded on the way out. */
static std::vector<uint16_t> rounded(std::vector<float> &x) { /* x becomes its bf16 value */
  std::vector<uint16_t> h(x.size());
  cpu->to_bf16(h.data(), x.data(), (int64_t)x.size());
  cpu->from_bf16(x.data(), h.data(), (int64_t)x.size());
  return h;
}

static bool same_bits(const std::vector<float> &a, const std::vector<float> &b) {
  return memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

template <int DT>
static void check_attention_tc_bf16(int B, int S, int Hq, int Hkv, int q_first, int kv_first,
                                    int group) {
  const int D = 16 * DT;
  float scale = 1.0f / sqrtf((float)D);
  size_t nq = (size_t)B * S * Hq * D, nk = (size_t)B * S * Hkv * D, nl = (size_t)B * Hq * S;
  std::vector<float> q = random(nq), k = random(nk), v = random(nk), dout = random(nq);
  for (auto &x : q) x *= 3;
  std::vector<uint16_t> q16 = rounded(q), k16 = rounded(k), v16 = rounded(v);
  unsigned tiles = (unsigned)((S + TC_TILE - 1) / TC_TILE);
  std::vector<float> out = nans(nq), lse = nans(nl), lse16 = nans(nl);
  std::vector<uint16_t> out16 = nan_halves(nq);
  launch(blocks(tiles, Hq, B), blocks(TC_THREADS), tc_fwd_smem(D), [&] {
    tc_fwd_kernel<DT>(out.data(), lse.data(), q.data(), k.data(), v.data(), S, Hq, Hkv, q_first,
                      kv_first, group, scale);
  });
  launch(blocks(tiles, Hq, B), blocks(TC_THREADS), tc_fwd_smem(D), [&] {
    tc_fwd_kernel<DT>(out16.data(), lse16.data(), q16.data(), k16.data(), v16.data(), S, Hq, Hkv,
                      q_first, kv_first, group, scale);
  });
  check_rounds("tensor, bf16 in and out: out", out16, out);
  checks++;
  failures += !same_bits(lse16, lse);
  printf("%-52s %-4s bit for bit\n", "tensor, bf16 in and out: lse",
         same_bits(lse16, lse) ? "ok" : "FAIL");
  std::vector<float> outw(nq); /* the backward reads the forward's bf16 output */
  cpu->from_bf16(outw.data(), out16.data(), (int64_t)nq);
  std::vector<float> dq[2] = {nans(nq), nans(nq)}, dk[2] = {nans(nk), nans(nk)};
  std::vector<float> dv[2] = {nans(nk), nans(nk)};
  launch(blocks(tiles, Hq, B), blocks(TC_THREADS), tc_dq_smem(D), [&] {
    tc_bwd_dq_kernel<DT>(dq[0].data(), dout.data(), outw.data(), lse.data(), q.data(), k.data(),
                         v.data(), S, Hq, Hkv, q_first, kv_first, group, scale);
  });
  launch(blocks(tiles, Hq, B), blocks(TC_THREADS), tc_dq_smem(D), [&] {
    tc_bwd_dq_kernel<DT>(dq[1].data(), dout.data(), out16.data(), lse.data(), q16.data(),
                         k16.data(), v16.data(), S, Hq, Hkv, q_first, kv_first, group, scale);
  });
  launch(blocks(tiles, Hkv, B), blocks(TC_THREADS), tc_dkdv_smem(D), [&] {
    tc_bwd_dkdv_kernel<DT>(dk[0].data(), dv[0].data(), dout.data(), outw.data(), lse.data(),
                           q.data(), k.data(), v.data(), S, Hq, Hkv, q_first, kv_first, group,
                           scale);
  });
  launch(blocks(tiles, Hkv, B), blocks(TC_THREADS), tc_dkdv_smem(D), [&] {
    tc_bwd_dkdv_kernel<DT>(dk[1].data(), dv[1].data(), dout.data(), out16.data(), lse.data(),
                           q16.data(), k16.data(), v16.data(), S, Hq, Hkv, q_first, kv_first,
                           group, scale);
  });
  const char *what[3] = {"dq", "dk", "dv"};
  const std::vector<float> *pairs[3] = {dq, dk, dv};
  for (int i = 0; i < 3; i++) {
    bool ok = same_bits(pairs[i][1], pairs[i][0]);
    char name[96];
    snprintf(name, sizeof name, "tensor, bf16 in: %s", what[i]);
    checks++;
    failures += !ok;
    printf("%-52s %-4s bit for bit\n", name, ok ? "ok" : "FAIL");
  }
}

int main(void) {
  cpu = ff_kernels_cpu(1);
  check_embedding(7, 300, 256, 40, 240); /* C past one block of threads, tokens off the shard */
  check_rmsnorm(5, 300);
  check_rope(2, 9, 3, 16);
  check_elementwise(3001);
  check_cross_entropy(5, 1000, 300);
  check_cross_entropy(3, 77, 0);
  check_optimizer(3001);
  check_bf16(3001);
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
  check_attention_tc_bf16<2>(1, 80, 3, 2, 1, 0, 2);  /* bf16 in and out: GQA shard, 2 tiles */
  check_attention(true, 1, 130, 2, 1, 64, 0, 0, 2);   /* three tiles, GQA */
  check_attention(true, 1, 96, 2, 2, 128, 0, 0, 1);   /* the largest D */
  printf("%d checks, %d failed\n", checks, failures);
  return failures ? 1 : 0;
}
