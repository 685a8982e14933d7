/* ff_kernels.h — the compute backends' one interface: a table of functions per backend
 * (kernels/cpu in C over BLAS, kernels/cuda in CUDA C), so the model code in executor/ never
 * knows which one runs. Every operation the Llama decoder needs has a forward and a backward.
 *
 * Conventions (the same on every backend):
 *  - Tensors are fp32 (float), but where a parameter is uint16_t: a bf16 tensor, the bit
 *    patterns to_bf16 makes. The _bf16 forms are what bf16 plans run: each computes in fp32 what
 *    its fp32 form computes on the same values and rounds a bf16 output as to_bf16 rounds.
 *  - Activations are row-major (N, C): N = B·S tokens of a micro-batch, C channels.
 *  - Weights are (out, in) like torch.nn.Linear: y = x·Wᵀ.
 *  - Attention tensors are (B, S, H, D): token-major, then head, then head dimension.
 *  - Backward functions ACCUMULATE into weight gradients (+=, so micro-batches accumulate) and
 *    OVERWRITE input gradients (=), unless a name says otherwise.
 *  - Shards: a rank may hold a contiguous range of heads, kv heads, FFN columns or vocabulary
 *    rows; kernels work on the local range and take the global offsets where the result depends
 *    on them (RoPE does not; GQA's query-to-kv mapping and vocabulary rows do).
 * Nothing here allocates except `alloc`; nothing prints. */
#ifndef FF_KERNELS_H
#define FF_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What a backend's allocations hold now and at most, and (on a GPU) what the device reports. */
typedef struct ff_kernel_memory {
  int64_t allocated_bytes, peak_bytes;           /* through alloc/release */
  int64_t device_used_bytes, device_total_bytes; /* whole device, all processes; 0 on the CPU */
} ff_kernel_memory;

/* How the CUDA backend's fp32 matmuls and attention compute: fp32 on CUDA cores, or bf16
 * tensor cores with fp32 accumulation (fp32 operands rounded to bf16 inside cuBLAS). The bf16
 * matmuls below take bf16 operands and run on tensor cores under either. */
typedef enum ff_kernel_math { FF_MATH_FP32, FF_MATH_BF16 } ff_kernel_math;

typedef struct ff_kernels {
  const char *name; /* "cpu", "cuda" */
  bool host_memory; /* buffers from alloc are ordinary host memory the caller may touch */

  /* Memory of the backend (host memory on the CPU backend). Copies are ordered after the work
   * already issued; to_host returns once the data is on the host. */
  void *(*alloc)(size_t bytes);      /* zero-filled; NULL on failure */
  void (*release)(void *p);
  void (*zero)(void *p, size_t bytes);
  void (*to_device)(void *dst, const void *host_src, size_t bytes);
  void (*to_host)(void *host_dst, const void *src, size_t bytes);
  /* Host memory for staging transfers (page-locked on the CUDA backend); zero-filled. */
  void *(*alloc_host)(size_t bytes);
  void (*release_host)(void *p);
  /* Wait until all issued work has finished (timers call this). */
  void (*sync)(void);
  void (*memory)(ff_kernel_memory *out);
  /* Seconds spent in matmuls and in attention since the backend started (on the GPU, measured
   * with events around each operation; complete once the work has been waited for). */
  void (*op_seconds)(double *matmul_seconds, double *attention_seconds);

  /* out(N, Out) = inp(N, In) · w(Out, In)ᵀ */
  void (*matmul_fwd)(float *out, const float *inp, const float *w, int N, int In, int Out);
  /* dinp(N, In) = dout(N, Out) · w (overwritten; skipped when dinp is NULL);
   * dw(Out, In) += dout(N, Out)ᵀ · inp(N, In) */
  void (*matmul_bwd)(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                     int N, int In, int Out);
  /* The same two on bf16 operands (bit patterns as to_bf16 makes them), products accumulated
   * in fp32 into fp32 outputs: what bf16 plans run, with a bf16 copy of the weights, the
   * inputs as saved for the backward and the output gradients rounded to bf16. */
  void (*matmul_fwd_bf16)(float *out, const uint16_t *inp, const uint16_t *w, int N, int In,
                          int Out);
  void (*matmul_bwd_bf16)(float *dinp, float *dw, const uint16_t *dout, const uint16_t *inp,
                          const uint16_t *w, int N, int In, int Out);
  /* matmul_fwd_bf16 with its fp32 result rounded to bf16 (as to_bf16 rounds) on the way out:
   * for outputs bf16 plans keep only in bf16 (gate, up) */
  void (*matmul_fwd_bf16_rounded)(uint16_t *out, const uint16_t *inp, const uint16_t *w, int N,
                                  int In, int Out);
  /* matmul_bwd_bf16 adding its input gradient to dinp (+=): where the model sums the input
   * gradients of matmuls that share an input (q, k, v; gate, up) */
  void (*matmul_bwd_bf16_acc)(float *dinp, float *dw, const uint16_t *dout, const uint16_t *inp,
                              const uint16_t *w, int N, int In, int Out);

  /* out(N, C) = table[tok - vocab_first] for tokens in [vocab_first, vocab_end), else 0 (a
   * vocabulary shard; the TP group sums the partial rows). table is (vocab_end-vocab_first, C). */
  void (*embedding_fwd)(float *out, const int32_t *tokens, const float *table, int N, int C,
                        int vocab_first, int vocab_end);
  /* dtable[tok - vocab_first] += dout for tokens in the shard */
  void (*embedding_bwd)(float *dtable, const float *dout, const int32_t *tokens, int N, int C,
                        int vocab_first, int vocab_end);

  /* out = inp / sqrt(mean(inp²) + eps) · w per row; rstd(N) saved for backward */
  void (*rmsnorm_fwd)(float *out, float *rstd, const float *inp, const float *w, int N, int C,
                      float eps);
  /* dinp = (overwritten), dw += */
  void (*rmsnorm_bwd)(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                      const float *rstd, int N, int C);
  /* rmsnorm_fwd writing its output in bf16, rounded as to_bf16 rounds the fp32 result */
  void (*rmsnorm_fwd_bf16)(uint16_t *out, float *rstd, const float *inp, const float *w, int N,
                           int C, float eps);
  /* rmsnorm_bwd adding its input gradient to dinp (+=): the residual stream's gradient */
  void (*rmsnorm_bwd_acc)(float *dinp, float *dw, const float *dout, const float *inp,
                          const float *w, const float *rstd, int N, int C);
  /* the same reading inp in bf16: the residual stream as bf16 plans keep it */
  void (*rmsnorm_bwd_acc_bf16)(float *dinp, float *dw, const float *dout, const uint16_t *inp,
                               const float *w, const float *rstd, int N, int C);

  /* Rotary embedding in place on x(B, S, H, D), rotating pairs (2i, 2i+1) by angle
   * pos · theta^(-2i/D), pos = the token's index in its sequence. Backward rotates back. */
  void (*rope_fwd)(float *x, int B, int S, int H, int D, float theta);
  void (*rope_bwd)(float *dx, int B, int S, int H, int D, float theta);
  /* rope_fwd's rotation of x written to out in bf16 (rounded as to_bf16 rounds); x is left
   * unspecified (a backend may rotate it in place) */
  void (*rope_fwd_bf16)(uint16_t *out, float *x, int B, int S, int H, int D, float theta);
  /* rope_bwd's rotation likewise: dx's rotation back, written to out in bf16 */
  void (*rope_bwd_bf16)(uint16_t *out, float *dx, int B, int S, int H, int D, float theta);

  /* Causal attention of local query heads q(B, S, Hq, D) over local kv heads k, v(B, S, Hkv, D):
   * local query head i is global head q_first + i and uses global kv head (q_first + i) / group,
   * i.e. local kv head (q_first + i) / group - kv_first. Scale 1/sqrt(D).
   * out(B, S, Hq, D); lse(B, Hq, S) = log-sum-exp of each score row, saved for backward. */
  void (*attention_fwd)(float *out, float *lse, const float *q, const float *k, const float *v,
                        int B, int S, int Hq, int Hkv, int D, int q_first, int kv_first, int group);
  /* dq (overwritten), dk and dv (overwritten: a kv head shared by several query heads sums
   * their contributions) */
  void (*attention_bwd)(float *dq, float *dk, float *dv, const float *dout, const float *out,
                        const float *lse, const float *q, const float *k, const float *v, int B,
                        int S, int Hq, int Hkv, int D, int q_first, int kv_first, int group);
  /* The same on bf16 q, k, v (and out in the backward), as bf16 plans keep them, the forward
   * writing out in bf16 (its fp32 result rounded as to_bf16 rounds). work: fp32 room for q, k, v
   * and out in that order (2·B·S·Hq·D + 2·B·S·Hkv·D floats) where a backend may compute from
   * fp32 copies; left unspecified. */
  void (*attention_fwd_bf16)(uint16_t *out, float *lse, const uint16_t *q, const uint16_t *k,
                             const uint16_t *v, int B, int S, int Hq, int Hkv, int D, int q_first,
                             int kv_first, int group, float *work);
  void (*attention_bwd_bf16)(float *dq, float *dk, float *dv, const float *dout,
                             const uint16_t *out, const float *lse, const uint16_t *q,
                             const uint16_t *k, const uint16_t *v, int B, int S, int Hq, int Hkv,
                             int D, int q_first, int kv_first, int group, float *work);

  /* out = silu(gate) · up, elementwise over n; backward overwrites dgate, dup */
  void (*swiglu_fwd)(float *out, const float *gate, const float *up, int64_t n);
  void (*swiglu_bwd)(float *dgate, float *dup, const float *dout, const float *gate,
                     const float *up, int64_t n);
  /* The same two on bf16 gate and up, writing bf16 (the fp32 results rounded as to_bf16
   * rounds): bf16 plans keep gate and up in bf16 only, and the SwiGLU product and the gradients
   * of gate and up are matmul operands. */
  void (*swiglu_fwd_bf16)(uint16_t *out, const uint16_t *gate, const uint16_t *up, int64_t n);
  void (*swiglu_bwd_bf16)(uint16_t *dgate, uint16_t *dup, const float *dout,
                          const uint16_t *gate, const uint16_t *up, int64_t n);

  /* out = a + b over n (out may alias a); acc: out += a */
  void (*add)(float *out, const float *a, const float *b, int64_t n);
  void (*accumulate)(float *out, const float *a, int64_t n);
  void (*scale)(float *x, float s, int64_t n);

  /* Softmax cross-entropy over a vocabulary shard, in two passes so a TP group can combine the
   * per-row statistics (max, then sum of exp) across shards between them:
   *  pass 1: row_max(N) = max over the shard's logits(N, V) columns
   *  pass 2 (after the group's row_max is the global max): row_sum(N) = Σ exp(logit - max)
   *  pass 3 (global max and sum): loss(N) += -(logit[target] - max - log sum) for targets in
   *          [vocab_first, vocab_first + V) (the owner of the target adds it), and
   *          dlogits(N, V) = (softmax - onehot) · scale  (overwritten; in place over logits is
   *          allowed). */
  void (*ce_row_max)(float *row_max, const float *logits, int N, int V);
  void (*ce_row_sum)(float *row_sum, const float *logits, const float *row_max, int N, int V);
  void (*ce_loss_grad)(float *loss, float *dlogits, const float *logits, const int32_t *targets,
                       const float *row_max, const float *row_sum, int N, int V, int vocab_first,
                       float scale);
  /* pass 3 writing dlogits in bf16 (the fp32 gradient rounded as to_bf16 rounds), apart from
   * logits: the LM head's matmuls read it so in bf16 plans */
  void (*ce_loss_grad_bf16)(float *loss, uint16_t *dlogits, const float *logits,
                            const int32_t *targets, const float *row_max, const float *row_sum,
                            int N, int V, int vocab_first, float scale);

  /* AdamW with decoupled weight decay and bias correction (step counts from 1); grad is scaled
   * by grad_scale first (the clipping factor). */
  void (*adamw)(float *param, const float *grad, float *m, float *v, int64_t n, float lr,
                float beta1, float beta2, float eps, float weight_decay, int64_t step,
                float grad_scale);
  /* Σ x² in double precision */
  double (*sum_squares)(const float *x, int64_t n);

  /* rows × width floats from src (rows src_stride floats apart) to dst (dst_stride apart), both
   * backend memory, not overlapping; ordered after the work already issued, like a kernel */
  void (*copy_rows)(float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                    int64_t width, int64_t rows);

  /* bf16 storage of activations: dst(n) = src rounded to the nearest bf16 (ties to even; a NaN
   * stays a NaN), and back (exact). Bit for bit the same on every backend. */
  void (*to_bf16)(uint16_t *dst, const float *src, int64_t n);
  void (*from_bf16)(float *dst, const uint16_t *src, int64_t n);
} ff_kernels;

/* The CPU backend (always present). threads: BLAS threads per rank (1 by default). */
const ff_kernels *ff_kernels_cpu(int threads);
/* The CPU backend saying its memory is not the host's (host_memory false), so that callers take
 * the copying paths a GPU needs: those paths tested where no GPU is. */
const ff_kernels *ff_kernels_cpu_staged(int threads);

/* The CUDA backend on GPU `device` of this process, or NULL with the reason in why (when the
 * build has no CUDA, no GPU answers, or the device cannot be set up). One per process: a second
 * call returns the same table (on the first call's device) with the new math for the matmuls
 * that follow. A failed CUDA call later prints what failed and where, then calls on_fatal(1)
 * (which must not return; NULL: exit(1)). */
const ff_kernels *ff_kernels_cuda(int device, ff_kernel_math math, void (*on_fatal)(int status),
                                  char *why, size_t why_cap);

/* Which attention the CUDA backend runs from now on (docs/executor.md): the tensor-core kernel
 * (under bf16 math and the head dimensions it supports; the fused one otherwise), the fused fp32
 * kernel, or cuBLAS GEMMs around materialised scores. AUTO leaves the choice to the FF_ATTENTION
 * environment variable (tensor, fused, gemm), else cuBLAS under bf16 math and the fused kernel
 * under fp32 math. A build without CUDA has no backend to set. */
typedef enum ff_kernel_attention {
  FF_KERNEL_ATTENTION_AUTO,
  FF_KERNEL_ATTENTION_TENSOR,
  FF_KERNEL_ATTENTION_FUSED,
  FF_KERNEL_ATTENTION_GEMM
} ff_kernel_attention;
void ff_kernels_cuda_attention(ff_kernel_attention a);

/* The CUDA backend's stream (a cudaStream_t) once ff_kernels_cuda has succeeded, else NULL: what
 * a communication backend orders its device collectives on. */
void *ff_kernels_cuda_stream(void);

#ifdef __cplusplus
}
#endif
#endif
