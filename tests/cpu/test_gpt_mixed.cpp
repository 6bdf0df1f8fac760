// The GPT under mixed precision on the CPU (bf16 / f16 activations, float master parameters and
// arithmetic): LayerNorm and attention on bf16 values against their float selves, a bf16 GPT's
// logits and gradients against the fp32 model's, and bf16_mixed / fp16_mixed training steps
// tracking the fp32 loss curve with the predicted launches.
#include <kiln.hpp>
#include <kiln/models/gpt.hpp>
#include <kiln/optim/adam.hpp>
#include <kiln/train/report.hpp>
#include <kiln/train/step.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

using namespace kiln;

namespace {

constexpr models::GptConfig tiny{.vocab = 65, .block_size = 16, .layers = 2, .heads = 2, .width = 32};
using Tiny = models::GPT<tiny>;
constexpr index_t batch = 4, length = 16;

// max |a - b| / max |b|.
template <class A, class B>
double relative_error(const A* a, const B* b, index_t n) {
  double worst = 0, scale = 0;
  for (index_t i = 0; i < n; ++i) {
    worst = std::max(worst, std::abs(double(convert<float>(a[i])) - double(convert<float>(b[i]))));
    scale = std::max(scale, std::abs(double(convert<float>(b[i]))));
  }
  return worst / std::max(scale, 1e-30);
}

template <class T>
ag::Var<T, host, dyn, dyn, dyn> random_var(Shape s, std::uint64_t seed, float scale, bool grad) {
  Tensor<T, host, dyn, dyn, dyn> t(s);
  Generator g(seed);
  for (index_t i = 0; i < t.size(); ++i) t.data()[i] = convert<T>(g.uniform(-scale, scale));
  return ag::Var<T, host, dyn, dyn, dyn>(std::move(t), grad);
}

// The same values in another type (bf16 -> float is exact).
template <class To, class From>
ag::Var<To, host, dyn, dyn, dyn> as(const ag::Var<From, host, dyn, dyn, dyn>& v, bool grad) {
  Tensor<To, host, dyn, dyn, dyn> t(v.shape());
  for (index_t i = 0; i < t.size(); ++i) t.data()[i] = convert<To>(v.value().data()[i]);
  return ag::Var<To, host, dyn, dyn, dyn>(std::move(t), grad);
}

}  // namespace

TEST_CASE("mixed GPT pieces: LayerNorm and attention on bf16 values give their float results, rounded") {
  CpuExecutor exec(2);
  ag::Tape<CpuExecutor> tape(exec);
  const auto xb = random_var<bf16>(Shape{3, 5, 32}, 1, 2.f, true);
  const auto xf = as<float>(xb, true);
  nn::LayerNorm<32> ln;
  const auto yb = ln.forward(tape, xb);
  static_assert(std::is_same_v<decltype(yb), const ag::Var<bf16, host, dyn, dyn, dyn>>);
  const auto yf = ln.forward(tape, xf);
  // One rounding of the float result: within bf16's half-ulp (2^-9 relative) of the largest value.
  CHECK(relative_error(yb.value().data(), yf.value().data(), yf.value().size()) < 1.0 / 256);

  const auto qb = random_var<bf16>(Shape{2, 67, 3 * 2 * 16}, 2, 1.5f, true);
  const auto qf = as<float>(qb, true);
  const auto ab = nn::causal_attention(tape, qb, 2);
  const auto af = nn::causal_attention(tape, qf, 2);
  CHECK(relative_error(ab.value().data(), af.value().data(), af.value().size()) < 1.0 / 256);
  // Gradients: the same upstream values in both types; bf16's are its float ones rounded at each
  // store (the attention's input gradient once, the LayerNorm's once).
  const auto wb = random_var<bf16>(Shape{2, 67, 32}, 3, 1.f, false);
  const auto wf = as<float>(wb, false);
  const auto w2b = random_var<bf16>(Shape{3, 5, 32}, 4, 1.f, false);
  const auto w2f = as<float>(w2b, false);
  tape.backward(ag::sum(tape, ag::map(tape, ab * wb)));
  tape.backward(ag::sum(tape, ag::map(tape, af * wf)));
  tape.backward(ag::sum(tape, ag::map(tape, yb * w2b)));
  tape.backward(ag::sum(tape, ag::map(tape, yf * w2f)));
  const double attention_grad = relative_error(qb.grad().data(), qf.grad().data(), qf.value().size());
  const double norm_grad = relative_error(xb.grad().data(), xf.grad().data(), xf.value().size());
  MESSAGE("bf16 against float: attention's input gradient ", attention_grad, ", LayerNorm's ", norm_grad);
  CHECK(attention_grad < 1.0 / 64);
  CHECK(norm_grad < 1.0 / 64);
}

TEST_CASE("mixed GPT: bf16 logits and gradients follow the fp32 model's") {
  static_assert(nn::mixed_precision_ok<Tiny>);
  Tiny model(5);
  CpuExecutor exec(2);
  model.refresh_low_copies<bf16>(exec);
  Tensor<float, host, dyn, length> ids(Shape{batch, length});
  std::vector<std::int32_t> labels(std::size_t(batch * length));
  Generator g(6);
  for (index_t i = 0; i < ids.size(); ++i) {
    ids.data()[i] = float(g.below(65));
    labels[std::size_t(i)] = std::int32_t(g.below(65));
  }
  Tensor<bf16, host, dyn, length> ids_b(Shape{batch, length});
  for (index_t i = 0; i < ids.size(); ++i) ids_b.data()[i] = bf16(ids.data()[i]);  // exact: ids < 256

  auto run = [&](const auto& x) {
    model.zero_grad();
    ag::Tape<CpuExecutor> tape(exec);
    const auto logits = model.forward(tape, x);
    std::vector<float> out(std::size_t(logits.value().size()));
    for (index_t i = 0; i < logits.value().size(); ++i) out[std::size_t(i)] = convert<float>(logits.value().data()[i]);
    const auto loss = train::CrossEntropy{}(tape, logits, labels.data());
    tape.backward(loss);
    std::vector<std::vector<float>> grads;
    grads.push_back({loss.item()});
    grads.push_back(out);
    model.for_each_parameter([&](const auto& v) {
      grads.emplace_back(v.grad().data(), v.grad().data() + v.grad().size());
    });
    return grads;
  };
  const auto f = run(ag::Var<float, host, dyn, length>(std::move(ids)));
  const auto b = run(ag::Var<bf16, host, dyn, length>(std::move(ids_b)));
  REQUIRE(f.size() == b.size());
  CHECK(b[0][0] == doctest::Approx(f[0][0]).epsilon(0.01));
  const double logit_error = relative_error(b[1].data(), f[1].data(), index_t(f[1].size()));
  MESSAGE("bf16 against fp32: loss ", b[0][0], " / ", f[0][0], ", logits within ", logit_error, " of the largest");
  CHECK(logit_error < 0.03);
  CHECK(logit_error > 1e-4);  // bf16 really ran: its roundings show
  // Every parameter's gradient points the way the fp32 one does (cosine > 0.99).
  double worst = 1;
  for (std::size_t k = 2; k < f.size(); ++k) {
    double dot = 0, nf = 0, nb = 0;
    for (std::size_t i = 0; i < f[k].size(); ++i) {
      dot += double(f[k][i]) * b[k][i];
      nf += double(f[k][i]) * f[k][i];
      nb += double(b[k][i]) * b[k][i];
    }
    if (nf > 0) worst = std::min(worst, dot / std::sqrt(nf * nb));
  }
  MESSAGE("bf16 against fp32 gradients: smallest cosine ", worst);
  CHECK(worst > 0.99);
}

namespace {

template <class Policy>
std::vector<float> gpt_loss_curve(int steps, index_t& launches_measured, index_t& launches_predicted) {
  CpuExecutor exec(2);
  Tiny model(9);
  optim::AdamW opt(model, {.lr = 3e-3, .beta2 = 0.99, .weight_decay = 0.1});
  train::Step step(model, opt, exec, Policy{}, train::CrossEntropy{}, {.loss_window = 1000});
  // A learnable text: each next token is the current one plus 1 (mod 65), from random starts.
  Generator g(10);
  std::vector<float> x(std::size_t(batch * length));
  std::vector<std::int32_t> y(std::size_t(batch * length));
  for (int s = 0; s < steps; ++s) {
    for (index_t r = 0; r < batch; ++r) {
      const auto start = std::int32_t(g.below(65));
      for (index_t t = 0; t < length; ++t) {
        x[std::size_t(r * length + t)] = float((start + t) % 65);
        y[std::size_t(r * length + t)] = std::int32_t((start + t + 1) % 65);
      }
    }
    if (s == steps - 1) step.record_next_step();
    step.run(x.data(), y.data(), batch, length);
  }
  const auto rep = train::report(step);
  launches_measured = index_t(std::lround(rep.kernels_per_step));
  launches_predicted = rep.predicted;
  return step.take_losses(true);
}

}  // namespace

TEST_CASE("mixed GPT: bf16_mixed and fp16_mixed steps track the fp32 loss curve, with the predicted launches") {
  const int steps = 40;
  index_t m32 = 0, p32 = 0, mbf = 0, pbf = 0, mh = 0, ph = 0;
  const auto fp32 = gpt_loss_curve<kiln::policy<>>(steps, m32, p32);
  const auto bf = gpt_loss_curve<kiln::policy<kiln::precision::bf16_mixed>>(steps, mbf, pbf);
  const auto half = gpt_loss_curve<kiln::policy<kiln::precision::fp16_mixed>>(steps, mh, ph);
  REQUIRE(fp32.size() == std::size_t(steps));
  REQUIRE(bf.size() == std::size_t(steps));
  double worst_bf = 0, worst_half = 0;
  for (int s = 0; s < steps; ++s) {
    const double ref = fp32[std::size_t(s)];
    worst_bf = std::max(worst_bf, std::abs(double(bf[std::size_t(s)]) - ref) / ref);
    worst_half = std::max(worst_half, std::abs(double(half[std::size_t(s)]) - ref) / ref);
  }
  MESSAGE("loss: fp32 ", fp32.front(), " -> ", fp32.back(), ", bf16 -> ", bf.back(), ", fp16 -> ", half.back(),
          "; worst relative difference bf16 ", worst_bf, ", fp16 ", worst_half);
  CHECK(fp32.back() < 0.5 * fp32.front());
  CHECK(bf.back() < 0.5 * bf.front());
  CHECK(half.back() < 0.5 * half.front());
  CHECK(worst_bf < 0.05);
  CHECK(worst_half < 0.02);
  CHECK(m32 == p32);
  CHECK(mbf == pbf);
  CHECK(mh == ph);
}
