// kiln/optim/adam.hpp — Adam and AdamW with PyTorch's semantics and defaults.
//
// Per element at step t (1-based), as torch.optim.Adam / AdamW (1.13, single-tensor path):
//   g = maximize ? -g : g
//   Adam:  g += weight_decay * p              (L2 penalty folded into the gradient)
//   AdamW: p *= 1 - lr * weight_decay         (decoupled decay, before the update)
//   m = beta1 * m + (1 - beta1) * g;   v = beta2 * v + (1 - beta2) * g * g
//   v_hat = amsgrad ? (v_max = max(v_max, v)) : v
//   p -= lr / (1 - beta1^t) * m / (sqrt(v_hat) / sqrt(1 - beta2^t) + eps)
// The step-dependent scalars are computed in double (as Python does) and handed to the
// per-element functions in an AdamParams. As in PyTorch, t is per parameter (state[p]["step"]):
// it advances only on steps where that parameter has a gradient, and a parameter without one
// (ParamSlot::has_grad false) is skipped — value, moments and weight decay untouched.
//
// optim::Adam<Space> / AdamW<Space> are one API for every memory space: the host ones here, the
// kiln::cuda ones in kiln/optim/cuda_step.cuh (nvcc translation units). Built from a table they
// are host optimizers; built from a model (optim::param_model) they take the model's space.
//   opt.step(exec)                                   one fused loop (one kernel on a device)
//   opt.step(exec, {.found_inf = flag})              a no-op when *flag != 0 (optim::StepGuard)
//   opt.template step<kiln::stance::force_eager>(exec)   kiln expressions, tensor by tensor
//
//   kiln::optim::AdamW opt(table, {.lr = 3e-4, .weight_decay = 0.1});
//   opt.step(exec);
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/backend/cpu/executor.hpp"
#include "kiln/config.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/space.hpp"
#include "kiln/core/stats.hpp"
#include "kiln/expr/assign.hpp"
#include "kiln/expr/elementwise.hpp"
#include "kiln/expr/math.hpp"
#include "kiln/optim/param.hpp"
#include "kiln/policy/stance.hpp"

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

// The step-t bias corrections of h (t >= 1), in double: h.step_size = lr / (1 - beta1^t) and
// h.bias_correction2_sqrt = sqrt(1 - beta2^t). On the host and in device code alike (the CUDA
// step computes them per chunk from the parameter's count in device memory).
KILN_HOST_DEVICE void set_adam_step(AdamParams& h, double lr, double beta1, double beta2, index_t t) {
  const double bias_correction1 = 1.0 - math::pow(beta1, double(t));
  const double bias_correction2 = 1.0 - math::pow(beta2, double(t));
  h.step_size = float(lr / bias_correction1);
  h.bias_correction2_sqrt = float(math::sqrt(bias_correction2));
}

// Builds the step-t scalars (t >= 1). decoupled: AdamW's weight decay, else Adam's.
inline AdamParams make_adam_params(double lr, double beta1, double beta2, double eps, double weight_decay,
                                   bool decoupled, bool maximize, index_t t) {
  AdamParams h{float(beta1),
               float(beta2),
               float(1.0 - beta1),
               float(1.0 - beta2),
               0.0f,
               1.0f,
               float(eps),
               decoupled ? 0.0f : float(weight_decay),
               decoupled ? float(1.0 - lr * weight_decay) : 1.0f,
               maximize};
  set_adam_step(h, lr, beta1, beta2, t);
  return h;
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

// Which parameters take part in a step and each one's step count t (PyTorch's state[p]["step"]).
// The host's record on the CPU; on CUDA a mirror of the device's counts.
class AdamSlots {
 public:
  explicit AdamSlots(index_t count) : active_(std::size_t(count), 0), steps_(std::size_t(count), 0) {}

  // Reads every slot's gradient flag for this step; returns the elements that will be updated.
  index_t read_flags(const ParamTable& table) {
    index_t n = 0;
    for (index_t k = 0; k < table.count(); ++k) {
      active_[std::size_t(k)] = table[k].has_gradient();
      if (active_[std::size_t(k)]) n += table[k].size;
    }
    return n;
  }
  // Advances the count of every parameter that read_flags found with a gradient.
  void advance() {
    for (std::size_t k = 0; k < active_.size(); ++k) steps_[k] += active_[k] ? 1 : 0;
  }
  bool any_active() const {
    for (char a : active_)
      if (a) return true;
    return false;
  }
  bool active(index_t k) const { return active_[std::size_t(k)] != 0; }
  index_t steps(index_t k) const { return steps_[std::size_t(k)]; }
  // One count per parameter (the device's layout too).
  std::vector<index_t>& counts() { return steps_; }

 private:
  std::vector<char> active_;  // char, not vector<bool>: threads read it side by side
  std::vector<index_t> steps_;
};

// The checks torch.optim.Adam(W) makes, except that eps must be > 0 here: eps == 0 divides 0 by 0
// for every element whose gradient has always been 0. `!(x >= 0)` also rejects NaN.
template <class Options>
void check_adam(const Options& o, const char* name) {
  KILN_CHECK(std::isfinite(o.lr) && o.lr >= 0.0, ValueError, name, ": lr must be finite and >= 0, got ", o.lr);
  KILN_CHECK(o.beta1 >= 0.0 && o.beta1 < 1.0, ValueError, name, ": beta1 must be in [0, 1), got ", o.beta1);
  KILN_CHECK(o.beta2 >= 0.0 && o.beta2 < 1.0, ValueError, name, ": beta2 must be in [0, 1), got ", o.beta2);
  KILN_CHECK(std::isfinite(o.eps) && o.eps > 0.0, ValueError, name, ": eps must be finite and > 0, got ", o.eps);
  KILN_CHECK(std::isfinite(o.weight_decay) && o.weight_decay >= 0.0, ValueError, name,
             ": weight_decay must be finite and >= 0, got ", o.weight_decay);
}

template <bool Decoupled, class Options>
AdamParams adam_params(const Options& o, index_t t) {
  return make_adam_params(o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, Decoupled, o.maximize, t);
}

// ---- force_eager: the update as kiln expressions, one parameter tensor at a time ------------------
// What PyTorch's single-tensor (foreach=False) Adam(W) does, node by node; every node is one
// kernel (kiln::assign<stance::force_eager>). The formulas of adam_update / adamw_update with the
// same AdamParams, so results agree with the fused step to rounding. G gradient, P value, M, V,
// VM (amsgrad's max) state, D a scratch tensor:
//   maximize or Adam's L2:  D = (maximize ? -G : G) [+ P * wd]           1 + 2 nodes at most
//   AdamW with weight decay:  P = P * (1 - lr * wd)                      1
//   M = M * beta1 + D * (1 - beta1)                                      3
//   V = V * beta2 + D * (1 - beta2) * D                                  4
//   amsgrad:  VM = maximum(VM, V)                                        1
//   P = P - M / (sqrt(V or VM) / sqrt(1 - beta2^t) + eps) * step_size    6
template <bool Decoupled, class Options>
constexpr index_t adam_eager_launches(const Options& o) {
  const bool wd = o.weight_decay != 0.0;
  return (o.maximize ? 1 : 0) + (!Decoupled && wd ? 2 : 0) + (Decoupled && wd ? 1 : 0) + 3 + 4 +
         (o.amsgrad ? 1 : 0) + 6;
}

// One parameter's eager Adam(W) step with its own scalars h (t already advanced). m, v, v_max:
// its part of the state (v_max amsgrad only); scratch: s.size floats in the same space (maximize
// or Adam's L2 only).
template <bool Decoupled, class Exec, class Options>
void adam_eager_tensor(Exec& exec, const ParamSlot& s, float* m_data, float* v_data, float* vmax_data, float* scratch,
                       const Options& o, const AdamParams& h) {
  using S = typename Exec::space;
  using E = stance::force_eager;
  const Shape shape{s.size};
  const FlatView<S, float> p(s.value, shape), m(m_data, shape), v(v_data, shape);
  const FlatView<S, const float> g(s.grad, shape);
  FlatView<S, const float> d = g;
  const bool l2 = !Decoupled && o.weight_decay != 0.0;
  if (o.maximize || l2) {
    const FlatView<S, float> t(scratch, shape);
    if (o.maximize && l2) assign<E>(t, -g + p * h.weight_decay, exec);
    else if (o.maximize) assign<E>(t, -g, exec);
    else assign<E>(t, g + p * h.weight_decay, exec);
    d = t;
  }
  if (Decoupled && o.weight_decay != 0.0) assign<E>(p, p * h.decay, exec);
  assign<E>(m, m * h.beta1 + d * h.one_minus_beta1, exec);
  assign<E>(v, v * h.beta2 + d * h.one_minus_beta2 * d, exec);
  FlatView<S, const float> v_hat = v;
  if (o.amsgrad) {
    const FlatView<S, float> vm(vmax_data, shape);
    assign<E>(vm, maximum(vm, v), exec);
    v_hat = vm;
  }
  assign<E>(p, p - m / (sqrt(v_hat) / h.bias_correction2_sqrt + h.eps) * h.step_size, exec);
}

// Adam (Decoupled = false) and AdamW (true) on the host: the same state and loop, a different update.
template <bool Decoupled>
class AdamBase {
 public:
  using space = host;
  using Options = std::conditional_t<Decoupled, AdamWOptions, AdamOptions>;
  static constexpr const char* name = Decoupled ? "AdamW" : "Adam";

  AdamBase(ParamTable table, const Options& options)
      : table_(std::move(table)), opt_(options), slots_(table_.count()), params_(std::size_t(table_.count())) {
    check_adam(opt_, name);
    const std::size_t n = std::size_t(table_.total_size());
    exp_avg_.assign(n, 0.0f);
    exp_avg_sq_.assign(n, 0.0f);
    if (opt_.amsgrad) max_exp_avg_sq_.assign(n, 0.0f);
  }
  // From a host model: its param_table().
  template <param_model M>
  AdamBase(const M& model, const Options& options) : AdamBase(model.param_table(), options) {
    static_assert(std::is_same_v<typename M::space, host>,
                  "kiln::optim::Adam<kiln::host> / AdamW<kiln::host>: the model's parameters live in another memory "
                  "space; write optim::AdamW opt(model, ...) to take the model's space");
  }

  // Launches of one step() for `tensors` parameter tensors with a gradient: fused, one
  // kind::optimizer launch (counted even when nothing has a gradient or a guard skips it);
  // force_eager, the nodes of detail::adam_eager_launches per tensor (none when a guard skips).
  static constexpr index_t launches(bool eager, const Options& options, index_t tensors) {
    return eager ? adam_eager_launches<Decoupled>(options) * tensors : 1;
  }

  // One update of every parameter that has a gradient. Fused (the default stance): one loop,
  // one launch of kind::optimizer. force_eager: the update as kiln expressions, tensor by tensor
  // (detail::adam_eager_tensor). With a guard whose flag is non-zero, nothing changes (the
  // per-parameter counts included).
  template <class Stance = stance::fused>
  void step(CpuExecutor& exec, StepGuard guard = {}) {
    static_assert(stance::is_stance_v<Stance>, "kiln::optim::Adam(W)::step: the template argument is a stance "
                  "(kiln::stance::fused or kiln::stance::force_eager)");
    ++steps_;
    const index_t work = slots_.read_flags(table_);
    const bool ams = opt_.amsgrad;
    if constexpr (std::is_same_v<Stance, stance::fused>)
      // bytes: read p, g, m, v (and v_max), write p, m, v (and v_max).
      exec.stats().count(kind::optimizer, Decoupled ? "adamw" : "adam", work,
                         std::size_t(work) * sizeof(float) * (ams ? 9 : 7));
    if (host_guard_skips(guard)) return;
    slots_.advance();
    // Each parameter's scalars from its own t, computed once per distinct t (usually one).
    index_t t_prev = 0;
    AdamParams h{};
    for (index_t k = 0; k < table_.count(); ++k) {
      if (!slots_.active(k)) continue;
      const index_t t = slots_.steps(k);
      if (t != t_prev) h = adam_params<Decoupled>(opt_, t);
      params_[std::size_t(k)] = h;
      if (!table_[k].decays) {  // the group without weight decay: L2 term 0, decoupled factor 1
        params_[std::size_t(k)].weight_decay = 0.0f;
        params_[std::size_t(k)].decay = 1.0f;
      }
      t_prev = t;
    }
    if constexpr (std::is_same_v<Stance, stance::fused>) fused_step(exec);
    else eager_step(exec);
  }

  // optim::zero_grad over the table: set_to_none clears flagged slots and zero-fills the others.
  void zero_grad(CpuExecutor& exec, bool set_to_none = true) const { optim::zero_grad(table_, exec, set_to_none); }

  double lr() const { return opt_.lr; }
  void set_lr(double lr) {
    Options next = opt_;
    next.lr = lr;
    check_adam(next, name);
    opt_ = next;
  }
  double beta1() const { return opt_.beta1; }
  // For momentum cycling (OneCycleLr::momentum), as PyTorch cycles betas[0].
  void set_beta1(double beta1) {
    Options next = opt_;
    next.beta1 = beta1;
    check_adam(next, name);
    opt_ = next;
  }

  const Options& options() const { return opt_; }
  const ParamTable& table() const { return table_; }
  // Number of step() calls (guard-skipped ones included).
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

  // Checkpoint state (optim::StateBuffer): the moments, and each parameter's step count t.
  static constexpr const char* counter_name = "step";
  std::vector<StateBuffer> state_buffers() {
    std::vector<StateBuffer> out{{"exp_avg", exp_avg_.data()}, {"exp_avg_sq", exp_avg_sq_.data()}};
    if (opt_.amsgrad) out.push_back({"max_exp_avg_sq", max_exp_avg_sq_.data()});
    return out;
  }
  std::vector<index_t> param_counters() const {
    std::vector<index_t> out;
    for (index_t k = 0; k < table_.count(); ++k) out.push_back(slots_.steps(k));
    return out;
  }
  // requires: one count per parameter of table(), each >= 0.
  void set_param_counters(const std::vector<index_t>& counts) {
    KILN_CHECK(index_t(counts.size()) == table_.count(), ValueError, name, "::set_param_counters: ", counts.size(),
               " counts for ", table_.count(), " parameters");
    slots_.counts() = counts;
  }
  void set_steps(index_t steps) { steps_ = steps; }

 private:
  // The loops of step(), one per stance: compiled once in kiln::kernels (below).
  void fused_step(CpuExecutor& exec);
  void eager_step(CpuExecutor& exec);

  static void update(float& p, float g, float& m, float& v, const AdamParams& h) {
    if constexpr (Decoupled) adamw_update(p, g, m, v, h);
    else adam_update(p, g, m, v, h);
  }
  static void update(float& p, float g, float& m, float& v, float& vmax, const AdamParams& h) {
    if constexpr (Decoupled) adamw_update(p, g, m, v, vmax, h);
    else adam_update(p, g, m, v, vmax, h);
  }

  ParamTable table_;
  Options opt_;
  AdamSlots slots_;
  std::vector<AdamParams> params_;  // this step's scalars per parameter (read only where active)
  std::vector<float> exp_avg_, exp_avg_sq_, max_exp_avg_sq_;
  index_t steps_ = 0;
};

template <bool Decoupled>
void AdamBase<Decoupled>::fused_step(CpuExecutor& exec) {
  const bool ams = opt_.amsgrad;
  float* m_all = exp_avg_.data();
  float* v_all = exp_avg_sq_.data();
  float* vmax_all = max_exp_avg_sq_.data();
  // A sqrt and a divide per element: worth threads at a quarter of the elementwise grain.
  // The inner loops vectorise (GCC -O3 unswitches them on the flags in h) only where sqrt
  // need not set errno: build with -fno-math-errno, or they stay scalar (~4x slower).
  exec.parallel_for(table_.total_size(), CpuExecutor::grain / 4, [&](index_t b, index_t e) {
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
template <bool Decoupled>
void AdamBase<Decoupled>::eager_step(CpuExecutor& exec) {
  index_t largest = 0;
  for (const ParamSlot& s : table_) largest = std::max(largest, s.size);
  auto scratch = exec.temps().take(std::size_t(largest) * sizeof(float));
  for (index_t k = 0; k < table_.count(); ++k) {
    if (!slots_.active(k)) continue;
    const index_t off = table_.offset(k);
    float* vmax = opt_.amsgrad ? max_exp_avg_sq_.data() + off : nullptr;
    adam_eager_tensor<Decoupled>(exec, table_[k], exp_avg_.data() + off, exp_avg_sq_.data() + off, vmax,
                                 static_cast<float*>(scratch.get()), opt_, params_[std::size_t(k)]);
  }
}

// kiln::kernels (kiln/config.hpp) compiles both optimizers' loops once (src/kernels/optim.cpp).
#if KILN_EXTERN_KERNELS
extern template class AdamBase<false>;
extern template class AdamBase<true>;
#endif

}  // namespace detail

// Adam (L2 weight decay, AdamOptions) and AdamW (decoupled weight decay, AdamWOptions) in a
// memory space: the host ones below, the kiln::cuda ones in kiln/optim/cuda_step.cuh.
template <class Space = host>
class Adam;
template <class Space = host>
class AdamW;

template <>
class Adam<host> : public detail::AdamBase<false> {
 public:
  using AdamBase::AdamBase;
};

template <>
class AdamW<host> : public detail::AdamBase<true> {
 public:
  using AdamBase::AdamBase;
};

// optim::AdamW opt(table, {...}) is a host optimizer; optim::AdamW opt(model, {...}) takes the model's space.
Adam(ParamTable, const AdamOptions&) -> Adam<host>;
template <param_model M>
Adam(const M&, const AdamOptions&) -> Adam<typename M::space>;
AdamW(ParamTable, const AdamWOptions&) -> AdamW<host>;
template <param_model M>
AdamW(const M&, const AdamWOptions&) -> AdamW<typename M::space>;

}  // namespace kiln::optim
