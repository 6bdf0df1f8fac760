// A Residual whose body ends in a batch norm runs its sum and activation in the normalising pass
// (nn/residual.hpp's fuses_into_norm, BatchNorm2d::forward_residual): the same values and
// gradients as the unfused form (stance::force_eager runs it: the batch norm, then the sum and
// ReLU as their own kernel), in both layouts, in training and evaluation mode, with and without a
// projection, with and without the ReLU; fp64 gradcheck; one kernel fewer forward.
#include <kiln/autograd/gradcheck.hpp>
#include <kiln/models/resnet.hpp>
#include <kiln/nn/loss.hpp>

#include <doctest/doctest.h>

#include "gradcheck_helpers.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

using namespace kiln;
using Tape = ag::Tape<CpuExecutor>;
using In = std::vector<GradcheckInput>;
using kiln_gradcheck_test::input;

namespace {

template <index_t I, index_t O, index_t K, index_t S = 1>
using Conv = nn::Conv2d<I, O, K, S, K / 2, 1, false, double>;
using BN4 = nn::BatchNorm2d<4, double>;
using BN6 = nn::BatchNorm2d<6, double>;

// ResNet's three kinds of block, small: identity shortcut with ReLU after the sum, a projection
// (stride 2), and a sum without activation.
using Basic = nn::Residual<nn::Sequential<Conv<4, 4, 3>, BN4, nn::ReLU, Conv<4, 4, 3>, BN4>, void, nn::ReLU>;
using Down = nn::Residual<nn::Sequential<Conv<4, 6, 3, 2>, BN6, nn::ReLU, Conv<6, 6, 1>, BN6>,
                          nn::Sequential<Conv<4, 6, 1, 2>, BN6>, nn::ReLU>;
using Plain = nn::Residual<nn::Sequential<Conv<6, 6, 3>, BN6>>;
using Net = nn::Sequential<nn::Unflatten<4, 6, 5>, Basic, Down, Plain, nn::GlobalAvgPool, nn::Linear<6, 3, true, double>>;
static_assert(Basic::fuses_into_norm && Down::fuses_into_norm && Plain::fuses_into_norm);
// A body that does not end in a batch norm, or an activation whose derivative needs the sum, keeps
// the separate kernel.
static_assert(!nn::Residual<nn::Sequential<Conv<4, 4, 3>>, void, nn::ReLU>::fuses_into_norm);
static_assert(!nn::Residual<nn::Sequential<Conv<4, 4, 3>, BN4>, void, nn::Tanh>::fuses_into_norm);
// ResNet-50's blocks fuse, and a projection's output (its batch norm's, read by nothing once
// summed) is freed after the sum.
static_assert(models::Bottleneck<256, 64, 1>::type::fuses_into_norm);
static_assert(models::Bottleneck<256, 128, 2>::type::projection_output_unread);
static_assert(Down::projection_output_unread && !Basic::projection_output_unread);

struct Run {
  std::vector<double> out, input_grad, param_grads;
  std::vector<std::string> kernels;
  std::size_t launches = 0;
};

// Forward, backward of sum(y * r) with fixed r, on a tape that fuses or not.
template <class M>
Run run(M& model, bool eager) {
  CpuExecutor exec(2);
  exec.stats().set_recording(true);
  Tape tape(exec, {.force_eager = eager});
  constexpr index_t batch = 3, features = 4 * 6 * 5;
  ag::Var<double, host, dyn, features> x(Tensor<double, host, dyn, features>(Shape{batch, features}), true);
  Generator gen(3);
  for (index_t i = 0; i < x.value().size(); ++i) x.value().data()[i] = gen.uniform(-2.f, 2.f);
  model.zero_grad();
  auto y = model.forward(tape, x);
  Tensor<double, host, dyn, dyn> r(y.shape());
  for (index_t i = 0; i < r.size(); ++i) r.data()[i] = gen.uniform(-1.f, 1.f);
  tape.backward(ag::sum(tape, ag::map(tape, y * r)));
  Run out;
  out.out.assign(y.value().data(), y.value().data() + y.value().size());
  out.input_grad.assign(x.grad().data(), x.grad().data() + x.grad().size());
  model.for_each_parameter([&](const auto& v) {
    out.param_grads.insert(out.param_grads.end(), v.grad().data(), v.grad().data() + v.value().size());
  });
  for (const auto& rec : exec.stats().records()) out.kernels.push_back(rec.name);
  out.launches = exec.stats().launches();
  return out;
}

void check_close(const std::vector<double>& a, const std::vector<double>& b, const char* what) {
  kiln_gradcheck_test::check_same_up_to_order(a, b, 1e-12, what);
}

std::size_t count(const std::vector<std::string>& names, const std::string& name) {
  return std::size_t(std::count(names.begin(), names.end(), name));
}

template <class M>
void check_fused_matches_unfused(M& model) {
  const Run fused = run(model, false), eager = run(model, true);
  check_close(fused.out, eager.out, "outputs");
  check_close(fused.input_grad, eager.input_grad, "input gradient");
  check_close(fused.param_grads, eager.param_grads, "parameter gradients");
  // Two blocks sum and ReLU inside the batch norm, one only sums; the unfused form runs none.
  CHECK(count(fused.kernels, "batch_norm+add+relu") == 2);
  CHECK(count(fused.kernels, "batch_norm+add") == 1);
  CHECK(count(eager.kernels, "batch_norm+add+relu") == 0);
  // The model's launch count follows: what fusing saved is what the prediction says it saves.
  const nn::LaunchContext c{.training = model.training(), .input_grad = true};
  nn::LaunchContext ce = c;
  ce.eager = true;
  CHECK(eager.launches - fused.launches == std::size_t(M::launches(ce).total() - M::launches(c).total()));
}

}  // namespace

TEST_CASE("residual blocks ending in a batch norm sum and activate in its pass, as the unfused form computes") {
  SUBCASE("nchw") {
    Net net(7);
    check_fused_matches_unfused(net);
    net.eval();
    check_fused_matches_unfused(net);
  }
  SUBCASE("nhwc") {
    Net::with_layout<nn::layout::nhwc> net(7);
    check_fused_matches_unfused(net);
    net.eval();
    check_fused_matches_unfused(net);
  }
}

TEST_CASE("residual blocks fused into their batch norm pass gradcheck in fp64, both layouts, train and eval") {
  static const std::int32_t labels[2] = {2, 0};
  Net a(11);
  Net::with_layout<nn::layout::nhwc> b(11);
  for (bool training : {true, false}) {
    a.train(training);
    b.train(training);
    CAPTURE(training);
    const auto ra = gradcheck([&](Tape& t, In& x) { return nn::cross_entropy(t, a.forward(t, x[0]), labels); },
                              {input(2, 120, 12)}, a.parameters());
    CHECK_MESSAGE(ra.ok, ra.report);
    const auto rb = gradcheck([&](Tape& t, In& x) { return nn::cross_entropy(t, b.forward(t, x[0]), labels); },
                              {input(2, 120, 13)}, b.parameters());
    CHECK_MESSAGE(rb.ok, rb.report);
  }
}
