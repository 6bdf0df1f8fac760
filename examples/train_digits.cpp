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
//
// The program is five files (train_digits/train_digits.hpp lists them): the policy the flags name
// is chosen at run time among steps compiled in three files, one per precision, which build in
// parallel (kiln/train/select_step.hpp); the GPU part is one file nvcc builds.
#include <cstdio>
#include <string>

#include "kiln/core/device_required.hpp"
#include "train_digits/train_digits.hpp"

#include "cli.hpp"

namespace train_digits {

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

}  // namespace train_digits

namespace {

// The CPU step of the precision --precision names, from the file that compiles that precision.
train_digits::HostStep make_host_step(const train_digits::Options& o, train_digits::ModelOn<kiln::host>& model,
                                      kiln::optim::AdamW<kiln::host>& opt, kiln::CpuExecutor& exec,
                                      kiln::train::StepOptions options) {
  if (o.precision == kiln::precision::fp32::name || o.precision == kiln::precision::tf32::name)
    return train_digits::make_host_step_float(o, model, opt, exec, std::move(options));
  if (o.precision == kiln::precision::bf16_mixed::name)
    return train_digits::make_host_step_bf16(o, model, opt, exec, std::move(options));
  if (o.precision == kiln::precision::fp16_mixed::name)
    return train_digits::make_host_step_fp16(o, model, opt, exec, std::move(options));
  throw kiln::ValueError(kiln::detail::concat("unknown precision \"", o.precision,
                                              "\"; the precisions are fp32, tf32, bf16_mixed and fp16_mixed"));
}

}  // namespace

int main(int argc, char** argv) try {
  // Under mpirun only rank 0 speaks (errors still come from every rank, on stderr, naming it).
  if (!kiln::dist::ProcessGroup::world().is_root()) (void)std::freopen("/dev/null", "w", stdout);
  const train_digits::Options o = train_digits::parse(argc, argv);
  // --verify-checkpoints and --plan read no data: they only need the model.
  auto data = o.verify_checkpoints || o.plan ? kiln_example::DigitsData{} : kiln_example::load_digits(o.data_dir);
  const auto keep = kiln_example::parse_digits(o.digits);
  if (o.digits != "all") {
    data.train = kiln_example::only_digits(data.train, keep);
    data.test = kiln_example::only_digits(data.test, keep);
  }
  if (o.verify_checkpoints || o.plan)
    std::printf("model: %s\n", train_digits::Model(o.seed).describe().c_str());
  else
    std::printf("data: %lld train / %lld test digits (%s), %lld features; %s\n", (long long)data.train.n,
                (long long)data.test.n, o.digits.c_str(), (long long)data.train.d, train_digits::Model(o.seed).describe().c_str());
#if KILN_EXAMPLE_DEVICE  // train_digits/device.cu is built (nvcc)
  std::string why;
  if (auto status = train_digits::train_on_device(o, data.train, data.test, why)) return *status;
  std::printf("device: CPU, %d thread%s (no CUDA device: %s)\n", o.threads, o.threads == 1 ? "" : "s", why.c_str());
#else
  KILN_CHECK(!kiln::device_required(), kiln::ValueError, "KILN_REQUIRE_DEVICE is set, but this build has no CUDA");
  std::printf("device: CPU, %d thread%s (this build has no CUDA part: no nvcc, or built without it)\n", o.threads,
              o.threads == 1 ? "" : "s");
#endif
  return train_digits::train<kiln::host>(o, data.train, data.test, make_host_step);
} catch (const std::exception& e) {
  return kiln::dist::fail_job("train_digits", e);  // under mpirun: every rank ends, not only this one
}
