// train_cnn_digits — a small CNN learns digits20 (20×20 MNIST digits) with AdamW:
// conv16-bn-relu-pool / conv32-bn-relu-pool / fc128 / fc10, PyTorch's layers and initialisation.
// The model's type carries every size (a wrong one is a compile error); BatchNorm2d + ReLU and
// Linear + ReLU run fused. Built by nvcc with cuDNN it trains on the GPU when one is present
// (NCHW; convolution through cuDNN), otherwise, and in host-only builds, on the CPU.
//
//   build/examples/train_cnn_digits --data-dir data [--epochs 10] [--batch 64] [--accumulate 1]
//     [--lr 2e-3] [--lr-scaling sqrt] [--schedule cosine] [--crop-pad 1] [--label-smoothing 0.1] [--stance fused] [--seed 0] [--threads 1]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "kiln/data/augment.hpp"
#include "kiln/models/convnets.hpp"
#include "kiln/train.hpp"
#if KILN_CUDA_COMPILER && defined(KILN_HAVE_CUDNN)
#include "kiln/nn/cuda.cuh"
#include "kiln/train.cuh"
#define KILN_EXAMPLE_CUDA 1  // convolution needs cuDNN on the device
#endif

#include "cli.hpp"

namespace {

using kiln::index_t;
using Cnn = kiln::models::DigitsCnn;  // kiln/models/convnets.hpp
constexpr index_t base_batch = 64;  // the batch --lr is tuned for

struct Options {
  int epochs = 10, threads = 1;
  index_t batch = 64, accumulate = 1, crop_pad = 1;
  double lr = 2e-3, label_smoothing = 0.1;
  std::string lr_scaling = "sqrt", schedule = "cosine", precision = "fp32", stance = "fused", layout = "nchw",
              data_dir = "data";
  std::uint64_t seed = 0;
};

Options parse(int argc, char** argv) {
  Options o;
  kiln_example::Flags flags;
  flags.add("--epochs", o.epochs, kiln_example::positive);
  flags.add("--batch", o.batch, kiln_example::positive);
  flags.add("--accumulate", o.accumulate, kiln_example::positive);
  flags.add("--lr", o.lr, kiln_example::positive);
  flags.add("--lr-scaling", o.lr_scaling);
  flags.add("--schedule", o.schedule);
  flags.add("--crop-pad", o.crop_pad, kiln_example::non_negative);
  flags.add("--label-smoothing", o.label_smoothing, kiln_example::non_negative);
  flags.add("--precision", o.precision);
  flags.add("--stance", o.stance);
  flags.add("--layout", o.layout);
  flags.add("--seed", o.seed);
  flags.add("--threads", o.threads, kiln_example::positive);
  flags.add("--data-dir", o.data_dir);
  flags.parse(argc, argv,
              "usage: train_cnn_digits [--epochs N] [--batch N] [--accumulate N] [--lr X] [--lr-scaling "
              "none|linear|sqrt] [--schedule cosine|constant] [--crop-pad N] [--label-smoothing X] [--precision fp32] "
              "[--stance fused|force_eager] [--layout nchw|nhwc] [--seed N] [--threads N] "
              "[--data-dir DIR]\nTrains a CNN (conv16-bn-relu-pool, conv32-bn-relu-pool, fc128, fc10; AdamW) on "
              "digits20 (on the GPU when there is one). --lr is tuned for an effective batch of 64; "
              "--lr-scaling carries it to batch x accumulate; --schedule cosine anneals it to 0 over the run. Training images are shifted by up to "
              "--crop-pad pixels (a random crop of the zero-padded digit; 0: none).\n");
  KILN_CHECK(o.crop_pad >= 0 && o.crop_pad < 20, kiln::ValueError, "--crop-pad must be in [0, 20), got ", o.crop_pad);
  KILN_CHECK(o.epochs > 0 && o.batch > 0 && o.accumulate > 0 && o.lr > 0 && o.threads > 0, kiln::ValueError,
             "--epochs, --batch, --accumulate, --lr and --threads must be positive");
  // Convolution and batch norm take fp32 only so far: mixed precision covers Linear layers.
  KILN_CHECK(o.schedule == "cosine" || o.schedule == "constant", kiln::ValueError, "--schedule ", o.schedule,
             ": the schedules are cosine and constant");
  KILN_CHECK(o.layout == "nchw" || o.layout == "nhwc", kiln::ValueError, "--layout ", o.layout,
             ": the layouts are nchw and nhwc (channels-last)");
  KILN_CHECK(o.precision == "fp32", kiln::ValueError, "--precision ", o.precision,
             ": the CNN's convolution and batch-norm layers run in fp32 only (mixed precision covers Linear "
             "layers so far)");
  return o;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// train_set holds raw pixels (0..255): every batch is augmented (random crop) and normalised by
// `augment` as it is trained on. test_set is normalised already.
template <class Space, class Cnn, class Policy>
void train(const Options& o, const kiln::data::Dataset& train_set, const kiln::data::Dataset& test_set,
           const kiln::data::AugmentOptions& augment) {
  auto exec = kiln::make_executor<Space>(o.threads);
  typename Cnn::template on<Space> model(o.seed);
  const index_t effective = o.batch * o.accumulate;
  const double lr = kiln::optim::scale_lr(kiln::optim::batch_scaling(o.lr_scaling), o.lr, base_batch, effective);
  kiln::optim::AdamW opt(model, {.lr = lr});
  kiln::train::Step step(model, opt, exec, Policy{}, kiln::train::CrossEntropy{{.label_smoothing = o.label_smoothing}},
                         {.accumulate = o.accumulate});
  kiln::data::BatchLoader<Space> loader(train_set, {.batch_size = o.batch, .seed = o.seed}, exec);
  // Cosine annealing over every optimizer step of the run (PyTorch's CosineAnnealingLR, stepped per batch).
  const index_t micro_batches = loader.batches_per_epoch() * o.epochs;
  const index_t optimizer_steps = (micro_batches + o.accumulate - 1) / o.accumulate;
  if (o.schedule == "cosine") step.set_schedule(kiln::optim::CosineAnnealingLr(lr, optimizer_steps));
  std::printf("step: %s\neffective batch %lld (%lld x %lld); AdamW lr %g (%s scaling from batch %lld, --lr %g), %s\n",
              step.describe().c_str(), (long long)effective, (long long)o.batch, (long long)o.accumulate, lr,
              o.lr_scaling.c_str(), (long long)base_batch, o.lr,
              o.schedule == "cosine" ? "cosine-annealed to 0" : "constant");
  std::vector<double> epoch_seconds;
  const auto start = std::chrono::steady_clock::now();
  double loss_sum = 0;
  kiln::Tensor<float, Space, kiln::dyn> images;  // the augmented batch, reused
  auto read_losses = [&] {  // a NaN or infinite loss throws, naming its micro-batch
    for (float loss : step.take_losses(/*require_finite=*/true)) loss_sum += loss;
  };
  for (int epoch = 0; epoch < o.epochs; ++epoch) {
    const auto t0 = std::chrono::steady_clock::now();
    loader.start_epoch(epoch);
    if (epoch == o.epochs - 1) step.record_next_step();
    loss_sum = 0;
    while (const auto* batch = loader.next()) {
      // The batch's digits, shifted and normalised where the model runs (one kernel); the
      // choices depend on (seed, epoch, position in the epoch) only.
      step(kiln::data::augment_batch(exec, *batch, images, 1, 20, 20, augment, o.batch));
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

}  // namespace

int main(int argc, char** argv) try {
  const Options o = parse(argc, argv);
  const std::string dir = o.data_dir + "/";
  auto train_set = kiln::data::load_idx_classification(dir + "digits20-train-images-idx3-ubyte.gz",
                                                       dir + "digits20-train-labels-idx1-ubyte.gz", 10);
  auto test_set = kiln::data::load_idx_classification(dir + "digits20-test-images-idx3-ubyte.gz",
                                                      dir + "digits20-test-labels-idx1-ubyte.gz", 10);
  // MNIST-style global standardisation (one mean and std from the training set): applied to the
  // test set here and to each training batch by the augmentation, after the random crop, so the
  // padding is normalised like a black border (torchvision's RandomCrop before Normalize).
  auto norm = kiln::data::fit_normalizer(train_set, {.scale = 1.0f / 255, .standardize = kiln::data::Standardize::global});
  norm.apply(test_set);
  const kiln::data::AugmentOptions augment{.pad = o.crop_pad, .flip = false, .scale = norm.scale,
                                           .mean = {norm.mean[0]}, .stddev = {1.0f / norm.inv_std[0]},
                                           .seed = o.seed};
  std::printf("data: %lld train / %lld test digits, %lld features; %s\n", (long long)train_set.n,
              (long long)test_set.n, (long long)train_set.d, Cnn(o.seed).describe().c_str());
  using Fp32 = kiln::precision::fp32;
  using Acc = kiln::accumulate<kiln::dyn>;
  auto with_stance = [&]<class Space, class Model>() {
    if (o.stance == kiln::stance::fused::name)
      train<Space, Model, kiln::policy<Fp32, kiln::stance::fused, Acc>>(o, train_set, test_set, augment);
    else if (o.stance == kiln::stance::force_eager::name)
      train<Space, Model, kiln::policy<Fp32, kiln::stance::force_eager, Acc>>(o, train_set, test_set, augment);
    else throw kiln::ValueError("unknown stance \"" + o.stance + "\"; the stances are fused and force_eager");
  };
#if KILN_EXAMPLE_CUDA
  if (kiln::cu::device_available()) {
    std::printf("device: CUDA (%s); convolution through cuDNN\n", kiln::cu::device_name().c_str());
    KILN_CHECK(o.layout == "nchw", kiln::ValueError, "--layout ", o.layout,
               ": on CUDA the convnet layers run NCHW only so far");
    with_stance.template operator()<kiln::cuda, Cnn>();
    return 0;
  }
  if (kiln::device_required()) return kiln::cu::report_no_device("train_cnn_digits");  // KILN_REQUIRE_DEVICE
  std::printf("device: CPU, %d thread%s (no CUDA device: %s)\n", o.threads, o.threads == 1 ? "" : "s",
              kiln::cu::device_unavailable_reason().c_str());
#else
  KILN_CHECK(!kiln::device_required(), kiln::ValueError,
             "KILN_REQUIRE_DEVICE is set, but this build has no CUDA with cuDNN");
  std::printf("device: CPU, %d thread%s\n", o.threads, o.threads == 1 ? "" : "s");
#endif
  if (o.layout == "nhwc") with_stance.template operator()<kiln::host, Cnn::with_layout<kiln::nn::layout::nhwc>>();
  else with_stance.template operator()<kiln::host, Cnn>();
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "train_cnn_digits: %s\n", e.what());
  return 1;
}
