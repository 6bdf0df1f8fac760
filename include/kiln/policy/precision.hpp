// kiln/policy/precision.hpp — precision tags: which type GEMM inputs and saved activations use,
// and what a training step wraps around them.
//
//   fp32        everything in float (the default).
//   tf32        float storage; GEMMs may round their inputs to TF32 inside the tensor cores
//               (cuBLASLt's 32F_FAST_TF32 compute type). On the CPU the same as fp32, and said so.
//   bf16_mixed  GEMM inputs and the activations saved for backward in bfloat16, float
//               accumulation, float master weights in the optimizer; softmax, cross-entropy, norm
//               statistics and reductions in float.
//   fp16_mixed  the same in IEEE half, with a dynamic loss scaler (its range is narrow).
#pragma once

#include <type_traits>

#include "kiln/core/dtype.hpp"

namespace kiln::precision {

struct fp32 {
  static constexpr const char* name = "fp32";
  using low_type = float;
  static constexpr bool mixed = false;
  static constexpr bool scales_loss = false;  // whether a dynamic loss scaler is on by default
};
struct tf32 {
  static constexpr const char* name = "tf32";
  using low_type = float;
  static constexpr bool mixed = false;
  static constexpr bool scales_loss = false;
};
struct bf16_mixed {
  static constexpr const char* name = "bf16_mixed";
  using low_type = kiln::bf16;
  static constexpr bool mixed = true;
  static constexpr bool scales_loss = false;  // bf16 has float's exponent range
};
struct fp16_mixed {
  static constexpr const char* name = "fp16_mixed";
  using low_type = kiln::f16;
  static constexpr bool mixed = true;
  static constexpr bool scales_loss = true;
};

template <class P>
inline constexpr bool is_precision_v =
    std::is_same_v<P, fp32> || std::is_same_v<P, tf32> || std::is_same_v<P, bf16_mixed> || std::is_same_v<P, fp16_mixed>;

}  // namespace kiln::precision
