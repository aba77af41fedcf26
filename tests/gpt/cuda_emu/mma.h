/* tests/gpt/cuda_emu/mma.h — nvcuda::wmma for the emulated build, 16x16x16
 * bf16 fragments with fp32 accumulators as CUDA documents them (row_major:
 * element (r, c) at p[r ld + c]; col_major: at p[c ld + r]; pointers 32-byte
 * aligned, ld a multiple of 8 bf16 / 4 floats). Lane 0 of each warp holds
 * and computes the whole fragment and the other lanes do nothing, so a
 * lane that reads a stored fragment before a __syncwarp reads poison. */
#ifndef GPT_EMU_MMA_H
#define GPT_EMU_MMA_H

#include "emu_device.h"

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void> struct fragment {
  float v[16][16];
};

static inline int lead(const void *p, unsigned ld, unsigned mult) {
  emu_check(((uintptr_t)p & 31) == 0 && ld % mult == 0, "wmma: pointer or ld misaligned");
  return emu_lane() == 0;
}

template <typename Use, typename Layout>
static inline void load_matrix_sync(fragment<Use, 16, 16, 16, __nv_bfloat16, Layout> &f,
                                    const __nv_bfloat16 *p, unsigned ld) {
  if (!lead(p, ld, 8)) return;
  const bool col = std::is_same<Layout, col_major>::value;
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < 16; c++)
      f.v[r][c] = __bfloat162float(col ? p[c * ld + r] : p[r * ld + c]);
}
static inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p,
                                    unsigned ld, layout_t l) {
  if (!lead(p, ld, 4)) return;
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < 16; c++)
      f.v[r][c] = l == mem_col_major ? p[c * ld + r] : p[r * ld + c];
}
static inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f,
                                     unsigned ld, layout_t l) {
  if (!lead(p, ld, 4)) return;
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < 16; c++)
      (l == mem_col_major ? p[c * ld + r] : p[r * ld + c]) = f.v[r][c];
}
template <typename Use, typename T, typename Layout>
static inline void fill_fragment(fragment<Use, 16, 16, 16, T, Layout> &f, float x) {
  if (emu_lane() != 0) return;
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < 16; c++)
      f.v[r][c] = x;
}
/* d = a b + c in fp32 (bf16 products are exact in fp32) */
template <typename LA, typename LB>
static inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
                            const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA> &a,
                            const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB> &b,
                            const fragment<accumulator, 16, 16, 16, float> &c) {
  if (emu_lane() != 0) return;
  float t[16][16];
  for (int r = 0; r < 16; r++)
    for (int n = 0; n < 16; n++) {
      float s = c.v[r][n];
      for (int k = 0; k < 16; k++)
        s += a.v[r][k] * b.v[k][n];
      t[r][n] = s;
    }
  memcpy(d.v, t, sizeof t);
}

} // namespace wmma
} // namespace nvcuda

#endif
