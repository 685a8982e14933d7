/* ff_ops_kernels.cuh — the kernels of the CUDA backend's operations other than matmuls and
 * attention (embedding, RMSNorm, RoPE, SwiGLU and the elementwise ones, cross-entropy, AdamW,
 * the sum of squares, bf16 storage), with the launch shapes and host-side factors their
 * launchers in ff_kernels_cuda.cu use. They are here, apart from the launchers, so that
 * tests/unit/test_cuda_emulated.cc can run these same kernels on the CPU.
 *
 * Every reduction has a fixed shape (no atomics), so a run repeats bit for bit on the same GPU. */
#ifndef FF_OPS_KERNELS_CUH
#define FF_OPS_KERNELS_CUH

#include <math.h>
#include <stdint.h>

#include "ff_cuda_device.cuh"

enum {
  THREADS = 256,
  SUMSQ_BLOCKS = 512, /* fixed: the reduction's order depends on it */
  EMBED_BUCKETS = 32, /* vocabulary rows per column split over this many threads */
  RMS_W_ROWS = 8,     /* rmsnorm_bwd_w_kernel: row lanes per block of 32 columns */
};

/* out(N, C): one row per block */
__global__ void embedding_fwd_kernel(float *out, const int32_t *tokens, const float *table, int C,
                                     int vocab_first, int vocab_end) {
  int n = blockIdx.x, tok = tokens[n];
  bool owned = tok >= vocab_first && tok < vocab_end;
  const float *src = table + (size_t)(owned ? tok - vocab_first : 0) * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x)
    out[(size_t)n * C + c] = owned ? src[c] : 0.0f;
}

/* dtable rows: thread (column c, bucket y) adds, in token order, every dout row whose token
 * falls in bucket y (tok % EMBED_BUCKETS); one writer per element, so no atomics. */
__global__ void embedding_bwd_kernel(float *dtable, const float *dout, const int32_t *tokens,
                                     int N, int C, int vocab_first, int vocab_end) {
  int c = blockIdx.x * blockDim.x + threadIdx.x, bucket = blockIdx.y;
  if (c >= C) return;
  for (int n = 0; n < N; n++) {
    int tok = tokens[n];
    if (tok < vocab_first || tok >= vocab_end || tok % EMBED_BUCKETS != bucket) continue;
    dtable[(size_t)(tok - vocab_first) * C + c] += dout[(size_t)n * C + c];
  }
}

template <typename T>
__global__ void rmsnorm_fwd_kernel(T *out, float *rstd, const float *inp, const float *w, int C,
                                   float eps) {
  const float *x = inp + (size_t)blockIdx.x * C;
  T *o = out + (size_t)blockIdx.x * C;
  float ss = 0.0f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) ss += x[c] * x[c];
  ss = ff_block_reduce(ss, ff_op_sum(), 0.0f);
  float r = 1.0f / sqrtf(ss / (float)C + eps);
  for (int c = threadIdx.x; c < C; c += blockDim.x) ff_store(&o[c], x[c] * r * w[c]);
  if (threadIdx.x == 0) rstd[blockIdx.x] = r;
}

/* dinp = rstd · (dout∘w) − rstd³/C · inp · Σ(dout∘w∘inp), one row per block; ADD: dinp +=
 * instead of =; TI: inp's type (fp32, or bf16: the residual stream as bf16 plans keep it) */
template <bool ADD = false, typename TI = float>
__global__ void rmsnorm_bwd_inp_kernel(float *dinp, const float *dout, const TI *inp,
                                       const float *w, const float *rstd, int C) {
  size_t row = (size_t)blockIdx.x * C;
  const TI *x = inp + row;
  const float *dy = dout + row;
  float s = 0.0f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) s += dy[c] * w[c] * ff_load(&x[c]);
  s = ff_block_reduce(s, ff_op_sum(), 0.0f);
  float r = rstd[blockIdx.x], k = r * r * r * s / (float)C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float g = r * dy[c] * w[c] - k * ff_load(&x[c]);
    dinp[row + c] = ADD ? dinp[row + c] + g : g;
  }
}

/* dw(C) += Σ_n dout∘inp·rstd: block (32 columns × 8 row lanes), the 8 partials summed in order */
template <typename TI = float>
__global__ void rmsnorm_bwd_w_kernel(float *dw, const float *dout, const TI *inp,
                                     const float *rstd, int N, int C) {
  __shared__ float part[RMS_W_ROWS][FF_WARP];
  int c = blockIdx.x * FF_WARP + threadIdx.x;
  float s = 0.0f;
  if (c < C)
    for (int n = threadIdx.y; n < N; n += RMS_W_ROWS)
      s += dout[(size_t)n * C + c] * ff_load(&inp[(size_t)n * C + c]) * rstd[n];
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float total = 0.0f;
    for (int y = 0; y < RMS_W_ROWS; y++) total += part[y][threadIdx.x];
    dw[c] += total;
  }
}

/* One thread per rotation pair; the angle in double, as the CPU backend computes it. In place on
 * x, or (rope_out_kernel) x's rotation written to out, fp32 or bf16. */
template <typename T>
__device__ __forceinline__ void rope_pair(T *out, const float *x, int64_t idx, int S, int H, int D,
                                          float theta, float sign) {
  int half = D / 2;
  int i = (int)(idx % half);
  int64_t row = idx / half; /* (b, s, h) */
  int s = (int)((row / H) % S);
  double inv_freq = pow((double)theta, -2.0 * i / D);
  float cs = (float)cos(s * inv_freq), sn = sign * (float)sin(s * inv_freq);
  int64_t at = row * D + 2 * i;
  float x0 = x[at], x1 = x[at + 1];
  ff_store(&out[at], x0 * cs - x1 * sn);
  ff_store(&out[at + 1], x0 * sn + x1 * cs);
}

template <typename T>
__global__ void rope_out_kernel(T *out, const float *x, int S, int H, int D, float theta,
                                float sign, int64_t pairs) {
  FF_GRID_STRIDE(idx, pairs) rope_pair(out, x, idx, S, H, D, theta, sign);
}

__global__ void rope_kernel(float *x, int S, int H, int D, float theta, float sign, int64_t pairs) {
  FF_GRID_STRIDE(idx, pairs) rope_pair(x, x, idx, S, H, D, theta, sign);
}

__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

/* T: the output type, G: gate's and up's (bf16 plans: both bf16) */
template <typename T, typename G>
__global__ void swiglu_fwd_kernel(T *out, const G *gate, const G *up, int64_t n) {
  FF_GRID_STRIDE(i, n) {
    float gt = ff_load(&gate[i]);
    ff_store(&out[i], gt * sigmoidf_(gt) * ff_load(&up[i]));
  }
}

template <typename T, typename G>
__global__ void swiglu_bwd_kernel(T *dgate, T *dup, const float *dout, const G *gate, const G *up,
                                  int64_t n) {
  FF_GRID_STRIDE(i, n) {
    float gt = ff_load(&gate[i]), sg = sigmoidf_(gt), dy = dout[i], u = ff_load(&up[i]);
    ff_store(&dup[i], dy * gt * sg);
    ff_store(&dgate[i], dy * u * sg * (1.0f + gt * (1.0f - sg)));
  }
}

__global__ void add_kernel(float *out, const float *a, const float *b, int64_t n) {
  FF_GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}

__global__ void accumulate_kernel(float *out, const float *a, int64_t n) {
  FF_GRID_STRIDE(i, n) out[i] += a[i];
}

__global__ void scale_kernel(float *x, float s, int64_t n) { FF_GRID_STRIDE(i, n) x[i] *= s; }

__global__ void ce_row_max_kernel(float *row_max, const float *logits, int V) {
  const float *z = logits + (size_t)blockIdx.x * V;
  float m = -INFINITY;
  for (int j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, z[j]);
  m = ff_block_reduce(m, ff_op_max(), -INFINITY);
  if (threadIdx.x == 0) row_max[blockIdx.x] = m;
}

/* Σ exp(z − max) in double, like the CPU backend: a vocabulary row is long */
__global__ void ce_row_sum_kernel(float *row_sum, const float *logits, const float *row_max,
                                  int V) {
  const float *z = logits + (size_t)blockIdx.x * V;
  float m = row_max[blockIdx.x];
  double s = 0.0;
  for (int j = threadIdx.x; j < V; j += blockDim.x) s += expf(z[j] - m);
  s = ff_block_reduce(s, ff_op_sum(), 0.0);
  if (threadIdx.x == 0) row_sum[blockIdx.x] = (float)s;
}

/* One row per block; dlogits may be logits (fp32), so the target's logit is read before any
 * write; T: dlogits' type (fp32 or bf16) */
template <typename T>
__global__ void ce_loss_grad_kernel(float *loss, T *dlogits, const float *logits,
                                    const int32_t *targets, const float *row_max,
                                    const float *row_sum, int V, int vocab_first, float scale) {
  int n = blockIdx.x;
  const float *z = logits + (size_t)n * V;
  float m = row_max[n], inv_sum = 1.0f / row_sum[n];
  int64_t target = (int64_t)targets[n] - vocab_first;
  bool owned = target >= 0 && target < V;
  if (threadIdx.x == 0 && owned) loss[n] += logf(row_sum[n]) - (z[target] - m);
  if (!dlogits) return;
  __syncthreads();
  T *dz = dlogits + (size_t)n * V;
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    float d = expf(z[j] - m) * inv_sum * scale;
    ff_store(&dz[j], owned && j == target ? d - scale : d);
  }
}

__global__ void adamw_kernel(float *param, const float *grad, float *m, float *v, int64_t n,
                             float beta1, float beta2, float eps, float decay, float step_size,
                             float bc2_sqrt, float grad_scale) {
  float one_minus_b1 = 1.0f - beta1, one_minus_b2 = 1.0f - beta2;
  FF_GRID_STRIDE(i, n) {
    float gr = grad[i] * grad_scale;
    float mi = beta1 * m[i] + one_minus_b1 * gr;
    float vi = beta2 * v[i] + one_minus_b2 * gr * gr;
    m[i] = mi;
    v[i] = vi;
    float p = param[i] * decay;
    param[i] = p - step_size * (mi / (sqrtf(vi) / bc2_sqrt + eps));
  }
}

/* Σ x² in double: SUMSQ_BLOCKS fixed partial sums, then one block adds them in order. */
__global__ void sumsq_partial_kernel(double *partial, const float *x, int64_t n) {
  double s = 0.0;
  FF_GRID_STRIDE(i, n) s += (double)x[i] * x[i];
  s = ff_block_reduce(s, ff_op_sum(), 0.0);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void sumsq_final_kernel(double *partial, int blocks) {
  double s = 0.0;
  for (int i = threadIdx.x; i < blocks; i += blockDim.x) s += partial[i];
  s = ff_block_reduce(s, ff_op_sum(), 0.0);
  if (threadIdx.x == 0) partial[blocks] = s;
}

__global__ void to_bf16_kernel(uint16_t *dst, const float *src, int64_t n) {
  FF_GRID_STRIDE(i, n) dst[i] = ff_bf16_bits(src[i]);
}

__global__ void from_bf16_kernel(float *dst, const uint16_t *src, int64_t n) {
  FF_GRID_STRIDE(i, n) dst[i] = __uint_as_float((uint32_t)src[i] << 16);
}

/* AdamW's step-dependent factors, computed on the host as the CPU backend computes them. */
typedef struct ff_adamw_factors {
  float decay, step_size, bc2_sqrt;
} ff_adamw_factors;

static inline ff_adamw_factors ff_adamw_factors_of(float lr, float beta1, float beta2,
                                                   float weight_decay, int64_t step) {
  ff_adamw_factors f;
  f.decay = (float)(1.0 - (double)lr * weight_decay);
  f.step_size = (float)(lr / (1.0 - pow(beta1, (double)step)));
  f.bc2_sqrt = (float)sqrt(1.0 - pow(beta2, (double)step));
  return f;
}

#endif
