// kiln/policy/select.hpp — choosing a policy at run time (a command-line flag, a config file):
// every combination the names can select is compiled in, and the names pick one.
//
//   kiln::select_policy<kiln::accumulate<kiln::dyn>>(o.precision, o.stance, [&]<class Policy>() {
//     train<Policy>(...);
//   });
//
// Precision names: fp32, tf32, bf16_mixed, fp16_mixed (precision::X::name); stance names: fused,
// force_eager. Fixed tags (accumulation, loss scaling, fullgraph) are added to each policy.
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
void select_policy(std::string_view precision_name, std::string_view stance_name, F&& f) {
  using policy_detail::tag_list;
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
