// kiln/autograd/linear.hpp — y = act(x·Wᵀ + b) as ONE GEMM with a fused epilogue, and a
// backward of GEMMs only.
//
//   auto h = ag::linear<fn::Relu>(tape, x, w, b);   // x [B, In], w [Out, In], b [Out] -> [B, Out]
//   auto y = ag::linear(tape, h, w2);               // no activation, no bias
//   auto z = ag::linear(tape, seq, w, b);           // seq [B, T, In] -> [B, T, Out]: B * T rows
//
// Forward: exec.gemm with a BiasAct epilogue (kiln/core/epilogue.hpp) — on CUDA cuBLASLt's
// RELU_AUX_BIAS / GELU_AUX_BIAS / BIAS in one call — which also saves what act' needs (aux).
// Backward, for the gradient dY of y:
//   dZ = dY * act'(z) and db = column sums of dZ: folded into the GEMM that produced dY (the next
//     layer's dX GEMM gets a DRELU_BGRAD-style epilogue) through the offer this op leaves on y
//     (autograd/fold.hpp); when no GEMM took the offer, ONE dact kernel computes both from dY;
//   dW (+)= dZᵀ·x, with the BGRADA epilogue giving db when there is no activation;
//   dx (+)= dZ·W, offered in turn to x's producer.
// So an MLP's backward is its GEMMs and nothing else: three per layer become two plus the one
// the next layer already runs.
#pragma once

#include <cstddef>
#include <memory>
#include <type_traits>

#include "kiln/config.hpp"  // KILN_FORCE_EAGER_FORMS
#include "kiln/autograd/fold.hpp"
#include "kiln/autograd/map.hpp"
#include "kiln/autograd/tape.hpp"
#include "kiln/core/epilogue.hpp"
#include "kiln/core/temp_pool.hpp"
#include "kiln/expr/elementwise.hpp"  // the + and * its code writes on variables

namespace kiln {
class CpuExecutor;  // the host instances below name it
}  // namespace kiln

namespace kiln::ag {

namespace detail {

// What a linear op keeps for its backward: the aux buffer, and the offer (with its dZ buffer).
// Nothing in it depends on the layer's sizes: one type (and one backward) for every width.
template <class Exec, class T, class Act>
struct LinearState final : GemmGradFold<Exec, T> {
  using Buffer = typename TempPool<typename Exec::space>::Buffer;
  Buffer aux;
  Buffer dz;                                // dZ, once a consumer's GEMM took the offer
  std::shared_ptr<VarNode> bias;            // null without a bias; its elements are compute_t<T>
  const T* out = nullptr;                   // y's values (the CUDA ReLU path reads their sign)
  index_t rows = 0, cols = 0;
  bool taken = false;
  bool open = true;  // false once the backward rule that consumes the fold is gone from the tape

  T* dz_data() const { return static_cast<T*>(dz.get()); }

  // db (=|+=) its contribution: the pointer to write, or null when the bias needs no gradient.
  compute_t<T>* bias_grad(bool& add) const {
    if (!bias || !bias->requires_grad) return nullptr;
    add = bias->grad_valid;
    return static_cast<compute_t<T>*>(bias->ensure_grad_data());
  }

  bool gemm(Exec& exec, bool ta, bool tb, index_t m, index_t n, index_t k, const T* a, index_t lda, const T* b,
            index_t ldb) override {
    if (!open || taken || m != rows || n != cols || !exec.template folds_dact<Act>(k)) return false;
    dz = exec.temps().take(std::size_t(m * n) * sizeof(T));
    bool add = false;
    compute_t<T>* db = bias_grad(add);
    exec.gemm(ta, tb, m, n, k, 1.f, a, lda, b, ldb, 0.f, dz_data(), n, DAct<Act, T>{aux.get(), out, db, add});
    if (db) bias->grad_valid = true;
    taken = true;
    return true;
  }
};

// Closes the offer when the backward step holding it is freed (a backward() ran and released it,
// or its output died): a later GEMM must not fold into a producer that will never run.
template <class State>
struct CloseOfferOnDrop {
  std::weak_ptr<State> state;
  ~CloseOfferOnDrop() {
    if (auto s = state.lock()) s->open = false;
  }
};

// The backward of a linear op, compiled once for every width (its variables reached through
// VarNode): dZ = dY·act'(Z) (or the consumer's folded GEMM's), dW (=|+=) dZᵀ·X with the bias
// gradient in its epilogue, dX through gemm_into_grad. W = compute_t<T>: the weight's and the
// bias's elements; w_values the weight's values in T (their low-precision copy for a half T).
template <class Exec, class T, class Act>
struct LinearBackward {
  using State = LinearState<Exec, T, Act>;
  using W = compute_t<T>;
  std::shared_ptr<VarNode> x, w;
  const T* w_values;
  std::shared_ptr<State> state;
  std::shared_ptr<CloseOfferOnDrop<State>> guard;  // only an offer needs closing
  index_t m, n, k;

  [[gnu::noinline]] void operator()(Exec& exec, const VarNode& y, const T* y_grad) const {
    State& st = *state;
    const bool folded = st.taken;
    if (!folded && !y.grad_valid) return;  // nothing flowed back into y
    bool add_db = false;
    W* db = st.bias_grad(add_db);
    bool bias_done = false;
    typename State::Buffer scratch;
    const T* dz = nullptr;
    if constexpr (is_identity_act_v<Act>) {
      dz = y_grad;
    } else if (folded) {  // the consumer's GEMM wrote dZ and db; add what others sent to dY
      dz = st.dz_data();
      if (y.grad_valid) exec.template dact<Act>(m, n, y_grad, st.aux.get(), st.out, st.dz_data(), true, db, true);
      bias_done = true;
    } else {
      scratch = exec.temps().take(std::size_t(m * n) * sizeof(T));
      T* d = static_cast<T*>(scratch.get());
      exec.template dact<Act>(m, n, y_grad, st.aux.get(), st.out, d, false, db, add_db);
      dz = d;
      bias_done = true;
    }
    const T* x_values = static_cast<const T*>(x->value_data());
    if (w->requires_grad) {
      const float beta = w->grad_valid ? 1.f : 0.f;
      W* dw = static_cast<W*>(w->ensure_grad_data());
      if (db && !bias_done) {
        exec.gemm(true, false, n, k, m, 1.f, dz, n, x_values, k, beta, dw, k, BGradA<T>{db, add_db});
        bias_done = true;
      } else {
        exec.gemm(true, false, n, k, m, 1.f, dz, n, x_values, k, beta, dw, k);
      }
      w->grad_valid = true;
    }
    if (db && !bias_done)  // no weight gradient to ride on: the column sums alone
      exec.template dact<fn::Identity>(m, n, dz, static_cast<const void*>(nullptr), static_cast<const T*>(nullptr),
                                        static_cast<T*>(nullptr), false, db, add_db);
    if (db) st.bias->grad_valid = true;
    if (x->requires_grad) gemm_into_grad(exec, *x, false, false, m, k, n, dz, n, w_values, k);
    st.taken = false;
    st.dz = typename State::Buffer();
  }
};

// What the fused forward of one linear op reads, its sizes at run time: x [m, k] in T, the
// weight's values [n, k] in T (its low-precision copy for a half T) and its variable, the bias
// (null without one) in compute_t<T>.
template <class T>
struct LinearOperands {
  std::shared_ptr<VarNode> x, w, bias;
  const T* x_values;
  const T* w_values;
  const compute_t<T>* bias_values;
  index_t m, n, k;
  bool needs_grad;  // recording, and x, w or the bias requires a gradient
};

// y = act(x·wᵀ + b) into y_values ([m, n], allocated), and, when op.needs_grad, its backward
// recorded on y's node. The body of every linear op: nothing in it depends on the layer's sizes,
// so it is compiled once per executor, element type and activation — and, for the CPU executor
// and the common activations, once in kiln::kernels (KILN_CPU_LINEAR_FLOAT below).
template <class Act, class Exec, class T>
void linear_fused(Tape<Exec>& tape, const LinearOperands<T>& op, T* y_values, VarNode& y);

// stance::force_eager's form of linear_fused: the GEMM alone, then the bias and the activation as
// nodes of their own, the last one y. Defined in kiln/autograd/linear_eager.hpp (KILN_WEAK,
// KILN_FORCE_EAGER_FORMS).
template <class Act, class Exec, class T>
KILN_WEAK void linear_eager(Tape<Exec>& tape, const LinearOperands<T>& op, T* y_values, VarNode& y);

// x in T; the weight w (and the bias) in W = compute_t<T>. For a half-precision T the GEMMs read
// w_low, w's values in T (a copy the caller keeps current), and w's gradient still lands in w:
// mixed precision's float master weight.
// x [..., I] -> y [..., O]: every leading index a row of one GEMM ([B, T, D] -> B * T rows), as
// torch.nn.functional.linear.
template <index_t O, class T, class S, class Ext>
struct linear_out;
template <index_t O, class T, class S, index_t B, index_t I>
struct linear_out<O, T, S, extents<B, I>> {
  using type = Var<T, S, B, O>;
};
template <index_t O, class T, class S, index_t B, index_t L, index_t I>
struct linear_out<O, T, S, extents<B, L, I>> {
  using type = Var<T, S, B, L, O>;
};

template <index_t... D>
constexpr index_t last_extent() {
  index_t last = dyn;
  ((last = D), ...);
  return last;
}

template <class Act, class Exec, class T, class W, class S, index_t... XD, index_t O, index_t I2, class BiasVar>
auto linear_impl(Tape<Exec>& tape, const Var<T, S, XD...>& x, const Var<W, S, O, I2>& w, const BiasVar* bias,
                 const T* w_low) {
  static_assert(sizeof...(XD) == 2 || sizeof...(XD) == 3,
                "kiln: ag::linear(x, w): x is [rows, in] or a sequence [B, T, in]");
  constexpr index_t I = last_extent<XD...>();
  static_assert(std::is_same_v<S, typename Exec::space>,
                "kiln: ag::linear's variables must live in the executor's memory space");
  static_assert(std::is_same_v<W, compute_t<T>>,
                "kiln: ag::linear(x, w): w's type must be x's, or float for a bf16 / f16 x (mixed precision)");
  static_assert(I == dyn || I2 == dyn || I == I2,
                "kiln: ag::linear(x, w): x's last size must equal w's second size (y = x·wᵀ)");
  constexpr bool has_bias = !std::is_same_v<BiasVar, std::nullptr_t>;
  constexpr bool identity = is_identity_act_v<Act>;
  const Shape xs = x.shape();
  const index_t m = xs.rows(), k = xs.cols(), n = w.dim(0);
  KILN_CHECK(w.dim(1) == k, ShapeError, "linear: x has shape ", x.shape().str(), " and the weight ",
             w.shape().str(), "; the weight must be [out, ", k, "]");
  const T* w_values = nullptr;
  if constexpr (std::is_same_v<T, W>) {
    w_values = w.value().data();
  } else {
    KILN_CHECK(w_low != nullptr || w.value().size() == 0, ValueError,
               "linear: a half-precision input needs the weight's values in its type (the low-precision copy a "
               "training step keeps); got none");
    w_values = w_low;
  }
  const W* bias_values = nullptr;
  bool bias_grad = false;
  if constexpr (has_bias) {
    KILN_CHECK(bias->dim(0) == n, ShapeError, "linear: the bias has shape ", bias->shape().str(),
               " but the weight has ", n, " outputs");
    bias_values = bias->value().data();
    bias_grad = bias->requires_grad();
  }
  using Y = typename linear_out<O, T, S, extents<XD...>>::type;
  Shape ys = xs;
  ys[ys.rank - 1] = n;
  Y y{typename Y::tensor_type(ys)};
  LinearOperands<T> op{x.data(), w.data(), nullptr, x.value().data(), w_values, bias_values, m, n, k, false};
  op.needs_grad = tape.recording() && (x.requires_grad() || w.requires_grad() || bias_grad);
  if constexpr (has_bias) op.bias = bias->data();
  // force_eager: the GEMM alone, then the bias and the activation as nodes of their own (one
  // kernel each way per node), as an unfused framework runs them (kiln/force_eager.hpp).
  if (tape.force_eager() && (has_bias || !identity))
    run_eager_form(&linear_eager<Act, Exec, T>, "ag::linear", tape, op, y.value().data(), *y.data());
  else
    linear_fused<Act>(tape, op, y.value().data(), *y.data());
  return y;
}

template <class Act, class Exec, class T>
void linear_fused(Tape<Exec>& tape, const LinearOperands<T>& op, T* y_values, VarNode& y) {
  constexpr bool identity = is_identity_act_v<Act>;
  Exec& exec = tape.exec();
  const index_t m = op.m, n = op.n, k = op.k;
  using State = LinearState<Exec, T, Act>;
  auto state = std::make_shared<State>();
  state->rows = m;
  state->cols = n;
  state->out = y_values;
  state->bias = op.bias;
  // Without a backward to come nothing needs saving; executors then skip the aux write.
  // An aux format with padding the backward reads (cuBLASLt's ReLU bit-mask) starts zeroed.
  constexpr bool zero_fresh = requires { requires Exec::template act_aux_padded<Act>; };
  if (!identity && op.needs_grad)
    state->aux = exec.temps().take(exec.template act_aux_bytes<Act, T>(m, n), zero_fresh);
  exec.gemm(false, true, m, n, k, 1.f, op.x_values, k, op.w_values, k, 0.f, y_values, n,
            BiasAct<Act, T>{op.bias_values, state->aux.get()});
  if (!op.needs_grad) return;
  y.requires_grad = true;
  LinearBackward<Exec, T, Act> backward{op.x, op.w, op.w_values, state, nullptr, m, n, k};
  if constexpr (!identity) {
    offer_fold<Exec, T>(y, state);
    // In place: a temporary's destructor would close the offer.
    backward.guard = std::make_shared<CloseOfferOnDrop<State>>();
    backward.guard->state = state;
  }
  std::vector<std::shared_ptr<VarNode>> inputs{op.x, op.w};
  if (op.bias) inputs.push_back(op.bias);
  VarNode* out = &y;  // raw: the step is owned by y, so y outlives it
  tape.record_node(y, std::move(inputs), [backward = std::move(backward), out](Exec& exec) {
    backward(exec, *out, static_cast<const T*>(out->grad_data()));
  });
}

// The CPU executor's linear ops (fused and force_eager forms) compiled once in kiln::kernels.
#define KILN_CPU_LINEAR_FORMS(EXTERN, Act, T)                                                                       \
  EXTERN template void linear_fused<Act, ::kiln::CpuExecutor, T>(Tape<::kiln::CpuExecutor>&, const LinearOperands<T>&, \
                                                                 T*, VarNode&);                                        \
  KILN_CPU_LINEAR_EAGER(EXTERN, Act, T)
#define KILN_CPU_LINEAR_EAGER(EXTERN, Act, T)                                                                       \
  EXTERN template void linear_eager<Act, ::kiln::CpuExecutor, T>(Tape<::kiln::CpuExecutor>&, const LinearOperands<T>&, \
                                                                 T*, VarNode&);
// Those most programs use: kiln's activations in float, the identity and ReLU in bf16 and f16
// (src/kernels/linear_float.cpp, linear_half.cpp); any other is compiled where it is used.
#define KILN_CPU_LINEAR_FLOAT(EXTERN)                  \
  KILN_CPU_LINEAR_FORMS(EXTERN, fn::Identity, float)   \
  KILN_CPU_LINEAR_FORMS(EXTERN, fn::Relu, float)       \
  KILN_CPU_LINEAR_FORMS(EXTERN, fn::GeluErf, float)    \
  KILN_CPU_LINEAR_FORMS(EXTERN, fn::GeluTanh, float)
#define KILN_CPU_LINEAR_HALF(EXTERN)                   \
  KILN_CPU_LINEAR_FORMS(EXTERN, fn::Identity, bf16)    \
  KILN_CPU_LINEAR_FORMS(EXTERN, fn::Relu, bf16)        \
  KILN_CPU_LINEAR_FORMS(EXTERN, fn::Identity, f16)     \
  KILN_CPU_LINEAR_FORMS(EXTERN, fn::Relu, f16)
#if KILN_EXTERN_KERNELS
KILN_CPU_LINEAR_FLOAT(extern)
KILN_CPU_LINEAR_HALF(extern)
#endif

}  // namespace detail

// y = act(x·wᵀ + b); Act is a kiln::fn functor (fn::Identity: none). Mixed precision: x in bf16
// or f16, w and b float master parameters, w_low w's values in x's type (required then, and
// kept current by the caller); y in x's type, the gradients of w and b in float.
template <class Act = fn::Identity, class Exec, class T, class W, class S, index_t... XD, index_t O, index_t I2,
          index_t OB>
auto linear(Tape<Exec>& tape, const Var<T, S, XD...>& x, const Var<W, S, O, I2>& w, const Var<W, S, OB>& b,
            const T* w_low = nullptr) {
  static_assert(O == dyn || OB == dyn || O == OB, "kiln: ag::linear(x, w, b): b's size must equal w's first size");
  return detail::linear_impl<Act>(tape, x, w, &b, w_low);
}

// y = act(x·wᵀ), no bias.
template <class Act = fn::Identity, class Exec, class T, class W, class S, index_t... XD, index_t O, index_t I2>
auto linear(Tape<Exec>& tape, const Var<T, S, XD...>& x, const Var<W, S, O, I2>& w, const T* w_low = nullptr) {
  return detail::linear_impl<Act>(tape, x, w, static_cast<const std::nullptr_t*>(nullptr), w_low);
}

}  // namespace kiln::ag

#if KILN_FORCE_EAGER_FORMS
#include "kiln/autograd/linear_eager.hpp"
#endif
