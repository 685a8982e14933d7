/* ff_attention_widened.c — see ff_attention_widened.h. The work room holds q, k, v and out in
 * that order (2·B·S·Hq·D + 2·B·S·Hkv·D floats). */
#include "ff_attention_widened.h"

void ff_attention_fwd_widened(const ff_kernels *k, uint16_t *out, float *lse, const uint16_t *q,
                              const uint16_t *kk, const uint16_t *v, int B, int S, int Hq,
                              int Hkv, int D, int q_first, int kv_first, int group, float *work) {
  int64_t nq = (int64_t)B * S * Hq * D, nk = (int64_t)B * S * Hkv * D;
  float *wq = work, *wk = wq + nq, *wv = wk + nk, *wo = wv + nk;
  k->from_bf16(wq, q, nq);
  k->from_bf16(wk, kk, nk);
  k->from_bf16(wv, v, nk);
  k->attention_fwd(wo, lse, wq, wk, wv, B, S, Hq, Hkv, D, q_first, kv_first, group);
  k->to_bf16(out, wo, nq);
}

void ff_attention_bwd_widened(const ff_kernels *k, float *dq, float *dk, float *dv,
                              const float *dout, const uint16_t *out, const float *lse,
                              const uint16_t *q, const uint16_t *kk, const uint16_t *v, int B,
                              int S, int Hq, int Hkv, int D, int q_first, int kv_first, int group,
                              float *work) {
  int64_t nq = (int64_t)B * S * Hq * D, nk = (int64_t)B * S * Hkv * D;
  float *wq = work, *wk = wq + nq, *wv = wk + nk, *wo = wv + nk;
  k->from_bf16(wq, q, nq);
  k->from_bf16(wk, kk, nk);
  k->from_bf16(wv, v, nk);
  k->from_bf16(wo, out, nq);
  k->attention_bwd(dq, dk, dv, dout, wo, lse, wq, wk, wv, B, S, Hq, Hkv, D, q_first, kv_first,
                   group);
}
