// kiln/nn/linear.hpp — y = x·Wᵀ + b with PyTorch's layout ([Out, In] weight) and default init.
//
// Forward is ONE GEMM whose epilogue adds the bias; forward_fused<Act> puts an activation into the
// same epilogue, act(x·Wᵀ + b) — Sequential does this for every Linear followed by an activation.
// Backward is GEMMs only: act' and the bias gradient ride on the next layer's dX GEMM (or on one
// dact kernel) and the weight gradient's GEMM (autograd/linear.hpp).
//
// Out may be dyn: a head whose size is known only at run time (the class count of an image folder),
// Linear<2048, dyn>. It starts with no outputs and draws nothing; reset(outputs, seed) gives it
// its size and fresh PyTorch-style values — replacing a loaded model's head is that one call,
// made before the optimizer is built (the optimizer holds the parameters it was given).
//
// Space is where the parameters live (kiln::host or kiln::cuda). Initial values are always drawn
// on the host, in PyTorch's order, and moved into Space (space_ops<Space>::from_host), so a
// Linear<.., cuda> starts from exactly the numbers the host one does for the same seed. For
// kiln::cuda include kiln/nn/cuda.cuh (an nvcc translation unit).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>

#include "kiln/autograd/linear.hpp"
#include "kiln/autograd/map.hpp"
#include "kiln/autograd/matmul.hpp"
#include "kiln/core/random.hpp"
#include "kiln/nn/init.hpp"
#include "kiln/nn/module.hpp"
#include "kiln/nn/sample_shape.hpp"

namespace kiln::nn {

template <index_t In, index_t Out, bool Bias = true, class T = float, class Space = host>
class Linear {
  static_assert(In > 0 && (Out > 0 || Out == dyn),
                "kiln::nn::Linear<In, Out>: In must be positive, Out positive or dyn (a head sized at run time)");

 public:
  static constexpr index_t in_features = In;
  static constexpr index_t out_features = Out;
  static constexpr bool has_bias = Bias;
  static constexpr bool fuses_activation = true;
  using value_type = T;
  using space = Space;
  // The layer's own type, or bf16 / f16 when T is float (mixed precision).
  template <class X>
  static constexpr bool accepts_input = std::is_same_v<X, T> || (kiln::detail::is_half_v<X> && std::is_same_v<T, float>);
  // The same layer with its parameters in another space (Sequential<...>::on<S> uses it).
  template <class S>
  using on = Linear<In, Out, Bias, T, S>;

  // Weight, then bias, from U(-1/sqrt(In), 1/sqrt(In)) (PyTorch's reset_parameters), drawn on
  // the host and moved into Space.
  explicit Linear(Generator& gen) : weight_(init_weight(gen, Out == dyn ? 0 : Out), true), bias_(init_bias(gen, Out == dyn ? 0 : Out)) {}
  explicit Linear(std::uint64_t seed = 0) : Linear(lvalue(Generator(seed))) {}

  // Out = dyn: `outputs` outputs with fresh values from gen (drawn as Linear<In, outputs> draws
  // them). The previous parameters are dropped: call it before building the optimizer.
  void reset(index_t outputs, Generator& gen)
    requires(Out == dyn)
  {
    KILN_CHECK(outputs > 0, ValueError, "Linear<", In, ", dyn>::reset: outputs = ", outputs, " must be positive");
    weight_ = ag::Var<T, Space, Out, In>(init_weight(gen, outputs), true);
    if constexpr (Bias) bias_ = init_bias(gen, outputs);
    low_bf16_.reset();
    low_f16_.reset();
  }
  void reset(index_t outputs, std::uint64_t seed)
    requires(Out == dyn)
  {
    reset(outputs, lvalue(Generator(seed)));
  }
  // The number of outputs (Out, or a dyn head's current size).
  index_t outputs() const { return weight_.value().shape()[0]; }

  // x [B, In] -> [B, Out], or a sequence [B, T, In] -> [B, T, Out] (B * T rows): ONE GEMM with a
  // bias epilogue. x is T, or — under mixed precision — bf16 / f16: the GEMM then reads the
  // weight's copy in x's type (refresh_low_copy) and the output is x's type; the weight, the bias
  // and their gradients stay T.
  template <class Exec, class X, index_t... XD>
    requires accepts_input<X>
  auto forward(ag::Tape<Exec>& tape, const ag::Var<X, Space, XD...>& x) const {
    return run<fn::Identity>(tape, x);
  }

  // act(x·Wᵀ + b) as ONE GEMM with a bias + activation epilogue; Act is an activation layer type
  // (one without a kiln::fn functor gets GEMM + ONE fused act(z + b) kernel instead).
  template <class Act, class Exec, class X, index_t... XD>
    requires accepts_input<X>
  auto forward_fused(ag::Tape<Exec>& tape, const ag::Var<X, Space, XD...>& x) const {
    if constexpr (requires { typename Act::functor; }) {
      static_assert(fn::unary_functor<typename Act::functor>,
                    "kiln::nn::Linear::forward_fused<Act>: Act::functor must be a kiln::fn::unary_functor (a name, "
                    "operator() and its derivative d(); see kiln/nn/activation.hpp)");
      return run<typename Act::functor>(tape, x);
    } else {
      static_assert(std::is_same_v<X, T>,
                    "kiln::nn::Linear::forward_fused<Act>: under mixed precision an activation must name its "
                    "functor (kiln::nn::Activation<F>)");
      const auto z = product(tape, x);
      if constexpr (Bias) return ag::map(tape, Act::apply(z + bias_));
      else return ag::map(tape, Act::apply(z));
    }
  }

  // Mixed precision: the weight's values in L (bf16 or f16), rounded from the float master
  // weight by ONE kernel. A training step calls it after every optimizer step (and at start), so
  // the GEMMs of a bf16 / f16 forward read current weights.
  template <class L, class Exec>
  void refresh_low_copy(Exec& exec) const {
    static_assert(std::is_same_v<L, bf16> || std::is_same_v<L, f16>, "kiln::nn::Linear: low copies are bf16 or f16");
    auto& slot = low_slot<L>();
    if (!slot) slot = std::make_shared<Tensor<L, Space, Out, In>>(Shape{outputs(), In});
    const index_t n = outputs() * In;
    exec.for_each_element(1, n, detail::RoundCopy<T, L>{weight_.value().data(), slot->data()}, kind::copy,
                          "round_weight", std::size_t(n) * (sizeof(T) + sizeof(L)));
  }
  // Whether a bf16 / f16 copy of the weight exists (refresh_low_copy<L> ran).
  template <class L>
  bool has_low_copy() const {
    return low_slot<L>() != nullptr;
  }

  // Launches per forward and backward with the activation layer Act in the epilogue (one with a
  // kiln::fn functor; fn::Identity's layer or none: plain). Fused: ONE GEMM forward; backward the
  // weight-gradient GEMM (the bias gradient rides it or the activation's backward), the input-
  // gradient GEMM when the input needs one, and ONE dact kernel unless the next GEMM took it.
  // force_eager: GEMM, bias and activation one kernel each; backward the activation's kernel,
  // the bias's (a pass and a column reduction), and the GEMMs.
  // Frozen (c.weight_grad / c.bias_grad false): no weight-gradient GEMM; a trainable bias of a
  // plain Linear then takes a column reduction of its own; nothing at all when no gradient is due.
  template <class Act = void>
  static constexpr Launches launches_fused(const LaunchContext& c) {
    constexpr bool act = applies_activation<Act>();
    const bool dw = c.weight_grad, db = Bias && c.bias_grad;
    const index_t dx = c.input_grad ? 1 : 0;
    if (c.eager) {
      if (!(c.input_grad || dw || db)) return {1 + index_t(Bias) + index_t(act), 0};
      // The bias node: a pass for the GEMM's output gradient when it needs one, a column reduction
      // for the bias's.
      return {1 + index_t(Bias) + index_t(act),
              index_t(act) + (Bias ? index_t(c.input_grad || dw) + index_t(db) : 0) + index_t(dw) + dx};
    }
    if (!(c.input_grad || dw || db)) return {1, 0};
    return {1, index_t(act && !c.folded) + index_t(dw) + index_t(db && !dw && !act) + dx};
  }
  static constexpr Launches launches(const LaunchContext& c) { return launches_fused<void>(c); }
  // Parameter tensors (weight, and bias when it has one).
  static constexpr index_t parameter_tensors = Bias ? 2 : 1;
  // Its input gradient is a GEMM that can carry the producer's activation backward (fold.hpp).
  static constexpr bool takes_fold = true;
  // Runs on bf16 / f16 inputs with float master parameters (train::Step's mixed precisions),
  // keeping one low-precision copy (its weight).
  static constexpr bool mixed_precision = true;
  static constexpr index_t low_copies = 1;

  // "Linear<400, 256>" (", no bias" when it has none; "Linear<2048, dyn = 5>" for a head sized at
  // run time), for Sequential::describe().
  std::string describe() const {
    const std::string out = Out == dyn ? "dyn = " + std::to_string(outputs()) : std::to_string(Out);
    return "Linear<" + std::to_string(In) + ", " + out + (Bias ? ">" : ", no bias>");
  }

  template <class F>
  void for_each_parameter(F&& f) const {
    f(weight_);
    if constexpr (Bias) f(bias_);
  }

  const ag::Var<T, Space, Out, In>& weight() const { return weight_; }
  const ag::Var<T, Space, Out>& bias() const
    requires Bias
  {
    return bias_;
  }

 private:
  static Generator& lvalue(Generator&& g) { return g; }

  static Tensor<T, Space, Out, In> init_weight(Generator& gen, index_t outputs) {
    ag::Var<T, host, Out, In> w(Tensor<T, host, Out, In>(Shape{outputs, In}));
    init::kaiming_uniform(w, gen, In);
    return space_ops<Space>::from_host(std::move(w.value()));
  }
  static auto init_bias(Generator& gen, index_t outputs) {
    if constexpr (Bias) {
      ag::Var<T, host, Out> b(Tensor<T, host, Out>(Shape{outputs}));
      init::uniform(b, gen, -1.0 / std::sqrt(double(In)), 1.0 / std::sqrt(double(In)));
      return ag::Var<T, Space, Out>(space_ops<Space>::from_host(std::move(b.value())), true);
    } else {
      return nullptr;
    }
  }

  template <class Exec, class X, index_t... XD>
  void check_input(const ag::Var<X, Space, XD...>& x) const {
    static_assert(sizeof...(XD) == 2 || sizeof...(XD) == 3,
                  "kiln::nn::Linear: the input is [B, In] or a sequence [B, T, In]");
    KILN_CHECK(x.shape().rank == int(sizeof...(XD)) && x.shape().cols() == In, ShapeError, describe(),
               ": the input has shape ", x.shape().str(), "; its last size must be ", In);
    if constexpr (Out == dyn)
      KILN_CHECK(outputs() > 0, ValueError, describe(), ": a head sized at run time has no outputs yet; call "
                 "reset(outputs, seed) first");
  }
  template <class Act, class Exec, class X, index_t... XD>
  auto run(ag::Tape<Exec>& tape, const ag::Var<X, Space, XD...>& x) const {
    check_input<Exec>(x);
    const X* low = nullptr;
    if constexpr (!std::is_same_v<X, T>) {
      KILN_CHECK(low_slot<X>() != nullptr, ValueError, describe(), ": a ", kiln::name(dtype_of<X>),
                 " input needs the weight's ", kiln::name(dtype_of<X>), " copy; call refresh_low_copy (a train::Step does)");
      low = low_slot<X>()->data();
    }
    if constexpr (Bias) return ag::linear<Act>(tape, x, weight_, bias_, low);
    else return ag::linear<Act>(tape, x, weight_, low);
  }
  template <class Exec, index_t... XD>
  auto product(ag::Tape<Exec>& tape, const ag::Var<T, Space, XD...>& x) const {
    check_input<Exec>(x);
    return ag::matmul(tape, x, weight_, false, true);
  }

  template <class L>
  auto& low_slot() const {
    if constexpr (std::is_same_v<L, bf16>) return low_bf16_;
    else return low_f16_;
  }

  ag::Var<T, Space, Out, In> weight_;
  [[no_unique_address]] std::conditional_t<Bias, ag::Var<T, Space, Out>, std::nullptr_t> bias_;
  // The weight in bf16 / f16 for mixed precision (shared like the parameters: a copied layer
  // shares them), created by the first refresh_low_copy.
  mutable std::shared_ptr<Tensor<bf16, Space, Out, In>> low_bf16_;
  mutable std::shared_ptr<Tensor<f16, Space, Out, In>> low_f16_;
};

namespace detail {
// Between planar rows (per sample [C][H*W], NCHW's order) and channels-last ones ([H*W][C]),
// one element per work item, i indexing the planar side: to_last writes y[channels-last place of
// i] from x[i], otherwise y[i] from x's channels-last place (add: accumulate, for gradients).
template <class T>
struct ChannelsCopy {
  const T* x;
  T* y;
  index_t c, hw;
  bool to_last, add;
  KILN_HOST_DEVICE void operator()(index_t, index_t i) const {
    if (c == 1) {  // one channel: both orders are the same, a plain copy
      put_grad(y[i], x[i], add);
      return;
    }
    const index_t per = c * hw, n = i / per, r = i - n * per, ch = r / hw, p = r - ch * hw;
    const index_t last = n * per + p * c + ch;
    if (to_last) put_grad(y[last], x[i], add);
    else put_grad(y[i], x[last], add);
  }
};

// Flatten's output sample (declarations only: used in decltype).
any_sample flattened(any_sample*);
template <index_t... D>
sample<sample<D...>::size> flattened(sample<D...>*);
}  // namespace detail

// Flatten: [B, d1, d2, ...] -> [B, d1 * d2 * ...] for a following Linear. A rank-2 input is
// returned as it is (no kernel); higher ranks are copied (ONE kernel forward, ONE backward),
// because a variable owns its storage. FlattenLayout<layout::nhwc> (what with_layout gives)
// takes [B, H, W, C] and flattens in C, H, W order, so a following Linear sees the same features
// (and keeps the same weights) in either layout — as PyTorch's Flatten of a channels_last tensor.
template <layout Layout>
struct FlattenLayout {
  template <layout L>
  using with_layout = FlattenLayout<L>;
  // [C, H, W] (any rank) -> [C*H*W]; dyn when a size is (nn/sample_shape.hpp).
  template <class In>
  using output_sample = decltype(detail::flattened(static_cast<In*>(nullptr)));

  // A copy each way for an image (any sample of rank > 1, or one Sequential cannot see); nothing
  // for flat rows.
  template <class In>
  static constexpr Launches launches_for(const LaunchContext& c) {
    if constexpr (requires { In::rank; }) {
      if constexpr (In::rank <= 1) return {};
    }
    return {1, c.input_grad ? 1 : 0};
  }
  static constexpr Launches launches(const LaunchContext& c) { return launches_for<any_sample>(c); }
  static constexpr bool mixed_precision = true;  // a copy, in any type
  static std::string describe() { return Layout == layout::nhwc ? "Flatten[nhwc]" : "Flatten"; }

  template <class Exec, class T, class S, index_t D0, index_t... Rest>
  auto forward(ag::Tape<Exec>& tape, const ag::Var<T, S, D0, Rest...>& x) const {
    if constexpr (sizeof...(Rest) <= 1) {
      return x;
    } else {
      static_assert(Layout == layout::nchw || sizeof...(Rest) == 3,
                    "kiln::nn::Flatten in nhwc flattens images [B, H, W, C]");
      constexpr index_t cols = ((Rest == dyn) || ...) ? dyn : (Rest * ...);
      using V = ag::Var<T, S, D0, cols>;
      const Shape xs = x.shape();
      // The columns from the shape, not n / rows: a batch of 0 rows still has its width.
      index_t c = 1;
      for (int d = 1; d < xs.rank; ++d) c *= xs[d];
      const index_t rows = x.dim(0), n = x.value().size();
      // NHWC: the copy reorders [H*W][C] into [C][H*W]; NCHW: a plain copy (one channel of all).
      const index_t ch = Layout == layout::nhwc ? xs[xs.rank - 1] : 1, hw = ch > 0 ? c / ch : 0;
      V out{typename V::tensor_type(Shape{rows, c})};
      const T* X = x.value().data();
      T* Y = out.value().data();
      tape.exec().for_each_element(1, n, detail::ChannelsCopy<T>{X, Y, ch, hw, false, false}, kind::copy, "flatten",
                                   std::size_t(n) * sizeof(T) * 2);
      if (!x.requires_grad() || !tape.recording()) return out;
      out.set_requires_grad(true);
      tape.record(out, {x.data()}, [xd = x.data(), n, ch, hw](Exec& exec, auto& od) {
        if (!od.grad_valid || !xd->requires_grad) return;
        const bool add = xd->grad_valid;
        T* dx = xd->ensure_grad();
        const T* G = od.grad.data();
        exec.for_each_element(1, n, detail::ChannelsCopy<T>{G, dx, ch, hw, true, add}, kind::copy,
                              "flatten_backward", std::size_t(n) * sizeof(T) * 2);
        xd->grad_valid = true;
      });
      return out;
    }
  }
};
using Flatten = FlattenLayout<layout::nchw>;

}  // namespace kiln::nn
