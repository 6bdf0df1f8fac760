// kiln/policy/accumulate.hpp — gradient accumulation: N micro-batches per optimizer step.
//
// accumulate<4>: the loss of each micro-batch is scaled by 1/4, gradients add up over four
// micro-batches, then one optimizer step (and one loss-scaler check and update). The effective
// batch is 4 × the loader's batch; schedules count optimizer steps. accumulate<kiln::dyn> takes
// the count at run time (train::StepOptions::accumulate), checked at start.
#pragma once

#include "kiln/core/extents.hpp"

namespace kiln {

template <index_t N>
struct accumulate {
  static_assert(N >= 1 || N == dyn,
                "kiln::accumulate<N>: N micro-batches per optimizer step must be at least 1 (or kiln::dyn for a "
                "count given at run time)");
  static constexpr index_t count = N;
};

template <class T>
inline constexpr bool is_accumulate_v = false;
template <index_t N>
inline constexpr bool is_accumulate_v<accumulate<N>> = true;

}  // namespace kiln
