// kiln/backend/cuda/epilogue.cuh — the kernels behind the CUDA executor's GEMM epilogues
// (kiln/core/epilogue.hpp) where cuBLASLt has none of its own (or its heuristic finds no kernel
// for one): bias + activation after a plain GEMM, act' with the bias gradient (column sums), and
// adding a bias gradient that cuBLASLt can only overwrite.
//
// The CUDA aux formats (exec.act_aux_bytes):
//   fn::Relu      cuBLASLt's ReLU bit-mask, relu_mask_ld(n) bits per row (opaque: outside
//                 cuBLASLt the derivative is read from the sign of the forward's output, so
//                 the kernel path writes no aux);
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

}  // namespace kiln::cu

namespace kiln::cu::kernels {

// z = d[i, j] + bias[j] (bias may be null); aux[i, j] = z when aux is not null; d = act(z).
// Over an [m, n] matrix: d row stride ldd, aux row stride ldaux.
template <class Act, class T, class B>
KILN_GLOBAL void bias_act(T* d, index_t ldd, const B* bias, T* aux, index_t ldaux, index_t m, index_t n) {
  const index_t total = m * n;
  for (index_t e = index_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += index_t(gridDim.x) * blockDim.x) {
    const index_t i = e / n, j = e - i * n;
    const float z = convert<float>(d[i * ldd + j]) + (bias ? convert<float>(bias[j]) : 0.f);
    if (aux) aux[i * ldaux + j] = convert<T>(z);
    d[i * ldd + j] = convert<T>(Act{}(z));
  }
}

// One thread per column j (adjacent threads read adjacent columns: coalesced): v = g * act' down
// the column; d (=|+=) v unless d is null; dbias[j] (=|+=) the column's sum unless dbias is null.
// Each column is summed in row order, so results do not depend on the launch shape.
template <class Deriv, class T, class B>
KILN_GLOBAL void dact_columns(index_t m, index_t n, const T* g, index_t ldg, Deriv deriv, T* d, index_t ldd,
                              bool add_d, B* dbias, bool add_dbias) {
  const index_t j = index_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= n) return;
  float acc = 0.f;
  for (index_t i = 0; i < m; ++i) {
    const float v = convert<float>(g[i * ldg + j]) * deriv(i, j);
    if (d) d[i * ldd + j] = convert<T>(add_d ? convert<float>(d[i * ldd + j]) + v : v);
    acc += v;
  }
  if (dbias) dbias[j] = convert<B>(add_dbias ? convert<float>(dbias[j]) + acc : acc);
}

// dst[i] += src[i].
template <class T, class S>
KILN_GLOBAL void add_vector(T* dst, const S* src, index_t n) {
  for (index_t i = index_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += index_t(gridDim.x) * blockDim.x)
    dst[i] = convert<T>(convert<float>(dst[i]) + convert<float>(src[i]));
}

}  // namespace kiln::cu::kernels
