// bench/policies.hpp — what bench/policies (CPU) and bench/policies_cuda share: one training step
// of the MLP 400-256-128-10 (AdamW) under every precision × stance × accumulation, timed per
// optimizer step, with its launches measured and predicted at compile time. Plain host C++ plus
// the space: nvcc compiles it for the CUDA program.
//
// One JSON line per configuration: bench, backend, precision, stance, accumulate, batch (the
// micro-batch), step_ms (median over steps, one optimizer step each), kernels_per_step,
// predicted_kernels.
//
// The modes (all_modes): default, reduce_overhead and max_autotune side by side — three models,
// stepped in turn, one step each per round in a rotating order, so that the machine's drift and
// the caches' state hit all three alike —
// at batch 64, 256 and 1024 (fp32, fused); each line adds the mode and its step time against
// default's (vs_default: default's median / this one's; above 1 is faster).
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

// One model per mode, stepped in turn; one JSON line per mode.
template <class Space, class Sync>
void mode_steps(const char* backend, kiln::index_t batch, int steps, int threads, Sync sync) {
  using Model = typename Mlp::template on<Space>;
  struct Run {
    kiln::executor_t<Space> exec;
    Model model{0};
    // Named, not a braced temporary: GCC 12 at -O3 warns of a dangling pointer to one (a false
    // positive of -Wdangling-pointer through the inherited constructor).
    kiln::optim::AdamWOptions options{.lr = 1e-3};
    kiln::optim::AdamW<Space> opt{model, options};
    explicit Run(int threads) : exec(kiln::make_executor<Space>(threads)) {}
  };
  Run d(threads), r(threads), a(threads);
  kiln::train::Step by_default(d.model, d.opt, d.exec, kiln::policy<>{});
  kiln::train::Step replayed(r.model, r.opt, r.exec, kiln::policy<kiln::mode::reduce_overhead>{});
  kiln::train::Step tuned(a.model, a.opt, a.exec, kiln::policy<kiln::mode::max_autotune>{});
  kiln::Generator gen(1);
  std::vector<float> x(static_cast<std::size_t>(batch * 400));
  std::vector<std::int32_t> y(static_cast<std::size_t>(batch));
  for (auto& v : x) v = gen.uniform(-1.f, 1.f);
  for (auto& v : y) v = std::int32_t(gen.below(10));
  kiln::Tensor<float, Space, kiln::dyn> xs(kiln::Shape{batch * 400});
  kiln::Tensor<std::int32_t, Space, kiln::dyn> ys(kiln::Shape{batch});
  kiln::memory_traits<Space>::copy_from_host(xs.data(), x.data(), x.size() * sizeof(float));
  kiln::memory_traits<Space>::copy_from_host(ys.data(), y.data(), y.size() * sizeof(std::int32_t));
  std::vector<double> t_default, t_replayed, t_tuned;
  auto time_one = [&](auto& step, auto& exec, std::vector<double>& into, int s) {
    sync(exec);
    const auto t0 = std::chrono::steady_clock::now();
    step.run(xs.data(), ys.data(), batch, 400);
    sync(exec);
    if (s >= 3) into.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (step.window_full()) (void)step.take_losses();
  };
  for (int s = 0; s < steps + 3; ++s) {  // three warm-up rounds: the capture and the tuning happen there
    // Each mode goes first, second and third in turn: whoever runs after another model finds the
    // caches holding that model's buffers.
    for (int turn = 0; turn < 3; ++turn) {
      switch ((s + turn) % 3) {
        case 0: time_one(by_default, d.exec, t_default, s); break;
        case 1: time_one(replayed, r.exec, t_replayed, s); break;
        default: time_one(tuned, a.exec, t_tuned, s); break;
      }
    }
  }
  const double base = median(t_default);
  auto line = [&](const char* mode, const std::vector<double>& t, const std::string& extra) {
    std::printf("{\"bench\": \"policies\", \"backend\": \"%s\", \"mode\": \"%s\", \"precision\": \"fp32\", "
                "\"stance\": \"fused\", \"batch\": %lld, \"step_ms\": %.4f, \"vs_default\": %.3f%s}\n",
                backend, mode, (long long)batch, median(t) * 1e3, base / median(t), extra.c_str());
  };
  line("default", t_default, "");
  if constexpr (decltype(replayed)::captures)
    line("reduce_overhead", t_replayed,
         ", \"replays\": " + std::to_string(replayed.captures_made().counts().replays));
  else
    line("reduce_overhead", t_replayed, ", \"note\": \"not built for this executor yet: ran as default\"");
  if constexpr (decltype(tuned)::autotunes)
    line("max_autotune", t_tuned,
         ", \"gemm_shapes_timed\": " + std::to_string(tuned.tuner()->tuned()) +
             ", \"gemm_shapes_from_cache\": " + std::to_string(tuned.tuner()->reused()));
  else
    line("max_autotune", t_tuned, ", \"note\": \"not built for this executor yet: ran as default\"");
  std::fflush(stdout);
}

// The three modes at batch 64, 256 and 1024.
template <class Space, class Sync>
void all_modes(const char* backend, int steps, int threads, Sync sync) {
  for (kiln::index_t batch : {64, 256, 1024}) mode_steps<Space>(backend, batch, steps, threads, sync);
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
