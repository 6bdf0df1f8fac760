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
// CPU only so far (the kernels run on the host executor's threads).
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
template <class Space>
constexpr void host_only_layer() {
  static_assert(std::is_same_v<Space, host>,
                "kiln::nn: Embedding, PositionEmbedding and TiedHead run on the CPU only so far");
}

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
  explicit Embedding(Generator& gen) : weight_(Tensor<T, Space, Vocab, D>(Shape{Vocab, D}), true) {
    detail::host_only_layer<Space>();
    init::normal(weight_, gen, 0.0, 1.0);
  }
  explicit Embedding(std::uint64_t seed = 0) : Embedding(lvalue(Generator(seed))) {}

  // ids [B, L] (float values) -> [B, L, D].
  template <class Exec, index_t B, index_t L>
  auto forward(ag::Tape<Exec>& tape, const ag::Var<float, Space, B, L>& ids) const {
    using V = ag::Var<T, Space, B, L, D>;
    const index_t rows = ids.dim(0), len = ids.dim(1), n = rows * len;
    V out{typename V::tensor_type(Shape{rows, len, D})};
    auto index = std::make_shared<Tensor<std::int32_t, Space, dyn>>(Shape{n});
    const float* X = ids.value().data();
    std::int32_t* I = index->data();
    T* Y = out.value().data();
    const T* Wt = weight_.value().data();
    Exec& exec = tape.exec();
    exec.launch("embedding", [&exec, X, I, Y, Wt, n, len](std::string_view nm) {
      exec.stats().count(kind::copy, nm, n * D, std::size_t(n) * (D * sizeof(T) * 2 + sizeof(float)));
      for (index_t r = 0; r < n; ++r) {  // checked first, in order: the error names the first bad id
        const float v = X[r];
        KILN_CHECK(v >= 0.0f && v < float(Vocab) && v == std::floor(v), ValueError, "Embedding<", Vocab, ", ", D,
                   ">: token id ", v, " at batch row ", r / len, ", position ", r % len,
                   " is not an id of the vocabulary [0, ", Vocab, ")");
        I[r] = std::int32_t(v);
      }
      exec.parallel_for(n, std::max<index_t>(1, Exec::grain / D), [&](index_t b, index_t e) {
        for (index_t r = b; r < e; ++r) {
          const T* src = Wt + index_t(I[r]) * D;
          T* dst = Y + r * D;
          for (index_t c = 0; c < D; ++c) dst[c] = src[c];
        }
      });
    });
    if (!weight_.requires_grad() || !tape.recording()) return out;
    out.set_requires_grad(true);
    tape.record(out, {weight_.data()}, [wd = weight_.data(), index, n](Exec& ex, auto& od) {
      if (!od.grad_valid || !wd->requires_grad) return;
      const bool add = wd->grad_valid;
      T* dW = wd->ensure_grad();
      const T* G = od.grad.data();
      const std::int32_t* I = index->data();
      ex.launch("embedding_backward", [&ex, dW, G, I, n, add](std::string_view nm) {
        ex.stats().count(kind::other, nm, n * D, std::size_t(n) * D * sizeof(T) * 2);
        // Column slices: each thread owns some of the D columns of every row of dW.
        ex.parallel_for(D, std::max<index_t>(1, D * Exec::grain / std::max<index_t>(n * D, 1)), [&](index_t b, index_t e) {
          if (!add)
            for (index_t v = 0; v < Vocab; ++v)
              for (index_t c = b; c < e; ++c) dW[v * D + c] = T(0);
          for (index_t r = 0; r < n; ++r) {
            T* dst = dW + index_t(I[r]) * D;
            const T* g = G + r * D;
            for (index_t c = b; c < e; ++c) dst[c] += g[c];
          }
        });
      });
      wd->grad_valid = true;
    });
    return out;
  }

  // ONE gather forward, ONE scatter-add backward (none when frozen).
  static constexpr Launches launches(const LaunchContext& c) { return {1, c.weight_grad ? 1 : 0}; }
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

  explicit PositionEmbedding(Generator& gen) : weight_(Tensor<T, Space, MaxT, D>(Shape{MaxT, D}), true) {
    detail::host_only_layer<Space>();
    init::normal(weight_, gen, 0.0, 1.0);
  }
  explicit PositionEmbedding(std::uint64_t seed = 0) : PositionEmbedding(lvalue(Generator(seed))) {}

  // x [B, L, D] -> x + table[0:L]; throws ShapeError when L > MaxT.
  template <class Exec, index_t B, index_t L, index_t W>
  auto forward(ag::Tape<Exec>& tape, const ag::Var<T, Space, B, L, W>& x) const {
    using V = ag::Var<T, Space, B, L, W>;
    const index_t rows = x.dim(0), len = x.dim(1);
    KILN_CHECK(x.dim(2) == D, ShapeError, describe(), ": the input has shape ", x.shape().str(), "; its width must be ", D);
    KILN_CHECK(len <= MaxT, ShapeError, describe(), ": the sequence has T = ", len,
               " positions, more than the model's maximum of ", MaxT);
    V out{typename V::tensor_type(x.shape())};
    const T* X = x.value().data();
    const T* P = weight_.value().data();
    T* Y = out.value().data();
    const index_t n = rows * len;
    Exec& exec = tape.exec();
    exec.launch("position_embedding", [&exec, X, P, Y, n, len](std::string_view nm) {
      exec.stats().count(kind::elementwise, nm, n * D, std::size_t(n) * D * sizeof(T) * 3);
      exec.parallel_for(n, std::max<index_t>(1, Exec::grain / D), [&](index_t b, index_t e) {
        for (index_t r = b; r < e; ++r) {
          const T* xr = X + r * D;
          const T* pr = P + (r % len) * D;
          T* yr = Y + r * D;
          for (index_t c = 0; c < D; ++c) yr[c] = xr[c] + pr[c];
        }
      });
    });
    const bool dx = x.requires_grad(), dp = weight_.requires_grad();
    if (!(dx || dp) || !tape.recording()) return out;
    out.set_requires_grad(true);
    tape.record(out, {x.data(), weight_.data()}, [xd = x.data(), wd = weight_.data(), rows, len](Exec& ex, auto& od) {
      if (!od.grad_valid) return;
      const T* G = od.grad.data();
      const index_t n = rows * len;
      if (xd->requires_grad) {  // the sum's gradient passes to x as it is
        const bool add = xd->grad_valid;
        T* dX = xd->ensure_grad();
        ex.launch("position_embedding_input_backward", [&ex, dX, G, n, add](std::string_view nm) {
          ex.stats().count(kind::copy, nm, n * D, std::size_t(n) * D * sizeof(T) * 2);
          ex.parallel_for(n * D, Exec::grain, [&](index_t b, index_t e) {
            for (index_t i = b; i < e; ++i) dX[i] = add ? dX[i] + G[i] : G[i];
          });
        });
        xd->grad_valid = true;
      }
      if (wd->requires_grad) {  // position t's row: the batch's rows at t, summed in order
        const bool add = wd->grad_valid;
        T* dP = wd->ensure_grad();
        ex.launch("position_embedding_backward", [&ex, dP, G, rows, len, add](std::string_view nm) {
          ex.stats().count(kind::reduce, nm, rows * len * D, std::size_t(rows * len) * D * sizeof(T));
          ex.parallel_for(MaxT, std::max<index_t>(1, Exec::grain / std::max<index_t>(rows * D, 1)), [&](index_t b, index_t e) {
            for (index_t t = b; t < e; ++t) {
              T* dst = dP + t * D;
              if (!add)
                for (index_t c = 0; c < D; ++c) dst[c] = T(0);
              if (t >= len) continue;
              for (index_t r = 0; r < rows; ++r) {
                const T* g = G + (r * len + t) * D;
                for (index_t c = 0; c < D; ++c) dst[c] += g[c];
              }
            }
          });
        });
        wd->grad_valid = true;
      }
    });
    return out;
  }

  // ONE pass forward; backward the table's column sums and x's gradient (when x needs one).
  static constexpr Launches launches(const LaunchContext& c) {
    return {1, index_t(c.weight_grad) + index_t(c.input_grad)};
  }
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

  template <class Exec, index_t B, index_t L, index_t W>
  auto forward(ag::Tape<Exec>& tape, const ag::Var<T, Space, B, L, W>& x) const {
    KILN_CHECK(tied(), ValueError, describe(), ": no table to read; tie() it to the token embedding's weight");
    return ag::linear(tape, x, weight_);
  }

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
  ag::Var<T, Space, Vocab, D> weight_;
  bool tied_ = false;
};

}  // namespace kiln::nn
