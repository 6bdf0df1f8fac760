// kiln/nn/transformer.hpp — GPT-2's pre-norm transformer block.
//
//   x = x + attn(ln_1(x));  x = x + mlp(ln_2(x))       mlp = c_proj(gelu_tanh(c_fc(x))), 4D wide
//
// Its parts are nanoGPT's Block, named as its state_dict names them (ln_1, attn.c_attn, attn.c_proj,
// ln_2, mlp.c_fc, mlp.c_proj), with nanoGPT's dropout P where it has it (none at P = 0); c_fc's GELU runs in its GEMM's epilogue (Sequential fuses a Linear
// and the activation after it), and each residual add is ONE kernel each way. The block shows its
// parts as a Sequential does (size(), layer<I>()), so the layer walkers — state-dict names, train /
// eval, summaries — visit them; its forward is its own, the two residual adds.
#pragma once

#include <string>
#include <type_traits>

#include "kiln/autograd/map.hpp"
#include "kiln/expr/elementwise.hpp"
#include "kiln/nn/activation.hpp"
#include "kiln/nn/attention.hpp"
#include "kiln/nn/dropout.hpp"
#include "kiln/nn/layernorm.hpp"
#include "kiln/nn/linear.hpp"
#include "kiln/nn/named.hpp"
#include "kiln/nn/sequential.hpp"

namespace kiln::nn {

// GPT-2's MLP: D -> 4D (GELU, tanh form, in the GEMM's epilogue) -> D, then dropout P (none at 0).
template <index_t D, double P = 0.0, class T = float, class Space = host>
using TransformerMlp = std::conditional_t<
    P == 0.0,
    Sequential<Named<"c_fc", Linear<D, 4 * D, true, T, Space>>, GELUTanh, Named<"c_proj", Linear<4 * D, D, true, T, Space>>>,
    Sequential<Named<"c_fc", Linear<D, 4 * D, true, T, Space>>, GELUTanh, Named<"c_proj", Linear<4 * D, D, true, T, Space>>,
               Dropout<P>>>;

// P: nanoGPT's dropout — on the attention probabilities and at the end of both residual branches.
template <index_t D, index_t Heads, double P = 0.0, class T = float, class Space = host>
class TransformerBlock {
  static_assert(D > 0 && Heads > 0 && D % Heads == 0,
                "kiln::nn::TransformerBlock<D, Heads>: D must be a positive multiple of Heads");
  using Parts = Sequential<Named<"ln_1", LayerNorm<D, T, Space>>, Named<"attn", CausalSelfAttention<D, Heads, P, T, Space>>,
                           Named<"ln_2", LayerNorm<D, T, Space>>, Named<"mlp", TransformerMlp<D, P, T, Space>>>;

 public:
  static constexpr index_t width = D;
  static constexpr index_t heads = Heads;
  using value_type = T;
  using space = Space;
  template <class S>
  using on = TransformerBlock<D, Heads, P, T, S>;
  // sequence<MaxT, D> in and out (a wrong width is layer_accepts' static_assert at ln_1).
  template <class In>
  using output_sample = output_sample_t<Parts, In>;

  explicit TransformerBlock(Generator& gen) : parts_(gen) {}
  explicit TransformerBlock(std::uint64_t seed = 0) : parts_(seed) {}

  template <class Exec, class X>
  auto forward(ag::Tape<Exec>& tape, const X& x) {
    const auto a = parts_.template layer<1>().forward(tape, parts_.template layer<0>().forward(tape, x));
    const X h = add(tape, x, a);
    const auto m = parts_.template layer<3>().forward(tape, parts_.template layer<2>().forward(tape, h));
    return add(tape, h, m);
  }

  // The parts, in the order they run (for the layer walkers).
  static constexpr std::size_t size() { return Parts::size(); }
  template <std::size_t I>
  auto& layer() {
    return parts_.template layer<I>();
  }
  template <std::size_t I>
  const auto& layer() const {
    return parts_.template layer<I>();
  }

  template <class F>
  void for_each_parameter(F&& f) const {
    parts_.for_each_parameter(f);
  }
  void train(bool on = true) { parts_.train(on); }
  void eval() { train(false); }
  bool training() const { return parts_.training(); }

  // The parts' launches, as a Sequential of them counts them, and the two residual adds, ONE
  // kernel each way.
  static constexpr Launches launches(const LaunchContext& c) {
    Launches l = Parts::launches(c);
    l += Launches{2, c.input_grad ? 2 : 0};
    return l;
  }
  static constexpr index_t parameter_tensors = Parts::parameter_tensors;
  static constexpr bool counts_launches = Parts::counts_launches;
  // Mixed precision: as its parts (bf16 / f16 activations through the block, the residual adds
  // in them too), their Linears' low copies refreshed through it.
  static constexpr bool mixed_precision = Parts::mixed_precision;
  static constexpr index_t low_copies = Parts::low_copies;
  template <class L, class Exec>
  void refresh_low_copy(Exec& exec) const {
    parts_.template refresh_low_copies<L>(exec);
  }
  std::string describe() const { return "TransformerBlock<" + std::to_string(D) + ", " + std::to_string(Heads) + " heads>"; }

 private:
  // A residual add, ONE kernel; bf16 / f16 computed in float and rounded as stored (as nn::Residual).
  template <class Exec, class A, class B>
  static A add(ag::Tape<Exec>& tape, const A& a, const B& b) {
    using V = typename A::value_type;
    if constexpr (std::is_same_v<V, compute_t<V>>) return A(ag::map(tape, a + b));
    else return A(ag::map(tape, cast<V>(a + b)));
  }

  Parts parts_;
};

}  // namespace kiln::nn
