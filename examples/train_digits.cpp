// train_digits — the main job: an MLP 400-256-128-10 learns digits20 (20×20 MNIST digits) with
// AdamW. One training loop for every backend, precision, stance and accumulation: built by nvcc
// it trains on the GPU when one is present; otherwise, and in host-only builds, on the CPU.
//
//   build/examples/train_digits --data-dir data [--epochs 10] [--batch 64] [--accumulate 1]
//     [--lr 1e-3] [--lr-scaling sqrt] [--precision fp32] [--stance fused] [--seed 0] [--threads 1]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "kiln/train.hpp"
#if KILN_CUDA_COMPILER
#include "kiln/train.cuh"
#endif

#include "cli.hpp"

namespace {

using kiln::index_t;
using Model = kiln::nn::Sequential<kiln::nn::Linear<400, 256>, kiln::nn::ReLU, kiln::nn::Linear<256, 128>,
                                   kiln::nn::ReLU, kiln::nn::Linear<128, 10>>;
constexpr index_t base_batch = 64;  // the batch --lr is tuned for

struct Options {
  int epochs = 10, threads = 1;
  index_t batch = 64, accumulate = 1;
  double lr = 1e-3;
  std::string lr_scaling = "sqrt", precision = "fp32", stance = "fused", data_dir = "data";
  std::uint64_t seed = 0;
};

Options parse(int argc, char** argv) {
  Options o;
  kiln_example::Flags flags;
  flags.add("--epochs", o.epochs);
  flags.add("--batch", o.batch);
  flags.add("--accumulate", o.accumulate);
  flags.add("--lr", o.lr);
  flags.add("--lr-scaling", o.lr_scaling);
  flags.add("--precision", o.precision);
  flags.add("--stance", o.stance);
  flags.add("--seed", o.seed);
  flags.add("--threads", o.threads);
  flags.add("--data-dir", o.data_dir);
  flags.parse(argc, argv,
              "usage: train_digits [--epochs N] [--batch N] [--accumulate N] [--lr X] [--lr-scaling none|linear|"
              "sqrt] [--precision fp32|tf32|bf16_mixed|fp16_mixed] [--stance fused|force_eager] [--seed N] "
              "[--threads N] [--data-dir DIR]\nTrains an MLP 400-256-128-10 (ReLU, AdamW) on digits20. --lr is "
              "tuned for an effective batch of 64; --lr-scaling carries it to batch x accumulate.\n");
  KILN_CHECK(o.epochs > 0 && o.batch > 0 && o.accumulate > 0 && o.lr > 0 && o.threads > 0, kiln::ValueError,
             "--epochs, --batch, --accumulate, --lr and --threads must be positive");
  return o;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

template <class Space, class Policy>
void train(const Options& o, const kiln::data::Dataset& train_set, const kiln::data::Dataset& test_set) {
  auto exec = kiln::make_executor<Space>(o.threads);
  typename Model::template on<Space> model(o.seed);
  const index_t effective = o.batch * o.accumulate;
  const double lr = kiln::optim::scale_lr(kiln::optim::batch_scaling(o.lr_scaling), o.lr, base_batch, effective);
  kiln::optim::AdamW opt(model, {.lr = lr});
  kiln::train::Step step(model, opt, exec, Policy{}, {}, {.accumulate = o.accumulate});
  kiln::data::BatchLoader<Space> loader(train_set, {.batch_size = o.batch, .seed = o.seed}, exec);
  std::printf("step: %s\neffective batch %lld (%lld x %lld); AdamW lr %g (%s scaling from batch %lld, --lr %g)\n",
              step.describe().c_str(), (long long)effective, (long long)o.batch, (long long)o.accumulate, lr,
              o.lr_scaling.c_str(), (long long)base_batch, o.lr);
  std::vector<double> epoch_seconds;
  const auto start = std::chrono::steady_clock::now();
  double loss_sum = 0;
  auto read_losses = [&] {  // a NaN or infinite loss throws, naming its micro-batch
    for (float loss : step.take_losses(/*require_finite=*/true)) loss_sum += loss;
  };
  for (int epoch = 0; epoch < o.epochs; ++epoch) {
    const auto t0 = std::chrono::steady_clock::now();
    loader.start_epoch(epoch);
    if (epoch == o.epochs - 1) step.record_next_step();
    loss_sum = 0;
    while (const auto* batch = loader.next()) {
      step(*batch);
      if (step.window_full()) read_losses();
    }
    read_losses();
    epoch_seconds.push_back(seconds_since(t0));
    std::printf("epoch %2d/%d  train loss %.4f  test accuracy %.4f  %.3f s\n", epoch + 1, o.epochs,
                loss_sum / double(loader.batches_per_epoch()), kiln::train::accuracy(model, exec, test_set),
                epoch_seconds.back());
  }
  std::sort(epoch_seconds.begin(), epoch_seconds.end());
  const auto rep = kiln::train::report(step);
  std::printf("%sfinal test accuracy %.4f; total %.2f s; median epoch %.4f s; waited for data %.4f s\n"
              "%.1f kernels per training step (%lld predicted at compile time)\n",
              rep.str().c_str(), kiln::train::accuracy(model, exec, test_set), seconds_since(start),
              epoch_seconds[epoch_seconds.size() / 2], loader.wait_seconds(), rep.kernels_per_step,
              (long long)rep.predicted);
}

template <class Space>
void run(const Options& o, const kiln::data::Dataset& tr, const kiln::data::Dataset& te) {
  kiln::select_policy<kiln::accumulate<kiln::dyn>>(o.precision, o.stance,
                                                   [&]<class Policy>() { train<Space, Policy>(o, tr, te); });
}

}  // namespace

int main(int argc, char** argv) try {
  const Options o = parse(argc, argv);
  const std::string dir = o.data_dir + "/";
  auto train_set = kiln::data::load_idx_classification(dir + "digits20-train-images-idx3-ubyte.gz",
                                                       dir + "digits20-train-labels-idx1-ubyte.gz", 10);
  auto test_set = kiln::data::load_idx_classification(dir + "digits20-test-images-idx3-ubyte.gz",
                                                      dir + "digits20-test-labels-idx1-ubyte.gz", 10);
  // MNIST-style global standardisation (one mean and std from the training set).
  auto norm = kiln::data::fit_normalizer(train_set, {.scale = 1.0f / 255, .standardize = kiln::data::Standardize::global});
  norm.apply(train_set);
  norm.apply(test_set);
  std::printf("data: %lld train / %lld test digits, %lld features; %s\n", (long long)train_set.n,
              (long long)test_set.n, (long long)train_set.d, Model(o.seed).describe().c_str());
#if KILN_CUDA_COMPILER
  if (kiln::cu::device_available()) {
    std::printf("device: CUDA (%s)\n", kiln::cu::device_name().c_str());
    run<kiln::cuda>(o, train_set, test_set);
    return 0;
  }
  if (kiln::device_required()) return kiln::cu::report_no_device("train_digits");  // KILN_REQUIRE_DEVICE
  std::printf("device: CPU, %d thread%s (no CUDA device: %s)\n", o.threads, o.threads == 1 ? "" : "s",
              kiln::cu::device_unavailable_reason().c_str());
#else
  KILN_CHECK(!kiln::device_required(), kiln::ValueError, "KILN_REQUIRE_DEVICE is set, but this build has no CUDA");
  std::printf("device: CPU, %d thread%s (this build has no CUDA: nvcc was not found)\n", o.threads,
              o.threads == 1 ? "" : "s");
#endif
  run<kiln::host>(o, train_set, test_set);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "train_digits: %s\n", e.what());
  return 1;
}
