// kiln/nn/sequential.hpp — a model as a type: Sequential<Linear<784, 256>, ReLU, Linear<256, 10>>.
//
// Adjacent feature sizes are checked when the type is instantiated. forward() runs the layers
// as a left fold over an index sequence (bounded template depth, whatever the layer count), and
// a Linear followed by an activation runs as ONE GEMM with a bias + activation epilogue.
//
// Memory space: a model lives where its parameter layers do. Sequential::space is the space of
// the layers that name one (Linear's Space; they must agree), kiln::host when none does, and
// Sequential<...>::on<S> is the same model with every such layer rebound to S:
//   using Mlp = nn::Sequential<nn::Linear<784, 256>, nn::ReLU, nn::Linear<256, 10>>;
//   Mlp::on<kiln::cuda> gpu_model(seed);   // same initial numbers as Mlp(seed), on the device
// (for kiln::cuda include kiln/nn/cuda.cuh). Layers without parameters are space-generic.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/autograd/remake.hpp"
#include "kiln/core/random.hpp"
#include "kiln/core/view.hpp"
#include "kiln/expr/functors.hpp"
#include "kiln/nn/module.hpp"
#include "kiln/nn/sample_shape.hpp"
#include "kiln/optim/param.hpp"

namespace kiln::nn {

namespace detail {

// The activation part of the layer contract (kiln/nn/activation.hpp), checked per layer so the
// compiler names the layer: an activation says how to apply itself, and its functor, when it
// names one (what a preceding Linear fuses), has a value and a derivative.
template <class Layer>
struct activation_layer_ok {
  // An activation without a functor must at least apply itself to an expression (a Linear then
  // runs GEMM + one fused kernel instead of an epilogue).
  static_assert(!is_activation_v<Layer> ||
                    requires(View<const float, host, extents<dyn>> e) { Layer::apply(e); },
                "kiln::nn::Sequential: an activation layer (is_activation = true) must name its function, "
                "`using functor = F` with F a kiln::fn::unary_functor; derive from kiln::nn::Activation<F>");
  static constexpr bool value = true;
};
template <class Layer>
  requires requires { typename Layer::functor; }
struct activation_layer_ok<Layer> {
  static_assert(fn::unary_functor<typename Layer::functor>,
                "kiln::nn::Sequential: this activation layer's functor is not a kiln::fn::unary_functor: it needs "
                "`static constexpr const char* name`, `template <class T> KILN_HOST_DEVICE T operator()(T) const` "
                "and its derivative `template <class T> KILN_HOST_DEVICE T d(T) const`, default-constructible and "
                "trivially copyable (see activation_layer_ok<Layer> and kiln/nn/activation.hpp)");
  static constexpr bool value = true;
};

// Parameter tensors of a layer (0 when it does not say: layers without parameters).
template <class L>
constexpr index_t parameter_tensors_of() {
  if constexpr (requires { L::parameter_tensors; }) return L::parameter_tensors;
  else return 0;
}
// Whether a layer computes its input's gradient with a GEMM that can take the producer's
// activation backward (autograd/fold.hpp): a Linear, or a model that starts with one.
template <class L>
constexpr bool takes_fold_of() {
  if constexpr (requires { L::takes_fold; }) return L::takes_fold;
  else return false;
}
template <class L>
constexpr bool mixed_precision_of() {
  if constexpr (requires { L::mixed_precision; }) return bool(L::mixed_precision);
  else return false;
}
template <class L>
constexpr bool opaque_of() {
  if constexpr (requires { L::is_opaque; }) return bool(L::is_opaque);
  else return false;
}
template <class L>
constexpr index_t low_copies_of() {
  if constexpr (requires { L::low_copies; }) return L::low_copies;
  else return 0;
}
template <class L>
constexpr bool has_functor() {
  return requires { typename L::functor; };
}

// A layer's one-line description: its describe() when it has one, else "layer".
template <class L>
std::string describe_layer(const L& l) {
  if constexpr (requires { l.describe_nested(); }) return std::string(l.describe_nested());
  else if constexpr (requires { l.describe(); }) return std::string(l.describe());
  else if constexpr (requires { typename L::functor; }) return std::string(L::functor::name);
  else return "layer";
}

// A value flowing through the layers; `flow | step<I>` runs layer I.
template <class X>
struct Flow {
  X x;
};
template <std::size_t I, class Seq, class Tape>
struct Step {
  Seq* seq;
  Tape* tape;
  const void* input;  // the Sequential's input variable's node (null: not a variable)
};
template <class X>
const void* node_of(const X& x) {
  if constexpr (requires { x.data().get(); }) return x.data().get();
  else return nullptr;
}
// Whether layer I takes back an input freed after its forward (autograd/remake.hpp).
template <std::size_t I, class Seq>
constexpr bool remakes_input_at() {
  using L = std::tuple_element_t<I, typename Seq::layer_types>;
  if constexpr (requires { L::remakes_input; }) return L::remakes_input;
  else return false;
}
template <class X, std::size_t I, class Seq, class Tape>
auto operator|(Flow<X>&& f, Step<I, Seq, Tape> s) {
  using Y = decltype(s.seq->template run_layer<I>(*s.tape, f.x));
  Flow<Y> next{s.seq->template run_layer<I>(*s.tape, f.x)};
  // An input made inside this Sequential (I > 0: not the caller's) that only layer I reads, and
  // that layer I's backward can make again: freed now rather than kept until backward.
  // (A layer that passes its input through unchanged would hand on the caller's own: kept.)
  if constexpr (I > 0 && remakes_input_at<I, Seq>())
    if (node_of(f.x) != s.input) ag::free_remakeable(f.x);
  return next;
}

template <class L>
struct value_type_of {
  using type = typename L::value_type;
};

// L with its parameters in space S (L::on<S>), or L itself for a layer without a space.
template <class L, class S>
struct rebind_space {
  using type = L;
};
template <class L, class S>
  requires requires { typename L::template on<S>; }
struct rebind_space<L, S> {
  using type = typename L::template on<S>;
};

// L::space, or D for a layer that does not name one.
template <class L, class D>
struct space_of_or {
  using type = D;
};
template <class L, class D>
  requires requires { typename L::space; }
struct space_of_or<L, D> {
  using type = typename L::space;
};

template <class L>
L make_layer(Generator& gen) {
  if constexpr (std::is_constructible_v<L, Generator&>) return L(gen);
  else return L{};
}

}  // namespace detail

template <class... Layers>
class Sequential {
  static constexpr std::size_t N = sizeof...(Layers);
  static constexpr std::array<index_t, N> ins_{in_features_of<Layers>()...};
  static constexpr std::array<index_t, N> outs_{out_features_of<Layers>()...};
  static constexpr std::array<bool, N> acts_{is_activation_v<Layers>...};
  static constexpr std::array<bool, N> fusable_{fuses_activation_v<Layers>...};
  static constexpr std::array<bool, N> typed_{requires { typename Layers::value_type; }...};
  static constexpr std::size_t first_typed_ = [] {
    for (std::size_t i = 0; i < N; ++i)
      if (typed_[i]) return i;
    return N;
  }();
  static constexpr std::array<bool, N> spaced_{requires { typename Layers::space; }...};
  static constexpr std::size_t first_spaced_ = [] {
    for (std::size_t i = 0; i < N; ++i)
      if (spaced_[i]) return i;
    return N;
  }();
  struct no_layer {};

  // The output size of the nearest layer before i that fixes one (dyn if none).
  static constexpr index_t previous_outputs(std::size_t i) {
    for (std::size_t j = i; j-- > 0;)
      if (outs_[j] != dyn) return outs_[j];
    return dyn;
  }
  // Sizes between layers: the per-sample shape folded through the layers (sample_shape.hpp); a
  // layer that does not accept what the previous one makes is a static_assert naming both.
  static_assert(sizeof(fold_sample_t<any_sample, Layers...>*) > 0);
  static_assert((detail::activation_layer_ok<Layers>::value && ... && true));

  static constexpr bool fuses_next(std::size_t i) { return i + 1 < N && fusable_[i] && acts_[i + 1]; }

  static constexpr std::array<index_t, N> tensors_{detail::parameter_tensors_of<Layers>()...};
  static constexpr std::array<bool, N> takes_fold_{detail::takes_fold_of<Layers>()...};
  using Grads = std::array<ParamGrads, N>;
  // Every layer with parameters trainable: what the compile-time count assumes.
  static constexpr Grads all_trainable_ = [] {
    Grads g{};
    for (std::size_t i = 0; i < N; ++i) g[i] = {tensors_[i] > 0, true, true};
    return g;
  }();
  // Whether layer i's input needs a gradient: the model's input does, or an earlier layer has
  // trainable parameters.
  static constexpr bool input_grad(std::size_t i, bool model_input_grad, const Grads& g) {
    for (std::size_t j = 0; j < i; ++j)
      if (g[j].any) return true;
    return model_input_grad;
  }
  // Layer I's launches in context base, its parameters' flags in g; `self` (null at compile time)
  // lets a nested model count its own frozen parts.
  template <std::size_t I>
  static constexpr Launches layer_launches(LaunchContext base, const Grads& g, const Sequential* self) {
    using L = std::tuple_element_t<I, std::tuple<Layers...>>;
    LaunchContext c = base;
    c.input_grad = input_grad(I, base.input_grad, g);
    c.folded = false;
    c.weight_grad = g[I].weight;
    c.bias_grad = g[I].bias;
    if constexpr (I > 0 && fuses_next(I - 1)) {
      return {};  // counted with the Linear whose epilogue runs it
    } else if constexpr (counts_launches_now<L>) {
      if (self != nullptr) return std::get<I>(self->layers_).launches_now(c);
      return L::launches(c);
    } else if constexpr (fuses_next(I)) {
      // The activation's backward rides the GEMM that computes the gradient of its output: the
      // next layer's input-gradient GEMM (ag::linear's fold), when there is one.
      c.folded = !base.eager && I + 2 < N && takes_fold_[I + 2 < N ? I + 2 : 0];
      return L::template launches_fused<std::tuple_element_t<I + 1, std::tuple<Layers...>>>(c);
    } else if constexpr (requires { L::template launches_for<any_sample>(c); }) {
      // A layer whose launches depend on its input's shape (Flatten) gets the sample it sees.
      return L::template launches_for<typename detail::prefix_fold<I, any_sample, Layers...>::type>(c);
    } else {
      return L::launches(c);
    }
  }
  template <std::size_t... I>
  static constexpr Launches launches_impl(LaunchContext c, const Grads& g, const Sequential* self,
                                          std::index_sequence<I...>) {
    Launches total{};
    ((total += layer_launches<I>(c, g, self)), ...);
    return total;
  }

 public:
  // The element type of the first layer that has one (float for a model without parameters).
  using value_type = typename std::conditional_t<
      (first_typed_ < N),
      detail::value_type_of<std::tuple_element_t<(first_typed_ < N ? first_typed_ : 0), std::tuple<Layers..., float>>>,
      std::type_identity<float>>::type;

  // Where the parameters live: the space of the first layer that names one (host if none).
  using space =
      typename detail::space_of_or<std::tuple_element_t<first_spaced_, std::tuple<Layers..., no_layer>>, host>::type;
  static_assert((std::is_same_v<typename detail::space_of_or<Layers, space>::type, space> && ... && true),
                "kiln::nn::Sequential: the layers keep their parameters in different memory spaces; use "
                "Sequential<...>::on<Space> to put them all in one");

  // The same model with every layer that has a space rebound to S (Linear<..., S>).
  template <class S>
  using on = Sequential<typename detail::rebind_space<Layers, S>::type...>;
  // The same model with every image layer in layout L (nn/sample_shape.hpp): with_layout<
  // layout::nhwc> is channels-last, computing the same function with the same parameters.
  template <layout L>
  using with_layout = Sequential<typename detail::rebind_layout<Layers, L>::type...>;

  // The first layer's input size and the last layer's output size that are fixed (dyn if none).
  static constexpr index_t in_features = [] {
    for (std::size_t i = 0; i < N; ++i)
      if (ins_[i] != dyn) return ins_[i];
    return dyn;
  }();
  static constexpr index_t out_features = previous_outputs(N);
  // As a layer of an enclosing model (a Residual's body): what the layers make of sample In.
  template <class In>
  using output_sample = fold_sample_t<In, Layers...>;

  // Layers initialised in order from one generator (parameter layers draw, others ignore it).
  explicit Sequential(Generator& gen) : layers_{detail::make_layer<Layers>(gen)...} {}
  explicit Sequential(std::uint64_t seed = 0) : Sequential(lvalue(Generator(seed))) {}
  explicit Sequential(Layers... layers)
    requires(N > 0)
      : layers_{std::move(layers)...} {}

  template <std::size_t I>
  auto& layer() {
    return std::get<I>(layers_);
  }
  template <std::size_t I>
  const auto& layer() const {
    return std::get<I>(layers_);
  }
  static constexpr std::size_t size() { return N; }
  using layer_types = std::tuple<Layers...>;
  // Whether layer i runs layer i + 1 (an activation) in its own epilogue (a Linear or Conv2d
  // followed by an activation): the two are one step, forward and backward.
  static constexpr bool fuses_with_next(std::size_t i) { return fuses_next(i); }

  template <class Exec, class X>
  auto forward(ag::Tape<Exec>& tape, const X& x) {
    return forward_impl(tape, x, std::index_sequence_for<Layers...>{});
  }

  // Every layer but the last (what a Residual runs before fusing its sum into the last layer,
  // a batch norm: nn/residual.hpp), and the last layer.
  template <class Exec, class X>
    requires(N > 0)
  auto forward_but_last(ag::Tape<Exec>& tape, const X& x) {
    static_assert(!(N > 1 && fuses_next(N - 2)), "kiln::nn::Sequential::forward_but_last: the last layer runs "
                                                 "inside the one before it");
    return forward_impl(tape, x, std::make_index_sequence<N - 1>{});
  }
  auto& last_layer()
    requires(N > 0)
  {
    return std::get<N - 1>(layers_);
  }

  // Calls f(var) for every parameter variable, in layer order.
  template <class F>
  void for_each_parameter(F&& f) const {
    std::apply([&](const auto&... l) { (visit(l, f), ...); }, layers_);
  }

  // Every trainable parameter as (value, grad, size, node), gradient buffers allocated; for
  // optimizers. A frozen one (requires_grad false, nn/freeze.hpp) is left out and gets no buffer.
  // The pointers are in `space` (device pointers for a model on kiln::cuda).
  auto parameters() const {
    std::vector<Parameter<value_type>> out;
    for_each_parameter([&](const auto& v) {
      if (v.requires_grad()) out.push_back(parameter_of(v));
    });
    return out;
  }

  // The parameters as an optimizer table (float models). Its pointers are in `space`: for a
  // model on kiln::cuda a table of device pointers, what the CUDA optimizer step
  // (kiln/optim/cuda_step.cuh) takes; the host optimizers need a host model. Each slot points at
  // its variable's grad_valid flag (host memory in every space), so a parameter the last backward
  // did not reach is skipped by the optimizers and clipping, and an optimizer's zero_grad sets
  // it to none. Tables of several models concatenate: a.param_table() + b.param_table(). Frozen
  // parameters are not in it (freeze before building the optimizer, as PyTorch users pass only
  // the trainable ones).
  // requires: the model outlives the table and every optimizer built from it, and its parameters
  //   keep their shapes (the table holds pointers to their values, gradients and flags).
  optim::ParamTable param_table() const
    requires std::is_same_v<typename Sequential::value_type, float>
  {
    optim::ParamTable t;
    for (const auto& p : parameters()) t.add(p.value, p.grad, p.size, &p.node->grad_valid);
    return t;
  }

  // Whether every layer says what it launches (nn::counts_launches; a Linear's fused activation
  // must name its functor), so launches() is exact.
  static constexpr bool counts_launches = ((nn::counts_launches<Layers> && ...) && [] {
    bool ok = true;
    std::size_t i = 0;
    ((ok = ok && (!(i > 0 && fuses_next(i - 1)) || detail::has_functor<Layers>()), ++i), ...);
    return ok;
  }());
  // Parameter tensors over all layers (what an unfused optimizer launches kernels per).
  static constexpr index_t parameter_tensors = (detail::parameter_tensors_of<Layers>() + ... + 0);
  // Whether a GEMM computes this model's input gradient (its first layer is a Linear).
  static constexpr bool takes_fold = N > 0 && takes_fold_[0];
  // Whether every layer runs on bf16 / f16 activations (say `mixed_precision = true`): Linear,
  // Conv2d, BatchNorm2d, LayerNorm, the pools, activations, reshapes and the transformer layers;
  // kiln/nn/mixed_check.hpp names the layer that does not.
  static constexpr bool mixed_precision = (detail::mixed_precision_of<Layers>() && ... && true);
  // Whether a layer is an opaque user function (nn::Opaque), a boundary kiln does not fuse across.
  static constexpr bool has_opaque = (detail::opaque_of<Layers>() || ... || false);
  static constexpr bool is_opaque = has_opaque;  // as a layer of an enclosing model
  // Low-precision weight copies refresh_low_copies keeps (one kernel each).
  static constexpr index_t low_copies = (detail::low_copies_of<Layers>() + ... + 0);

  // Mixed precision: every Linear's weight copy in L (bf16 or f16), rounded from its float master
  // weight — one kernel per layer. train::Step calls it at start and after each optimizer step.
  template <class L, class Exec>
  void refresh_low_copies(Exec& exec) const {
    std::apply([&](const auto&... l) { (refresh_one<L>(l, exec), ...); }, layers_);
  }
  template <class L, class Exec>
  void refresh_low_copy(Exec& exec) const {  // as a layer of an enclosing model
    refresh_low_copies<L>(exec);
  }

  // Launches of one forward and one backward in context c (c.input_grad: whether the model's own
  // input needs a gradient; a batch of data does not), as the executor will count them.
  static constexpr Launches launches(const LaunchContext& c) {
    static_assert(counts_launches,
                  "kiln::nn::Sequential::launches: a layer does not say what it launches (give it "
                  "`static constexpr nn::Launches launches(const nn::LaunchContext&)`, see kiln/nn/module.hpp)");
    return launches_impl(c, all_trainable_, nullptr, std::index_sequence_for<Layers...>{});
  }
  // The same count for the parameters' requires_grad flags now: a frozen layer (nn/freeze.hpp)
  // launches no weight-gradient kernel, and nothing runs backward below the lowest trainable one.
  Launches launches_now(const LaunchContext& c) const {
    static_assert(counts_launches, "kiln::nn::Sequential::launches_now: a layer does not say what it launches");
    Grads g{};
    std::size_t i = 0;
    std::apply([&](const auto&... l) { ((g[i++] = param_grads_of(l)), ...); }, layers_);
    return launches_impl(c, g, this, std::index_sequence_for<Layers...>{});
  }

  index_t parameter_count() const {
    index_t n = 0;
    for_each_parameter([&](const auto& v) { n += v.value().size(); });
    return n;
  }
  // Values and tensors an optimizer updates: those of parameters not frozen.
  index_t trainable_parameter_count() const {
    index_t n = 0;
    for_each_parameter([&](const auto& v) { n += v.requires_grad() ? v.value().size() : 0; });
    return n;
  }
  index_t trainable_parameter_tensors() const {
    index_t n = 0;
    for_each_parameter([&](const auto& v) { n += v.requires_grad() ? 1 : 0; });
    return n;
  }

  // Set-to-none: the next backward writes every gradient instead of adding (no kernel).
  void zero_grad() const {
    for_each_parameter([](const auto& v) { v.data()->grad_valid = false; });
  }

  // Training mode (dropout active; batch statistics) or evaluation mode (dropout the identity;
  // running statistics), for every layer that has one, nested models included — as PyTorch's
  // Module.train() / eval(). A new model is in training mode. See also nn::EvalScope.
  void train(bool on = true) {
    std::apply([&](auto&... l) { (set_mode(l, on), ...); }, layers_);
    training_ = on;
  }
  void eval() { train(false); }
  bool training() const { return training_; }

  // One line for logs and reports: the mode, the layers as they run (a Linear and the activation
  // it fuses joined by '+'), and the parameter count, e.g.
  // "Sequential [train] Linear<400, 256>+relu -> Linear<256, 10> (102,986 parameters)".
  std::string describe() const {
    std::string out = training_ ? "Sequential [train]" : "Sequential [eval]";
    describe_layers(out, std::index_sequence_for<Layers...>{});
    const std::string count = std::to_string(parameter_count());
    std::string grouped;
    for (std::size_t i = 0; i < count.size(); ++i) {
      if (i > 0 && (count.size() - i) % 3 == 0) grouped += ',';
      grouped += count[i];
    }
    const index_t trainable = trainable_parameter_count();
    if (trainable == parameter_count()) return out + " (" + grouped + " parameters)";
    return out + " (" + grouped + " parameters, " + std::to_string(trainable) + " trainable)";
  }

  // As a layer of an enclosing model: its layers in brackets, e.g. "[Conv2d<3, 8, 3> -> ReLU]".
  std::string describe_nested() const {
    std::string out;
    describe_layers(out, std::index_sequence_for<Layers...>{});
    // Appended, not "[" + out.substr(1): g++ 12 warns (-Wrestrict, a false positive) on that form.
    std::string nested = "[";
    nested.append(out, out.empty() ? 0 : 1);
    nested += ']';
    return nested;
  }

  // Runs layer I on x (used by the forward fold). In anomaly mode (autograd/anomaly.hpp) the
  // layer's name labels what it records, and its output is checked.
  template <std::size_t I, class Exec, class X>
  auto run_layer(ag::Tape<Exec>& tape, const X& x) {
    if constexpr (I > 0 && fuses_next(I - 1)) {
      return x;  // ran inside the previous Linear
    } else {
      if (!ag::detect_anomaly()) return run_layer_now<I>(tape, x);
      ag::AnomalyLabel label(layer_label<I>());
      auto y = run_layer_now<I>(tape, x);
      if constexpr (requires { y.value(); }) ag::check_forward(y);
      return y;
    }
  }

 private:
  // "layer 2 (Linear<256, 128>+relu)": index and what runs, the fused activation included.
  template <std::size_t I>
  std::string layer_label() const {
    // Appended piece by piece: GCC 12 warns falsely (-Wrestrict) on `"text" + std::string`.
    std::string label = "layer ";
    label.append(std::to_string(I)).append(" (").append(detail::describe_layer(std::get<I>(layers_)));
    if constexpr (fuses_next(I)) label.append("+").append(detail::describe_layer(std::get<I + 1>(layers_)));
    return label.append(")");
  }
  template <std::size_t I, class Exec, class X>
  auto run_layer_now(ag::Tape<Exec>& tape, const X& x) {
    if constexpr (I > 0 && fuses_next(I - 1)) {
      return x;  // this activation already ran inside the previous Linear's bias kernel
    } else if constexpr (fuses_next(I)) {
      using Act = std::tuple_element_t<I + 1, std::tuple<Layers...>>;
      return std::get<I>(layers_).template forward_fused<Act>(tape, x);
    } else {
      return std::get<I>(layers_).forward(tape, x);
    }
  }

  static Generator& lvalue(Generator&& g) { return g; }

  template <class Exec, class X, std::size_t... I>
  auto forward_impl(ag::Tape<Exec>& tape, const X& x, std::index_sequence<I...>) {
    using Tape = ag::Tape<Exec>;
    return (detail::Flow<X>{x} | ... | detail::Step<I, Sequential, Tape>{this, &tape, detail::node_of(x)}).x;
  }

  template <std::size_t... I>
  void describe_layers(std::string& out, std::index_sequence<I...>) const {
    auto one = [&](auto index) {
      constexpr std::size_t i = decltype(index)::value;
      if constexpr (i > 0 && fuses_next(i - 1)) out += "+";
      else out += i == 0 ? " " : " -> ";
      out += detail::describe_layer(std::get<i>(layers_));
    };
    (one(std::integral_constant<std::size_t, I>{}), ...);
  }

  template <class L, class Layer, class Exec>
  static void refresh_one(const Layer& l, Exec& exec) {
    if constexpr (requires { l.template refresh_low_copy<L>(exec); }) l.template refresh_low_copy<L>(exec);
  }

  template <class L, class F>
  static void visit(const L& l, F& f) {
    if constexpr (requires { l.for_each_parameter(f); }) l.for_each_parameter(f);
  }
  template <class L>
  static void set_mode(L& l, bool on) {
    if constexpr (requires { l.train(on); }) l.train(on);
  }

  std::tuple<Layers...> layers_;
  bool training_ = true;
};

}  // namespace kiln::nn
