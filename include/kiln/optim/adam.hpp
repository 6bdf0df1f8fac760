// kiln/optim/adam.hpp — Adam and AdamW with PyTorch's semantics and defaults.
//
// Per element at step t (1-based), as torch.optim.Adam / AdamW (1.13, single-tensor path):
//   g = maximize ? -g : g
//   Adam:  g += weight_decay * p              (L2 penalty folded into the gradient)
//   AdamW: p *= 1 - lr * weight_decay         (decoupled decay, before the update)
//   m = beta1 * m + (1 - beta1) * g;   v = beta2 * v + (1 - beta2) * g * g
//   v_hat = amsgrad ? (v_max = max(v_max, v)) : v
//   p -= lr / (1 - beta1^t) * m / (sqrt(v_hat) / sqrt(1 - beta2^t) + eps)
// The step-dependent scalars are computed once per step in double (as Python does) and handed to
// the per-element functions in an AdamParams; one step() is one fused loop over every parameter.
// As in PyTorch, t is per parameter (state[p]["step"]): it advances only on steps where that
// parameter has a gradient, and a parameter without one (ParamSlot::has_grad false) is skipped —
// value, moments and weight decay untouched.
//
//   kiln::optim::AdamW opt(table, {.lr = 3e-4, .weight_decay = 0.1});
//   opt.step(exec);
#pragma once

#include <cmath>
#include <cstddef>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/backend/cpu/executor.hpp"
#include "kiln/config.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/stats.hpp"
#include "kiln/expr/math.hpp"
#include "kiln/optim/param.hpp"

namespace kiln::optim {

// Defaults of torch.optim.Adam.
struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool amsgrad = false;
  bool maximize = false;
};

// Defaults of torch.optim.AdamW: the same fields, weight_decay 1e-2.
struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool amsgrad = false;
  bool maximize = false;
};

// The scalars of one Adam(W) step, already in the parameter type.
struct AdamParams {
  float beta1;
  float beta2;
  float one_minus_beta1;
  float one_minus_beta2;
  float step_size;              // lr / (1 - beta1^t)
  float bias_correction2_sqrt;  // sqrt(1 - beta2^t)
  float eps;
  float weight_decay;  // Adam's L2 term; adam_update reads it, adamw_update does not
  float decay;         // AdamW's factor 1 - lr * weight_decay; adamw_update reads it, adam_update does not
  bool maximize;
};

// Builds the step-t scalars (t >= 1). decoupled: AdamW's weight decay, else Adam's.
inline AdamParams make_adam_params(double lr, double beta1, double beta2, double eps, double weight_decay,
                                   bool decoupled, bool maximize, index_t t) {
  const double bias_correction1 = 1.0 - std::pow(beta1, double(t));
  const double bias_correction2 = 1.0 - std::pow(beta2, double(t));
  return AdamParams{float(beta1),
                    float(beta2),
                    float(1.0 - beta1),
                    float(1.0 - beta2),
                    float(lr / bias_correction1),
                    float(std::sqrt(bias_correction2)),
                    float(eps),
                    decoupled ? 0.0f : float(weight_decay),
                    decoupled ? float(1.0 - lr * weight_decay) : 1.0f,
                    maximize};
}

namespace detail {
// Adam's gradient: negated for maximize, plus weight_decay * p when weight_decay != 0 (skipped
// at 0, as PyTorch does, so an infinite p cannot turn g into NaN through 0 * inf).
KILN_HOST_DEVICE float adam_grad(float p, float g, const AdamParams& h) {
  if (h.maximize) g = -g;
  if (h.weight_decay != 0.0f) g = g + h.weight_decay * p;
  return g;
}
// Moment updates shared by all four variants; g already has maximize and L2 applied.
KILN_HOST_DEVICE void adam_moments(float g, float& m, float& v, const AdamParams& h) {
  m = m * h.beta1 + h.one_minus_beta1 * g;
  v = v * h.beta2 + h.one_minus_beta2 * g * g;
}
// amsgrad's running max, NaN-propagating like torch.maximum (math::max would drop a NaN v).
KILN_HOST_DEVICE float nan_max(float v_max, float v) { return v_max >= v || v_max != v_max ? v_max : v; }
KILN_HOST_DEVICE void adam_apply(float& p, float m, float v_hat, const AdamParams& h) {
  const float denom = math::sqrt(v_hat) / h.bias_correction2_sqrt + h.eps;
  p = p - h.step_size * (m / denom);
}
}  // namespace detail

// One element of an Adam step (L2 weight decay folded into the gradient).
KILN_HOST_DEVICE void adam_update(float& p, float g, float& m, float& v, const AdamParams& h) {
  g = detail::adam_grad(p, g, h);
  detail::adam_moments(g, m, v, h);
  detail::adam_apply(p, m, v, h);
}
// Adam with amsgrad: v_max keeps the largest v seen and normalises in its place.
KILN_HOST_DEVICE void adam_update(float& p, float g, float& m, float& v, float& v_max, const AdamParams& h) {
  g = detail::adam_grad(p, g, h);
  detail::adam_moments(g, m, v, h);
  v_max = detail::nan_max(v_max, v);
  detail::adam_apply(p, m, v_max, h);
}
// One element of an AdamW step (decoupled weight decay applied to p first).
KILN_HOST_DEVICE void adamw_update(float& p, float g, float& m, float& v, const AdamParams& h) {
  if (h.maximize) g = -g;
  p = p * h.decay;
  detail::adam_moments(g, m, v, h);
  detail::adam_apply(p, m, v, h);
}
KILN_HOST_DEVICE void adamw_update(float& p, float g, float& m, float& v, float& v_max, const AdamParams& h) {
  if (h.maximize) g = -g;
  p = p * h.decay;
  detail::adam_moments(g, m, v, h);
  v_max = detail::nan_max(v_max, v);
  detail::adam_apply(p, m, v_max, h);
}

namespace detail {

// Which parameters take part in a step and each one's step count t (PyTorch's state[p]["step"]),
// shared by AdamBase and CudaAdamBase.
class AdamSlots {
 public:
  explicit AdamSlots(index_t count) : active_(std::size_t(count), 0), steps_(std::size_t(count), 0) {}

  // Reads every slot's gradient flag and advances the count of those that have one; returns the
  // elements that will be updated.
  index_t advance(const ParamTable& table) {
    index_t n = 0;
    for (index_t k = 0; k < table.count(); ++k) {
      const bool on = table[k].has_gradient();
      active_[std::size_t(k)] = on;
      if (on) {
        ++steps_[std::size_t(k)];
        n += table[k].size;
      }
    }
    return n;
  }
  // The count every non-empty slot shares when all of them take part in this step (one
  // AdamParams then serves the whole table), or 0 when the slots differ.
  index_t uniform_step(const ParamTable& table) const {
    index_t t = 0;
    for (index_t k = 0; k < table.count(); ++k) {
      if (table[k].size == 0) continue;
      if (!active(k) || (t != 0 && steps(k) != t)) return 0;
      t = steps(k);
    }
    return t;
  }
  bool active(index_t k) const { return active_[std::size_t(k)] != 0; }
  index_t steps(index_t k) const { return steps_[std::size_t(k)]; }

 private:
  std::vector<char> active_;  // char, not vector<bool>: threads read it side by side
  std::vector<index_t> steps_;
};

// Adam (Decoupled = false) and AdamW (true): the same state and loop, a different update.
template <bool Decoupled>
class AdamBase {
 public:
  using Options = std::conditional_t<Decoupled, AdamWOptions, AdamOptions>;
  static constexpr const char* name = Decoupled ? "AdamW" : "Adam";

  AdamBase(ParamTable table, const Options& options)
      : table_(std::move(table)), opt_(options), slots_(table_.count()), params_(std::size_t(table_.count())) {
    check(opt_);
    const std::size_t n = std::size_t(table_.total_size());
    exp_avg_.assign(n, 0.0f);
    exp_avg_sq_.assign(n, 0.0f);
    if (opt_.amsgrad) max_exp_avg_sq_.assign(n, 0.0f);
  }

  // One update of every parameter that has a gradient: one launch of kind::optimizer.
  void step(CpuExecutor& exec) {
    ++steps_;
    const index_t work = slots_.advance(table_);
    // Each parameter's scalars from its own t, computed once per distinct t (usually one).
    index_t t_prev = 0;
    AdamParams h{};
    for (index_t k = 0; k < table_.count(); ++k) {
      if (!slots_.active(k)) continue;
      const index_t t = slots_.steps(k);
      if (t != t_prev)
        h = make_adam_params(opt_.lr, opt_.beta1, opt_.beta2, opt_.eps, opt_.weight_decay, Decoupled, opt_.maximize, t);
      params_[std::size_t(k)] = h;
      t_prev = t;
    }
    const index_t n = table_.total_size();
    const bool ams = opt_.amsgrad;
    // bytes: read p, g, m, v (and v_max), write p, m, v (and v_max).
    exec.stats().count(kind::optimizer, Decoupled ? "adamw" : "adam", work,
                       std::size_t(work) * sizeof(float) * (ams ? 9 : 7));
    float* m_all = exp_avg_.data();
    float* v_all = exp_avg_sq_.data();
    float* vmax_all = max_exp_avg_sq_.data();
    // A sqrt and a divide per element: worth threads at a quarter of the elementwise grain.
    // The inner loops vectorise (GCC -O3 unswitches them on the flags in h) only where sqrt
    // need not set errno: build with -fno-math-errno, or they stay scalar (~4x slower).
    exec.parallel_for(n, CpuExecutor::grain / 4, [&](index_t b, index_t e) {
      table_.for_each_slot_span(b, e, [&](index_t k, const ParamSlot& s, index_t lb, index_t le, index_t fb) {
        if (!slots_.active(k)) return;
        const AdamParams hl = params_[std::size_t(k)];  // a private copy: stores through p cannot change it
        float* KILN_RESTRICT p = s.value;
        const float* KILN_RESTRICT g = s.grad;
        float* KILN_RESTRICT m = m_all + (fb - lb);
        float* KILN_RESTRICT v = v_all + (fb - lb);
        if (ams) {
          float* KILN_RESTRICT vmax = vmax_all + (fb - lb);
          for (index_t i = lb; i < le; ++i) update(p[i], g[i], m[i], v[i], vmax[i], hl);
        } else {
          for (index_t i = lb; i < le; ++i) update(p[i], g[i], m[i], v[i], hl);
        }
      });
    });
  }

  // optim::zero_grad over the table: set_to_none clears flagged slots and zero-fills the others.
  void zero_grad(CpuExecutor& exec, bool set_to_none = true) const { optim::zero_grad(table_, exec, set_to_none); }

  double lr() const { return opt_.lr; }
  void set_lr(double lr) {
    Options next = opt_;
    next.lr = lr;
    check(next);
    opt_ = next;
  }
  double beta1() const { return opt_.beta1; }
  // For momentum cycling (OneCycleLr::momentum), as PyTorch cycles betas[0].
  void set_beta1(double beta1) {
    Options next = opt_;
    next.beta1 = beta1;
    check(next);
    opt_ = next;
  }

  const Options& options() const { return opt_; }
  const ParamTable& table() const { return table_; }
  // Number of step() calls.
  index_t steps() const { return steps_; }
  // Steps that updated parameter k, its own t (PyTorch's state[p]["step"]).
  index_t param_steps(index_t k) const { return slots_.steps(k); }
  // State buffers, laid out by table().offset(k); max_exp_avg_sq is empty without amsgrad.
  std::span<float> exp_avg() { return exp_avg_; }
  std::span<const float> exp_avg() const { return exp_avg_; }
  std::span<float> exp_avg_sq() { return exp_avg_sq_; }
  std::span<const float> exp_avg_sq() const { return exp_avg_sq_; }
  std::span<float> max_exp_avg_sq() { return max_exp_avg_sq_; }
  std::span<const float> max_exp_avg_sq() const { return max_exp_avg_sq_; }

 private:
  static void update(float& p, float g, float& m, float& v, const AdamParams& h) {
    if constexpr (Decoupled) adamw_update(p, g, m, v, h);
    else adam_update(p, g, m, v, h);
  }
  static void update(float& p, float g, float& m, float& v, float& vmax, const AdamParams& h) {
    if constexpr (Decoupled) adamw_update(p, g, m, v, vmax, h);
    else adam_update(p, g, m, v, vmax, h);
  }

  // The checks torch.optim.Adam(W) makes, except that eps must be > 0 here: eps == 0 divides
  // 0 by 0 for every element whose gradient has always been 0. `!(x >= 0)` also rejects NaN.
  static void check(const Options& o) {
    KILN_CHECK(std::isfinite(o.lr) && o.lr >= 0.0, ValueError, name, ": lr must be finite and >= 0, got ", o.lr);
    KILN_CHECK(o.beta1 >= 0.0 && o.beta1 < 1.0, ValueError, name, ": beta1 must be in [0, 1), got ", o.beta1);
    KILN_CHECK(o.beta2 >= 0.0 && o.beta2 < 1.0, ValueError, name, ": beta2 must be in [0, 1), got ", o.beta2);
    KILN_CHECK(std::isfinite(o.eps) && o.eps > 0.0, ValueError, name, ": eps must be finite and > 0, got ", o.eps);
    KILN_CHECK(std::isfinite(o.weight_decay) && o.weight_decay >= 0.0, ValueError, name,
               ": weight_decay must be finite and >= 0, got ", o.weight_decay);
  }

  ParamTable table_;
  Options opt_;
  AdamSlots slots_;
  std::vector<AdamParams> params_;  // this step's scalars per parameter (read only where active)
  std::vector<float> exp_avg_, exp_avg_sq_, max_exp_avg_sq_;
  index_t steps_ = 0;
};

}  // namespace detail

// Adam: L2 weight decay (AdamOptions, weight_decay 0 by default).
class Adam : public detail::AdamBase<false> {
 public:
  using AdamBase::AdamBase;
};

// AdamW: decoupled weight decay (AdamWOptions, weight_decay 1e-2 by default).
class AdamW : public detail::AdamBase<true> {
 public:
  using AdamBase::AdamBase;
};

}  // namespace kiln::optim
