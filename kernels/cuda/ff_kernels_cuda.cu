/* ff_kernels_cuda.cu — the CUDA backend of ff_kernels.h: device memory, matmuls through
 * cuBLASLt, and a kernel per remaining operation, all on one stream per process. Storage is fp32
 * like the CPU backend, so the two are compared element for element, but for the operands of
 * the bf16 matmuls (bf16 tensor cores, fp32 accumulation), which bf16 plans run; with
 * FF_MATH_BF16 the fp32 matmuls run on bf16 tensor cores too (CUBLAS_COMPUTE_32F_FAST_16BF).
 * The kernels of the operations other than matmuls and attention are in ff_ops_kernels.cuh.
 * Attention runs under bf16 math in ff_attention_gemm_cuda.cu (cuBLAS, tensor cores in bf16), or
 * with FF_ATTENTION=tensor in ff_attention_tc_cuda.cu (fused, bf16 tensor cores), under fp32
 * math or with FF_ATTENTION=fused in ff_attention_cuda.cu (fused, fp32). The backend is
 * one per process: the table interface carries no context, so the stream, the cuBLASLt handle
 * and the allocation ledger sit in one static struct set up by ff_kernels_cuda(). */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../ff_attention_widened.h"
#include "../ff_kernels.h"
#include "ff_attention.h"
#include "ff_cuda_common.cuh"
#include "ff_ops_kernels.cuh"

/* Which attention runs (FF_ATTENTION): the fused fp32 kernel, cuBLAS, or the tensor-core kernel
 * (bf16 math and head dimensions it supports only; the fused kernel otherwise). The default is
 * cuBLAS under bf16 math and the fused kernel under fp32 math: on an H200 (tests/device/run.sh,
 * docs/benchmarks.md) the ~1B Llama's attention took 0.16 s per step through cuBLAS against
 * 1.16 s in the tensor-core kernel and 2.58 s in the fused one. */
typedef enum { ATTENTION_DEFAULT, ATTENTION_FUSED, ATTENTION_GEMM, ATTENTION_TENSOR } attention_kind;

enum {
  GEMM_CACHE = 128,             /* distinct matmul shapes remembered with their algorithm */
  WORKSPACE_BYTES = 32 << 20,   /* cuBLASLt workspace */
  OP_RING = 1024,               /* timed operations in flight before the oldest is waited for */
};

enum { OP_MATMUL, OP_ATTENTION, OP_KINDS };

typedef struct gemm_entry {
  int ta, tb, m, n, k, lda, ldb, ldc, accumulate, align_a, align_b, align_c;
  int bf16;     /* operands A and B in bf16 */
  int out_bf16; /* C (and D) in bf16 too: the fp32 result rounded on the way out */
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t a, b, c;
  cublasLtMatmulAlgo_t algo;
  bool lt; /* false: cuBLASLt offered no algorithm, cublasGemmEx runs it */
} gemm_entry;

typedef struct alloc_entry {
  void *p;
  size_t bytes;
} alloc_entry;

static struct cuda_backend {
  bool ready;
  int device;
  ff_kernel_math math;
  attention_kind attention;
  void (*on_fatal)(int status);
  cudaStream_t stream;
  cublasLtHandle_t lt;
  cublasHandle_t blas;
  void *workspace;
  double *sumsq_partial; /* SUMSQ_BLOCKS + 1 */
  size_t shared_limit;   /* dynamic shared memory a block may opt in to */
  gemm_entry gemm[GEMM_CACHE];
  int n_gemm;
  alloc_entry *allocs;
  int n_allocs, cap_allocs;
  int64_t allocated_bytes, peak_bytes;
  /* event pairs around matmuls and attention, read back once the stream has passed them */
  cudaEvent_t op_start[OP_RING], op_stop[OP_RING];
  unsigned char op_kind[OP_RING];
  int op_head, op_pending;
  double op_seconds[OP_KINDS];
} g;

cudaStream_t ff_cuda_stream(void) { return g.stream; }

size_t ff_cuda_shared_limit(void) { return g.shared_limit; }

extern "C" void *ff_kernels_cuda_stream(void) { return g.ready ? (void *)g.stream : NULL; }

void ff_cuda_fatal(const char *file, int line, const char *call, const char *message) {
  const char *base = strrchr(file, '/');
  fprintf(stderr, "cuda backend: %s failed (%s:%d): %s\n", call, base ? base + 1 : file, line,
          message);
  fflush(stderr);
  if (g.on_fatal) g.on_fatal(1);
  exit(1);
}

/* ---- timing of matmuls and attention ---------------------------------------------------- */

/* Fold finished event pairs into op_seconds; waits for the last one recorded, so callers do
 * this after a stream synchronisation (then nothing waits) or when the ring is full. */
static void op_drain(void) {
  for (; g.op_pending > 0; g.op_pending--, g.op_head = (g.op_head + 1) % OP_RING) {
    float ms = 0.0f;
    FF_CUDA_CHECK(cudaEventSynchronize(g.op_stop[g.op_head]));
    FF_CUDA_CHECK(cudaEventElapsedTime(&ms, g.op_start[g.op_head], g.op_stop[g.op_head]));
    g.op_seconds[g.op_kind[g.op_head]] += ms * 1e-3;
  }
}

static int op_begin(int kind) {
  if (g.op_pending == OP_RING) op_drain();
  int i = (g.op_head + g.op_pending) % OP_RING;
  g.op_kind[i] = (unsigned char)kind;
  FF_CUDA_CHECK(cudaEventRecord(g.op_start[i], g.stream));
  return i;
}

static void op_end(int i) {
  FF_CUDA_CHECK(cudaEventRecord(g.op_stop[i], g.stream));
  g.op_pending++;
}

static void cuda_op_seconds(double *matmul_seconds, double *attention_seconds) {
  FF_CUDA_CHECK(cudaStreamSynchronize(g.stream));
  op_drain();
  *matmul_seconds = g.op_seconds[OP_MATMUL];
  *attention_seconds = g.op_seconds[OP_ATTENTION];
}

/* ---- memory ----------------------------------------------------------------------------- */

static void *cuda_alloc(size_t bytes) {
  void *p = NULL;
  if (bytes == 0) bytes = 256; /* NULL means failure only */
  if (cudaMalloc(&p, bytes) != cudaSuccess) {
    cudaGetLastError(); /* out of memory is the caller's to report, not sticky */
    return NULL;
  }
  if (g.n_allocs == g.cap_allocs) {
    int cap = g.cap_allocs ? 2 * g.cap_allocs : 64;
    alloc_entry *grown = (alloc_entry *)realloc(g.allocs, (size_t)cap * sizeof *grown);
    if (!grown) {
      cudaFree(p);
      return NULL;
    }
    g.allocs = grown;
    g.cap_allocs = cap;
  }
  g.allocs[g.n_allocs++] = (alloc_entry){p, bytes};
  g.allocated_bytes += (int64_t)bytes;
  if (g.allocated_bytes > g.peak_bytes) g.peak_bytes = g.allocated_bytes;
  FF_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, g.stream));
  return p;
}

static void cuda_release(void *p) {
  if (!p) return;
  for (int i = 0; i < g.n_allocs; i++)
    if (g.allocs[i].p == p) {
      g.allocated_bytes -= (int64_t)g.allocs[i].bytes;
      g.allocs[i] = g.allocs[--g.n_allocs];
      break;
    }
  FF_CUDA_CHECK(cudaFree(p));
}

static void cuda_zero(void *p, size_t bytes) {
  if (bytes) FF_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, g.stream));
}

static void cuda_sync(void);

/* Either direction (unified addressing tells host from device); the host side may be pageable
 * and reused at once, so both wait for the copy. */
static void cuda_copy(void *dst, const void *src, size_t bytes) {
  if (!bytes) return;
  FF_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, g.stream));
  cuda_sync();
}

/* Rows of backend memory to backend memory, ordered on the stream like a kernel. */
static void cuda_copy_rows(float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                           int64_t width, int64_t rows) {
  if (width <= 0 || rows <= 0) return;
  size_t w = (size_t)width * sizeof(float);
  FF_CUDA_CHECK(cudaMemcpy2DAsync(dst, rows > 1 ? (size_t)dst_stride * sizeof(float) : w, src,
                                  rows > 1 ? (size_t)src_stride * sizeof(float) : w, w,
                                  (size_t)rows, cudaMemcpyDeviceToDevice, g.stream));
}

static void *cuda_alloc_host(size_t bytes) {
  void *p = NULL;
  if (bytes == 0) bytes = 64;
  if (cudaMallocHost(&p, bytes) != cudaSuccess) {
    cudaGetLastError();
    return NULL;
  }
  memset(p, 0, bytes);
  return p;
}

static void cuda_release_host(void *p) {
  if (p) FF_CUDA_CHECK(cudaFreeHost(p));
}

static void cuda_sync(void) {
  FF_CUDA_CHECK(cudaStreamSynchronize(g.stream));
  op_drain();
}

static void cuda_memory(ff_kernel_memory *out) {
  size_t free_bytes = 0, total_bytes = 0;
  FF_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  out->allocated_bytes = g.allocated_bytes;
  out->peak_bytes = g.peak_bytes;
  out->device_used_bytes = (int64_t)(total_bytes - free_bytes);
  out->device_total_bytes = (int64_t)total_bytes;
}

/* ---- matmul ----------------------------------------------------------------------------- */

static int alignment_of(const void *p) {
  uintptr_t a = (uintptr_t)p;
  int align = 16;
  while (align > 2 && a % (uintptr_t)align) align /= 2;
  return align;
}

/* bf16 operands accumulate in fp32; fp32 operands under bf16 math are rounded by cuBLAS. */
static cublasComputeType_t gemm_compute(bool bf16) {
  return !bf16 && g.math == FF_MATH_BF16 ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F;
}

/* Descriptors and the heuristic's algorithm for one shape, made on first use. */
static gemm_entry *gemm_plan(const gemm_entry *key) {
  for (int i = 0; i < g.n_gemm; i++) {
    gemm_entry *e = &g.gemm[i];
    if (e->ta == key->ta && e->tb == key->tb && e->m == key->m && e->n == key->n &&
        e->k == key->k && e->lda == key->lda && e->ldb == key->ldb && e->ldc == key->ldc &&
        e->accumulate == key->accumulate && e->align_a == key->align_a &&
        e->align_b == key->align_b && e->align_c == key->align_c && e->bf16 == key->bf16 &&
        e->out_bf16 == key->out_bf16)
      return e;
  }
  gemm_entry *e = g.n_gemm < GEMM_CACHE ? &g.gemm[g.n_gemm++] : &g.gemm[GEMM_CACHE - 1];
  if (e == &g.gemm[GEMM_CACHE - 1] && g.n_gemm == GEMM_CACHE && e->op) {
    cublasLtMatrixLayoutDestroy(e->a); /* a full cache recycles its last slot */
    cublasLtMatrixLayoutDestroy(e->b);
    cublasLtMatrixLayoutDestroy(e->c);
    cublasLtMatmulDescDestroy(e->op);
  }
  *e = *key;
  FF_CUBLAS_CHECK(cublasLtMatmulDescCreate(&e->op, gemm_compute(e->bf16), CUDA_R_32F));
  cublasOperation_t ta = e->ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = e->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  FF_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  FF_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  cudaDataType_t operand = e->bf16 ? CUDA_R_16BF : CUDA_R_32F;
  FF_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&e->a, operand, e->ta ? e->k : e->m,
                                             e->ta ? e->m : e->k, e->lda));
  FF_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&e->b, operand, e->tb ? e->n : e->k,
                                             e->tb ? e->k : e->n, e->ldb));
  FF_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&e->c, e->out_bf16 ? CUDA_R_16BF : CUDA_R_32F, e->m,
                                             e->n, e->ldc));
  cublasLtMatmulPreference_t pref;
  FF_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  uint64_t ws = WORKSPACE_BYTES;
  uint32_t al[3] = {(uint32_t)e->align_a, (uint32_t)e->align_b, (uint32_t)e->align_c};
  FF_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  FF_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al[0], sizeof al[0]));
  FF_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al[1], sizeof al[1]));
  FF_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al[2], sizeof al[2]));
  FF_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al[2], sizeof al[2]));
  cublasLtMatmulHeuristicResult_t result;
  int found = 0;
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(g.lt, e->op, e->a, e->b, e->c, e->c, pref, 1,
                                                     &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED) /* a failure, not a "no" */
    ff_cuda_fatal(__FILE__, __LINE__, "cublasLtMatmulAlgoGetHeuristic", cublasGetStatusString(st));
  e->lt = st == CUBLAS_STATUS_SUCCESS && found > 0;
  if (e->lt) e->algo = result.algo;
  return e;
}

/* Column-major C(m, n) = op(A) · op(B) (+ C when accumulate), cuBLAS's convention; A and B are
 * fp32, or bf16 when `bf16`; C is fp32, or bf16 when `out_bf16` (with bf16 operands only). */
static void gemm(int ta, int tb, int m, int n, int k, const void *A, int lda, const void *B,
                 int ldb, bool accumulate, void *C, int ldc, bool bf16, bool out_bf16 = false) {
  gemm_entry key;
  memset(&key, 0, sizeof key);
  key.ta = ta; key.tb = tb; key.m = m; key.n = n; key.k = k;
  key.lda = lda; key.ldb = ldb; key.ldc = ldc; key.accumulate = accumulate; key.bf16 = bf16;
  key.out_bf16 = out_bf16;
  key.align_a = alignment_of(A); key.align_b = alignment_of(B); key.align_c = alignment_of(C);
  gemm_entry *e = gemm_plan(&key);
  float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  if (e->lt) {
    FF_CUBLAS_CHECK(cublasLtMatmul(g.lt, e->op, &alpha, A, e->a, B, e->b, &beta, C, e->c, C, e->c,
                                   &e->algo, g.workspace, WORKSPACE_BYTES, g.stream));
    return;
  }
  cudaDataType_t operand = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  FF_CUBLAS_CHECK(cublasGemmEx(g.blas, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                               m, n, k, &alpha, A, operand, lda, B, operand, ldb, &beta, C,
                               out_bf16 ? CUDA_R_16BF : CUDA_R_32F, ldc, gemm_compute(bf16),
                               CUBLAS_GEMM_DEFAULT));
}

/* Row-major X(r, c) is column-major Xᵀ(c, r) with ld c, so each row-major product below is
 * written as its transpose. */

/* out(N, Out) = inp(N, In) · w(Out, In)ᵀ  ⇔  outᵀ(Out, N) = w · inpᵀ; operands fp32, or bf16
 * when `bf16`; out fp32, or bf16 when `out_bf16` */
static void matmul_forward(void *out, const void *inp, const void *w, int N, int In, int Out,
                           bool bf16, bool out_bf16) {
  if (N <= 0 || Out <= 0) return;
  if (In <= 0) {
    cuda_zero(out, (size_t)N * (size_t)Out * (out_bf16 ? 2 : 4));
    return;
  }
  int t = op_begin(OP_MATMUL);
  gemm(1, 0, Out, N, In, w, In, inp, In, false, out, Out, bf16, out_bf16);
  op_end(t);
}

/* dinp(N, In) = dout · w (+= with `add`)  ⇔  dinpᵀ(In, N) = wᵀ · doutᵀ;
 * dw(Out, In) += doutᵀ · inp  ⇔  dwᵀ(In, Out) += inpᵀ · dout */
static void matmul_backward(float *dinp, float *dw, const void *dout, const void *inp,
                            const void *w, int N, int In, int Out, bool bf16, bool add) {
  if (N <= 0 || In <= 0) return;
  if (Out <= 0) {
    if (dinp && !add) cuda_zero(dinp, (size_t)N * (size_t)In * sizeof *dinp);
    return;
  }
  int t = op_begin(OP_MATMUL);
  if (dinp) gemm(0, 0, In, N, Out, w, In, dout, Out, add, dinp, In, bf16);
  if (dw) gemm(0, 1, In, Out, N, inp, In, dout, Out, true, dw, In, bf16);
  op_end(t);
}

static void matmul_fwd(float *out, const float *inp, const float *w, int N, int In, int Out) {
  matmul_forward(out, inp, w, N, In, Out, false, false);
}

static void matmul_bwd(float *dinp, float *dw, const float *dout, const float *inp,
                       const float *w, int N, int In, int Out) {
  matmul_backward(dinp, dw, dout, inp, w, N, In, Out, false, false);
}

/* The same products on bf16 operands: tensor cores, fp32 accumulation, fp32 outputs. */
static void matmul_fwd_bf16(float *out, const uint16_t *inp, const uint16_t *w, int N, int In,
                            int Out) {
  matmul_forward(out, inp, w, N, In, Out, true, false);
}

static void matmul_fwd_bf16_rounded(uint16_t *out, const uint16_t *inp, const uint16_t *w, int N,
                                    int In, int Out) {
  matmul_forward(out, inp, w, N, In, Out, true, true);
}

static void matmul_bwd_bf16(float *dinp, float *dw, const uint16_t *dout, const uint16_t *inp,
                            const uint16_t *w, int N, int In, int Out) {
  matmul_backward(dinp, dw, dout, inp, w, N, In, Out, true, false);
}

static void matmul_bwd_bf16_acc(float *dinp, float *dw, const uint16_t *dout, const uint16_t *inp,
                                const uint16_t *w, int N, int In, int Out) {
  matmul_backward(dinp, dw, dout, inp, w, N, In, Out, true, true);
}

/* The attention that runs under the current math. */
static attention_kind attention_now(void) {
  if (g.attention != ATTENTION_DEFAULT) return g.attention;
  return g.math == FF_MATH_BF16 ? ATTENTION_GEMM : ATTENTION_FUSED;
}

static bool tensor_attention(int D, int Hq) {
  return attention_now() == ATTENTION_TENSOR && g.math == FF_MATH_BF16 && Hq > 0 &&
         ff_cuda_attention_tc_supports(D);
}

static void attention_fwd(float *out, float *lse, const float *q, const float *k, const float *v,
                          int B, int S, int Hq, int Hkv, int D, int q_first, int kv_first,
                          int group) {
  if (Hq > 0) ff_cuda_attention_check_gqa(Hq, Hkv, q_first, kv_first, group);
  int t = op_begin(OP_ATTENTION);
  if (attention_now() == ATTENTION_GEMM)
    ff_cuda_attention_gemm_fwd(g.blas, gemm_compute(false), out, lse, q, k, v, B, S, Hq, Hkv, D,
                               q_first, kv_first, group);
  else if (tensor_attention(D, Hq))
    ff_cuda_attention_tc_fwd(out, lse, q, k, v, B, S, Hq, Hkv, D, q_first, kv_first, group);
  else
    ff_cuda_attention_fwd(out, lse, q, k, v, B, S, Hq, Hkv, D, q_first, kv_first, group);
  op_end(t);
}

static void attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *out,
                          const float *lse, const float *q, const float *k, const float *v, int B,
                          int S, int Hq, int Hkv, int D, int q_first, int kv_first, int group) {
  if (Hq > 0) ff_cuda_attention_check_gqa(Hq, Hkv, q_first, kv_first, group);
  int t = op_begin(OP_ATTENTION);
  if (attention_now() == ATTENTION_GEMM)
    ff_cuda_attention_gemm_bwd(g.blas, gemm_compute(false), dq, dk, dv, dout, out, lse, q, k, v,
                               B, S, Hq, Hkv, D, q_first, kv_first, group);
  else if (tensor_attention(D, Hq))
    ff_cuda_attention_tc_bwd(dq, dk, dv, dout, out, lse, q, k, v, B, S, Hq, Hkv, D, q_first,
                             kv_first, group);
  else
    ff_cuda_attention_bwd(dq, dk, dv, dout, out, lse, q, k, v, B, S, Hq, Hkv, D, q_first, kv_first,
                          group);
  op_end(t);
}

/* On bf16 q, k, v (and out): the tensor-core kernels read them as they are; the other two
 * attentions compute from widened copies in the caller's work room (ff_attention_widened.c),
 * through the table below (so these two are defined after it). */
static void attention_fwd_bf16(uint16_t *out, float *lse, const uint16_t *q, const uint16_t *k,
                               const uint16_t *v, int B, int S, int Hq, int Hkv, int D,
                               int q_first, int kv_first, int group, float *work);
static void attention_bwd_bf16(float *dq, float *dk, float *dv, const float *dout,
                               const uint16_t *out, const float *lse, const uint16_t *q,
                               const uint16_t *k, const uint16_t *v, int B, int S, int Hq,
                               int Hkv, int D, int q_first, int kv_first, int group, float *work);

/* ---- embedding -------------------------------------------------------------------------- */

static void embedding_fwd(float *out, const int32_t *tokens, const float *table, int N, int C,
                          int vocab_first, int vocab_end) {
  if (N <= 0 || C <= 0) return;
  embedding_fwd_kernel<<<N, THREADS, 0, g.stream>>>(out, tokens, table, C, vocab_first, vocab_end);
  FF_CUDA_LAUNCHED("embedding_fwd");
}

static void embedding_bwd(float *dtable, const float *dout, const int32_t *tokens, int N, int C,
                          int vocab_first, int vocab_end) {
  if (N <= 0 || C <= 0) return;
  dim3 grid((unsigned)((C + THREADS - 1) / THREADS), EMBED_BUCKETS);
  embedding_bwd_kernel<<<grid, THREADS, 0, g.stream>>>(dtable, dout, tokens, N, C, vocab_first,
                                                       vocab_end);
  FF_CUDA_LAUNCHED("embedding_bwd");
}

/* ---- RMSNorm ---------------------------------------------------------------------------- */

static void rmsnorm_fwd(float *out, float *rstd, const float *inp, const float *w, int N, int C,
                        float eps) {
  if (N <= 0 || C <= 0) return;
  rmsnorm_fwd_kernel<<<N, THREADS, 0, g.stream>>>(out, rstd, inp, w, C, eps);
  FF_CUDA_LAUNCHED("rmsnorm_fwd");
}

static void rmsnorm_fwd_bf16(uint16_t *out, float *rstd, const float *inp, const float *w, int N,
                             int C, float eps) {
  if (N <= 0 || C <= 0) return;
  rmsnorm_fwd_kernel<<<N, THREADS, 0, g.stream>>>(out, rstd, inp, w, C, eps);
  FF_CUDA_LAUNCHED("rmsnorm_fwd_bf16");
}

/* add: dinp += instead of =; TI: inp's type */
template <typename TI>
static void rmsnorm_backward(float *dinp, float *dw, const float *dout, const TI *inp,
                             const float *w, const float *rstd, int N, int C, bool add) {
  if (N <= 0 || C <= 0) return;
  if (add)
    rmsnorm_bwd_inp_kernel<true><<<N, THREADS, 0, g.stream>>>(dinp, dout, inp, w, rstd, C);
  else
    rmsnorm_bwd_inp_kernel<false><<<N, THREADS, 0, g.stream>>>(dinp, dout, inp, w, rstd, C);
  FF_CUDA_LAUNCHED("rmsnorm_bwd_inp");
  unsigned blocks = (unsigned)((C + FF_WARP - 1) / FF_WARP);
  rmsnorm_bwd_w_kernel<<<blocks, dim3(FF_WARP, RMS_W_ROWS), 0, g.stream>>>(dw, dout, inp, rstd, N,
                                                                           C);
  FF_CUDA_LAUNCHED("rmsnorm_bwd_w");
}

static void rmsnorm_bwd(float *dinp, float *dw, const float *dout, const float *inp,
                        const float *w, const float *rstd, int N, int C) {
  rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C, false);
}

static void rmsnorm_bwd_acc(float *dinp, float *dw, const float *dout, const float *inp,
                            const float *w, const float *rstd, int N, int C) {
  rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C, true);
}

static void rmsnorm_bwd_acc_bf16(float *dinp, float *dw, const float *dout, const uint16_t *inp,
                                 const float *w, const float *rstd, int N, int C) {
  rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C, true);
}

/* ---- RoPE ------------------------------------------------------------------------------- */

static void rope(float *x, int B, int S, int H, int D, float theta, float sign) {
  int64_t pairs = (int64_t)B * S * H * (D / 2);
  if (pairs <= 0) return;
  rope_kernel<<<ff_grid_for(pairs, THREADS), THREADS, 0, g.stream>>>(x, S, H, D, theta, sign, pairs);
  FF_CUDA_LAUNCHED("rope");
}

static void rope_fwd(float *x, int B, int S, int H, int D, float theta) { rope(x, B, S, H, D, theta, 1.0f); }
static void rope_bwd(float *dx, int B, int S, int H, int D, float theta) { rope(dx, B, S, H, D, theta, -1.0f); }

static void rope_bf16(uint16_t *out, const float *x, int B, int S, int H, int D, float theta,
                      float sign) {
  int64_t pairs = (int64_t)B * S * H * (D / 2);
  if (pairs <= 0) return;
  rope_out_kernel<<<ff_grid_for(pairs, THREADS), THREADS, 0, g.stream>>>(out, x, S, H, D, theta,
                                                                          sign, pairs);
  FF_CUDA_LAUNCHED("rope_bf16");
}

static void rope_fwd_bf16(uint16_t *out, float *x, int B, int S, int H, int D, float theta) {
  rope_bf16(out, x, B, S, H, D, theta, 1.0f);
}

static void rope_bwd_bf16(uint16_t *out, float *dx, int B, int S, int H, int D, float theta) {
  rope_bf16(out, dx, B, S, H, D, theta, -1.0f);
}

/* ---- elementwise ------------------------------------------------------------------------ */

#define LAUNCH_1D(kernel, n, ...)                                                              \
  do {                                                                                         \
    if ((n) > 0) {                                                                             \
      kernel<<<ff_grid_for((n), THREADS), THREADS, 0, g.stream>>>(__VA_ARGS__);                \
      FF_CUDA_LAUNCHED(#kernel);                                                               \
    }                                                                                          \
  } while (0)

static void swiglu_fwd(float *out, const float *gate, const float *up, int64_t n) {
  LAUNCH_1D(swiglu_fwd_kernel, n, out, gate, up, n);
}
static void swiglu_bwd(float *dgate, float *dup, const float *dout, const float *gate,
                       const float *up, int64_t n) {
  LAUNCH_1D(swiglu_bwd_kernel, n, dgate, dup, dout, gate, up, n);
}

static void swiglu_fwd_bf16(uint16_t *out, const uint16_t *gate, const uint16_t *up, int64_t n) {
  LAUNCH_1D(swiglu_fwd_kernel, n, out, gate, up, n);
}
static void swiglu_bwd_bf16(uint16_t *dgate, uint16_t *dup, const float *dout,
                            const uint16_t *gate, const uint16_t *up, int64_t n) {
  LAUNCH_1D(swiglu_bwd_kernel, n, dgate, dup, dout, gate, up, n);
}
static void add(float *out, const float *a, const float *b, int64_t n) {
  LAUNCH_1D(add_kernel, n, out, a, b, n);
}
static void accumulate(float *out, const float *a, int64_t n) {
  LAUNCH_1D(accumulate_kernel, n, out, a, n);
}
static void scale(float *x, float s, int64_t n) { LAUNCH_1D(scale_kernel, n, x, s, n); }

/* ---- cross-entropy ---------------------------------------------------------------------- */

static void ce_row_max(float *row_max, const float *logits, int N, int V) {
  if (N <= 0) return;
  ce_row_max_kernel<<<N, THREADS, 0, g.stream>>>(row_max, logits, V);
  FF_CUDA_LAUNCHED("ce_row_max");
}

static void ce_row_sum(float *row_sum, const float *logits, const float *row_max, int N, int V) {
  if (N <= 0) return;
  ce_row_sum_kernel<<<N, THREADS, 0, g.stream>>>(row_sum, logits, row_max, V);
  FF_CUDA_LAUNCHED("ce_row_sum");
}

static void ce_loss_grad(float *loss, float *dlogits, const float *logits, const int32_t *targets,
                         const float *row_max, const float *row_sum, int N, int V, int vocab_first,
                         float scale) {
  if (N <= 0) return;
  ce_loss_grad_kernel<<<N, THREADS, 0, g.stream>>>(loss, dlogits, logits, targets, row_max,
                                                   row_sum, V, vocab_first, scale);
  FF_CUDA_LAUNCHED("ce_loss_grad");
}

static void ce_loss_grad_bf16(float *loss, uint16_t *dlogits, const float *logits,
                              const int32_t *targets, const float *row_max, const float *row_sum,
                              int N, int V, int vocab_first, float scale) {
  if (N <= 0) return;
  ce_loss_grad_kernel<<<N, THREADS, 0, g.stream>>>(loss, dlogits, logits, targets, row_max,
                                                   row_sum, V, vocab_first, scale);
  FF_CUDA_LAUNCHED("ce_loss_grad_bf16");
}

/* ---- optimizer -------------------------------------------------------------------------- */

/* The same update as the CPU backend's, its step-dependent factors computed the same way. */
static void adamw(float *param, const float *grad, float *m, float *v, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int64_t step,
                  float grad_scale) {
  ff_adamw_factors f = ff_adamw_factors_of(lr, beta1, beta2, weight_decay, step);
  LAUNCH_1D(adamw_kernel, n, param, grad, m, v, n, beta1, beta2, eps, f.decay, f.step_size,
            f.bc2_sqrt, grad_scale);
}

static double sum_squares(const float *x, int64_t n) {
  if (n <= 0) return 0.0;
  sumsq_partial_kernel<<<SUMSQ_BLOCKS, THREADS, 0, g.stream>>>(g.sumsq_partial, x, n);
  FF_CUDA_LAUNCHED("sumsq_partial");
  sumsq_final_kernel<<<1, THREADS, 0, g.stream>>>(g.sumsq_partial, SUMSQ_BLOCKS);
  FF_CUDA_LAUNCHED("sumsq_final");
  double result = 0.0;
  cuda_copy(&result, g.sumsq_partial + SUMSQ_BLOCKS, sizeof result);
  return result;
}

/* ---- bf16 storage: the CPU backend's bit operations, so both round alike ------------------ */

static void to_bf16(uint16_t *dst, const float *src, int64_t n) {
  LAUNCH_1D(to_bf16_kernel, n, dst, src, n);
}

static void from_bf16(float *dst, const uint16_t *src, int64_t n) {
  LAUNCH_1D(from_bf16_kernel, n, dst, src, n);
}

/* ---- the table and its set-up ----------------------------------------------------------- */

static const ff_kernels cuda_kernels = {
    /* .name = */ "cuda",
    /* .host_memory = */ false,
    cuda_alloc, cuda_release, cuda_zero, cuda_copy, cuda_copy, cuda_alloc_host, cuda_release_host,
    cuda_sync, cuda_memory, cuda_op_seconds, matmul_fwd, matmul_bwd, matmul_fwd_bf16,
    matmul_bwd_bf16, matmul_fwd_bf16_rounded, matmul_bwd_bf16_acc, embedding_fwd, embedding_bwd,
    rmsnorm_fwd, rmsnorm_bwd, rmsnorm_fwd_bf16, rmsnorm_bwd_acc,
    rmsnorm_bwd_acc_bf16, rope_fwd, rope_bwd, rope_fwd_bf16,
    rope_bwd_bf16, attention_fwd, attention_bwd, attention_fwd_bf16, attention_bwd_bf16,
    swiglu_fwd, swiglu_bwd, swiglu_fwd_bf16, swiglu_bwd_bf16, add, accumulate, scale, ce_row_max,
    ce_row_sum, ce_loss_grad, ce_loss_grad_bf16, adamw, sum_squares, cuda_copy_rows, to_bf16,
    from_bf16,
};

static void attention_fwd_bf16(uint16_t *out, float *lse, const uint16_t *q, const uint16_t *k,
                               const uint16_t *v, int B, int S, int Hq, int Hkv, int D,
                               int q_first, int kv_first, int group, float *work) {
  if (!tensor_attention(D, Hq)) {
    ff_attention_fwd_widened(&cuda_kernels, out, lse, q, k, v, B, S, Hq, Hkv, D, q_first,
                             kv_first, group, work);
    return;
  }
  ff_cuda_attention_check_gqa(Hq, Hkv, q_first, kv_first, group);
  int t = op_begin(OP_ATTENTION);
  ff_cuda_attention_tc_fwd_bf16(out, lse, q, k, v, B, S, Hq, Hkv, D, q_first, kv_first, group);
  op_end(t);
}

static void attention_bwd_bf16(float *dq, float *dk, float *dv, const float *dout,
                               const uint16_t *out, const float *lse, const uint16_t *q,
                               const uint16_t *k, const uint16_t *v, int B, int S, int Hq,
                               int Hkv, int D, int q_first, int kv_first, int group, float *work) {
  if (!tensor_attention(D, Hq)) {
    ff_attention_bwd_widened(&cuda_kernels, dq, dk, dv, dout, out, lse, q, k, v, B, S, Hq, Hkv,
                             D, q_first, kv_first, group, work);
    return;
  }
  ff_cuda_attention_check_gqa(Hq, Hkv, q_first, kv_first, group);
  int t = op_begin(OP_ATTENTION);
  ff_cuda_attention_tc_bwd_bf16(dq, dk, dv, dout, out, lse, q, k, v, B, S, Hq, Hkv, D, q_first,
                                kv_first, group);
  op_end(t);
}

static bool setup_failed(cudaError_t err, const char *what, char *why, size_t why_cap) {
  if (err == cudaSuccess) return false;
  snprintf(why, why_cap, "%s: %s", what, cudaGetErrorString(err));
  cudaGetLastError();
  return true;
}

/* The attention asked for by ff_kernels_cuda_attention, or under AUTO by FF_ATTENTION. */
static ff_kernel_attention requested_attention = FF_KERNEL_ATTENTION_AUTO;

static attention_kind chosen_attention(void) {
  switch (requested_attention) {
  case FF_KERNEL_ATTENTION_TENSOR: return ATTENTION_TENSOR;
  case FF_KERNEL_ATTENTION_FUSED: return ATTENTION_FUSED;
  case FF_KERNEL_ATTENTION_GEMM: return ATTENTION_GEMM;
  case FF_KERNEL_ATTENTION_AUTO: break;
  }
  const char *attention = getenv("FF_ATTENTION");
  if (attention && strcmp(attention, "tensor") && strcmp(attention, "gemm") &&
      strcmp(attention, "fused"))
    fprintf(stderr, "ffrun: FF_ATTENTION=%s is none of tensor, fused, gemm; using the default\n",
            attention);
  return attention && strcmp(attention, "gemm") == 0     ? ATTENTION_GEMM
         : attention && strcmp(attention, "fused") == 0  ? ATTENTION_FUSED
         : attention && strcmp(attention, "tensor") == 0 ? ATTENTION_TENSOR
                                                         : ATTENTION_DEFAULT;
}

extern "C" void ff_kernels_cuda_attention(ff_kernel_attention a) {
  requested_attention = a;
  if (g.ready) g.attention = chosen_attention();
}

extern "C" const ff_kernels *ff_kernels_cuda(int device, ff_kernel_math math,
                                             void (*on_fatal)(int status), char *why,
                                             size_t why_cap) {
  if (g.ready) { /* the same backend; a new math forgets the matmul plans made for the old one */
    if (math != g.math) {
      for (int i = 0; i < g.n_gemm; i++) {
        cublasLtMatrixLayoutDestroy(g.gemm[i].a);
        cublasLtMatrixLayoutDestroy(g.gemm[i].b);
        cublasLtMatrixLayoutDestroy(g.gemm[i].c);
        cublasLtMatmulDescDestroy(g.gemm[i].op);
      }
      memset(g.gemm, 0, sizeof g.gemm);
      g.n_gemm = 0;
      g.math = math;
    }
    return &cuda_kernels;
  }
  int count = 0;
  if (setup_failed(cudaGetDeviceCount(&count), "cudaGetDeviceCount", why, why_cap)) return NULL;
  if (device < 0 || device >= count) {
    snprintf(why, why_cap, "GPU %d asked for, %d answer%s", device, count, count == 1 ? "s" : "");
    return NULL;
  }
  bool failed =
      setup_failed(cudaSetDevice(device), "cudaSetDevice", why, why_cap) ||
      setup_failed(cudaStreamCreateWithFlags(&g.stream, cudaStreamNonBlocking),
                   "cudaStreamCreate", why, why_cap) ||
      setup_failed(cudaMalloc(&g.workspace, WORKSPACE_BYTES), "cudaMalloc (cuBLASLt workspace)",
                   why, why_cap) ||
      setup_failed(cudaMalloc(&g.sumsq_partial, (SUMSQ_BLOCKS + 1) * sizeof(double)),
                   "cudaMalloc (reduction scratch)", why, why_cap);
  int events = 0; /* pairs made */
  while (!failed && events < OP_RING) {
    failed = setup_failed(cudaEventCreate(&g.op_start[events]), "cudaEventCreate", why, why_cap);
    if (!failed && setup_failed(cudaEventCreate(&g.op_stop[events]), "cudaEventCreate", why, why_cap)) {
      cudaEventDestroy(g.op_start[events]);
      failed = true;
    }
    if (!failed) events++;
  }
  bool lt = !failed && cublasLtCreate(&g.lt) == CUBLAS_STATUS_SUCCESS;
  bool blas = lt && cublasCreate(&g.blas) == CUBLAS_STATUS_SUCCESS;
  if (!failed && (!blas || cublasSetStream(g.blas, g.stream) != CUBLAS_STATUS_SUCCESS)) {
    snprintf(why, why_cap, "cuBLAS could not be initialised on GPU %d", device);
    failed = true;
  }
  if (failed) { /* give back what was made, so a fallback to the CPU starts clean */
    if (blas) cublasDestroy(g.blas);
    if (lt) cublasLtDestroy(g.lt);
    for (int i = 0; i < events; i++) {
      cudaEventDestroy(g.op_start[i]);
      cudaEventDestroy(g.op_stop[i]);
    }
    if (g.sumsq_partial) cudaFree(g.sumsq_partial);
    if (g.workspace) cudaFree(g.workspace);
    if (g.stream) cudaStreamDestroy(g.stream);
    cudaGetLastError();
    g.sumsq_partial = NULL;
    g.workspace = NULL;
    g.stream = NULL;
    return NULL;
  }
  g.device = device;
  g.math = math;
  int optin = 0;
  cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  g.shared_limit = optin > 0 ? (size_t)optin : 48 * 1024;
  g.attention = chosen_attention();
  g.on_fatal = on_fatal;
  g.ready = true;
  return &cuda_kernels;
}
