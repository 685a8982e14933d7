/* cuda_bf16.h — the bf16 type of cuda_emu.h: storage and round-to-nearest-even. */
#ifndef FF_CUDA_EMU_BF16_H
#define FF_CUDA_EMU_BF16_H

#include <cstdint>
#include <cstring>

struct __nv_bfloat16 {
  uint16_t bits;
};

inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {(uint16_t)((u >> 16) | 0x40u)}; /* NaN stays NaN */
  u += 0x7fffu + ((u >> 16) & 1u);
  return {(uint16_t)(u >> 16)};
}

inline float emu_bf16_to_float(__nv_bfloat16 h) {
  uint32_t u = (uint32_t)h.bits << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

#endif
