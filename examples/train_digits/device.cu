// examples/train_digits/device.cu — train_digits on a GPU: the training loop in device memory and
// its steps (built by nvcc, in builds that have it). On a device the modes take the stance fused
// (CUDA graphs, cuBLASLt autotuning); mode default takes fused and force_eager: 16 policies.
#include <string>

#include "kiln/backend/cuda/device.cuh"
#include "kiln/backend/cuda/executor.cuh"
#include "kiln/core/device_required.hpp"
#include "kiln/data/device_loader.cuh"
#include "kiln/dist/device_reducer.cuh"
#include "kiln/nn/cuda.cuh"
#include "kiln/optim/cuda_step.cuh"
#include "kiln/train/grad_scaler.cuh"

#include "train_digits.hpp"

namespace train_digits {

namespace {
using namespace kiln::train;
using device_combos = combos<combo<kiln::stance::fused, kiln::mode::default_>,
                             combo<kiln::stance::force_eager, kiln::mode::default_>,
                             combo<kiln::stance::fused, kiln::mode::reduce_overhead>,
                             combo<kiln::stance::fused, kiln::mode::max_autotune>>;
}  // namespace

std::optional<int> train_on_device(const Options& o, const kiln::data::Dataset& train_set,
                                   const kiln::data::Dataset& test_set, std::string& why) {
  if (!kiln::cu::device_available()) {
    if (kiln::device_required()) return kiln::cu::report_no_device("train_digits");  // KILN_REQUIRE_DEVICE
    why = kiln::cu::device_unavailable_reason();
    return std::nullopt;
  }
  // Data-parallel on GPUs: each rank takes the device numbered by its rank on the node.
  auto& world = kiln::dist::ProcessGroup::world();
  if (world.size() > 1) kiln::dist::use_local_device(world);
  std::printf("device: CUDA (%s)\n", kiln::cu::device_name().c_str());
  return train<kiln::cuda>(o, train_set, test_set,
                           [](const Options& opts, auto& model, auto& opt, auto& exec, StepOptions options) {
                             return select_step<device_combos, kiln::accumulate<kiln::dyn>>(
                                 opts.precision, opts.stance, opts.mode, model, opt, exec, {}, std::move(options));
                           });
}

}  // namespace train_digits
