// kiln/nn/reshape.hpp — Unflatten<C, H, W>: flat rows [B, C*H*W] as images [B, C, H, W].
//
// The loaders and train::Step hand a model flat rows; a convolutional model starts with
// Unflatten, which also declares the image shape the rest of the model's type is checked against
// (nn/sample_shape.hpp) — PyTorch's nn.Unflatten(1, (C, H, W)). The values are copied (ONE kernel
// forward, ONE backward when the input needs a gradient), because a variable owns its storage.
#pragma once

#include <string>

#include "kiln/nn/linear.hpp"
#include "kiln/nn/module.hpp"
#include "kiln/nn/sample_shape.hpp"

namespace kiln::nn {

namespace detail {
template <index_t C, index_t H, index_t W, class In>
struct unflatten_accepts {
  static_assert(dependent_false<In>,
                "kiln::nn::Unflatten<C, H, W>: the input must be flat rows of C*H*W values (unflatten_accepts<C, H, "
                "W, sample<...>> names the sizes)");
  using type = sample<C, H, W>;
};
template <index_t C, index_t H, index_t W>
struct unflatten_accepts<C, H, W, any_sample> {
  using type = sample<C, H, W>;
};
template <index_t C, index_t H, index_t W, index_t N>
struct unflatten_accepts<C, H, W, sample<N>> {
  static_assert(N == dyn || N == C * H * W,
                "kiln::nn::Unflatten<C, H, W>: the previous layer's outputs are not C*H*W values "
                "(unflatten_accepts<C, H, W, sample<outputs>> names the sizes)");
  using type = sample<C, H, W>;
};
}  // namespace detail

// Layout nhwc (what with_layout gives) makes [B, H, W, C] from the same C, H, W-ordered rows.
template <index_t C, index_t H, index_t W, layout Layout = layout::nchw>
struct Unflatten {
  static_assert(C > 0 && H > 0 && W > 0, "kiln::nn::Unflatten<C, H, W>: the sizes must be positive");
  static constexpr index_t in_features = C * H * W;
  template <layout L>
  using with_layout = Unflatten<C, H, W, L>;
  template <class In>
  using output_sample = typename detail::unflatten_accepts<C, H, W, In>::type;

  template <class Exec, class T, class S, index_t B, index_t N>
  auto forward(ag::Tape<Exec>& tape, const ag::Var<T, S, B, N>& x) const {
    static_assert(N == dyn || N == C * H * W,
                  "kiln::nn::Unflatten<C, H, W>: the input's rows must hold C*H*W values");
    KILN_CHECK(x.dim(1) == C * H * W, ShapeError, "Unflatten<", C, ", ", H, ", ", W, ">: the input has shape ",
               x.shape().str(), "; its rows must hold ", C * H * W, " values");
    constexpr bool nhwc = Layout == layout::nhwc;
    using V = image_var_t<T, S, B, sample<C, H, W>, Layout>;
    const index_t rows = x.dim(0), n = x.value().size();
    V out{typename V::tensor_type(nhwc ? Shape{rows, H, W, C} : Shape{rows, C, H, W})};
    // NCHW: a plain copy (one "channel" of all the values); NHWC: [C][H*W] into [H*W][C].
    constexpr index_t ch = nhwc ? C : 1, hw = C * H * W / ch;
    tape.exec().for_each_element(1, n, detail::ChannelsCopy<T>{x.value().data(), out.value().data(), ch, hw, true, false},
                                 kind::copy, "unflatten", std::size_t(n) * sizeof(T) * 2);
    if (!x.requires_grad() || !tape.recording()) return out;
    out.set_requires_grad(true);
    tape.record(out, {x.data()}, [xd = x.data(), n](Exec& exec, auto& od) {
      if (!od.grad_valid || !xd->requires_grad) return;
      const bool add = xd->grad_valid;
      T* dx = xd->ensure_grad();
      exec.for_each_element(1, n, detail::ChannelsCopy<T>{od.grad.data(), dx, ch, hw, false, add}, kind::copy,
                            "unflatten_backward", std::size_t(n) * sizeof(T) * 2);
      xd->grad_valid = true;
    });
    return out;
  }
  static constexpr Launches launches(const LaunchContext& c) { return {1, c.input_grad ? 1 : 0}; }
  static constexpr bool mixed_precision = true;  // a copy, in any type
  static std::string describe() {
    return std::string(Layout == layout::nhwc ? "Unflatten[nhwc]<" : "Unflatten<") + std::to_string(C) + ", " + std::to_string(H) + ", " + std::to_string(W) + ">";
  }
};

}  // namespace kiln::nn
