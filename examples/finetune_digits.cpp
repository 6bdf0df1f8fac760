// finetune_digits — the fine-tuning recipe: take a network trained on one task, freeze its first
// layer and train the last two on a task it has not seen. The pretrained MLP 400-256-128-10 knows
// digits 0-4 only (a checkpoint of `train_digits --digits 0-4 --checkpoint-dir DIR`, or made here
// the same way when --checkpoint is not given); fine-tuning teaches it 5-9 with Linear<400, 256>
// frozen: no gradient buffer, no optimizer state, no weight-gradient GEMM and no backward below
// it (fewer kernels per step), and its weights bit-identical at the end.
//
//   build/examples/finetune_digits --data-dir data [--checkpoint FILE|DIR] [--epochs 5]
//     [--pretrain-epochs 5] [--pretrain-digits 0-4] [--digits 5-9] [--lr 1e-3] [--batch 64]
//     [--work-dir finetune_run] [--seed 0] [--threads 1]
//
// --checkpoint also takes weights PyTorch saved (safetensors.torch.save_file of the equivalent
// torch.nn.Sequential's state_dict()). --epochs 0 only loads and evaluates.
#include <chrono>
#include <cstdio>
#include <string>

#include "kiln/train.hpp"
#include "kiln/train/checkpoint_dir.hpp"
#if KILN_CUDA_COMPILER
#include "kiln/train.cuh"
#endif

#include "cli.hpp"
#include "digits_common.hpp"

namespace {

using kiln::index_t;
using Model = kiln_example::DigitsMlp;

struct Options {
  int epochs = 5, pretrain_epochs = 5, threads = 1;
  index_t batch = 64;
  double lr = 1e-3;
  std::string data_dir = "data", checkpoint, pretrain_digits = "0-4", digits = "5-9", work_dir = "finetune_run";
  std::uint64_t seed = 0;
};

Options parse(int argc, char** argv) {
  Options o;
  kiln_example::Flags flags;
  using kiln_example::positive;
  flags.add("--epochs", o.epochs, kiln_example::non_negative).add("--pretrain-epochs", o.pretrain_epochs, positive);
  flags.add("--threads", o.threads, positive).add("--batch", o.batch, positive).add("--lr", o.lr, positive);
  flags.add("--data-dir", o.data_dir).add("--checkpoint", o.checkpoint);
  flags.add("--pretrain-digits", o.pretrain_digits).add("--digits", o.digits).add("--work-dir", o.work_dir);
  flags.add("--seed", o.seed);
  flags.parse(argc, argv,
              "usage: finetune_digits [--data-dir DIR] [--checkpoint FILE|DIR] [--epochs N] [--pretrain-epochs N] "
              "[--pretrain-digits 0-4] [--digits 5-9] [--lr X] [--batch N] [--work-dir DIR] [--seed N] "
              "[--threads N]\nFine-tunes the last two layers of a digits MLP pretrained on --pretrain-digits "
              "(a train_digits checkpoint, or pretrained here into --work-dir) on --digits, its first layer frozen.\n");
  KILN_CHECK(o.epochs >= 0 && o.pretrain_epochs > 0 && o.batch > 0 && o.lr > 0 && o.threads > 0, kiln::ValueError,
             "--epochs must be >= 0; --pretrain-epochs, --batch, --lr and --threads positive");
  return o;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Trains `model` on `train` for `epochs` epochs (AdamW, the given lr), printing test accuracy.
template <class Space, class M, class Exec>
void fit(M& model, Exec& exec, const Options& o, int epochs, const kiln::data::Dataset& train,
         const kiln::data::Dataset& test, const char* what, kiln::train::CheckpointDir* save_to = nullptr) {
  kiln::optim::AdamW opt(model, {.lr = o.lr});
  kiln::train::Step step(model, opt, exec);
  kiln::data::BatchLoader<Space> loader(train, {.batch_size = o.batch, .seed = o.seed}, exec);
  for (int epoch = 0; epoch < epochs; ++epoch) {
    const auto t0 = std::chrono::steady_clock::now();
    loader.start_epoch(epoch);
    if (epoch == epochs - 1) step.record_next_step();
    double loss_sum = 0;
    while (const auto* batch = loader.next()) {
      step(*batch);
      if (step.window_full())
        for (float l : step.take_losses(true)) loss_sum += l;
    }
    for (float l : step.take_losses(true)) loss_sum += l;
    std::printf("%s epoch %d/%d  train loss %.4f  test accuracy %.4f  %.3f s\n", what, epoch + 1, epochs,
                loss_sum / double(loader.batches_per_epoch()), kiln::train::accuracy(model, exec, test),
                seconds_since(t0));
  }
  if (save_to != nullptr) {
    std::printf("saved %s\n", save_to->save(step, {epochs, 0}).c_str());
    return;
  }
  const auto rep = kiln::train::report(step);
  // Every layer trainable, as the compile-time prediction counts it.
  const index_t all_trainable = kiln::train::launches_per_step<M, decltype(opt), kiln::policy<>,
                                                               kiln::train::CrossEntropy, Space>(opt.options(), 1);
  std::printf("%.1f kernels per training step with the first layer frozen (%lld predicted); %lld with every layer "
              "trainable\n",
              rep.kernels_per_step, (long long)rep.predicted, (long long)all_trainable);
}

template <class Space>
int run(const Options& o, const kiln_example::DigitsData& data) {
  auto exec = kiln::make_executor<Space>(o.threads);
  const auto old_digits = kiln_example::parse_digits(o.pretrain_digits);
  const auto new_digits = kiln_example::parse_digits(o.digits);
  const auto old_test = kiln_example::only_digits(data.test, old_digits);
  const auto new_test = kiln_example::only_digits(data.test, new_digits);

  std::string weights = o.checkpoint;
  if (weights.empty()) {
    std::printf("no --checkpoint: pretraining on digits %s for %d epochs first, as `train_digits --digits %s "
                "--epochs %d --checkpoint-dir %s/pretrained` does\n",
                o.pretrain_digits.c_str(), o.pretrain_epochs, o.pretrain_digits.c_str(), o.pretrain_epochs,
                o.work_dir.c_str());
    typename Model::template on<Space> pretrained(o.seed);
    kiln::train::CheckpointDir dir(o.work_dir + "/pretrained");
    fit<Space>(pretrained, exec, o, o.pretrain_epochs, kiln_example::only_digits(data.train, old_digits), old_test,
               "pretrain", &dir);
    weights = dir.path();
  }
  if (std::filesystem::is_directory(weights)) {  // a checkpoint directory: its newest file
    const auto files = kiln::train::CheckpointDir(weights).list();
    KILN_CHECK(!files.empty(), kiln::DataError, "--checkpoint ", weights, ": the directory holds no checkpoints");
    weights = files.front();
  }

  // A fresh model, differently initialised: everything it knows comes from the file.
  typename Model::template on<Space> model(o.seed + 1);
  kiln::train::load_weights(weights, model);
  const double old_before = kiln::train::accuracy(model, exec, old_test);
  const double new_before = kiln::train::accuracy(model, exec, new_test);
  std::printf("loaded %s\npretrained: test accuracy %.4f on digits %s, %.4f on digits %s\n", weights.c_str(),
              old_before, o.pretrain_digits.c_str(), new_before, o.digits.c_str());
  if (o.epochs == 0) return 0;

  auto& first = model.template layer<0>();
  kiln::nn::freeze(first);
  const std::uint32_t frozen_before = kiln::train::state_checksum(first);
  std::printf("frozen: %s (%lld parameters); training the last two layers (%lld parameters)\n",
              first.describe().c_str(), (long long)(model.parameter_count() - model.trainable_parameter_count()),
              (long long)model.trainable_parameter_count());
  fit<Space>(model, exec, o, o.epochs, kiln_example::only_digits(data.train, new_digits), new_test, "fine-tune");
  const std::uint32_t frozen_after = kiln::train::state_checksum(first);
  std::printf("fine-tuned: test accuracy %.4f on digits %s (was %.4f), %.4f on digits %s (was %.4f)\n",
              kiln::train::accuracy(model, exec, new_test), o.digits.c_str(), new_before,
              kiln::train::accuracy(model, exec, old_test), o.pretrain_digits.c_str(), old_before);
  std::printf("frozen layer: crc32c %08x before, %08x after: %s\n", frozen_before, frozen_after,
              frozen_before == frozen_after ? "bit-identical" : "CHANGED");
  return frozen_before == frozen_after ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) try {
  const Options o = parse(argc, argv);
  const auto data = kiln_example::load_digits(o.data_dir);
#if KILN_CUDA_COMPILER
  if (kiln::cu::device_available()) {
    std::printf("device: CUDA (%s)\n", kiln::cu::device_name().c_str());
    return run<kiln::cuda>(o, data);
  }
  if (kiln::device_required()) return kiln::cu::report_no_device("finetune_digits");
  std::printf("device: CPU, %d thread%s (no CUDA device: %s)\n", o.threads, o.threads == 1 ? "" : "s",
              kiln::cu::device_unavailable_reason().c_str());
#else
  KILN_CHECK(!kiln::device_required(), kiln::ValueError, "KILN_REQUIRE_DEVICE is set, but this build has no CUDA");
  std::printf("device: CPU, %d thread%s\n", o.threads, o.threads == 1 ? "" : "s");
#endif
  return run<kiln::host>(o, data);
} catch (const std::exception& e) {
  std::fprintf(stderr, "finetune_digits: %s\n", e.what());
  return 1;
}
