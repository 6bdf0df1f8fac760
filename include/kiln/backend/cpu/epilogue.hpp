// kiln/backend/cpu/epilogue.hpp — the passes the CPU executor runs over a GEMM's output to give it
// an epilogue (kiln/core/epilogue.hpp): bias + activation forward, act' + bias gradient backward.
//
// The CPU aux format is simply the pre-activation z = op(A) op(B) + bias, row-major [m, n]: the
// derivative of any kiln::fn functor can be taken from it. Each pass runs right after the GEMM
// that wrote the output, while the output is still in cache.
//
// Column sums accumulate in double over rows in order, one column range per thread, so the bias
// gradient does not depend on the thread count.
#pragma once

#include <algorithm>

#include "kiln/config.hpp"
#include "kiln/core/epilogue.hpp"

namespace kiln::cpu {

// Rows [r0, r1): z = d + bias (bias may be null); aux = z (unless null); d = act(z).
template <class Act, class T>
void bias_act_rows(index_t r0, index_t r1, index_t n, T* d, index_t ldd, const T* bias, T* aux) {
  const Act act{};
  for (index_t i = r0; i < r1; ++i) {
    T* KILN_RESTRICT di = d + i * ldd;
    T* KILN_RESTRICT zi = aux ? aux + i * n : nullptr;
    for (index_t j = 0; j < n; ++j) {
      const T z = bias ? T(di[j] + bias[j]) : di[j];
      if (zi) zi[j] = z;
      di[j] = act(z);
    }
  }
}

// Columns [c0, c1) of an [m, n] gradient: v = g * act'(z) (z = aux, ld n; unused for the
// identity); d (=|+=) v unless d is null; dbias[j] (=|+=) sum_i v unless dbias is null.
// d may alias g (the in-place epilogue of a GEMM that wrote g).
template <class Act, class T>
void dact_cols(index_t m, index_t c0, index_t c1, index_t n, const T* g, index_t ldg, const T* z, T* d,
               index_t ldd, bool add_d, T* dbias, bool add_dbias) {
  constexpr index_t chunk = 64;  // accumulators for one chunk of columns stay in registers / L1
  const Act act{};
  for (index_t cb = c0; cb < c1; cb += chunk) {
    const index_t ce = std::min(c1, cb + chunk);
    double acc[chunk] = {};
    for (index_t i = 0; i < m; ++i) {
      const T* gi = g + i * ldg;
      const T* zi = z ? z + i * n : nullptr;
      T* di = d ? d + i * ldd : nullptr;
      for (index_t j = cb; j < ce; ++j) {
        T v = gi[j];
        if constexpr (!is_identity_act_v<Act>) v = T(v * act.d(zi[j]));
        if (di) di[j] = add_d ? T(di[j] + v) : v;
        acc[j - cb] += double(v);
      }
    }
    if (dbias)
      for (index_t j = cb; j < ce; ++j) dbias[j] = add_dbias ? T(dbias[j] + T(acc[j - cb])) : T(acc[j - cb]);
  }
}

// dbias[i] (=|+=) sum_p op(A)[i, p] for op(A) = Aᵀ, A stored [k, m] with row stride lda:
// columns [c0, c1) of A.
template <class T>
void col_sums(index_t k, index_t c0, index_t c1, const T* a, index_t lda, T* dbias, bool add) {
  dact_cols<fn::Identity, T>(k, c0, c1, 0, a, lda, nullptr, nullptr, 0, false, dbias, add);
}

}  // namespace kiln::cpu
