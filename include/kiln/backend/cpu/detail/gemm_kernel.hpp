// kiln/backend/cpu/detail/gemm_kernel.hpp — block sizes and register-blocked microkernels of the
// CPU GEMM.
//
// A microkernel computes one MR x NR tile of C from a packed A micro-panel (kc x MR, k-major) and
// a packed B micro-panel (kc x NR, k-major). The packing (gemm_pack.hpp) makes both operands
// contiguous and zero-padded, so the kernel never branches on transposes, strides or edges inside
// its k loop; only the final store knows about a partial tile.
#pragma once

#ifndef KILN_INTERNAL_INCLUDE
#error "kiln/backend/cpu/detail/gemm_kernel.hpp is internal: include <kiln/backend/cpu/gemm.hpp>"
#endif

#include <algorithm>
#include <type_traits>

#include "kiln/config.hpp"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define KILN_GEMM_AVX2 1
#else
#define KILN_GEMM_AVX2 0
#endif

// The AVX-512 fp32 kernel (gemm_kernel_avx512.hpp) when the target has AVX-512F, which implies
// AVX2 and FMA (the packing keeps using the AVX2 routines). -DKILN_GEMM_AVX2_ONLY keeps the AVX2
// kernel on such targets, for side-by-side measurements.
#if KILN_GEMM_AVX2 && defined(__AVX512F__) && !defined(KILN_GEMM_AVX2_ONLY)
#define KILN_GEMM_AVX512 1
#else
#define KILN_GEMM_AVX512 0
#endif

// Unrolling the k loop 4x is worth a few percent with GCC; nvcc's front end does not know the
// pragma (and warns), so it only goes to the host compilers. Undefined at the end of this file.
#if (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#define KILN_GEMM_UNROLL_K _Pragma("GCC unroll 4")
#else
#define KILN_GEMM_UNROLL_K
#endif

namespace kiln::cpu::detail {

// Block sizes per accumulation type (BLIS naming). mr x nr is the register tile; kc bounds the
// k extent of a packed panel so one B micro-panel (kc x nr) stays in L1 while the A block
// (mc x kc) stays in L2 and the B block (kc x nc) in L3.
template <class Acc>
struct gemm_blocking;

#if KILN_GEMM_AVX512
// 12 x 32 floats = 24 zmm accumulators (see gemm_kernel_avx512.hpp). A B micro-panel, kc x 32
// floats, is 32 KiB at kc = 256: two thirds of a 48 KiB L1d (Zen 5, Sapphire Rapids), the rest
// for the 12 KiB A micro-panel streaming past it. kc = 192 (24 KiB) measured up to 15% slower on
// the MLP shapes, whose k = 256 it splits in two passes over C. The A block, mc x kc = 240 x 256
// floats = 240 KiB, sits in the 1-2 MiB L2; the B block, kc x nc (4 MiB), in L3.
template <>
struct gemm_blocking<float> {
  static constexpr int mr = 12, nr = 32;
  static constexpr index_t kc = 256, mc = 240, nc = 4096;
};
#elif KILN_GEMM_AVX2
// 6 x 16 floats = 12 ymm accumulators + 2 B vectors + 1 broadcast: 15 of the 16 ymm registers.
// Per k step 8 loads feed 12 FMAs, so the two FMA pipes, not the load ports, set the pace.
template <>
struct gemm_blocking<float> {
  static constexpr int mr = 6, nr = 16;
  static constexpr index_t kc = 256, mc = 144, nc = 4080;
};
#endif
#if KILN_GEMM_AVX2
template <>
struct gemm_blocking<double> {
  static constexpr int mr = 6, nr = 8;
  static constexpr index_t kc = 256, mc = 72, nc = 4080;
};
#else
// Portable sizes: 4 x 8 accumulators fit the 16 registers of SSE2-class targets.
template <>
struct gemm_blocking<float> {
  static constexpr int mr = 4, nr = 8;
  static constexpr index_t kc = 256, mc = 128, nc = 4096;
};
template <>
struct gemm_blocking<double> {
  static constexpr int mr = 4, nr = 4;
  static constexpr index_t kc = 256, mc = 64, nc = 4096;
};
#endif

// Writes the mr x nr corner of `tile` (row stride NR, already times alpha) to C(r, j) at
// c[r * rs_c + j * cs_c]; beta == 0 does not read C. The slow path for tiles the vector stores
// do not cover.
template <int NR, class Acc>
inline void store_tile(const Acc* KILN_RESTRICT tile, Acc* KILN_RESTRICT c, index_t rs_c,
                       index_t cs_c, Acc beta, int mr, int nr) {
  for (int r = 0; r < mr; ++r) {
    for (int j = 0; j < nr; ++j) {
      Acc& x = c[r * rs_c + j * cs_c];
      x = beta == Acc(0) ? tile[r * NR + j] : tile[r * NR + j] + beta * x;
    }
  }
}

#if KILN_GEMM_AVX2

// The few AVX operations the kernel and the packing need, per element type, so one template
// serves float and double. Masked loads neither read nor fault on masked-out lanes, and masked
// stores leave those lanes of memory alone: that is how partial tiles and panels stay inside
// the matrices.
template <class Acc>
struct avx_ops;

template <>
struct avx_ops<float> {
  using vec = __m256;
  static constexpr int lanes = 8;
  static vec zero() { return _mm256_setzero_ps(); }
  static vec set1(float x) { return _mm256_set1_ps(x); }
  static vec bcast(const float* p) { return _mm256_broadcast_ss(p); }
  static vec load(const float* p) { return _mm256_load_ps(p); }
  static vec loadu(const float* p) { return _mm256_loadu_ps(p); }
  static void storeu(float* p, vec v) { _mm256_storeu_ps(p, v); }
  static vec mul(vec a, vec b) { return _mm256_mul_ps(a, b); }
  static vec fma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
  // Lanes [0, n) selected; n outside [0, lanes] is clamped.
  static __m256i mask(index_t n) {
    const int c = static_cast<int>(std::clamp<index_t>(n, 0, lanes));
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(c), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static vec maskload(const float* p, __m256i m) { return _mm256_maskload_ps(p, m); }
  static void maskstore(float* p, __m256i m, vec v) { _mm256_maskstore_ps(p, m, v); }
  // Stores lanes [0, N) of v; N is 8, 6 or 4 (the panel heights modulo 8).
  template <int N>
  static void store_first(float* d, vec v) {
    static_assert(N == 8 || N == 6 || N == 4, "float panels have 8n, 8n + 4 or 6 rows");
    if constexpr (N == 8) {
      _mm256_storeu_ps(d, v);
    } else if constexpr (N == 4) {
      _mm_storeu_ps(d, _mm256_castps256_ps128(v));
    } else {
      _mm_storeu_ps(d, _mm256_castps256_ps128(v));
      _mm_storel_pi(reinterpret_cast<__m64*>(d + 4), _mm256_extractf128_ps(v, 1));
    }
  }
};

template <>
struct avx_ops<double> {
  using vec = __m256d;
  static constexpr int lanes = 4;
  static vec zero() { return _mm256_setzero_pd(); }
  static vec set1(double x) { return _mm256_set1_pd(x); }
  static vec bcast(const double* p) { return _mm256_broadcast_sd(p); }
  static vec load(const double* p) { return _mm256_load_pd(p); }
  static vec loadu(const double* p) { return _mm256_loadu_pd(p); }
  static void storeu(double* p, vec v) { _mm256_storeu_pd(p, v); }
  static vec mul(vec a, vec b) { return _mm256_mul_pd(a, b); }
  static vec fma(vec a, vec b, vec c) { return _mm256_fmadd_pd(a, b, c); }
  static __m256i mask(index_t n) {
    return _mm256_cmpgt_epi64(_mm256_set1_epi64x(std::clamp<index_t>(n, 0, lanes)),
                              _mm256_setr_epi64x(0, 1, 2, 3));
  }
  static vec maskload(const double* p, __m256i m) { return _mm256_maskload_pd(p, m); }
  static void maskstore(double* p, __m256i m, vec v) { _mm256_maskstore_pd(p, m, v); }
  template <int N>
  static void store_first(double* d, vec v) {
    static_assert(N == 4 || N == 2, "store_first<N> on double vectors stores a whole vector (4) or its low half (2)");
    if constexpr (N == 4) {
      _mm256_storeu_pd(d, v);
    } else {
      _mm_storeu_pd(d, _mm256_castpd256_pd128(v));
    }
  }
};

// C row = x + beta * C row over NV vectors; Masked limits it to the lanes in `mask` (the last
// columns of C). beta == 0 does not read C.
template <bool Masked, class Acc, int NV>
inline void update_c_row(Acc* cr, const typename avx_ops<Acc>::vec (&x)[NV], Acc beta,
                         const __m256i (&mask)[NV]) {
  using ops = avx_ops<Acc>;
  for (int v = 0; v < NV; ++v) {
    Acc* p = cr + v * ops::lanes;
    typename ops::vec y = x[v];
    if (beta != Acc(0))
      y = ops::fma(ops::set1(beta), Masked ? ops::maskload(p, mask[v]) : ops::loadu(p), y);
    if constexpr (Masked) {
      ops::maskstore(p, mask[v], y);
    } else {
      ops::storeu(p, y);
    }
  }
}

// Transposes the 8 x 8 block whose rows are r[0..7] in place: afterwards r[p] holds column p.
inline void transpose8x8(__m256 r[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int h = 0; h < 2; ++h) {
    u[4 * h + 0] = _mm256_shuffle_ps(t[4 * h + 0], t[4 * h + 2], 0x44);
    u[4 * h + 1] = _mm256_shuffle_ps(t[4 * h + 0], t[4 * h + 2], 0xEE);
    u[4 * h + 2] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0x44);
    u[4 * h + 3] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

// Stores the register tile transposed: tile element (r, j) goes to c[j * ldc + r]. This is
// how a product computed as C^T = op(B)^T op(A)^T (narrow C, see gemm_driver.hpp) lands in C.
// float transposes in registers so each C row takes one short store; double, rarely narrow
// in practice, goes through memory.
template <class Acc, int MR, int NV>
inline void store_tile_transposed(const typename avx_ops<Acc>::vec (&acc)[MR][NV], Acc* c,
                                  index_t ldc, Acc beta, int mr, int nr) {
  using ops = avx_ops<Acc>;
  if constexpr (std::is_same_v<Acc, float> && MR == 6) {
    const __m256i rows = ops::mask(mr);
    for (int v = 0; v < NV; ++v) {
      __m256 t[8] = {acc[0][v], acc[1][v], acc[2][v],   acc[3][v],
                     acc[4][v], acc[5][v], ops::zero(), ops::zero()};
      transpose8x8(t);
      for (int q = 0; q < 8 && v * 8 + q < nr; ++q) {
        float* p = c + (v * 8 + q) * ldc;
        __m256 y = t[q];
        if (beta != 0.0f) y = ops::fma(ops::set1(beta), ops::maskload(p, rows), y);
        if (mr == MR) {
          ops::template store_first<6>(p, y);
        } else {
          ops::maskstore(p, rows, y);
        }
      }
    }
  } else {
    constexpr int NR = NV * ops::lanes;
    alignas(32) Acc tile[MR * NR];
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < NV; ++v) ops::storeu(tile + r * NR + v * ops::lanes, acc[r][v]);
    store_tile<NR>(tile, c, 1, ldc, beta, mr, nr);
  }
}

// The A operand of microkernel_avx2: element r of the current k step's six (row(r)), then the
// next step (next()). PackedA reads a packed panel (kc x 6, k-major); RowsA reads six rows where
// they lie, k contiguous in each (row r at a + r * lda), from two bases and three offsets, so the
// six rows cost four registers rather than six.
template <class Acc>
struct PackedA {
  const Acc* ap;
  const Acc* row(int r) const { return ap + r; }
  void next() { ap += 6; }
};
template <class Acc>
struct RowsA {
  const Acc* base[2];
  index_t offset[3];
  RowsA(const Acc* a, index_t lda) : base{a, a + 3 * lda}, offset{0, lda, 2 * lda} {}
  const Acc* row(int r) const { return base[r / 3] + offset[r % 3]; }
  void next() {
    ++base[0];
    ++base[1];
  }
};

// C[0:mr, 0:nr] = alpha * A * Bp + beta * C   (beta == 0: C is not read), where C(r, j) is
// c[r * rs_c + j * cs_c] and either cs_c == 1 (row-major C) or rs_c == 1 (C seen transposed);
// A read through `a` (PackedA, RowsA: the same products in the same order either way, so the same
// bits). requires: A holds kc x 6 values (rows past mr of a RowsA must exist: whole tiles only),
// bp kc x NR packed values, 32-byte aligned; mr <= MR, nr <= NR.
template <class Acc, class A>
inline void microkernel_avx2_reading(index_t kc, A a, const Acc* KILN_RESTRICT bp, Acc* KILN_RESTRICT c,
                                     index_t rs_c, index_t cs_c, Acc alpha, Acc beta, int mr, int nr) {
  using ops = avx_ops<Acc>;
  using vec = typename ops::vec;
  constexpr int MR = 6;
  constexpr int NR = 2 * ops::lanes;
  constexpr int NV = NR / ops::lanes;
  static_assert(MR == 6 && NV == 2, "the AVX2 microkernel is written for 6 rows of two vectors");

  // Named accumulators instead of an array: GCC then keeps all twelve in registers for sure.
  vec c00 = ops::zero(), c01 = ops::zero(), c10 = ops::zero(), c11 = ops::zero();
  vec c20 = ops::zero(), c21 = ops::zero(), c30 = ops::zero(), c31 = ops::zero();
  vec c40 = ops::zero(), c41 = ops::zero(), c50 = ops::zero(), c51 = ops::zero();

  // Touch the C tile early so its lines arrive while the k loop runs.
  if (cs_c == 1) {
    for (int r = 0; r < mr; ++r)
      _mm_prefetch(reinterpret_cast<const char*>(c + r * rs_c), _MM_HINT_T0);
  } else {
    for (int j = 0; j < nr; ++j)
      _mm_prefetch(reinterpret_cast<const char*>(c + j * cs_c), _MM_HINT_T0);
  }

  KILN_GEMM_UNROLL_K
  for (index_t p = 0; p < kc; ++p) {
    const vec b0 = ops::load(bp), b1 = ops::load(bp + ops::lanes);
    vec ai = ops::bcast(a.row(0));
    c00 = ops::fma(ai, b0, c00);
    c01 = ops::fma(ai, b1, c01);
    ai = ops::bcast(a.row(1));
    c10 = ops::fma(ai, b0, c10);
    c11 = ops::fma(ai, b1, c11);
    ai = ops::bcast(a.row(2));
    c20 = ops::fma(ai, b0, c20);
    c21 = ops::fma(ai, b1, c21);
    ai = ops::bcast(a.row(3));
    c30 = ops::fma(ai, b0, c30);
    c31 = ops::fma(ai, b1, c31);
    ai = ops::bcast(a.row(4));
    c40 = ops::fma(ai, b0, c40);
    c41 = ops::fma(ai, b1, c41);
    ai = ops::bcast(a.row(5));
    c50 = ops::fma(ai, b0, c50);
    c51 = ops::fma(ai, b1, c51);
    a.next();
    bp += NR;
  }

  const vec va = ops::set1(alpha);
  const vec acc[MR][NV] = {
      {ops::mul(va, c00), ops::mul(va, c01)}, {ops::mul(va, c10), ops::mul(va, c11)},
      {ops::mul(va, c20), ops::mul(va, c21)}, {ops::mul(va, c30), ops::mul(va, c31)},
      {ops::mul(va, c40), ops::mul(va, c41)}, {ops::mul(va, c50), ops::mul(va, c51)}};
  if (cs_c != 1) {
    store_tile_transposed<Acc>(acc, c, cs_c, beta, mr, nr);
  } else if (nr == NR) {
    const __m256i none[NV] = {};
    if (mr == MR) {
      for (int r = 0; r < MR; ++r) update_c_row<false>(c + r * rs_c, acc[r], beta, none);
    } else {
      for (int r = 0; r < mr; ++r) update_c_row<false>(c + r * rs_c, acc[r], beta, none);
    }
  } else {
    const __m256i cols[NV] = {ops::mask(nr), ops::mask(nr - ops::lanes)};
    for (int r = 0; r < mr; ++r) update_c_row<true>(c + r * rs_c, acc[r], beta, cols);
  }
}

// The tile from packed panels (see microkernel_avx2_reading).
template <class Acc>
inline void microkernel_avx2(index_t kc, const Acc* KILN_RESTRICT ap, const Acc* KILN_RESTRICT bp,
                             Acc* KILN_RESTRICT c, index_t rs_c, index_t cs_c, Acc alpha, Acc beta, int mr, int nr) {
  microkernel_avx2_reading(kc, PackedA<Acc>{ap}, bp, c, rs_c, cs_c, alpha, beta, mr, nr);
}

// A whole 6-row tile with A's rows read where they lie (row r at a + r * lda, k contiguous): a
// pointwise convolution's input rows, a backward-data's dy, an MLP's activations — without the
// pass that packs them (as microkernel_avx512_rows does on AVX-512).
template <class Acc>
inline void microkernel_avx2_rows(index_t kc, const Acc* KILN_RESTRICT a, index_t lda, const Acc* KILN_RESTRICT bp,
                                  Acc* KILN_RESTRICT c, index_t rs_c, index_t cs_c, Acc alpha, Acc beta, int nr) {
  microkernel_avx2_reading(kc, RowsA<Acc>(a, lda), bp, c, rs_c, cs_c, alpha, beta, 6, nr);
}

}  // namespace kiln::cpu::detail

#if KILN_GEMM_AVX512
#include "kiln/backend/cpu/detail/gemm_kernel_avx512.hpp"
#endif

namespace kiln::cpu::detail {

// The tile of C at c (see microkernel_avx2) from packed panels of gemm_blocking<Acc>'s shape.
template <class Acc>
inline void microkernel(index_t kc, const Acc* KILN_RESTRICT ap, const Acc* KILN_RESTRICT bp,
                        Acc* KILN_RESTRICT c, index_t rs_c, index_t cs_c, Acc alpha, Acc beta,
                        int mr, int nr) {
#if KILN_GEMM_AVX512
  if constexpr (std::is_same_v<Acc, float>) {
    static_assert(gemm_blocking<float>::nr == 32, "the AVX-512 kernel is 32 columns wide");
    microkernel_avx512<gemm_blocking<float>::mr>(kc, ap, bp, c, rs_c, cs_c, alpha, beta, mr, nr);
  } else
#endif
  {
    static_assert(gemm_blocking<Acc>::mr == 6 && gemm_blocking<Acc>::nr == 16 * 4 / int(sizeof(Acc)),
                  "gemm_blocking<Acc> must match the AVX2 kernel's 6 x (two vectors) tile");
    microkernel_avx2(kc, ap, bp, c, rs_c, cs_c, alpha, beta, mr, nr);
  }
}

// A whole float tile of gemm_blocking<float>'s shape with A's rows read where they lie (row r at
// a + r * lda, k contiguous): microkernel_avx512_rows or microkernel_avx2_rows.
inline void microkernel_rows(index_t kc, const float* KILN_RESTRICT a, index_t lda, const float* KILN_RESTRICT bp,
                             float* KILN_RESTRICT c, index_t rs_c, index_t cs_c, float alpha, float beta, int nr) {
#if KILN_GEMM_AVX512
  microkernel_avx512_rows<gemm_blocking<float>::mr>(kc, a, lda, bp, c, rs_c, cs_c, alpha, beta, nr);
#else
  microkernel_avx2_rows(kc, a, lda, bp, c, rs_c, cs_c, alpha, beta, nr);
#endif
}

#else  // portable kernel: plain loops over a fixed tile that the compiler vectorises.

template <class Acc>
inline void microkernel(index_t kc, const Acc* KILN_RESTRICT ap, const Acc* KILN_RESTRICT bp,
                        Acc* KILN_RESTRICT c, index_t rs_c, index_t cs_c, Acc alpha, Acc beta,
                        int mr, int nr) {
  constexpr int MR = gemm_blocking<Acc>::mr;
  constexpr int NR = gemm_blocking<Acc>::nr;
  Acc tile[MR * NR] = {};
  for (index_t p = 0; p < kc; ++p) {
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < NR; ++j) tile[r * NR + j] += ap[r] * bp[j];
    ap += MR;
    bp += NR;
  }
  for (Acc& x : tile) x *= alpha;
  store_tile<NR>(tile, c, rs_c, cs_c, beta, mr, nr);
}

#endif

}  // namespace kiln::cpu::detail

#undef KILN_GEMM_UNROLL_K
