// What the CUDA Step suites share (test_cuda_step*.cu): a small MLP, a dataset, and the same
// five optimizer steps trained in either space, compared parameter by parameter. The suites are
// split by precision so that no one translation unit instantiates every policy: the GPU check's
// build is bound by its slowest file.
//
// kiln::train::Step on the CUDA executor against the same step on the CPU: every precision and
// stance trains the MLP to the same parameters within tolerance (the device's GEMMs sum in other
// orders, and its bf16 / f16 GEMMs are real half-precision tensor-core products, where the CPU
// rounds emulated values), runs exactly the launches predicted at compile time for kiln::cuda,
// and a gradient poisoned with inf is skipped on the device.
//
// Tolerances: after five AdamW steps the parameters agree to 2e-4 (fp32, tf32 to 2e-2: TF32
// keeps 10 mantissa bits), 3e-2 (bf16) and 5e-3 (fp16) in max absolute difference; the
// parameters are of order 0.1.
#pragma once

#include <doctest/doctest.h>

#include <kiln/train.cuh>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace kiln_cuda_step_test {


using kiln::index_t;
namespace nn = kiln::nn;
using Mlp = nn::Sequential<nn::Linear<12, 32>, nn::ReLU, nn::Linear<32, 16>, nn::GELUTanh, nn::Linear<16, 4>>;
using Device = kiln::cuda;

inline kiln::data::Dataset dataset(index_t n) {
  kiln::data::Dataset d;
  d.n = n;
  d.d = 12;
  d.num_classes = 4;
  d.sample_shape = {12};
  kiln::Generator g(5);
  for (index_t i = 0; i < n * 12; ++i) d.features.push_back(g.uniform(-1.f, 1.f));
  for (index_t i = 0; i < n; ++i) d.labels.push_back(std::int32_t(g.below(4)));
  return d;
}

template <class M>
std::vector<float> values_of(const M& m) {
  std::vector<float> out;
  m.for_each_parameter([&](const auto& v) {
    if constexpr (std::is_same_v<typename std::remove_cvref_t<decltype(v)>::space, kiln::host>) {
      out.insert(out.end(), v.value().data(), v.value().data() + v.value().size());
    } else {
      const auto h = kiln::to_host(v.value());
      out.insert(out.end(), h.data(), h.data() + h.size());
    }
  });
  return out;
}

// Five optimizer steps of 2 micro-batches of 16 rows in Space; the parameters after them.
template <class Space, class Policy>
std::vector<float> train(const kiln::data::Dataset& data, index_t& launches, index_t& predicted) {
  auto exec = kiln::make_executor<Space>(1);
  typename Mlp::template on<Space> model(3);
  // eps 1e-3, not 1e-8: Adam's update is lr * g / (|g| + eps), so with a tiny eps a gradient
  // element near zero whose sign the device's summation order flips moves by 2 lr (0.02, the tf32
  // tolerance itself); with 1e-3 a difference d in g moves the parameter by at most lr d / eps,
  // while the MLP's real gradients (1e-2 and up) still take steps of about lr.
  kiln::optim::AdamW opt(model, {.lr = 1e-2, .eps = 1e-3});
  kiln::train::Step step(model, opt, exec, Policy{});
  kiln::data::BatchLoader<Space> loader(data, {.batch_size = 16, .shuffle = false, .workers = 0}, exec);
  for (int epoch = 0; epoch < 5; ++epoch) {
    loader.start_epoch(epoch);
    const auto before = exec.stats().launches();
    while (const auto* b = loader.next()) step(*b);
    launches = index_t(exec.stats().launches() - before);
  }
  predicted = step.predicted_launches();
  (void)step.take_losses(true);
  return values_of(model);
}

template <class Policy>
void compare(double tolerance) {
  const auto data = dataset(32);
  index_t cpu_launches = 0, cpu_predicted = 0, gpu_launches = 0, gpu_predicted = 0;
  const auto cpu = train<kiln::host, Policy>(data, cpu_launches, cpu_predicted);
  const auto gpu = train<Device, Policy>(data, gpu_launches, gpu_predicted);
  REQUIRE(cpu.size() == gpu.size());
  double worst = 0;
  for (std::size_t i = 0; i < cpu.size(); ++i) worst = std::max(worst, std::abs(double(cpu[i]) - double(gpu[i])));
  CHECK_MESSAGE(worst <= tolerance, "largest difference ", worst);
  CHECK(cpu_launches == cpu_predicted);
  CHECK(gpu_launches == gpu_predicted);
}

}  // namespace kiln_cuda_step_test
