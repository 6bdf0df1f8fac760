// kiln/backend/cpu/epilogue.hpp — the passes the CPU executor runs over a GEMM's output to give it
// an epilogue (kiln/core/epilogue.hpp): bias + activation forward, act' + bias gradient backward.
//
// The CPU aux format is simply the pre-activation z = op(A) op(B) + bias, row-major [m, n], in the
// output's type: the derivative of any kiln::fn functor can be taken from it. Each pass runs right
// after the GEMM that wrote the output, while the output is still in cache.
//
// Types: T is the output's (and aux's) type, C = compute_t<T> the type arithmetic runs in and the
// bias and its gradient are kept in. For T = float the GEMM's result is the output itself and the
// pass works in place; for bf16 / f16 the GEMM writes float into a scratch buffer and the pass
// rounds each value once, as it stores it (round to nearest even) — exactly what a GPU's
// half-precision GEMM epilogue does.
//
// Column sums accumulate in double over rows in order, one column range per thread, so the bias
// gradient does not depend on the thread count.
#pragma once

#include <algorithm>
#include <type_traits>

#include "kiln/config.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/core/epilogue.hpp"
#include "kiln/expr/functors.hpp"

namespace kiln::cpu {

// Rows [r0, r1): z = src + bias (bias may be null); aux = z (unless null); d = act(z).
// src is the GEMM's result in C (row stride lds); for T = C it may be d itself.
template <class Act, class T>
void bias_act_rows(index_t r0, index_t r1, index_t n, const compute_t<T>* src, index_t lds, T* d, index_t ldd,
                   const compute_t<T>* bias, T* aux) {
  using C = compute_t<T>;
  const Act act{};
  if constexpr (std::is_same_v<T, C>) {
    (void)src;
    (void)lds;
    for (index_t i = r0; i < r1; ++i) {
      T* KILN_RESTRICT di = d + i * ldd;
      T* KILN_RESTRICT zi = aux ? aux + i * n : nullptr;
      for (index_t j = 0; j < n; ++j) {
        const T z = bias ? T(di[j] + bias[j]) : di[j];
        if (zi) zi[j] = z;
        di[j] = act(z);
      }
    }
  } else {
    for (index_t i = r0; i < r1; ++i) {
      const C* KILN_RESTRICT si = src + i * lds;
      T* KILN_RESTRICT di = d + i * ldd;
      T* KILN_RESTRICT zi = aux ? aux + i * n : nullptr;
      for (index_t j = 0; j < n; ++j) {
        const C z = bias ? C(si[j] + bias[j]) : si[j];
        if (zi) zi[j] = convert<T>(z);
        di[j] = convert<T>(act(z));
      }
    }
  }
}

// Columns [c0, c1) of an [m, n] gradient: v = g * act'(z) (z = aux, ld n; unused for the
// identity); d (=|+=) v unless d is null; dbias[j] (=|+=) sum_i v unless dbias is null.
// g is in T or in C (a GEMM's float result); d may alias g (the in-place epilogue of a GEMM that
// wrote g).
template <class Act, class T, class G>
void dact_cols(index_t m, index_t c0, index_t c1, index_t n, const G* g, index_t ldg, const T* z, T* d,
               index_t ldd, bool add_d, compute_t<T>* dbias, bool add_dbias) {
  using C = compute_t<T>;
  constexpr index_t chunk = 64;  // accumulators for one chunk of columns stay in registers / L1
  const Act act{};
  for (index_t cb = c0; cb < c1; cb += chunk) {
    const index_t ce = std::min(c1, cb + chunk);
    double acc[chunk] = {};
    for (index_t i = 0; i < m; ++i) {
      const G* gi = g + i * ldg;
      const T* zi = z ? z + i * n : nullptr;
      T* di = d ? d + i * ldd : nullptr;
      for (index_t j = cb; j < ce; ++j) {
        C v = convert<C>(gi[j]);
        if constexpr (!is_identity_act_v<Act>) v = C(v * act.d(convert<C>(zi[j])));
        if (di) di[j] = add_d ? convert<T>(C(convert<C>(di[j]) + v)) : convert<T>(v);
        acc[j - cb] += double(v);
      }
    }
    if (dbias)
      for (index_t j = cb; j < ce; ++j) dbias[j] = add_dbias ? C(dbias[j] + C(acc[j - cb])) : C(acc[j - cb]);
  }
}

// dbias[i] (=|+=) sum_p op(A)[i, p] for op(A) = Aᵀ, A stored [k, m] with row stride lda:
// columns [c0, c1) of A.
template <class T>
void col_sums(index_t k, index_t c0, index_t c1, const T* a, index_t lda, compute_t<T>* dbias, bool add) {
  dact_cols<fn::Identity, T, T>(k, c0, c1, 0, a, lda, nullptr, nullptr, 0, false, dbias, add);
}

// Rows [r0, r1) of src (C, row stride lds) stored into d (T, row stride ldd), each value rounded
// once: a GEMM's float result written to a half-precision output.
template <class T>
void store_rows(index_t r0, index_t r1, index_t n, const compute_t<T>* src, index_t lds, T* d, index_t ldd) {
  for (index_t i = r0; i < r1; ++i) {
    const compute_t<T>* KILN_RESTRICT si = src + i * lds;
    T* KILN_RESTRICT di = d + i * ldd;
    for (index_t j = 0; j < n; ++j) di[j] = convert<T>(si[j]);
  }
}

// kiln::kernels (kiln/config.hpp) compiles these passes once for kiln's activations and element
// types (src/kernels/epilogue.cpp); an activation of one's own is compiled where it is used.
#define KILN_CPU_EPILOGUE_INSTANCES(EXTERN, Act)                                                                    \
  EXTERN template void bias_act_rows<Act, float>(index_t, index_t, index_t, const float*, index_t, float*, index_t, \
                                                 const float*, float*);                                             \
  EXTERN template void bias_act_rows<Act, bf16>(index_t, index_t, index_t, const float*, index_t, bf16*, index_t,   \
                                                const float*, bf16*);                                               \
  EXTERN template void bias_act_rows<Act, f16>(index_t, index_t, index_t, const float*, index_t, f16*, index_t,     \
                                               const float*, f16*);                                                 \
  EXTERN template void dact_cols<Act, float, float>(index_t, index_t, index_t, index_t, const float*, index_t,      \
                                                    const float*, float*, index_t, bool, float*, bool);             \
  EXTERN template void dact_cols<Act, bf16, bf16>(index_t, index_t, index_t, index_t, const bf16*, index_t,         \
                                                  const bf16*, bf16*, index_t, bool, float*, bool);                 \
  EXTERN template void dact_cols<Act, bf16, float>(index_t, index_t, index_t, index_t, const float*, index_t,       \
                                                   const bf16*, bf16*, index_t, bool, float*, bool);                \
  EXTERN template void dact_cols<Act, f16, f16>(index_t, index_t, index_t, index_t, const f16*, index_t,            \
                                                const f16*, f16*, index_t, bool, float*, bool);                     \
  EXTERN template void dact_cols<Act, f16, float>(index_t, index_t, index_t, index_t, const float*, index_t,        \
                                                  const f16*, f16*, index_t, bool, float*, bool);
#define KILN_CPU_EPILOGUE_ACTIVATIONS(EXTERN)            \
  KILN_CPU_EPILOGUE_INSTANCES(EXTERN, fn::Identity)      \
  KILN_CPU_EPILOGUE_INSTANCES(EXTERN, fn::Relu)          \
  KILN_CPU_EPILOGUE_INSTANCES(EXTERN, fn::GeluErf)       \
  KILN_CPU_EPILOGUE_INSTANCES(EXTERN, fn::GeluTanh)      \
  KILN_CPU_EPILOGUE_INSTANCES(EXTERN, fn::Silu)          \
  KILN_CPU_EPILOGUE_INSTANCES(EXTERN, fn::Tanh)          \
  KILN_CPU_EPILOGUE_INSTANCES(EXTERN, fn::Sigmoid)       \
  KILN_CPU_EPILOGUE_INSTANCES(EXTERN, fn::Softplus)
#if KILN_EXTERN_KERNELS
KILN_CPU_EPILOGUE_ACTIVATIONS(extern)
#endif

}  // namespace kiln::cpu
