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

// The executor that runs work in a space (CpuExecutor, CudaExecutor), specialised next to each
// executor, so code generic over the space names its executor as executor_t<Space>.
template <class S>
struct executor_for;
template <class S>
using executor_t = typename executor_for<S>::type;
// An executor for space S; cpu_threads is the CPU executor's thread count (0: all), ignored by
// a device executor (it runs on the default stream).
template <class S>
executor_t<S> make_executor(int cpu_threads = 0);

}  // namespace kiln
