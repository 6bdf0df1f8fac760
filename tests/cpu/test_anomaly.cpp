// Anomaly mode (autograd/anomaly.hpp): a NaN injected into one layer is reported at that layer,
// forward or backward, with the step; off, the same run goes on silently; the setting is scoped.
#include <kiln/train.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>

#include "step_helpers.hpp"

using namespace kiln;

namespace {

using kiln_step_test::OwnedBatch;
using kiln_step_test::random_batch;

// The identity forward whose derivative is NaN: a finite forward and a poisoned backward.
struct NanGrad {
  static constexpr const char* name = "nan_grad";
  template <class T>
  KILN_HOST_DEVICE T operator()(T x) const {
    return x;
  }
  template <class T>
  KILN_HOST_DEVICE T d(T) const {
    return T(std::numeric_limits<float>::quiet_NaN());
  }
};

using Mlp = nn::Sequential<nn::Linear<12, 16>, nn::ReLU, nn::Linear<16, 8>, nn::ReLU, nn::Linear<8, 4>>;
using Poisoned = nn::Sequential<nn::Linear<12, 16>, nn::ReLU, nn::Linear<16, 8>, nn::Activation<NanGrad>,
                                nn::Linear<8, 4>>;

template <class F>
std::string numeric_error(F f) {
  try {
    f();
  } catch (const NumericError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("anomaly mode names the layer whose forward made a NaN, and the step") {
  CpuExecutor exec(1);
  Mlp model(1);
  optim::AdamW opt(model, {.lr = 1e-2});
  train::Step step(model, opt, exec);
  OwnedBatch b = random_batch(6, 2);
  step(b.batch());
  step(b.batch());
  // Poison one weight of the middle Linear: its output (and all after it) turns NaN.
  float* w = model.layer<2>().weight().value().data();
  w[5] = std::numeric_limits<float>::quiet_NaN();
  {
    ag::DetectAnomaly on;
    const std::string message = numeric_error([&] { step(b.batch()); });
    CAPTURE(message);
    CHECK(message.find("anomaly mode: the forward of layer 2 (Linear<16, 8>+relu)") != std::string::npos);
    CHECK(message.find("of its output [6, 8]") != std::string::npos);
    CHECK(message.find("optimizer step 3, micro-batch 3") != std::string::npos);
  }
  CHECK(!ag::detect_anomaly());  // the scope put the setting back
  // Off: the step runs, and the NaN only shows in the loss.
  CHECK_NOTHROW(step(b.batch()));
  CHECK(std::isnan(step.take_losses().back()));
}

TEST_CASE("anomaly mode names the layer whose backward made a NaN") {
  CpuExecutor exec(1);
  Poisoned model(1);
  optim::AdamW opt(model, {.lr = 1e-2});
  for (const char* stance : {"fused", "force_eager"}) {
    CAPTURE(stance);
    ag::Tape<CpuExecutor> tape(exec, {.force_eager = std::string(stance) == "force_eager"});
    OwnedBatch b = random_batch(5, 3);
    Tensor<float, host, dyn, 12> xt(5, 12);
    std::copy(b.x.begin(), b.x.end(), xt.data());
    const ag::Var<float, host, dyn, 12> x(std::move(xt));
    ag::DetectAnomaly on;
    model.zero_grad();
    auto loss = nn::cross_entropy(tape, model.forward(tape, x), b.y.data());
    CHECK(std::isfinite(loss.item()));  // the forward is clean
    const std::string message = numeric_error([&] { tape.backward(loss); });
    CAPTURE(message);
    CHECK(message.find("anomaly mode: the backward of layer 2 (Linear<16, 8>+nan_grad)") != std::string::npos);
  }
  // Off: backward runs through and leaves NaN gradients behind, unreported.
  ag::Tape<CpuExecutor> tape(exec);
  OwnedBatch b = random_batch(5, 3);
  Tensor<float, host, dyn, 12> xt(5, 12);
  std::copy(b.x.begin(), b.x.end(), xt.data());
  const ag::Var<float, host, dyn, 12> x(std::move(xt));
  (void)model.parameters();
  model.zero_grad();
  auto loss = nn::cross_entropy(tape, model.forward(tape, x), b.y.data());
  CHECK_NOTHROW(tape.backward(loss));
  CHECK(std::isnan(model.layer<0>().weight().data()->grad.data()[0]));
}

TEST_CASE("anomaly mode stays quiet on a clean step") {
  CpuExecutor exec(1);
  Mlp model(4);
  optim::AdamW opt(model, {.lr = 1e-2});
  train::Step step(model, opt, exec, kiln::policy<kiln::stance::force_eager>{});
  ag::DetectAnomaly on;
  OwnedBatch b = random_batch(6, 9);
  for (int s = 0; s < 3; ++s) CHECK_NOTHROW(step(b.batch()));
}
