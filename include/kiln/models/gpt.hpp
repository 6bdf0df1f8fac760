// kiln/models/gpt.hpp — GPT-2 as a type: nanoGPT's model, its sizes as template arguments.
//
//   using Net = kiln::models::GPT<kiln::models::GptConfig{.vocab = 65, .block_size = 64, .layers = 4,
//                                                          .heads = 4, .width = 128}>;
//   Net model(/*seed=*/0);          // 0.80M parameters with the head tied, as nanoGPT counts
//
// transformer.wte (token Embedding) -> transformer.wpe (learned positions) -> transformer.h.0 ..
// h.{layers-1} (pre-norm TransformerBlock: attention with one QKV GEMM, a 4x GELU MLP) ->
// transformer.ln_f -> lm_head, a GEMM with wte's table (tied: one parameter, two uses, its gradient
// the sum). The state-dict names are nanoGPT's / Hugging Face's ("transformer.h.0.attn.c_attn.weight",
// "lm_head.weight" the same tensor as "transformer.wte.weight"); the layouts are nanoGPT's
// (torch.nn.Linear's [out, in]; Hugging Face's GPT-2 checkpoints store Conv1D's [in, out]).
//
// The model's input is [B, T] token ids (float values, T = block_size for train::Step; any
// T <= block_size for a forward of its own); its output the logits [B, T, vocab], which
// train::CrossEntropy takes with B * T labels. Initialisation is GPT-2's (nanoGPT's _init_weights):
// N(0, 0.02) for every weight and embedding, N(0, 0.02 / sqrt(2 * layers)) for the projections that
// end a residual branch (c_proj), zero biases, LayerNorms 1 and 0.
// param_table() puts biases, LayerNorms and embeddings in the group without weight decay
// (minGPT's rule), so optim::AdamW(model, {.weight_decay = 0.1}) decays the matrices only.
#pragma once

#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <type_traits>

#include "kiln/io/state_dict.hpp"
#include "kiln/nn/dropout.hpp"
#include "kiln/nn/embedding.hpp"
#include "kiln/nn/init.hpp"
#include "kiln/nn/layernorm.hpp"
#include "kiln/nn/named.hpp"
#include "kiln/nn/repeat.hpp"
#include "kiln/nn/sequential.hpp"
#include "kiln/nn/transformer.hpp"

namespace kiln::models {

struct GptConfig {
  index_t vocab = 65;
  index_t block_size = 64;  // the longest sequence (the position table's size)
  index_t layers = 4;
  index_t heads = 4;
  index_t width = 128;  // n_embd
  // nanoGPT's dropout: after the embeddings, on the attention probabilities, at the end of both
  // residual branches (train mode only). 0: no dropout layers at all (and reduce_overhead captures).
  double dropout = 0.0;
};

template <GptConfig C, class T = float, class Space = host>
using GptBlocks = nn::Named<"h", nn::Repeat<C.layers, nn::TransformerBlock<C.width, C.heads, C.dropout, T, Space>>>;
template <GptConfig C, class T = float, class Space = host>
using GptTrunk = std::conditional_t<
    C.dropout == 0.0,
    nn::Sequential<nn::Named<"wte", nn::Embedding<C.vocab, C.width, T, Space>>,
                   nn::Named<"wpe", nn::PositionEmbedding<C.block_size, C.width, T, Space>>, GptBlocks<C, T, Space>,
                   nn::Named<"ln_f", nn::LayerNorm<C.width, T, Space>>>,
    nn::Sequential<nn::Named<"wte", nn::Embedding<C.vocab, C.width, T, Space>>,
                   nn::Named<"wpe", nn::PositionEmbedding<C.block_size, C.width, T, Space>>,
                   nn::Named<"drop", nn::Dropout<C.dropout>>, GptBlocks<C, T, Space>,
                   nn::Named<"ln_f", nn::LayerNorm<C.width, T, Space>>>>;

template <GptConfig C, class T = float, class Space = host>
class GPT : public nn::Sequential<nn::Named<"transformer", GptTrunk<C, T, Space>>,
                                  nn::Named<"lm_head", nn::TiedHead<C.vocab, C.width, T, Space>>> {
  using Base = nn::Sequential<nn::Named<"transformer", GptTrunk<C, T, Space>>,
                              nn::Named<"lm_head", nn::TiedHead<C.vocab, C.width, T, Space>>>;
  static_assert(C.vocab > 0 && C.block_size > 0 && C.layers > 0 && C.heads > 0 && C.width % C.heads == 0,
                "kiln::models::GPT: vocab, block_size, layers and heads must be positive and width a multiple of heads");
  static_assert(C.dropout >= 0.0 && C.dropout < 1.0, "kiln::models::GPT: dropout must be in [0, 1)");

 public:
  static constexpr GptConfig config = C;
  // train::Step's batch width: block_size token ids per row.
  static constexpr index_t in_features = C.block_size;
  static constexpr index_t out_features = C.vocab;
  // A batch row's labels: the next token at each of its block_size positions (train::Step).
  static constexpr index_t labels_per_row = C.block_size;
  template <class S>
  using on = GPT<C, T, S>;

  explicit GPT(Generator& gen) : Base(gen) { init(gen); }
  explicit GPT(std::uint64_t seed = 0) : GPT(lvalue(Generator(seed))) {}
  GPT(const GPT& other) : Base(other) { tie(); }
  GPT& operator=(const GPT& other) {
    Base::operator=(other);
    tie();
    return *this;
  }

  auto& transformer() { return this->template layer<0>(); }
  const auto& transformer() const { return this->template layer<0>(); }
  const auto& token_embedding() const { return transformer().template layer<0>(); }
  // The trunk's blocks (transformer.h) and final LayerNorm (transformer.ln_f): after "drop" when
  // the model has dropout.
  static constexpr std::size_t blocks_index = C.dropout == 0.0 ? 2 : 3;
  auto& blocks() { return transformer().template layer<blocks_index>(); }
  auto& final_norm() { return transformer().template layer<blocks_index + 1>(); }

  // The optimizer's table: biases, LayerNorm parameters and both embeddings without weight decay.
  optim::ParamTable param_table() const {
    std::set<const ag::VarNode*> no_decay;
    io::for_each_state(const_cast<GPT&>(*this), [&](const std::string& name, auto& item, io::state_kind) {
      if constexpr (requires { item.data(); item.shape(); }) {
        const bool embedding = name.starts_with("transformer.wte.") || name.starts_with("transformer.wpe.");
        if (item.shape().rank < 2 || embedding || name.find(".ln_") != std::string::npos)
          no_decay.insert(item.data().get());
      }
    });
    optim::ParamTable t;
    this->for_each_parameter([&](const auto& v) {
      if (!v.requires_grad()) return;
      const auto p = nn::parameter_of(v);
      const index_t k = t.add(p.value, p.grad, p.size, &p.node->grad_valid);
      if (no_decay.count(v.data().get())) t.exclude_from_decay(k);
    });
    return t;
  }

  std::string describe() const {
    return "GPT (vocab " + std::to_string(C.vocab) + ", block " + std::to_string(C.block_size) + ", " +
           std::to_string(C.layers) + " layers, " + std::to_string(C.heads) + " heads, width " +
           std::to_string(C.width) + (C.dropout > 0.0 ? ", dropout " + std::to_string(C.dropout).substr(0, 4) : std::string()) +
           "; " + std::to_string(this->parameter_count()) + " parameters, head tied)";
  }

 private:
  static Generator& lvalue(Generator&& g) { return g; }

  void tie() { this->template layer<1>().tie(token_embedding().weight()); }

  // draw(v) fills a host variable with item's new values: item itself on the host; on a device a
  // host copy, drawn in the same order and then copied there (the same numbers as the host model).
  template <class Item, class Draw>
  static void redraw(Item& item, Draw&& draw) {
    if constexpr (std::is_same_v<Space, host>) {
      draw(item);
    } else {
      ag::Var<T, host, dyn> values(Tensor<T, host, dyn>(Shape{item.value().size()}), true);
      draw(values);
      nn::space_ops<Space>::copy_from_host(item.value().data(), values.value().data(), values.value().size());
    }
  }

  // GPT-2's initialisation, drawn in state-dict order (lm_head.weight is wte's table: skipped).
  void init(Generator& gen) {
    tie();
    const double proj_std = 0.02 / std::sqrt(2.0 * double(C.layers));
    io::for_each_state(*this, [&](const std::string& name, auto& item, io::state_kind kind) {
      if constexpr (requires { item.data(); item.shape(); }) {
        if (kind != io::state_kind::parameter || name == "lm_head.weight") return;
        if (name.find(".ln_") != std::string::npos) return;  // LayerNorms: 1 and 0 already
        if (item.shape().rank >= 2)
          redraw(item, [&](auto& v) { nn::init::normal(v, gen, 0.0, name.ends_with("c_proj.weight") ? proj_std : 0.02); });
        else
          redraw(item, [](auto& v) { nn::init::constant(v, 0.0); });
      }
    });
  }
};

}  // namespace kiln::models
