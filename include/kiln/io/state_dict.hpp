// kiln/io/state_dict.hpp — a model's tensors under PyTorch's state_dict names, so a checkpoint's
// weights load into the equivalent torch.nn module and back (kiln/train/checkpoint.hpp).
//
// The names follow torch.nn for the same architecture: a Sequential's layers are "0.", "1.", ...
// (nested Sequentials nest: "3.1.weight"); Linear and Conv2d have "weight" ([out, in] and
// [out, in, kh, kw], PyTorch's layouts, which are kiln's) and "bias"; BatchNorm2d and LayerNorm
// "weight" and "bias", and BatchNorm2d's buffers "running_mean", "running_var" and
// "num_batches_tracked" (int64, a scalar). A Residual, which torch spells as a user module, names
// its parts "body." and "shortcut." (a projection shortcut's layers). An nn::Repeat names its
// blocks as a Sequential does: "0.", "1.", ...
// A named layer (nn::Named<"conv1", L>, kiln/nn/named.hpp) is "conv1." instead of its position;
// in a Residual's body it sits directly under the block ("layer1.0.conv1.weight", torchvision's
// Bottleneck), and a named shortcut replaces "shortcut." ("layer1.0.downsample.0.weight").
//
//   kiln::io::for_each_state(model, [](const std::string& name, auto& item, kiln::io::state_kind kind) { ... });
// item is the parameter's ag::Var (kind parameter), the buffer's Tensor (buffer) or a std::int64_t&
// (counter). for_each_layer(model, f) visits every leaf layer with its name prefix ("2." ...).
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "kiln/nn/named.hpp"
#include "kiln/nn/sequential.hpp"

namespace kiln::io {

enum class state_kind { parameter, buffer, counter };

namespace detail {

template <class M>
concept sequential_like = requires(M& m) {
  M::size();
  m.template layer<0>();
};
template <class M>
concept residual_like = requires(M& m) {
  m.body();
  m.shortcut();
};

template <class M>
concept repeat_like = requires(M& m) {
  M::count;
  m.first();
  m.block(1);
};

// A Sequential's layers: a named one by its name, the others by `fallback` and their position
// ("" in a Sequential, "body." in a Residual's body).
template <class M, class F, std::size_t... I>
void each_sequential_layer(M& m, const std::string& prefix, F& f, std::index_sequence<I...>,
                           const std::string& fallback = "");

// A part's name: its own (nn::Named) or the default the container gives it.
template <class L>
std::string part_name(const std::string& fallback) {
  if constexpr (nn::is_named_v<L>) return std::string(nn::name_of<L>()) + ".";
  else return fallback;
}

// f(prefix, layer) for every leaf layer under m.
template <class M, class F>
void walk(M& m, const std::string& prefix, F& f) {
  if constexpr (sequential_like<std::remove_const_t<M>>) {
    each_sequential_layer(m, prefix, f, std::make_index_sequence<std::remove_const_t<M>::size()>{});
  } else if constexpr (residual_like<std::remove_const_t<M>>) {
    using Body = std::remove_cvref_t<decltype(m.body())>;
    if constexpr (sequential_like<Body> && !nn::is_named_v<Body>)  // its layers, named or "body.<i>."
      each_sequential_layer(m.body(), prefix, f, std::make_index_sequence<Body::size()>{}, "body.");
    else
      walk(m.body(), prefix + part_name<Body>("body."), f);
    walk(m.shortcut(), prefix + part_name<std::remove_cvref_t<decltype(m.shortcut())>>("shortcut."), f);
  } else if constexpr (repeat_like<std::remove_const_t<M>>) {  // nn::Repeat: named as nn.Sequential
    walk(m.first(), prefix + "0.", f);
    for (index_t i = 1; i < std::remove_const_t<M>::count; ++i) walk(m.block(i), prefix + std::to_string(i) + ".", f);
  } else {
    f(prefix, m);
  }
}
template <class M, class F, std::size_t... I>
void each_sequential_layer(M& m, const std::string& prefix, F& f, std::index_sequence<I...>,
                           const std::string& fallback) {
  (walk(m.template layer<I>(),
        prefix + part_name<std::remove_cvref_t<decltype(m.template layer<I>())>>(fallback + std::to_string(I) + "."), f),
   ...);
}

}  // namespace detail

// f(prefix, layer) for every leaf layer of a model (not Sequential or Residual themselves), in
// forward order; prefix is the layer's name with a trailing dot ("0.", "2.body.1.").
template <class Model, class F>
void for_each_layer(Model& model, F&& f) {
  detail::walk(model, std::string(), f);
}

// f(name, item, kind) for every tensor of the model's state, in forward order (see the header).
template <class Model, class F>
void for_each_state(Model& model, F&& f) {
  for_each_layer(model, [&](const std::string& prefix, auto& layer) {
    using L = std::remove_cvref_t<decltype(layer)>;
    if constexpr (requires { layer.buffers().running_mean; }) {  // BatchNorm2d
      f(prefix + "weight", layer.weight(), state_kind::parameter);
      f(prefix + "bias", layer.bias(), state_kind::parameter);
      auto& buffers = const_cast<typename L::Buffers&>(layer.buffers());
      f(prefix + "running_mean", buffers.running_mean, state_kind::buffer);
      f(prefix + "running_var", buffers.running_var, state_kind::buffer);
      f(prefix + "num_batches_tracked", buffers.batches_tracked, state_kind::counter);
    } else if constexpr (requires { layer.weight(); }) {  // Linear, Conv2d, LayerNorm
      f(prefix + "weight", layer.weight(), state_kind::parameter);
      if constexpr (requires { layer.bias(); }) f(prefix + "bias", layer.bias(), state_kind::parameter);
    } else {
      static_assert(nn::detail::parameter_tensors_of<L>() == 0,
                    "kiln::io::for_each_state: this layer has parameters but kiln does not know their "
                    "state_dict names; give it weight() (and bias()) accessors as nn::Linear has");
    }
  });
}

}  // namespace kiln::io
