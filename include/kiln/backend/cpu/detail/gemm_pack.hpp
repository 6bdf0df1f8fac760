// kiln/backend/cpu/detail/gemm_pack.hpp — copies blocks of op(A) and op(B) into the micro-panel
// layout the microkernel reads (gemm_kernel.hpp), converting f16/bf16 to float on the way (the
// exact emulation; the vdpbf16ps kernel keeps bf16 and packs with gemm_pack_bf16.hpp).
//
// Both operands are packed by the same routine: a block of `rows` x kc values whose element
// (r, p) sits at src[r * rs + p * cs] becomes panels of R rows, panel-major, each panel k-major
// (dst[panel][p][r]), with the rows past `rows` in the last panel set to zero. For A the rows are
// C's rows (R = MR); for B they are C's columns (R = NR). Transposes only change (rs, cs).
#pragma once

#ifndef KILN_INTERNAL_INCLUDE
#error "kiln/backend/cpu/detail/gemm_pack.hpp is internal: include <kiln/backend/cpu/gemm.hpp>"
#endif

#include <algorithm>
#include <type_traits>
#include <utility>

#include "kiln/backend/cpu/detail/gemm_kernel.hpp"
#include "kiln/config.hpp"

namespace kiln::cpu::detail {

#if KILN_GEMM_AVX2

// Transposes the 4 x 4 block whose rows are r[0..3] in place.
inline void transpose4x4(__m256d r[4]) {
  const __m256d t0 = _mm256_unpacklo_pd(r[0], r[1]), t1 = _mm256_unpackhi_pd(r[0], r[1]);
  const __m256d t2 = _mm256_unpacklo_pd(r[2], r[3]), t3 = _mm256_unpackhi_pd(r[2], r[3]);
  r[0] = _mm256_permute2f128_pd(t0, t2, 0x20);
  r[1] = _mm256_permute2f128_pd(t1, t3, 0x20);
  r[2] = _mm256_permute2f128_pd(t0, t2, 0x31);
  r[3] = _mm256_permute2f128_pd(t1, t3, 0x31);
}

// One panel whose R rows are contiguous (rs == 1): dst[p][r] = src[p * cs + r] for r < live,
// zero above. Masked loads read exactly the live values (never past the matrix) and bring the
// zeros of the padding rows with them; Full (live == R) loads whole vectors without masks.
// V... numbers the vectors of a panel row (R = 16 floats: 0, 1; R = 6 doubles: 0, 1;
// R = 12 floats: 0, 1, the second stored half).
template <int R, bool Full, class Acc, int... V>
inline void pack_panel_contiguous(index_t kc, const Acc* src, index_t cs, index_t live, Acc* dst,
                                  std::integer_sequence<int, V...>) {
  using ops = avx_ops<Acc>;
  constexpr int W = ops::lanes;
  const __m256i masks[] = {ops::mask(Full ? R - V * W : live - V * W)...};
  for (index_t p = 0; p < kc; ++p) {
    const Acc* s = src + p * cs;
    Acc* d = dst + p * R;
    (ops::template store_first<std::min(W, R - V * W)>(
         d + V * W,
         Full && R - V * W >= W ? ops::loadu(s + V * W) : ops::maskload(s + V * W, masks[V])),
     ...);
  }
}

template <int R, bool Full, class Acc>
inline void pack_panel_contiguous(index_t kc, const Acc* src, index_t cs, index_t live, Acc* dst) {
  constexpr int W = avx_ops<Acc>::lanes;
  pack_panel_contiguous<R, Full>(kc, src, cs, live, dst,
                                 std::make_integer_sequence<int, (R + W - 1) / W>{});
}

// One panel of R rows (`live` of them real, the rest zero) that are contiguous along k
// (cs == 1): the transposing case, which otherwise costs a scalar load and store per value.
// Handles p in [0, kc - kc % W); returns how far it got so the caller finishes the tail.
template <int R>
inline index_t pack_panel_transposed(index_t kc, const float* src, index_t rs, index_t live,
                                     float* dst) {
  static_assert(R % 8 == 0 || R % 8 == 4 || R == 6,
                "float transposing pack handles R = 8n, 8n + 4 (AVX-512 tiles) or 6");
  const index_t kc8 = kc - kc % 8;
  for (index_t p = 0; p < kc8; p += 8) {
    for (int g = 0; g < (R + 7) / 8; ++g) {
      __m256 r[8];
      for (int i = 0; i < 8; ++i) {
        const int row = 8 * g + i;  // rows past R (R = 6, 12) are zero and never stored
        r[i] = row < live ? _mm256_loadu_ps(src + row * rs + p) : _mm256_setzero_ps();
      }
      transpose8x8(r);
      for (int q = 0; q < 8; ++q) {
        float* d = dst + (p + q) * R + g * 8;
        if (8 * g + 8 <= R) {
          avx_ops<float>::store_first<8>(d, r[q]);
        } else {
          avx_ops<float>::store_first<(R % 8 == 0 ? 8 : R % 8)>(d, r[q]);
        }
      }
    }
  }
  return kc8;
}

template <int R>
inline index_t pack_panel_transposed(index_t kc, const double* src, index_t rs, index_t live,
                                     double* dst) {
  static_assert(R % 4 == 0 || R == 6, "double transposing pack handles R = 4n or 6");
  const index_t kc4 = kc - kc % 4;
  for (index_t p = 0; p < kc4; p += 4) {
    for (int g = 0; g < (R + 3) / 4; ++g) {
      __m256d r[4];
      for (int i = 0; i < 4; ++i) {
        const int row = 4 * g + i;
        r[i] = row < live ? _mm256_loadu_pd(src + row * rs + p) : _mm256_setzero_pd();
      }
      transpose4x4(r);
      for (int q = 0; q < 4; ++q) {
        double* d = dst + (p + q) * R + g * 4;
        if (4 * g + 4 <= R) {
          _mm256_storeu_pd(d, r[q]);
        } else {
          _mm_storeu_pd(d, _mm256_castpd256_pd128(r[q]));
        }
      }
    }
  }
  return kc4;
}

#endif  // KILN_GEMM_AVX2

// Packs `rows` x kc values (see the file comment) into ceil(rows / R) panels at dst.
// requires: dst has room for ceil(rows / R) * R * kc values.
template <int R, class T, class Acc>
inline void pack_panels(index_t rows, index_t kc, const T* KILN_RESTRICT src, index_t rs,
                        index_t cs, Acc* KILN_RESTRICT dst) {
  for (index_t r0 = 0; r0 < rows; r0 += R, src += R * rs, dst += R * kc) {
    const index_t live = rows - r0 < R ? rows - r0 : R;
    if (rs == 1) {
#if KILN_GEMM_AVX2
      if constexpr (std::is_same_v<T, Acc>) {
        if (live == R) {
          pack_panel_contiguous<R, true>(kc, src, cs, live, dst);
        } else {
          pack_panel_contiguous<R, false>(kc, src, cs, live, dst);
        }
      } else  // f16/bf16 take the scalar copy with conversion below
#endif
      {
        for (index_t p = 0; p < kc; ++p) {
          const T* s = src + p * cs;
          Acc* d = dst + p * R;
          for (int r = 0; r < R; ++r) d[r] = r < live ? static_cast<Acc>(s[r]) : Acc(0);
        }
      }
      continue;
    }
    index_t p = 0;
#if KILN_GEMM_AVX2
    if constexpr (std::is_same_v<T, Acc>) {
      if (cs == 1) p = pack_panel_transposed<R>(kc, src, rs, live, dst);
    }
#endif
    // k tail and f16/bf16: read along k (contiguous when cs == 1), write strided.
    for (index_t r = 0; r < live; ++r) {
      const T* s = src + r * rs;
      for (index_t q = p; q < kc; ++q) dst[q * R + r] = static_cast<Acc>(s[q * cs]);
    }
    for (index_t r = live; r < R; ++r)
      for (index_t q = p; q < kc; ++q) dst[q * R + r] = Acc(0);
  }
}

}  // namespace kiln::cpu::detail
