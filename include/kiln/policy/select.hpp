// kiln/policy/select.hpp — choosing a policy at run time (a command-line flag, a config file):
// every combination the names can select is compiled in, and the names pick one.
//
//   kiln::select_policy<kiln::accumulate<kiln::dyn>>(o.precision, o.stance, [&]<class Policy>() {
//     train<Policy>(...);
//   });
//
// Precision names: fp32, tf32, bf16_mixed, fp16_mixed (precision::X::name); stance names: fused,
// force_eager. Fixed tags (accumulation, loss scaling, fullgraph) are added to each policy.
//
// The overload with a mode name (default, reduce_overhead, max_autotune) adds the mode. To keep
// the number of compiled policies in check it takes the combinations that mean something: under
// default every stance; under reduce_overhead fused and the two recompile stances
// (eager_on_recompile, fail_on_recompile); under max_autotune fused. Others are a ValueError
// saying which combinations exist.
#pragma once

#include <string_view>
#include <utility>

#include "kiln/core/error.hpp"
#include "kiln/policy/policy.hpp"

namespace kiln {

namespace policy_detail {
template <class... Tags>
struct tag_list {};

template <class Stance, class... Fixed, class F, class P, class... Ps>
void select_precision(tag_list<Fixed...>, tag_list<P, Ps...>, std::string_view name, F& f) {
  if (name == P::name) {
    f.template operator()<policy<P, Stance, Fixed...>>();
  } else if constexpr (sizeof...(Ps) > 0) {
    select_precision<Stance>(tag_list<Fixed...>{}, tag_list<Ps...>{}, name, f);
  } else {
    throw ValueError(kiln::detail::concat("unknown precision \"", name,
                                          "\"; the precisions are fp32, tf32, bf16_mixed and fp16_mixed"));
  }
}
}  // namespace policy_detail

// Calls f.template operator()<policy<Precision, Stance, Fixed...>>() for the precision and stance
// named; a name that selects nothing is a ValueError naming it and the choices.
template <class... Fixed, class F>
void select_policy(std::string_view precision_name, std::string_view stance_name, F&& f);

// Only the precision chosen by name: policy<Precision, Stance, Fixed...>.
template <class Stance, class... Fixed, class F>
void select_precision(std::string_view precision_name, F&& f) {
  using all = policy_detail::tag_list<precision::fp32, precision::tf32, precision::bf16_mixed, precision::fp16_mixed>;
  policy_detail::select_precision<Stance>(policy_detail::tag_list<Fixed...>{}, all{}, precision_name, f);
}

// The same with a mode: policy<Precision, Stance, Mode, Fixed...> (see the header comment).
template <class... Fixed, class F>
void select_policy(std::string_view precision_name, std::string_view stance_name, std::string_view mode_name,
                   F&& f) {
  using policy_detail::tag_list;
  using all = tag_list<precision::fp32, precision::tf32, precision::bf16_mixed, precision::fp16_mixed>;
  if (mode_name == mode::default_::name) {
    select_policy<Fixed...>(precision_name, stance_name, f);
    return;
  }
  const bool ro = mode_name == mode::reduce_overhead::name;
  KILN_CHECK(ro || mode_name == mode::max_autotune::name, ValueError, "unknown mode \"", mode_name,
             "\"; the modes are default, reduce_overhead and max_autotune");
  if (stance_name == stance::fused::name) {
    if (ro)
      policy_detail::select_precision<stance::fused>(tag_list<mode::reduce_overhead, Fixed...>{}, all{}, precision_name, f);
    else
      policy_detail::select_precision<stance::fused>(tag_list<mode::max_autotune, Fixed...>{}, all{}, precision_name, f);
  } else if (ro && stance_name == stance::eager_on_recompile::name) {
    policy_detail::select_precision<stance::eager_on_recompile>(tag_list<mode::reduce_overhead, Fixed...>{}, all{},
                                                                precision_name, f);
  } else if (ro && stance_name == stance::fail_on_recompile::name) {
    policy_detail::select_precision<stance::fail_on_recompile>(tag_list<mode::reduce_overhead, Fixed...>{}, all{},
                                                               precision_name, f);
  } else {
    throw ValueError(kiln::detail::concat(
        "stance \"", stance_name, "\" with mode ", mode_name, ": mode reduce_overhead takes the stances fused, ",
        "eager_on_recompile and fail_on_recompile, mode max_autotune the stance fused, mode default fused and ",
        "force_eager"));
  }
}
template <class... Fixed, class F>
void select_policy(std::string_view precision_name, std::string_view stance_name, F&& f) {
  using policy_detail::tag_list;
  if (stance_name == stance::eager_on_recompile::name || stance_name == stance::fail_on_recompile::name)
    throw ValueError(kiln::detail::concat("the stance ", stance_name, " is about recompiling a captured step: it ",
                                          "needs mode reduce_overhead"));
  using all = tag_list<precision::fp32, precision::tf32, precision::bf16_mixed, precision::fp16_mixed>;
  if (stance_name == stance::fused::name) {
    policy_detail::select_precision<stance::fused>(tag_list<Fixed...>{}, all{}, precision_name, f);
  } else if (stance_name == stance::force_eager::name) {
    policy_detail::select_precision<stance::force_eager>(tag_list<Fixed...>{}, all{}, precision_name, f);
  } else {
    throw ValueError(
        kiln::detail::concat("unknown stance \"", stance_name, "\"; the stances are fused and force_eager"));
  }
}

}  // namespace kiln
