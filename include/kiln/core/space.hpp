// kiln/core/space.hpp — memory spaces are types, so mixing them is a compile error.
#pragma once

#include <type_traits>

#include "kiln/config.hpp"

namespace kiln {

// Tag types (lower case, like std tags): where a tensor's bytes live.
struct host {
  static constexpr const char* name = "host";
};
struct cuda {
  static constexpr const char* name = "cuda";
};

template <class S>
inline constexpr bool is_space_v = std::is_same_v<S, host> || std::is_same_v<S, cuda>;

}  // namespace kiln
