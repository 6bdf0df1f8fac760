// bench/gpt_scaling — how a GPT's costs grow with the sequence length (nanoGPT's baby GPT: vocab 65,
// 4 layers, 4 heads, width 128), one JSON line per measurement:
//   memory:     one training step (forward, loss, backward, AdamW) at T = 512 and T = 1024, batch 4:
//               the heap's peak during the step (counting operator new, every byte), the model and
//               optimizer before it, and the step's own share; fused attention keeps no T × T matrix,
//               so the step's share grows linearly (×2 for ×2 T) and the total by less than 2×;
//   generation: milliseconds per new token with the key/value cache at positions 64 and 512 (the
//               mean of 16 tokens after each), and without it (nanoGPT's loop, the last block re-run);
//               with the cache a token costs O(T) attention plus the same projections at any position.
//
//   build/bench/gpt_scaling [--threads 1]
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define KILN_FORCE_EAGER_FORMS 0
#include "kiln/models/gpt.hpp"
#include "kiln/models/gpt_sample.hpp"
#include "kiln/train.hpp"

#include "counting_new.hpp"

namespace {

using namespace kiln;

template <index_t T>
using Net = models::GPT<models::GptConfig{.vocab = 65, .block_size = T, .layers = 4, .heads = 4, .width = 128}>;

template <index_t T>
void memory(int threads) {
  constexpr index_t batch = 4;
  CpuExecutor exec(threads);
  Net<T> model(0);
  optim::AdamW opt(model, {.lr = 1e-3, .beta2 = 0.99, .weight_decay = 0.1});
  train::Step step(model, opt, exec);
  Generator gen(1);
  std::vector<float> x(static_cast<std::size_t>(batch * T));
  std::vector<std::int32_t> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    x[i] = float(gen.below(65));
    y[i] = std::int32_t(gen.below(65));
  }
  (void)step.run(x.data(), y.data(), batch, T);  // the optimizer's state exists from here on
  const std::size_t before = kiln_memory_test::heap_in_use();
  kiln_memory_test::reset_heap_peak();
  (void)step.run(x.data(), y.data(), batch, T);
  const std::size_t peak = kiln_memory_test::heap_peak();
  std::printf("{\"bench\": \"gpt_scaling\", \"measure\": \"memory\", \"T\": %lld, \"batch\": %lld, \"threads\": %d, "
              "\"peak_mib\": %.2f, \"before_step_mib\": %.2f, \"step_mib\": %.2f}\n",
              (long long)T, (long long)batch, threads, double(peak) / 1048576.0, double(before) / 1048576.0,
              double(peak - before) / 1048576.0);
  std::fflush(stdout);
}

double ms_per_token(auto&& generate_from, std::vector<std::int32_t> prompt, index_t n) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto out = generate_from(prompt, n);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return ms / double(out.size());
}

void generation(int threads) {
  constexpr index_t T = 1024, n = 16;
  CpuExecutor exec(threads);
  Net<T> model(0);
  for (index_t position : {index_t(64), index_t(512)}) {
    std::vector<std::int32_t> prompt(static_cast<std::size_t>(position), 1);
    // Prompt processing is one position at a time too: time the whole and the prompt alone.
    const double with_prompt = ms_per_token(
        [&](auto p, index_t k) { return models::generate(model, exec, p, k, {.seed = 1}); }, prompt, n) * double(n);
    const double prompt_only = ms_per_token(
        [&](auto p, index_t k) { return models::generate(model, exec, p, k, {.seed = 1}); }, prompt, 1);
    const double cached = (with_prompt - prompt_only) / double(n - 1);
    const double uncached = ms_per_token(
        [&](auto p, index_t k) { return models::generate_uncached(model, exec, p, k, {.seed = 1}); }, prompt, 4);
    std::printf("{\"bench\": \"gpt_scaling\", \"measure\": \"generation\", \"position\": %lld, \"block\": %lld, "
                "\"threads\": %d, \"cached_ms_per_token\": %.4f, \"uncached_ms_per_token\": %.4f}\n",
                (long long)position, (long long)T, threads, cached, uncached);
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  kiln::set_host_cache_limit(0);  // peaks of live memory: no freed blocks kept for reuse (core/host_block_cache.hpp)
  int threads = 1;
  for (int i = 1; i + 1 < argc; i += 2)
    if (std::string(argv[i]) == "--threads") threads = std::atoi(argv[i + 1]);
  memory<512>(threads);
  memory<1024>(threads);
  generation(threads);
  return 0;
}
