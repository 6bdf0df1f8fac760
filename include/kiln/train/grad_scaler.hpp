// kiln/train/grad_scaler.hpp — the dynamic loss scaler of fp16 mixed precision, PyTorch's
// torch.amp.GradScaler: the loss is multiplied by a scale so small fp16 gradients do not flush
// to zero; before the optimizer step the gradients are unscaled and checked, a step whose
// gradients hold inf or NaN is skipped (optim::StepGuard) and the scale backs off, and
// growth_interval clean steps in a row grow it.
//
//   kiln::train::GradScaler<Space> scaler({});                 // init_scale 2^16, PyTorch's defaults
//   tape.backward(loss, {.seed = 1.0 / n, .seed_scale = scaler.scale_ptr()});
//   scaler.unscale_and_check(opt.table(), exec);               // one launch: g /= scale, found_inf
//   opt.step(exec, {.found_inf = scaler.found_inf_ptr()});     // a no-op when found_inf != 0
//   scaler.update(exec);                                       // one launch: the new scale
//   ...
//   scaler.check();                                            // whenever losses are read anyway
//
// Everything a step decides lives in ONE small state block in the scaler's memory space (device
// memory for kiln::cuda): the scale, found_inf, the growth tracker, the step and skip counts and
// the step at which the scale fell below its floor. Both launches read and write only that block
// and the gradients, so nothing waits for the device and the step can be captured in a CUDA graph;
// the host reads the block only in the accessors below (which synchronise on CUDA).
//
// found_inf's reset: update() clears it after using it, in the same single-thread launch, so the
// next unscale_and_check only ever sets it (any element, any block; no extra launch or memset).
// Hence found_inf() reads the current step's verdict between unscale_and_check() and update(),
// and 0 after; skipped_steps() counts the verdicts.
//
// Both launches are counted as kind::optimizer ("unscale_check", "scaler_update"): they are part
// of the optimizer step (PyTorch's scaler.step/update wrap optimizer.step) and touch nothing else.
// kiln::cuda needs kiln/train/grad_scaler.cuh (nvcc); the math below is shared by both spaces.
#pragma once

#include <atomic>
#include <cmath>
#include <cstddef>
#include <memory>
#include <type_traits>

#include "kiln/backend/cpu/executor.hpp"
#include "kiln/config.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/memory.hpp"
#include "kiln/core/space.hpp"
#include "kiln/core/stats.hpp"
#include "kiln/optim/param.hpp"

namespace kiln::train {

struct GradScalerOptions {
  // false: the scale is 1, unscale_and_check and update launch nothing and found_inf stays 0, so a
  // training step can hold a scaler whether or not its policy scales the loss.
  bool enabled = true;
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;   // > 1
  double backoff_factor = 0.5;  // in (0, 1)
  index_t growth_interval = 2000;
  // The floor. 1 (DeepSpeed's and Megatron-LM's default min_loss_scale): a scale below 1 means the
  // gradients overflowed fp16 even at their true size, so the run has diverged and halving further
  // only skips more steps on the way to a silent zero. Crossing it is recorded on the device and
  // thrown by check() as a NumericError naming the step; the scale is clamped to the floor (as
  // Megatron-LM does) so it never reaches 0 or a subnormal whose inverse overflows.
  double min_scale = 1.0;
};

namespace detail {

// The state block. Trivially copyable: copied whole between spaces.
struct ScalerState {
  float scale;
  float found_inf;         // what optim::StepGuard reads; 1: this step's gradients hold inf or NaN
  index_t growth_tracker;  // clean steps in a row since the last growth or backoff
  index_t steps;           // update() calls so far
  index_t skipped;         // of those, steps whose found_inf was set
  index_t floor_step;      // the first step (from 1) whose update fell below min_scale; 0: none
};

inline ScalerState initial_state(const GradScalerOptions& o) {
  return {o.enabled ? float(o.init_scale) : 1.0f, 0.0f, 0, 0, 0, 0};
}

inline void check_options(const GradScalerOptions& o) {
  const float init = float(o.init_scale), floor = float(o.min_scale);
  KILN_CHECK(std::isfinite(init) && init > 0.0f, ValueError,
             "GradScaler: init_scale must be a positive finite float, got ", o.init_scale);
  KILN_CHECK(o.growth_factor > 1.0 && std::isfinite(o.growth_factor), ValueError,
             "GradScaler: growth_factor must be > 1 and finite, got ", o.growth_factor);
  KILN_CHECK(o.backoff_factor > 0.0 && o.backoff_factor < 1.0, ValueError,
             "GradScaler: backoff_factor must lie in (0, 1), got ", o.backoff_factor);
  KILN_CHECK(o.growth_interval >= 1, ValueError, "GradScaler: growth_interval must be >= 1, got ",
             o.growth_interval);
  KILN_CHECK(std::isfinite(floor) && floor > 0.0f && floor <= init, ValueError,
             "GradScaler: min_scale must be a positive float no larger than init_scale (", o.init_scale, "), got ",
             o.min_scale);
}

// Finite test without a library call (same on host and device; kiln builds without fast-math).
KILN_HOST_DEVICE bool is_finite(float x) { return x <= 3.40282347e+38f && x >= -3.40282347e+38f; }

// PyTorch's inverse scale: the reciprocal in double, rounded to float (GradScaler.unscale_).
KILN_HOST_DEVICE float inverse_scale(float scale) { return float(1.0 / double(scale)); }

// One gradient element: g *= inv in float; true when the result is inf or NaN. The unscaled value
// is checked (PyTorch checks the scaled one): it is what the optimizer would read, and it is
// non-finite whenever the scaled one is, plus when a scale below 1 overflows on unscaling.
KILN_HOST_DEVICE bool unscale_element(float& g, float inv) {
  g = g * inv;
  return !is_finite(g);
}

// The update of one optimizer step, PyTorch's _amp_update_scale_ (products in double, stored as
// float, growth refused when it would overflow float), then the floor and found_inf's reset.
struct ScaleUpdate {
  ScalerState* state;
  double growth_factor, backoff_factor;
  index_t growth_interval;
  float min_scale;

  KILN_HOST_DEVICE void operator()(index_t, index_t) const {
    ScalerState& s = *state;
    s.steps += 1;
    if (s.found_inf != 0.0f) {
      s.scale = float(double(s.scale) * backoff_factor);
      s.growth_tracker = 0;
      s.skipped += 1;
    } else if (s.growth_tracker + 1 == growth_interval) {
      const float grown = float(double(s.scale) * growth_factor);
      if (is_finite(grown)) s.scale = grown;
      s.growth_tracker = 0;
    } else {
      s.growth_tracker += 1;
    }
    if (s.scale < min_scale) {
      if (s.floor_step == 0) s.floor_step = s.steps;
      s.scale = min_scale;
    }
    s.found_inf = 0.0f;
  }
};

// The space-specific half (uploading the first state; the unscale-and-check pass). kiln::cuda's is
// in kiln/train/grad_scaler.cuh.
template <class Space>
class ScalerBackend {
  static_assert(dependent_false<Space>,
                "kiln::train::GradScaler<kiln::cuda> needs #include <kiln/train/grad_scaler.cuh> in a file compiled "
                "by nvcc");
};

template <>
class ScalerBackend<host> {
 public:
  static void upload(ScalerState* dst, const ScalerState& s) { *dst = s; }

  // A parallel loop over the table's flat index space; a thread that meets inf or NaN raises a
  // shared flag, published to the state once at the end (found_inf is only ever set here).
  void unscale_and_check(ScalerState* state, const optim::ParamTable& table, CpuExecutor& exec) const {
    const float inv = inverse_scale(state->scale);
    std::atomic<bool> found{false};
    exec.parallel_for(table.total_size(), CpuExecutor::grain, [&](index_t b, index_t e) {
      bool bad = false;
      table.for_each_span(b, e, [&](const optim::ParamSlot& s, index_t lb, index_t le, index_t) {
        if (!s.has_gradient()) return;
        float* KILN_RESTRICT g = s.grad;
        for (index_t i = lb; i < le; ++i) bad |= unscale_element(g[i], inv);
      });
      if (bad) found.store(true, std::memory_order_relaxed);
    });
    if (found.load(std::memory_order_relaxed)) state->found_inf = 1.0f;
  }
};

template <class Space>
struct StateDeleter {
  void operator()(ScalerState* p) const noexcept { memory_traits<Space>::deallocate(p, sizeof(ScalerState)); }
};

}  // namespace detail

template <class Space = host>
class GradScaler {
  static_assert(is_space_v<Space>, "kiln::train::GradScaler<Space>: Space is kiln::host or kiln::cuda");

 public:
  using space = Space;

  // Allocates and initialises the state block; on kiln::cuda this synchronises the device once
  // (as the CUDA optimizers' construction does), so any stream may use the scaler after.
  // throws: ValueError naming the option that is out of range.
  explicit GradScaler(const GradScalerOptions& options = {})
      : opt_(checked(options)),
        state_(static_cast<detail::ScalerState*>(memory_traits<Space>::allocate(sizeof(detail::ScalerState)))),
        backend_(std::make_unique<detail::ScalerBackend<Space>>()) {
    detail::ScalerBackend<Space>::upload(state_.get(), detail::initial_state(opt_));
  }

  // Launches of one optimizer step: unscale_and_check and update.
  static constexpr index_t launches_per_step(bool enabled) { return enabled ? 2 : 0; }

  // The current scale (a float in Space): the backward's seed is scale / N, read there.
  const float* scale_ptr() const { return &state_->scale; }
  // This step's verdict (a float in Space), for optim::StepGuard.
  const float* found_inf_ptr() const { return &state_->found_inf; }

  // Unscales every gradient of the slots that have one (g *= float(1 / scale)) and sets found_inf
  // when any result is inf or NaN: one launch of kind::optimizer "unscale_check" (counted also
  // when no element needs it). Slots without a gradient are left alone, bit for bit.
  // throws: ValueError when called twice without update() in between (the gradients would be
  //   unscaled twice), as PyTorch's unscale_.
  template <class Exec>
  void unscale_and_check(const optim::ParamTable& table, Exec& exec) {
    static_assert(std::is_same_v<typename Exec::space, Space>,
                  "kiln::train::GradScaler::unscale_and_check: the executor runs in another memory space than the "
                  "scaler's state");
    if (!opt_.enabled) return;
    KILN_CHECK(!unscaled_, ValueError, "GradScaler::unscale_and_check: called twice since the last update(); the "
               "gradients would be unscaled twice");
    const index_t work = optim::size_with_gradient(table);
    exec.stats().count(kind::optimizer, "unscale_check", work, std::size_t(work) * sizeof(float) * 2);
    backend_->unscale_and_check(state_.get(), table, exec);
    unscaled_ = true;
  }

  // The step's scale update (see detail::ScaleUpdate): one single-thread launch of kind::optimizer
  // "scaler_update". Clears found_inf for the next step.
  // throws: ValueError when unscale_and_check() did not run since the last update() (no verdict).
  template <class Exec>
  void update(Exec& exec) {
    static_assert(std::is_same_v<typename Exec::space, Space>,
                  "kiln::train::GradScaler::update: the executor runs in another memory space than the scaler's state");
    if (!opt_.enabled) return;
    KILN_CHECK(unscaled_, ValueError, "GradScaler::update: no unscale_and_check() since the last update(); the "
               "step's gradients were never checked");
    unscaled_ = false;
    const detail::ScaleUpdate op{state_.get(), opt_.growth_factor, opt_.backoff_factor, opt_.growth_interval,
                                 float(opt_.min_scale)};
    exec.for_each_element(1, 1, op, kind::optimizer, "scaler_update", 2 * sizeof(detail::ScalerState));
  }

  // Host reads of the state block; on kiln::cuda each waits for the whole device.
  detail::ScalerState state() const {
    detail::ScalerState s{};
    memory_traits<Space>::copy_to_host(&s, state_.get(), sizeof(s));
    return s;
  }
  float scale() const { return state().scale; }
  index_t growth_tracker() const { return state().growth_tracker; }
  bool found_inf() const { return state().found_inf != 0.0f; }
  index_t steps() const { return state().steps; }
  index_t skipped_steps() const { return state().skipped; }

  // Throws the divergence the device recorded: NumericError naming the optimizer step at which
  // the scale fell below min_scale. One state read (a device synchronisation on kiln::cuda).
  void check() const {
    if (!opt_.enabled) return;
    const detail::ScalerState s = state();
    KILN_CHECK(s.floor_step == 0, NumericError, "the loss scale fell below its floor ", opt_.min_scale,
               " at optimizer step ", s.floor_step, ": the gradients kept overflowing to inf or NaN (", s.skipped,
               " of ", s.steps, " steps skipped), so the run diverged; lower the learning rate, or find the "
               "operation that produces inf or NaN");
  }

  // Replaces the state block (a checkpoint's, kiln/train/checkpoint.hpp); between steps only.
  void load_state(const detail::ScalerState& s) {
    KILN_CHECK(!unscaled_, ValueError, "GradScaler::load_state: called between unscale_and_check() and update()");
    detail::ScalerBackend<Space>::upload(state_.get(), s);
  }

  bool enabled() const { return opt_.enabled; }
  const GradScalerOptions& options() const { return opt_; }

 private:
  static const GradScalerOptions& checked(const GradScalerOptions& o) {
    detail::check_options(o);
    return o;
  }

  GradScalerOptions opt_;
  std::unique_ptr<detail::ScalerState, detail::StateDeleter<Space>> state_;
  std::unique_ptr<detail::ScalerBackend<Space>> backend_;  // the CUDA one caches a CudaParamTable
  bool unscaled_ = false;                                  // unscale_and_check ran since the last update
};

}  // namespace kiln::train
