/* ff_attention_widened.h — attention on bf16 q, k, v (and out) computed by a backend's fp32
 * attention from widened copies in the caller's work room, the output rounded back: how the
 * CPU backend runs attention_fwd_bf16 and attention_bwd_bf16, and the CUDA backend wherever its
 * tensor-core kernels do not apply. Arguments as ff_kernels.h's, with the backend's table k
 * (its from_bf16, to_bf16 and fp32 attention). Internal to kernels/. */
#ifndef FF_ATTENTION_WIDENED_H
#define FF_ATTENTION_WIDENED_H

#include "ff_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

void ff_attention_fwd_widened(const ff_kernels *k, uint16_t *out, float *lse, const uint16_t *q,
                              const uint16_t *kk, const uint16_t *v, int B, int S, int Hq,
                              int Hkv, int D, int q_first, int kv_first, int group, float *work);
void ff_attention_bwd_widened(const ff_kernels *k, float *dq, float *dk, float *dv,
                              const float *dout, const uint16_t *out, const float *lse,
                              const uint16_t *q, const uint16_t *kk, const uint16_t *v, int B,
                              int S, int Hq, int Hkv, int D, int q_first, int kv_first, int group,
                              float *work);

#ifdef __cplusplus
}
#endif
#endif
