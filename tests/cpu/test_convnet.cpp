// Convolutional layers as autograd ops and layers (kiln/nn/conv.hpp, batchnorm.hpp, pool.hpp,
// reshape.hpp, residual.hpp): shapes through the model's type, the layers against the CPU kernels
// they wrap (which have their own fp64 references in test_conv2d / test_batchnorm2d /
// test_pool2d), every gradient against central differences in fp64, launch counts, modes, bad
// inputs. The channels-last (nhwc) twins are in test_convnet_nhwc.cpp: one file held both and
// passed its compile-time budget.
#include <kiln/models/convnets.hpp>
#include <kiln/train.hpp>

#include <doctest/doctest.h>

#include "gradcheck_helpers.hpp"
#include "step_helpers.hpp"

#include <cstdint>
#include <type_traits>
#include <vector>

using namespace kiln;
using Tape = ag::Tape<CpuExecutor>;
using In = std::vector<GradcheckInput>;
using kiln_gradcheck_test::input;
using DigitsCnn = models::DigitsCnn;

TEST_CASE("sizes flow through a convolutional model's type") {
  using nn::any_sample;
  using nn::sample;
  static_assert(std::is_same_v<nn::output_sample_t<nn::Conv2d<1, 16, 3, 1, 1>, sample<1, 20, 20>>, sample<16, 20, 20>>);
  static_assert(std::is_same_v<nn::output_sample_t<nn::Conv2d<3, 8, 5, 2, 1>, sample<3, 9, 12>>, sample<8, 4, 5>>);
  static_assert(std::is_same_v<nn::output_sample_t<nn::Conv2d<3, 8, 3, 1, 0, 2>, sample<3, 9, 9>>, sample<8, 5, 5>>);
  static_assert(std::is_same_v<nn::output_sample_t<nn::MaxPool2d<2>, sample<16, 20, 20>>, sample<16, 10, 10>>);
  static_assert(std::is_same_v<nn::output_sample_t<nn::MaxPool2d<3, 2, 1>, sample<4, 7, 8>>, sample<4, 4, 4>>);
  static_assert(std::is_same_v<nn::output_sample_t<nn::AvgPool2d<2>, sample<4, 5, 5>>, sample<4, 2, 2>>);
  static_assert(std::is_same_v<nn::output_sample_t<nn::GlobalAvgPool, sample<4, 5, 5>>, sample<4>>);
  static_assert(std::is_same_v<nn::output_sample_t<nn::Flatten, sample<32, 5, 5>>, sample<800>>);
  static_assert(std::is_same_v<nn::output_sample_t<nn::Flatten, sample<32, dyn, 5>>, sample<dyn>>);
  static_assert(std::is_same_v<nn::output_sample_t<nn::Unflatten<1, 20, 20>, any_sample>, sample<1, 20, 20>>);
  static_assert(std::is_same_v<nn::output_sample_t<nn::ReLU, sample<3, 4, 4>>, sample<3, 4, 4>>);
  static_assert(std::is_same_v<nn::output_sample_t<nn::Dropout<0.1>, sample<3, 4, 4>>, sample<3, 4, 4>>);
  static_assert(std::is_same_v<nn::output_sample_t<nn::Conv2d<1, 16, 3>, any_sample>, sample<16, dyn, dyn>>);
  static_assert(std::is_same_v<nn::output_sample_t<DigitsCnn, any_sample>, sample<10>>);
  static_assert(DigitsCnn::in_features == 400 && DigitsCnn::out_features == 10);
  using Block = nn::Residual<nn::Sequential<nn::Conv2d<8, 8, 3, 1, 1>, nn::BatchNorm2d<8>, nn::ReLU>>;
  static_assert(std::is_same_v<nn::output_sample_t<Block, sample<8, 6, 6>>, sample<8, 6, 6>>);
  using Down = nn::Residual<nn::Sequential<nn::Conv2d<8, 16, 3, 2, 1>>, nn::Conv2d<8, 16, 1, 2>>;
  static_assert(std::is_same_v<nn::output_sample_t<Down, sample<8, 6, 6>>, sample<16, 3, 3>>);

  // The forward's variables carry the same static extents.
  CpuExecutor exec(1);
  Tape tape(exec);
  DigitsCnn model(1);
  ag::Var<float, host, dyn, 400> x(Tensor<float, host, dyn, 400>(Shape{2, 400}));
  auto y = model.forward(tape, x);
  static_assert(std::is_same_v<decltype(y), ag::Var<float, host, dyn, 10>>);
  CHECK(y.shape() == Shape{2, 10});
  CHECK(model.describe().find("Conv2d<1, 16, 3, pad 1> -> BatchNorm2d<16>+relu -> MaxPool2d<2>") != std::string::npos);
}

TEST_CASE("Conv2d's forward is the CPU convolution plus bias, and a fused activation applies to it") {
  CpuExecutor exec(2);
  Tape tape(exec);
  nn::Conv2d<3, 5, 3, 2, 1> conv(7);
  ag::Var<float, host, dyn, 3, 9, 11> x(Tensor<float, host, dyn, 3, 9, 11>(Shape{4, 3, 9, 11}));
  Generator gen(3);
  for (index_t i = 0; i < x.value().size(); ++i) x.value().data()[i] = gen.uniform(-2.f, 2.f);
  const auto y = conv.forward(tape, x);
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(y)>, ag::Var<float, host, dyn, 5, 5, 6>>);
  const cpu::Conv2dShape s{.n = 4, .c_in = 3, .h = 9, .w = 11, .c_out = 5, .kh = 3, .kw = 3, .stride_h = 2,
                           .stride_w = 2, .pad_h = 1, .pad_w = 1};
  std::vector<float> ref(std::size_t(y.value().size()));
  cpu::conv2d_forward(s, x.value().data(), conv.weight().value().data(), conv.bias().value().data(), ref.data(), 1);
  CHECK(std::equal(ref.begin(), ref.end(), y.value().data()));
  const auto z = conv.forward_fused<nn::ReLU>(tape, x);
  index_t negatives = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    negatives += ref[i] < 0;
    CHECK(z.value().data()[i] == std::max(ref[i], 0.0f));
  }
  CHECK(negatives > 0);  // the activation had something to do
  // Initial values follow PyTorch's bounds: |w|, |b| <= 1/sqrt(fan_in), fan_in = 3*3*3.
  const float bound = 1.0f / std::sqrt(27.0f);
  float wmax = 0;
  for (index_t i = 0; i < conv.weight().value().size(); ++i) wmax = std::max(wmax, std::abs(conv.weight().value().data()[i]));
  CHECK(wmax <= bound);
  CHECK(wmax > 0.8f * bound);
}

TEST_CASE("convolution, batch norm, pooling and residual layers pass gradcheck in fp64") {
  SUBCASE("Conv2d with bias, stride 2, padding 1") {
    nn::Sequential<nn::Unflatten<2, 5, 6>, nn::Conv2d<2, 3, 3, 2, 1, 1, true, double>> m(5);
    CHECK_GRADCHECK(gradcheck([&](Tape& t, In& x) { return m.forward(t, x[0]); }, {input(2, 60, 11)}, m.parameters()));
  }
  SUBCASE("Conv2d without bias, dilation 2, fused tanh") {
    nn::Sequential<nn::Unflatten<1, 7, 6>, nn::Conv2d<1, 2, 3, 1, 1, 2, false, double>, nn::Tanh> m(6);
    CHECK_GRADCHECK(gradcheck([&](Tape& t, In& x) { return m.forward(t, x[0]); }, {input(3, 42, 12)}, m.parameters()));
  }
  SUBCASE("BatchNorm2d in training mode, alone and fused with an activation") {
    nn::Sequential<nn::Unflatten<3, 4, 5>, nn::BatchNorm2d<3, double>> bn;
    CHECK_GRADCHECK(gradcheck([&](Tape& t, In& x) { return bn.forward(t, x[0]); }, {input(2, 60, 13)}, bn.parameters()));
    nn::Sequential<nn::Unflatten<3, 4, 5>, nn::BatchNorm2d<3, double>, nn::SiLU> fused;
    CHECK_GRADCHECK(
        gradcheck([&](Tape& t, In& x) { return fused.forward(t, x[0]); }, {input(2, 60, 14)}, fused.parameters()));
  }
  SUBCASE("BatchNorm2d in evaluation mode (running statistics as constants)") {
    nn::Sequential<nn::Unflatten<3, 4, 5>, nn::BatchNorm2d<3, double>, nn::GELU> bn;
    {
      CpuExecutor exec(1);
      Tape t(exec);
      auto warm = input(4, 60, 15, 0.5, 3.0);  // moves the running statistics off (0, 1)
      bn.forward(t, warm);
    }
    bn.eval();
    CHECK_GRADCHECK(gradcheck([&](Tape& t, In& x) { return bn.forward(t, x[0]); }, {input(2, 60, 16)}, bn.parameters()));
  }
  SUBCASE("MaxPool2d (overlapping windows, padding), AvgPool2d both divisors, GlobalAvgPool") {
    nn::Sequential<nn::Unflatten<2, 7, 8>, nn::MaxPool2d<3, 2, 1>> mp;
    CHECK_GRADCHECK(gradcheck([&](Tape& t, In& x) { return mp.forward(t, x[0]); }, {input(2, 112, 17)}));
    nn::Sequential<nn::Unflatten<2, 7, 8>, nn::AvgPool2d<3, 2, 1>> ap;
    CHECK_GRADCHECK(gradcheck([&](Tape& t, In& x) { return ap.forward(t, x[0]); }, {input(2, 112, 18)}));
    nn::Sequential<nn::Unflatten<2, 7, 8>, nn::AvgPool2d<3, 2, 1, false>> ap2;
    CHECK_GRADCHECK(gradcheck([&](Tape& t, In& x) { return ap2.forward(t, x[0]); }, {input(2, 112, 19)}));
    nn::Sequential<nn::Unflatten<2, 7, 8>, nn::GlobalAvgPool> gp;
    CHECK_GRADCHECK(gradcheck([&](Tape& t, In& x) { return gp.forward(t, x[0]); }, {input(3, 112, 20)}));
  }
  SUBCASE("Residual blocks, identity and projection shortcuts, inside a small ResNet with a loss") {
    using Body = nn::Sequential<nn::Conv2d<3, 3, 3, 1, 1, 1, true, double>, nn::BatchNorm2d<3, double>, nn::ReLU,
                                nn::Conv2d<3, 3, 3, 1, 1, 1, true, double>>;
    using Down = nn::Residual<nn::Sequential<nn::Conv2d<3, 4, 3, 2, 1, 1, true, double>>,
                              nn::Conv2d<3, 4, 1, 2, 0, 1, false, double>>;
    nn::Sequential<nn::Unflatten<3, 6, 6>, nn::Residual<Body>, Down, nn::GlobalAvgPool, nn::Linear<4, 3, true, double>>
        net(21);
    static const std::int32_t labels[2] = {2, 0};
    CHECK_GRADCHECK(gradcheck([&](Tape& t, In& x) { return nn::cross_entropy(t, net.forward(t, x[0]), labels); },
                              {input(2, 108, 22)}, net.parameters()));
  }
}

TEST_CASE("BatchNorm2d keeps PyTorch's running statistics and switches modes") {
  CpuExecutor exec(1);
  Tape tape(exec);
  nn::BatchNorm2d<2> bn;
  ag::Var<float, host, dyn, 2, 2, 2> x(Tensor<float, host, dyn, 2, 2, 2>(Shape{2, 2, 2, 2}));
  // Channel 0 holds 1..4 and 5..8 (mean 4.5, biased var 5.25); channel 1 is 10 everywhere.
  const float vals[16] = {1, 2, 3, 4, 10, 10, 10, 10, 5, 6, 7, 8, 10, 10, 10, 10};
  std::copy(vals, vals + 16, x.value().data());
  const auto y = bn.forward(tape, x);
  CHECK(bn.buffers().running_mean.data()[0] == doctest::Approx(0.45));
  CHECK(bn.buffers().running_var.data()[0] == doctest::Approx(0.9 + 0.1 * 5.25 * 8 / 7));
  CHECK(bn.buffers().running_mean.data()[1] == doctest::Approx(1.0));
  CHECK(bn.buffers().running_var.data()[1] == doctest::Approx(0.9));
  CHECK(bn.buffers().batches_tracked == 1);
  CHECK(y.value().data()[0] == doctest::Approx((1 - 4.5) / std::sqrt(5.25 + 1e-5)));
  CHECK(y.value().data()[4] == 0.0f);  // a constant channel normalises to beta
  bn.eval();
  const auto e = bn.forward(tape, x);
  CHECK(e.value().data()[0] == doctest::Approx((1 - 0.45) / std::sqrt(0.9 + 0.1 * 5.25 * 8 / 7 + 1e-5)));
  CHECK(bn.buffers().batches_tracked == 1);  // evaluation leaves the statistics alone
}

TEST_CASE("a CNN training step launches what the model's type predicts") {
  using Model = DigitsCnn;
  CpuExecutor exec(2);
  Model model(0);
  optim::AdamW opt(model, {.lr = 1e-3});
  train::Step step(model, opt, exec, policy<>{});
  kiln_step_test::OwnedBatch batch{std::vector<float>(32 * 400), std::vector<std::int32_t>(32), 400};
  Generator gen(4);
  for (float& v : batch.x) v = gen.uniform(-1.f, 1.f);
  for (std::size_t i = 0; i < batch.y.size(); ++i) batch.y[i] = std::int32_t(i % 10);
  step.record_next_step();
  for (int i = 0; i < 3; ++i) step(batch.batch());
  const auto rep = train::report(step);
  CHECK(rep.kernels_per_step == doctest::Approx(double(rep.predicted)));
  CHECK(rep.predicted > 0);
  const auto losses = step.take_losses(true);
  CHECK(losses.size() == 3);
}

TEST_CASE("a ResNet-9 (residual blocks, global pooling) trains a step with the predicted launches") {
  using Model = models::ResNet9<4>;  // width 4: the examples' network, small enough for a test
  static_assert(std::is_same_v<nn::output_sample_t<Model, nn::any_sample>, nn::sample<10>>);
  CpuExecutor exec(2);
  Model model(3);
  optim::AdamW opt(model, {.lr = 1e-3});
  train::Step step(model, opt, exec, policy<>{});
  kiln_step_test::OwnedBatch batch{std::vector<float>(4 * 3072), std::vector<std::int32_t>{1, 4, 7, 9}, 3072};
  Generator gen(8);
  for (float& v : batch.x) v = gen.uniform(-1.f, 1.f);
  const auto before = kiln_step_test::values_of(model);
  step.record_next_step();
  step(batch.batch());
  const auto rep = train::report(step);
  CHECK(rep.kernels_per_step == doctest::Approx(double(rep.predicted)));
  CHECK(kiln_step_test::values_of(model) != before);  // every layer's parameters reached the optimizer
  CHECK(std::isfinite(step.take_losses(true).at(0)));
}

TEST_CASE("convolutional layers reject inputs that do not fit, naming the shapes") {
  CpuExecutor exec(1);
  Tape tape(exec);
  nn::Conv2d<3, 4, 3> conv;
  ag::Var<float, host, dyn, dyn, dyn, dyn> wrong(Tensor<float, host, dyn, dyn, dyn, dyn>(Shape{1, 2, 5, 5}));
  CHECK_THROWS_WITH_AS(conv.forward(tape, wrong), doctest::Contains("[1, 2, 5, 5]"), ShapeError);
  ag::Var<float, host, dyn, dyn, dyn, dyn> small(Tensor<float, host, dyn, dyn, dyn, dyn>(Shape{1, 3, 2, 5}));
  CHECK_THROWS_AS(conv.forward(tape, small), ShapeError);
  nn::BatchNorm2d<4> bn;
  CHECK_THROWS_WITH_AS(bn.forward(tape, wrong), doctest::Contains("[N, 4, H, W]"), ShapeError);
  nn::Unflatten<1, 20, 20> unflatten;
  ag::Var<float, host, dyn, dyn> rows(Tensor<float, host, dyn, dyn>(Shape{2, 399}));
  CHECK_THROWS_WITH_AS(unflatten.forward(tape, rows), doctest::Contains("400"), ShapeError);
  CHECK_THROWS_AS(nn::BatchNorm2d<4>(1e-5, 1.5), ValueError);
}
