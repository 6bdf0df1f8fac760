// kiln/nn/named.hpp — a layer with a name, the attribute name a torch.nn module would give it.
//
//   using Stem = nn::Sequential<nn::Named<"conv1", nn::Conv2d<3, 64, 7, 2, 3, 1, false>>,
//                               nn::Named<"bn1", nn::BatchNorm2d<64>>, nn::ReLU>;
//   // state_dict names: "conv1.weight", "bn1.weight", "bn1.running_mean", ...  (not "0.weight")
//
// Named<"n", L> IS an L (it derives from it: same forward, parameters, launches, modes, shapes),
// so it goes wherever L goes; only the state-dict walker (kiln/io/state_dict.hpp) and describe()
// read the name. In a Sequential a named layer is "n." where an unnamed one is its position "3.";
// in a Residual's body a named layer sits directly under the block ("conv1.", as in
// torchvision's Bottleneck, whose convolutions are attributes of the block) and a named
// shortcut is "n." ("downsample.") instead of "shortcut.". That is what makes
// torchvision's state_dict() load into kiln::models::ResNet50 with no renaming.
// requires: a name is a non-empty identifier without '.' (a static_assert says so).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

#include "kiln/nn/sample_shape.hpp"
#include "kiln/nn/sequential.hpp"

namespace kiln::nn {

// A string usable as a template argument: nn::Named<"conv1", ...>.
template <std::size_t N>
struct layer_name {
  char text[N]{};
  constexpr layer_name(const char (&s)[N]) {  // NOLINT(google-explicit-constructor): "conv1" as an argument
    for (std::size_t i = 0; i < N; ++i) text[i] = s[i];
  }
  constexpr std::string_view view() const { return {text, N - 1}; }
  constexpr bool valid() const {
    if (N < 2) return false;
    for (std::size_t i = 0; i + 1 < N; ++i) {
      const char c = text[i];
      const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
      if (!ok) return false;
    }
    return true;
  }
};

template <layer_name Name, class Layer>
class Named : public Layer {
  static_assert(Name.valid(),
                "kiln::nn::Named<Name, Layer>: a layer name must be a non-empty identifier of letters, digits and "
                "'_' (no '.': the state-dict walker joins names with dots)");

 public:
  using layer_type = Layer;
  static constexpr std::string_view name = Name.view();

  using Layer::Layer;
  Named() = default;
  explicit Named(Layer layer) : Layer(std::move(layer)) {}

  template <class S>
  using on = Named<Name, typename detail::rebind_space<Layer, S>::type>;
  template <layout L>
  using with_layout = Named<Name, typename detail::rebind_layout<Layer, L>::type>;

  Layer& unnamed() { return *this; }
  const Layer& unnamed() const { return *this; }

  // "conv1: Conv2d<...>" in a model's description.
  std::string describe_nested() const { return std::string(name) + ": " + detail::describe_layer(unnamed()); }
};

// Whether L carries a name (nn::Named), and the name ("" when it does not).
template <class L>
inline constexpr bool is_named_v = requires {
  typename L::layer_type;
  L::name;
};
template <class L>
constexpr std::string_view name_of() {
  if constexpr (is_named_v<L>) return L::name;
  else return {};
}

}  // namespace kiln::nn
