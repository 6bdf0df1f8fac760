// kiln/core/space.hpp — memory spaces are types, so mixing them is a compile error.
#pragma once

#include <type_traits>

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

// A dependent false for static_asserts in templates that must not be instantiated.
template <class...>
inline constexpr bool dependent_false = false;

}  // namespace kiln
