// kiln/io/model_state.hpp — a model's state (kiln/io/state_dict.hpp) as a list of untyped
// entries: each tensor's name, kind, element type, shape, address and its memory's copies, and
// each layer's random stream. What checkpoints save, load and checksum (kiln/train/checkpoint.hpp)
// is written on this list, so that code is compiled once (in kiln::kernels), not once per model
// type; what stays per model is this one walk.
//
//   const kiln::io::ModelState state = kiln::io::model_state(model);
//   for (const auto& t : state.tensors) std::printf("%s %s\n", t.name.c_str(), t.shape.str().c_str());
//
// The entries point into the model: they are valid while it lives and its parameters stay where
// they are (a freeze or a move to another space makes a new list necessary).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/autograd/var.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/core/memory.hpp"
#include "kiln/io/state_dict.hpp"

namespace kiln::io {

// One tensor of a model's state. A counter (BatchNorm2d's num_batches_tracked) is an int64
// scalar in host memory.
struct StateTensor {
  std::string name;  // its state_dict name
  state_kind kind;
  dtype type;
  Shape shape;
  void* data;         // in the model's memory space (host memory for a counter)
  std::size_t bytes;  // the whole tensor's
  // Copies between the tensor's memory and the host (memcpy on the host; a device's copies).
  void (*copy_to_host)(void* dst, const void* src, std::size_t bytes);
  void (*copy_from_host)(void* dst, const void* src, std::size_t bytes);
};

// A layer's random stream (a dropout layer's): its name prefix ("2.") and its position.
struct StateRng {
  std::string prefix;
  std::function<std::pair<std::uint64_t, std::uint64_t>()> get;  // the seed and the offset
  std::function<void(std::uint64_t, std::uint64_t)> set;
};

struct ModelState {
  std::vector<StateTensor> tensors;  // in for_each_state's order
  std::vector<StateRng> rngs;        // in for_each_layer's order
};

// The model's state as untyped entries (Model may be const: the entries are then for reading).
template <class Model>
ModelState model_state(Model& model) {
  ModelState out;
  for_each_state(model, [&](const std::string& name, auto& item, state_kind kind) {
    using I = std::remove_cvref_t<decltype(item)>;
    if constexpr (std::is_same_v<I, std::int64_t>) {
      out.tensors.push_back({name, kind, dtype::i64, Shape{}, const_cast<std::int64_t*>(&item), sizeof(std::int64_t),
                             memory_traits<host>::copy_to_host, memory_traits<host>::copy_from_host});
    } else {
      const auto& t = [&]() -> const auto& {
        if constexpr (ag::is_var_v<I>) return item.value();
        else return item;
      }();
      using T = typename std::remove_cvref_t<decltype(t)>::value_type;
      using S = typename std::remove_cvref_t<decltype(t)>::space;
      out.tensors.push_back({name, kind, dtype_of<T>, t.shape(), const_cast<T*>(t.data()), t.bytes(),
                             memory_traits<S>::copy_to_host, memory_traits<S>::copy_from_host});
    }
  });
  for_each_layer(model, [&](const std::string& prefix, auto& layer) {
    if constexpr (requires { layer.set_rng(std::uint64_t{}, std::uint64_t{}); }) {
      auto* target = const_cast<std::remove_cvref_t<decltype(layer)>*>(&layer);
      out.rngs.push_back({prefix, [target] { return std::pair{target->seed(), target->offset()}; },
                          [target](std::uint64_t seed, std::uint64_t offset) { target->set_rng(seed, offset); }});
    }
  });
  return out;
}

}  // namespace kiln::io
