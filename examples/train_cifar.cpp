// train_cifar — a ResNet-9 (kiln/models/convnets.hpp, width 32) learns CIFAR-10 with AdamW,
// random crops (padding 4) and horizontal flips, per-channel normalisation, and label smoothing,
// printing images/s per epoch. The binary CIFAR-10 (data_batch_1..5.bin, test_batch.bin from
// https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz) is read from --data-dir; without it the
// program says so and trains on synthetic images of the same shape (random pixels, random labels:
// nothing to learn, but the throughput is real). Built by nvcc with cuDNN it trains on the GPU
// when one is present (NCHW, convolution through cuDNN), otherwise on the CPU.
//
//   build/examples/train_cifar [--data-dir DIR] [--epochs 1] [--batch 128] [--lr 2e-3]
//     [--synthetic-images 2048] [--seed 0] [--threads 1] [--layout nchw]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "kiln/data/augment.hpp"
#include "kiln/data/cifar.hpp"
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
using ResNet = kiln::models::ResNet9<32>;
// The per-channel mean and standard deviation of CIFAR-10's training images (on 0..1 values), as
// the usual torchvision recipes hard-code them.
const std::vector<float> cifar_mean = {0.4914f, 0.4822f, 0.4465f};
const std::vector<float> cifar_std = {0.2470f, 0.2435f, 0.2616f};

struct Options {
  int epochs = 1, threads = 1;
  index_t batch = 128, synthetic_images = 2048;
  double lr = 2e-3;
  std::string data_dir, layout = "nchw";
  std::uint64_t seed = 0;
};

Options parse(int argc, char** argv) {
  Options o;
  kiln_example::Flags flags;
  flags.add("--epochs", o.epochs, kiln_example::positive);
  flags.add("--batch", o.batch, kiln_example::positive);
  flags.add("--lr", o.lr, kiln_example::positive);
  flags.add("--synthetic-images", o.synthetic_images, kiln_example::positive);
  flags.add("--seed", o.seed);
  flags.add("--threads", o.threads, kiln_example::positive);
  flags.add("--data-dir", o.data_dir);
  flags.add("--layout", o.layout);
  flags.parse(argc, argv,
              "usage: train_cifar [--data-dir DIR] [--epochs N] [--batch N] [--lr X] [--synthetic-images N] "
              "[--seed N] [--threads N] [--layout nchw|nhwc]\nTrains a ResNet-9 (width 32) on CIFAR-10 from DIR (the binary version), "
              "or on synthetic images of the same shape when DIR is not given or has no data_batch_1.bin.\n");
  KILN_CHECK(o.layout == "nchw" || o.layout == "nhwc", kiln::ValueError, "--layout ", o.layout,
             ": the layouts are nchw and nhwc (channels-last)");
  KILN_CHECK(o.epochs > 0 && o.batch > 0 && o.lr > 0 && o.threads > 0 && o.synthetic_images > 0, kiln::ValueError,
             "--epochs, --batch, --lr, --synthetic-images and --threads must be positive");
  return o;
}

// n random CIFAR-shaped images (pixels 0..255) with random labels.
kiln::data::Dataset synthetic(index_t n, std::uint64_t seed) {
  kiln::data::Dataset ds;
  ds.n = n;
  ds.d = kiln::data::cifar10_image_bytes;
  ds.num_classes = kiln::data::cifar10_num_classes;
  ds.sample_shape = {3, 32, 32};
  ds.features.resize(std::size_t(n * ds.d));
  ds.labels.resize(std::size_t(n));
  kiln::Generator gen(seed);
  for (float& v : ds.features) v = float(gen.below(256));
  for (auto& l : ds.labels) l = std::int32_t(gen.below(10));
  return ds;
}

// (x / 255 - mean[c]) / std[c] in place, planar [n, 3, 32, 32]: the evaluation images get what
// the augmentation does to training images, without the crop and flip.
void normalize(kiln::data::Dataset& ds) {
  const index_t plane = 32 * 32;
  for (index_t i = 0; i < ds.n; ++i)
    for (index_t c = 0; c < 3; ++c) {
      float* p = ds.features.data() + (i * 3 + c) * plane;
      for (index_t j = 0; j < plane; ++j) p[j] = (p[j] / 255.0f - cifar_mean[std::size_t(c)]) / cifar_std[std::size_t(c)];
    }
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

template <class Space, class Model>
void train(const Options& o, const kiln::data::Dataset& train_set, const kiln::data::Dataset& test_set, bool real) {
  auto exec = kiln::make_executor<Space>(o.threads);
  typename Model::template on<Space> model(o.seed);
  std::printf("model: %s\n", model.describe().c_str());
  kiln::optim::AdamW opt(model, {.lr = o.lr, .weight_decay = 5e-4});
  kiln::train::Step step(model, opt, exec, kiln::policy<>{}, kiln::train::CrossEntropy{{.label_smoothing = 0.1}});
  kiln::data::BatchLoader<Space> loader(train_set, {.batch_size = o.batch, .seed = o.seed}, exec);
  step.set_schedule(kiln::optim::CosineAnnealingLr(o.lr, loader.batches_per_epoch() * o.epochs));
  const kiln::data::AugmentOptions augment{.pad = 4, .flip = true, .scale = 1.0f / 255, .mean = cifar_mean,
                                           .stddev = cifar_std, .seed = o.seed};
  kiln::Tensor<float, Space, kiln::dyn> images;  // the augmented batch, reused
  std::vector<double> rates;
  for (int epoch = 0; epoch < o.epochs; ++epoch) {
    const auto t0 = std::chrono::steady_clock::now();
    loader.start_epoch(epoch);
    if (epoch == o.epochs - 1) step.record_next_step();
    double loss_sum = 0;
    index_t seen = 0;
    while (const auto* batch = loader.next()) {
      step(kiln::data::augment_batch(exec, *batch, images, 3, 32, 32, augment, o.batch));
      seen += batch->size;
      for (float loss : step.take_losses(/*require_finite=*/true)) loss_sum += loss;
    }
    const double s = seconds_since(t0);
    rates.push_back(double(seen) / s);
    std::printf("epoch %2d/%d  train loss %.4f  test accuracy %.4f  %.2f s  %.1f images/s\n", epoch + 1, o.epochs,
                loss_sum / double(loader.batches_per_epoch()), kiln::train::accuracy(model, exec, test_set), s,
                rates.back());
  }
  std::sort(rates.begin(), rates.end());
  const auto rep = kiln::train::report(step);
  std::printf("%sfinal test accuracy %.4f%s; median %.1f images/s (batch %lld, %d thread%s)\n"
              "%.1f kernels per training step (%lld predicted at compile time)\n",
              rep.str().c_str(), kiln::train::accuracy(model, exec, test_set), real ? "" : " (synthetic data)",
              rates[rates.size() / 2], (long long)o.batch, o.threads, o.threads == 1 ? "" : "s", rep.kernels_per_step,
              (long long)rep.predicted);
}

}  // namespace

int main(int argc, char** argv) try {
  const Options o = parse(argc, argv);
  kiln::data::Dataset train_set, test_set;
  const bool real = !o.data_dir.empty() && std::filesystem::exists(o.data_dir + "/data_batch_1.bin");
  if (real) {
    train_set = kiln::data::load_cifar10(o.data_dir, true);
    test_set = kiln::data::load_cifar10(o.data_dir, false);
    std::printf("data: CIFAR-10 from %s: %lld train / %lld test images\n", o.data_dir.c_str(), (long long)train_set.n,
                (long long)test_set.n);
  } else {
    train_set = synthetic(o.synthetic_images, o.seed + 1);
    test_set = synthetic(std::max<index_t>(o.synthetic_images / 4, 1), o.seed + 2);
    std::printf("data: no CIFAR-10 given (%s): training on %lld SYNTHETIC images of the same shape (random pixels "
                "and labels: the accuracy means nothing, the images/s are real)\n",
                o.data_dir.empty() ? "--data-dir not set" : ("no data_batch_1.bin in " + o.data_dir).c_str(),
                (long long)train_set.n);
  }
  normalize(test_set);
#if KILN_EXAMPLE_CUDA
  if (kiln::cu::device_available()) {
    std::printf("device: CUDA (%s); convolution through cuDNN\n", kiln::cu::device_name().c_str());
    KILN_CHECK(o.layout == "nchw", kiln::ValueError, "--layout ", o.layout,
               ": on CUDA the convnet layers run NCHW only so far");
    train<kiln::cuda, ResNet>(o, train_set, test_set, real);
    return 0;
  }
  if (kiln::device_required()) return kiln::cu::report_no_device("train_cifar");  // KILN_REQUIRE_DEVICE
  std::printf("device: CPU, %d thread%s (no CUDA device: %s)\n", o.threads, o.threads == 1 ? "" : "s",
              kiln::cu::device_unavailable_reason().c_str());
#else
  KILN_CHECK(!kiln::device_required(), kiln::ValueError, "KILN_REQUIRE_DEVICE is set, but this build has no CUDA with cuDNN");
  std::printf("device: CPU, %d thread%s\n", o.threads, o.threads == 1 ? "" : "s");
#endif
  if (o.layout == "nhwc") train<kiln::host, ResNet::with_layout<kiln::nn::layout::nhwc>>(o, train_set, test_set, real);
  else train<kiln::host, ResNet>(o, train_set, test_set, real);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "train_cifar: %s\n", e.what());
  return 1;
}
