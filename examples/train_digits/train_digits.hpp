// examples/train_digits/train_digits.hpp — train_digits' training loop, written once for every
// memory space and policy: it drives a train::StepBase, whatever policy the flags chose (the
// options, the model and the step makers are in steps.hpp).
//
//   train_digits.cpp    main: flags, data, CPU or GPU, the loop on the CPU
//   host_float.cpp      the CPU steps in fp32 and tf32 (every stance and mode)
//   host_bf16.cpp       ... in bf16_mixed
//   host_fp16.cpp       ... in fp16_mixed
//   device.cu           the GPU: the loop and its steps (built by nvcc, when there is one)
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "kiln/data/batch_loader.hpp"
#include "kiln/dist/process_group.hpp"
#include "kiln/io/training_log.hpp"
#include "kiln/optim/batch_scaling.hpp"
#include "kiln/train/checkpoint.hpp"
#include "kiln/train/checkpoint_dir.hpp"
#include "kiln/train/evaluate.hpp"
#include "kiln/train/memory_plan.hpp"
#include "kiln/train/report.hpp"

#include "steps.hpp"

namespace train_digits {

// The accuracy of a model in any space: on the CPU through host_accuracy.
template <class M, class Exec>
double accuracy(M& model, Exec& exec, const kiln::data::Dataset& dataset) {
  if constexpr (std::is_same_v<Exec, kiln::CpuExecutor>) return host_accuracy(model, exec, dataset);
  else return kiln::train::accuracy(model, exec, dataset);
}

// The GPU run (device.cu, in builds with nvcc): trains there and returns the exit status when a
// device answers; nothing when none does (then `why` says why), or exit status 2 under
// KILN_REQUIRE_DEVICE.
std::optional<int> train_on_device(const Options& o, const kiln::data::Dataset& train_set,
                                   const kiln::data::Dataset& test_set, std::string& why);

inline double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Loads every checkpoint of the directory into a fresh step; returns the exit status (0: all load).
template <class StepT>
int verify_checkpoints(const Options& o, StepT& step) {
  kiln::train::CheckpointDir dir(o.checkpoint_dir, {.keep = o.keep});
  int valid = 0, invalid = 0;
  for (const std::string& file : dir.list()) {
    try {
      const auto info = kiln::train::load_checkpoint(file, step);
      std::printf("valid   %s (optimizer step %lld, epoch %lld, batch %lld)\n", file.c_str(),
                  (long long)info.optimizer_steps, (long long)info.position.epoch, (long long)info.position.batch);
      ++valid;
    } catch (const kiln::DataError& e) {
      std::printf("INVALID %s\n", e.what());
      ++invalid;
    }
  }
  std::printf("checkpoints: %d valid, %d invalid\n", valid, invalid);
  return invalid == 0 && valid > 0 ? 0 : 1;
}

// --plan: the memory plan (kiln/train/memory_plan.hpp) at --batch, and the largest batch that
// fits the budget: --memory-budget, or the device's free memory (the host's available memory)
// less a margin of 10%.
template <class Space, class StepT>
int print_plan(const Options& o, const StepT& step) {
  const auto plan = kiln::train::plan_memory<kiln::optim::AdamW<Space>>(step.model(), step.optimizer().options(),
                                                                        o.threads, step.policy());
  std::size_t budget = std::size_t(o.memory_budget_mib * 1048576.0);
  const char* source = "--memory-budget";
  if (budget == 0) {
    budget = kiln::train::host_memory_budget();
    source = "available host memory less 10%";
#if KILN_CUDA_COMPILER
    if constexpr (!std::is_same_v<Space, kiln::host>) {
      std::size_t free_bytes = 0, total = 0;
      KILN_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
      budget = free_bytes / 10 * 9;
      source = "free device memory less 10%";
    }
#endif
  }
  std::printf("memory plan (%s, batch %lld per micro-batch; budget: %s)\n%s", step.policy().precision,
              (long long)o.batch, source, plan.str(o.batch, budget).c_str());
  return 0;
}

// The run: the model, its optimizer and a step of the policy the flags name (make_step(o, model,
// opt, exec, step_options)), trained for --epochs on `train_set`, with checkpoints, logs and the
// closing report. Compiled once per memory space, whatever the policy.
template <class Space, class MakeStep>
int train(const Options& o, const kiln::data::Dataset& train_set, const kiln::data::Dataset& test_set,
          MakeStep make_step) {
  auto exec = kiln::make_executor<Space>(o.threads);
  ModelOn<Space> model(o.seed);
  // Data-parallel under mpirun (kiln/dist/): --batch is the global batch, each rank takes its
  // share of it from its shard of the epoch, and the gradients are averaged over the ranks.
  auto& group = kiln::dist::ProcessGroup::world();
  const int ranks = group.size();
  KILN_CHECK(o.batch % ranks == 0, kiln::ValueError, "--batch ", o.batch, " is the global batch: it must split evenly ",
             "over the ", ranks, " ranks");
  KILN_CHECK(ranks == 1 || (o.checkpoint_dir.empty() && !o.resume), kiln::ValueError,
             "--checkpoint-dir is not supported in a data-parallel run yet (every rank would write the same files)");
  const index_t rank_batch = o.batch / ranks;
  const index_t effective = o.batch * o.accumulate;
  const double lr = kiln::optim::scale_lr(kiln::optim::batch_scaling(o.lr_scaling), o.lr, base_batch, effective);
  kiln::optim::AdamW opt(model, {.lr = lr});
  auto step_ptr = make_step(o, model, opt, exec,
                            {.accumulate = o.accumulate, .data_parallel = ranks > 1 ? &group : nullptr});
  auto& step = *step_ptr;
  if (o.plan) return print_plan<Space>(o, step);
  if (o.verify_checkpoints) return verify_checkpoints(o, step);
  kiln::data::BatchLoader<Space> loader(
      train_set, {.batch_size = rank_batch, .seed = o.seed, .shard = {group.rank(), ranks}}, exec);
  std::printf("step: %s\neffective batch %lld (%lld x %lld); AdamW lr %g (%s scaling from batch %lld, --lr %g)\n",
              step.describe().c_str(), (long long)effective, (long long)o.batch, (long long)o.accumulate, lr,
              o.lr_scaling.c_str(), (long long)base_batch, o.lr);
  // A value summed or averaged over the ranks: on MPI's host collectives, or (a GPU job torchrun
  // launched, which has none) through the step's NCCL group.
  auto over_ranks = [&](double* value, kiln::dist::ReduceOp op) {
#if KILN_CUDA_COMPILER
    if constexpr (!std::is_same_v<Space, kiln::host>) {
      if (!group.host_collectives()) return step.reducer()->nccl().all_reduce_host(value, 1, op);
    }
#endif
    group.all_reduce(value, 1, op);
  };
  if (ranks > 1)
    std::printf("data parallel: %d ranks (%s), batch %lld per rank from its shard of each epoch, gradients averaged "
                "before each optimizer step\n", ranks, group.backend(), (long long)rank_batch);

  std::optional<kiln::train::CheckpointDir> checkpoints;
  kiln::train::TrainPosition at{};
  double loss_sum = 0;  // this epoch's, carried through a checkpoint so a resumed epoch reports it whole
  if (!o.checkpoint_dir.empty()) checkpoints.emplace(o.checkpoint_dir, kiln::train::CheckpointDirOptions{.keep = o.keep});
  if (o.resume) {
    if (auto info = checkpoints->resume(step)) {
      at = info->position;
      if (auto it = info->metadata.find("train_digits.epoch_loss_sum"); it != info->metadata.end())
        loss_sum = std::stod(it->second);
      std::printf("resumed from %s: epoch %lld, batch %lld, optimizer step %lld\n", info->path.c_str(),
                  (long long)at.epoch + 1, (long long)at.batch, (long long)info->optimizer_steps);
    } else {
      std::printf("nothing to resume in %s: starting from scratch\n", o.checkpoint_dir.c_str());
    }
    std::fflush(stdout);  // said now: a run killed later (scripts/kill_test.sh) still reports it
  }
  KILN_CHECK(at.epoch <= o.epochs, kiln::ValueError, "the checkpoint has run ", at.epoch, " epochs and ", at.batch,
             " batches, more than --epochs ", o.epochs);
  const bool finished = at.epoch == o.epochs;
  std::optional<kiln::io::TrainingLog> log;
  if (!o.log_dir.empty() && group.is_root()) log.emplace(o.log_dir);

  std::vector<double> epoch_seconds;
  index_t rows_trained = 0;  // by this rank, in this run
  const auto start = std::chrono::steady_clock::now();
  auto window_start = start;
  double window_wait = loader.wait_seconds();
  index_t window_steps0 = step.optimizer_steps();
  auto read_losses = [&] {  // a NaN or infinite loss throws, naming its micro-batch
    const auto losses = step.take_losses(/*require_finite=*/true);
    double window_sum = 0;
    for (float loss : losses) {
      loss_sum += loss;  // one at a time: the same sums whether or not checkpoints split the windows
      window_sum += loss;
    }
    if (log && !losses.empty()) {
      const double dt = std::max(seconds_since(window_start), 1e-9);
      const double steps = double(step.optimizer_steps() - window_steps0);
      log->write(step.optimizer_steps(), {{"train/loss", window_sum / double(losses.size())},
                                          {"train/lr", opt.lr()},
                                          {"train/loss_scale", step.scaler().enabled() ? step.scaler().scale() : 1.0},
                                          {"perf/steps_per_s", steps / dt},
                                          {"perf/samples_per_s", double(losses.size()) * double(o.batch) / dt},
                                          {"perf/data_wait_fraction", (loader.wait_seconds() - window_wait) / dt}});
      window_start = std::chrono::steady_clock::now();
      window_wait = loader.wait_seconds();
      window_steps0 = step.optimizer_steps();
    }
  };
  auto save = [&](kiln::train::TrainPosition position, double epoch_loss) {
    checkpoints->save(step, position, {{"train_digits.epoch_loss_sum", kiln::train::detail::number_text(epoch_loss)}});
  };
  for (index_t epoch = at.epoch; epoch < o.epochs; ++epoch) {
    const auto t0 = std::chrono::steady_clock::now();
    loader.start_epoch(epoch, epoch == at.epoch ? at.batch : 0);
    if (epoch == o.epochs - 1) step.record_next_step();
    if (epoch != at.epoch) loss_sum = 0;
    while (const auto* batch = loader.next()) {
      step(*batch);
      rows_trained += batch->size;
      if (step.window_full()) read_losses();
      if (o.checkpoint_every > 0 && step.stepped() && step.optimizer_steps() % o.checkpoint_every == 0) {
        read_losses();  // the epoch's loss so far goes into the checkpoint
        save({epoch, loader.batches_taken()}, loss_sum);
      }
    }
    read_losses();
    epoch_seconds.push_back(seconds_since(t0));
    double epoch_loss = loss_sum / double(loader.batches_per_epoch());  // over every rank's shard
    over_ranks(&epoch_loss, kiln::dist::ReduceOp::average);
    std::printf("epoch %2lld/%d  train loss %.4f  test accuracy %.4f  %.3f s\n", (long long)epoch + 1, o.epochs,
                epoch_loss, accuracy(model, exec, test_set), epoch_seconds.back());
  }
  if (checkpoints && !finished) save({o.epochs, 0}, 0.0);
  const double final_accuracy = accuracy(model, exec, test_set);
  if (epoch_seconds.empty()) {  // a resume of a finished run
    std::printf("final test accuracy %.4f; the checkpoint is already at epoch %d\nstate crc32c %08x\n", final_accuracy,
                o.epochs, kiln::train::state_checksum(model));
    return 0;
  }
  std::sort(epoch_seconds.begin(), epoch_seconds.end());
  const auto rep = kiln::train::report(step);
  std::printf("%s", step.mode_report().c_str());
  if (ranks > 1) {  // samples trained per second of the whole run: this rank's, and the job's
    const double seconds = seconds_since(start);
    double rank_rate = double(rows_trained) / seconds, job_rate = rank_rate;
    over_ranks(&job_rate, kiln::dist::ReduceOp::sum);
    std::printf("throughput: %.0f samples/s per rank (rank 0), %.0f samples/s over %d ranks\n", rank_rate, job_rate,
                ranks);
  }
  std::printf("%sfinal test accuracy %.4f; total %.2f s; median epoch %.4f s; waited for data %.4f s\n"
              "%.1f kernels per training step (%lld predicted at compile time)\nstate crc32c %08x\n",
              rep.str().c_str(), final_accuracy, seconds_since(start), epoch_seconds[epoch_seconds.size() / 2],
              loader.wait_seconds(), rep.kernels_per_step, (long long)rep.predicted, kiln::train::state_checksum(model));
  return 0;
}

}  // namespace train_digits
