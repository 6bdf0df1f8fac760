// bench/policies.hpp — what bench/policies (CPU) and bench/policies_cuda share: one training step
// of the MLP 400-256-128-10 (AdamW) under every precision × stance × accumulation, timed per
// optimizer step, with its launches measured and predicted at compile time. Plain host C++ plus
// the space: nvcc compiles it for the CUDA program.
//
// One JSON line per configuration: bench, backend, precision, stance, accumulate, batch (the
// micro-batch), step_ms (median over steps, one optimizer step each), kernels_per_step,
// predicted_kernels.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "kiln/train.hpp"
#include "mlp_step.hpp"
#include "timing.hpp"

namespace kiln_bench {

// Times `steps` optimizer steps of policy Policy on a model in Space; `sync` waits for the device.
template <class Space, class Policy, class Sync>
void policy_step(const char* backend, kiln::index_t batch, kiln::index_t accumulate, int steps, int threads,
                 Sync sync) {
  auto exec = kiln::make_executor<Space>(threads);
  typename Mlp::template on<Space> model(0);
  kiln::optim::AdamW opt(model, {.lr = 1e-3});
  kiln::train::Step step(model, opt, exec, Policy{}, {}, {.accumulate = accumulate});
  kiln::data::Dataset data;  // random digits-shaped rows
  data.n = batch * accumulate;
  data.d = 400;
  data.num_classes = 10;
  data.sample_shape = {400};
  kiln::Generator gen(1);
  for (kiln::index_t i = 0; i < data.n * data.d; ++i) data.features.push_back(gen.uniform(-1.f, 1.f));
  for (kiln::index_t i = 0; i < data.n; ++i) data.labels.push_back(std::int32_t(gen.below(10)));
  kiln::data::BatchLoader<Space> loader(data, {.batch_size = batch, .shuffle = false, .workers = 0}, exec);
  std::vector<double> times;
  std::size_t launches = 0;
  for (int s = 0; s < steps + 3; ++s) {  // three warm-up steps
    loader.start_epoch(0);
    sync(exec);
    const auto before = exec.stats().launches();
    const auto t0 = std::chrono::steady_clock::now();
    while (const auto* b = loader.next()) step(*b);
    sync(exec);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    launches = exec.stats().launches() - before;
    if (s >= 3) times.push_back(secs);
    if (step.window_full()) (void)step.take_losses();
  }
  std::printf("{\"bench\": \"policies\", \"backend\": \"%s\", \"precision\": \"%s\", \"stance\": \"%s\", "
              "\"accumulate\": %lld, \"batch\": %lld, \"step_ms\": %.4f, \"kernels_per_step\": %zu, "
              "\"predicted_kernels\": %lld}\n",
              backend, Policy::precision::name, Policy::stance::name, (long long)accumulate, (long long)batch,
              median(times) * 1e3, launches, (long long)step.predicted_launches());
  std::fflush(stdout);
}

// Every precision × stance × accumulation (1 and 4) at batch 64 and 256.
template <class Space, class Sync>
void all_policies(const char* backend, int steps, int threads, Sync sync) {
  for (const char* precision : {"fp32", "tf32", "bf16_mixed", "fp16_mixed"})
    for (const char* stance : {"fused", "force_eager"})
      for (kiln::index_t accumulate : {1, 4})
        for (kiln::index_t batch : {64, 256})
          kiln::select_policy<kiln::accumulate<kiln::dyn>>(precision, stance, [&]<class Policy>() {
            policy_step<Space, Policy>(backend, batch, accumulate, steps, threads, sync);
          });
}

}  // namespace kiln_bench
