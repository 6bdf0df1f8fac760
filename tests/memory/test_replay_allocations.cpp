// mode::reduce_overhead on the CPU: a replayed training step allocates nothing — not a tensor,
// not a tape node, not a scratch buffer — for the digits MLP in fp32 and bf16_mixed, at two
// batch shapes, with accumulation; the same step in mode::default allocates every step (the
// count the replay removes).
#include <doctest/doctest.h>

#include <kiln/train.hpp>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "counting_new.hpp"

namespace {

using Mlp = kiln::nn::Sequential<kiln::nn::Linear<400, 256>, kiln::nn::ReLU, kiln::nn::Linear<256, 128>,
                                 kiln::nn::ReLU, kiln::nn::Linear<128, 10>>;

// Heap allocations of each of `steps` micro-batches, cycling through batches of `rows` rows.
template <class Policy>
std::vector<std::size_t> allocations_per_step(const std::vector<kiln::index_t>& rows, int steps) {
  std::vector<std::vector<float>> x;
  std::vector<std::vector<std::int32_t>> y;
  for (kiln::index_t r : rows) {
    x.emplace_back(std::size_t(r * 400));
    y.emplace_back(std::size_t(r));
    for (std::size_t i = 0; i < x.back().size(); ++i) x.back()[i] = float(i % 23) / 23.f - 0.5f;
    for (std::size_t i = 0; i < y.back().size(); ++i) y.back()[i] = std::int32_t((i * 7) % 10);
  }
  kiln::CpuExecutor exec(2);
  Mlp model(0);
  kiln::optim::AdamW opt(model, {.lr = 1e-3});
  kiln::train::StepOptions options;
  if constexpr (Policy::accumulate == kiln::dyn) options.accumulate = 2;
  kiln::train::Step step(model, opt, exec, Policy{}, kiln::train::CrossEntropy{}, options);
  std::vector<std::size_t> out;
  for (int s = 0; s < steps; ++s) {
    const std::size_t i = std::size_t(s) % rows.size();
    const std::size_t before = kiln_memory_test::heap_allocations();
    step.run(x[i].data(), y[i].data(), rows[i], 400);
    out.push_back(kiln_memory_test::heap_allocations() - before);
    if (step.window_full()) (void)step.take_losses();  // outside the count: the caller's vector
  }
  return out;
}

}  // namespace

TEST_CASE("reduce_overhead: a replayed step allocates nothing; the same step in mode default does") {
  const std::vector<kiln::index_t> shapes{64, 48};
  auto check_replays = [&](const std::vector<std::size_t>& counts, std::size_t captures, const char* what) {
    std::size_t during = 0, after = 0;
    for (std::size_t s = 0; s < counts.size(); ++s) (s < captures ? during : after) += counts[s];
    std::printf("%s: %zu allocations in the %zu capturing steps, %zu in the %zu replayed ones\n", what, during,
                captures, after, counts.size() - captures);
    CAPTURE(what);
    CHECK(after == 0);
  };
  check_replays(allocations_per_step<kiln::policy<kiln::mode::reduce_overhead>>(shapes, 10), 2, "fp32");
  check_replays(allocations_per_step<kiln::policy<kiln::mode::reduce_overhead, kiln::precision::bf16_mixed>>(shapes, 10),
                2, "bf16_mixed");
  // accumulate<dyn> = 2 over two shapes: positions 0 and 1 of each shape, 4 captures.
  check_replays(allocations_per_step<kiln::policy<kiln::mode::reduce_overhead, kiln::accumulate<kiln::dyn>>>({64, 64, 48, 48}, 12),
                4, "accumulate 2");
  const auto eager = allocations_per_step<kiln::policy<>>(shapes, 10);
  std::printf("mode default: %zu allocations in step 10\n", eager.back());
  CHECK(eager.back() > 10);
}
