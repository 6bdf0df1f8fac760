// kiln/autograd/linear.hpp — y = act(x·Wᵀ + b) as ONE GEMM with a fused epilogue, and a
// backward of GEMMs only.
//
//   auto h = ag::linear<fn::Relu>(tape, x, w, b);   // x [B, In], w [Out, In], b [Out] -> [B, Out]
//   auto y = ag::linear(tape, h, w2);               // no activation, no bias
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

namespace kiln::ag {

namespace detail {

// What a linear op keeps for its backward: the aux buffer, and the offer (with its dZ buffer).
// Nothing in it depends on the layer's sizes: one type (and one backward) for every width.
template <class Exec, class T, class Act, bool HasBias>
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
    if constexpr (!HasBias) {
      return nullptr;
    } else {
      if (!bias || !bias->requires_grad) return nullptr;
      add = bias->grad_valid;
      return static_cast<compute_t<T>*>(bias->ensure_grad_data());
    }
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
template <class Exec, class T, class Act, bool HasBias>
struct LinearBackward {
  using State = LinearState<Exec, T, Act, HasBias>;
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

// stance::force_eager's form of linear_impl: the GEMM alone, then the bias and the activation as
// nodes of their own; false (y untouched) where that split does not give y's type. Defined in
// kiln/autograd/linear_eager.hpp (KILN_WEAK, KILN_FORCE_EAGER_FORMS).
template <class Act, class Exec, class T, class W, class S, index_t B, index_t I, index_t O, index_t I2,
          class BiasVar>
KILN_WEAK bool linear_eager(Tape<Exec>& tape, const Var<T, S, B, I>& x, const Var<W, S, O, I2>& w, const BiasVar* bias,
                            const T* w_low, Var<T, S, B, O>& y);

// x in T; the weight w (and the bias) in W = compute_t<T>. For a half-precision T the GEMMs read
// w_low, w's values in T (a copy the caller keeps current), and w's gradient still lands in w:
// mixed precision's float master weight.
template <class Act, class Exec, class T, class W, class S, index_t B, index_t I, index_t O, index_t I2,
          class BiasVar>
auto linear_impl(Tape<Exec>& tape, const Var<T, S, B, I>& x, const Var<W, S, O, I2>& w, const BiasVar* bias,
                 const T* w_low) {
  static_assert(std::is_same_v<S, typename Exec::space>,
                "kiln: ag::linear's variables must live in the executor's memory space");
  static_assert(std::is_same_v<W, compute_t<T>>,
                "kiln: ag::linear(x, w): w's type must be x's, or float for a bf16 / f16 x (mixed precision)");
  static_assert(I == dyn || I2 == dyn || I == I2,
                "kiln: ag::linear(x, w): x's last size must equal w's second size (y = x·wᵀ)");
  constexpr bool has_bias = !std::is_same_v<BiasVar, std::nullptr_t>;
  constexpr bool identity = is_identity_act_v<Act>;
  const index_t m = x.dim(0), k = x.dim(1), n = w.dim(0);
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
  using State = LinearState<Exec, T, Act, has_bias>;
  using Y = Var<T, S, B, O>;

  // force_eager: the GEMM alone, then the bias and the activation as nodes of their own (one
  // kernel each way per node), as an unfused framework runs them (kiln/force_eager.hpp).
  if constexpr (has_bias || !identity) {
    if (tape.force_eager()) {
      Y eager;
      if (run_eager_form(&linear_eager<Act, Exec, T, W, S, B, I, O, I2, BiasVar>, "ag::linear", tape, x, w, bias,
                         w_low, eager))
        return eager;
    }
  }

  Exec& exec = tape.exec();
  Y y(typename Y::tensor_type(Shape{m, n}));
  const bool needs_grad = tape.recording() && (x.requires_grad() || w.requires_grad() || bias_grad);
  auto state = std::make_shared<State>();
  state->rows = m;
  state->cols = n;
  state->out = y.value().data();
  if constexpr (has_bias) state->bias = bias->data();
  // Without a backward to come nothing needs saving; executors then skip the aux write.
  if (!identity && needs_grad) state->aux = exec.temps().take(exec.template act_aux_bytes<Act, T>(m, n));
  exec.gemm(false, true, m, n, k, 1.f, x.value().data(), k, w_values, k, 0.f, y.value().data(), n,
            BiasAct<Act, T>{bias_values, state->aux.get()});
  if (!needs_grad) return y;
  y.set_requires_grad(true);
  LinearBackward<Exec, T, Act, has_bias> backward{x.data(), w.data(), w_values, state, nullptr, m, n, k};
  if constexpr (!identity) {
    offer_fold<Exec, T>(*y.data(), state);
    // In place: a temporary's destructor would close the offer.
    backward.guard = std::make_shared<CloseOfferOnDrop<State>>();
    backward.guard->state = state;
  }
  std::vector<std::shared_ptr<VarNode>> inputs{x.data(), w.data()};
  if constexpr (has_bias) inputs.push_back(bias->data());
  tape.record(y, std::move(inputs),
              [backward = std::move(backward)](Exec& exec, auto& yd) { backward(exec, yd, yd.grad.data()); });
  return y;
}

}  // namespace detail

// y = act(x·wᵀ + b); Act is a kiln::fn functor (fn::Identity: none). Mixed precision: x in bf16
// or f16, w and b float master parameters, w_low w's values in x's type (required then, and
// kept current by the caller); y in x's type, the gradients of w and b in float.
template <class Act = fn::Identity, class Exec, class T, class W, class S, index_t B, index_t I, index_t O, index_t I2,
          index_t OB>
auto linear(Tape<Exec>& tape, const Var<T, S, B, I>& x, const Var<W, S, O, I2>& w, const Var<W, S, OB>& b,
            const T* w_low = nullptr) {
  static_assert(O == dyn || OB == dyn || O == OB, "kiln: ag::linear(x, w, b): b's size must equal w's first size");
  return detail::linear_impl<Act>(tape, x, w, &b, w_low);
}

// y = act(x·wᵀ), no bias.
template <class Act = fn::Identity, class Exec, class T, class W, class S, index_t B, index_t I, index_t O,
          index_t I2>
auto linear(Tape<Exec>& tape, const Var<T, S, B, I>& x, const Var<W, S, O, I2>& w, const T* w_low = nullptr) {
  return detail::linear_impl<Act>(tape, x, w, static_cast<const std::nullptr_t*>(nullptr), w_low);
}

}  // namespace kiln::ag

#if KILN_FORCE_EAGER_FORMS
#include "kiln/autograd/linear_eager.hpp"
#endif
