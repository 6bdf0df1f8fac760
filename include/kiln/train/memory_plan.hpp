// kiln/train/memory_plan.hpp — how much memory a training step of a model takes, from its type:
// parameters, their gradients, the optimizer's state, the weights' low-precision copies, and the
// activations a step keeps per sample (each layer's output and, in backward, its gradient, and
// the buffers a fused activation's backward takes) — and so the largest batch that fits a budget.
//
//   auto plan = kiln::train::plan_memory<Model, kiln::optim::AdamW<>>(kiln::policy<>{});
//   std::puts(plan.str(64).c_str());
//   index_t batch = plan.largest_batch(plan.default_budget());   // free memory less a margin
//
// What the model counts is what kiln allocates in the fused stance: every layer's output (a fused
// Linear + activation is one), the output's gradient, for a fused activation one buffer more (the
// dZ its folded backward writes, or its own scratch), the step's input buffer, and the loss's
// per-row values. tests/cpu/test_memory_plan.cpp holds the CPU prediction to within 10% of what
// a counting allocator sees at batch 64 and 1024 (the digits MLP). force_eager keeps a buffer
// per expression node and is not modelled (a plan says so); convolutions count their outputs and
// gradients but not their workspaces.
#pragma once

#include <cstddef>
#include <cstdio>
#include <functional>
#include <fstream>
#include <string>
#include <type_traits>
#include <utility>

#include "kiln/backend/cpu/gemm.hpp"
#include "kiln/config.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/nn/module.hpp"
#include "kiln/nn/sample_shape.hpp"
#include "kiln/nn/sequential.hpp"
#include "kiln/policy/info.hpp"
#include "kiln/policy/policy.hpp"

namespace kiln::train {

struct MemoryPlan {
  std::string model;             // the model's describe() line, when given
  std::size_t parameters = 0;    // values
  std::size_t gradients = 0;     // their gradient buffers
  std::size_t optimizer = 0;     // moments / momentum
  std::size_t low_copies = 0;    // bf16 / f16 weight copies (mixed precision)
  std::size_t per_sample = 0;    // activations, their gradients and backward buffers, per sample
  // The GEMM workspace at a batch size: the CPU GEMM's packing buffer (it depends on the batch's
  // rows), or cuBLASLt's fixed workspace on CUDA.
  std::function<std::size_t(index_t)> workspace = [](index_t) { return std::size_t(0); };
  bool modelled = true;          // false: the stance keeps more than the model counts (force_eager)

  std::size_t fixed() const { return parameters + gradients + optimizer + low_copies; }
  std::size_t bytes_for(index_t batch) const { return fixed() + workspace(batch) + std::size_t(batch) * per_sample; }
  // The largest batch whose step fits in `budget` bytes (0 when not even one sample does).
  KILN_COMPILED index_t largest_batch(std::size_t budget) const;
  // The plan at `batch`, and the largest batch for `budget` bytes (0: not shown).
  KILN_COMPILED std::string str(index_t batch, std::size_t budget = 0) const;
};

namespace detail {

template <class Model>
struct sequential_layers;
template <class... L>
struct sequential_layers<nn::Sequential<L...>> {
  using tuple = std::tuple<L...>;
  static constexpr std::size_t count = sizeof...(L);
  template <std::size_t I>
  using sample_before = typename nn::detail::prefix_fold<I, nn::any_sample, L...>::type;
};

template <class S>
constexpr index_t sample_elements() {
  if constexpr (requires { S::size; }) return S::size;
  else return dyn;
}

// Elements per sample layer I keeps (see the header comment), or dyn when a size is unknown.
template <class Model, std::size_t I>
constexpr index_t layer_elements() {
  using Info = sequential_layers<Model>;
  if constexpr (I > 0 && Model::fuses_with_next(I - 1)) return 0;  // runs inside the previous layer
  constexpr bool fused = Model::fuses_with_next(I);
  constexpr index_t out = sample_elements<typename Info::template sample_before<fused ? I + 2 : I + 1>>();
  if constexpr (out == dyn) return dyn;
  else return 2 * out + (fused ? out : 0);  // value and gradient, and a fused activation's dZ
}

template <class Model, std::size_t... I>
constexpr index_t model_elements(std::index_sequence<I...>) {
  index_t total = 0;
  bool known = true;
  ((layer_elements<Model, I>() == dyn ? (known = false, 0) : (total += layer_elements<Model, I>(), 0)), ...);
  return known ? total : dyn;
}

// The optimizer's state in floats per trainable parameter value.
template <class Optimizer, class Options>
constexpr std::size_t optimizer_floats(const Options& o) {
  if constexpr (requires { o.amsgrad; }) return o.amsgrad ? 3 : 2;  // Adam / AdamW: exp_avg, exp_avg_sq (+ max)
  else if constexpr (requires { o.momentum; }) return o.momentum != 0 ? 1 : 0;  // SGD: the momentum buffer
  else return 0;
}

}  // namespace detail

// The largest CPU GEMM workspace of a step at `batch`: each Linear's forward (batch x out x in),
// weight gradient (out x in x batch) and — past the first layer with parameters, whose input is
// data — input gradient (batch x in x out).
template <class Model, class T, std::size_t... I>
std::size_t linear_gemm_workspace(index_t batch, int threads, std::index_sequence<I...>) {
  using Info = detail::sequential_layers<Model>;
  std::size_t most = 0;
  bool input_grad = false;
  auto one = [&]<class L>(std::type_identity<L>) {
    if constexpr (nn::detail::takes_fold_of<L>() && requires { L::in_features; L::out_features; }) {
      constexpr index_t in = L::in_features, out = L::out_features;
      most = std::max({most, cpu::gemm_workspace_bytes<T>(batch, out, in, threads),
                       cpu::gemm_workspace_bytes<T>(out, in, batch, threads)});
      if (input_grad) most = std::max(most, cpu::gemm_workspace_bytes<T>(batch, in, out, threads));
    }
    if constexpr (nn::detail::parameter_tensors_of<L>() > 0) input_grad = true;
  };
  (one(std::type_identity<std::tuple_element_t<I, typename Info::tuple>>{}), ...);
  return most;
}

// Weights of the model's Linear layers: what mixed precision keeps a 2-byte copy of.
template <class Model, std::size_t... I>
constexpr index_t linear_weights(std::index_sequence<I...>) {
  using Info = detail::sequential_layers<Model>;
  index_t n = 0;
  auto one = [&]<class L>(std::type_identity<L>) {
    if constexpr (nn::detail::low_copies_of<L>() > 0 && requires { L::in_features; L::out_features; })
      n += L::in_features * L::out_features;
  };
  (one(std::type_identity<std::tuple_element_t<I, typename Info::tuple>>{}), ...);
  return n;
}

// The plan for `model` trained by Optimizer (with `options`) under a policy given as values
// (kiln/policy/info.hpp: a step's policy(), whatever its type). Activations are counted in the
// policy's activation type (2 bytes under mixed precision); parameters, gradients and optimizer
// state in the model's type; frozen parameters (nn/freeze.hpp) get no optimizer state.
template <class Optimizer, class Model>
MemoryPlan plan_memory(const Model& model, const typename Optimizer::Options& options, int threads,
                       const PolicyInfo& policy) {
  using Info = detail::sequential_layers<Model>;
  constexpr index_t elements = detail::model_elements<Model>(std::make_index_sequence<Info::count>{});
  static_assert(elements != dyn,
                "kiln::train::plan_memory: a layer's output size is not known at compile time; the planner needs "
                "every size (start an image model with nn::Unflatten<C, H, W>)");
  using value = typename Model::value_type;
  const bool mixed = policy.mixed;
  const std::size_t activation = mixed ? 2 : sizeof(value);
  MemoryPlan plan;
  plan.model = model.describe();
  plan.parameters = std::size_t(model.parameter_count()) * sizeof(value);
  plan.gradients = plan.parameters;  // static-shape variables hold theirs from construction
  plan.optimizer = std::size_t(model.trainable_parameter_count()) * sizeof(float) *
                   detail::optimizer_floats<Optimizer>(options);
  plan.low_copies = mixed ? std::size_t(linear_weights<Model>(std::make_index_sequence<Info::count>{})) * 2 : 0;
  // The step's input rows, the activations, and the loss's per-row values (3 floats: the row's
  // loss, its log-sum-exp and its label).
  plan.per_sample = std::size_t(Model::in_features + elements) * activation + 3 * sizeof(float);
  plan.modelled = !policy.eager;
  if constexpr (std::is_same_v<typename Model::space, host>) {
    plan.workspace = [threads, mixed](index_t batch) {
      constexpr auto seq = std::make_index_sequence<Info::count>{};
      return mixed ? linear_gemm_workspace<Model, bf16>(batch, threads, seq)
                   : linear_gemm_workspace<Model, value>(batch, threads, seq);
    };
  } else {
    plan.workspace = [](index_t) { return std::size_t{32} << 20; };  // cuBLASLt's (Lt::default_workspace_bytes)
  }
  return plan;
}

// The same under the policy bag Policy.
template <class Optimizer, class Policy = kiln::policy<>, class Model>
MemoryPlan plan_memory(const Model& model, const typename Optimizer::Options& options = {}, int threads = 1) {
  using P = typename Policy::precision;
  return plan_memory<Optimizer>(model, options, threads,
                                {.precision = P::name, .eager = std::is_same_v<typename Policy::stance, stance::force_eager>,
                                 .mixed = P::mixed});
}

// Memory to plan with when none is given: MemAvailable of /proc/meminfo (the CPU backend) less a
// 10% margin; 0 when it cannot be read.
KILN_COMPILED std::size_t host_memory_budget();

}  // namespace kiln::train

#if KILN_HEADER_BODIES
#include "kiln/train/memory_plan_bodies.hpp"
#endif
