// nn::Repeat (kiln/nn/repeat.hpp) and the ResNets built from it (kiln/models/resnet.hpp): a
// Repeat computes what the Sequential of its blocks computes — the same initial parameters from
// one seed, the same forward, the same gradients, the same launches and state_dict names — and a
// ResNet-50 has torchvision's parameter count and trains a step with the launches its type
// predicts.
#include <kiln/models/resnet.hpp>
#include <kiln/autograd/gradcheck.hpp>
#include <kiln/io/model_state.hpp>
#include <kiln/io/safetensors.hpp>
#include <kiln/io/state_dict.hpp>
#include <kiln/nn/repeat.hpp>
#include <kiln/nn/summary.hpp>
#include <kiln/train.hpp>

#include <doctest/doctest.h>

#include "step_helpers.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <type_traits>
#include <vector>

using namespace kiln;

namespace {

// A block that keeps its shape (a residual MLP), and a first block that changes it.
using Block = nn::Residual<nn::Sequential<nn::Linear<8, 8>, nn::ReLU, nn::Linear<8, 8>>>;
using First = nn::Sequential<nn::Linear<6, 8>, nn::ReLU>;
using Repeated = nn::Sequential<nn::Repeat<4, Block, First>, nn::Linear<8, 3>>;
using Written = nn::Sequential<nn::Sequential<First, Block, Block, Block>, nn::Linear<8, 3>>;

std::vector<std::string> state_names(auto& model) {
  std::vector<std::string> out;
  io::for_each_state(model, [&](const std::string& name, auto&, io::state_kind) { out.push_back(name); });
  return out;
}

// The outputs and every parameter's gradient after one backward of sum(model(x) * r).
template <class Model>
std::vector<double> outputs_and_gradients(Model& model) {
  CpuExecutor exec(2);
  ag::Tape<CpuExecutor> tape(exec);
  ag::Var<double, host, dyn, 6> x(Tensor<double, host, dyn, 6>(Shape{5, 6}));
  Generator gen(11);
  for (index_t i = 0; i < x.value().size(); ++i) x.value().data()[i] = gen.uniform(-1.f, 1.f);
  model.zero_grad();
  auto y = model.forward(tape, x);
  std::vector<double> out(y.value().data(), y.value().data() + y.value().size());
  Tensor<double, host, dyn, dyn> r(y.shape());
  for (index_t i = 0; i < r.size(); ++i) r.data()[i] = gen.uniform(-1.f, 1.f);
  tape.backward(ag::sum(tape, ag::map(tape, y * r)));
  model.for_each_parameter(
      [&](const auto& v) { out.insert(out.end(), v.grad().data(), v.grad().data() + v.value().size()); });
  return out;
}

}  // namespace

TEST_CASE("a Repeat computes what the Sequential of its blocks computes") {
  static_assert(std::is_same_v<nn::output_sample_t<nn::Repeat<4, Block, First>, nn::any_sample>, nn::sample<8>>);
  static_assert(Repeated::in_features == 6 && Repeated::out_features == 3);
  static_assert(nn::Repeat<4, Block, First>::parameter_tensors == 2 + 3 * 4);

  Repeated repeated(7);
  Written written(7);
  // The same numbers from one seed, in the same order, under the same names.
  CHECK(kiln_step_test::values_of(repeated) == kiln_step_test::values_of(written));
  const auto names = state_names(repeated);
  CHECK(names == state_names(written));
  CHECK(names.front() == "0.0.0.weight");
  CHECK(names.at(2) == "0.1.body.0.weight");
  CHECK(names.back() == "1.bias");
  CHECK(repeated.parameter_count() == written.parameter_count());
  CHECK(repeated.describe().find("Linear<6, 8>+relu] -> 3 x Residual(") != std::string::npos);

  // Launches: what the type predicts, the same as the written-out model's.
  for (bool eager : {false, true}) {
    const nn::LaunchContext c{.eager = eager};
    CHECK(Repeated::launches(c) == Written::launches(c));
    CHECK(repeated.launches_now(c) == written.launches_now(c));
  }
}

TEST_CASE("a Repeat's forward and gradients equal the written-out model's, in fp64") {
  using L64 = nn::Linear<8, 8, true, double>;
  using B64 = nn::Residual<nn::Sequential<L64, nn::ReLU, L64>>;
  using F64 = nn::Sequential<nn::Linear<6, 8, true, double>, nn::ReLU>;
  nn::Sequential<nn::Repeat<3, B64, F64>, nn::Linear<8, 3, true, double>> repeated(5);
  nn::Sequential<nn::Sequential<F64, B64, B64>, nn::Linear<8, 3, true, double>> written(5);
  const auto a = outputs_and_gradients(repeated);
  const auto b = outputs_and_gradients(written);
  REQUIRE(a.size() == b.size());
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(a[i]));
  }
  CHECK(scale > 0);
  CHECK(worst == 0.0);  // the same operations in the same order
}

TEST_CASE("a Repeat's blocks follow train / eval and freezing, and its step launches what it predicts") {
  Repeated model(3);
  model.eval();
  CHECK(!model.layer<0>().training());
  model.train();
  nn::freeze(model.layer<0>().first());
  CHECK(model.trainable_parameter_count() < model.parameter_count());
  CpuExecutor exec(2);
  optim::AdamW opt(model, {.lr = 1e-2});
  train::Step step(model, opt, exec);
  kiln_step_test::OwnedBatch batch{std::vector<float>(8 * 6), std::vector<std::int32_t>(8), 6};
  Generator gen(2);
  for (float& v : batch.x) v = gen.uniform(-1.f, 1.f);
  for (std::size_t i = 0; i < batch.y.size(); ++i) batch.y[i] = std::int32_t(i % 3);
  const auto frozen_before = kiln_step_test::values_of(model.layer<0>().first());
  step.record_next_step();
  for (int i = 0; i < 4; ++i) step(batch.batch());
  const auto losses = step.take_losses(true);
  CHECK(losses.back() < losses.front());
  CHECK(kiln_step_test::values_of(model.layer<0>().first()) == frozen_before);
  const auto rep = train::report(step);
  CHECK(rep.kernels_per_step == doctest::Approx(double(rep.predicted)));
}

TEST_CASE("ResNet-18 and ResNet-50 have torchvision's parameter counts and layout") {
  // torchvision.models.resnet18() / resnet50(): 11,689,512 and 25,557,032 parameters.
  CHECK(models::ResNet18<>(0).parameter_count() == 11689512);
  CHECK(models::ResNet50<>(0).parameter_count() == 25557032);
  using R50 = models::ResNet50<10, 32>;
  static_assert(std::is_same_v<nn::output_sample_t<R50, nn::any_sample>, nn::sample<10>>);
  // layer2's first block: the 3x3 convolution takes the stride (v1.5) and a projection the shape.
  using Layer2 = std::remove_cvref_t<decltype(std::declval<R50&>().layer<6>())>;
  static_assert(Layer2::count == 4);
  static_assert(std::is_same_v<nn::output_sample_t<Layer2, nn::sample<256, 8, 8>>, nn::sample<512, 4, 4>>);
}

TEST_CASE("a ResNet-50 trains a step on the CPU with the launches its type predicts") {
  using Model = models::ResNet50<10, 32>;
  CpuExecutor exec(2);
  Model model(1);
  optim::AdamW opt(model, {.lr = 1e-3});
  train::Step step(model, opt, exec);
  kiln_step_test::OwnedBatch batch{std::vector<float>(2 * 3 * 32 * 32), std::vector<std::int32_t>{3, 8}, 3 * 32 * 32};
  Generator gen(6);
  for (float& v : batch.x) v = gen.uniform(-1.f, 1.f);
  const auto before = kiln_step_test::values_of(model);
  step.record_next_step();
  step(batch.batch());
  const auto rep = train::report(step);
  CHECK(rep.predicted > 0);
  CHECK(rep.kernels_per_step == doctest::Approx(double(rep.predicted)));
  CHECK(kiln_step_test::values_of(model) != before);
  CHECK(std::isfinite(step.take_losses(true).at(0)));
}

namespace {
// (name, dtype, dims) of each tensor of torchvision's `arch` state_dict, from
// tests/fixtures/resnet_state_names.txt (scripts/golden_resnet_names.py).
std::vector<std::string> torchvision_state(const std::string& arch) {
  std::ifstream in(std::string(KILN_SOURCE_DIR) + "/tests/fixtures/resnet_state_names.txt");
  REQUIRE(in);
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(arch + " ", 0) == 0) out.push_back(line.substr(arch.size() + 1));
  return out;
}
template <class Model>
std::vector<std::string> kiln_state(const Model& model) {
  std::vector<std::string> out;
  for (const auto& t : io::model_state(model).tensors) {
    std::string line = t.name + " " + io::safetensors_name(t.type);
    for (int i = 0; i < t.shape.rank; ++i) line += " " + std::to_string(t.shape[i]);
    out.push_back(line);
  }
  return out;
}
}  // namespace

TEST_CASE("ResNet-18 and ResNet-50 walk to torchvision's state_dict names, shapes and dtypes, in order") {
  const auto r18 = torchvision_state("resnet18");
  const auto r50 = torchvision_state("resnet50");
  REQUIRE(r18.size() == 122);
  REQUIRE(r50.size() == 320);
  CHECK(kiln_state(models::ResNet18<>(0)) == r18);
  CHECK(kiln_state(models::ResNet50<>(0)) == r50);
}

TEST_CASE("nn::Named gives a layer its torch name at any depth; unnamed layers keep their positions") {
  using Body = nn::Sequential<nn::Named<"fc1", nn::Linear<4, 4>>, nn::ReLU, nn::Linear<4, 4>>;
  using Model = nn::Sequential<nn::Named<"stem", nn::Linear<3, 4>>, nn::Residual<Body, void, nn::ReLU>,
                               nn::Named<"block", nn::Residual<Body, nn::Named<"proj", nn::Linear<4, 4>>>>,
                               nn::Named<"trunk", nn::Repeat<2, nn::Residual<Body>>>, nn::Linear<4, 2>>;
  Model model(1);
  CHECK(state_names(model) == std::vector<std::string>{
                                  "stem.weight",         "stem.bias",           "1.fc1.weight",         "1.fc1.bias",
                                  "1.body.2.weight",     "1.body.2.bias",       "block.fc1.weight",     "block.fc1.bias",
                                  "block.body.2.weight", "block.body.2.bias",   "block.proj.weight",    "block.proj.bias",
                                  "trunk.0.fc1.weight",  "trunk.0.fc1.bias",    "trunk.0.body.2.weight", "trunk.0.body.2.bias",
                                  "trunk.1.fc1.weight",  "trunk.1.fc1.bias",    "trunk.1.body.2.weight", "trunk.1.body.2.bias",
                                  "4.weight",            "4.bias"});
  // A name changes nothing else: the same numbers from one seed as the unnamed model.
  using Plain = nn::Sequential<nn::Linear<3, 4>, nn::Residual<nn::Sequential<nn::Linear<4, 4>, nn::ReLU, nn::Linear<4, 4>>,
                                                              void, nn::ReLU>,
                               nn::Residual<nn::Sequential<nn::Linear<4, 4>, nn::ReLU, nn::Linear<4, 4>>, nn::Linear<4, 4>>,
                               nn::Repeat<2, nn::Residual<nn::Sequential<nn::Linear<4, 4>, nn::ReLU, nn::Linear<4, 4>>>>,
                               nn::Linear<4, 2>>;
  Plain plain(1);
  CHECK(kiln_step_test::values_of(model) == kiln_step_test::values_of(plain));
  static_assert(Model::launches(nn::LaunchContext{}) == Plain::launches(nn::LaunchContext{}));
  CHECK(model.describe().find("stem: Linear<3, 4>") != std::string::npos);
}

TEST_CASE("a Residual with an activation computes act(body + shortcut) in one pass, gradients to fp64 differences") {
  using L64 = nn::Linear<5, 5, true, double>;
  using Body = nn::Sequential<L64, nn::Tanh, L64>;
  nn::Sequential<nn::Residual<Body, L64, nn::ReLU>> block(3);
  nn::Sequential<nn::Residual<Body, L64>> plain(3);
  CpuExecutor exec(1);
  ag::Tape<CpuExecutor> tape(exec);
  auto make_input = [] {
    HostMatrix<double> m(4, 5);
    Generator gen(4);
    for (index_t i = 0; i < m.size(); ++i) m.data()[i] = gen.uniform(-1.f, 1.f);
    return m;
  };
  ag::Var<double, host, dyn, dyn> x(make_input());
  const auto y = block.forward(tape, x);
  const auto z = plain.forward(tape, x);  // the same without the activation
  int negatives = 0;
  for (index_t i = 0; i < y.value().size(); ++i) {
    CHECK(y.value().data()[i] == std::max(0.0, z.value().data()[i]));
    negatives += z.value().data()[i] < 0 ? 1 : 0;
  }
  CHECK(negatives > 0);  // the ReLU had something to do
  // The activation rides the sum's kernel: no launch more than the plain Residual.
  static_assert(decltype(block)::launches(nn::LaunchContext{}) == decltype(plain)::launches(nn::LaunchContext{}));
  const auto r = gradcheck([&](ag::Tape<CpuExecutor>& t, std::vector<GradcheckInput>& in) { return block.forward(t, in[0]); },
                           {GradcheckInput(make_input(), true)}, block.parameters());
  CHECK_MESSAGE(r.ok, r.report);
}

TEST_CASE("nn::summary: ResNet-50 as a tree with per-layer output shapes and parameter counts") {
  const models::ResNet50<> model(0);
  const std::string top = nn::summary(model, 1);
  CAPTURE(top);
  CHECK(top.find("├─ conv1 Conv2d<3, 64, 7, stride 2, pad 3, no bias>  [64, 112, 112]") != std::string::npos);
  CHECK(top.find("├─ bn1 BatchNorm2d<64>+relu") != std::string::npos);
  CHECK(top.find("├─ layer4 Repeat x3") != std::string::npos);
  CHECK(top.find("[2048, 7, 7]    14,964,736") != std::string::npos);
  CHECK(top.find("├─ fc Linear<2048, 1000>") != std::string::npos);
  CHECK(top.find("total 25,557,032 parameters\n") != std::string::npos);
  CHECK(std::count(top.begin(), top.end(), '\n') == 13);  // header, model, 10 layers, total
  const std::string deep = nn::summary(model, 3);
  CHECK(deep.find("│  │  ├─ conv2 Conv2d<128, 128, 3, stride 2, pad 1, no bias>  [128, 28, 28]") != std::string::npos);
  CHECK(deep.find("│  │  ├─ downsample Sequential") != std::string::npos);
  // A frozen part is counted in the total line.
  models::ResNet50<> frozen(0);
  nn::freeze(frozen.layer<5>());
  CHECK(nn::summary(frozen, 1).find("total 25,557,032 parameters, 25,341,224 trainable") != std::string::npos);
}
