// kiln/backend/cpu/detail/gemm_cblas.hpp — forwards float/double GEMMs to a CBLAS (OpenBLAS)
// when the build found one (KILN_HAVE_CBLAS).
#pragma once

#ifndef KILN_INTERNAL_INCLUDE
#error "kiln/backend/cpu/detail/gemm_cblas.hpp is internal: include <kiln/backend/cpu/gemm.hpp>"
#endif

#include "kiln/config.hpp"

#if defined(KILN_HAVE_CBLAS)
#include <cblas.h>

#include <algorithm>
#include <limits>
#include <type_traits>

namespace kiln::cpu::detail {

#if defined(OPENBLAS_VERSION)
using cblas_int = blasint;  // 64-bit in ILP64 builds of OpenBLAS
#else
using cblas_int = int;  // the reference CBLAS interface
#endif

// True when every extent fits CBLAS's integer type (32-bit unless OpenBLAS was built ILP64).
inline bool cblas_can_take(index_t m, index_t n, index_t k, index_t lda, index_t ldb, index_t ldc) {
  constexpr index_t top = static_cast<index_t>(std::numeric_limits<cblas_int>::max());
  return std::max({m, n, k, lda, ldb, ldc}) <= top;
}

// requires: validated arguments, cblas_can_take(...). An ld is only read by CBLAS for a non-empty
// row, but CBLAS rejects ld < 1 regardless, hence the max(1, ld).
template <class T>
void cblas_gemm(bool ta, bool tb, index_t m, index_t n, index_t k, T alpha, const T* a, index_t lda,
                const T* b, index_t ldb, T beta, T* c, index_t ldc, int threads) {
#if defined(OPENBLAS_VERSION)
  // OpenBLAS's thread count is process-wide: a caller asking for a count gets it (and keeps it);
  // threads == 0 leaves OpenBLAS's own setting.
  if (threads > 0 && openblas_get_num_threads() != threads) openblas_set_num_threads(threads);
#else
  (void)threads;
#endif
  const auto op_a = ta ? CblasTrans : CblasNoTrans, op_b = tb ? CblasTrans : CblasNoTrans;
  const auto bi = [](index_t v) { return static_cast<cblas_int>(std::max<index_t>(v, 1)); };
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, op_a, op_b, static_cast<cblas_int>(m), static_cast<cblas_int>(n),
                static_cast<cblas_int>(k), alpha, a, bi(lda), b, bi(ldb), beta, c, bi(ldc));
  } else {
    cblas_dgemm(CblasRowMajor, op_a, op_b, static_cast<cblas_int>(m), static_cast<cblas_int>(n),
                static_cast<cblas_int>(k), alpha, a, bi(lda), b, bi(ldb), beta, c, bi(ldc));
  }
}

}  // namespace kiln::cpu::detail

#endif  // KILN_HAVE_CBLAS
