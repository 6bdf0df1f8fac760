// The MLP of tests/fixtures/golden_mlp.txt (scripts/golden_mlp.py, PyTorch, float32):
// Linear(12,16) -> ReLU -> Linear(16,8) -> GELU(erf) -> Linear(8,4), batch 5, cross-entropy
// with label_smoothing 0.1 (mean). Loss, every parameter's gradient, three AdamW steps; then
// CPU determinism: the same seed gives bit-identical parameters after a few steps.
#include <kiln.hpp>
#include <kiln/nn/activation.hpp>
#include <kiln/nn/dropout.hpp>
#include <kiln/nn/linear.hpp>
#include <kiln/nn/loss.hpp>
#include <kiln/nn/sequential.hpp>

#include <kiln/optim/adam.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fixture.hpp"

using namespace kiln;
using Tape = ag::Tape<CpuExecutor>;
using Mlp = nn::Sequential<nn::Linear<12, 16>, nn::ReLU, nn::Linear<16, 8>, nn::GELU, nn::Linear<8, 4>>;

namespace {

const kiln_test::FixtureBlock& golden(const std::string& name) { return kiln_test::golden_mlp().at(name); }

const char* const param_names[] = {"l0.weight", "l0.bias", "l1.weight", "l1.bias", "l2.weight", "l2.bias"};

void load(const Mlp& model) {
  const auto params = model.parameters();
  REQUIRE(params.size() == 6);
  for (std::size_t k = 0; k < 6; ++k) {
    const auto& b = golden(param_names[k]);
    REQUIRE(index_t(b.values.size()) == params[k].size);
    for (index_t i = 0; i < params[k].size; ++i) params[k].value[i] = float(b.values[std::size_t(i)]);
  }
}

ag::Var<float, host, dyn, 12> input() {
  const auto& b = golden("x");
  Tensor<float, host, dyn, 12> x(5, 12);
  for (index_t i = 0; i < 60; ++i) x.data()[i] = float(b.values[std::size_t(i)]);
  return ag::Var<float, host, dyn, 12>(std::move(x));
}

std::vector<std::int32_t> labels() {
  std::vector<std::int32_t> l;
  for (double v : golden("labels").values) l.push_back(std::int32_t(v));
  return l;
}

// One forward + backward; returns the loss.
float step(Mlp& model, CpuExecutor& exec, const ag::Var<float, host, dyn, 12>& x, const std::vector<std::int32_t>& y) {
  Tape tape(exec);
  model.zero_grad();
  auto loss = nn::cross_entropy(tape, model.forward(tape, x), y.data(), {.label_smoothing = 0.1});
  tape.backward(loss);
  return loss.value().data()[0];
}

// |got - want| <= atol + rtol * |want| for every element (fp32 tolerances).
void check_close(const float* got, const std::vector<double>& want, const std::string& what, double atol = 2e-6,
                 double rtol = 1e-4) {
  for (std::size_t i = 0; i < want.size(); ++i) {
    INFO(what << " element " << i << ": got " << got[i] << ", want " << want[i]);
    CHECK(std::abs(double(got[i]) - want[i]) <= atol + rtol * std::abs(want[i]));
  }
}

}  // namespace

TEST_CASE("golden MLP: loss and every parameter's gradient match PyTorch") {
  Mlp model;
  load(model);
  CpuExecutor exec;
  const float loss = step(model, exec, input(), labels());
  CHECK(loss == doctest::Approx(golden("loss0").values[0]).epsilon(1e-6));
  const auto params = model.parameters();
  for (std::size_t k = 0; k < 6; ++k) {
    REQUIRE(params[k].node->grad_valid);
    check_close(params[k].grad, golden(std::string("grad.") + param_names[k]).values, std::string("grad.") + param_names[k]);
  }
}

TEST_CASE("golden MLP: three AdamW steps match PyTorch (loss before each step, final parameters)") {
  Mlp model;
  load(model);
  CpuExecutor exec;
  const auto x = input();
  const auto y = labels();
  optim::AdamW opt(model.param_table(), {.lr = 1e-2, .weight_decay = 0.01});
  for (int s = 1; s <= 3; ++s) {
    CAPTURE(s);
    const float loss = step(model, exec, x, y);
    CHECK(loss == doctest::Approx(golden("adamw.loss" + std::to_string(s)).values[0]).epsilon(1e-5));
    opt.step(exec);
  }
  const auto params = model.parameters();
  for (std::size_t k = 0; k < 6; ++k)
    check_close(params[k].value, golden(std::string("adamw.") + param_names[k]).values,
                std::string("adamw.") + param_names[k], 1e-5, 1e-4);
}

TEST_CASE("CPU determinism: the same seed gives bit-identical parameters after a few steps") {
  using Net = nn::Sequential<nn::Linear<12, 32>, nn::GELU, nn::Dropout<>, nn::Linear<32, 16>, nn::SiLU,
                             nn::Linear<16, 4>>;
  auto train = [](std::uint64_t seed) {
    Net net(seed);
    CpuExecutor exec;
    optim::AdamW opt(net.param_table(), {.lr = 1e-2});
    const auto x = input();
    const auto y = labels();
    for (int s = 0; s < 4; ++s) {
      Tape tape(exec);
      net.zero_grad();
      auto loss = nn::cross_entropy(tape, net.forward(tape, x), y.data());
      tape.backward(loss);
      opt.step(exec);
    }
    std::vector<float> flat;
    for (const auto& p : net.parameters()) flat.insert(flat.end(), p.value, p.value + p.size);
    return flat;
  };
  const auto a = train(9), b = train(9), c = train(10);
  REQUIRE(a.size() == b.size());
  CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(a.data(), c.data(), a.size() * sizeof(float)) != 0);
}
