// kiln/core/bf16_bulk.hpp — arrays of float to kiln::bf16 and back, vectorised (AVX-512 or AVX2
// where the target has them), bit for bit what kiln::bf16's scalar conversions give: round to
// nearest even, NaN keeping its sign and the payload's top bits with the quiet bit set,
// denormals kept (unlike vcvtneps2bf16, which flushes them).
//
// Mixed precision rounds every activation a layer writes and widens every one it reads: the
// scalar conversion (a branch for NaN per value) was a quarter of a bf16 ResNet-50 step.
#pragma once

#if defined(__AVX2__) && !defined(__CUDACC__)
#include <immintrin.h>
#endif

#include <cstdint>
#include <cstring>

#include "kiln/core/dtype.hpp"

namespace kiln {

// (The AVX-512 shifts and conversions are the zero-masked forms with every lane selected: GCC 12's unmasked ones
// start from _mm512_undefined and trip -Wmaybe-uninitialized, GCC PR 105593.)

namespace detail {
// The bits of bf16(x) for a float's bits u, branch-free (vectorisable).
inline std::uint16_t bf16_round_bits(std::uint32_t u) {
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const std::uint32_t nan = (u >> 16) | 0x0040u;
  return std::uint16_t((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}
}  // namespace detail

// dst[i] = bf16(src[i]) for i in [0, n).
inline void round_to_bf16(const float* src, bf16* dst, index_t n) {
  index_t i = 0;
#if defined(__AVX512F__) && defined(__AVX512BW__) && !defined(__CUDACC__)
  const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1), quiet = _mm512_set1_epi32(0x40);
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
  for (; i + 16 <= n; i += 16) {
    const __m512i u = _mm512_loadu_si512(src + i);
    const __m512i hi = _mm512_maskz_srli_epi32(0xFFFF, u, 16);
    const __m512i rounded = _mm512_maskz_srli_epi32(0xFFFF, _mm512_add_epi32(_mm512_add_epi32(u, bias), _mm512_and_si512(hi, one)), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs_mask), inf);
    const __m512i r = _mm512_mask_or_epi32(rounded, nan, hi, quiet);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_maskz_cvtepi32_epi16(0xFFFF, r));
  }
#elif defined(__AVX2__) && !defined(__CUDACC__)
  const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1), quiet = _mm256_set1_epi32(0x40);
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  for (; i + 8 <= n; i += 8) {
    const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256i hi = _mm256_srli_epi32(u, 16);
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, bias), _mm256_and_si256(hi, one)), 16);
    // |u| > inf as signed compares: both sides are below 2^31.
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
    const __m256i r = _mm256_blendv_epi8(rounded, _mm256_or_si256(hi, quiet), nan);
    // Every lane is below 2^16, so the saturating pack is exact; it interleaves 128-bit halves.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_castsi256_si128(packed));
  }
#endif
  for (; i < n; ++i) {
    std::uint32_t u;
    std::memcpy(&u, src + i, 4);
    dst[i] = bf16::from_bits(detail::bf16_round_bits(u));
  }
}

// dst[i] = bf16(float(dst[i]) + v[i]) for i in [0, n): a gradient accumulated in bf16, rounded
// once per addition.
inline void add_round_to_bf16(const float* v, bf16* dst, index_t n);

// dst[i] = float(src[i]) for i in [0, n) (exact).
inline void widen_bf16(const bf16* src, float* dst, index_t n) {
  index_t i = 0;
#if defined(__AVX512F__) && !defined(__CUDACC__)
  for (; i + 16 <= n; i += 16) {
    const __m512i h = _mm512_maskz_cvtepu16_epi32(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
    _mm512_storeu_si512(dst + i, _mm512_maskz_slli_epi32(0xFFFF, h, 16));
  }
#elif defined(__AVX2__) && !defined(__CUDACC__)
  for (; i + 8 <= n; i += 8) {
    const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm256_slli_epi32(h, 16));
  }
#endif
  for (; i < n; ++i) dst[i] = float(src[i]);
}

inline void add_round_to_bf16(const float* v, bf16* dst, index_t n) {
  constexpr index_t block = 1024;
  float sum[block];
  for (index_t b = 0; b < n; b += block) {
    const index_t len = n - b < block ? n - b : block;
    widen_bf16(dst + b, sum, len);
    for (index_t i = 0; i < len; ++i) sum[i] += v[b + i];
    round_to_bf16(sum, dst + b, len);
  }
}

}  // namespace kiln
