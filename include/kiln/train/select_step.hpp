// kiln/train/select_step.hpp — a training step whose policy is named at run time (a command-line
// flag, a config file), compiled only for the policies a program lists.
//
//   kiln::train::AnyStep<Model, Opt, kiln::CpuExecutor> step = kiln::train::select_step<kiln::train::every_combo,
//       kiln::accumulate<kiln::dyn>>(o.precision, o.stance, o.mode, model, opt, exec, {}, {.accumulate = 4});
//   while (const auto* batch = loader.next()) (*step)(*batch);
//
// An AnyStep is a StepBase (kiln/train/step_base.hpp) behind a pointer: the loop, checkpoints
// and report() that drive it are compiled once, whatever the policy. What is compiled per
// precision is one Step: its forward and backward in the precision, and — where Combos name more
// than one stance or mode — the stance and the mode as values (stance::at_run_time,
// mode::at_run_time): both optimizer forms, the capture and the tuner code, chosen when the step
// is made. tf32 runs fp32's code (its step is fp32's Step told it is tf32), so fp32 and tf32
// compile once between them.
//
// The cost is stated: select_step compiles 3 precisions' code (fp32 and tf32, bf16_mixed,
// fp16_mixed), one Step type each, into the translation unit that calls it. A program that wants them built in parallel gives each precision its own
// translation unit: a function per precision, declared in a header shared by the program's files
// and defined in its own .cpp with make_precision_step (examples/train_digits does: four files,
// two at a time with -j2).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "kiln/core/error.hpp"
#include "kiln/force_eager.hpp"  // the stances it selects include force_eager
#include "kiln/policy/policy.hpp"
#include "kiln/train/step.hpp"

namespace kiln::train {

template <class Model, class Optimizer, class Exec, class Loss = CrossEntropy>
using AnyStep = std::unique_ptr<StepBase<Model, Optimizer, Exec, Loss>>;

// A (stance, mode) pair a program builds, and a list of them.
template <class Stance, class Mode>
struct combo {
  using stance = Stance;
  using mode = Mode;
};
template <class... Combos>
struct combos {};
// What select_policy (kiln/policy/select.hpp) allows: under mode default the stances fused and
// force_eager; under reduce_overhead fused and the two recompile stances; under max_autotune fused.
using every_combo =
    combos<combo<stance::fused, mode::default_>, combo<stance::force_eager, mode::default_>,
           combo<stance::fused, mode::reduce_overhead>, combo<stance::eager_on_recompile, mode::reduce_overhead>,
           combo<stance::fail_on_recompile, mode::reduce_overhead>, combo<stance::fused, mode::max_autotune>>;

// The Step of one policy, as an AnyStep.
template <class Policy, class Model, class Optimizer, class Exec, class Loss = CrossEntropy>
AnyStep<Model, Optimizer, Exec, Loss> make_step(Model& model, Optimizer& optimizer, Exec& exec, Loss loss = {},
                                                StepOptions options = {}) {
  return std::make_unique<Step<Model, Optimizer, Exec, Policy, Loss>>(model, optimizer, exec, Policy{}, std::move(loss),
                                                                      std::move(options));
}

namespace detail {
// The precision whose code a precision's step runs: tf32 is fp32's code with the executor's TF32
// units allowed (StepBase sets that from the policy's values), so a program that builds both
// compiles the code once.
template <class Precision>
struct code_precision {
  using type = Precision;
};
template <>
struct code_precision<precision::tf32> {
  using type = precision::fp32;
};

// The stance and mode tags of the Step type that runs every pair of Combos: the pairs' own when
// they all share it, else at_run_time.
template <class Combos>
struct code_tags;
template <class First, class... Rest>
struct code_tags<combos<First, Rest...>> {
  using stance = std::conditional_t<(std::is_same_v<typename First::stance, typename Rest::stance> && ...),
                                    typename First::stance, kiln::stance::at_run_time>;
  using mode = std::conditional_t<(std::is_same_v<typename First::mode, typename Rest::mode> && ...),
                                  typename First::mode, kiln::mode::at_run_time>;
};

template <class... C>
std::string combo_names(combos<C...>) {
  std::string out;
  ((out += (out.empty() ? "" : ", ") + std::string(C::stance::name) + " with mode " + C::mode::name), ...);
  return out;
}

inline void check_stance_and_mode(std::string_view stance_name, std::string_view mode_name) {
  const bool stance_known = stance_name == stance::fused::name || stance_name == stance::force_eager::name ||
                            stance_name == stance::eager_on_recompile::name ||
                            stance_name == stance::fail_on_recompile::name;
  KILN_CHECK(stance_known, ValueError, "unknown stance \"", stance_name,
             "\"; the stances are fused, force_eager, eager_on_recompile and fail_on_recompile");
  const bool mode_known = mode_name == mode::default_::name || mode_name == mode::reduce_overhead::name ||
                          mode_name == mode::max_autotune::name;
  KILN_CHECK(mode_known, ValueError, "unknown mode \"", mode_name,
             "\"; the modes are default, reduce_overhead and max_autotune");
  KILN_CHECK(mode_name == mode::reduce_overhead::name || (stance_name != stance::eager_on_recompile::name &&
                                                          stance_name != stance::fail_on_recompile::name),
             ValueError, "the stance ", stance_name, " is about recompiling a captured step: it needs mode ",
             "reduce_overhead");
}
}  // namespace detail

// The step of precision Precision with the stance and mode named, one of Combos (a ValueError
// naming the pairs built when it is none of them), with the tags Fixed (accumulation, loss
// scaling, fullgraph) added to its policy.
template <class Precision, class Combos, class... Fixed, class Model, class Optimizer, class Exec,
          class Loss = CrossEntropy>
AnyStep<Model, Optimizer, Exec, Loss> make_precision_step(std::string_view stance_name, std::string_view mode_name,
                                                          Model& model, Optimizer& optimizer, Exec& exec,
                                                          Loss loss = {}, StepOptions options = {}) {
  detail::check_stance_and_mode(stance_name, mode_name);
  AnyStep<Model, Optimizer, Exec, Loss> out;
  auto one = [&]<class C>(std::type_identity<C>) {
    if (out || stance_name != C::stance::name || mode_name != C::mode::name) return;
    using P = policy<Precision, typename C::stance, typename C::mode, Fixed...>;
    using Code = policy<typename detail::code_precision<Precision>::type, typename detail::code_tags<Combos>::stance,
                        typename detail::code_tags<Combos>::mode, Fixed...>;
    out = std::make_unique<Step<Model, Optimizer, Exec, Code, Loss>>(model, optimizer, exec, policy_info<P, Exec>(), loss,
                                                                     options);
  };
  [&]<class... C>(combos<C...>) { (one(std::type_identity<C>{}), ...); }(Combos{});
  KILN_CHECK(out != nullptr, ValueError, "stance ", stance_name, " with mode ", mode_name,
             " is not built into this program; it has ", detail::combo_names(Combos{}));
  return out;
}

// Every precision (fp32, tf32, bf16_mixed, fp16_mixed) × Combos, in this translation unit.
template <class Combos, class... Fixed, class Model, class Optimizer, class Exec, class Loss = CrossEntropy>
AnyStep<Model, Optimizer, Exec, Loss> select_step(std::string_view precision_name, std::string_view stance_name,
                                                  std::string_view mode_name, Model& model, Optimizer& optimizer,
                                                  Exec& exec, Loss loss = {}, StepOptions options = {}) {
  auto make = [&]<class P>(std::type_identity<P>) {
    return make_precision_step<P, Combos, Fixed...>(stance_name, mode_name, model, optimizer, exec, std::move(loss),
                                                    std::move(options));
  };
  if (precision_name == precision::fp32::name) return make(std::type_identity<precision::fp32>{});
  if (precision_name == precision::tf32::name) return make(std::type_identity<precision::tf32>{});
  if (precision_name == precision::bf16_mixed::name) return make(std::type_identity<precision::bf16_mixed>{});
  if (precision_name == precision::fp16_mixed::name) return make(std::type_identity<precision::fp16_mixed>{});
  throw ValueError(kiln::detail::concat("unknown precision \"", precision_name,
                                        "\"; the precisions are fp32, tf32, bf16_mixed and fp16_mixed"));
}

}  // namespace kiln::train
