// kiln/nn/module.hpp — what every nn op and layer shares: parameter handles for optimizers, the
// loss reduction enum, layer traits (feature sizes, activations) and put_grad, which the ops'
// kernel functors use to write or accumulate a gradient.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/autograd/tape.hpp"
#include "kiln/autograd/var.hpp"
#include "kiln/config.hpp"
#include "kiln/core/bf16_bulk.hpp"
#include "kiln/core/epilogue.hpp"
#include "kiln/core/stats.hpp"
#include "kiln/core/tensor.hpp"

namespace kiln {
class CpuExecutor;  // the host instances below name it
}  // namespace kiln

namespace kiln::nn {

// ---- memory spaces ---------------------------------------------------------------------------
// What the nn layers need from the memory space their parameters live in: moving a tensor that
// was initialised on the host into the space (layers always draw their initial values on the
// host, so every space starts from the same numbers) and zero-filling a gradient buffer.
// host is defined here; another space's specialisation lives in its backend's nn header
// (kiln/nn/cuda.cuh for kiln::cuda), so host-only translation units need no device header.
template <class Space>
struct space_ops {
  static_assert(dependent_false<Space>,
                "kiln::nn: no space_ops for this memory space; include its backend's nn header "
                "(kiln/nn/cuda.cuh for kiln::cuda) before using nn layers in that space");
};
template <>
struct space_ops<host> {
  template <class T, index_t... D>
  static Tensor<T, host, D...> from_host(Tensor<T, host, D...>&& t) {
    return std::move(t);
  }
  template <class T>
  static void zero(T* p, index_t n) {
    std::fill(p, p + n, T(0));
  }
  // n values drawn on the host into a parameter's storage (a model's own re-initialisation).
  template <class T>
  static void copy_from_host(T* dst, const T* src, index_t n) {
    std::copy(src, src + n, dst);
  }
};

// How a loss reduces its per-sample values: their mean (PyTorch's default) or their sum.
enum class loss_reduction { mean, sum };

// One parameter as an optimizer or gradcheck sees it: `size` values, their gradient, and the
// variable's node (requires_grad / grad_valid). The gradient buffer exists (see parameter_of).
template <class T>
struct Parameter {
  T* value = nullptr;
  T* grad = nullptr;
  index_t size = 0;
  ag::VarNode* node = nullptr;
};

// The Parameter of a variable. Allocates its gradient buffer and, while it holds no valid
// gradient, zero-fills it (an optimizer that steps before any backward reads zeros) without
// marking it valid (set-to-none semantics: the next backward writes it).
// The pointers are in the variable's space S (device pointers for kiln::cuda).
// ensures: the pointers stay valid while the variable keeps its shape.
template <class T, class S, index_t... D>
Parameter<T> parameter_of(const ag::Var<T, S, D...>& v) {
  auto& d = *v.data();
  T* g = d.ensure_grad();
  d.grad_shared = true;
  if (!d.grad_valid) space_ops<S>::zero(g, d.value.size());
  return {d.value.data(), g, d.value.size(), &d};
}

// ---- launch counts known at compile time ------------------------------------------------------
// What a layer launches per forward and per backward (kernels and library calls, as the
// executor counts them), so a model's kernels per training step are a constexpr value
// (Sequential::launches, kiln/train/launches.hpp). A layer gives
//   static constexpr nn::Launches launches(const nn::LaunchContext&)
// and a Linear that runs a following activation in its epilogue also launches_fused<Act>(ctx).
struct LaunchContext {
  bool eager = false;       // stance::force_eager: every node its own kernel, no GEMM epilogues
  bool device = false;      // a device executor (some reductions take a kernel there, not a host loop)
  bool training = true;     // train mode (dropout draws masks)
  bool input_grad = false;  // the layer's input needs a gradient (an earlier layer has parameters)
  bool folded = false;      // a following GEMM takes this layer's activation backward (ag::linear's fold)
  // Whether the layer's own first parameter tensor (its weight) and second (its bias) need
  // gradients: false for a frozen one (nn/freeze.hpp), whose gradient kernel then does not run.
  bool weight_grad = true;
  bool bias_grad = true;
};
struct Launches {
  index_t forward = 0;
  index_t backward = 0;
  constexpr index_t total() const { return forward + backward; }
  constexpr Launches& operator+=(const Launches& o) {
    forward += o.forward;
    backward += o.backward;
    return *this;
  }
  constexpr bool operator==(const Launches&) const = default;
};
template <class L>
concept counts_launches = requires(const LaunchContext& c) {
  { L::launches(c) } -> std::same_as<Launches>;
};

// Which of a layer's parameters need gradients now: any of them, its first (weight) and its
// second (bias). nn/freeze.hpp clears them; a layer without parameters has none.
struct ParamGrads {
  bool any = false, weight = false, bias = false;
};
namespace detail {
struct IgnoreParameter {
  template <class V>
  void operator()(const V&) const {}
};
}  // namespace detail
// A layer or model with parameters (for_each_parameter).
template <class L>
concept has_parameters = requires(const L& l) { l.for_each_parameter(detail::IgnoreParameter{}); };
template <class L>
ParamGrads param_grads_of(const L& layer) {
  ParamGrads g;
  if constexpr (has_parameters<L>) {
    int k = 0;
    layer.for_each_parameter([&](const auto& v) {
      const bool r = v.requires_grad();
      g.any = g.any || r;
      if (k == 0) g.weight = r;
      if (k == 1) g.bias = r;
      ++k;
    });
  }
  return g;
}
// A composite layer (Sequential, Residual) that counts its parts' launches for their
// requires_grad flags now.
template <class L>
concept counts_launches_now = requires(const L& l, const LaunchContext& c) {
  { l.launches_now(c) } -> std::same_as<Launches>;
};
// A layer's launches as its parameters' requires_grad flags now make them; L::launches(c)
// assumes every parameter trainable.
template <class L>
Launches launches_now_of(const L& layer, LaunchContext c) {
  if constexpr (counts_launches_now<L>) {
    return layer.launches_now(c);
  } else {
    const ParamGrads g = param_grads_of(layer);
    c.weight_grad = g.weight;
    c.bias_grad = g.bias;
    return L::launches(c);
  }
}

// ---- layer traits ----------------------------------------------------------------------------
// A layer's first size (what its input's last dimension must be) and its output size; `dyn`
// for layers that keep whatever size they get (activations, dropout).
template <class L>
constexpr index_t in_features_of() {
  if constexpr (requires { L::in_features; }) return L::in_features;
  else return dyn;
}
template <class L>
constexpr index_t out_features_of() {
  if constexpr (requires { L::out_features; }) return L::out_features;
  else return dyn;
}
// Activations (elementwise layers a preceding Linear can fuse into its bias kernel) say
// `static constexpr bool is_activation = true` and give `static auto apply(expr)`.
template <class L>
constexpr bool is_activation_of() {
  if constexpr (requires { L::is_activation; }) return bool(L::is_activation);
  else return false;
}
template <class L>
inline constexpr bool is_activation_v = is_activation_of<L>();

// Whether a layer fused into a preceding one (launches_fused<Act>) applies a function: false for
// none (void) and for the identity's layer. Its functor says (Act::functor).
template <class Act>
constexpr bool applies_activation() {
  if constexpr (std::is_void_v<Act>) return false;
  else return !is_identity_act_v<typename Act::functor>;
}

// Layers that can run a following activation inside their own output kernel (Linear) say
// `static constexpr bool fuses_activation = true` and give `forward_fused<Act>(tape, x)`.
template <class L>
constexpr bool fuses_activation_of() {
  if constexpr (requires { L::fuses_activation; }) return bool(L::fuses_activation);
  else return false;
}
template <class L>
inline constexpr bool fuses_activation_v = fuses_activation_of<L>();

namespace detail {
// f(layer) for m and every layer inside it that has a train / eval mode, each container before
// the layers in it (Sequential, Residual, Repeat, by what they expose).
template <class M, class F>
void for_each_moded(M& m, F& f) {
  if constexpr (requires { m.training(); m.train(true); }) f(m);
  if constexpr (requires { M::size(); m.template layer<0>(); }) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (for_each_moded(m.template layer<I>(), f), ...);
    }(std::make_index_sequence<M::size()>{});
  } else if constexpr (requires { m.body(); m.shortcut(); }) {
    for_each_moded(m.body(), f);
    for_each_moded(m.shortcut(), f);
  } else if constexpr (requires { M::count; m.first(); m.block(1); }) {
    for_each_moded(m.first(), f);
    for (index_t i = 1; i < M::count; ++i) for_each_moded(m.block(i), f);
  }
}
}  // namespace detail

// Evaluation for the length of a scope: the model in eval mode and nothing recorded (NoGrad),
// every layer's own mode restored on exit — PyTorch's model.eval() + torch.no_grad(), undone. A
// layer the user put in eval mode in a model that trains (a frozen part, a Dropout turned off)
// stays in eval mode after the scope.
//   { kiln::nn::EvalScope evaluating(model); auto logits = model.forward(tape, x); ... }
template <class Model>
class EvalScope {
 public:
  explicit EvalScope(Model& model) : model_(&model) {
    auto save = [&](auto& layer) { modes_.push_back(layer.training()); };
    detail::for_each_moded(model, save);
    model.eval();
  }
  ~EvalScope() {
    // Outer layers first: a container's train() sets the layers in it, which then get their own.
    std::size_t next = 0;
    auto restore = [&](auto& layer) { layer.train(modes_[next++]); };
    detail::for_each_moded(*model_, restore);
  }
  EvalScope(const EvalScope&) = delete;
  EvalScope& operator=(const EvalScope&) = delete;

 private:
  Model* model_;
  std::vector<bool> modes_;  // each moded layer's, in for_each_moded's order
  ag::NoGrad no_grad_;
};

namespace detail {

// f for every row (f(r, 0), r < n) or, with PerColumn, every column (f(0, c), c < n), each
// item `len` elements of work, as ONE launch of kind k. On the CPU the items are split across
// threads by their length (for_each_element(n, 1) would give a thread up to `grain` whole items,
// so most inputs would run on one thread). On an executor with cooperative kernels (CUDA,
// kiln/backend/cuda/rowwise.cuh) f gives them its row as `row(team, r)`, run by a warp or a block
// per row, or its column sums as `terms` / `finish`, summed in tiles; a functor with a `part_type`
// (`part` / `finish`, rowwise.cuh) has its long rows split over several blocks each
// (kiln/core/row_parts.hpp). Elsewhere one work item each.
template <bool PerColumn, class Exec, class F>
void launch_lines(Exec& exec, index_t n, index_t len, const F& f, const char* name, std::size_t bytes,
                  const char* k = kind::norm) {
  if constexpr (std::is_same_v<typename Exec::space, host>) {
    exec.launch(name, [&exec, n, len, f, k, bytes](std::string_view nm) {
      exec.stats().count(k, nm, n * len, bytes);
      exec.parallel_for(n, std::max<index_t>(1, Exec::grain / std::max<index_t>(len, 1)), [&](index_t b, index_t e) {
        const F local = f;  // a private copy keeps its pointers in registers
        for (index_t i = b; i < e; ++i) {
          if constexpr (PerColumn) local(0, i);
          else local(i, 0);
        }
      });
    });
  } else if constexpr (PerColumn && requires { exec.column_sums(len, n, f, k, name, bytes); }) {
    exec.column_sums(len, n, f, k, name, bytes);
  } else if constexpr (!PerColumn && requires {
                         typename F::part_type;
                         exec.for_each_row_in_parts(n, len, f, k, name, bytes);
                       }) {
    exec.for_each_row_in_parts(n, len, f, k, name, bytes);
  } else if constexpr (!PerColumn && requires { exec.for_each_row(n, len, f, k, name, bytes); }) {
    exec.for_each_row(n, len, f, k, name, bytes);
  } else if constexpr (PerColumn) {
    exec.for_each_element(1, n, f, k, name, bytes);
  } else {
    exec.for_each_element(n, 1, f, k, name, bytes);
  }
}

// stance::force_eager's form of a layer's forward_fused<Act> (a convolution's, a batch norm's):
// the layer's plain forward, then the activation as a kernel of its own. Defined in
// kiln/nn/fused_eager.hpp (KILN_WEAK, KILN_FORCE_EAGER_FORMS).
template <class Act, class Layer, class Exec, class X, class Y>
KILN_WEAK Y forward_fused_eager(const Layer& layer, ag::Tape<Exec>& tape, const X& x);

// f(r, c) for every element of a rows × cols grid: the executor's for_each_element, as a free
// function so that kiln::kernels can compile the host instances of kiln's own element kernels once
// (a member template of the executor could not be declared extern where the kernels are defined).
template <class Exec, class F>
void launch_elements(Exec& exec, index_t rows, index_t cols, const F& f, const char* k, const char* name,
                     std::size_t bytes) {
  exec.for_each_element(rows, cols, f, k, name, bytes);
}

// The host instances of kiln's row kernels (launch_lines) and element kernels (launch_elements):
// compiled once in kiln::kernels (src/kernels/rows.cpp); a program linking it (KILN_EXTERN_KERNELS)
// declares them extern next to each kernel's definition. The kernel's type is the last argument
// (it may hold commas).
#define KILN_CPU_LINES(EXTERN, PER_COLUMN, ...)                                                          \
  EXTERN template void launch_lines<PER_COLUMN, ::kiln::CpuExecutor, __VA_ARGS__>(                      \
      ::kiln::CpuExecutor&, index_t, index_t, const __VA_ARGS__&, const char*, std::size_t, const char*);
#define KILN_CPU_ELEMENTS(EXTERN, ...)                                                 \
  EXTERN template void launch_elements<::kiln::CpuExecutor, __VA_ARGS__>(             \
      ::kiln::CpuExecutor&, index_t, index_t, const __VA_ARGS__&, const char*, const char*, std::size_t);

// dst[i] = src[i] rounded to L (one work item per element): a weight's or a batch's copy in bf16 /
// f16 for mixed precision.
template <class T, class L>
struct RoundCopy {
  const T* src;
  L* dst;
  KILN_HOST_DEVICE void operator()(index_t, index_t i) const { dst[i] = convert<L>(src[i]); }
  // The CPU executor's whole-range form: float to bf16 vectorised (kiln/core/bf16_bulk.hpp; the
  // same bits), for the 25 M weights of a ResNet-50 every step. (A member, as ag's kernels have:
  // a constant would leave the executor's per-element loop unreachable, which nvcc warns about.)
  bool flat = true;
  void run_flat(index_t begin, index_t end) const {
    if constexpr (std::is_same_v<T, float> && std::is_same_v<L, bf16>) {
      round_to_bf16(src + begin, dst + begin, end - begin);
    } else {
      for (index_t i = begin; i < end; ++i) dst[i] = convert<L>(src[i]);
    }
  }
};

// Writes v to the gradient slot, or adds it when the gradient already holds a contribution; the
// sum is taken in T's compute type and rounded once into a half-precision slot.
template <class T, class V>
KILN_HOST_DEVICE void put_grad(T& slot, V v, bool add) {
  using C = compute_t<T>;
  slot = add ? convert<T>(C(convert<C>(slot) + convert<C>(v))) : convert<T>(v);
}

}  // namespace detail
}  // namespace kiln::nn

#if KILN_FORCE_EAGER_FORMS
#include "kiln/nn/fused_eager.hpp"
#endif
