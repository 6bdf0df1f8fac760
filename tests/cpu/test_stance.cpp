// stance::force_eager on a tape: every expression node one kernel forward and one backward, a
// Linear's bias and activation out of its GEMM, cross-entropy as nll_loss(log_softmax) — the
// same values and gradients as fused, and exactly the launches Sequential::launches predicts.
#include <kiln.hpp>
#include <kiln/autograd/gradcheck.hpp>
#include <kiln/autograd/linear.hpp>
#include <kiln/nn/activation.hpp>
#include <kiln/nn/dropout.hpp>
#include <kiln/nn/layernorm.hpp>
#include <kiln/nn/linear.hpp>
#include <kiln/nn/loss.hpp>
#include <kiln/nn/sequential.hpp>
#include <kiln/nn/softmax.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

using namespace kiln;
using Tape = ag::Tape<CpuExecutor>;

namespace {

template <class T>
ag::Var<T, host, dyn, dyn> filled(index_t rows, index_t cols, std::uint64_t seed, bool requires_grad = true) {
  HostMatrix<T> m(rows, cols);
  Generator g(seed);
  for (index_t i = 0; i < m.size(); ++i) m.data()[i] = T(g.uniform(-1.5f, 1.5f));
  return ag::Var<T, host, dyn, dyn>(std::move(m), requires_grad);
}

template <class V>
std::vector<double> grad_of(const V& v) {
  return std::vector<double>(v.grad().data(), v.grad().data() + v.grad().size());
}

// The model's own launches in one forward and one backward of its cross-entropy on a tape: the
// loss's kernels (one each way fused; eager two backward) and the backward's seed left out.
template <class Model>
nn::Launches measure(Model& model, bool eager) {
  CpuExecutor exec(1);
  Tape tape(exec, {.force_eager = eager});
  auto x = filled<float>(6, Model::in_features, 3, false);
  const std::int32_t labels[6] = {0, 1, 2, 3, 4, 0};
  model.zero_grad();
  auto logits = model.forward(tape, x);
  const auto forward = exec.stats().launches();
  auto loss = nn::cross_entropy(tape, logits, labels);
  const auto with_loss = exec.stats().launches();
  tape.backward(loss);
  const std::size_t loss_backward = eager ? 2 : 1, seed = 1;
  return {index_t(forward), index_t(exec.stats().launches() - with_loss - loss_backward - seed)};
}

}  // namespace

TEST_CASE("force_eager: an expression runs node by node with the fused values and gradients") {
  for (const bool eager : {false, true}) {
    CpuExecutor exec(1);
    Tape tape(exec, {.force_eager = eager});
    auto x = filled<double>(4, 5, 1), w = filled<double>(1, 5, 2);
    exec.stats().set_recording(true);
    auto y = ag::map(tape, tanh(x * w + 1.0));
    CHECK(exec.stats().launches() == (eager ? 3u : 1u));  // mul, add, tanh
    const auto before = exec.stats().launches();
    tape.backward(ag::sum(tape, y));
    // The sum, the seed and the sum's backward; then one backward kernel per node, and w's column
    // sums (it is broadcast over the rows).
    CHECK(exec.stats().launches() - before == 3u + (eager ? 3u : 1u) + 1u);
    for (index_t r = 0; r < 4; ++r)
      for (index_t c = 0; c < 5; ++c) {
        const double xv = x.value()(r, c), wv = w.value()(0, c);
        const double t = std::tanh(xv * wv + 1.0);
        CHECK(y.value()(r, c) == doctest::Approx(t).epsilon(1e-15));
        CHECK(x.grad()(r, c) == doctest::Approx((1 - t * t) * wv).epsilon(1e-14));
      }
  }
}

TEST_CASE("force_eager: nll_loss(log_softmax(x)) is cross_entropy, values and gradients, with smoothing") {
  for (const double eps : {0.0, 0.1}) {
    CpuExecutor exec(1);
    Tape fused(exec), eager(exec, {.force_eager = true});
    auto a = filled<double>(5, 7, 8), b = filled<double>(5, 7, 8);
    const std::int32_t labels[5] = {6, 0, 3, 3, 1};
    auto la = nn::cross_entropy(fused, a, labels, {.label_smoothing = eps});
    auto lb = nn::cross_entropy(eager, b, labels, {.label_smoothing = eps});
    CHECK(la.item() == doctest::Approx(lb.item()).epsilon(1e-14));
    fused.backward(la);
    eager.backward(lb);
    const auto ga = grad_of(a), gb = grad_of(b);
    for (std::size_t i = 0; i < ga.size(); ++i) CHECK(ga[i] == doctest::Approx(gb[i]).epsilon(1e-12));
  }
  auto res = gradcheck(
      [](Tape& t, std::vector<GradcheckInput>& in) {
        static const std::int32_t y[3] = {2, 0, 1};
        return nn::nll_loss(t, nn::log_softmax(t, in[0]), y, {.label_smoothing = 0.2});
      },
      {filled<double>(3, 4, 9)});
  CHECK_MESSAGE(res.ok, res.report);
  CpuExecutor exec(1);
  Tape tape(exec);
  auto logp = filled<double>(2, 3, 4);
  const std::int32_t bad[2] = {0, 3};
  CHECK_THROWS_WITH_AS(nn::nll_loss(tape, logp, bad), doctest::Contains("the label of row 1 is 3, outside [0, 3)"),
                       ValueError);
}

TEST_CASE("force_eager: a Linear's bias and activation leave its GEMM; results equal the fused layer's") {
  for (const bool eager : {false, true}) {
    CpuExecutor exec(1);
    Tape tape(exec, {.force_eager = eager});
    auto x = filled<double>(6, 4, 11), w = filled<double>(3, 4, 12);
    ag::Var<double, host, dyn> b(HostVector<double>(3), true);
    for (index_t i = 0; i < 3; ++i) b.value()(i) = 0.1 * double(i) - 0.2;
    exec.stats().set_recording(true);
    auto y = ag::linear<fn::GeluTanh>(tape, x, w, b);
    CHECK(exec.stats().launches() == (eager ? 3u : 1u));
    CHECK(exec.stats().records()[0].name == (eager ? "gemm" : "gemm+bias+gelu_tanh"));
    tape.backward(ag::sum(tape, y));
    for (index_t r = 0; r < 6; ++r)
      for (index_t o = 0; o < 3; ++o) {
        double z = b.value()(o);
        for (index_t i = 0; i < 4; ++i) z += x.value()(r, i) * w.value()(o, i);
        CHECK(y.value()(r, o) == doctest::Approx(fn::GeluTanh{}(z)).epsilon(1e-14));
      }
    double db0 = 0;
    for (index_t r = 0; r < 6; ++r) {
      double z = b.value()(0);
      for (index_t i = 0; i < 4; ++i) z += x.value()(r, i) * w.value()(0, i);
      db0 += fn::GeluTanh{}.d(z);
    }
    CHECK(b.grad()(0) == doctest::Approx(db0).epsilon(1e-13));
  }
}

TEST_CASE("Sequential::launches equals what the executor counts, fused and force_eager") {
  using Mlp = nn::Sequential<nn::Linear<12, 16>, nn::ReLU, nn::Linear<16, 8>, nn::ReLU, nn::Linear<8, 5>>;
  using Mixed = nn::Sequential<nn::Linear<12, 16>, nn::GELU, nn::Dropout<0.1>, nn::LayerNorm<16>, nn::Linear<16, 8>,
                               nn::Tanh, nn::Linear<8, 5>, nn::SiLU>;
  static_assert(Mlp::launches({}) == nn::Launches{3, 5});
  static_assert(Mlp::launches({.eager = true}) == nn::Launches{8, 13});
  for (const bool eager : {false, true}) {
    Mlp mlp(1);
    Mixed mixed(2);
    CHECK(measure(mlp, eager) == Mlp::launches({.eager = eager}));
    CHECK(measure(mixed, eager) == Mixed::launches({.eager = eager}));
    mixed.eval();
    CHECK(measure(mixed, eager) == Mixed::launches({.eager = eager, .training = false}));
  }
}
