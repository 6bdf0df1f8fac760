// kiln/policy/info.hpp — a policy as values: what a training step's policy is, for code compiled
// once for every policy (a loop over train::StepBase, checkpoints, reports). train::Step makes one
// from its policy bag at compile time (train::policy_info<Policy, Exec>(), kiln/train/step.hpp).
#pragma once

#include "kiln/config.hpp"

namespace kiln {

struct PolicyInfo {
  const char* precision = "fp32";
  const char* stance = "fused";
  const char* mode = "default";
  bool eager = false;        // stance::force_eager
  bool mixed = false;        // bf16_mixed / fp16_mixed
  bool scales_loss = false;  // a dynamic loss scaler
  bool tf32 = false;
  bool bf16 = false;         // the low type is bfloat16
  bool captures = false;     // mode::reduce_overhead, on an executor that captures
  bool autotunes = false;    // mode::max_autotune, on an executor with a GEMM tuner
  index_t accumulate = 1;    // the policy's count, or kiln::dyn (StepOptions::accumulate)
};

}  // namespace kiln
