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

// Fused kernels, and under mode::reduce_overhead a batch shape met after the first capture runs
// eagerly (through the tape) instead of being captured.
struct eager_on_recompile {
  static constexpr const char* name = "eager_on_recompile";
};
// Fused kernels, and under mode::reduce_overhead a batch shape met after the first capture is an
// error naming it and the captured ones (a loop that must never recapture).
struct fail_on_recompile {
  static constexpr const char* name = "fail_on_recompile";
};

// Any of the four, chosen when the step is made (kiln::train::select_step's steps): one Step
// type runs every stance, its stance a value (PolicyInfo). Not a stance a user names.
struct at_run_time {
  static constexpr const char* name = "at_run_time";
};

// The stances that choose kernels (kiln::assign, the optimizers' step<Stance>).
template <class S>
inline constexpr bool is_stance_v = std::is_same_v<S, fused> || std::is_same_v<S, force_eager>;
// Every stance a policy takes.
template <class S>
inline constexpr bool is_policy_stance_v =
    is_stance_v<S> || std::is_same_v<S, eager_on_recompile> || std::is_same_v<S, fail_on_recompile> ||
    std::is_same_v<S, at_run_time>;
// The kernels a policy stance runs: force_eager's own, fused for the others.
template <class S>
using kernels_of = std::conditional_t<std::is_same_v<S, force_eager>, force_eager, fused>;

}  // namespace kiln::stance
