// kiln/train/memory_plan.hpp — how much memory a training step of a model takes: parameters,
// their gradients, the optimizer's state, the weights' low-precision copies, the activations a
// step keeps per sample, and the scratch of its GEMMs and convolutions — and so the largest batch
// that fits a budget.
//
//   kiln::optim::AdamW opt(model, {.lr = 3e-4});
//   auto plan = kiln::train::plan_memory<kiln::optim::AdamW<>, kiln::policy<kiln::precision::bf16_mixed>>(
//       model, opt.options());
//   std::puts(plan.str(32).c_str());
//   index_t batch = plan.largest_batch(plan.default_budget());   // free memory less a margin
//
// The walk goes through every depth (Sequential, Residual, Repeat, Named; a Linear or Conv2d and
// the activation it fuses count once) and follows the parameters' requires_grad flags now, as the
// tape does: a layer whose input needs no gradient and whose parameters are all frozen records
// nothing, so its output lives only until the next layer has read it (a transient, the largest of
// which counts once), while a recorded layer keeps its output until backward (and a fused
// activation's pre-activation, unless it recomputes it) and gets its gradient there; backward frees each result once its
// step ran, so the gradients add only the most alive at one step (output, input, and the skip
// connections' waiting ones).
// Under mixed precision activations are 2 bytes and the CPU's float working copies of a
// convolution's or batch norm's input and output (nn/half_io.hpp) count as a transient.
// Gradient buffers and the optimizer's state are the trainable parameters'. force_eager keeps a buffer per expression node and is not modelled (a plan
// says so). tests/memory/test_memory_plan.cpp holds the CPU prediction to within 10% of a
// counting allocator's peak for the digits MLP, and examples/finetune_resnet --plan checks
// ResNet-50 at 224x224 against its measured peak (training and fine-tuning, batches 2, 8, 16).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <tuple>
#include <vector>
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
#include "kiln/nn/freeze.hpp"
#include "kiln/nn/mixed_check.hpp"
#include "kiln/nn/sequential.hpp"
#include "kiln/nn/summary.hpp"
#include "kiln/backend/cpu/conv2d.hpp"
#include "kiln/policy/info.hpp"
#include "kiln/policy/policy.hpp"

namespace kiln::train {

struct MemoryPlan {
  std::string model;             // the model's top-level layers (nn::summary at depth 1), when given
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

// What the walk has counted so far, in elements per sample (bytes for the transient).
struct PlanWalk {
  bool mixed = false;
  std::size_t activation = 4;   // bytes per activation element (2 under mixed precision)
  bool input_grad = false;      // whether the layer now being walked gets an input that needs a gradient
  std::size_t kept = 0;         // bytes per sample kept until backward (values and saved extras)
  std::size_t transient = 0;    // the largest per-sample bytes alive for one layer only
  // Backward frees each result once its step ran (autograd/tape.hpp), so gradients are not all
  // alive at once: the most alive while one step runs — its output's and its input's, and those
  // of enclosing skip connections still waiting for the other branch (pending).
  std::size_t gradients = 0;
  std::size_t pending = 0;
  std::size_t linear_weights = 0;  // weights with a low-precision copy (mixed precision)
  std::vector<cpu::Conv2dShape> convs{};  // for the convolutions' scratch (one image each)
  std::vector<std::array<index_t, 2>> linears{};  // in, out: for the GEMM workspace
  bool known = true;            // false: a size the walk could not see (a plan says so)
};

template <index_t C, index_t H, index_t W>
constexpr std::array<index_t, 3> image_dims(nn::sample<C, H, W>*) {
  return {C, H, W};
}

template <class S>
constexpr index_t sample_elements() {
  if constexpr (requires { S::size; }) return S::size;
  else return dyn;
}

template <class L>
bool layer_trains(const L& l) {
  return nn::param_grads_of(l).any;
}

// A leaf layer of input sample In (and the activation it runs in its epilogue, Fused: void or the
// activation layer): its output's bytes, kept or transient.
template <class In, class Fused, class L>
void plan_leaf(const L& l, PlanWalk& w) {
  using Out = nn::output_sample_t<L, In>;
  // The model's own input (any_sample before an Unflatten) is the step's input buffer, counted apart.
  constexpr index_t in = sample_elements<In>() == dyn ? 0 : sample_elements<In>();
  index_t out = sample_elements<Out>();
  if constexpr (sample_elements<Out>() == dyn && requires { l.outputs(); }) out = l.outputs();  // Linear<In, dyn>
  if (out == dyn) {
    w.known = false;
  } else {
    const bool recorded = w.input_grad || layer_trains(l);
    const std::size_t a = w.activation;
    if (recorded) {
      // The output's value; a fused activation keeps its pre-activation too. While its step runs,
      // the output's gradient and the input's are alive.
      constexpr bool recomputes = requires { L::recomputes_pre_activation; };  // batch norm: from its statistics
      w.kept += std::size_t(out) * a + (nn::applies_activation<Fused>() && !recomputes ? std::size_t(out) * a : 0);
      w.gradients = std::max(w.gradients, w.pending + std::size_t(in + out) * a);
    } else {
      w.transient = std::max(w.transient, std::size_t(in + out) * a);
    }
    if constexpr (requires { L::in_channels; L::kernel; }) {  // Conv2d: its scratch (samples are <C, H, W> in either layout)
      if constexpr (requires { In::rank; }) {
        if constexpr (In::rank == 3) {
          const auto [c, h, wd] = detail::image_dims(static_cast<In*>(nullptr));
          w.convs.push_back({.n = 1, .c_in = c, .h = h, .w = wd, .c_out = L::out_channels, .kh = L::kernel,
                             .kw = L::kernel, .stride_h = L::stride, .stride_w = L::stride, .pad_h = L::padding,
                             .pad_w = L::padding, .dil_h = L::dilation, .dil_w = L::dilation});
        }
      }
    }
    if (w.mixed && (requires { L::in_channels; } || requires { L::channels; }))  // conv, batch norm: float copies
      w.transient = std::max(w.transient, std::size_t(in + out) * (sizeof(float) + (recorded ? 0 : a)));
    if constexpr (nn::detail::takes_fold_of<L>() && requires { L::in_features; }) {
      w.linears.push_back({L::in_features, out});
      if constexpr (nn::detail::low_copies_of<L>() > 0) w.linear_weights += std::size_t(L::in_features) * std::size_t(out);
    } else if constexpr (nn::detail::low_copies_of<L>() > 0 && requires { L::in_channels; L::kernel; }) {
      w.linear_weights += std::size_t(L::out_channels * L::in_channels * L::kernel * L::kernel);
    }
    w.input_grad = recorded;
  }
}

template <class In, class M>
void plan_walk(const M& m, PlanWalk& w);

// A batch norm's output taken back by the layer after it (Next: one whose backward makes it
// again) is freed after forward, not kept (nn::Sequential, autograd/remake.hpp): fp32 / fp64 only.
template <class L, class Next, class Out>
void plan_remade(PlanWalk& w, std::size_t kept_before) {
  if constexpr (requires { L::remakeable_output; Next::remakes_input; } && sample_elements<Out>() != dyn) {
    if (L::remakeable_output && Next::remakes_input && !w.mixed && w.kept > kept_before)
      w.kept -= std::size_t(sample_elements<Out>()) * w.activation;
  }
}

template <class In, class M, std::size_t I, std::size_t N>
void plan_sequential(const M& m, PlanWalk& w) {
  if constexpr (I < N) {
    using Types = typename M::layer_types;
    using L = std::tuple_element_t<I, Types>;
    const std::size_t kept_before = w.kept;
    if constexpr (M::fuses_with_next(I)) {  // a Linear / Conv2d / BatchNorm2d and the activation it runs
      plan_leaf<In, std::tuple_element_t<I + 1, Types>>(m.template layer<I>(), w);
      using Next = nn::output_sample_t<std::tuple_element_t<I + 1, Types>, nn::output_sample_t<L, In>>;
      if constexpr (I + 2 < N) plan_remade<L, std::tuple_element_t<I + 2, Types>, Next>(w, kept_before);
      plan_sequential<Next, M, I + 2, N>(m, w);
    } else {
      plan_walk<In>(m.template layer<I>(), w);
      if constexpr (I + 1 < N)
        plan_remade<L, std::tuple_element_t<I + 1, Types>, nn::output_sample_t<L, In>>(w, kept_before);
      plan_sequential<nn::output_sample_t<L, In>, M, I + 1, N>(m, w);
    }
  }
}

// The walk of any layer of input sample In: containers by what they expose, leaves counted.
template <class In, class M>
void plan_walk(const M& m, PlanWalk& w) {
  if constexpr (requires { typename M::layer_type; M::name; }) {  // nn::Named
    plan_walk<In>(static_cast<const typename M::layer_type&>(m), w);
  } else if constexpr (requires { typename M::layer_types; }) {  // nn::Sequential
    plan_sequential<In, M, 0, std::tuple_size_v<typename M::layer_types>>(m, w);
  } else if constexpr (requires { m.body(); m.shortcut(); }) {  // nn::Residual: both branches, then the sum
    using Out = nn::output_sample_t<M, In>;
    constexpr std::size_t out = sample_elements<Out>() == dyn ? 0 : std::size_t(sample_elements<Out>());
    const bool in_grad = w.input_grad;
    // While a branch runs backward, the other's input gradient (x's, the sum's size) waits.
    w.pending += out * w.activation;
    plan_walk<In>(m.body(), w);
    const bool body_grad = w.input_grad;
    w.input_grad = in_grad;
    if constexpr (M::has_projection) {  // the identity makes no tensor
      const std::size_t kept_before = w.kept;
      plan_walk<In>(m.shortcut(), w);
      // Fused on the CPU, the projection's output is freed once summed (nn::Residual).
      if (M::projection_output_unread && std::is_same_v<typename M::space, host> && w.kept > kept_before)
        w.kept -= std::min(w.kept - kept_before, out * w.activation);
    }
    w.pending -= out * w.activation;
    const bool recorded = body_grad || w.input_grad;
    if constexpr (sample_elements<Out>() != dyn) {
      // Fused into the body's batch norm (on the CPU), the sum is that layer's output, counted.
      constexpr bool fused = M::fuses_into_norm && std::is_same_v<typename M::space, host>;
      if (recorded && !fused) w.kept += out * w.activation;
      if (recorded) w.gradients = std::max(w.gradients, w.pending + 3 * out * w.activation);
      else w.transient = std::max(w.transient, 3 * out * w.activation);  // the two branches and the sum
      // Fused under mixed precision, the batch norm's float copies of its input, the shortcut
      // and the sum (nn/half_io.hpp) live while it runs, beside the three half-precision tensors
      // (a frozen block's peak; a trained one's is in backward, with everything kept).
      if (fused && w.mixed && !recorded) w.transient = std::max(w.transient, 3 * out * (sizeof(float) + w.activation));
    }
    w.input_grad = recorded;
  } else if constexpr (requires { M::count; m.first(); m.block(1); }) {  // nn::Repeat
    plan_walk<In>(m.first(), w);
    using After = nn::output_sample_t<typename M::first_type, In>;
    for (index_t i = 1; i < M::count; ++i) plan_walk<After>(m.block(i), w);
  } else {
    plan_leaf<In, void>(m, w);
  }
}

// The optimizer's state in floats per trainable parameter value.
template <class Optimizer, class Options>
constexpr std::size_t optimizer_floats(const Options& o) {
  if constexpr (requires { o.amsgrad; }) return o.amsgrad ? 3 : 2;  // Adam / AdamW: exp_avg, exp_avg_sq (+ max)
  else if constexpr (requires { o.momentum; }) return o.momentum != 0 ? 1 : 0;  // SGD: the momentum buffer
  else return 0;
}

}  // namespace detail

// The plan for `model` trained by Optimizer (with `options`) under a policy given as values
// (kiln/policy/info.hpp: a step's policy(), whatever its type), for the parameters' requires_grad
// flags now (freeze before planning a fine-tune).
template <class Optimizer, class Model>
MemoryPlan plan_memory(const Model& model, const typename Optimizer::Options& options, int threads,
                       const PolicyInfo& policy) {
  using value = typename Model::value_type;
  const bool mixed = policy.mixed;
  detail::PlanWalk walk{.mixed = mixed, .activation = mixed ? 2 : sizeof(value)};
  detail::plan_walk<nn::any_sample>(model, walk);
  KILN_CHECK(walk.known, ValueError, "plan_memory: a layer's output size is not known at compile time; the planner "
             "needs every size (start an image model with nn::Unflatten<C, H, W>)");
  MemoryPlan plan;
  plan.model = nn::summary(model, 1);  // the top-level layers, one per line
  plan.parameters = std::size_t(model.parameter_count()) * sizeof(value);
  // Gradient buffers: the trainable parameters' (a frozen one gets none, nn/freeze.hpp).
  plan.gradients = std::size_t(model.trainable_parameter_count()) * sizeof(value);
  plan.optimizer = std::size_t(model.trainable_parameter_count()) * sizeof(float) *
                   detail::optimizer_floats<Optimizer>(options);
  plan.low_copies = mixed ? walk.linear_weights * 2 : 0;
  // The step's input rows, what the walk keeps and its largest transient, and the loss's per-row
  // values (3 floats: the row's loss, its log-sum-exp and its label).
  plan.per_sample = std::size_t(Model::in_features) * walk.activation + walk.kept +
                    std::max(walk.transient, walk.gradients) + 3 * sizeof(float);
  plan.modelled = !policy.eager;
  if constexpr (std::is_same_v<typename Model::space, host>) {
    plan.workspace = [threads, mixed, linears = walk.linears, convs = walk.convs](index_t batch) {
      std::size_t most = 0;
      for (const auto& [in, out] : linears) {  // forward, weight gradient, input gradient
        auto ws = [&](index_t m, index_t n, index_t k) {
          return mixed ? cpu::gemm_workspace_bytes<bf16>(m, n, k, threads) : cpu::gemm_workspace_bytes<value>(m, n, k, threads);
        };
        most = std::max({most, ws(batch, out, in), ws(out, in, batch), ws(batch, in, out)});
      }
      // A convolution's two scratch buffers (columns and output, grown to the largest chunk and
      // kept, per thread: kiln/backend/cpu/conv2d.hpp), and its GEMM's packing.
      std::size_t conv = 0;
      for (cpu::Conv2dShape s : convs) {
        s.n = batch;
        const index_t chunk = cpu::detail::conv2d_chunk<float>(s), ohw = s.out_h() * s.out_w();
        conv = std::max(conv, std::size_t(s.col_rows() + s.c_out) * std::size_t(chunk * ohw) * sizeof(float));
        most = std::max(most, cpu::gemm_workspace_bytes<float>(s.c_out, chunk * ohw, s.col_rows(), threads));
      }
      return most + conv;
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
  // A policy train::Step refuses is refused here too (the layer without a half-precision path named).
  static_assert(nn::mixed_precision_required<P::mixed, Model>::value);
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
