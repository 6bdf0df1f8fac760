// train_digits — the main job: an MLP 400-256-128-10 learns digits20 (20×20 MNIST digits) with
// AdamW. One training loop for every backend, precision, stance and accumulation: built by nvcc
// it trains on the GPU when one is present; otherwise, and in host-only builds, on the CPU.
//
//   build/examples/train_digits --data-dir data [--epochs 10] [--batch 64] [--accumulate 1]
//     [--lr 1e-3] [--lr-scaling sqrt] [--precision fp32] [--stance fused] [--mode default] [--seed 0] [--threads 1]
//     [--digits 0-9] [--checkpoint-dir DIR] [--checkpoint-every N] [--keep 2] [--resume]
//     [--verify-checkpoints] [--log-dir DIR]
//
// Checkpoints (kiln/train/checkpoint_dir.hpp): with --checkpoint-dir the run saves there every
// --checkpoint-every optimizer steps and at its end; --resume continues from the newest valid one
// until --epochs epochs in all have run, bit for bit where an uninterrupted run would be (the
// closing "state crc32c" line says so). --verify-checkpoints loads every checkpoint in the
// directory, reports, and exits (non-zero when one does not load). --log-dir writes TensorBoard
// event files and scalars.csv (loss, lr, loss scale, steps/s, samples/s, data-wait fraction).
// --mode (kiln/policy/mode.hpp): reduce_overhead captures the step at each batch shape and
// replays it; max_autotune times each GEMM shape's candidates once and keeps the fastest, cached
// under KILN_CACHE_DIR. The closing lines say what the mode did.
//
// Data-parallel on the CPU: `mpirun -np 2 build/examples/train_digits --data-dir data` (as root,
// OpenMPI also wants --allow-run-as-root, and --oversubscribe where ranks outnumber cores). --batch
// stays the global batch: each rank takes batch / ranks rows of its shard of every epoch
// (LoaderOptions::shard), the gradients are averaged over the ranks before each optimizer step,
// and rank 0 prints, with a closing line of per-rank and whole-job throughput.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "kiln/io/training_log.hpp"
#include "kiln/train.hpp"
#include "kiln/train/checkpoint_dir.hpp"
#include "kiln/train/memory_plan.hpp"
#if KILN_CUDA_COMPILER
#include "kiln/train.cuh"
#endif

#include "cli.hpp"
#include "digits_common.hpp"

namespace {

using kiln::index_t;
using Model = kiln_example::DigitsMlp;
constexpr index_t base_batch = 64;  // the batch --lr is tuned for

struct Options {
  int epochs = 10, threads = 1;
  index_t batch = 64, accumulate = 1, checkpoint_every = 0, keep = 2;
  double lr = 1e-3;
  std::string lr_scaling = "sqrt", precision = "fp32", stance = "fused", mode = "default", data_dir = "data",
              digits = "all";
  std::string checkpoint_dir, log_dir;
  bool resume = false, verify_checkpoints = false, plan = false;
  double memory_budget_mib = 0;  // --plan's budget; 0: free memory less a margin
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
  flags.add("--precision", o.precision);
  flags.add("--stance", o.stance);
  flags.add("--mode", o.mode);
  flags.add("--seed", o.seed);
  flags.add("--threads", o.threads, kiln_example::positive);
  flags.add("--data-dir", o.data_dir);
  flags.add("--digits", o.digits);
  flags.add("--checkpoint-dir", o.checkpoint_dir);
  flags.add("--checkpoint-every", o.checkpoint_every, kiln_example::non_negative);
  flags.add("--keep", o.keep, kiln_example::positive);
  flags.add("--resume", o.resume);
  flags.add("--verify-checkpoints", o.verify_checkpoints);
  flags.add("--log-dir", o.log_dir);
  flags.add("--plan", o.plan);
  flags.add("--memory-budget", o.memory_budget_mib, kiln_example::positive);
  flags.parse(argc, argv,
              "usage: train_digits [--epochs N] [--batch N] [--accumulate N] [--lr X] [--lr-scaling none|linear|"
              "sqrt] [--precision fp32|tf32|bf16_mixed|fp16_mixed] [--stance fused|force_eager|eager_on_recompile|"
              "fail_on_recompile] [--mode default|reduce_overhead|max_autotune] [--seed N] "
              "[--threads N] [--data-dir DIR] [--digits 0-9] [--checkpoint-dir DIR] [--checkpoint-every N] "
              "[--keep K] [--resume] [--verify-checkpoints] [--log-dir DIR] [--plan] [--memory-budget MIB]\n"
              "Trains an MLP 400-256-128-10 (ReLU, AdamW) on digits20 (--digits: only those classes). --lr is "
              "tuned for an effective batch of 64; --lr-scaling carries it to batch x accumulate.\n"
              "--checkpoint-dir: save there every --checkpoint-every optimizer steps (0: only at the end), keeping "
              "the last --keep; --resume continues from the newest valid checkpoint until --epochs epochs in all "
              "have run. --verify-checkpoints: load every checkpoint in --checkpoint-dir, report, exit. --log-dir: "
              "TensorBoard event files and scalars.csv. --plan: print the memory a step takes at --batch and the largest "
              "batch that fits --memory-budget MiB (default: free memory less a margin), and exit.\n");
  KILN_CHECK(o.epochs > 0 && o.batch > 0 && o.accumulate > 0 && o.lr > 0 && o.threads > 0, kiln::ValueError,
             "--epochs, --batch, --accumulate, --lr and --threads must be positive");
  KILN_CHECK(o.checkpoint_every >= 0 && o.keep >= 1, kiln::ValueError,
             "--checkpoint-every must be >= 0 and --keep >= 1");
  KILN_CHECK(!o.checkpoint_dir.empty() || (!o.resume && !o.verify_checkpoints && o.checkpoint_every == 0),
             kiln::ValueError, "--resume, --verify-checkpoints and --checkpoint-every need --checkpoint-dir");
  return o;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
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
template <class Space, class Policy, class M, class Opt>
int print_plan(const Options& o, const M& model, const Opt& opt) {
  const auto plan = kiln::train::plan_memory<Opt, Policy>(model, opt.options(), o.threads);
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
  std::printf("memory plan (%s, batch %lld per micro-batch; budget: %s)\n%s", Policy::precision::name,
              (long long)o.batch, source, plan.str(o.batch, budget).c_str());
  return 0;
}

template <class Space, class Policy>
int train(const Options& o, const kiln::data::Dataset& train_set, const kiln::data::Dataset& test_set) {
  auto exec = kiln::make_executor<Space>(o.threads);
  typename Model::template on<Space> model(o.seed);
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
  if (o.plan) return print_plan<Space, Policy>(o, model, opt);
  kiln::train::Step step(model, opt, exec, Policy{}, {},
                         {.accumulate = o.accumulate, .data_parallel = ranks > 1 ? &group : nullptr});
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
                epoch_loss, kiln::train::accuracy(model, exec, test_set), epoch_seconds.back());
  }
  if (checkpoints && !finished) save({o.epochs, 0}, 0.0);
  const double final_accuracy = kiln::train::accuracy(model, exec, test_set);
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

template <class Space>
int run(const Options& o, const kiln::data::Dataset& tr, const kiln::data::Dataset& te) {
  int status = 0;
  auto go = [&]<class Policy>() { status = train<Space, Policy>(o, tr, te); };
  if constexpr (std::is_same_v<Space, kiln::host>) {
    kiln::select_policy<kiln::accumulate<kiln::dyn>>(o.precision, o.stance, o.mode, go);
  } else if (o.mode == "default") {
    kiln::select_policy<kiln::accumulate<kiln::dyn>>(o.precision, o.stance, go);
  } else {
    // On a device: CUDA graphs or cuBLASLt autotuning with the fused stance (a few policies, not
    // every combination, to keep the CUDA build short).
    KILN_CHECK((o.mode == "reduce_overhead" || o.mode == "max_autotune") && o.stance == "fused", kiln::ValueError,
               "--mode ", o.mode, " --stance ", o.stance, " is not built for CUDA; on a GPU the modes are default ",
               "(any stance), reduce_overhead and max_autotune (stance fused)");
    if (o.mode == "reduce_overhead")
      kiln::select_precision<kiln::stance::fused, kiln::mode::reduce_overhead, kiln::accumulate<kiln::dyn>>(o.precision, go);
    else
      kiln::select_precision<kiln::stance::fused, kiln::mode::max_autotune, kiln::accumulate<kiln::dyn>>(o.precision, go);
  }
  return status;
}

}  // namespace

int main(int argc, char** argv) try {
  // Under mpirun only rank 0 speaks (errors still come from every rank, on stderr, naming it).
  if (!kiln::dist::ProcessGroup::world().is_root()) (void)std::freopen("/dev/null", "w", stdout);
  const Options o = parse(argc, argv);
  // --verify-checkpoints and --plan read no data: they only need the model.
  auto data = o.verify_checkpoints || o.plan ? kiln_example::DigitsData{} : kiln_example::load_digits(o.data_dir);
  const auto keep = kiln_example::parse_digits(o.digits);
  if (o.digits != "all") {
    data.train = kiln_example::only_digits(data.train, keep);
    data.test = kiln_example::only_digits(data.test, keep);
  }
  if (o.verify_checkpoints || o.plan)
    std::printf("model: %s\n", Model(o.seed).describe().c_str());
  else
    std::printf("data: %lld train / %lld test digits (%s), %lld features; %s\n", (long long)data.train.n,
                (long long)data.test.n, o.digits.c_str(), (long long)data.train.d, Model(o.seed).describe().c_str());
#if KILN_CUDA_COMPILER
  if (kiln::cu::device_available()) {
    // Data-parallel on GPUs: each rank takes the device numbered by its rank on the node.
    if (kiln::dist::ProcessGroup::world().size() > 1) kiln::dist::use_local_device(kiln::dist::ProcessGroup::world());
    std::printf("device: CUDA (%s)\n", kiln::cu::device_name().c_str());
    return run<kiln::cuda>(o, data.train, data.test);
  }
  if (kiln::device_required()) return kiln::cu::report_no_device("train_digits");  // KILN_REQUIRE_DEVICE
  std::printf("device: CPU, %d thread%s (no CUDA device: %s)\n", o.threads, o.threads == 1 ? "" : "s",
              kiln::cu::device_unavailable_reason().c_str());
#else
  KILN_CHECK(!kiln::device_required(), kiln::ValueError, "KILN_REQUIRE_DEVICE is set, but this build has no CUDA");
  std::printf("device: CPU, %d thread%s (this build has no CUDA: nvcc was not found)\n", o.threads,
              o.threads == 1 ? "" : "s");
#endif
  return run<kiln::host>(o, data.train, data.test);
} catch (const std::exception& e) {
  return kiln::dist::fail_job("train_digits", e);  // under mpirun: every rank ends, not only this one
}
