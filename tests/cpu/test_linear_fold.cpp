// ag::linear (one GEMM with a bias + activation epilogue) and the fold of its backward into the
// consumer's gradient GEMM (autograd/fold.hpp), against the same model written without either:
// ag::matmul + ag::map(act(z + b)), whose backward is the derived elementwise kernel.
//
// Every way an activation's gradient can arrive is covered: from one GEMM consumer (the offer is
// taken), from an elementwise consumer only (it is not), from both (taken, plus a dact pass for
// the rest), and from two GEMM consumers (the first takes it, the second adds to the gradient).
// fp64 throughout, so the two paths agree to rounding (1e-12 relative).
#include <kiln.hpp>
#include <kiln/autograd/linear.hpp>
#include <kiln/nn/activation.hpp>
#include <kiln/nn/linear.hpp>
#include <kiln/nn/loss.hpp>
#include <kiln/nn/sequential.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

using namespace kiln;
using Tape = ag::Tape<CpuExecutor>;
using V = ag::Var<double, host, dyn, dyn>;
using B = ag::Var<double, host, dyn>;

namespace {

V matrix(index_t rows, index_t cols, std::uint64_t seed) {
  Tensor<double, host, dyn, dyn> t(rows, cols);
  Generator g(seed);
  for (index_t i = 0; i < t.size(); ++i) t.data()[i] = g.uniform(-1.5f, 1.5f);
  return V(std::move(t), true);
}
B vector(index_t n, std::uint64_t seed) {
  Tensor<double, host, dyn> t(n);
  Generator g(seed);
  for (index_t i = 0; i < t.size(); ++i) t.data()[i] = g.uniform(-0.5f, 0.5f);
  return B(std::move(t), true);
}

std::vector<double> values(const Tensor<double, host, dyn, dyn>& t) { return {t.data(), t.data() + t.size()}; }
std::vector<double> values(const Tensor<double, host, dyn>& t) { return {t.data(), t.data() + t.size()}; }

void check_close(const std::vector<double>& got, const std::vector<double>& want, const char* what) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO(what << " element " << i << ": got " << got[i] << ", want " << want[i]);
    CHECK(std::abs(got[i] - want[i]) <= 1e-12 * std::max(1.0, std::abs(want[i])));
  }
}

enum class consumers { gemm, elementwise, gemm_and_elementwise, two_gemms };

struct Grads {
  double loss;
  std::vector<double> dx, dw1, db1, dw2, db2, dw3;
};

// The sizes: rows of x, its features, the hidden width (h's columns: the epilogue's act' and
// bias sums work in chunks of 64 columns), the widths of the consumers' GEMMs, and threads.
struct Dims {
  index_t rows = 7, in = 5, hidden = 6, out = 4, side = 3;
  int threads = 1;
};

// loss of h = act(x·w1ᵀ + b1) through the consumers; fused: ag::linear, else matmul + map.
template <class Act>
Grads run(bool fused, consumers c, Dims d) {
  V x = matrix(d.rows, d.in, 1), w1 = matrix(d.hidden, d.in, 2), w2 = matrix(d.out, d.hidden, 3),
    w3 = matrix(d.side, d.hidden, 4);
  B b1 = vector(d.hidden, 5), b2 = vector(d.out, 6);
  CpuExecutor exec(d.threads);
  Tape tape(exec);
  auto layer = [&](const V& in, const V& w, const B& b, auto act) {
    using A = decltype(act);
    if (fused) return V(ag::linear<typename A::functor>(tape, in, w, b));
    return V(ag::map(tape, A::apply(ag::matmul(tape, in, w, false, true) + b)));
  };
  V h = layer(x, w1, b1, Act{});
  auto square_sum = [&](const V& v) { return ag::sum(tape, ag::map(tape, v * v)); };
  ag::Var<double, host> loss;
  switch (c) {
    case consumers::gemm: loss = square_sum(layer(h, w2, b2, nn::Tanh{})); break;
    case consumers::elementwise: loss = square_sum(h); break;
    case consumers::gemm_and_elementwise:
      loss = ag::map(tape, square_sum(layer(h, w2, b2, nn::Tanh{})) + square_sum(h));
      break;
    case consumers::two_gemms:
      loss = ag::map(tape, square_sum(layer(h, w2, b2, nn::Tanh{})) +
                               square_sum(V(ag::matmul(tape, h, w3, false, true))));
      break;
  }
  tape.backward(loss);
  Grads g{loss.value().data()[0], values(x.grad()), values(w1.grad()), values(b1.grad()), {}, {}, {}};
  if (w2.has_grad()) g.dw2 = values(w2.grad()), g.db2 = values(b2.grad());
  if (w3.has_grad()) g.dw3 = values(w3.grad());
  return g;
}

template <class Act>
void compare_all(Dims d = {}) {
  for (consumers c : {consumers::gemm, consumers::elementwise, consumers::gemm_and_elementwise, consumers::two_gemms}) {
    CAPTURE(int(c));
    const Grads want = run<Act>(false, c, d), got = run<Act>(true, c, d);
    CHECK(std::abs(got.loss - want.loss) <= 1e-12 * std::abs(want.loss));
    check_close(got.dx, want.dx, "dx");
    check_close(got.dw1, want.dw1, "dw1");
    check_close(got.db1, want.db1, "db1");
    check_close(got.dw2, want.dw2, "dw2");
    check_close(got.db2, want.db2, "db2");
    check_close(got.dw3, want.dw3, "dw3");
  }
}

}  // namespace

TEST_CASE("ag::linear with a fused epilogue: values and gradients equal the unfused ops, every consumer mix") {
  SUBCASE("relu") { compare_all<nn::ReLU>(); }
  SUBCASE("gelu tanh") { compare_all<nn::GELUTanh>(); }
  SUBCASE("gelu erf") { compare_all<nn::GELU>(); }
  SUBCASE("sigmoid") { compare_all<nn::Sigmoid>(); }
}

TEST_CASE("ag::linear's fused backward over widths past its 64-column chunks, on two threads") {
  // hidden 150 = two whole chunks and a tail; out 70 crosses one chunk edge too.
  const Dims wide{.rows = 37, .in = 70, .hidden = 150, .out = 70, .side = 65, .threads = 2};
  SUBCASE("relu") { compare_all<nn::ReLU>(wide); }
  SUBCASE("gelu tanh") { compare_all<nn::GELUTanh>(wide); }
  SUBCASE("sigmoid") { compare_all<nn::Sigmoid>(wide); }
}

TEST_CASE("ag::linear without an activation or a bias; input without a gradient") {
  V x = matrix(5, 3, 7), w = matrix(4, 3, 8);
  B b = vector(4, 9);
  x.set_requires_grad(false);
  CpuExecutor exec(1);
  Tape tape(exec);
  auto y = ag::linear(tape, x, w, b);
  auto y0 = ag::linear(tape, x, w);
  auto ref = ag::map(tape, ag::matmul(tape, x, w, false, true) + b);
  check_close(values(y.value()), values(ref.value()), "y");
  auto loss = ag::sum(tape, ag::map(tape, y * y + y0));
  tape.backward(loss);
  CHECK_FALSE(x.has_grad());
  // d/dW of sum(y² + y0) = (2y + 1)ᵀ x; d/db = column sums of 2y.
  for (index_t o = 0; o < 4; ++o) {
    double db = 0;
    for (index_t r = 0; r < 5; ++r) db += 2 * y.value()(r, o);
    CHECK(b.grad()(o) == doctest::Approx(db).epsilon(1e-12));
    for (index_t i = 0; i < 3; ++i) {
      double dw = 0;
      for (index_t r = 0; r < 5; ++r) dw += (2 * y.value()(r, o) + 1) * x.value()(r, i);
      CHECK(w.grad()(o, i) == doctest::Approx(dw).epsilon(1e-12));
    }
  }
}

TEST_CASE("ag::linear: shape errors name both shapes") {
  V x = matrix(5, 3, 1), w = matrix(4, 2, 2);
  B b = vector(3, 3);
  CpuExecutor exec(1);
  Tape tape(exec);
  CHECK_THROWS_WITH_AS(ag::linear(tape, x, w), doctest::Contains("x has shape [5, 3] and the weight [4, 2]"),
                       ShapeError);
  V w2 = matrix(4, 3, 4);
  CHECK_THROWS_WITH_AS(ag::linear(tape, x, w2, b), doctest::Contains("the bias has shape [3]"), ShapeError);
}

TEST_CASE("An MLP training step is GEMMs only: act' and bias gradients ride on the GEMM epilogues") {
  using Mlp = nn::Sequential<nn::Linear<20, 16>, nn::ReLU, nn::Linear<16, 12>, nn::ReLU, nn::Linear<12, 5>>;
  Mlp model(3);
  CpuExecutor exec(1);
  Tape tape(exec);
  Tensor<float, host, dyn, dyn> xt(8, 20);
  Generator g(4);
  for (index_t i = 0; i < xt.size(); ++i) xt.data()[i] = g.uniform(-1.f, 1.f);
  ag::Var<float, host, dyn, dyn> x(std::move(xt));
  const std::int32_t labels[8] = {0, 1, 2, 3, 4, 0, 1, 2};
  exec.stats().set_recording(true);
  auto loss = nn::cross_entropy(tape, model.forward(tape, x), labels);
  tape.backward(loss);
  std::vector<std::string> gemms;
  for (const auto& r : exec.stats().records())
    if (r.kind == kind::gemm) gemms.push_back(r.name);
  // Forward: three GEMMs with their epilogues. Backward, last layer first: its weight gradient
  // with the bias gradient (bgrada), its input gradient with the previous ReLU's derivative and
  // bias gradient (drelu+bgrad), and so on; the first layer's input needs no gradient.
  const std::vector<std::string> want{"gemm+bias+relu", "gemm+bias+relu", "gemm+bias",       "gemm+bgrada",
                                      "gemm+drelu+bgrad", "gemm",          "gemm+drelu+bgrad", "gemm"};
  CHECK(gemms == want);
  CHECK(exec.stats().launches(kind::elementwise) == 1);  // backward's seed: d(loss)/d(loss) = 1
  CHECK(exec.stats().launches() == 8 + 2 + 1);           // + the cross-entropy's two loss kernels
}

TEST_CASE("ag::linear: once its backward step is released, a backward through its output throws and folds nothing") {
  V x = matrix(6, 4, 1), w1 = matrix(5, 4, 2), w2 = matrix(3, 5, 3);
  B b1 = vector(5, 4);
  CpuExecutor exec(1);
  Tape tape(exec);
  V h = ag::linear<fn::Relu>(tape, x, w1, b1);
  tape.backward(ag::sum(tape, h));  // nothing else consumes h: its producer's step is released
  w1.zero_grad();
  b1.zero_grad();
  auto loss = ag::sum(tape, ag::map(tape, ag::matmul(tape, h, w2, false, true) * 2.0));
  CHECK_THROWS_WITH_AS(tape.backward(loss), doctest::Contains("graph an earlier backward() freed"), ValueError);
  CHECK_FALSE(w2.has_grad());  // it threw before running anything ...
  CHECK_FALSE(b1.has_grad());  // ... and no GEMM folded into the released producer
  CHECK_FALSE(w1.has_grad());
}
