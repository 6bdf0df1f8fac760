// What a user of the nn layers relies on beyond the built-in layers: an activation of their own
// (Activation<F>: fused into the Linear's epilogue, gradients right), the model's one-line
// description with its mode, EvalScope (every layer's own mode restored), and cross_entropy over
// a span of labels.
#include <kiln.hpp>
#include <kiln/autograd/gradcheck.hpp>
#include <kiln/nn/activation.hpp>
#include <kiln/nn/dropout.hpp>
#include <kiln/nn/layernorm.hpp>
#include <kiln/nn/linear.hpp>
#include <kiln/nn/loss.hpp>
#include <kiln/nn/repeat.hpp>
#include <kiln/nn/residual.hpp>
#include <kiln/nn/sequential.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

using namespace kiln;
using Tape = ag::Tape<CpuExecutor>;

namespace {

// mish(x) = x·tanh(softplus(x)), written as a user would: value and derivative.
struct Mish {
  static constexpr const char* name = "mish";
  template <class T>
  KILN_HOST_DEVICE T operator()(T x) const {
    return x * math::tanh(math::log1p(math::exp(x)));
  }
  template <class T>
  KILN_HOST_DEVICE T d(T x) const {
    const T t = math::tanh(math::log1p(math::exp(x)));
    const T sig = T(1) / (T(1) + math::exp(-x));
    return t + x * (T(1) - t * t) * sig;
  }
};
using MishLayer = nn::Activation<Mish>;
static_assert(fn::unary_functor<Mish>);
static_assert(!fn::unary_functor<fn::Add>);

template <class T>
ag::Var<T, host, dyn, dyn> filled(index_t rows, index_t cols, std::uint64_t seed, bool requires_grad = false) {
  HostMatrix<T> m(rows, cols);
  Generator g(seed);
  for (index_t i = 0; i < m.size(); ++i) m.data()[i] = T(g.uniform(-2.0f, 2.0f));
  return ag::Var<T, host, dyn, dyn>(std::move(m), requires_grad);
}

}  // namespace

TEST_CASE("a user's activation rides the Linear's GEMM epilogue and equals the unfused computation") {
  using Model = nn::Sequential<nn::Linear<6, 5>, MishLayer, nn::Linear<5, 3>>;
  Model model(4);
  CpuExecutor exec(1);
  exec.stats().set_recording(true);
  Tape tape(exec);
  auto x = filled<float>(7, 6, 5);
  auto y = model.forward(tape, x);
  REQUIRE(exec.stats().records().size() == 2);
  CHECK(exec.stats().records()[0].name == "gemm+bias+mish");

  const auto& l0 = model.layer<0>();
  const auto& l2 = model.layer<2>();
  for (index_t r = 0; r < 7; ++r)
    for (index_t o = 0; o < 3; ++o) {
      double want = l2.bias().value()(o);
      for (index_t j = 0; j < 5; ++j) {
        double z = l0.bias().value()(j);
        for (index_t i = 0; i < 6; ++i) z += double(x.value()(r, i)) * double(l0.weight().value()(j, i));
        want += Mish{}(z) * double(l2.weight().value()(o, j));
      }
      CHECK(double(y.value()(r, o)) == doctest::Approx(want).epsilon(1e-5));
    }
}

TEST_CASE("a user's activation has the gradients of central differences in fp64, fused or alone") {
  nn::Sequential<nn::Linear<6, 5, true, double>, MishLayer, nn::Linear<5, 3, true, double>> mlp(3);
  static const std::int32_t labels[4] = {0, 2, 1, 1};
  auto fused = gradcheck(
      [&](Tape& t, std::vector<GradcheckInput>& in) { return nn::cross_entropy(t, mlp.forward(t, in[0]), labels); },
      {GradcheckInput(std::move(filled<double>(4, 6, 9).value()), true)}, mlp.parameters());
  CHECK_MESSAGE(fused.ok, fused.report);
  auto alone = gradcheck([](Tape& t, std::vector<GradcheckInput>& in) { return nn::activation<Mish>(t, in[0]); },
                         {GradcheckInput(std::move(filled<double>(3, 4, 10).value()), true)});
  CHECK_MESSAGE(alone.ok, alone.report);
}

TEST_CASE("Sequential::describe names the layers as they run, the mode and the parameter count") {
  nn::Sequential<nn::Linear<400, 256>, nn::ReLU, nn::Linear<256, 10, false>, nn::LayerNorm<10>, MishLayer> model;
  CHECK(model.describe() ==
        "Sequential [train] Linear<400, 256>+relu -> Linear<256, 10, no bias> -> LayerNorm<10> -> mish "
        "(105,236 parameters)");
  model.eval();
  CHECK(model.describe().rfind("Sequential [eval] Linear<400, 256>+relu", 0) == 0);
}

TEST_CASE("EvalScope: eval mode and no recording inside, the previous mode restored after") {
  nn::Sequential<nn::Linear<6, 3>> model(1);
  CpuExecutor exec(1);
  Tape tape(exec);
  auto x = filled<float>(2, 6, 3);
  CHECK(model.training());
  {
    nn::EvalScope evaluating(model);
    CHECK_FALSE(model.training());
    auto y = model.forward(tape, x);
    CHECK_FALSE(y.requires_grad());
    CHECK(tape.size() == 0);
  }
  CHECK(model.training());
  CHECK(ag::grad_enabled());
  model.eval();
  { nn::EvalScope evaluating(model); }
  CHECK_FALSE(model.training());  // it was in eval mode before: it stays there
}

TEST_CASE("EvalScope: each layer's own mode restored, nested layers included") {
  using Inner = nn::Sequential<nn::Linear<6, 6>, nn::Dropout<0.5>>;
  nn::Sequential<nn::Linear<6, 6>, nn::Dropout<0.5>, nn::Residual<Inner>, nn::Repeat<2, Inner>> model(1);
  model.layer<1>().eval();                    // a Dropout turned off in a model that trains
  model.layer<2>().body().layer<1>().eval();  // one inside a Residual
  model.layer<3>().block(1).layer<1>().eval();  // one inside the second block of a Repeat
  {
    nn::EvalScope evaluating(model);
    CHECK_FALSE(model.training());
    CHECK_FALSE(model.layer<2>().training());
    CHECK_FALSE(model.layer<3>().first().layer<1>().training());
  }
  CHECK(model.training());
  CHECK_FALSE(model.layer<1>().training());
  CHECK(model.layer<2>().training());
  CHECK(model.layer<2>().body().training());
  CHECK_FALSE(model.layer<2>().body().layer<1>().training());
  CHECK(model.layer<3>().training());
  CHECK(model.layer<3>().first().layer<1>().training());
  CHECK_FALSE(model.layer<3>().block(1).layer<1>().training());
}

TEST_CASE("cross_entropy takes the labels as a span or a vector, checked against the rows") {
  CpuExecutor exec(1);
  Tape tape(exec);
  auto logits = filled<float>(3, 4, 8, true);
  std::vector<std::int32_t> labels{3, 0, 2};
  const float by_pointer = nn::cross_entropy(tape, logits, labels.data()).item();
  CHECK(nn::cross_entropy(tape, logits, std::span<std::int32_t>(labels)).item() == by_pointer);
  CHECK(nn::cross_entropy(tape, logits, labels).item() == by_pointer);
  std::vector<std::int32_t> short_labels{3, 0};
  CHECK_THROWS_WITH_AS(nn::cross_entropy(tape, logits, short_labels),
                       doctest::Contains("2 labels for logits of shape [3, 4]"), ShapeError);
}

TEST_CASE("eval(): Dropout is the identity, so evaluation is deterministic; train() draws masks again") {
  nn::Sequential<nn::Linear<6, 8>, nn::ReLU, nn::Dropout<0.5>, nn::Linear<8, 3>> model(2);
  CpuExecutor exec(1);
  Tape tape(exec);
  auto x = filled<float>(5, 6, 4);
  auto vals = [](const auto& v) { return std::vector<float>(v.value().data(), v.value().data() + v.value().size()); };
  const auto train1 = vals(model.forward(tape, x)), train2 = vals(model.forward(tape, x));
  CHECK(train1 != train2);  // a fresh mask per training forward
  model.eval();
  const auto eval1 = vals(model.forward(tape, x)), eval2 = vals(model.forward(tape, x));
  CHECK(eval1 == eval2);
  // ... and equal to the model without its dropout layer.
  auto h = model.layer<0>().template forward_fused<nn::ReLU>(tape, x);
  CHECK(vals(model.layer<3>().forward(tape, h)) == eval1);
  model.train();
  CHECK(vals(model.forward(tape, x)) != eval1);
}
