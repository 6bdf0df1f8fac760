// kiln/backend/cuda/epilogue.cuh — the kernels behind the CUDA executor's GEMM epilogues
// (kiln/core/epilogue.hpp) where cuBLASLt has none of its own (or its heuristic finds no kernel
// for one): bias + activation after a plain GEMM, act' with the bias gradient (column sums), and
// adding a bias gradient that cuBLASLt can only overwrite.
//
// The CUDA aux formats (exec.act_aux_bytes):
//   fn::Relu      cuBLASLt's ReLU bit-mask, relu_mask_ld(n) bits per row (opaque: outside
//                 cuBLASLt the derivative is read from the sign of the forward's output, so
//                 the kernel path writes no aux, and the executor runs cuBLASLt's DRELU only on
//                 a mask it knows cuBLASLt's forward wrote);
//   fn::GeluTanh  the GELU input z, gelu_aux_ld(n) elements per row (cuBLASLt's GELU aux; the
//                 kernel path writes the same layout, so either backward reads either forward's);
//   others        z, n elements per row.
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "kiln/backend/cuda/cublaslt.cuh"
#include "kiln/config.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/core/epilogue.hpp"

namespace kiln::cu {

// Activations with a cuBLASLt epilogue of their own (GELU there is the tanh form).
template <class Act>
inline constexpr bool lt_activation_v = std::is_same_v<Act, fn::Relu> || std::is_same_v<Act, fn::GeluTanh>;

// Row stride of the aux matrix of an [m, n] output (bits for the ReLU mask, elements otherwise).
template <class Act>
constexpr index_t act_aux_ld(index_t n) {
  if constexpr (std::is_same_v<Act, fn::Relu>) return relu_mask_ld(n);
  else if constexpr (std::is_same_v<Act, fn::GeluTanh>) return gelu_aux_ld(n);
  else return n;
}

// act'(z) at (i, j), three ways.
template <class Act, class T>
struct DerivFromInput {  // from the saved input z
  const T* z;
  index_t ldz;
  KILN_HOST_DEVICE float operator()(index_t i, index_t j) const { return Act{}.d(convert<float>(z[i * ldz + j])); }
};
template <class T>
struct ReluDerivFromOutput {  // relu(z) > 0 exactly when z > 0
  const T* out;
  index_t ld;
  KILN_HOST_DEVICE float operator()(index_t i, index_t j) const {
    return convert<float>(out[i * ld + j]) > 0.f ? 1.f : 0.f;
  }
};
struct UnitDeriv {  // no activation: column sums only
  KILN_HOST_DEVICE float operator()(index_t, index_t) const { return 1.f; }
};

// The activation backward over an [m, n] gradient g: v = g * act' at each (i, j); d (=|+=) v
// unless d is null; dbias[j] (=|+=) column j's sum unless dbias is null. As an element kernel
// (operator(), when there is no bias gradient) or as column_sums terms (rowwise.cuh: tiled,
// deterministic sums).
template <class Deriv, class T, class B>
struct DactTerms {
  using sum_type = float;
  static constexpr int sums = 1;
  const T* g;
  index_t ldg;
  Deriv deriv;
  T* d;
  index_t ldd;
  bool add_d;
  B* dbias;
  bool add_dbias;
  KILN_HOST_DEVICE float value(index_t i, index_t j) const {
    const float v = convert<float>(g[i * ldg + j]) * deriv(i, j);
    if (d) d[i * ldd + j] = convert<T>(add_d ? convert<float>(d[i * ldd + j]) + v : v);
    return v;
  }
  KILN_HOST_DEVICE void operator()(index_t i, index_t j) const { (void)value(i, j); }
  KILN_HOST_DEVICE void terms(index_t i, index_t j, float (&v)[1]) const { v[0] = value(i, j); }
  KILN_HOST_DEVICE void finish(index_t j, const float (&s)[1]) const {
    if (dbias) dbias[j] = convert<B>(add_dbias ? convert<float>(dbias[j]) + s[0] : s[0]);
  }
};

}  // namespace kiln::cu

namespace kiln::cu::kernels {

// z = d[i, j] + bias[j] (bias may be null); aux[i, j] = z when aux is not null; d = act(z).
// Over an [m, n] matrix: d row stride ldd, aux row stride ldaux. I is the flat index's type
// (32-bit when m * n < 2^31: the division is then one hardware-assisted 32-bit sequence, not
// a 64-bit one the GPU emulates).
template <class Act, class I, class T, class B>
KILN_GLOBAL void bias_act(T* d, index_t ldd, const B* bias, T* aux, index_t ldaux, I m, I n) {
  const I total = m * n;
  for (I e = I(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += I(gridDim.x) * blockDim.x) {
    const I i = e / n, j = e - i * n;
    const float z = convert<float>(d[i * ldd + j]) + (bias ? convert<float>(bias[j]) : 0.f);
    if (aux) aux[i * ldaux + j] = convert<T>(z);
    d[i * ldd + j] = convert<T>(Act{}(z));
  }
}

// D = alpha·op(A)·op(B) + beta·C (C read only when beta != 0), one thread per output element,
// summed in float in k order: the fallback for a plain GEMM cuBLASLt has no kernel for (a
// dimension of 1 on some GPUs — PyTorch keeps those away from cuBLASLt too). Such GEMMs are
// matrix-vector products or outer products, bound by memory, where this loses little; a long k
// with a tiny output is slow here but correct.
template <class T, class C>
KILN_GLOBAL void gemm_fallback(bool ta, bool tb, index_t m, index_t n, index_t k, float alpha, const T* a,
                               index_t lda, const T* b, index_t ldb, float beta, const C* c, index_t ldc, C* d,
                               index_t ldd) {
  const index_t total = m * n;
  for (index_t e = index_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += index_t(gridDim.x) * blockDim.x) {
    const index_t i = e / n, j = e - i * n;
    float acc = 0.f;
    for (index_t p = 0; p < k; ++p)
      acc += convert<float>(ta ? a[p * lda + i] : a[i * lda + p]) * convert<float>(tb ? b[j * ldb + p] : b[p * ldb + j]);
    float v = alpha * acc;
    if (beta != 0.f) v += beta * convert<float>(c[i * ldc + j]);
    d[i * ldd + j] = convert<C>(v);
  }
}

// dst[i] += src[i].
template <class T, class S>
KILN_GLOBAL void add_vector(T* dst, const S* src, index_t n) {
  for (index_t i = index_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += index_t(gridDim.x) * blockDim.x)
    dst[i] = convert<T>(convert<float>(dst[i]) + convert<float>(src[i]));
}

}  // namespace kiln::cu::kernels
