// The memory planner (kiln/train/memory_plan.hpp) against what a training step really takes: this
// binary replaces the global operator new / delete with a counting allocator (every heap byte:
// tensors, optimizer state, tape nodes, scratch), and the plan must be within 10% of the peak
// the step reaches, for the digits MLP at batch 64 and 1024 (fp32, fused, AdamW). Its own
// executable (counting_new.cpp): the replacement would count every other suite's allocations too.
#include <doctest/doctest.h>

#include <kiln/train.hpp>
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
