// kiln/nn/linear.hpp — y = x·Wᵀ + b with PyTorch's layout ([Out, In] weight) and default init.
//
// Forward is ONE GEMM whose epilogue adds the bias; forward_fused<Act> puts an activation into the
// same epilogue, act(x·Wᵀ + b) — Sequential does this for every Linear followed by an activation.
// Backward is GEMMs only: act' and the bias gradient ride on the next layer's dX GEMM (or on one
// dact kernel) and the weight gradient's GEMM (autograd/linear.hpp).
//
// Space is where the parameters live (kiln::host or kiln::cuda). Initial values are always drawn
// on the host, in PyTorch's order, and moved into Space (space_ops<Space>::from_host), so a
// Linear<.., cuda> starts from exactly the numbers the host one does for the same seed. For
// kiln::cuda include kiln/nn/cuda.cuh (an nvcc translation unit).
#pragma once

#include <cstdint>
#include <string>

#include "kiln/autograd/linear.hpp"
#include "kiln/autograd/map.hpp"
#include "kiln/autograd/matmul.hpp"
#include "kiln/core/random.hpp"
#include "kiln/nn/init.hpp"
#include "kiln/nn/module.hpp"

namespace kiln::nn {

template <index_t In, index_t Out, bool Bias = true, class T = float, class Space = host>
class Linear {
  static_assert(In > 0 && Out > 0, "kiln::nn::Linear<In, Out>: both sizes must be positive");

 public:
  static constexpr index_t in_features = In;
  static constexpr index_t out_features = Out;
  static constexpr bool has_bias = Bias;
  static constexpr bool fuses_activation = true;
  using value_type = T;
  using space = Space;
  // The same layer with its parameters in another space (Sequential<...>::on<S> uses it).
  template <class S>
  using on = Linear<In, Out, Bias, T, S>;

  // Weight, then bias, from U(-1/sqrt(In), 1/sqrt(In)) (PyTorch's reset_parameters), drawn on
  // the host and moved into Space.
  explicit Linear(Generator& gen) : weight_(init_weight(gen), true), bias_(init_bias(gen)) {}
  explicit Linear(std::uint64_t seed = 0) : Linear(lvalue(Generator(seed))) {}

  // x [B, In] -> [B, Out]: ONE GEMM with a bias epilogue.
  template <class Exec, index_t B, index_t I>
  auto forward(ag::Tape<Exec>& tape, const ag::Var<T, Space, B, I>& x) const {
    return run<fn::Identity>(tape, x);
  }

  // act(x·Wᵀ + b) as ONE GEMM with a bias + activation epilogue; Act is an activation layer type
  // (one without a kiln::fn functor gets GEMM + ONE fused act(z + b) kernel instead).
  template <class Act, class Exec, index_t B, index_t I>
  auto forward_fused(ag::Tape<Exec>& tape, const ag::Var<T, Space, B, I>& x) const {
    if constexpr (requires { typename Act::functor; }) {
      static_assert(fn::unary_functor<typename Act::functor>,
                    "kiln::nn::Linear::forward_fused<Act>: Act::functor must be a kiln::fn::unary_functor (a name, "
                    "operator() and its derivative d(); see kiln/nn/activation.hpp)");
      return run<typename Act::functor>(tape, x);
    } else {
      const auto z = product(tape, x);
      if constexpr (Bias) return ag::map(tape, Act::apply(z + bias_));
      else return ag::map(tape, Act::apply(z));
    }
  }

  // "Linear<400, 256>" (", no bias" when it has none), for Sequential::describe().
  static std::string describe() {
    return "Linear<" + std::to_string(In) + ", " + std::to_string(Out) + (Bias ? ">" : ", no bias>");
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

  static Tensor<T, Space, Out, In> init_weight(Generator& gen) {
    ag::Var<T, host, Out, In> w;
    init::kaiming_uniform(w, gen, In);
    return space_ops<Space>::from_host(std::move(w.value()));
  }
  static auto init_bias(Generator& gen) {
    if constexpr (Bias) {
      ag::Var<T, host, Out> b;
      init::uniform(b, gen, -1.0 / std::sqrt(double(In)), 1.0 / std::sqrt(double(In)));
      return ag::Var<T, Space, Out>(space_ops<Space>::from_host(std::move(b.value())), true);
    } else {
      return nullptr;
    }
  }

  template <class Exec, index_t B, index_t I>
  void check_input(const ag::Var<T, Space, B, I>& x) const {
    KILN_CHECK(x.shape().rank == 2 && x.dim(1) == In, ShapeError, "Linear<", In, ", ", Out, ">: the input has shape ",
               x.shape().str(), "; its last size must be ", In);
  }
  template <class Act, class Exec, index_t B, index_t I>
  auto run(ag::Tape<Exec>& tape, const ag::Var<T, Space, B, I>& x) const {
    check_input<Exec>(x);
    if constexpr (Bias) return ag::linear<Act>(tape, x, weight_, bias_);
    else return ag::linear<Act>(tape, x, weight_);
  }
  template <class Exec, index_t B, index_t I>
  auto product(ag::Tape<Exec>& tape, const ag::Var<T, Space, B, I>& x) const {
    check_input<Exec>(x);
    return ag::matmul(tape, x, weight_, false, true);
  }

  ag::Var<T, Space, Out, In> weight_;
  [[no_unique_address]] std::conditional_t<Bias, ag::Var<T, Space, Out>, std::nullptr_t> bias_;
};

namespace detail {
// Flatten's kernels, as functors so that they run on every executor.
template <class T>
struct FlattenCopy {
  const T* x;
  T* y;
  KILN_HOST_DEVICE void operator()(index_t, index_t i) const { y[i] = x[i]; }
};
template <class T>
struct FlattenBackward {
  T* dx;
  const T* g;
  bool add;
  KILN_HOST_DEVICE void operator()(index_t, index_t i) const { put_grad(dx[i], g[i], add); }
};
}  // namespace detail

// Flatten: [B, d1, d2, ...] -> [B, d1 * d2 * ...] for a following Linear. A rank-2 input is
// returned as it is (no kernel); higher ranks are copied (ONE kernel forward, ONE backward),
// because a variable owns its storage.
struct Flatten {
  template <class Exec, class T, class S, index_t D0, index_t... Rest>
  auto forward(ag::Tape<Exec>& tape, const ag::Var<T, S, D0, Rest...>& x) const {
    if constexpr (sizeof...(Rest) <= 1) {
      return x;
    } else {
      constexpr index_t cols = ((Rest == dyn) || ...) ? dyn : (Rest * ...);
      using V = ag::Var<T, S, D0, cols>;
      const index_t rows = x.dim(0), n = x.value().size(), c = rows > 0 ? n / rows : 0;
      V out{typename V::tensor_type(Shape{rows, c})};
      const T* X = x.value().data();
      T* Y = out.value().data();
      tape.exec().for_each_element(1, n, detail::FlattenCopy<T>{X, Y}, kind::copy, "flatten",
                                   std::size_t(n) * sizeof(T) * 2);
      if (!x.requires_grad() || !tape.recording()) return out;
      out.set_requires_grad(true);
      tape.record(out, {x.data()}, [xd = x.data(), n](Exec& exec, auto& od) {
        if (!od.grad_valid || !xd->requires_grad) return;
        const bool add = xd->grad_valid;
        T* dx = xd->ensure_grad();
        const T* G = od.grad.data();
        exec.for_each_element(1, n, detail::FlattenBackward<T>{dx, G, add}, kind::copy,
                              "flatten_backward", std::size_t(n) * sizeof(T) * 2);
        xd->grad_valid = true;
      });
      return out;
    }
  }
};

}  // namespace kiln::nn
