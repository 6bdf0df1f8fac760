// kiln/policy/policy.hpp — the policy bag: tags in any order, defaults filled in.
//
//   kiln::policy<kiln::precision::bf16_mixed, kiln::accumulate<4>>   // stance fused, no scaler
//   kiln::policy<kiln::stance::force_eager>                          // fp32, every node a kernel
//
// Categories and defaults:
//   precision     precision::fp32 | tf32 | bf16_mixed | fp16_mixed          (fp32)
//   stance        stance::fused | force_eager | eager_on_recompile | fail_on_recompile   (fused)
//   mode          mode::default_ | reduce_overhead | max_autotune           (default_)
//   accumulate    accumulate<N>, N >= 1, or accumulate<kiln::dyn>           (accumulate<1>)
//   loss scaling  loss_scaling::dynamic | none          (dynamic for fp16_mixed, none otherwise)
//   fullgraph     kiln::fullgraph: a fusion boundary in the step (an nn::Opaque layer) is a
//                 compile error                                             (off)
// stance::at_run_time and mode::at_run_time leave the stance and the mode to values given when the
// step is made (kiln::train::select_step's steps); a program names them only through select_step.
// A tag of no category, or two tags of one category, is a static_assert naming them.
#pragma once

#include <cstddef>
#include <type_traits>

#include "kiln/config.hpp"
#include "kiln/policy/accumulate.hpp"
#include "kiln/policy/mode.hpp"
#include "kiln/policy/precision.hpp"
#include "kiln/policy/scaling.hpp"
#include "kiln/policy/stance.hpp"

namespace kiln {

// torch.compile(fullgraph=True): the whole step must fuse as written; no opaque boundaries.
struct fullgraph {
  static constexpr const char* name = "fullgraph";
};

namespace policy_detail {

enum class category { precision, stance, accumulate, loss_scaling, fullgraph, mode, none };

template <class T>
constexpr category category_of() {
  if constexpr (precision::is_precision_v<T>) return category::precision;
  else if constexpr (stance::is_policy_stance_v<T>) return category::stance;
  else if constexpr (mode::is_mode_v<T>) return category::mode;
  else if constexpr (is_accumulate_v<T>) return category::accumulate;
  else if constexpr (loss_scaling::is_scaling_v<T>) return category::loss_scaling;
  else if constexpr (std::is_same_v<T, fullgraph>) return category::fullgraph;
  else return category::none;
}

// Each failure is its own template, so the compiler's note names the offending tags.
template <class Tag>
struct not_a_policy_tag {
  static_assert(dependent_false<Tag>,
                "kiln::policy: a tag is not a policy tag (see not_a_policy_tag<Tag>); the tags are "
                "precision::{fp32, tf32, bf16_mixed, fp16_mixed}, stance::{fused, force_eager, eager_on_recompile, "
                "fail_on_recompile}, mode::{default_, reduce_overhead, max_autotune}, accumulate<N>, "
                "loss_scaling::{dynamic, none} and fullgraph");
};
template <class A, class B>
struct two_precision_tags {
  static_assert(dependent_false<A>, "kiln::policy: two precision tags (see two_precision_tags<A, B>); give one");
};
template <class A, class B>
struct two_stance_tags {
  static_assert(dependent_false<A>, "kiln::policy: two stance tags (see two_stance_tags<A, B>); give one");
};
template <class A, class B>
struct two_accumulate_tags {
  static_assert(dependent_false<A>, "kiln::policy: two accumulate<N> tags (see two_accumulate_tags<A, B>); give one");
};
template <class A, class B>
struct two_loss_scaling_tags {
  static_assert(dependent_false<A>,
                "kiln::policy: two loss_scaling tags (see two_loss_scaling_tags<A, B>); give one");
};
template <class A, class B>
struct two_mode_tags {
  static_assert(dependent_false<A>, "kiln::policy: two mode tags (see two_mode_tags<A, B>); give one");
};
template <class A, class B>
struct fullgraph_twice {
  static_assert(dependent_false<A>, "kiln::policy: fullgraph is given twice; give it once");
};

template <category C, class... Tags>
inline constexpr std::size_t count_of = ((category_of<Tags>() == C ? 1 : 0) + ... + 0);

// The first tag of category C, or Default.
template <category C, class Default, class... Tags>
struct first_of {
  using type = Default;
};
template <category C, class Default, class T, class... Rest>
struct first_of<C, Default, T, Rest...> {
  using type = std::conditional_t<category_of<T>() == C, T, typename first_of<C, Default, Rest...>::type>;
};
// The second tag of category C (void if none), for the duplicate diagnostics.
template <category C, class... Tags>
struct second_of {
  using type = void;
};
template <category C, class T, class... Rest>
struct second_of<C, T, Rest...> {
  using type = std::conditional_t<category_of<T>() == C, typename first_of<C, void, Rest...>::type,
                                  typename second_of<C, Rest...>::type>;
};

template <template <class, class> class Error, category C, class... Tags>
constexpr bool at_most_one() {
  if constexpr (count_of<C, Tags...> > 1) {
    using A = typename first_of<C, void, Tags...>::type;
    using B = typename second_of<C, Tags...>::type;
    return sizeof(Error<A, B>) == 0;
  } else {
    return true;
  }
}

template <class Tag>
constexpr bool known() {
  if constexpr (category_of<Tag>() == category::none) return sizeof(not_a_policy_tag<Tag>) == 0;
  else return true;
}

}  // namespace policy_detail

template <class... Tags>
struct policy {
 private:
  using category = policy_detail::category;
  static constexpr bool checked =
      (policy_detail::known<Tags>() && ... && true) &&
      policy_detail::at_most_one<policy_detail::two_precision_tags, category::precision, Tags...>() &&
      policy_detail::at_most_one<policy_detail::two_stance_tags, category::stance, Tags...>() &&
      policy_detail::at_most_one<policy_detail::two_accumulate_tags, category::accumulate, Tags...>() &&
      policy_detail::at_most_one<policy_detail::two_loss_scaling_tags, category::loss_scaling, Tags...>() &&
      policy_detail::at_most_one<policy_detail::fullgraph_twice, category::fullgraph, Tags...>() &&
      policy_detail::at_most_one<policy_detail::two_mode_tags, category::mode, Tags...>();
  static_assert(checked);

 public:
  using precision = typename policy_detail::first_of<category::precision, kiln::precision::fp32, Tags...>::type;
  using stance = typename policy_detail::first_of<category::stance, kiln::stance::fused, Tags...>::type;
  using mode = typename policy_detail::first_of<category::mode, kiln::mode::default_, Tags...>::type;
  using accumulate_tag = typename policy_detail::first_of<category::accumulate, kiln::accumulate<1>, Tags...>::type;
  using loss_scaling = typename policy_detail::first_of<
      category::loss_scaling,
      std::conditional_t<precision::scales_loss, kiln::loss_scaling::dynamic, kiln::loss_scaling::none>, Tags...>::type;
  // Micro-batches per optimizer step (kiln::dyn: given at run time).
  static constexpr index_t accumulate = accumulate_tag::count;
  static constexpr bool fullgraph = policy_detail::count_of<category::fullgraph, Tags...> == 1;

 private:
  static_assert(sizeof(accumulate_tag) > 0);  // instantiates accumulate<N>'s own check
};

template <class T>
inline constexpr bool is_policy_v = false;
template <class... Tags>
inline constexpr bool is_policy_v<policy<Tags...>> = true;

}  // namespace kiln
