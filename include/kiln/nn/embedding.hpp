// kiln/nn/embedding.hpp — token and position embeddings, and a head tied to the token embedding.
//
//   Embedding<65, 128>            token ids [B, T] -> [B, T, 128]: row id of a [65, 128] table
//   PositionEmbedding<64, 128>    x [B, T, 128] -> x + table[0:T] (T <= 64, a learned table)
//   TiedHead<65, 128>             x [B, T, 128] -> x · tableᵀ, [B, T, 65], with the Embedding's table
//
// Token ids travel as float values, as every model input does (train::Step's batch is float):
// exact for ids below 2^24, and each id is checked — an id that is not a whole number in
// [0, Vocab) is an error naming its batch row, position and value. The embedding's backward is a
// scatter-add made deterministic by giving each thread a slice of the D columns and summing the
// positions in order (the same bits at any thread count); rows of ids that did not occur get 0,
// as PyTorch's dense gradient. The position table's gradient sums the batch in order per position.
// A tied head uses one parameter twice (GPT-2's lm_head): the Embedding owns and lists it, the head
// holds a handle to the same variable and lists nothing, so the optimizer sees it once and its
// gradient is the sum of both uses (the tape adds the head's GEMM to the scatter's rows).
// On kiln::cuda (include kiln/nn/cuda.cuh) the same layers run one-thread-per-element kernels
// through the executor's for_each_element. A kernel cannot report a bad id without a host wait
// per step, so there, as a bad label in cross_entropy, a bad id makes its row NaN (and gives its
// row no gradient) instead of reading outside the table; the CPU checks every id and throws.
// The device scatter-add runs a thread per column over the rows in order (deterministic, D-wide:
// fine for character vocabularies and batches of a few thousand rows, slow for GPT-2's 50257).
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>

#include "kiln/autograd/linear.hpp"
#include "kiln/core/random.hpp"
#include "kiln/nn/init.hpp"
#include "kiln/nn/module.hpp"
#include "kiln/nn/sample_shape.hpp"

namespace kiln::nn {

namespace detail {

// A parameter drawn on the host by `draw` (in the host layer's order) and moved into Space.
template <class T, class Space, index_t R, index_t C, class Draw>
ag::Var<T, Space, R, C> drawn_table(Draw&& draw) {
  ag::Var<T, host, R, C> w(Tensor<T, host, R, C>(Shape{R, C}), true);
  draw(w);
  return ag::Var<T, Space, R, C>(space_ops<Space>::from_host(std::move(w.value())), true);
}

// The device forms, a thread per element (the executor's for_each_element). T is the table's type,
// Id the ids', O (or X) the activations' (bf16 / f16 under mixed precision: computed in T, rounded
// as stored).
// out row r = table row ids[r], or NaN when ids[r] is not an id; index[r] = the id, or -1.
template <class T, class Id = float, class O = T>
struct EmbeddingGather {
  const Id* ids;
  const T* table;
  O* out;
  std::int32_t* index;
  index_t vocab, width;
  KILN_HOST_DEVICE void operator()(index_t r, index_t c) const {
    const float v = convert<float>(ids[r]);
    const bool ok = v >= 0.0f && v < float(vocab) && v == ::floorf(v);
    out[r * width + c] = ok ? convert<O>(table[index_t(v) * width + c]) : convert<O>(NAN);
    if (c == 0) index[r] = ok ? std::int32_t(v) : -1;
  }
};
// Column c of the table's gradient: (= 0, or kept when add) + the rows of each id, in row order.
template <class T, class G = T>
struct EmbeddingScatterColumn {
  const G* grad;
  const std::int32_t* index;
  T* dw;
  index_t rows, vocab, width;
  bool add;
  KILN_HOST_DEVICE void operator()(index_t, index_t c) const {
    if (!add)
      for (index_t v = 0; v < vocab; ++v) dw[v * width + c] = T(0);
    for (index_t r = 0; r < rows; ++r) {
      const std::int32_t id = index[r];
      if (id >= 0) dw[index_t(id) * width + c] += convert<T>(grad[r * width + c]);
    }
  }
};
// y = x + table[row r's position], rows of `len` positions.
template <class T, class X = T>
struct PositionAdd {
  const X* x;
  const T* table;
  X* y;
  index_t len, width;
  KILN_HOST_DEVICE void operator()(index_t r, index_t c) const {
    y[r * width + c] = convert<X>(convert<T>(x[r * width + c]) + table[(r % len) * width + c]);
  }
};
// dx = g (or dx + g when add), element by element.
template <class X>
struct GradientPass {
  const X* g;
  X* dx;
  index_t width;
  bool add;
  KILN_HOST_DEVICE void operator()(index_t r, index_t c) const {
    const index_t i = r * width + c;
    dx[i] = add ? convert<X>(convert<compute_t<X>>(dx[i]) + convert<compute_t<X>>(g[i])) : g[i];
  }
};
// The position table's gradient at (t, c): the batch's rows at position t, summed in order.
template <class T, class X = T>
struct PositionTableGradient {
  const X* g;
  T* dp;
  index_t rows, len, width;
  bool add;
  KILN_HOST_DEVICE void operator()(index_t t, index_t c) const {
    T s = add ? dp[t * width + c] : T(0);
    if (t < len)
      for (index_t b = 0; b < rows; ++b) s += convert<T>(g[(b * len + t) * width + c]);
    dp[t * width + c] = s;
  }
};

template <index_t D, class In>
struct embedded_sample {
  using type = sequence<dyn, D>;
};
template <index_t D, index_t L>
struct embedded_sample<D, sample<L>> {
  using type = sequence<L, D>;
};

template <index_t MaxT, index_t D, class In>
struct positioned_sample {
  using type = sequence<MaxT, D>;  // any_sample: from here on the bound is the table's
};
template <index_t MaxT, index_t D, index_t L, index_t W>
struct positioned_sample<MaxT, D, sequence<L, W>> {
  static_assert(W == dyn || W == D,
                "kiln::nn::PositionEmbedding<MaxT, D>: its input's width differs from D (positioned_sample<MaxT, D, "
                "sequence<length, width>> names both)");
  static_assert(L == dyn || L <= MaxT,
                "kiln::nn::PositionEmbedding<MaxT, D>: the sequence is longer than the table's MaxT positions "
                "(positioned_sample<MaxT, D, sequence<length, width>> names both)");
  using type = sequence<MaxT, D>;
};
}  // namespace detail

template <index_t Vocab, index_t D, class T = float, class Space = host>
class Embedding {
  static_assert(Vocab > 0 && D > 0, "kiln::nn::Embedding<Vocab, D>: both sizes must be positive");
  static_assert(Vocab <= (index_t(1) << 24),
                "kiln::nn::Embedding<Vocab, D>: token ids travel as float values, exact up to 2^24; a larger "
                "vocabulary is not supported");

 public:
  static constexpr index_t vocabulary = Vocab;
  static constexpr index_t width = D;
  using value_type = T;
  using space = Space;
  template <class S>
  using on = Embedding<Vocab, D, T, S>;
  template <class In>
  using output_sample = typename detail::embedded_sample<D, In>::type;

  // N(0, 1), torch.nn.Embedding's default.
  explicit Embedding(Generator& gen)
      : weight_(detail::drawn_table<T, Space, Vocab, D>([&](auto& w) { init::normal(w, gen, 0.0, 1.0); })) {}
  explicit Embedding(std::uint64_t seed = 0) : Embedding(lvalue(Generator(seed))) {}

  // ids [B, L] (float values) -> [B, L, D]. Under mixed precision the step's batch, and so the
  // ids, are bf16 / f16 (exact for ids up to 256 / 2048): the rows are then that type too.
  template <class Exec, class Id, index_t B, index_t L>
    requires(std::is_same_v<Id, float> || std::is_same_v<Id, bf16> || std::is_same_v<Id, f16>)
  auto forward(ag::Tape<Exec>& tape, const ag::Var<Id, Space, B, L>& ids) const {
    static_assert(!std::is_same_v<Id, bf16> || Vocab <= 256,
                  "kiln::nn::Embedding<Vocab, D>: under bf16_mixed the batch's token ids travel as bfloat16, exact "
                  "only up to 256; use fp16_mixed (2048) or fp32 for a larger vocabulary");
    static_assert(!std::is_same_v<Id, f16> || Vocab <= 2048,
                  "kiln::nn::Embedding<Vocab, D>: under fp16_mixed the batch's token ids travel as IEEE half, exact "
                  "only up to 2048; use fp32 for a larger vocabulary");
    using O = std::conditional_t<std::is_same_v<Id, float>, T, Id>;  // the rows' type
    using V = ag::Var<O, Space, B, L, D>;
    const index_t rows = ids.dim(0), len = ids.dim(1), n = rows * len;
    V out{typename V::tensor_type(Shape{rows, len, D})};
    auto index = std::make_shared<Tensor<std::int32_t, Space, dyn>>(Shape{n});
    const auto* X = ids.value().data();
    std::int32_t* Ix = index->data();
    O* Y = out.value().data();
    const T* Wt = weight_.value().data();
    Exec& exec = tape.exec();
    if constexpr (!std::is_same_v<Space, host>) {
      exec.for_each_element(n, D, detail::EmbeddingGather<T, Id, O>{X, Wt, Y, Ix, Vocab, D}, kind::copy, "embedding",
                            std::size_t(n) * (D * sizeof(T) * 2 + sizeof(float)));
    } else {
      exec.launch("embedding", [&exec, X, Ix, Y, Wt, n, len](std::string_view nm) {
        exec.stats().count(kind::copy, nm, n * D, std::size_t(n) * (D * sizeof(T) * 2 + sizeof(float)));
        std::int32_t* I = Ix;
        for (index_t r = 0; r < n; ++r) {  // checked first, in order: the error names the first bad id
          const float v = convert<float>(X[r]);
          KILN_CHECK(v >= 0.0f && v < float(Vocab) && v == std::floor(v), ValueError, "Embedding<", Vocab, ", ", D,
                     ">: token id ", v, " at batch row ", r / len, ", position ", r % len,
                     " is not an id of the vocabulary [0, ", Vocab, ")");
          I[r] = std::int32_t(v);
        }
        exec.parallel_for(n, std::max<index_t>(1, Exec::grain / D), [&](index_t b, index_t e) {
          for (index_t r = b; r < e; ++r) {
            const T* src = Wt + index_t(I[r]) * D;
            O* dst = Y + r * D;
            for (index_t c = 0; c < D; ++c) dst[c] = convert<O>(src[c]);
          }
        });
      });
    }
    if (!weight_.requires_grad() || !tape.recording()) return out;
    out.set_requires_grad(true);
    tape.record(out, {weight_.data()}, [wd = weight_.data(), index, n](Exec& ex, auto& od) {
      if (!od.grad_valid || !wd->requires_grad) return;
      const bool add = wd->grad_valid;
      T* dW = wd->ensure_grad();
      const O* G = od.grad.data();
      const std::int32_t* I = index->data();
      if constexpr (!std::is_same_v<Space, host>) {
        ex.for_each_element(1, D, detail::EmbeddingScatterColumn<T, O>{G, I, dW, n, Vocab, D, add}, kind::other,
                            "embedding_backward", std::size_t(n) * D * sizeof(T) * 2);
      } else {
        ex.launch("embedding_backward", [&ex, dW, G, I, n, add](std::string_view nm) {
          ex.stats().count(kind::other, nm, n * D, std::size_t(n) * D * sizeof(T) * 2);
          // Column slices: each thread owns some of the D columns of every row of dW.
          const index_t grain = std::max<index_t>(1, D * Exec::grain / std::max<index_t>(n * D, 1));
          ex.parallel_for(D, grain, [&](index_t b, index_t e) {
            if (!add)
              for (index_t v = 0; v < Vocab; ++v)
                for (index_t c = b; c < e; ++c) dW[v * D + c] = T(0);
            for (index_t r = 0; r < n; ++r) {
              T* dst = dW + index_t(I[r]) * D;
              const O* g = G + r * D;
              for (index_t c = b; c < e; ++c) dst[c] += convert<T>(g[c]);
            }
          });
        });
      }
      wd->grad_valid = true;
    });
    return out;
  }

  // ONE gather forward, ONE scatter-add backward (none when frozen).
  static constexpr Launches launches(const LaunchContext& c) { return {1, c.weight_grad ? 1 : 0}; }
  // bf16 / f16 ids give rows of their type (train::Step's mixed precisions).
  static constexpr bool mixed_precision = true;
  static constexpr index_t parameter_tensors = 1;
  static std::string describe() { return "Embedding<" + std::to_string(Vocab) + ", " + std::to_string(D) + ">"; }

  template <class F>
  void for_each_parameter(F&& f) const {
    f(weight_);
  }
  const ag::Var<T, Space, Vocab, D>& weight() const { return weight_; }

 private:
  static Generator& lvalue(Generator&& g) { return g; }
  ag::Var<T, Space, Vocab, D> weight_;
};

template <index_t MaxT, index_t D, class T = float, class Space = host>
class PositionEmbedding {
  static_assert(MaxT > 0 && D > 0, "kiln::nn::PositionEmbedding<MaxT, D>: both sizes must be positive");

 public:
  static constexpr index_t max_length = MaxT;
  static constexpr index_t width = D;
  using value_type = T;
  using space = Space;
  template <class S>
  using on = PositionEmbedding<MaxT, D, T, S>;
  template <class In>
  using output_sample = typename detail::positioned_sample<MaxT, D, In>::type;

  explicit PositionEmbedding(Generator& gen)
      : weight_(detail::drawn_table<T, Space, MaxT, D>([&](auto& w) { init::normal(w, gen, 0.0, 1.0); })) {}
  explicit PositionEmbedding(std::uint64_t seed = 0) : PositionEmbedding(lvalue(Generator(seed))) {}

  // x [B, L, D] -> x + table[0:L]; throws ShapeError when L > MaxT. x is T, or bf16 / f16 under
  // mixed precision (the sum in float, rounded once; the table and its gradient stay T).
  template <class Exec, class X, index_t B, index_t L, index_t W>
    requires(std::is_same_v<X, T> || std::is_same_v<X, bf16> || std::is_same_v<X, f16>)
  auto forward(ag::Tape<Exec>& tape, const ag::Var<X, Space, B, L, W>& x) const {
    using V = ag::Var<X, Space, B, L, W>;
    const index_t rows = x.dim(0), len = x.dim(1);
    KILN_CHECK(x.dim(2) == D, ShapeError, describe(), ": the input has shape ", x.shape().str(), "; its width must be ", D);
    KILN_CHECK(len <= MaxT, ShapeError, describe(), ": the sequence has T = ", len,
               " positions, more than the model's maximum of ", MaxT);
    V out{typename V::tensor_type(x.shape())};
    const X* Xs = x.value().data();
    const T* P = weight_.value().data();
    X* Y = out.value().data();
    const index_t n = rows * len;
    Exec& exec = tape.exec();
    if constexpr (!std::is_same_v<Space, host>) {
      exec.for_each_element(n, D, detail::PositionAdd<T, X>{Xs, P, Y, len, D}, kind::elementwise, "position_embedding",
                            std::size_t(n) * D * sizeof(T) * 3);
    } else {
      exec.launch("position_embedding", [&exec, Xs, P, Y, n, len](std::string_view nm) {
        exec.stats().count(kind::elementwise, nm, n * D, std::size_t(n) * D * sizeof(T) * 3);
        exec.parallel_for(n, std::max<index_t>(1, Exec::grain / D), [&](index_t b, index_t e) {
          for (index_t r = b; r < e; ++r) {
            const X* xr = Xs + r * D;
            const T* pr = P + (r % len) * D;
            X* yr = Y + r * D;
            for (index_t c = 0; c < D; ++c) yr[c] = convert<X>(convert<T>(xr[c]) + pr[c]);
          }
        });
      });
    }
    const bool dx = x.requires_grad(), dp = weight_.requires_grad();
    if (!(dx || dp) || !tape.recording()) return out;
    out.set_requires_grad(true);
    tape.record(out, {x.data(), weight_.data()}, [xd = x.data(), wd = weight_.data(), rows, len](Exec& ex, auto& od) {
      if (!od.grad_valid) return;
      const X* G = od.grad.data();
      const index_t n = rows * len;
      if (xd->requires_grad) {  // the sum's gradient passes to x as it is
        const bool add = xd->grad_valid;
        X* dX = xd->ensure_grad();
        if constexpr (!std::is_same_v<Space, host>) {
          ex.for_each_element(n, D, detail::GradientPass<X>{G, dX, D, add}, kind::copy,
                              "position_embedding_input_backward", std::size_t(n) * D * sizeof(T) * 2);
        } else {
          ex.launch("position_embedding_input_backward", [&ex, dX, G, n, add](std::string_view nm) {
            ex.stats().count(kind::copy, nm, n * D, std::size_t(n) * D * sizeof(T) * 2);
            ex.parallel_for(n * D, Exec::grain, [&](index_t b, index_t e) {
              for (index_t i = b; i < e; ++i)
                dX[i] = add ? convert<X>(convert<float>(dX[i]) + convert<float>(G[i])) : G[i];
            });
          });
        }
        xd->grad_valid = true;
      }
      if (wd->requires_grad) {  // position t's row: the batch's rows at t, summed in order
        const bool add = wd->grad_valid;
        T* dP = wd->ensure_grad();
        if constexpr (!std::is_same_v<Space, host>) {
          ex.for_each_element(MaxT, D, detail::PositionTableGradient<T, X>{G, dP, rows, len, D, add}, kind::reduce,
                              "position_embedding_backward", std::size_t(rows * len) * D * sizeof(T));
        } else {
          ex.launch("position_embedding_backward", [&ex, dP, G, rows, len, add](std::string_view nm) {
            ex.stats().count(kind::reduce, nm, rows * len * D, std::size_t(rows * len) * D * sizeof(T));
            const index_t grain = std::max<index_t>(1, Exec::grain / std::max<index_t>(rows * D, 1));
            ex.parallel_for(MaxT, grain, [&](index_t b, index_t e) {
              for (index_t t = b; t < e; ++t) {
                T* dst = dP + t * D;
                if (!add)
                  for (index_t c = 0; c < D; ++c) dst[c] = T(0);
                if (t >= len) continue;
                for (index_t r = 0; r < rows; ++r) {
                  const X* g = G + (r * len + t) * D;
                  for (index_t c = 0; c < D; ++c) dst[c] += convert<T>(g[c]);
                }
              }
            });
          });
        }
        wd->grad_valid = true;
      }
    });
    return out;
  }

  // ONE pass forward; backward the table's column sums and x's gradient (when x needs one).
  static constexpr Launches launches(const LaunchContext& c) {
    return {1, index_t(c.weight_grad) + index_t(c.input_grad)};
  }
  static constexpr bool mixed_precision = true;  // bf16 / f16 activations, a float table
  static constexpr index_t parameter_tensors = 1;
  static std::string describe() {
    return "PositionEmbedding<" + std::to_string(MaxT) + ", " + std::to_string(D) + ">";
  }

  template <class F>
  void for_each_parameter(F&& f) const {
    f(weight_);
  }
  const ag::Var<T, Space, MaxT, D>& weight() const { return weight_; }

 private:
  static Generator& lvalue(Generator&& g) { return g; }
  ag::Var<T, Space, MaxT, D> weight_;
};

// x [B, L, D] -> logits [B, L, Vocab] = x · Wᵀ with W an Embedding<Vocab, D>'s table (tie() binds it).
// Lists no parameter: the table is the embedding's. Its state-dict entry ("lm_head.weight") is the
// same tensor, as in PyTorch's state_dict of a tied model.
template <index_t Vocab, index_t D, class T = float, class Space = host>
class TiedHead {
 public:
  static constexpr index_t in_features = D;
  static constexpr index_t out_features = Vocab;
  using value_type = T;
  using space = Space;
  template <class S>
  using on = TiedHead<Vocab, D, T, S>;

  TiedHead() = default;
  explicit TiedHead(Generator&) {}

  void tie(const ag::Var<T, Space, Vocab, D>& table) {
    weight_ = table;
    tied_ = true;
  }
  bool tied() const { return tied_; }

  // x is T, or bf16 / f16 under mixed precision: the GEMM then reads the table's copy in x's type
  // (refresh_low_copy, as Linear's), the logits are x's type, the table's gradient T.
  template <class Exec, class X, index_t B, index_t L, index_t W>
    requires(std::is_same_v<X, T> || std::is_same_v<X, bf16> || std::is_same_v<X, f16>)
  auto forward(ag::Tape<Exec>& tape, const ag::Var<X, Space, B, L, W>& x) const {
    KILN_CHECK(tied(), ValueError, describe(), ": no table to read; tie() it to the token embedding's weight");
    if constexpr (std::is_same_v<X, T>) {
      return ag::linear(tape, x, weight_);
    } else {
      KILN_CHECK(low_slot<X>() != nullptr, ValueError, describe(), ": a ", kiln::name(dtype_of<X>),
                 " input needs the table's ", kiln::name(dtype_of<X>), " copy; call refresh_low_copy (a train::Step does)");
      return ag::linear(tape, x, weight_, low_slot<X>()->data());
    }
  }

  // Mixed precision: the table's values in L, rounded by ONE kernel (after every optimizer step).
  template <class L, class Exec>
  void refresh_low_copy(Exec& exec) const {
    static_assert(std::is_same_v<L, bf16> || std::is_same_v<L, f16>, "kiln::nn::TiedHead: low copies are bf16 or f16");
    KILN_CHECK(tied(), ValueError, describe(), ": no table to copy; tie() it to the token embedding's weight");
    auto& slot = low_slot<L>();
    if (!slot) slot = std::make_shared<Tensor<L, Space, Vocab, D>>(Shape{Vocab, D});
    exec.for_each_element(1, Vocab * D, detail::RoundCopy<T, L>{weight_.value().data(), slot->data()}, kind::copy,
                          "round_weight", std::size_t(Vocab * D) * (sizeof(T) + sizeof(L)));
  }
  static constexpr bool mixed_precision = true;
  static constexpr index_t low_copies = 1;

  // ONE GEMM forward; backward the table's gradient GEMM (when it trains) and x's (when x needs one).
  static constexpr Launches launches(const LaunchContext& c) { return {1, 1 + index_t(c.input_grad)}; }
  Launches launches_now(const LaunchContext& c) const {
    return {1, index_t(weight_.requires_grad()) + index_t(c.input_grad)};
  }
  static std::string describe() {
    return "TiedHead<" + std::to_string(Vocab) + ", " + std::to_string(D) + "> (the token embedding's table)";
  }
  const ag::Var<T, Space, Vocab, D>& weight() const { return weight_; }

 private:
  template <class L>
  auto& low_slot() const {
    if constexpr (std::is_same_v<L, bf16>) return low_bf16_;
    else return low_f16_;
  }

  ag::Var<T, Space, Vocab, D> weight_;
  bool tied_ = false;
  // The table in bf16 / f16 for mixed precision, created by the first refresh_low_copy.
  mutable std::shared_ptr<Tensor<bf16, Space, Vocab, D>> low_bf16_;
  mutable std::shared_ptr<Tensor<f16, Space, Vocab, D>> low_f16_;
};

}  // namespace kiln::nn
