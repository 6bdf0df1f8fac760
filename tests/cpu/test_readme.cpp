// The README's snippets, compiled and checked so they never rot; and the README's copies of them
// must equal these (the last test case compares the text).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "kiln.hpp"
#include "kiln/models/resnet.hpp"
#include "kiln/nn/freeze.hpp"
#include "kiln/optim/adam.hpp"
#include "kiln/train/memory_plan.hpp"
#include "kiln/nn/activation.hpp"
#include "kiln/nn/linear.hpp"
#include "kiln/nn/loss.hpp"
#include "kiln/nn/sequential.hpp"

TEST_CASE("readme: fused expression") {
  // example-begin fused
  kiln::CpuExecutor exec;
  kiln::Tensor<float, kiln::host, kiln::dyn, 4> x(3, 4), y(3, 4);
  kiln::Tensor<float, kiln::host, 4> bias;
  kiln::assign(x, 1.5f, exec);
  kiln::assign(bias, 0.25f, exec);
  exec.stats().reset();
  // ((x·2 + bias) max 0)·3 − 1 : one kernel, bias broadcast over the rows.
  kiln::assign(y, kiln::maximum(x * 2.0f + bias, 0.0f) * 3.0f - 1.0f, exec);
  CHECK(exec.stats().launches() == 1);
  CHECK(y(2, 3) == doctest::Approx(8.75f));
  // The same expression, one kernel per node: the baseline fusion is measured against.
  kiln::assign<kiln::stance::force_eager>(y, kiln::maximum(x * 2.0f + bias, 0.0f) * 3.0f - 1.0f, exec);
  CHECK(exec.stats().launches() == 1 + 5);
  // example-end fused
}

// example-begin activation-functor
// softsign(x) = x / (1 + |x|): a value and its derivative, for host and device.
struct Softsign {
  static constexpr const char* name = "softsign";
  template <class T>
  KILN_HOST_DEVICE T operator()(T x) const {
    return x / (T(1) + (x < T(0) ? -x : x));
  }
  template <class T>
  KILN_HOST_DEVICE T d(T x) const {
    const T a = T(1) + (x < T(0) ? -x : x);
    return T(1) / (a * a);
  }
};
// example-end activation-functor

TEST_CASE("readme: an activation of your own, and two losses backwarded in turn") {
  // example-begin activation-model
  using Model = kiln::nn::Sequential<kiln::nn::Linear<4, 8>, kiln::nn::Activation<Softsign>, kiln::nn::Linear<8, 3>>;
  Model model(/*seed=*/1);
  kiln::CpuExecutor exec;
  kiln::ag::Tape tape(exec);
  kiln::ag::Var<float, kiln::host, kiln::dyn, 4> x(kiln::Tensor<float, kiln::host, kiln::dyn, 4>(2, 4));
  kiln::assign(x.value(), 0.5f, exec);
  exec.stats().set_recording(true);
  auto logits = model.forward(tape, x);  // Linear + softsign: ONE GEMM with the activation in its epilogue
  CHECK(exec.stats().records()[0].name == "gemm+bias+softsign");
  const std::int32_t a_labels[2] = {0, 2}, b_labels[2] = {1, 1};
  auto la = kiln::nn::cross_entropy(tape, logits, a_labels);
  auto lb = kiln::nn::cross_entropy(tape, logits, b_labels);
  model.zero_grad();
  tape.backward(la);  // runs la's graph; the shared part stays for lb
  tape.backward(lb);  // the gradients now equal those of la + lb
  CHECK(model.layer<0>().weight().has_grad());
  CHECK(la.item() > 0.0f);
  // example-end activation-model
}

TEST_CASE("readme: planning a ResNet-50 fine-tune") {
  // example-begin finetune-plan
  using Net = kiln::models::ResNet50<kiln::dyn, 224>;  // torchvision's layout and state_dict names
  Net model(/*seed=*/0);
  // kiln::train::load_weights("resnet50.safetensors", model, {.skip = {"fc."}});  // torchvision's weights
  model.layer<10>().reset(/*classes=*/5, /*seed=*/1);  // the new head: fc is a Linear<2048, dyn>
  kiln::nn::freeze(model.layer<1>());  // conv1, bn1, layer1..layer3 frozen:
  kiln::nn::freeze(model.layer<2>());  // no gradients, no optimizer state, running statistics only
  kiln::nn::freeze(model.layer<5>());
  kiln::nn::freeze(model.layer<6>());
  kiln::nn::freeze(model.layer<7>());  // layer4 and fc train
  kiln::optim::AdamW opt(model, {.lr = 3e-4});
  const auto plan = kiln::train::plan_memory<kiln::optim::AdamW<>, kiln::policy<kiln::precision::bf16_mixed>>(
      model, opt.options());
  std::printf("%s", plan.str(/*batch=*/32).c_str());
  const kiln::index_t fits = plan.largest_batch(std::size_t{8} << 30);  // the largest batch in 8 GiB
  CHECK(fits > 32);
  // example-end finetune-plan
  CHECK(plan.per_sample < 20u << 20);  // fine-tuning keeps layer4's activations only
}

namespace {
// The blocks between `// example-begin NAME` and `// example-end NAME` lines, each line stripped of
// the block's common indentation.
std::map<std::string, std::string> blocks(const std::string& path) {
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "cannot open ", path);
  std::map<std::string, std::string> out;
  std::string line, name;
  std::vector<std::string> lines;
  const std::string begin_mark = "// example-begin ", end_mark = "// example-end ";
  while (std::getline(in, line)) {
    const std::size_t first = line.find_first_not_of(' ');
    const std::string trimmed = first == std::string::npos ? "" : line.substr(first);
    if (trimmed.rfind(begin_mark, 0) == 0) {
      name = trimmed.substr(begin_mark.size());
      lines.clear();
    } else if (trimmed.rfind(end_mark, 0) == 0 && !name.empty()) {
      std::size_t indent = std::string::npos;
      for (const auto& l : lines)
        if (l.find_first_not_of(' ') != std::string::npos) indent = std::min(indent, l.find_first_not_of(' '));
      std::string text;
      for (const auto& l : lines) text += (l.size() > indent ? l.substr(indent) : std::string()) + "\n";
      out[name] = text;
      name.clear();
    } else if (!name.empty()) {
      lines.push_back(line);
    }
  }
  return out;
}
}  // namespace

TEST_CASE("readme: every snippet in README.md is this file's text") {
  const auto readme = blocks(std::string(KILN_SOURCE_DIR) + "/README.md");
  const auto tests = blocks(std::string(KILN_SOURCE_DIR) + "/tests/cpu/test_readme.cpp");
  CHECK(readme.size() >= 3);
  for (const auto& [name, text] : readme) {
    CAPTURE(name);
    REQUIRE(tests.count(name) == 1);
    CHECK(text == tests.at(name));
  }
}
