// kiln/backend/cpu/detail/gemm_kernel_bf16.hpp — the AVX512-BF16 microkernel of the CPU GEMM:
// kiln::bf16 inputs multiplied by vdpbf16ps (_mm512_dpbf16_ps), fp32 accumulators, float C.
//
// Built when the target has AVX512-BF16 (and AVX512-BW for the packing), unless
// KILN_GEMM_BF16_EMULATE is defined; otherwise bf16 inputs take the exact emulation (converted to
// float while packing, fp32 kernel). gemm.hpp can also pick the emulation at run time
// (set_gemm_bf16_path). AMX (tdpbf16ps tiles, which also need the ARCH_REQ_XCOMP_PERM
// arch_prctl) would be the next step on Intel Sapphire Rapids and later; it is not written, as no
// machine here has it to test on.
//
// Tile: 12 rows x 32 columns, as the fp32 AVX-512 kernel (gemm_kernel_avx512.hpp): 24 zmm
// accumulators, 2 zmm of B pairs and broadcasts of A pairs. One k step of the loop is two k
// values: 2 loads + 12 broadcasts feed 24 vdpbf16ps, each 32 multiply-adds, twice the work of the
// fp32 kernel's 24 FMAs per step for the same instruction count (Zen 5 issues two vdpbf16ps or two
// FMAs per cycle, 6 cycles latency, so 24 independent accumulators keep both pipes full).
//
// Numerics, against the emulation (which adds one exact product at a time with an fp32 FMA, in k
// order, IEEE denormals): vdpbf16ps adds the two exact products of a pair to the accumulator one
// after the other, the odd-k product first, each addition rounded to nearest even (checked on Zen
// 5, as Intel's pseudocode has it); it ignores MXCSR, treats denormal inputs (bf16 operands and
// the accumulator) as zero and flushes denormal results to zero. So a sum differs from the
// emulated one in its last bits (another order of the same k roundings, error bound k * 2^-24 *
// sum |a b| either way) and, when values below 2^-126 take part, by up to about k * 2^-126.
#pragma once

#ifndef KILN_INTERNAL_INCLUDE
#error "kiln/backend/cpu/detail/gemm_kernel_bf16.hpp is internal: include <kiln/backend/cpu/gemm.hpp>"
#endif

#include "kiln/config.hpp"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512BF16__) && \
    !defined(KILN_GEMM_BF16_EMULATE)
#define KILN_GEMM_BF16_NATIVE 1
#else
#define KILN_GEMM_BF16_NATIVE 0
#endif

#if KILN_GEMM_BF16_NATIVE

#include <immintrin.h>

#include <bit>
#include <cstdint>

#include "kiln/backend/cpu/detail/gemm_kernel_avx512.hpp"
#include "kiln/backend/cpu/detail/gemm_pack_bf16.hpp"
#include "kiln/core/dtype.hpp"

#if (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#define KILN_GEMMBF16_UNROLL(n) _Pragma(n)
#else
#define KILN_GEMMBF16_UNROLL(n)
#endif

namespace kiln::cpu::detail {

inline __m512bh as_bf16x32(__m512i v) { return std::bit_cast<__m512bh>(v); }

// C[0:mr, 0:nr] = alpha * Ap * Bp + beta * C   (beta == 0: C is not read), C(r, j) at
// c[r * rs_c + j * cs_c] with cs_c == 1 or rs_c == 1, from panels of bf16 pairs
// (gemm_pack_bf16.hpp) covering kc values of k.
// requires: ap holds ceil(kc / 2) x MR and bp ceil(kc / 2) x 32 words, bp 64-byte aligned;
// mr <= MR <= 16, nr <= 32.
template <int MR>
inline void microkernel_bf16(index_t kc, const std::uint32_t* KILN_RESTRICT ap,
                             const std::uint32_t* KILN_RESTRICT bp, float* KILN_RESTRICT c,
                             index_t rs_c, index_t cs_c, float alpha, float beta, int mr, int nr) {
  constexpr int NV = 2, W = 16;
  __m512 acc[MR][NV];
  KILN_GEMMBF16_UNROLL("GCC unroll 16")
  for (int r = 0; r < MR; ++r) {
    acc[r][0] = _mm512_setzero_ps();
    acc[r][1] = _mm512_setzero_ps();
  }
  prefetch_tile_avx512(c, rs_c, cs_c, mr, nr);

  const index_t kp = bf16_pairs(kc);
  KILN_GEMMBF16_UNROLL("GCC unroll 4")
  for (index_t q = 0; q < kp; ++q) {
    const __m512bh b0 = as_bf16x32(_mm512_load_si512(bp));
    const __m512bh b1 = as_bf16x32(_mm512_load_si512(bp + W));
    KILN_GEMMBF16_UNROLL("GCC unroll 16")
    for (int r = 0; r < MR; ++r) {
      const __m512bh ai = as_bf16x32(_mm512_set1_epi32(static_cast<int>(ap[r])));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], ai, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], ai, b1);
    }
    ap += MR;
    bp += NV * W;
  }

  store_tile_avx512<MR>(acc, c, rs_c, cs_c, alpha, beta, mr, nr);
}

// The bf16 kernel as the loop nest of gemm_driver.hpp sees it. Block sizes: the same bytes as the
// fp32 kernel's (a B micro-panel of kc = 512 bf16 is 256 pairs x 32 words = 32 KiB of L1), so
// k = 400, the widest k of the MLP shapes, is one pass over C instead of two.
struct gemm_kernel_bf16 {
  using input = bf16;
  using acc = float;
  using packed = std::uint32_t;
  static constexpr int mr = 12, nr = 32;
  static constexpr index_t kc = 512, mc = 240, nc = 4096;
  static constexpr index_t kstep = 2;  // k blocks but the last are even: no padding inside k
  static constexpr index_t packed_k(index_t k) { return bf16_pairs(k); }
  static void pack_a(index_t rows, index_t k, const bf16* src, index_t rs, index_t cs, packed* dst) {
    pack_panels_bf16<mr>(rows, k, src, rs, cs, dst);
  }
  static void pack_b(index_t rows, index_t k, const bf16* src, index_t rs, index_t cs, packed* dst) {
    pack_panels_bf16<nr>(rows, k, src, rs, cs, dst);
  }
  static void tile(index_t k, const packed* ap, const packed* bp, float* c, index_t rs_c,
                   index_t cs_c, float alpha, float beta, int m_live, int n_live) {
    microkernel_bf16<mr>(k, ap, bp, c, rs_c, cs_c, alpha, beta, m_live, n_live);
  }
  static constexpr const char* name = "avx512bf16 12x32";
};

}  // namespace kiln::cpu::detail

#undef KILN_GEMMBF16_UNROLL

#endif  // KILN_GEMM_BF16_NATIVE
