// kiln/train/launches.hpp — the kernels of one training step, known at compile time.
//
//   using Policy = kiln::policy<kiln::stance::force_eager>;
//   static_assert(kiln::train::launches_per_step<Model, kiln::optim::AdamW<>, Policy>({.lr = 1e-3}) == 96);
//
// One training step is one optimizer step: `accumulate` micro-batches of forward, loss, seed and
// backward, then the loss scaler's check, the optimizer and the scaler's update (and under mixed
// precision a rounding of each batch and of each weight's low copy). Each part says
// what it launches (Sequential::launches, the loss's and the optimizer's launches, GradScaler's);
// a test compares the sum with what the executor counts, for every stance and precision.
// Assumptions the count makes: every parameter receives a gradient each step; on CUDA the GEMM
// epilogues a Linear asks for count as one launch whether cuBLASLt or kiln's fallback runs them.
#pragma once

#include <type_traits>

#include "kiln/core/space.hpp"
#include "kiln/nn/module.hpp"
#include "kiln/policy/policy.hpp"
#include "kiln/train/grad_scaler.hpp"
#include "kiln/train/loss.hpp"

namespace kiln::train {

// The context a model's layers are counted in for a training step under Policy in Space.
template <class Policy, class Space>
constexpr nn::LaunchContext step_context() {
  return {.eager = std::is_same_v<typename Policy::stance, stance::force_eager>,
          .device = !std::is_same_v<Space, host>,
          .training = true,
          .input_grad = false,
          .folded = false};
}

// Policy with its stance replaced by Stance: how the counts below see a step whose stance is
// chosen at run time (stance::at_run_time, kiln/train/select_step.hpp) once it is known.
template <class Policy, class Stance>
using counted_policy =
    kiln::policy<typename Policy::precision, Stance, typename Policy::accumulate_tag, typename Policy::loss_scaling>;

// Launches of one micro-batch: forward, loss, the backward's seed and backward (and under mixed
// precision the batch's rounding to the low type).
template <class Model, class Policy, class Loss = CrossEntropy, class Space = typename Model::space>
constexpr index_t launches_per_micro_batch() {
  constexpr nn::LaunchContext c = step_context<Policy, Space>();
  return Model::launches(c).total() + Loss::launches(c).total() + 1 + (Policy::precision::mixed ? 1 : 0);
}

// Launches of one optimizer step with `accumulate` micro-batches (the policy's count, or the
// run-time one for accumulate<kiln::dyn>), for the optimizer's options.
template <class Model, class Optimizer, class Policy = kiln::policy<>, class Loss = CrossEntropy,
          class Space = typename Model::space>
constexpr index_t launches_per_step(const typename Optimizer::Options& options, index_t accumulate = Policy::accumulate) {
  constexpr bool eager = std::is_same_v<typename Policy::stance, stance::force_eager>;
  return accumulate * launches_per_micro_batch<Model, Policy, Loss, Space>() +
         Optimizer::launches(eager, options, Model::parameter_tensors) +
         GradScaler<Space>::launches_per_step(Policy::loss_scaling::on) +
         (Policy::precision::mixed ? Model::low_copies : 0);  // the weights' low copies, refreshed
}

// The same count for the model's requires_grad flags now (frozen layers, nn/freeze.hpp): its
// launches_now, and the optimizer over the trainable parameter tensors only. Equal to
// launches_per_step when nothing is frozen.
template <class Model, class Optimizer, class Policy = kiln::policy<>, class Loss = CrossEntropy,
          class Space = typename Model::space>
index_t launches_per_step_now(const Model& model, const typename Optimizer::Options& options,
                              index_t accumulate = Policy::accumulate) {
  constexpr bool eager = std::is_same_v<typename Policy::stance, stance::force_eager>;
  constexpr nn::LaunchContext c = step_context<Policy, Space>();
  const index_t micro = model.launches_now(c).total() + Loss::launches(c).total() + 1 + (Policy::precision::mixed ? 1 : 0);
  return accumulate * micro + Optimizer::launches(eager, options, model.trainable_parameter_tensors()) +
         GradScaler<Space>::launches_per_step(Policy::loss_scaling::on) +
         (Policy::precision::mixed ? Model::low_copies : 0);
}

}  // namespace kiln::train
