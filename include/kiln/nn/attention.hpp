// kiln/nn/attention.hpp — causal self-attention as an autograd op and as layers.
//
//   auto y = nn::causal_attention(tape, qkv, heads);   // qkv [B, T, 3D] -> y [B, T, D]
//   using Attn = nn::CausalSelfAttention<128, 4>;      // c_attn (one QKV GEMM) -> attention -> c_proj
//
// The op is fused attention (kiln/backend/cpu/attention.hpp): ONE kernel forward, which saves only
// each row's log-sum-exp, and ONE kernel backward, which recomputes the probabilities from it —
// memory linear in T, never a T×T matrix. The scale is 1 / sqrt(D / heads), PyTorch's
// scaled_dot_product_attention default. CausalSelfAttention is nanoGPT's module as a Sequential:
// Named<"c_attn", Linear<D, 3D>> (bias on), the attention, Named<"c_proj", Linear<D, D>>, so its
// state-dict names are nanoGPT's (attn.c_attn.weight, attn.c_proj.bias).
// On kiln::cuda (include kiln/nn/cuda.cuh) the same op runs kiln's own kernels
// (kiln/backend/cuda/attention.cuh: ONE launch each way, the CPU's mask and log-sum-exp). bf16 /
// f16 activations (mixed precision) compute in float on both: on the CPU the float kernels run on
// widened copies, on CUDA the kernels widen as they load.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "kiln/backend/cpu/attention.hpp"
#include "kiln/core/random.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/nn/dropout.hpp"
#include "kiln/nn/half_io.hpp"
#include "kiln/nn/linear.hpp"
#include "kiln/nn/module.hpp"
#include "kiln/nn/named.hpp"
#include "kiln/nn/sample_shape.hpp"
#include "kiln/nn/sequential.hpp"

namespace kiln::nn {

namespace detail {
template <index_t W3, index_t Heads>
constexpr index_t attention_width() {
  return W3 == dyn ? dyn : W3 / 3;
}
// CausalAttention<Heads>'s output sample for input In (instantiated per input, so the compiler
// names the width and the heads).
template <class In, index_t Heads>
struct attention_output {
  using type = any_sample;
};
template <index_t MaxT, index_t W3, index_t Heads>
struct attention_output<sequence<MaxT, W3>, Heads> {
  static_assert(W3 == dyn || W3 % (3 * Heads) == 0,
                "kiln::nn::CausalAttention<Heads>: its input packs q, k and v ([B, T, 3 * D]), so its width must be "
                "a multiple of 3 * Heads (attention_output<sequence<max_length, width>, heads> names both)");
  using type = sequence<MaxT, attention_width<W3, Heads>()>;
};
}  // namespace detail

// How a device space runs attention: forward(exec, dims, qkv, out, lse) and backward(exec, dims,
// qkv, out, dout, lse, dqkv, accumulate), on the executor's stream. kiln/nn/cuda.cuh gives
// kiln::cuda's (kiln/backend/cuda/attention.cuh); the CPU runs kiln/backend/cpu/attention.hpp directly.
template <class Space>
struct attention_backend {
  static_assert(dependent_false<Space>,
                "kiln::nn::causal_attention: no attention kernel for this memory space; for kiln::cuda include "
                "kiln/nn/cuda.cuh");
};

// Dropout on the attention probabilities: p (0: none), and the Philox stream the mask comes from
// (a call draws B * heads * T * T counters from `offset` on; CausalAttention advances it).
struct AttentionDropout {
  double p = 0.0;
  std::uint64_t seed = 0, offset = 0;
};

// y [B, T, D] from qkv [B, T, 3D] (q = columns [0, D), k = [D, 2D), v = [2D, 3D); head h is columns
// [h * D / heads, (h + 1) * D / heads) of each): y_i = softmax(q_i kᵀ / sqrt(D / heads), keys <= i) v,
// the probabilities dropped with drop.p and the kept ones scaled by 1 / (1 - p) (inverted dropout).
template <class Exec, class T, class S, index_t B, index_t L, index_t W3>
auto causal_attention(ag::Tape<Exec>& tape, const ag::Var<T, S, B, L, W3>& qkv, index_t heads,
                      AttentionDropout drop = {}) {
  static_assert(std::is_same_v<S, typename Exec::space>,
                "kiln::nn::causal_attention: the activations live in another memory space than the executor's");
  constexpr bool half = kiln::detail::is_half_v<T>;
  static_assert(std::is_floating_point_v<T> || half,
                "kiln::nn::causal_attention: float, double, bf16 or f16 activations");
  using C = compute_t<T>;  // the kernels' type: float for bf16 / fp16 (their values widened, the output rounded)
  constexpr index_t D = W3 == dyn ? dyn : W3 / 3;
  using V = ag::Var<T, S, B, L, D>;
  const Shape xs = qkv.shape();
  const index_t width3 = xs[2];
  KILN_CHECK(heads > 0 && width3 % (3 * heads) == 0, ShapeError, "causal_attention: qkv has shape ", xs.str(),
             "; its last size must be 3 * heads * head_dim with ", heads, " heads");
  cpu::AttentionDims dims;
  dims.batch = xs[0];
  dims.length = xs[1];
  dims.heads = heads;
  dims.head_dim = width3 / (3 * heads);
  dims.scale = 1.0 / std::sqrt(double(dims.head_dim));
  KILN_CHECK(drop.p >= 0.0 && drop.p < 1.0, ValueError, "causal_attention: the dropout probability must be in [0, 1), got ",
             drop.p);
  dims.dropout = float(drop.p);
  dims.seed = drop.seed;
  dims.offset = drop.offset;
  V out{typename V::tensor_type(Shape{xs[0], xs[1], width3 / 3})};
  auto lse = std::make_shared<Tensor<C, S, dyn>>(Shape{dims.pairs() * dims.length});
  Exec& exec = tape.exec();
  // One work item per (sample, head); the flops of a pair, for the split across threads.
  const index_t pair_work = dims.length * dims.length * dims.head_dim;
  const index_t grain = [pair_work] {  // pairs per CPU task (a device launches them all at once)
    if constexpr (std::is_same_v<S, host>) return std::max<index_t>(1, Exec::grain / std::max<index_t>(pair_work, 1));
    else return index_t(1);
  }();
  const std::size_t bytes = std::size_t(xs.size() + out.value().size()) * sizeof(T);
  {
    const T* X = qkv.value().data();
    T* Y = out.value().data();
    C* LSE = lse->data();
    if constexpr (half && std::is_same_v<S, host>) {
      exec.launch("causal_attention", [&exec, X, Y, LSE, dims, grain, pair_work, bytes](std::string_view nm) {
        exec.stats().count(kind::other, nm, dims.pairs() * pair_work, bytes);
        const index_t rows = dims.batch * dims.length, w = dims.width();
        const auto xf = detail::widened(X, rows * 3 * w, exec.threads());
        std::vector<float> yf(static_cast<std::size_t>(rows * w));
        exec.parallel_for(dims.pairs(), grain, [&](index_t b, index_t e) {
          cpu::causal_attention_forward(xf.data(), yf.data(), LSE, dims, b, e);
        });
        detail::store_rounded(Y, yf.data(), rows * w, false, exec.threads());
      });
    } else if constexpr (std::is_same_v<S, host>) {
      exec.launch("causal_attention", [&exec, X, Y, LSE, dims, grain, pair_work, bytes](std::string_view nm) {
        exec.stats().count(kind::other, nm, dims.pairs() * pair_work, bytes);
        exec.parallel_for(dims.pairs(), grain, [&](index_t b, index_t e) {
          cpu::causal_attention_forward(X, Y, LSE, dims, b, e);
        });
      });
    } else {
      exec.stats().count(kind::other, "causal_attention", dims.pairs() * pair_work, bytes);
      attention_backend<S>::forward(exec, dims, X, Y, LSE);
    }
  }
  if (!qkv.requires_grad() || !tape.recording()) return out;
  out.set_requires_grad(true);
  tape.record(out, {qkv.data()}, [xd = qkv.data(), lse, dims, grain, pair_work, bytes](Exec& ex, auto& od) {
    if (!od.grad_valid || !xd->requires_grad) return;
    const bool add = xd->grad_valid;
    T* dX = xd->ensure_grad();
    const T* X = xd->value.data();
    const T* Y = od.value.data();
    const T* G = od.grad.data();
    const C* LSE = lse->data();
    if constexpr (half && std::is_same_v<S, host>) {
      ex.launch("causal_attention_backward", [&ex, X, Y, G, LSE, dX, add, dims, grain, pair_work,
                                              bytes](std::string_view nm) {
        ex.stats().count(kind::other, nm, 2 * dims.pairs() * pair_work, 2 * bytes);
        const index_t rows = dims.batch * dims.length, w = dims.width();
        const int threads = ex.threads();
        const auto xf = detail::widened(X, rows * 3 * w, threads), yf = detail::widened(Y, rows * w, threads),
                   gf = detail::widened(G, rows * w, threads);
        std::vector<float> dxf(static_cast<std::size_t>(rows * 3 * w));
        ex.parallel_for(dims.pairs(), grain, [&](index_t b, index_t e) {
          cpu::causal_attention_backward(xf.data(), yf.data(), gf.data(), LSE, dxf.data(), false, dims, b, e);
        });
        detail::store_rounded(dX, dxf.data(), rows * 3 * w, add, ex.threads());
      });
    } else if constexpr (std::is_same_v<S, host>) {
      ex.launch("causal_attention_backward", [&ex, X, Y, G, LSE, dX, add, dims, grain, pair_work,
                                              bytes](std::string_view nm) {
        ex.stats().count(kind::other, nm, 2 * dims.pairs() * pair_work, 2 * bytes);
        ex.parallel_for(dims.pairs(), grain, [&](index_t b, index_t e) {
          cpu::causal_attention_backward(X, Y, G, LSE, dX, add, dims, b, e);
        });
      });
    } else {
      ex.stats().count(kind::other, "causal_attention_backward", 2 * dims.pairs() * pair_work, 2 * bytes);
      attention_backend<S>::backward(ex, dims, X, Y, G, LSE, dX, add);
    }
    xd->grad_valid = true;
  });
  return out;
}

// The attention of a transformer block as a layer without parameters: qkv [B, T, 3D] -> [B, T, D],
// with dropout P on the probabilities in train mode (nanoGPT's attn_dropout; a fresh mask every
// forward, as nn::Dropout: the offset advances by the counters drawn, and the step is then not
// captured by reduce_overhead, whose replays could not advance it).
template <index_t Heads, double P = 0.0>
class CausalAttention {
  static_assert(Heads > 0, "kiln::nn::CausalAttention<Heads>: Heads must be positive");
  static_assert(P >= 0.0 && P < 1.0, "kiln::nn::CausalAttention<Heads, P>: the dropout probability P must be in [0, 1)");

 public:
  static constexpr index_t heads = Heads;
  static constexpr double dropout = P;

  CausalAttention() = default;
  // With dropout, Sequential's constructor: the mask's seed is the generator's next 64 bits (none
  // is drawn without dropout, so a model's other draws do not move).
  explicit CausalAttention(Generator& gen)
    requires(P > 0.0)
      : seed_(gen.next_u64()) {}

  template <class In>
  using output_sample = typename detail::attention_output<In, Heads>::type;

  template <class Exec, class T, class S, index_t B, index_t L, index_t W3>
  auto forward(ag::Tape<Exec>& tape, const ag::Var<T, S, B, L, W3>& qkv) {
    static_assert(W3 == dyn || W3 % (3 * Heads) == 0,
                  "kiln::nn::CausalAttention<Heads>: its input's width must be a multiple of 3 * Heads");
    if constexpr (P > 0.0) {
      if (training_) {
        tape.exec().stats().host_state("attention dropout's random offset");
        auto y = causal_attention(tape, qkv, Heads, {P, seed_, offset_});
        offset_ += std::uint64_t(qkv.dim(0) * Heads * qkv.dim(1) * qkv.dim(1));
        return y;
      }
    }
    return causal_attention(tape, qkv, Heads);
  }
  // ONE fused kernel each way (the dropout mask is drawn inside them).
  static constexpr Launches launches(const LaunchContext& c) { return {1, c.input_grad ? 1 : 0}; }
  // bf16 / f16 activations (the kernels compute in float; causal_attention).
  static constexpr bool mixed_precision = true;
  static std::string describe() {
    return "CausalAttention<" + std::to_string(Heads) + " heads" + (P > 0.0 ? ", dropout>" : ">");
  }

  void train(bool on = true) { training_ = on; }
  void eval() { training_ = false; }
  bool training() const { return training_; }
  std::uint64_t seed() const { return seed_; }
  std::uint64_t offset() const { return offset_; }
  void set_rng(std::uint64_t seed, std::uint64_t offset) {
    seed_ = seed;
    offset_ = offset;
  }

 private:
  std::uint64_t seed_ = 0, offset_ = 0;
  bool training_ = true;
};

// nanoGPT's CausalSelfAttention: the QKV projection, fused attention, the output projection, and
// with dropout P, attention dropout and the residual branch's (nanoGPT's resid_dropout).
template <index_t D, index_t Heads, double P = 0.0, class T = float, class Space = host>
using CausalSelfAttention = std::conditional_t<
    P == 0.0,
    Sequential<Named<"c_attn", Linear<D, 3 * D, true, T, Space>>, CausalAttention<Heads>,
               Named<"c_proj", Linear<D, D, true, T, Space>>>,
    Sequential<Named<"c_attn", Linear<D, 3 * D, true, T, Space>>, CausalAttention<Heads, P>,
               Named<"c_proj", Linear<D, D, true, T, Space>>, Dropout<P>>>;

}  // namespace kiln::nn
