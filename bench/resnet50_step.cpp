// bench/resnet50_step — a ResNet-50 written as a user writes it (kiln::models::ResNet50, torchvision's
// layout, its stages as nn::Repeat) trained on the CPU: forward, cross-entropy, backward and AdamW
// on random images, one policy, side by side with PyTorch's same step (bench/torch_resnet_step.py:
// torchvision's resnet50, eager and torch.compile, contiguous and channels_last, each in its own
// process) run BEFORE kiln's, with the same --threads, --batch and --train-from. It is also the
// compile-time budget's ResNet-50 row (bench/compile_time, README "Compile time"): a deep
// convnet's program must build in seconds.
//
// The same source builds the other ResNets of bench/convnet's rows (bench/CMakeLists.txt, not
// part of `all`: each is a model type of its own, ~40 s to compile): KILN_BENCH_RESNET_DEPTH 18
// or 50 (default 50) and KILN_BENCH_RESNET_SIZE 32 or 224 (default 224) — bench/resnet18_step,
// resnet18_32_step, resnet50_32_step (and _bf16) — with the peer on the same torchvision model and
// size. bench/convnet --models resnet18_32,resnet50_224,... runs them (its file comment).
//
// bench_resnet50_step_bf16 is the same program under the bf16_mixed policy (built with
// KILN_BENCH_BF16_MIXED: one policy per program keeps this one within its compile budget), its
// peer under torch.autocast(bfloat16); lines carry "precision".
//
// --train-from conv1 trains everything; layer4 fine-tunes (conv1, bn1 and layer1-3 frozen with
// nn::freeze: no gradients below layer4, their batch norms on running statistics; AdamW over the
// rest), as examples/finetune_resnet and the peer do.
//
// kiln's model runs channels-last (ResNet50::with_layout<nhwc>, as examples/finetune_resnet):
// the CPU layout its convolutions and batch norm run fastest in (README, "Layouts"); the peer is
// measured in both of its layouts.
//
// Output, JSON lines: the peer's lines first; then kiln's: bench, model, layout, size (224: the images'
// side, fixed in the model's type, as a program has one), batch, threads, train_from, step_ms
// (median over --steps after one warm-up step), images_per_s, kernels_per_step (measured) and
// predicted (from the model's type), peak_rss_mib (this process's peak resident memory: model,
// gradients, AdamW state and the step's buffers, as the peer's line counts its own),
// peak_tensors_mib (the most bytes of host blocks of 128 KiB and up live at once: the tensors,
// without what the host block cache keeps), cache_kept_mib (what it keeps at the end) and
// cache_misses_per_step (blocks the cache could not serve in the timed steps: each is mapped, and
// its pages faulted in and zeroed, again); per peer
// one line with peer_ms and speedup (peer_ms / kiln_ms); last a summary: kiln_ms, fastest_peer,
// fastest_peer_ms, kiln_faster.
//
//   build/bench/resnet50_step [--threads 1] [--batch 2] [--steps 3] [--train-from conv1|layer4]
//                             [--python PY|none] [--host-cache on|off]
// (--host-cache off: nothing kept for reuse, kiln/core/host_block_cache.hpp)
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

// One policy, the fused stance: the ops' force_eager forms are not compiled (kiln/config.hpp).
#define KILN_FORCE_EAGER_FORMS 0
#include "kiln/models/resnet.hpp"
#include "kiln/nn/freeze.hpp"
#include "kiln/train.hpp"

#include "bench_policy.hpp"
#include "mlp_step.hpp"

namespace {

using kiln::index_t;

using kiln_bench::Policy;
using kiln_bench::precision;

#ifndef KILN_BENCH_RESNET_DEPTH
#define KILN_BENCH_RESNET_DEPTH 50
#endif
#ifndef KILN_BENCH_RESNET_SIZE
#define KILN_BENCH_RESNET_SIZE 224
#endif
constexpr index_t Size = KILN_BENCH_RESNET_SIZE;
#if KILN_BENCH_RESNET_DEPTH == 50
using Net = kiln::models::ResNet50<10, Size>;
constexpr const char* model_name = "resnet50";
#elif KILN_BENCH_RESNET_DEPTH == 18
using Net = kiln::models::ResNet18<10, Size>;
constexpr const char* model_name = "resnet18";
#else
#error "bench/resnet50_step.cpp: KILN_BENCH_RESNET_DEPTH is 18 or 50"
#endif
using Model = Net::with_layout<kiln::nn::layout::nhwc>;

struct Peer {
  std::string name;
  double ms;
};

double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

void run(index_t batch, int threads, int steps, const std::string& train_from, const std::vector<Peer>& peers) {
  kiln::CpuExecutor exec(threads);
  Model model(0);
  if (train_from == "layer4") {  // everything before layer4 (the unnamed ReLU and pool hold nothing)
    kiln::nn::freeze(model.layer<1>());  // conv1
    kiln::nn::freeze(model.layer<2>());  // bn1
    kiln::nn::freeze(model.layer<5>());  // layer1
    kiln::nn::freeze(model.layer<6>());  // layer2
    kiln::nn::freeze(model.layer<7>());  // layer3
  }
  kiln::optim::AdamW opt(model, {.lr = 1e-3});
  kiln::train::Step step(model, opt, exec, Policy{});
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
  const std::size_t misses_before = kiln::host_cache_stats().misses;
  for (int i = 0; i < steps; ++i) ms.push_back(1e3 * kiln_bench::seconds([&] { step(b); }));
  const double misses_per_step = double(kiln::host_cache_stats().misses - misses_before) / steps;
  (void)step.take_losses(/*require_finite=*/true);
  const auto rep = kiln::train::report(step);
  const double median = kiln_bench::median(ms);
  std::printf("{\"bench\":\"resnet50_step\",\"model\":\"%s\",\"layout\":\"nhwc\",\"size\":%lld,\"batch\":%lld,\"threads\":%d,"
              "\"precision\":\"%s\",\"train_from\":\"%s\",\"step_ms\":%.2f,\"images_per_s\":%.2f,\"kernels_per_step\":%.0f,"
              "\"predicted\":%lld,\"peak_rss_mib\":%.1f,\"peak_tensors_mib\":%.1f,\"cache_kept_mib\":%.1f,"
              "\"cache_misses_per_step\":%.1f}\n",
              model_name, (long long)Size, (long long)batch, threads, precision, train_from.c_str(), median,
              double(batch) / (median / 1e3),
              rep.kernels_per_step, (long long)rep.predicted, peak_rss_mib(),
              double(kiln::host_cache_stats().peak_in_use_bytes) / (1 << 20),
              double(kiln::host_cache_stats().kept_bytes) / (1 << 20), misses_per_step);
  const Peer* fastest = nullptr;
  for (const Peer& p : peers) {
    std::printf("{\"bench\":\"resnet50_step\",\"model\":\"%s\",\"size\":%lld,\"batch\":%lld,\"threads\":%d,"
                "\"train_from\":\"%s\",\"kiln_ms\":%.2f,\"peer\":\"%s\",\"peer_ms\":%.2f,\"speedup\":%.3f}\n",
                model_name, (long long)Size, (long long)batch, threads, train_from.c_str(), median, p.name.c_str(), p.ms,
                p.ms / median);
    if (!fastest || p.ms < fastest->ms) fastest = &p;
  }
  if (fastest)
    std::printf("{\"bench\":\"resnet50_step\",\"summary\":true,\"model\":\"%s\",\"size\":%lld,\"batch\":%lld,"
                "\"threads\":%d,\"train_from\":\"%s\",\"kiln_ms\":%.2f,\"fastest_peer\":\"%s\",\"fastest_peer_ms\":%.2f,"
                "\"kiln_faster\":%s}\n",
                model_name, (long long)Size, (long long)batch, threads, train_from.c_str(), median, fastest->name.c_str(),
                fastest->ms,
                median < fastest->ms ? "true" : "false");
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 1, steps = 3;
  index_t batch = 2;
  std::string train_from = "conv1", python = kiln_bench::default_python();
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const long long v = std::atoll(argv[i + 1]);
    if (flag == "--threads") threads = int(v);
    else if (flag == "--batch") batch = v;
    else if (flag == "--steps") steps = int(v);
    else if (flag == "--train-from") train_from = argv[i + 1];
    else if (flag == "--python") python = argv[i + 1];
    else if (flag == "--host-cache" && std::string(argv[i + 1]) == "off") kiln::set_host_cache_limit(0);
    else {
      std::fprintf(stderr,
                   "usage: resnet50_step [--threads N] [--batch N] [--steps N] [--train-from conv1|layer4] "
                   "[--python PY|none] [--host-cache on|off]\n");
      return 1;
    }
  }
  if (threads < 1 || batch < 1 || steps < 1) {
    std::fprintf(stderr, "resnet50_step: --threads, --batch and --steps must be positive\n");
    return 1;
  }
  if (train_from != "conv1" && train_from != "layer4") {
    std::fprintf(stderr, "resnet50_step: --train-from is conv1 (all layers) or layer4 (fine-tuning), got %s\n",
                 train_from.c_str());
    return 1;
  }
  std::vector<Peer> peers;
  if (python != "none") {
    const std::string args = "--batch " + std::to_string(batch) + " --threads " + std::to_string(threads) +
                             " --steps " + std::to_string(steps) + " --train-from " + train_from +
                             " --precision " + precision + " --model " + model_name + " --size " +
                             std::to_string(Size);
    const auto lines = kiln_bench::peer_lines(python, "torch_resnet_step.py", args);
    if (lines.empty())
      std::printf("{\"bench\":\"resnet50_step\",\"peer\":\"torch\",\"skipped\":\"%s printed nothing\"}\n",
                  python.c_str());
    for (const auto& l : lines) {
      std::printf("%s\n", l.c_str());
      const std::string ms = kiln_bench::json_field(l, "step_ms");
      if (!ms.empty() && ms != "null") peers.push_back({kiln_bench::json_field(l, "peer"), std::atof(ms.c_str())});
    }
    std::fflush(stdout);
  }
  run(batch, threads, steps, train_from, peers);
  return 0;
}
