// kiln/core/epilogue.hpp — what a GEMM may do to its output before it returns: the requests a
// Linear layer makes of an executor, in words both backends understand.
//
//   forward   D = act(alpha op(A) op(B) + beta C + bias[j])       BiasAct<Act, T>
//             and keeps what act' needs ("aux") for the backward;
//   backward  D = (alpha op(A) op(B)) * act'(aux)                   DAct<Act, T>
//             and dbias[j] (=|+=) sum_i D[i, j];
//   weights   dW = alpha op(A) op(B) + beta C                       BGradA<T>
//             and dbias[i] (=|+=) sum_k op(A)[i, k].
//
// Act is an elementwise functor of kiln::fn (operator() and d()); fn::Identity means no
// activation. On CUDA these map onto cuBLASLt's epilogues where one exists (RELU_AUX_BIAS /
// DRELU_BGRAD, GELU_AUX_BIAS / DGELU_BGRAD for the tanh GELU, BIAS, BGRADA/B), so the whole request
// is ONE library call; other activations take the GEMM plus one kernel. The CPU executor runs
// its GEMM and then one pass over the output it just wrote.
//
// The aux buffer's format belongs to the executor (cuBLASLt's ReLU aux is an opaque bit-mask):
// size it with exec.act_aux_bytes<Act, T>(m, n) and hand it back unchanged to DAct and dact().
//
// T is the type of the GEMM's inputs and output (float, or bf16 / f16 under mixed precision:
// products accumulate in float, the output is rounded once). The bias and its gradient are always
// in compute_t<T> (float for the half types): they belong to the float master parameters.
#pragma once

#include <string>
#include <type_traits>

#include "kiln/config.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/expr/functors.hpp"

namespace kiln {

template <class Act>
inline constexpr bool is_identity_act_v = std::is_same_v<Act, fn::Identity>;

// Forward epilogue. bias may be null (no bias); aux may be null only when Act is the identity.
template <class Act, class T>
struct BiasAct {
  const compute_t<T>* bias = nullptr;
  void* aux = nullptr;
};

// Backward epilogue on the GEMM that produces the activation's output gradient. `out` is the
// forward's D (the activation's output; the CUDA ReLU path reads its sign instead of the mask
// outside cuBLASLt). dbias may be null; add_dbias adds to it instead of writing it.
template <class Act, class T>
struct DAct {
  const void* aux = nullptr;
  const T* out = nullptr;
  compute_t<T>* dbias = nullptr;
  bool add_dbias = false;
};

// Bias gradient from the A operand of the weight-gradient GEMM (A = dZ, transposed).
template <class T>
struct BGradA {
  compute_t<T>* dbias = nullptr;
  bool add_dbias = false;
};

// Launch names for the fusion report: "gemm+bias+relu", "gemm+drelu+bgrad", "gemm+bgrada".
template <class Act>
const std::string& bias_act_name(bool bias) {
  static const std::string with = is_identity_act_v<Act> ? "gemm+bias" : std::string("gemm+bias+") + Act::name;
  static const std::string without = is_identity_act_v<Act> ? "gemm" : std::string("gemm+") + Act::name;
  return bias ? with : without;
}
template <class Act>
const std::string& dact_name(bool bgrad) {
  static const std::string with = std::string("gemm+d") + Act::name + "+bgrad";
  static const std::string without = std::string("gemm+d") + Act::name;
  return bgrad ? with : without;
}

}  // namespace kiln
