// mode::reduce_overhead on CUDA (kiln/backend/cuda/step_graph.cuh): the step captured as a CUDA
// graph and replayed gives the eager step's parameters bit for bit in fp32 (the same kernels on
// the same buffers) and within rounding in bf16_mixed, with a schedule changing the rate every
// step and the last partial batch captured as a second shape; the allocator makes no cudaMalloc
// after the captures; replays count the launches the eager step counts; dropout (state kept on
// the host) keeps its shape eager and the report says so.
#include "step_support.hpp"

using namespace kiln_cuda_step_test;

namespace {

struct Run {
  std::vector<float> params, losses;
  kiln::train::CaptureCounts counts;
  std::size_t mallocs_after_captures = 0, launches_last_step = 0;
  std::string report;
};

template <class Model, class Policy>
Run run(int steps) {
  kiln::CudaExecutor exec;
  Model model(3);
  kiln::optim::AdamW opt(model, {.lr = 1e-2});
  kiln::train::Step step(model, opt, exec, Policy{});
  step.set_schedule(kiln::optim::CosineAnnealingLr(1e-2, steps, 1e-4));
  const auto data = dataset(16 * 3 + 5);  // three batches of 16 and a partial one of 5
  kiln::data::BatchLoader<kiln::cuda> loader(data, {.batch_size = 16, .shuffle = false, .workers = 0}, exec);
  Run out;
  std::size_t mallocs = 0;
  int done = 0;
  for (int epoch = 0; done < steps; ++epoch) {
    loader.start_epoch(epoch);
    while (const auto* b = loader.next()) {
      if (done == 8) mallocs = kiln::cu::default_allocator().stats().allocations -
                               kiln::cu::default_allocator().stats().cache_hits;
      const auto before = exec.stats().launches();
      step(*b);
      out.launches_last_step = exec.stats().launches() - before;
      for (float l : step.take_losses()) out.losses.push_back(l);
      if (++done == steps) break;
    }
  }
  exec.synchronize();
  out.mallocs_after_captures = kiln::cu::default_allocator().stats().allocations -
                               kiln::cu::default_allocator().stats().cache_hits - mallocs;
  out.params = values_of(model);
  if constexpr (decltype(step)::captures) out.counts = step.captures_made().counts();
  out.report = step.mode_report();
  return out;
}

using DeviceMlp = Mlp::on<kiln::cuda>;
using DropMlp = nn::Sequential<nn::Linear<12, 32>, nn::ReLU, nn::Dropout<0.25>, nn::Linear<32, 4>>::on<kiln::cuda>;

}  // namespace

TEST_CASE("reduce_overhead on CUDA: replayed graphs give the eager steps' parameters, fp32 bit for bit") {
  const Run eager = run<DeviceMlp, kiln::policy<>>(16);
  const Run replayed = run<DeviceMlp, kiln::policy<kiln::mode::reduce_overhead>>(16);
  CHECK(replayed.params == eager.params);
  CHECK(replayed.losses == eager.losses);
  // Two shapes (16 and 5 rows): a warm-up and a capture each, the rest replayed.
  CHECK(replayed.counts.captured_steps == 2);
  CHECK(replayed.counts.eager_steps == 2);
  CHECK(replayed.counts.replays == 12);
  CHECK(replayed.mallocs_after_captures == 0);
  CHECK(replayed.launches_last_step == eager.launches_last_step);
  MESSAGE(replayed.report);
}

TEST_CASE("reduce_overhead on CUDA: bf16_mixed replays within rounding of eager") {
  const Run eager = run<DeviceMlp, kiln::policy<kiln::precision::bf16_mixed>>(12);
  const Run replayed = run<DeviceMlp, kiln::policy<kiln::precision::bf16_mixed, kiln::mode::reduce_overhead>>(12);
  REQUIRE(eager.params.size() == replayed.params.size());
  double worst = 0;
  for (std::size_t i = 0; i < eager.params.size(); ++i)
    worst = std::max(worst, std::abs(double(eager.params[i]) - double(replayed.params[i])));
  CHECK(worst <= 1e-3);
  CHECK(replayed.counts.replays > 0);
}

TEST_CASE("reduce_overhead on CUDA: dropout keeps its shape eager, and the report names it") {
  const Run r = run<DropMlp, kiln::policy<kiln::mode::reduce_overhead>>(8);
  CHECK(r.counts.replays == 0);
  CHECK(r.report.find("dropout's random offset") != std::string::npos);
}
