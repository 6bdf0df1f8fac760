// kiln/nn/mixed_check.hpp — which layer keeps a model from mixed precision, named by the compiler.
//
// A model runs under bf16_mixed / fp16_mixed when every layer does (`mixed_precision = true`:
// Linear, Conv2d, BatchNorm2d, LayerNorm, the pools, activations, reshapes, the GPT's embeddings,
// attention and blocks, Residual and Repeat of such layers; not Dropout yet). train::Step checks nn::mixed_precision_ok<Model>: it walks the model's type through
// Sequential, Residual, Repeat and Named, and for the first layer that cannot, instantiates
// layer_runs_in_half_precision<Layer>, whose static_assert the compiler reports together with the
// layer's type, e.g. `layer_runs_in_half_precision<kiln::nn::Dropout<0.1>>`.
#pragma once

#include <tuple>
#include <type_traits>

#include "kiln/nn/sequential.hpp"

namespace kiln::nn {

template <class Layer>
struct layer_runs_in_half_precision {
  static_assert(dependent_false<Layer>,
                "kiln::train::Step: under bf16_mixed / fp16_mixed every layer must run on half-precision activations, "
                "and this one does not (layer_runs_in_half_precision<Layer> names it; a layer says "
                "`mixed_precision = true`); use fp32 or tf32 for this model");
  static constexpr bool value = false;
};

namespace detail {

template <class L>
constexpr bool mixed_ok();

template <class Tuple, std::size_t... I>
constexpr bool all_mixed_ok(std::index_sequence<I...>) {
  return (mixed_ok<std::tuple_element_t<I, Tuple>>() && ...);
}

// True when L (and everything inside it) runs in half precision; otherwise the first leaf that
// does not instantiates layer_runs_in_half_precision<leaf>.
template <class L>
constexpr bool mixed_ok() {
  if constexpr (requires { typename L::layer_type; L::name; }) {  // nn::Named
    return mixed_ok<typename L::layer_type>();
  } else if constexpr (requires { typename L::layer_types; }) {  // nn::Sequential
    using T = typename L::layer_types;
    return all_mixed_ok<T>(std::make_index_sequence<std::tuple_size_v<T>>{});
  } else if constexpr (requires { typename L::body_type; typename L::shortcut_type; }) {  // nn::Residual
    if constexpr (std::is_void_v<typename L::shortcut_type>) return mixed_ok<typename L::body_type>();
    else return mixed_ok<typename L::body_type>() && mixed_ok<typename L::shortcut_type>();
  } else if constexpr (requires { typename L::block_type; typename L::first_type; }) {  // nn::Repeat
    return mixed_ok<typename L::first_type>() && mixed_ok<typename L::block_type>();
  } else if constexpr (mixed_precision_of<L>()) {
    return true;
  } else {
    return layer_runs_in_half_precision<L>::value;
  }
}

}  // namespace detail

template <class Model>
inline constexpr bool mixed_precision_ok = detail::mixed_ok<Model>();

// mixed_precision_ok<Model>, looked at only when Mixed (so an fp32 step or plan of a model with a
// layer that has no half-precision path compiles): what train::Step and plan_memory assert.
template <bool Mixed, class Model>
struct mixed_precision_required {
  static constexpr bool value = true;
};
template <class Model>
struct mixed_precision_required<true, Model> {
  static constexpr bool value = mixed_precision_ok<Model>;
};

}  // namespace kiln::nn
