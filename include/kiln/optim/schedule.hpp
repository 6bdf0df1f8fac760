// kiln/optim/schedule.hpp — learning-rate schedules as small value types.
//
// A schedule is a pure function of the step: `double lr(index_t step) const`, step counted from
// 0 (the step about to run). It holds no optimizer and no mutable state, so it can be copied,
// compared across runs and evaluated at any step; the training loop applies it:
//
//   kiln::optim::OneCycleLr sched(0.1, total_steps);
//   for (index_t s = 0; s < total_steps; ++s) {
//     opt.set_lr(sched.lr(s));
//     opt.set_momentum(sched.momentum(s));   // Sgd; Adam(W): set_beta1
//     ... forward, backward, opt.step(exec) ...
//   }
//
// Values match PyTorch's schedulers where one exists (StepLR, CosineAnnealingLR, OneCycleLR):
// the value of torch's `param_groups[0]["lr"]` after `step` calls of `scheduler.step()`.
// Arguments are checked at construction and throw ValueError naming the argument.
#pragma once

#include <cmath>
#include <concepts>
#include <numbers>

#include "kiln/config.hpp"
#include "kiln/core/error.hpp"

namespace kiln::optim {

// What a training loop needs from a schedule.
template <class S>
concept LrSchedule = requires(const S& s, index_t step) {
  { s.lr(step) } -> std::convertible_to<double>;
};

namespace detail {
inline void check_lr_arg(double v, const char* schedule, const char* arg) {
  KILN_CHECK(std::isfinite(v) && v >= 0.0, ValueError, schedule, ": ", arg, " must be finite and >= 0, got ", v);
}
inline void check_step(index_t step, const char* schedule) {
  KILN_CHECK(step >= 0, ValueError, schedule, ": step must be >= 0, got ", step);
}
// Cosine from `start` (pct 0) to `end` (pct 1), PyTorch's _annealing_cos.
inline double anneal_cos(double start, double end, double pct) {
  return end + (start - end) / 2.0 * (std::cos(std::numbers::pi * pct) + 1.0);
}
inline double anneal_linear(double start, double end, double pct) { return (end - start) * pct + start; }
}  // namespace detail

// The same lr at every step.
class ConstantLr {
 public:
  explicit ConstantLr(double lr) : lr_(lr) { detail::check_lr_arg(lr, "ConstantLr", "lr"); }
  double lr(index_t step) const {
    detail::check_step(step, "ConstantLr");
    return lr_;
  }

 private:
  double lr_;
};

// StepLR: base_lr * gamma^floor(step / step_size).
class StepLr {
 public:
  StepLr(double base_lr, index_t step_size, double gamma = 0.1)
      : base_lr_(base_lr), step_size_(step_size), gamma_(gamma) {
    detail::check_lr_arg(base_lr, "StepLr", "base_lr");
    KILN_CHECK(step_size > 0, ValueError, "StepLr: step_size must be > 0, got ", step_size);
    detail::check_lr_arg(gamma, "StepLr", "gamma");
  }
  double lr(index_t step) const {
    detail::check_step(step, "StepLr");
    return base_lr_ * std::pow(gamma_, double(step / step_size_));
  }

 private:
  double base_lr_;
  index_t step_size_;
  double gamma_;
};

// CosineAnnealingLR: eta_min + (base_lr - eta_min) * (1 + cos(pi * step / t_max)) / 2. Past
// t_max the cosine rises again (period 2 * t_max), as PyTorch's does.
class CosineAnnealingLr {
 public:
  CosineAnnealingLr(double base_lr, index_t t_max, double eta_min = 0.0)
      : base_lr_(base_lr), t_max_(t_max), eta_min_(eta_min) {
    detail::check_lr_arg(base_lr, "CosineAnnealingLr", "base_lr");
    KILN_CHECK(t_max > 0, ValueError, "CosineAnnealingLr: t_max must be > 0, got ", t_max);
    detail::check_lr_arg(eta_min, "CosineAnnealingLr", "eta_min");
  }
  double lr(index_t step) const {
    detail::check_step(step, "CosineAnnealingLr");
    return detail::anneal_cos(base_lr_, eta_min_, double(step) / double(t_max_));
  }

 private:
  double base_lr_;
  index_t t_max_;
  double eta_min_;
};

// Linear warmup, then cosine decay to min_lr, then min_lr:
//   step <  warmup_steps:          base_lr * (step + 1) / warmup_steps
//   warmup_steps <= step < total:  cosine from base_lr (at warmup_steps) to min_lr (at total_steps)
//   step >= total_steps:           min_lr
// Warmup counts from step + 1 so the first step already moves the weights (a schedule that
// starts at lr 0 wastes it) and step warmup_steps - 1 runs at base_lr.
class WarmupCosineLr {
 public:
  WarmupCosineLr(index_t warmup_steps, index_t total_steps, double base_lr, double min_lr = 0.0)
      : warmup_(warmup_steps), total_(total_steps), base_lr_(base_lr), min_lr_(min_lr) {
    KILN_CHECK(warmup_steps >= 0, ValueError, "WarmupCosineLr: warmup_steps must be >= 0, got ", warmup_steps);
    KILN_CHECK(total_steps > 0 && total_steps >= warmup_steps, ValueError,
               "WarmupCosineLr: total_steps must be > 0 and >= warmup_steps (", warmup_steps, "), got ", total_steps);
    detail::check_lr_arg(base_lr, "WarmupCosineLr", "base_lr");
    detail::check_lr_arg(min_lr, "WarmupCosineLr", "min_lr");
  }
  double lr(index_t step) const {
    detail::check_step(step, "WarmupCosineLr");
    if (step < warmup_) return base_lr_ * double(step + 1) / double(warmup_);
    if (step >= total_) return min_lr_;
    return detail::anneal_cos(base_lr_, min_lr_, double(step - warmup_) / double(total_ - warmup_));
  }
  // The steps the schedule is written for (a training step checks its run makes as many).
  index_t total_steps() const { return total_; }

 private:
  index_t warmup_, total_;
  double base_lr_, min_lr_;
};

enum class Anneal { cos, linear };

// OneCycleLR's settings other than max_lr and total_steps, with its defaults.
struct OneCycleOptions {
  double pct_start = 0.3;
  Anneal anneal = Anneal::cos;
  double div_factor = 25.0;        // initial_lr = max_lr / div_factor
  double final_div_factor = 1e4;   // min_lr = initial_lr / final_div_factor
  bool three_phase = false;
  double base_momentum = 0.85;     // momentum (or Adam's beta1) at the lr peak
  double max_momentum = 0.95;      // momentum at the start and end
};

// OneCycleLR (Smith & Topin 2017) with PyTorch's phase boundaries: lr rises from initial_lr to
// max_lr over steps [0, pct_start * total_steps - 1], then anneals to min_lr at total_steps - 1
// (three_phase: back to initial_lr first, then to min_lr). momentum(step) moves the other way,
// max_momentum -> base_momentum -> max_momentum. Defined for 0 <= step <= total_steps, the range
// PyTorch accepts (step total_steps follows the last one and is never trained with).
class OneCycleLr {
 public:
  OneCycleLr(double max_lr, index_t total_steps, const OneCycleOptions& o = {}) : o_(o), total_(total_steps) {
    KILN_CHECK(std::isfinite(max_lr) && max_lr > 0.0, ValueError, "OneCycleLr: max_lr must be finite and > 0, got ",
               max_lr);
    KILN_CHECK(total_steps > 0, ValueError, "OneCycleLr: total_steps must be > 0, got ", total_steps);
    KILN_CHECK(o.pct_start >= 0.0 && o.pct_start <= 1.0, ValueError, "OneCycleLr: pct_start must be in [0, 1], got ",
               o.pct_start);
    KILN_CHECK(std::isfinite(o.div_factor) && o.div_factor > 0.0, ValueError,
               "OneCycleLr: div_factor must be finite and > 0, got ", o.div_factor);
    KILN_CHECK(std::isfinite(o.final_div_factor) && o.final_div_factor > 0.0, ValueError,
               "OneCycleLr: final_div_factor must be finite and > 0, got ", o.final_div_factor);
    detail::check_lr_arg(o.base_momentum, "OneCycleLr", "base_momentum");
    detail::check_lr_arg(o.max_momentum, "OneCycleLr", "max_momentum");
    const double initial = max_lr / o.div_factor, min_lr = initial / o.final_div_factor;
    const double T = double(total_steps);
    // The products are rounded before the subtraction, as in Python: a fused multiply-add
    // (GCC contracts by default with -march=native) would turn 0.1 * 10 - 1 into 5.6e-17 instead
    // of 0 and move a phase boundary past step 0.
    volatile double up_product = o.pct_start * T, down_product = 2.0 * o.pct_start * T;
    const double up = up_product - 1.0, down = down_product - 2.0;
    const double hi = o.max_momentum, lo = o.base_momentum;
    if (o.three_phase) {
      phases_ = 3;
      phase_[0] = {up, initial, max_lr, hi, lo};
      phase_[1] = {down, max_lr, initial, lo, hi};
      phase_[2] = {T - 1.0, initial, min_lr, hi, hi};
    } else {
      phases_ = 2;
      phase_[0] = {up, initial, max_lr, hi, lo};
      phase_[1] = {T - 1.0, max_lr, min_lr, lo, hi};
    }
  }

  double lr(index_t step) const { return value(step, false); }
  // Momentum for Sgd::set_momentum, or beta1 for Adam(W)::set_beta1 (PyTorch's cycle_momentum).
  double momentum(index_t step) const { return value(step, true); }

  double initial_lr() const { return phase_[0].start_lr; }
  double max_lr() const { return phase_[0].end_lr; }
  double min_lr() const { return phase_[phases_ - 1].end_lr; }
  index_t total_steps() const { return total_; }

 private:
  struct Phase {
    double end_step, start_lr, end_lr, start_momentum, end_momentum;
  };

  // PyTorch's OneCycleLR.get_lr: the first phase whose end_step >= step (or the last phase).
  double value(index_t step, bool momentum) const {
    detail::check_step(step, "OneCycleLr");
    KILN_CHECK(step <= total_, ValueError, "OneCycleLr: step ", step, " is past total_steps ", total_);
    const double s = double(step);
    double start = 0.0;
    for (int i = 0; i < phases_; ++i) {
      const Phase& p = phase_[i];
      if (s <= p.end_step || i == phases_ - 1) {
        // A phase of zero length (e.g. pct_start * total_steps == 1) is already at its end;
        // PyTorch divides by zero here.
        const double pct = p.end_step == start ? 1.0 : (s - start) / (p.end_step - start);
        const double a = momentum ? p.start_momentum : p.start_lr, b = momentum ? p.end_momentum : p.end_lr;
        return o_.anneal == Anneal::cos ? detail::anneal_cos(a, b, pct) : detail::anneal_linear(a, b, pct);
      }
      start = p.end_step;
    }
    return 0.0;  // unreachable: the last phase always matches
  }

  OneCycleOptions o_;
  index_t total_;
  int phases_ = 2;
  Phase phase_[3] = {};
};

}  // namespace kiln::optim
