// examples/train_digits/steps.hpp — what every file of train_digits shares: its options, its model,
// and the functions that make a CPU training step of each precision (each defined in its own
// file, so the policies compile in parallel). The precision files include only this, not the
// training loop's headers (train_digits.hpp).
#pragma once

#include <cstdint>
#include <string>

#include "kiln/optim/adam.hpp"
#include "kiln/train/select_step.hpp"

#include "../digits_common.hpp"

namespace train_digits {

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

template <class Space>
using ModelOn = typename Model::template on<Space>;
using HostStep = kiln::train::AnyStep<ModelOn<kiln::host>, kiln::optim::AdamW<kiln::host>, kiln::CpuExecutor>;

// The CPU steps of one precision, every stance and mode (kiln::train::every_combo), each defined
// in its own file: host_float.cpp (fp32 and tf32), host_bf16.cpp, host_fp16.cpp.
HostStep make_host_step_float(const Options& o, ModelOn<kiln::host>& model, kiln::optim::AdamW<kiln::host>& opt,
                              kiln::CpuExecutor& exec, kiln::train::StepOptions options);
HostStep make_host_step_bf16(const Options& o, ModelOn<kiln::host>& model, kiln::optim::AdamW<kiln::host>& opt,
                             kiln::CpuExecutor& exec, kiln::train::StepOptions options);
HostStep make_host_step_fp16(const Options& o, ModelOn<kiln::host>& model, kiln::optim::AdamW<kiln::host>& opt,
                             kiln::CpuExecutor& exec, kiln::train::StepOptions options);

// The model's accuracy on the CPU (defined in host_float.cpp, which compiles the float model's
// code anyway; the loop's own file then compiles no layer).
double host_accuracy(ModelOn<kiln::host>& model, kiln::CpuExecutor& exec, const kiln::data::Dataset& dataset);

}  // namespace train_digits
