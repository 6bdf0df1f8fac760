// kiln/policy/stance.hpp — compile stances, named after torch.compiler.set_stance's values.
#pragma once

#include <type_traits>

namespace kiln::stance {

// Elementwise chains fuse into one kernel (the default).
struct fused {
  static constexpr const char* name = "fused";
};
// Every node is its own kernel writing its own buffer: the baseline for measuring fusion and
// for debugging a fused result.
struct force_eager {
  static constexpr const char* name = "force_eager";
};

template <class S>
inline constexpr bool is_stance_v = std::is_same_v<S, fused> || std::is_same_v<S, force_eager>;

}  // namespace kiln::stance
