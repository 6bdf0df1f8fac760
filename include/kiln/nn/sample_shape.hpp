// kiln/nn/sample_shape.hpp — the shape of one sample as it flows through a model's type.
//
// A model's layers see [batch, ...sample] tensors. nn::sample<D...> is the per-sample part as a
// type (sample<800> for a flat row, sample<32, 5, 5> for a 32-channel 5x5 image; dyn where a size
// is known only at run time) and output_sample_t<Layer, In> is what a layer makes of it. Sequential
// folds its layers over the sample its first layer declares, so a wrong size anywhere — a Conv2d
// whose input channels differ from the previous layer's outputs, 32x5x5 flattened into a
// Linear<512, ...>, an image handed to a Linear without Flatten — is a static_assert when the
// model's type is used. The sentence says what is wrong; the instantiation the compiler names
// with it carries the sizes, e.g. `layer_accepts<kiln::nn::Linear<512, 128>, kiln::nn::sample<800>>`.
//
// What a layer says about shapes (kiln/nn/activation.hpp lists the whole layer contract):
// - `template <class In> using output_sample = ...`: its output for input sample In, with its own
//   static_asserts (Conv2d, pools, BatchNorm2d, Flatten, Unflatten, Residual, Sequential);
// - else `in_features` / `out_features` (Linear, LayerNorm): a flat input of in_features values;
// - else `keeps_shape = true` or an activation: the output has the input's shape (Dropout);
// - else nothing is known after it (any_sample), and checks resume at the next layer that
//   declares its input (Unflatten) — an opaque user function may reshape.
#pragma once

#include <cstddef>
#include <type_traits>

#include "kiln/autograd/var.hpp"
#include "kiln/config.hpp"

namespace kiln::nn {

// How an image batch is laid out in memory: [N, C, H, W] (PyTorch's default) or channels-last
// [N, H, W, C] (PyTorch's channels_last memory format). Samples are always described logically,
// sample<C, H, W>; a layer's Layout parameter says how its variables hold them, and
// Model::with_layout<layout::nhwc> (Sequential, Residual) rebinds every image layer at once — the
// counterpart of model.to(memory_format=torch.channels_last).
enum class layout { nchw, nhwc };

// One sample's shape: the sizes after the batch dimension.
template <index_t... D>
struct sample {
  static constexpr int rank = int(sizeof...(D));
  // The number of values per sample (dyn when a size is dyn).
  static constexpr index_t size = ((D == dyn) || ...) ? dyn : (index_t(1) * ... * D);
};
// Nothing known (the model's input before a layer declares it, or after an opaque layer).
struct any_sample {};

// One sample of a sequence model: up to MaxT positions of D features each ([B, T, D] variables,
// T <= MaxT chosen at run time; dyn when the bound is not known yet). A layer with a flat input
// (Linear, LayerNorm) applies to every position: it must take D features, and gives
// sequence<MaxT, out_features>.
template <index_t MaxT, index_t D>
struct sequence {
  static constexpr int rank = 2;
  static constexpr index_t max_length = MaxT;
  static constexpr index_t width = D;
};

template <class S>
inline constexpr bool is_image_sample_v = false;
template <index_t C, index_t H, index_t W>
inline constexpr bool is_image_sample_v<sample<C, H, W>> = true;

namespace detail {

template <class L>
constexpr bool keeps_shape_of() {
  if constexpr (requires { L::keeps_shape; }) return bool(L::keeps_shape);
  else if constexpr (requires { L::is_activation; }) return bool(L::is_activation);
  else return false;
}

// A layer with a flat input of in_features values (Linear, LayerNorm) after a layer whose output
// sample is In. Instantiated per layer, so the compiler names the layer and the sample.
template <class Layer, class In>
struct layer_accepts {
  using type = any_sample;
};
template <class Layer>
struct layer_accepts<Layer, any_sample> {
  using type = sample<Layer::out_features>;
};
template <class Layer, index_t N>
struct layer_accepts<Layer, sample<N>> {
  static_assert(N == dyn || Layer::in_features == dyn || N == Layer::in_features,
                "kiln::nn::Sequential: a layer follows a layer with a different number of outputs; its first size "
                "must equal them (the instantiation layer_accepts<Layer, sample<outputs>> names both: e.g. "
                "Linear<128, 10> after a layer with 256 outputs must be Linear<256, 10>)");
  using type = sample<Layer::out_features>;
};
template <class Layer, index_t MaxT, index_t D>
struct layer_accepts<Layer, sequence<MaxT, D>> {
  static_assert(D == dyn || Layer::in_features == dyn || D == Layer::in_features,
                "kiln::nn::Sequential: a layer applied at every position of a sequence takes a different width "
                "than the previous layer gives (layer_accepts<Layer, sequence<max_length, width>> names both: "
                "e.g. Linear<128, 512> after a layer of width 256 must be Linear<256, 512>)");
  using type = sequence<MaxT, Layer::out_features>;
};
template <class Layer, index_t D0, index_t D1, index_t... Rest>
struct layer_accepts<Layer, sample<D0, D1, Rest...>> {
  static_assert(D0 != D0,  // always false here, but only once instantiated
                "kiln::nn::Sequential: a layer with a flat input (a Linear) follows a layer whose output is an "
                "image [C, H, W]; put nn::Flatten between them (layer_accepts<Layer, sample<C, H, W>> names the "
                "sizes: Flatten makes sample<C*H*W>)");
  using type = sample<Layer::out_features>;
};

template <class L, class In>
struct output_sample_of {
  using type = any_sample;
};
template <class L, class In>
  requires requires { typename L::template output_sample<In>; }
struct output_sample_of<L, In> {
  using type = typename L::template output_sample<In>;
};
template <class L, class In>
  requires(!requires { typename L::template output_sample<In>; } && requires { L::in_features; })
struct output_sample_of<L, In> {
  using type = typename layer_accepts<L, In>::type;
};
template <class L, class In>
  requires(!requires { typename L::template output_sample<In>; } && !requires { L::in_features; } &&
           keeps_shape_of<L>())
struct output_sample_of<L, In> {
  using type = In;
};

template <class In, class... Layers>
struct sample_fold {
  using type = In;
};
template <class In, class L, class... Rest>
struct sample_fold<In, L, Rest...> {
  using type = typename sample_fold<typename output_sample_of<L, In>::type, Rest...>::type;
};

// The sample after the first I layers.
template <std::size_t I, class In, class... Layers>
struct prefix_fold {
  using type = In;
};
template <std::size_t I, class In, class L, class... Rest>
  requires(I > 0)
struct prefix_fold<I, In, L, Rest...> {
  using type = typename prefix_fold<I - 1, typename output_sample_of<L, In>::type, Rest...>::type;
};

// sample<D...> from an ag::Var's static extents after the batch dimension.
template <index_t... D>
struct sample_after_batch;
template <index_t B, index_t... D>
struct sample_after_batch<B, D...> {
  using type = sample<D...>;
};

template <class T, class S, index_t B, class Sample>
struct batch_var;
template <class T, class S, index_t B, index_t... D>
struct batch_var<T, S, B, sample<D...>> {
  using type = ag::Var<T, S, B, D...>;
};

}  // namespace detail

// The variable [B, ...Sample] (B the batch extent).
template <class T, class S, index_t B, class Sample>
using batch_var_t = typename detail::batch_var<T, S, B, Sample>::type;

namespace detail {
template <class T, class S, index_t B, class Sample, layout L>
struct image_var {
  using type = batch_var_t<T, S, B, Sample>;
};
template <class T, class S, index_t B, index_t C, index_t H, index_t W>
struct image_var<T, S, B, sample<C, H, W>, layout::nhwc> {
  using type = ag::Var<T, S, B, H, W, C>;
};
}  // namespace detail

// The variable holding a batch of Sample in layout L: [B, C, H, W] or [B, H, W, C] for an image,
// [B, ...Sample] otherwise.
template <class T, class S, index_t B, class Sample, layout L>
using image_var_t = typename detail::image_var<T, S, B, Sample, L>::type;

// The logical sample of an image variable's extents [B, D1, D2, D3] in layout L.
template <layout L, index_t D1, index_t D2, index_t D3>
using image_sample_t = std::conditional_t<L == layout::nchw, sample<D1, D2, D3>, sample<D3, D1, D2>>;

namespace detail {
// L with its image layers in layout Y (L::with_layout<Y>), or L itself (no spatial layout).
template <class L, layout Y>
struct rebind_layout {
  using type = L;
};
template <class L, layout Y>
  requires requires { typename L::template with_layout<Y>; }
struct rebind_layout<L, Y> {
  using type = typename L::template with_layout<Y>;
};
}  // namespace detail

// What layer L makes of input sample In (any_sample when L does not say).
template <class L, class In>
using output_sample_t = typename detail::output_sample_of<L, In>::type;

// What layers Ls make of In, in order.
template <class In, class... Ls>
using fold_sample_t = typename detail::sample_fold<In, Ls...>::type;

// The output size of a convolution or pooling window along one axis (floor mode, as PyTorch);
// dyn stays dyn.
constexpr index_t window_output(index_t in, index_t kernel, index_t stride, index_t pad, index_t dilation = 1) {
  if (in == dyn) return dyn;
  const index_t span = dilation * (kernel - 1) + 1;
  return in + 2 * pad < span ? 0 : (in + 2 * pad - span) / stride + 1;
}

}  // namespace kiln::nn
