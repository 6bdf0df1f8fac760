// kiln/policy/mode.hpp — modes, named after torch.compile's: what a training step does around its
// kernels.
//
//   mode::default_         heuristic kernel choices, every step runs through the autograd tape
//                          ("default"; today's behaviour).
//   mode::reduce_overhead  the first step at a batch shape is captured, later steps at that shape
//                          replay it: on CUDA a CUDA graph, on the CPU the captured launches run
//                          again with no tape and no allocation (kiln/backend/cpu/step_graph.hpp).
//                          What happens at a new shape is the stance's choice (stance.hpp).
//   mode::max_autotune     each GEMM shape the step meets is timed once over its candidates and
//                          the fastest kept, cached on disk (kiln/tune/autotune.hpp).
#pragma once

#include <type_traits>

namespace kiln::mode {

struct default_ {
  static constexpr const char* name = "default";
  static constexpr bool captures = false;
  static constexpr bool autotunes = false;
};
struct reduce_overhead {
  static constexpr const char* name = "reduce_overhead";
  static constexpr bool captures = true;
  static constexpr bool autotunes = false;
};
struct max_autotune {
  static constexpr const char* name = "max_autotune";
  static constexpr bool captures = false;
  static constexpr bool autotunes = true;
};

// Any of the three, chosen when the step is made (kiln::train::select_step's steps): one Step
// type has the capture and the tuner code and runs what its PolicyInfo says. Not a mode a user
// names.
struct at_run_time {
  static constexpr const char* name = "at_run_time";
  static constexpr bool captures = true;
  static constexpr bool autotunes = true;
};

template <class M>
inline constexpr bool is_mode_v = std::is_same_v<M, default_> || std::is_same_v<M, reduce_overhead> ||
                                  std::is_same_v<M, max_autotune> || std::is_same_v<M, at_run_time>;

}  // namespace kiln::mode
