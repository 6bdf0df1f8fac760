// bench/convnet — one training step (forward, cross-entropy, backward, AdamW) of the two reference
// convnets (kiln/models/convnets.hpp: DigitsCnn on 20x20 digits, ResNet9<32> on 32x32 RGB) on the
// CPU backend at batch 64 and 256, side by side with PyTorch eager and torch.compile
// (bench/torch_convnet.py, the same layers) run in the same process tree BEFORE kiln's runs, with
// the same --threads.
//
// Output, JSON lines: the peer's own lines first (versions, BLAS, thread limits, or a "skipped"
// reason); then per model and batch
//   kiln:     bench, backend ("cpu"), model, layout, batch, threads, kiln_ms, images_per_s, epoch_s (digits:
//             the 4,000-image training set), kernels_per_step, steps;
//   per peer: bench, model, layout, batch, threads, kiln_ms, peer ("torch_eager", "torch_compiled"),
//             peer_ms, speedup (peer_ms / kiln_ms).
// Medians over --seconds of steps per measurement after warm-up steps.
//
//   build/bench/convnet [--threads 1] [--seconds 2] [--models digits_cnn,resnet9_w32]
//                       [--batches 64,256] [--layouts nchw,nhwc] [--python PY|none]
// kiln runs each model in every --layouts entry (nhwc: Model::with_layout<layout::nhwc>); its lines
// carry "layout". The peers run PyTorch's default (contiguous NCHW) memory format.
//
// ResNet-18 and ResNet-50 (torchvision's layout, kiln::models::ResNet18 / ResNet50, 10 classes)
// at 32x32 or 224x224: --models resnet18_32, resnet18_224, resnet50_32, resnet50_224. Each runs
// as its own program beside this one (resnet18_32_step, resnet18_step, resnet50_32_step,
// resnet50_step; _bf16 from convnet_bf16: bench/resnet50_step.cpp's builds, a model type each,
// built by `cmake --build build --target bench_convnet_resnets`), once per --batches entry and
// --train-from entry (conv1: full training; layer4: fine-tuning layer4 + fc), --steps timed
// steps each: a process per measurement, so each line's peak resident memory is that
// configuration's alone, and the peer (bench/torch_resnet_step.py: torchvision's model, eager
// and torch.compile, contiguous and channels_last, each in its own process) in the same run.
// Their lines are resnet50_step's (model, size, step_ms, images_per_s, peak_rss_mib, one line
// per peer with its speedup, and a summary naming the fastest peer); kiln runs them NHWC.
//
//   build/bench/convnet --models resnet18_32,resnet18_224,resnet50_32,resnet50_224 --batches 8,32
//                       --train-from conv1,layer4 [--steps 3] [--threads 1]
//
// bench_convnet_bf16 is the same program under the bf16_mixed policy (built with
// KILN_BENCH_BF16_MIXED: one policy per program, one program's compile time), its peers under
// torch.autocast(bfloat16); kiln's lines carry "precision".
#include <unistd.h>  // access

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/models/convnets.hpp"
#include "kiln/train.hpp"

#include "bench_policy.hpp"
#include "mlp_step.hpp"

namespace {

using kiln::index_t;
using kiln_bench::median;
using kiln_bench::Policy;
using kiln_bench::precision;

struct KilnResult {
  double ms;
  double kernels;
  int steps;
};

// Median step of Model at `batch` over random inputs in [-1, 1) and random labels.
template <class Model>
KilnResult kiln_steps(index_t batch, int threads, double seconds) {
  kiln::CpuExecutor exec(threads);
  Model model(0);
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
  for (int i = 0; i < 3; ++i) step(b);  // warm-up: scratch and allocations reach their sizes
  step.take_losses();
  std::vector<double> times;
  const auto start = std::chrono::steady_clock::now();
  const std::size_t launches0 = exec.stats().launches();
  while (times.size() < 3 || (times.size() < 200 && std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                                                                    start).count() < seconds)) {
    const auto t0 = std::chrono::steady_clock::now();
    step(b);
    times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    step.take_losses();  // bounded: losses are read every step, as a training loop would
  }
  const double kernels = double(exec.stats().launches() - launches0) / double(times.size());
  return {median(times), kernels, int(times.size())};
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) out.push_back(item);
  return out;
}

// The program that measures ResNet row `model` (resnet18_32 ...), or "" when it is not one.
std::string resnet_program(const std::string& model) {
  const std::string suffix = std::string(precision) == "fp32" ? "" : "_bf16";
  if (model == "resnet50_224") return "resnet50_step" + suffix;
  if (model == "resnet50_32") return "resnet50_32_step" + suffix;
  if (model == "resnet18_224") return "resnet18_step" + suffix;
  if (model == "resnet18_32") return "resnet18_32_step" + suffix;
  return "";
}

// Runs the ResNet row's program (next to this one) once per batch and train_from; its lines go
// straight to our stdout as it prints them.
void run_resnet_rows(const std::string& model, const std::string& self, const std::vector<std::string>& batches,
                     const std::vector<std::string>& train_from, int threads, int steps, const std::string& python) {
  const std::string dir = self.find('/') == std::string::npos ? "." : self.substr(0, self.rfind('/'));
  const std::string program = dir + "/" + resnet_program(model);
  if (access(program.c_str(), X_OK) != 0) {
    std::printf("{\"bench\": \"convnet\", \"model\": \"%s\", \"skipped\": \"%s is not built (cmake --build build "
                "--target bench_convnet_resnets)\"}\n",
                model.c_str(), program.c_str());
    return;
  }
  for (const std::string& tf : train_from)
    for (const std::string& bs : batches) {
      const std::string cmd = "'" + program + "' --batch " + std::to_string(std::atol(bs.c_str())) + " --threads " +
                              std::to_string(threads) + " --steps " + std::to_string(steps) + " --train-from '" + tf +
                              "' --python '" + python + "'";
      std::fflush(stdout);  // ours first, then the child's
      const int rc = std::system(cmd.c_str());
      if (rc != 0)
        std::printf("{\"bench\": \"convnet\", \"model\": \"%s\", \"batch\": %ld, \"train_from\": \"%s\", "
                    "\"failed\": \"%s exited with status %d\"}\n",
                    model.c_str(), std::atol(bs.c_str()), tf.c_str(), program.c_str(), rc);
    }
}

struct PeerTime {
  std::string model, peer;
  long batch;
  double ms;
};

}  // namespace

int main(int argc, char** argv) {
  int threads = 1, steps = 3;
  double seconds = 2.0;
  std::string models = "digits_cnn,resnet9_w32", batches = "64,256", layouts = "nchw,nhwc", train_from = "conv1",
              python = kiln_bench::default_python();
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--threads") threads = std::atoi(argv[i + 1]);
    else if (a == "--seconds") seconds = std::atof(argv[i + 1]);
    else if (a == "--models") models = argv[i + 1];
    else if (a == "--batches") batches = argv[i + 1];
    else if (a == "--layouts") layouts = argv[i + 1];
    else if (a == "--python") python = argv[i + 1];
    else if (a == "--train-from") train_from = argv[i + 1];
    else if (a == "--steps") steps = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "convnet: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  // The ResNet rows run as programs of their own (file comment); the rest here, their peers first.
  std::string small_models;
  for (const std::string& model : split(models))
    if (resnet_program(model).empty()) small_models += (small_models.empty() ? "" : ",") + model;
  std::vector<PeerTime> peers;
  if (python != "none" && !small_models.empty()) {
    const std::string args = "--threads " + std::to_string(threads) + " --models " + small_models + " --batches " +
                             batches + " --seconds " + std::to_string(seconds) + " --precision " + precision;
    const auto lines = kiln_bench::peer_lines(python, "torch_convnet.py", args);
    if (lines.empty())
      std::printf("{\"bench\": \"convnet\", \"peer\": \"torch\", \"skipped\": \"%s printed nothing\"}\n",
                  python.c_str());
    for (const auto& l : lines) {
      std::printf("%s\n", l.c_str());
      const std::string ms = kiln_bench::json_field(l, "median_ms");
      if (!ms.empty() && ms != "null")
        peers.push_back({kiln_bench::json_field(l, "model"), kiln_bench::json_field(l, "peer"),
                         std::atol(kiln_bench::json_field(l, "batch").c_str()), std::atof(ms.c_str())});
    }
    std::fflush(stdout);
  }
  using kiln::nn::layout;
  using Digits = kiln::models::DigitsCnn;
  using ResNet = kiln::models::ResNet9<32>;
  for (const std::string& model : split(models)) {
    if (!resnet_program(model).empty()) {
      run_resnet_rows(model, argv[0], split(batches), split(train_from), threads, steps, python);
      continue;
    }
    for (const std::string& bs : split(batches))
      for (const std::string& lay : split(layouts)) {
        const long batch = std::atol(bs.c_str());
        const bool last = lay == "nhwc";
        KilnResult k{};
        if (lay != "nchw" && !last) {
          std::printf("{\"bench\": \"convnet\", \"layout\": \"%s\", \"skipped\": \"unknown layout\"}\n", lay.c_str());
          continue;
        }
        if (model == "digits_cnn" && last) k = kiln_steps<Digits::with_layout<layout::nhwc>>(batch, threads, seconds);
        else if (model == "digits_cnn") k = kiln_steps<Digits>(batch, threads, seconds);
        else if (model == "resnet9_w32" && last) k = kiln_steps<ResNet::with_layout<layout::nhwc>>(batch, threads, seconds);
        else if (model == "resnet9_w32") k = kiln_steps<ResNet>(batch, threads, seconds);
        else {
          std::printf("{\"bench\": \"convnet\", \"model\": \"%s\", \"skipped\": \"unknown model\"}\n", model.c_str());
          continue;
        }
        std::printf("{\"bench\": \"convnet\", \"backend\": \"cpu\", \"model\": \"%s\", \"layout\": \"%s\", \"batch\": %ld, "
                    "\"threads\": %d, \"precision\": \"%s\", \"kiln_ms\": %.4f, \"images_per_s\": %.1f, ",
                    model.c_str(), lay.c_str(), batch, threads, precision, k.ms, double(batch) * 1000.0 / k.ms);
        if (model == "digits_cnn") std::printf("\"epoch_s\": %.4f, ", k.ms / 1000.0 * std::ceil(4000.0 / double(batch)));
        std::printf("\"kernels_per_step\": %.1f, \"steps\": %d}\n", k.kernels, k.steps);
        for (const auto& p : peers)
          if (p.model == model && p.batch == batch)
            std::printf("{\"bench\": \"convnet\", \"model\": \"%s\", \"layout\": \"%s\", \"batch\": %ld, \"threads\": %d, "
                        "\"kiln_ms\": %.4f, \"peer\": \"%s\", \"peer_ms\": %.4f, \"speedup\": %.3f}\n",
                        model.c_str(), lay.c_str(), batch, threads, k.ms, p.peer.c_str(), p.ms, p.ms / k.ms);
        std::fflush(stdout);
      }
  }
  return 0;
}
