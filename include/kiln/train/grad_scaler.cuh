// kiln/train/grad_scaler.cuh — GradScaler<kiln::cuda> (kiln/train/grad_scaler.hpp): its state
// block in device memory and the unscale-and-check pass as ONE multi-tensor kernel over the
// parameters. Include it in nvcc translation units that construct a GradScaler<kiln::cuda>.
//
// The pass runs over a CudaParamTable uploaded from the ParamTable on first use and kept while the
// same table (the same slots) comes back, so a training loop uploads once; which slots have a
// gradient is read on the host per call (as the CUDA optimizers do), nothing waits for the device.
// Every thread that meets inf or NaN writes 1 to found_inf (the same value from any thread, as
// PyTorch's _amp_foreach_non_finite_check_and_unscale_); the previous update() cleared it.
#pragma once

#include <cuda_runtime.h>

#include <optional>

#include "kiln/backend/cuda/check.cuh"
#include "kiln/backend/cuda/executor.cuh"
#include "kiln/backend/cuda/memory.cuh"
#include "kiln/config.hpp"
#include "kiln/optim/multi_tensor.cuh"
#include "kiln/optim/param.hpp"
#include "kiln/train/grad_scaler.hpp"

namespace kiln::train::detail {

struct UnscaleCheckOp {
  ScalerState* state;
  const optim::SlotStep* slots;  // nullptr: every parameter has a gradient
  float inv = 1.0f;              // set per chunk from the scale on the device
  KILN_DEVICE bool select(index_t slot, const optim::CudaParamEntry&) {
    if (slots != nullptr && !slots[slot].active) return false;
    inv = inverse_scale(state->scale);
    return true;
  }
  KILN_DEVICE void operator()(const optim::CudaParamEntry& e, index_t i) const {
    if (unscale_element(e.grad[i], inv)) state->found_inf = 1.0f;
  }
};

template <>
class ScalerBackend<cuda> {
 public:
  // The first state, copied then waited for: the executor's stream may be a non-blocking one.
  static void upload(ScalerState* dst, const ScalerState& s) {
    KILN_CUDA_CHECK(cudaMemcpy(dst, &s, sizeof(s), cudaMemcpyHostToDevice));
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
  }

  void unscale_and_check(ScalerState* state, const optim::ParamTable& table, CudaExecutor& exec) {
    if (!table_ || !same_slots(table_->table(), table)) {
      // The old upload goes before the new one is made — once the passes queued on it have run:
      // the allocator is not stream-aware, and the new table's upload (a legacy-stream copy,
      // not ordered with a non-blocking executor stream) would refill the freed blocks under a
      // pass still waiting to read them. A new table is rare (a training loop keeps one), and
      // its upload synchronises the device anyway.
      if (table_) KILN_CUDA_CHECK(cudaStreamSynchronize(exec.stream()));
      table_.reset();
      table_.emplace(table);
    }
    optim::detail::with_active_slots(*table_, exec.stream(), [&](const optim::SlotStep* slots) {
      table_->apply(exec, UnscaleCheckOp{state, slots});
    });
  }

 private:
  static bool same_slots(const optim::ParamTable& a, const optim::ParamTable& b) {
    if (a.count() != b.count()) return false;
    for (index_t k = 0; k < a.count(); ++k)
      if (a[k].value != b[k].value || a[k].grad != b[k].grad || a[k].size != b[k].size ||
          a[k].has_grad != b[k].has_grad)
        return false;
    return true;
  }

  std::optional<optim::CudaParamTable> table_;
};

}  // namespace kiln::train::detail
