// bench/gpt_step — one training iteration of nanoGPT's CPU "baby GPT" (vocab 65, block 64, 4 layers,
// 4 heads, width 128, batch 12): a batch of random windows, forward, cross-entropy over 12 x 64
// positions, backward, gradient clipping at 1.0, AdamW with nanoGPT's parameter groups — kiln's
// train::Step as examples/train_gpt runs it, side by side with bench/torch_gpt.py (nanoGPT's model in
// PyTorch: eager, eager with the fused AdamW, torch.compile), run in the same process tree BEFORE
// kiln's runs (so they never share the cores) with the same --threads and --steps.
//
// Output, JSON lines: the peers' own lines as they come (or a "skipped" reason); then per thread count
//   kiln:     bench, backend ("cpu"), threads, kiln_ms, kernels_per_step;
//   per peer: bench, threads, kiln_ms, peer, peer_ms, speedup (peer_ms / kiln_ms);
//   summary:  bench, threads, kiln_ms, fastest_peer, fastest_peer_ms, kiln_faster (null without a peer).
// Medians over --steps iterations after a warm-up of 20. --threads takes a list ("1,2").
//
//   build/bench/gpt_step [--threads 1,2] [--steps 100] [--python PY|none]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#define KILN_FORCE_EAGER_FORMS 0
#include "kiln/data/text.hpp"
#include "kiln/models/gpt.hpp"
#include "kiln/train.hpp"

#include "mlp_step.hpp"

namespace {

using namespace kiln;

constexpr models::GptConfig config{.vocab = 65, .block_size = 64, .layers = 4, .heads = 4, .width = 128};
using Model = models::GPT<config>;
constexpr index_t T = config.block_size, batch = 12;

struct KilnStep {
  double ms;
  double kernels;
};

template <class Policy>
KilnStep kiln_step(int threads, int steps) {
  CpuExecutor exec(threads);
  Model model(0);
  optim::AdamW opt(model, {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.99, .weight_decay = 0.1});
  train::StepOptions options;
  options.after_backward = [&](index_t) { optim::clip_grad_norm(opt.table(), 1.0, exec); };
  train::Step step(model, opt, exec, Policy{}, train::CrossEntropy{}, options);
  Generator gen(1);
  std::vector<std::int32_t> tokens(100000);
  for (auto& t : tokens) t = std::int32_t(gen.below(config.vocab));
  const data::TokenWindows windows(std::move(tokens), T, "random tokens");
  std::vector<float> x;
  std::vector<std::int32_t> y;
  std::vector<double> times;
  const int warmup = 20;
  for (int i = 0; i < warmup + steps; ++i) {
    if (i == warmup) exec.stats().reset();
    const auto t0 = std::chrono::steady_clock::now();
    windows.sample(batch, gen, x, y);
    step.run(x.data(), y.data(), batch, T);
    const auto t1 = std::chrono::steady_clock::now();
    if (i >= warmup) times.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  (void)step.take_losses(/*require_finite=*/true);
  return {kiln_bench::median(times), double(exec.stats().launches()) / steps};
}

struct PeerTime {
  std::string peer;
  int threads;
  double ms;
};

}  // namespace

int main(int argc, char** argv) {
  std::string thread_list = "1";
  int steps = 100;
  std::string python = kiln_bench::default_python();
  std::string mode = "reduce_overhead";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--threads") thread_list = argv[i + 1];
    else if (a == "--steps") steps = std::atoi(argv[i + 1]);
    else if (a == "--python") python = argv[i + 1];
    else if (a == "--mode") mode = argv[i + 1];
  }
  std::vector<int> thread_counts;
  std::stringstream list(thread_list);
  for (std::string t; std::getline(list, t, ',');) thread_counts.push_back(std::atoi(t.c_str()));
  std::vector<PeerTime> peers;
  if (python != "none") {
    for (int threads : thread_counts) {
      const std::string args = "--mode step --threads " + std::to_string(threads) + " --steps " + std::to_string(steps);
      const auto lines = kiln_bench::peer_lines(python, "torch_gpt.py", args);
      if (lines.empty())
        std::printf("{\"bench\": \"gpt_step\", \"peer\": \"torch\", \"skipped\": \"%s printed nothing\"}\n", python.c_str());
      for (const auto& l : lines) {
        std::printf("%s\n", l.c_str());
        const std::string peer = kiln_bench::json_field(l, "peer"), ms = kiln_bench::json_field(l, "torch_ms");
        if (!peer.empty() && !ms.empty() && ms != "null") peers.push_back({peer, threads, std::atof(ms.c_str())});
      }
      std::fflush(stdout);
    }
  }
  for (int threads : thread_counts) {
    const KilnStep k = mode == "reduce_overhead" ? kiln_step<kiln::policy<kiln::mode::reduce_overhead>>(threads, steps)
                                                 : kiln_step<kiln::policy<>>(threads, steps);
    std::printf("{\"bench\": \"gpt_step\", \"backend\": \"cpu\", \"mode\": \"%s\", \"threads\": %d, \"kiln_ms\": %.4f, "
                "\"kernels_per_step\": %.1f}\n",
                mode.c_str(), threads, k.ms, k.kernels);
    const PeerTime* fastest = nullptr;
    for (const auto& p : peers) {
      if (p.threads != threads) continue;
      std::printf("{\"bench\": \"gpt_step\", \"threads\": %d, \"kiln_ms\": %.4f, \"peer\": \"%s\", \"peer_ms\": %.4f, "
                  "\"speedup\": %.3f}\n",
                  threads, k.ms, p.peer.c_str(), p.ms, p.ms / k.ms);
      if (!fastest || p.ms < fastest->ms) fastest = &p;
    }
    if (fastest)
      std::printf("{\"bench\": \"gpt_step\", \"threads\": %d, \"kiln_ms\": %.4f, \"fastest_peer\": \"%s\", "
                  "\"fastest_peer_ms\": %.4f, \"kiln_faster\": %s}\n",
                  threads, k.ms, fastest->peer.c_str(), fastest->ms, k.ms < fastest->ms ? "true" : "false");
    else
      std::printf("{\"bench\": \"gpt_step\", \"threads\": %d, \"kiln_ms\": %.4f, \"fastest_peer\": null, "
                  "\"fastest_peer_ms\": null, \"kiln_faster\": null}\n",
                  threads, k.ms);
    std::fflush(stdout);
  }
  return 0;
}
