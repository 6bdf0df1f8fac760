// Fine-tuning's pieces on small models (issue 29): a head sized at run time (Linear<In, dyn>),
// replacing a loaded model's head (load_weights with skip, then reset), and training only what is
// not frozen. ResNet-50 itself runs in examples/finetune_resnet and scripts/torch_resnet_interop.py.
#include <kiln/nn/named.hpp>
#include <kiln/train.hpp>
#include <kiln/train/checkpoint.hpp>

#include <doctest/doctest.h>

#include "data_helpers.hpp"
#include "step_helpers.hpp"

#include <filesystem>
#include <string>
#include <vector>

using namespace kiln;
namespace fs = std::filesystem;

TEST_CASE("Linear<In, dyn>: no outputs until reset, then what Linear<In, Out> draws from the same seed") {
  nn::Linear<4, dyn> head(1);
  CHECK(head.outputs() == 0);
  CHECK(head.describe() == "Linear<4, dyn = 0>");
  CpuExecutor exec(1);
  ag::Tape<CpuExecutor> tape(exec);
  ag::Var<float, host, dyn, 4> x(Tensor<float, host, dyn, 4>(Shape{2, 4}));
  CHECK_THROWS_WITH_AS(head.forward(tape, x), doctest::Contains("call reset(outputs, seed) first"), ValueError);
  head.reset(3, 7);
  const nn::Linear<4, 3> fixed(7);
  CHECK(head.outputs() == 3);
  CHECK(head.describe() == "Linear<4, dyn = 3>");
  CHECK(kiln_step_test::values_of(nn::Sequential<nn::Linear<4, dyn>>(nn::Linear<4, dyn>(head))) ==
        kiln_step_test::values_of(nn::Sequential<nn::Linear<4, 3>>(fixed)));
  for (index_t i = 0; i < x.value().size(); ++i) x.value().data()[i] = float(i) * 0.25f - 1.0f;
  const auto a = head.forward(tape, x);
  const auto b = fixed.forward(tape, x);
  CHECK(a.shape() == Shape{2, 3});
  CHECK(std::vector<float>(a.value().data(), a.value().data() + 6) == std::vector<float>(b.value().data(), b.value().data() + 6));
  CHECK_THROWS_AS(head.reset(0, 1), ValueError);
}

TEST_CASE("fine-tuning: a loaded model gets a new head for another class count and trains only it") {
  using Pretrained = nn::Sequential<nn::Named<"body", nn::Linear<12, 16>>, nn::ReLU, nn::Named<"fc", nn::Linear<16, 10>>>;
  using Tuned = nn::Sequential<nn::Named<"body", nn::Linear<12, 16>>, nn::ReLU, nn::Named<"fc", nn::Linear<16, dyn>>>;
  const fs::path dir = fs::temp_directory_path() / ("kiln_finetune_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "pretrained.safetensors").string();
  Pretrained pretrained(3);
  train::save_weights(path, pretrained);

  Tuned model(9);
  // The old head does not fit: the error names it; skipping "fc." loads the rest.
  kiln_test::check_data_error([&] { train::load_weights(path, model); }, path,
                              {"2 with another shape or dtype: fc.weight (model [0, 16] F32, file [10, 16] F32)"});
  const auto result = train::load_weights(path, model, {.skip = {"fc."}});
  CHECK(result.skipped == 4);
  model.layer<2>().reset(4, 11);
  CHECK(model.layer<2>().outputs() == 4);
  const auto body = kiln_step_test::values_of(nn::Sequential<nn::Linear<12, 16>>(model.layer<0>()));
  CHECK(body == kiln_step_test::values_of(nn::Sequential<nn::Linear<12, 16>>(pretrained.layer<0>())));

  nn::freeze(model.layer<0>());
  CpuExecutor exec(2);
  optim::AdamW opt(model, {.lr = 1e-2});
  train::Step step(model, opt, exec);
  auto batch = kiln_step_test::random_batch(16, 5);  // labels in [0, 4): the new head's classes
  for (int i = 0; i < 20; ++i) step(batch.batch());
  const auto losses = step.take_losses(true);
  CHECK(losses.back() < losses.front());
  CHECK(kiln_step_test::values_of(nn::Sequential<nn::Linear<12, 16>>(model.layer<0>())) == body);
  // What was trained saves and loads back by name (the head at its run-time size).
  const std::string tuned = (dir / "tuned.safetensors").string();
  train::save_weights(tuned, model);
  Tuned again(1);
  again.layer<2>().reset(4, 1);
  train::load_weights(tuned, again);
  CHECK(kiln_step_test::values_of(again) == kiln_step_test::values_of(model));
  fs::remove_all(dir);
}
