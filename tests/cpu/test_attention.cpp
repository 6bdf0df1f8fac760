// Fused causal attention (kiln/nn/attention.hpp) against attention written out — scores, mask,
// softmax, weighted sum — and its backward against central differences in fp64: T = 1, T below
// and above the key tile (64), T not a multiple of it, the model's maximum.
#include <kiln.hpp>
#include <kiln/autograd/map.hpp>
#include <kiln/autograd/reduce.hpp>
#include <kiln/nn/attention.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

using namespace kiln;

namespace {

using Qkv = ag::Var<double, host, dyn, dyn, dyn>;

std::vector<double> random_values(index_t n, std::uint64_t seed, double scale = 1.0) {
  Generator gen(seed);
  std::vector<double> v(static_cast<std::size_t>(n));
  for (double& x : v) x = scale * (2.0 * double(gen.uniform()) - 1.0);
  return v;
}

Qkv make_qkv(index_t b, index_t t, index_t w3, const std::vector<double>& values, bool grad) {
  Qkv x(Qkv::tensor_type(Shape{b, t, w3}), grad);
  std::copy(values.begin(), values.end(), x.value().data());
  return x;
}

// Attention as the formula: y[b, i, head] = sum_{j <= i} softmax_j(q_i · k_j * scale) z_ij v_j, z_ij the
// dropout factor (1 without dropout; 1 / (1 - p) or 0 by the mask's definition in AttentionDims).
std::vector<double> reference(const std::vector<double>& qkv, index_t B, index_t T, index_t H, index_t hd,
                              nn::AttentionDropout drop = {}) {
  const index_t W = H * hd, row = 3 * W;
  const double scale = 1.0 / std::sqrt(double(hd));
  std::vector<double> y(std::size_t(B * T * W), 0.0);
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < H; ++h)
      for (index_t i = 0; i < T; ++i) {
        std::vector<double> s(static_cast<std::size_t>(i + 1));
        double mx = -1e300;
        for (index_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (index_t d = 0; d < hd; ++d)
            dot += qkv[std::size_t((b * T + i) * row + h * hd + d)] * qkv[std::size_t((b * T + j) * row + W + h * hd + d)];
          s[std::size_t(j)] = dot * scale;
          mx = std::max(mx, s[std::size_t(j)]);
        }
        double sum = 0;
        for (double& e : s) sum += (e = std::exp(e - mx));
        for (index_t j = 0; j <= i; ++j) {
          double z = 1.0;
          if (drop.p > 0) {
            const std::uint64_t counter = drop.offset + std::uint64_t(((b * H + h) * T + i) * T + j);
            z = uniform01(drop.seed, counter) >= float(drop.p) ? 1.0 / (1.0 - double(float(drop.p))) : 0.0;
          }
          for (index_t d = 0; d < hd; ++d)
            y[std::size_t((b * T + i) * W + h * hd + d)] +=
                s[std::size_t(j)] / sum * z * qkv[std::size_t((b * T + j) * row + 2 * W + h * hd + d)];
        }
      }
  return y;
}

// sum(attention(qkv) * w): a scalar whose gradient is attention's backward of w.
double weighted_sum(const std::vector<double>& qkv, const std::vector<double>& w, index_t B, index_t T, index_t H,
                    index_t hd, nn::AttentionDropout drop) {
  CpuExecutor exec(1);
  ag::Tape<CpuExecutor> tape(exec);
  ag::NoGrad off;
  const auto y = nn::causal_attention(tape, make_qkv(B, T, 3 * H * hd, qkv, false), H, drop);
  double s = 0;
  for (index_t i = 0; i < y.value().size(); ++i) s += y.value().data()[i] * w[std::size_t(i)];
  return s;
}

void check_case(index_t B, index_t T, index_t H, index_t hd, int threads, nn::AttentionDropout drop = {}) {
  CAPTURE(B);
  CAPTURE(T);
  CAPTURE(H);
  CAPTURE(hd);
  CAPTURE(threads);
  const index_t W = H * hd;
  const auto qkv = random_values(B * T * 3 * W, 1000 + std::uint64_t(T), 1.5);
  const auto w = random_values(B * T * W, 2000 + std::uint64_t(T));
  CpuExecutor exec(threads);
  ag::Tape<CpuExecutor> tape(exec);
  auto x = make_qkv(B, T, 3 * W, qkv, true);
  CAPTURE(drop.p);
  const auto y = nn::causal_attention(tape, x, H, drop);
  REQUIRE(y.shape() == Shape{B, T, W});
  const auto ref = reference(qkv, B, T, H, hd, drop);
  double worst = 0;
  for (index_t i = 0; i < y.value().size(); ++i) worst = std::max(worst, std::abs(y.value().data()[i] - ref[std::size_t(i)]));
  CHECK(worst < 1e-12);

  ag::Var<double, host, dyn, dyn, dyn> wv(ag::Var<double, host, dyn, dyn, dyn>::tensor_type(Shape{B, T, W}));
  std::copy(w.begin(), w.end(), wv.value().data());
  tape.backward(ag::sum(tape, ag::map(tape, y * wv)));
  REQUIRE(x.has_grad());
  // Central differences of the weighted sum, every element of qkv.
  const double eps = 1e-6;
  double worst_grad = 0, largest = 0;
  auto p = qkv;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const double v = p[i];
    p[i] = v + eps;
    const double up = weighted_sum(p, w, B, T, H, hd, drop);
    p[i] = v - eps;
    const double down = weighted_sum(p, w, B, T, H, hd, drop);
    p[i] = v;
    const double numeric = (up - down) / (2 * eps);
    worst_grad = std::max(worst_grad, std::abs(numeric - x.grad().data()[i]));
    largest = std::max(largest, std::abs(numeric));
  }
  CHECK(largest > 0.1);  // the check sees real gradients
  CHECK(worst_grad < 1e-7 * std::max(1.0, largest));
}

}  // namespace

TEST_CASE("causal attention: the formula's values and fp64 finite-difference gradients") {
  check_case(1, 1, 1, 4, 1);     // T = 1: each row attends to itself only
  check_case(2, 5, 2, 3, 1);     // below one key tile
  check_case(1, 64, 2, 4, 2);    // exactly one tile, two threads
  check_case(2, 67, 3, 2, 2);    // one tile and three rows: the mask inside the second tile
  check_case(1, 130, 1, 8, 1);   // three tiles
}

TEST_CASE("causal attention with dropout on the probabilities: the mask's definition, and its gradients") {
  // The same mask in forward and backward (drawn twice from its counters, never stored).
  check_case(2, 5, 2, 3, 1, {.p = 0.3, .seed = 11, .offset = 0});
  check_case(1, 67, 2, 4, 2, {.p = 0.5, .seed = 12, .offset = 1000});
  // A different offset draws a different mask; p = 0 is the plain op.
  const auto qkv = random_values(1 * 8 * 3 * 4, 3);
  CpuExecutor exec(1);
  ag::Tape<CpuExecutor> tape(exec);
  const auto x = make_qkv(1, 8, 12, qkv, false);
  const auto a = nn::causal_attention(tape, x, 2, {.p = 0.4, .seed = 1, .offset = 0});
  const auto b = nn::causal_attention(tape, x, 2, {.p = 0.4, .seed = 1, .offset = 64});
  const auto c = nn::causal_attention(tape, x, 2, {.p = 0.0, .seed = 1, .offset = 0});
  const auto d = nn::causal_attention(tape, x, 2);
  CHECK(std::vector<double>(a.value().data(), a.value().data() + 32) != std::vector<double>(b.value().data(), b.value().data() + 32));
  CHECK(std::vector<double>(c.value().data(), c.value().data() + 32) == std::vector<double>(d.value().data(), d.value().data() + 32));
  CHECK_THROWS_WITH_AS(nn::causal_attention(tape, x, 2, {.p = 1.0}), doctest::Contains("must be in [0, 1)"), ValueError);
}

TEST_CASE("causal attention: the same bits at any thread count, and accumulated gradients") {
  const index_t B = 3, T = 70, H = 2, hd = 8, W = H * hd;
  const auto qkv = random_values(B * T * 3 * W, 7);
  std::vector<std::vector<double>> grads, outs;
  for (int threads : {1, 2, 3}) {
    CpuExecutor exec(threads);
    ag::Tape<CpuExecutor> tape(exec);
    auto x = make_qkv(B, T, 3 * W, qkv, true);
    const auto y = nn::causal_attention(tape, x, H);
    tape.backward(ag::sum(tape, ag::map(tape, y * y)));
    outs.emplace_back(y.value().data(), y.value().data() + y.value().size());
    grads.emplace_back(x.grad().data(), x.grad().data() + x.grad().size());
  }
  CHECK(outs[0] == outs[1]);
  CHECK(outs[0] == outs[2]);
  CHECK(grads[0] == grads[1]);
  CHECK(grads[0] == grads[2]);

  // Used twice, the gradient is the sum of both uses (the second backward adds).
  CpuExecutor exec(2);
  ag::Tape<CpuExecutor> tape(exec);
  auto x = make_qkv(B, T, 3 * W, qkv, true);
  const auto a = nn::causal_attention(tape, x, H);
  const auto b = nn::causal_attention(tape, x, H);
  tape.backward(ag::sum(tape, ag::map(tape, a * a + b * b)));
  for (std::size_t i = 0; i < grads[0].size(); ++i) REQUIRE(x.grad().data()[i] == doctest::Approx(2 * grads[0][i]).epsilon(1e-12));
}

TEST_CASE("causal attention: a width that is not 3 * heads * head_dim is refused") {
  CpuExecutor exec(1);
  ag::Tape<CpuExecutor> tape(exec);
  const auto x = make_qkv(1, 4, 12, random_values(48, 1), false);
  CHECK_THROWS_WITH_AS(nn::causal_attention(tape, x, 3), doctest::Contains("3 * heads * head_dim"), ShapeError);
}
