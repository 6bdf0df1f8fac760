// kiln/models/gpt_sample.hpp — text from a GPT: nanoGPT's generate(), with a key/value cache.
//
//   auto ids = kiln::models::generate(model, exec, tok.encode("\n"), 200, {.temperature = 0.8, .top_k = 200});
//
// generate() runs the prompt once through the blocks, keeping each layer's keys and values, and then
// one position per new token: the embedding of the token just drawn, LayerNorm, the QKV projection
// of that one row, attention of its query against the cached keys (O(T) work), the output projection,
// the MLP, and the tied head — so a token costs the same at position 500 as at 50, instead of
// re-running the whole prefix. generate_uncached() is nanoGPT's loop (the model's forward over the
// last block_size tokens for every new token), the reference the cached one is tested against.
// Sampling is nanoGPT's: logits / temperature, all but the top_k set to -inf, softmax, one draw from
// a kiln::Generator seeded by `seed` (the same seed, the same text). Batch 1, CPU, no gradients.
// Past block_size positions the position table ends and every position shifts: both forms then
// re-run the last block_size tokens for each new one (nanoGPT's crop), so their tokens stay the same.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "kiln/autograd/tape.hpp"
#include "kiln/core/random.hpp"
#include "kiln/models/gpt.hpp"

namespace kiln::models {

struct SampleOptions {
  double temperature = 1.0;
  index_t top_k = 0;  // 0: every token
  std::uint64_t seed = 0;
};

namespace detail {

// One token drawn from a row of logits (nanoGPT's sampling step).
inline std::int32_t draw_token(const float* logits, index_t vocab, const SampleOptions& o, Generator& gen) {
  std::vector<double> z(static_cast<std::size_t>(vocab));
  for (index_t v = 0; v < vocab; ++v) z[std::size_t(v)] = double(logits[v]) / o.temperature;
  if (o.top_k > 0 && o.top_k < vocab) {
    std::vector<double> sorted = z;
    std::nth_element(sorted.begin(), sorted.begin() + (o.top_k - 1), sorted.end(), std::greater<>());
    const double kth = sorted[std::size_t(o.top_k - 1)];
    for (double& v : z)
      if (v < kth) v = -std::numeric_limits<double>::infinity();
  }
  const double mx = *std::max_element(z.begin(), z.end());
  double sum = 0;
  for (double& v : z) sum += (v = std::exp(v - mx));
  double u = double(gen.uniform()) * sum;
  for (index_t v = 0; v < vocab; ++v) {
    u -= z[std::size_t(v)];
    if (u < 0) return std::int32_t(v);
  }
  for (index_t v = vocab; v-- > 0;)  // rounding left u at the end: the last token with mass
    if (z[std::size_t(v)] > 0) return std::int32_t(v);
  return 0;
}

inline void check_prompt(std::span<const std::int32_t> prompt, index_t vocab) {
  KILN_CHECK(!prompt.empty(), ValueError, "generate: the prompt is empty; give at least one token");
  for (std::size_t i = 0; i < prompt.size(); ++i)
    KILN_CHECK(prompt[i] >= 0 && index_t(prompt[i]) < vocab, ValueError, "generate: prompt token ", prompt[i],
               " at position ", i, " is outside the vocabulary [0, ", vocab, ")");
}

inline void check_options(const SampleOptions& o) {
  KILN_CHECK(o.temperature > 0 && std::isfinite(o.temperature), ValueError,
             "generate: the temperature must be positive and finite, got ", o.temperature);
  KILN_CHECK(o.top_k >= 0, ValueError, "generate: top_k must be >= 0, got ", o.top_k);
}

}  // namespace detail

namespace detail {
// The next token's logits from the model's forward over the last block_size tokens of `context`,
// through the model's one input type ([B, block_size]): the context left-aligned, padded with
// token 0 — causal attention keeps the padding after the last real position from changing it.
template <GptConfig C>
std::vector<float> context_logits(GPT<C>& model, ag::Tape<CpuExecutor>& tape, const std::vector<std::int32_t>& context) {
  constexpr index_t T = C.block_size;
  ag::Var<float, host, dyn, T> x(Tensor<float, host, dyn, T>(Shape{1, T}));
  const index_t len = std::min<index_t>(index_t(context.size()), T);
  const std::int32_t* start = context.data() + (index_t(context.size()) - len);
  for (index_t t = 0; t < T; ++t) x.value().data()[t] = t < len ? float(start[t]) : 0.0f;
  const auto logits = model.forward(tape, x);
  const float* row = logits.value().data() + (len - 1) * C.vocab;
  return std::vector<float>(row, row + C.vocab);
}
}  // namespace detail

// nanoGPT's generate: the model's forward over the last block_size tokens for each new token.
template <GptConfig C>
std::vector<std::int32_t> generate_uncached(GPT<C>& model, CpuExecutor& exec, std::span<const std::int32_t> prompt,
                                            index_t n, const SampleOptions& o = {}) {
  detail::check_prompt(prompt, C.vocab);
  detail::check_options(o);
  nn::EvalScope evaluating(model);
  ag::Tape<CpuExecutor> tape(exec);
  Generator gen(o.seed);
  std::vector<std::int32_t> context(prompt.begin(), prompt.end()), out;
  for (index_t i = 0; i < n; ++i) {
    const std::int32_t next = detail::draw_token(detail::context_logits(model, tape, context).data(), C.vocab, o, gen);
    context.push_back(next);
    out.push_back(next);
  }
  return out;
}

// The same tokens with a key/value cache: each new token one position of work.
template <GptConfig C>
std::vector<std::int32_t> generate(GPT<C>& model, CpuExecutor& exec, std::span<const std::int32_t> prompt, index_t n,
                                   const SampleOptions& o = {}) {
  detail::check_prompt(prompt, C.vocab);
  detail::check_options(o);
  nn::EvalScope evaluating(model);
  ag::Tape<CpuExecutor> tape(exec);
  Generator gen(o.seed);
  constexpr index_t D = C.width, H = C.heads, hd = D / H, L = C.layers, Tm = C.block_size;
  using Row = ag::Var<float, host, dyn, dyn, D>;
  // Per layer: keys and values of every position so far, [Tm][D] each (head h at columns h * hd).
  std::vector<float> keys(static_cast<std::size_t>(L * Tm * D)), values(static_cast<std::size_t>(L * Tm * D));
  auto& trunk = model.transformer();
  const float* wte = trunk.template layer<0>().weight().value().data();
  const float* wpe = trunk.template layer<1>().weight().value().data();
  auto& blocks = model.blocks();
  const double scale = 1.0 / std::sqrt(double(hd));
  std::vector<float> scores(static_cast<std::size_t>(Tm));
  std::vector<std::int32_t> out;

  // One position through the model; returns its logits row.
  auto step = [&](std::int32_t token, index_t pos) {
    Row x{typename Row::tensor_type(Shape{1, 1, D})};
    for (index_t c = 0; c < D; ++c) x.value().data()[c] = wte[index_t(token) * D + c] + wpe[pos * D + c];
    for (index_t l = 0; l < L; ++l) {
      auto& block = l == 0 ? blocks.first() : blocks.block(l);
      auto& attn = block.template layer<1>();
      const auto qkv = attn.template layer<0>().forward(tape, block.template layer<0>().forward(tape, x));
      const float* q = qkv.value().data();
      float* kc = keys.data() + l * Tm * D;
      float* vc = values.data() + l * Tm * D;
      std::copy(q + D, q + 2 * D, kc + pos * D);
      std::copy(q + 2 * D, q + 3 * D, vc + pos * D);
      Row y{typename Row::tensor_type(Shape{1, 1, D})};
      for (index_t h = 0; h < H; ++h) {
        float mx = -std::numeric_limits<float>::infinity();
        for (index_t j = 0; j <= pos; ++j) {
          float s = 0;
          for (index_t f = 0; f < hd; ++f) s += q[h * hd + f] * kc[j * D + h * hd + f];
          scores[std::size_t(j)] = s * float(scale);
          mx = std::max(mx, scores[std::size_t(j)]);
        }
        float sum = 0;
        for (index_t j = 0; j <= pos; ++j) sum += (scores[std::size_t(j)] = std::exp(scores[std::size_t(j)] - mx));
        float* yh = y.value().data() + h * hd;
        std::fill(yh, yh + hd, 0.0f);
        for (index_t j = 0; j <= pos; ++j) {
          const float p = scores[std::size_t(j)] / sum;
          for (index_t f = 0; f < hd; ++f) yh[f] += p * vc[j * D + h * hd + f];
        }
      }
      const auto a = attn.template layer<2>().forward(tape, y);
      for (index_t c = 0; c < D; ++c) x.value().data()[c] += a.value().data()[c];
      const auto m = block.template layer<3>().forward(tape, block.template layer<2>().forward(tape, x));
      for (index_t c = 0; c < D; ++c) x.value().data()[c] += m.value().data()[c];
    }
    return model.template layer<1>().forward(tape, model.final_norm().forward(tape, x));
  };

  std::vector<std::int32_t> context(prompt.begin(), prompt.end());
  index_t cached = 0;  // positions whose keys and values are in the cache
  std::vector<float> logits(static_cast<std::size_t>(C.vocab));
  for (index_t i = 0; i < n; ++i) {
    if (index_t(context.size()) <= Tm) {
      while (cached < index_t(context.size())) {
        const auto row = step(context[std::size_t(cached)], cached);
        std::copy(row.value().data(), row.value().data() + C.vocab, logits.begin());
        ++cached;
      }
    } else {  // past the position table: every position shifts, so the last block_size are re-run
      logits = detail::context_logits(model, tape, context);
    }
    const std::int32_t next = detail::draw_token(logits.data(), C.vocab, o, gen);
    context.push_back(next);
    out.push_back(next);
  }
  return out;
}

}  // namespace kiln::models
