// Channels-last (nhwc) convolutional models (every layer's `with_layout`): the same values and
// gradients as their NCHW twins, fp64 gradcheck of the nhwc layers, a step's launch count and its
// losses against the NCHW step's. The NCHW cases are in test_convnet.cpp.
#include <kiln/models/convnets.hpp>
#include <kiln/train.hpp>

#include <doctest/doctest.h>

#include "gradcheck_helpers.hpp"
#include "step_helpers.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

using namespace kiln;
using Tape = ag::Tape<CpuExecutor>;
using In = std::vector<GradcheckInput>;
using kiln_gradcheck_test::input;
using DigitsCnn = models::DigitsCnn;

namespace {
// Every parameter's gradient after one backward of sum(model(x) * r), in for_each_parameter order.
template <class Model>
std::vector<double> forward_backward(Model& model, const std::vector<double>& x, index_t batch, std::vector<double>& out) {
  CpuExecutor exec(2);
  Tape tape(exec);
  ag::Var<double, host, dyn, Model::in_features> in(Tensor<double, host, dyn, Model::in_features>(Shape{batch, Model::in_features}));
  std::copy(x.begin(), x.end(), in.value().data());
  model.zero_grad();
  auto y = model.forward(tape, in);
  out.assign(y.value().data(), y.value().data() + y.value().size());
  Tensor<double, host, dyn, dyn> r(y.shape());
  Generator gen(99);
  for (index_t i = 0; i < r.size(); ++i) r.data()[i] = gen.uniform(-1.f, 1.f);
  auto loss = ag::sum(tape, ag::map(tape, y * r));
  tape.backward(loss);
  std::vector<double> grads;
  model.for_each_parameter([&](const auto& v) {
    grads.insert(grads.end(), v.grad().data(), v.grad().data() + v.value().size());
  });
  return grads;
}

// Equal up to fp64 summation order (the layouts sum a channel in different orders).
void check_same(const std::vector<double>& a, const std::vector<double>& b, const char* what) {
  kiln_gradcheck_test::check_same_up_to_order(a, b, 1e-10, what);
}
}  // namespace

TEST_CASE("channels-last (nhwc) models compute what their NCHW twins compute, values and gradients") {
  using Net = nn::Sequential<nn::Unflatten<3, 9, 8>, nn::Conv2d<3, 6, 3, 1, 1, 1, true, double>,
                             nn::BatchNorm2d<6, double>, nn::ReLU, nn::MaxPool2d<2>,
                             nn::Residual<nn::Sequential<nn::Conv2d<6, 6, 3, 1, 1, 1, true, double>, nn::BatchNorm2d<6, double>>>,
                             nn::Residual<nn::Sequential<nn::Conv2d<6, 8, 3, 2, 2, 2, true, double>, nn::SiLU>,
                                          nn::Conv2d<6, 8, 1, 2, 0, 1, false, double>>,
                             nn::AvgPool2d<2, 1, 1, false>, nn::Flatten, nn::Linear<72, 5, true, double>>;
  using NetLast = Net::with_layout<nn::layout::nhwc>;
  // with_layout rebinds every image layer and leaves the others alone.
  using L = nn::layout;
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(std::declval<NetLast&>().layer<1>())>,
                               nn::Conv2d<3, 6, 3, 1, 1, 1, true, double, host, L::nhwc>>);
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(std::declval<NetLast&>().layer<3>())>, nn::ReLU>);
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(std::declval<NetLast&>().layer<8>())>,
                               nn::FlattenLayout<L::nhwc>>);
  Net a(17);
  NetLast b(17);
  CHECK(a.describe().find("Conv2d<3, 6, 3, pad 1>") != std::string::npos);
  CHECK(b.describe().find("Conv2d[nhwc]<3, 6, 3, pad 1>") != std::string::npos);
  std::vector<double> x(4 * 216);
  Generator gen(5);
  for (double& v : x) v = gen.uniform(-2.f, 2.f);
  std::vector<double> ya, yb;
  const auto ga = forward_backward(a, x, 4, ya);
  const auto gb = forward_backward(b, x, 4, yb);
  check_same(ya, yb, "logits");
  check_same(ga, gb, "parameter gradients");
  a.eval();
  b.eval();
  forward_backward(a, x, 4, ya);
  forward_backward(b, x, 4, yb);
  check_same(ya, yb, "logits in evaluation mode");
}

TEST_CASE("channels-last layers pass gradcheck in fp64") {
  using Last = nn::Sequential<nn::Unflatten<3, 6, 5>, nn::Conv2d<3, 4, 3, 2, 1, 1, true, double>,
                              nn::BatchNorm2d<4, double>, nn::Tanh,
                              nn::Residual<nn::Sequential<nn::Conv2d<4, 4, 3, 1, 1, 1, false, double>>>,
                              nn::MaxPool2d<3, 1, 1>, nn::AvgPool2d<2, 1, 0, true>, nn::Flatten,
                              nn::Linear<16, 3, true, double>>::with_layout<nn::layout::nhwc>;
  Last net(23);
  static const std::int32_t labels[3] = {2, 0, 1};
  CHECK_GRADCHECK(gradcheck([&](Tape& t, In& x) { return nn::cross_entropy(t, net.forward(t, x[0]), labels); },
                            {input(3, 90, 24)}, net.parameters()));
  using Pool = nn::Sequential<nn::Unflatten<5, 3, 4>, nn::GlobalAvgPool>::with_layout<nn::layout::nhwc>;
  Pool gp;
  CHECK_GRADCHECK(gradcheck([&](Tape& t, In& x) { return gp.forward(t, x[0]); }, {input(2, 60, 25)}));
}

TEST_CASE("a channels-last CNN step launches what its type predicts and learns like the NCHW one") {
  using Model = DigitsCnn::with_layout<nn::layout::nhwc>;
  CpuExecutor exec(2);
  Model model(0);
  optim::AdamW opt(model, {.lr = 1e-3});
  train::Step step(model, opt, exec, policy<>{});
  kiln_step_test::OwnedBatch batch{std::vector<float>(16 * 400), std::vector<std::int32_t>(16), 400};
  Generator gen(4);
  for (float& v : batch.x) v = gen.uniform(-1.f, 1.f);
  for (std::size_t i = 0; i < batch.y.size(); ++i) batch.y[i] = std::int32_t(i % 10);
  step.record_next_step();
  for (int i = 0; i < 2; ++i) step(batch.batch());
  const auto rep = train::report(step);
  CHECK(rep.kernels_per_step == doctest::Approx(double(rep.predicted)));
  // The same two steps in NCHW give the same losses (fp32: up to summation order).
  DigitsCnn twin(0);
  optim::AdamW twin_opt(twin, {.lr = 1e-3});
  train::Step twin_step(twin, twin_opt, exec, policy<>{});
  for (int i = 0; i < 2; ++i) twin_step(batch.batch());
  const auto la = step.take_losses(true), lb = twin_step.take_losses(true);
  REQUIRE(la.size() == 2);
  REQUIRE(lb.size() == 2);
  for (int i = 0; i < 2; ++i) CHECK(la[std::size_t(i)] == doctest::Approx(lb[std::size_t(i)]).epsilon(1e-5));
}
