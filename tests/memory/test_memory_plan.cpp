// The memory planner (kiln/train/memory_plan.hpp) against what a training step really takes: this
// binary replaces the global operator new / delete with a counting allocator (every heap byte:
// tensors, optimizer state, tape nodes, scratch), and the plan must be within 10% of the peak
// the step reaches, for the digits MLP at batch 64 and 1024 (fp32, fused, AdamW). Its own
// executable (counting_new.cpp): the replacement would count every other suite's allocations too.
#include <doctest/doctest.h>

#include <kiln/train.hpp>
#include <kiln/models/resnet.hpp>
#include <kiln/train/memory_plan.hpp>

#include <cstdio>
#include <vector>

#include "counting_new.hpp"

using kiln_memory_test::heap_in_use;
using kiln_memory_test::heap_peak;
using kiln_memory_test::reset_heap_peak;

namespace {

using Mlp = kiln::nn::Sequential<kiln::nn::Linear<400, 256>, kiln::nn::ReLU, kiln::nn::Linear<256, 128>,
                                 kiln::nn::ReLU, kiln::nn::Linear<128, 10>>;

// The heap a model, its optimizer and its step reach over 3 training steps at `batch`, above
// what was in use before the model existed (the batch's own rows are made before).
template <class Policy>
std::size_t measured_peak(kiln::index_t batch, kiln::train::MemoryPlan& plan) {
  std::vector<float> x(static_cast<std::size_t>(batch * 400));
  std::vector<std::int32_t> y(static_cast<std::size_t>(batch));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(i % 17) / 17.f - 0.5f;
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = std::int32_t(i % 10);
  const std::size_t before = heap_in_use();
  reset_heap_peak();
  {
    kiln::CpuExecutor exec(1);
    Mlp model(0);
    kiln::optim::AdamW opt(model, {.lr = 1e-3});
    plan = kiln::train::plan_memory<kiln::optim::AdamW<>, Policy>(model, opt.options());
    kiln::train::Step step(model, opt, exec, Policy{});
    for (int s = 0; s < 3; ++s) step.run(x.data(), y.data(), batch, 400);
  }
  return heap_peak() - before;
}

}  // namespace

TEST_CASE("the memory plan of the digits MLP is within 10% of the peak a training step reaches") {
  for (kiln::index_t batch : {64, 1024}) {
    kiln::train::MemoryPlan plan;
    const std::size_t measured = measured_peak<kiln::policy<>>(batch, plan);
    const std::size_t predicted = plan.bytes_for(batch);
    const double error = (double(predicted) - double(measured)) / double(measured);
    std::printf("memory plan, batch %lld: predicted %zu bytes, measured peak %zu bytes (%+.1f%%)\n", (long long)batch,
                predicted, measured, 100 * error);
    CAPTURE(batch);
    CHECK(std::abs(error) <= 0.10);
  }
}

TEST_CASE("the plan's largest batch fits its budget and one more sample does not") {
  Mlp model(0);
  const auto plan = kiln::train::plan_memory<kiln::optim::AdamW<>>(model, {});
  const std::size_t budget = 64u << 20;
  const kiln::index_t b = plan.largest_batch(budget);
  CHECK(b > 0);
  CHECK(plan.bytes_for(b) <= budget);
  CHECK(plan.bytes_for(b + 1) > budget);
  CHECK(plan.largest_batch(plan.fixed()) == 0);
  CHECK(plan.str(64, budget).find("largest batch") != std::string::npos);
}

TEST_CASE("under bf16 mixed precision the plan is within 15% (activations in 2 bytes; float temporaries not modelled)") {
  for (kiln::index_t batch : {64, 1024}) {
    kiln::train::MemoryPlan plan;
    const std::size_t measured = measured_peak<kiln::policy<kiln::precision::bf16_mixed>>(batch, plan);
    const double error = (double(plan.bytes_for(batch)) - double(measured)) / double(measured);
    std::printf("memory plan, bf16_mixed, batch %lld: predicted %zu bytes, measured peak %zu bytes (%+.1f%%)\n",
                (long long)batch, plan.bytes_for(batch), measured, 100 * error);
    CAPTURE(batch);
    CHECK(std::abs(error) <= 0.15);
  }
}

namespace {

// ResNet-50's layout (Bottleneck blocks, projections, named stages) with one block per stage and
// two in layer4, at 64x64 — ResNet-50 itself at 224x224 is bench/memory_plan's, whose figures
// the README gives; this one compiles in half the time. Trained fully or fine-tuned (layer4 + fc
// trainable), for the planner's walk through Named stages of Residual blocks.
using ResNet = kiln::models::ResNet<kiln::models::Bottleneck, 1, 1, 1, 2, 10, 64>;

template <class Policy>
std::size_t resnet_peak(kiln::index_t batch, bool finetune, kiln::train::MemoryPlan& plan) {
  const kiln::index_t dim = ResNet::in_features;
  std::vector<float> x(static_cast<std::size_t>(batch * dim));
  std::vector<std::int32_t> y(static_cast<std::size_t>(batch), 3);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(i % 23) / 23.f - 0.5f;
  const std::size_t before = heap_in_use();
  reset_heap_peak();
  {
    kiln::CpuExecutor exec(1);
    ResNet model(0);
    if (finetune) {
      kiln::nn::freeze(model.layer<1>());
      kiln::nn::freeze(model.layer<2>());
      kiln::nn::freeze(model.layer<5>());
      kiln::nn::freeze(model.layer<6>());
      kiln::nn::freeze(model.layer<7>());
    }
    kiln::optim::AdamW opt(model, {.lr = 1e-3});
    plan = kiln::train::plan_memory<kiln::optim::AdamW<>, Policy>(model, opt.options());
    kiln::train::Step step(model, opt, exec, Policy{});
    for (int s = 0; s < 2; ++s) step.run(x.data(), y.data(), batch, dim);
  }
  return heap_peak() - before;
}

template <class Policy>
void check_resnet_plan() {
  for (bool finetune : {false, true})
    for (kiln::index_t batch : {2, 6}) {
      kiln::train::MemoryPlan plan;
      const std::size_t measured = resnet_peak<Policy>(batch, finetune, plan);
      const double error = (double(plan.bytes_for(batch)) - double(measured)) / double(measured);
      std::printf("memory plan, ResNet (Bottleneck 1-1-1-2) 64x64 %s, %s, batch %lld: predicted %zu bytes, measured peak %zu (%+.1f%%)\n",
                  finetune ? "fine-tune (layer4 + fc)" : "training", Policy::precision::name, (long long)batch,
                  plan.bytes_for(batch), measured, 100 * error);
      CAPTURE(finetune);
      CAPTURE(batch);
      CHECK(std::abs(error) <= 0.15);
    }
}

}  // namespace

TEST_CASE("the plan of a Bottleneck ResNet walks every depth: within 15% of the peak, trained or fine-tuned, fp32 and bf16") {
  check_resnet_plan<kiln::policy<>>();
  check_resnet_plan<kiln::policy<kiln::precision::bf16_mixed>>();
}

TEST_CASE("a fine-tune's plan counts no gradients or optimizer state for frozen layers, and fewer activations") {
  ResNet model(0);
  const auto full = kiln::train::plan_memory<kiln::optim::AdamW<>>(model, {});
  kiln::nn::freeze(model.layer<7>());
  const auto part = kiln::train::plan_memory<kiln::optim::AdamW<>>(model, {});
  CHECK(part.gradients < full.gradients);
  CHECK(part.optimizer < full.optimizer);
  CHECK(part.parameters == full.parameters);
  CHECK(part.per_sample == full.per_sample);  // layer1..2 below still train: everything is recorded
  kiln::nn::freeze(model.layer<1>());
  kiln::nn::freeze(model.layer<2>());
  kiln::nn::freeze(model.layer<5>());
  kiln::nn::freeze(model.layer<6>());
  const auto top = kiln::train::plan_memory<kiln::optim::AdamW<>>(model, {});
  // Only layer4 and the head keep activations; the frozen layers' largest transient stays
  // (training's own figure holds values — since batch norm outputs are made again in backward,
  // about three times fine-tuning's — and only the gradients alive at one step).
  MESSAGE("per sample: training ", full.per_sample, " bytes, layer4 + fc ", top.per_sample);
  CHECK(top.per_sample * 5 < full.per_sample * 2);
}
