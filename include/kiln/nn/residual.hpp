// kiln/nn/residual.hpp — a skip connection around a sub-model: y = act(body(x) + shortcut(x)).
//
//   using Block = nn::Residual<nn::Sequential<nn::Conv2d<64, 64, 3, 1, 1>, nn::BatchNorm2d<64>, nn::ReLU,
//                                             nn::Conv2d<64, 64, 3, 1, 1>, nn::BatchNorm2d<64>>>;
//   using Down  = nn::Residual<Body, nn::Conv2d<64, 128, 1, 2>>;            // with a projection
//   using Basic = nn::Residual<Body, void, nn::ReLU>;                        // torchvision's relu(out + identity)
//
// Shortcut is void (the identity: x itself) or a layer — a projection such as a 1x1 Conv2d — when
// the body changes the shape. The body's and the shortcut's output samples must agree (a
// static_assert naming both). Activation is void (none) or an activation layer (nn::ReLU) applied
// to the sum in the same pass. The sum (and its activation) is ONE fused kernel, its backward ONE
// kernel that hands the gradient to both branches — and on the CPU, when the body ends in a
// BatchNorm2d and the activation is none or a ReLU, no kernel of its own: the batch norm's
// normalising pass adds the shortcut and applies the ReLU (fuses_into_norm); the gradient of x is the sum of both branches' contributions (the
// tape adds them). Parameters, modes and launch counts are the body's and the shortcut's.
#pragma once

#include <string>
#include <tuple>
#include <type_traits>

#include "kiln/autograd/map.hpp"
#include "kiln/core/random.hpp"
#include "kiln/expr/elementwise.hpp"
#include "kiln/nn/module.hpp"
#include "kiln/nn/sample_shape.hpp"
#include "kiln/nn/sequential.hpp"

namespace kiln::nn {

namespace detail {
struct IdentityShortcut {
  template <class In>
  using output_sample = In;
  template <class Exec, class X>
  const X& forward(ag::Tape<Exec>&, const X& x) const {
    return x;
  }
  static constexpr Launches launches(const LaunchContext&) { return {}; }
  static constexpr bool mixed_precision = true;
  static std::string describe() { return "identity"; }
};

// The functor a Residual's activation applies: fn::Identity for none, void for an activation
// that names none.
template <class A>
struct residual_act {
  using type = void;
};
template <class A>
  requires requires { typename A::functor; }
struct residual_act<A> {
  using type = typename A::functor;
};
template <>
struct residual_act<void> {
  using type = fn::Identity;
};
template <class A>
using residual_act_t = typename residual_act<A>::type;

// The last layer of a model (a Sequential), void for anything else.
template <class M>
struct last_layer {
  using type = void;
};
template <class M>
  requires(std::tuple_size_v<typename M::layer_types> > 0)
struct last_layer<M> {
  using type = std::tuple_element_t<std::tuple_size_v<typename M::layer_types> - 1, typename M::layer_types>;
};
template <class M>
using last_layer_t = typename last_layer<M>::type;
// A layer that can add a residual in its own pass (BatchNorm2d::forward_residual), and one whose
// backward never reads its output.
template <class L>
concept fuses_residual_layer = requires { L::fuses_residual; };
template <class L>
concept output_unread_layer = requires { L::backward_reads_output; } && !L::backward_reads_output;

template <class A, class B>
struct residual_branches_agree {
  static constexpr bool value = true;
};
template <index_t... A, index_t... B>
struct residual_branches_agree<sample<A...>, sample<B...>> {
  static_assert(sizeof...(A) == sizeof...(B) && ((A == dyn || B == dyn || A == B) && ...),
                "kiln::nn::Residual: the body's output and the shortcut's differ in shape; give the block a "
                "projection (residual_branches_agree<sample<body...>, sample<shortcut...>> names both)");
  static constexpr bool value = true;
};
}  // namespace detail

template <class Body, class Shortcut = void, class Activation = void>
class Residual {
  using SC = std::conditional_t<std::is_void_v<Shortcut>, detail::IdentityShortcut, Shortcut>;
  static_assert(std::is_void_v<Activation> || is_activation_v<Activation>,
                "kiln::nn::Residual<Body, Shortcut, Activation>: Activation must be void (none) or an activation "
                "layer such as nn::ReLU (kiln/nn/activation.hpp)");

 public:
  template <class In>
  using output_sample = std::enable_if_t<
      detail::residual_branches_agree<output_sample_t<Body, In>, output_sample_t<SC, In>>::value,
      output_sample_t<Body, In>>;
  using value_type = typename Body::value_type;
  using space = typename Body::space;
  template <class S>
  using on = Residual<typename detail::rebind_space<Body, S>::type, typename detail::rebind_space<Shortcut, S>::type,
                      Activation>;
  template <layout L>
  using with_layout = Residual<typename detail::rebind_layout<Body, L>::type,
                               typename detail::rebind_layout<Shortcut, L>::type, Activation>;
  static constexpr bool has_projection = !std::is_void_v<Shortcut>;
  using body_type = Body;
  using shortcut_type = Shortcut;  // void for the identity
  using activation_type = Activation;

  explicit Residual(Generator& gen) : body_(detail::make_layer<Body>(gen)), shortcut_(detail::make_layer<SC>(gen)) {}
  explicit Residual(std::uint64_t seed = 0) : Residual(lvalue(Generator(seed))) {}

  // Whether the sum and its activation run inside the body's last layer, a batch norm (its
  // normalising pass adds the shortcut and applies the ReLU: BatchNorm2d::forward_residual): on
  // the CPU, when the activation is none or a ReLU. Then the block's forward is one pass fewer,
  // and neither the body's output nor the sum is stored — backward takes the ReLU's derivative
  // from the block's output. stance::force_eager and anomaly mode run the unfused form.
  static constexpr bool fuses_into_norm =
      detail::fuses_residual_layer<detail::last_layer_t<Body>> && std::is_same_v<space, host> &&
      (std::is_same_v<detail::residual_act_t<Activation>, fn::Identity> ||
       std::is_same_v<detail::residual_act_t<Activation>, fn::Relu>);

  // Whether the shortcut is a model ending in a layer whose backward never reads its output (a
  // batch norm): with fuses_into_norm, nothing reads the projection's output after the sum.
  static constexpr bool projection_output_unread =
      fuses_into_norm && detail::output_unread_layer<detail::last_layer_t<SC>>;

  template <class Exec, class X>
  auto forward(ag::Tape<Exec>& tape, const X& x) {
    if constexpr (fuses_into_norm) {
      using Y = decltype(unfused_forward(tape, x));
      if (!tape.force_eager() && !ag::detect_anomaly()) {
        const auto h = body_.forward_but_last(tape, x);
        const auto& b = shortcut_.forward(tape, x);
        Y y = body_.last_layer().template forward_residual<detail::residual_act_t<Activation>, Y>(tape, h, b);
        // The projection's output: the fused backward passes its gradient on without reading it,
        // and its batch norm's backward does not read it either, so unless someone else holds it
        // (b here, the fused step's list of inputs) its elements go now: ResNet-50's four
        // projections kept 5.7 MiB per image that nothing would read.
        if constexpr (projection_output_unread) {
          if (b.data().use_count() <= 2) b.value().free_elements();
        }
        return y;
      }
    }
    return unfused_forward(tape, x);
  }

 private:
  // The block as written: the body, the shortcut, then the sum and its activation as one kernel.
  template <class Exec, class X>
  auto unfused_forward(ag::Tape<Exec>& tape, const X& x) {
    const auto a = body_.forward(tape, x);
    const auto& b = shortcut_.forward(tape, x);
    using V = typename decltype(a)::value_type;
    constexpr bool half = !std::is_same_v<V, compute_t<V>>;  // bf16 / f16: computed in float, rounded as stored
    if constexpr (std::is_void_v<Activation>) {
      if constexpr (half) return ag::map(tape, cast<V>(a + b));
      else return ag::map(tape, a + b);
    } else {
      if constexpr (half) return ag::map(tape, cast<V>(Activation::apply(a + b)));
      else return ag::map(tape, Activation::apply(a + b));
    }
  }

 public:

  template <class F>
  void for_each_parameter(F&& f) const {
    if constexpr (requires { body_.for_each_parameter(f); }) body_.for_each_parameter(f);
    if constexpr (requires { shortcut_.for_each_parameter(f); }) shortcut_.for_each_parameter(f);
  }
  void train(bool on = true) {
    if constexpr (requires { body_.train(on); }) body_.train(on);
    if constexpr (requires { shortcut_.train(on); }) shortcut_.train(on);
    training_ = on;
  }
  bool training() const { return training_; }

  // The branches' launches plus the sum (and its activation): ONE kernel forward, ONE backward —
  // none forward when the body's batch norm runs it (fuses_into_norm), the backward's being
  // dz = dy * relu'(y) for both branches then.
  static constexpr Launches launches(const LaunchContext& c) {
    Launches l = Body::launches(c);
    l += SC::launches(c);
    l += Launches{sum_runs_alone(c) ? sum_kernels(c) : 0, sum_kernels(c)};
    return l;
  }
  // The same for the parameters' requires_grad flags now (a frozen block: nn/freeze.hpp).
  Launches launches_now(const LaunchContext& c) const {
    Launches l = launches_now_of(body_, c);
    l += launches_now_of(shortcut_, c);
    const bool any = c.input_grad || param_grads_of(body_).any || param_grads_of(shortcut_).any;
    l += Launches{sum_runs_alone(c) ? sum_kernels(c) : 0, any ? sum_kernels(c) : 0};
    return l;
  }
  static constexpr bool sum_runs_alone(const LaunchContext& c) { return !fuses_into_norm || c.eager || c.device; }
  // The sum and its activation: one kernel each way, two under force_eager (every node its own).
  static constexpr index_t sum_kernels(const LaunchContext& c) { return c.eager && has_activation ? 2 : 1; }
  static constexpr bool has_activation = !std::is_void_v<Activation>;
  static constexpr index_t parameter_tensors =
      detail::parameter_tensors_of<Body>() + detail::parameter_tensors_of<SC>();
  // bf16 / f16 activations when both branches take them (the sum runs in float, rounded once).
  static constexpr bool mixed_precision = detail::mixed_precision_of<Body>() && detail::mixed_precision_of<SC>();
  static constexpr index_t low_copies = detail::low_copies_of<Body>() + detail::low_copies_of<SC>();
  template <class L, class Exec>
  void refresh_low_copy(Exec& exec) const {
    if constexpr (requires { body_.template refresh_low_copy<L>(exec); }) body_.template refresh_low_copy<L>(exec);
    if constexpr (requires { shortcut_.template refresh_low_copy<L>(exec); })
      shortcut_.template refresh_low_copy<L>(exec);
  }

  std::string describe() const {
    std::string out = "Residual(" + detail::describe_layer(body_);
    if constexpr (has_projection) out.append(" + ").append(detail::describe_layer(shortcut_));
    out.append(")");
    if constexpr (!std::is_void_v<Activation>) out.append("+").append(detail::describe_layer(Activation{}));
    return out;
  }
  Body& body() { return body_; }
  const Body& body() const { return body_; }
  SC& shortcut() { return shortcut_; }
  const SC& shortcut() const { return shortcut_; }

 private:
  static Generator& lvalue(Generator&& g) { return g; }

  Body body_;
  SC shortcut_;
  bool training_ = true;
};

}  // namespace kiln::nn
