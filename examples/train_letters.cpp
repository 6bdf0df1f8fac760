// train_letters — a CSV file, a small MLP and AdamW: UCI letter-recognition (20,000 letters, 16
// integer features, 26 classes) with a 16-256-256-26 MLP (LayerNorm, GELU, Dropout), warmup +
// cosine schedule. The program a new user writes: no memcpy, no per-backend code, one loop.
//
//   build/examples/train_letters --data-dir data [--epochs 20] [--batch 64] [--lr 2e-3] [--threads 1]
#include <cstdio>
#include <string>

// One policy, the fused stance: the ops' unfused force_eager forms are not compiled (a fifth of
// this file's compile time; kiln/config.hpp, KILN_FORCE_EAGER_FORMS).
#define KILN_FORCE_EAGER_FORMS 0
#include "kiln/train.hpp"
#if KILN_CUDA_COMPILER
#include "kiln/train.cuh"
#endif

#include "cli.hpp"

namespace {

using namespace kiln;
using Model = nn::Sequential<nn::Linear<16, 256>, nn::LayerNorm<256>, nn::GELU, nn::Dropout<0.1>, nn::Linear<256, 256>,
                             nn::GELU, nn::Linear<256, 26>>;

struct Options {
  int epochs = 20, threads = 1;
  index_t batch = 64;
  double lr = 2e-3;
  std::string data_dir = "data";
};

template <class Space>
void fit(const Options& o, const data::Dataset& train_set, const data::Dataset& test_set) {
  auto exec = make_executor<Space>(o.threads);
  typename Model::template on<Space> model(/*seed=*/0);
  optim::AdamW opt(model, {.lr = o.lr, .weight_decay = 0.05});
  train::Step step(model, opt, exec);
  data::BatchLoader<Space> loader(train_set, {.batch_size = o.batch, .seed = 0}, exec);
  const index_t steps = o.epochs * loader.batches_per_epoch();
  step.set_schedule(optim::WarmupCosineLr(steps / 20, steps, o.lr), steps);
  std::printf("%s\nstep: %s\n", model.describe().c_str(), step.describe().c_str());
  for (int epoch = 0; epoch < o.epochs; ++epoch) {
    loader.start_epoch(epoch);
    double loss = 0;
    while (const auto* batch = loader.next()) {
      step(*batch);
      if (step.window_full())
        for (float l : step.take_losses(true)) loss += l;
    }
    for (float l : step.take_losses(true)) loss += l;
    std::printf("epoch %2d/%d  train loss %.4f  test accuracy %.4f\n", epoch + 1, o.epochs,
                loss / double(loader.batches_per_epoch()), train::accuracy(model, exec, test_set));
  }
  std::printf("final test accuracy %.4f\n", train::accuracy(model, exec, test_set));
}

}  // namespace

int main(int argc, char** argv) try {
  Options o;
  kiln_example::Flags flags;
  flags.add("--epochs", o.epochs, kiln_example::positive);
  flags.add("--batch", o.batch, kiln_example::positive);
  flags.add("--lr", o.lr, kiln_example::positive);
  flags.add("--threads", o.threads, kiln_example::positive);
  flags.add("--data-dir", o.data_dir);
  flags.parse(argc, argv,
              "usage: train_letters [--epochs N] [--batch N] [--lr X] [--threads N] [--data-dir DIR]\n"
              "Trains an MLP with LayerNorm, GELU and Dropout on UCI letter-recognition (warmup + cosine).\n");
  auto all = data::load_csv_classification(o.data_dir + "/letter-recognition.data.gz",
                                           data::CsvOptions::letter_recognition());
  auto [train_set, test_set] = data::split(all, 16000, {.seed = 0, .stratified = true});
  auto norm = data::fit_normalizer(train_set, {.standardize = data::Standardize::per_feature});
  norm.apply(train_set);
  norm.apply(test_set);
  std::printf("data: %lld train / %lld test letters, %lld features\n", (long long)train_set.n,
              (long long)test_set.n, (long long)train_set.d);
#if KILN_CUDA_COMPILER
  if (cu::device_available()) {
    fit<kiln::cuda>(o, train_set, test_set);
    return 0;
  }
  if (kiln::device_required()) return cu::report_no_device("train_letters");  // KILN_REQUIRE_DEVICE
#else
  KILN_CHECK(!kiln::device_required(), ValueError, "KILN_REQUIRE_DEVICE is set, but this build has no CUDA");
#endif
  fit<kiln::host>(o, train_set, test_set);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "train_letters: %s\n", e.what());
  return 1;
}
