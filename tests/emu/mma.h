/* mma.h — WMMA's 16 × 16 × 16 bf16 fragments for cuda_emu.h. Operand fragments hold the whole
 * matrix (every lane of a GPU warp needs all of it for its share of the product); accumulators
 * are computed, loaded and stored by each lane for the elements it owns (cuda_emu.h). Pointers
 * must be 32-byte aligned and pitches a multiple of 16 bytes, as WMMA requires. */
#ifndef FF_CUDA_EMU_MMA_H
#define FF_CUDA_EMU_MMA_H

#include <cstdint>
#include <type_traits>

#include "cuda_bf16.h"
#include "cuda_emu.h"

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  float x[16][16];
};

inline bool emu_owns(int r, int c) { return (r * 16 + c) % 32 == (int)(threadIdx.x % 32); }

inline void emu_check(const void *p, unsigned ld, unsigned elem) {
  emu_require((uintptr_t)p % 32 == 0, "a fragment pointer is not 32-byte aligned");
  emu_require(ld * elem % 16 == 0, "a fragment pitch is not a multiple of 16 bytes");
}

template <typename Use, typename Layout>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, __nv_bfloat16, Layout> &f,
                             const __nv_bfloat16 *p, unsigned ld) {
  emu_check(p, ld, 2);
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < 16; c++)
      f.x[r][c] = emu_bf16_to_float(std::is_same<Layout, row_major>::value ? p[r * ld + c]
                                                                          : p[c * ld + r]);
}

typedef fragment<accumulator, 16, 16, 16, float> emu_acc;

inline void fill_fragment(emu_acc &f, float v) {
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < 16; c++)
      if (emu_owns(r, c)) f.x[r][c] = v;
}

inline void load_matrix_sync(emu_acc &f, const float *p, unsigned ld, layout_t l) {
  emu_check(p, ld, 4);
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < 16; c++)
      if (emu_owns(r, c)) f.x[r][c] = l == mem_row_major ? p[r * ld + c] : p[c * ld + r];
}

inline void store_matrix_sync(float *p, const emu_acc &f, unsigned ld, layout_t l) {
  emu_check(p, ld, 4);
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < 16; c++)
      if (emu_owns(r, c)) (l == mem_row_major ? p[r * ld + c] : p[c * ld + r]) = f.x[r][c];
}

template <typename LA, typename LB>
inline void mma_sync(emu_acc &d, const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA> &a,
                     const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB> &b,
                     const emu_acc &c) {
  for (int r = 0; r < 16; r++)
    for (int n = 0; n < 16; n++)
      if (emu_owns(r, n)) {
        float s = c.x[r][n];
        for (int k = 0; k < 16; k++) s += a.x[r][k] * b.x[k][n];
        d.x[r][n] = s;
      }
}

} // namespace wmma
} // namespace nvcuda

#endif
