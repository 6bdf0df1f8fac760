// bench/data_parallel — data-parallel training of the digits MLP (400-256-128-10, fp32, AdamW) on
// the CPU over MPI (kiln/dist/): per-rank batches of 64 and 256, each rank on its own thread.
//
//   build/bench/data_parallel                                   one process: the solo step only
//   mpirun -np 2 --oversubscribe build/bench/data_parallel      (as root: --allow-run-as-root)
//
// One JSON line per per-rank batch, from rank 0, all measured in one run:
// - step_ms: median step time with the gradients all-reduced during backward (overlap), and
//   after it (no_overlap_step_ms);
// - solo_step_ms: rank 0 alone at the same per-rank batch, the other ranks waiting politely (a
//   sleeping barrier), so the weak-scaling efficiency is solo_step_ms / step_ms;
// - allreduce_ms: per step, the time gradient averaging takes when it runs after backward (packing,
//   all-reduces, unpacking: all of it shows); exposed_ms: the time it still costs the step when
//   it overlaps backward (packing, starting and progressing the all-reduces, waiting for them,
//   unpacking); hidden_share = 1 - exposed_ms / allreduce_ms. thread_ms: the communication
//   thread's time on the buckets it averaged while backward ran (wall time, waits included).
// --bucket-kb sets the all-reduce bucket (default 128 kB: the MLP's 547 kB of gradients in four
// buckets, three of which backward finishes before its last GEMM, dW1).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kiln/train.hpp"
#include "timing.hpp"

using kiln::index_t;
namespace nn = kiln::nn;
namespace dist = kiln::dist;
using Mlp = nn::Sequential<nn::Linear<400, 256>, nn::ReLU, nn::Linear<256, 128>, nn::ReLU, nn::Linear<128, 10>>::on<kiln::host>;

namespace {

struct Timing {
  // Per step: gradient averaging backward did not cover, and the communication thread's time.
  double step_ms = 0, exposed_ms = 0, concurrent_ms = 0;
};

// Median step time of `steps` steps (after `warm` unmeasured ones) at `batch` rows, data-parallel
// over `group` when it is given.
Timing time_steps(index_t batch, dist::ProcessGroup* group, dist::DataParallelOptions dp, int warm, int steps) {
  kiln::CpuExecutor exec(1);
  Mlp model(1);
  kiln::optim::AdamW opt(model, {.lr = 1e-3});
  kiln::train::Step step(model, opt, exec, kiln::policy<>{}, kiln::train::CrossEntropy{},
                         {.data_parallel = group, .data_parallel_options = dp});
  const int rank = group ? group->rank() : 0;
  kiln::Generator g(7 + std::uint64_t(rank));
  std::vector<float> x(std::size_t(batch * 400));
  std::vector<std::int32_t> y(static_cast<std::size_t>(batch));
  for (float& v : x) v = g.uniform(0.f, 1.f);
  for (auto& l : y) l = std::int32_t(g.below(10));
  std::vector<double> times;
  for (int s = 0; s < warm + steps; ++s) {
    if (s == warm && step.reducer()) step.reducer()->reset_timing();
    const double t = kiln_bench::seconds([&] { step.run(x.data(), y.data(), batch, 400); });
    if (s >= warm) times.push_back(t);
  }
  (void)step.take_losses();
  Timing out{1e3 * kiln_bench::median(times), 0, 0};
  if (step.reducer()) {
    out.exposed_ms = 1e3 * step.reducer()->exposed_seconds() / steps;
    out.concurrent_ms = 1e3 * step.reducer()->concurrent_seconds() / steps;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) try {
  index_t bucket_kb = 128;
  int steps = 60;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--bucket-kb") && i + 1 < argc) bucket_kb = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--steps") && i + 1 < argc) steps = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: data_parallel [--bucket-kb N] [--steps N] (under mpirun for several ranks)\n");
      return 2;
    }
  }
  auto& group = dist::ProcessGroup::world();
  const dist::DataParallelOptions overlap{.bucket_bytes = bucket_kb << 10, .overlap = true};
  dist::DataParallelOptions after = overlap;
  after.overlap = false;
  for (index_t batch : {64, 256}) {
    Timing solo;
    if (group.is_root()) solo = time_steps(batch, nullptr, {}, 10, steps);
    group.barrier();  // the other ranks sleep meanwhile
    if (group.size() == 1) {
      std::printf("{\"bench\": \"data_parallel\", \"model\": \"digits_mlp\", \"ranks\": 1, \"batch_per_rank\": %lld, "
                  "\"solo_step_ms\": %.4f}\n", (long long)batch, solo.step_ms);
      continue;
    }
    // The two variants alternate in rounds, so that a slow moment of the machine hits both.
    std::vector<double> with, without, comm, exposed, concurrent;
    for (int round = 0; round < 3; ++round) {
      const Timing a = time_steps(batch, &group, overlap, 10, steps);
      const Timing b = time_steps(batch, &group, after, 10, steps);
      with.push_back(a.step_ms), exposed.push_back(a.exposed_ms), concurrent.push_back(a.concurrent_ms);
      without.push_back(b.step_ms), comm.push_back(b.exposed_ms);  // after backward: all of it shows
    }
    const double step_ms = kiln_bench::median(with), allreduce_ms = kiln_bench::median(comm),
                 exposed_ms = kiln_bench::median(exposed);
    if (group.is_root())
      std::printf("{\"bench\": \"data_parallel\", \"model\": \"digits_mlp\", \"ranks\": %d, \"batch_per_rank\": %lld, "
                  "\"bucket_kb\": %lld, \"step_ms\": %.4f, \"no_overlap_step_ms\": %.4f, \"solo_step_ms\": %.4f, "
                  "\"scaling_efficiency\": %.3f, \"samples_per_s\": %.0f, \"allreduce_ms\": %.4f, \"exposed_ms\": %.4f, "
                  "\"hidden_share\": %.3f, \"thread_ms\": %.4f}\n",
                  group.size(), (long long)batch, (long long)bucket_kb, step_ms, kiln_bench::median(without),
                  solo.step_ms, solo.step_ms / step_ms, double(batch * group.size()) / (step_ms * 1e-3), allreduce_ms,
                  exposed_ms, allreduce_ms > 0 ? 1.0 - exposed_ms / allreduce_ms : 0.0, kiln_bench::median(concurrent));
  }
  return 0;
} catch (const std::exception& e) {
  return kiln::dist::fail_job("data_parallel", e);
}
