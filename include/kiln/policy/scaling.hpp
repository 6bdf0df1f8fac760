// kiln/policy/scaling.hpp — loss scaling tags. precision::fp16_mixed turns the dynamic scaler on
// by default; loss_scaling::dynamic asks for it under another precision (legal, pointless with a
// float exponent range, and reported at start), loss_scaling::none turns it off.
#pragma once

#include <type_traits>

namespace kiln::loss_scaling {

// PyTorch's GradScaler: the loss is multiplied by a scale kept on the device; a step whose
// gradients hold inf or NaN is skipped and the scale halves; 2,000 clean steps double it.
struct dynamic {
  static constexpr const char* name = "dynamic";
  static constexpr bool on = true;
};
struct none {
  static constexpr const char* name = "none";
  static constexpr bool on = false;
};

template <class S>
inline constexpr bool is_scaling_v = std::is_same_v<S, dynamic> || std::is_same_v<S, none>;

}  // namespace kiln::loss_scaling
