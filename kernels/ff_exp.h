/* ff_exp.h — e^x for the CPU backend's element-wise loops (kernels/cpu/ff_kernels_cpu.c). */
#ifndef FF_EXP_H
#define FF_EXP_H

#include <stdint.h>
#include <string.h>

/* e^x for float x, within 1.2 ulp of the exact value (tests/unit/test_kernels.c), in plain arithmetic and bit moves with no
 * branch and no call, so that a loop of them vectorises (libm's expf is a call per element) and
 * gives the same bits in every lane width: x = n·ln2 + r with n = round(x·log2 e) (adding
 * 1.5·2²³ rounds to the integer) and |r| ≤ ln2/2 (ln2 in two parts, the first exact times any
 * n here), e^r by its Taylor polynomial of degree 7 (truncation below 10⁻⁸ of the result), and
 * 2ⁿ applied as two powers of two so that results down to the subnormals and up to overflow
 * come out as expf gives them: 0 below −104, ∞ above 89; NaN stays NaN. */
static inline float ff_exp_lanes(float x) {
  const float shifter = 12582912.0f; /* 1.5 · 2^23 */
  x = x < -104.0f ? -104.0f : x;
  x = x > 89.0f ? 89.0f : x;
  float t = x * 1.44269504088896341f + shifter;
  float n = t - shifter;
  float r = x - n * 0.693145751953125f; /* ln2's upper bits: exact for |n| ≤ 256 */
  r = r - n * 1.42860682030941723e-6f;  /* the rest of ln2 */
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  uint32_t tb, s_bits[2];
  memcpy(&tb, &t, sizeof tb);
  int32_t ni = (int32_t)(tb - 0x4B400000u); /* n, from t's low mantissa bits */
  ni = ni < -150 ? -150 : ni > 128 ? 128 : ni; /* already so, but for a NaN x */
  int32_t half = ni / 2;
  s_bits[0] = (uint32_t)(half + 127) << 23;
  s_bits[1] = (uint32_t)(ni - half + 127) << 23;
  float s0, s1;
  memcpy(&s0, &s_bits[0], sizeof s0);
  memcpy(&s1, &s_bits[1], sizeof s1);
  return p * s0 * s1;
}

#endif
