// bench/resnet50_step — a ResNet-50 written as a user writes it (kiln::models::ResNet50, torchvision's
// layout, its stages as nn::Repeat) trained on the CPU: forward, cross-entropy, backward and AdamW
// on random images, one policy. It is also the compile-time budget's ResNet-50 row
// (bench/compile_time, README "Compile time"): a deep convnet's program must build in seconds.
//
// Output, one JSON line: bench, model, size (224: the images' side, fixed in the model's type, as
// a program has one), batch, threads, step_ms (median over --steps after one warm-up step),
// images_per_s, kernels_per_step (measured) and predicted (from the model's type).
//
//   build/bench/resnet50_step [--threads 1] [--batch 2] [--steps 3]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

// One policy, the fused stance: the ops' force_eager forms are not compiled (kiln/config.hpp).
#define KILN_FORCE_EAGER_FORMS 0
#include "kiln/models/resnet.hpp"
#include "kiln/train.hpp"

#include "timing.hpp"

namespace {

using kiln::index_t;

constexpr index_t Size = 224;
using Model = kiln::models::ResNet50<10, Size>;

void run(index_t batch, int threads, int steps) {
  kiln::CpuExecutor exec(threads);
  Model model(0);
  kiln::optim::AdamW opt(model, {.lr = 1e-3});
  kiln::train::Step step(model, opt, exec);
  const index_t dim = Model::in_features;
  std::vector<float> x(static_cast<std::size_t>(batch * dim));
  std::vector<std::int32_t> y(static_cast<std::size_t>(batch));
  kiln::Generator gen(1);
  for (auto& v : x) v = gen.uniform(-1.f, 1.f);
  for (auto& v : y) v = std::int32_t(gen.below(10));
  kiln::data::Batch b;
  b.features = x;
  b.labels = y;
  b.size = batch;
  b.dim = dim;
  step(b);  // warm-up: buffers, workspaces
  step.record_next_step();
  std::vector<double> ms;
  for (int i = 0; i < steps; ++i) ms.push_back(1e3 * kiln_bench::seconds([&] { step(b); }));
  (void)step.take_losses(/*require_finite=*/true);
  const auto rep = kiln::train::report(step);
  const double median = kiln_bench::median(ms);
  std::printf("{\"bench\":\"resnet50_step\",\"model\":\"resnet50\",\"size\":%lld,\"batch\":%lld,\"threads\":%d,"
              "\"step_ms\":%.2f,\"images_per_s\":%.2f,\"kernels_per_step\":%.0f,\"predicted\":%lld}\n",
              (long long)Size, (long long)batch, threads, median, double(batch) / (median / 1e3), rep.kernels_per_step,
              (long long)rep.predicted);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 1, steps = 3;
  index_t batch = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const long long v = std::atoll(argv[i + 1]);
    if (flag == "--threads") threads = int(v);
    else if (flag == "--batch") batch = v;
    else if (flag == "--steps") steps = int(v);
    else {
      std::fprintf(stderr, "usage: resnet50_step [--threads N] [--batch N] [--steps N]\n");
      return 1;
    }
  }
  if (threads < 1 || batch < 1 || steps < 1) {
    std::fprintf(stderr, "resnet50_step: --threads, --batch and --steps must be positive\n");
    return 1;
  }
  run(batch, threads, steps);
  return 0;
}
