// kiln/optim/sgd.hpp — stochastic gradient descent with PyTorch's semantics and defaults.
//
// Per element, as torch.optim.SGD (1.13, single-tensor path):
//   d = maximize ? -g : g;   d += weight_decay * p
//   buf = first step with momentum ? d : momentum * buf + (1 - dampening) * d
//   d = nesterov ? d + momentum * buf : buf          (only when momentum != 0)
//   p -= lr * d
// A parameter without a gradient this step (ParamSlot::has_grad false) is skipped, value and
// buffer untouched, and its buffer starts on the first step where it has one — PyTorch's
// per-parameter state.
//
// optim::SGD<Space> is one API for every memory space: SGD<kiln::host> here, SGD<kiln::cuda> in
// kiln/optim/cuda_step.cuh (nvcc translation units). Built from a table it is a host optimizer;
// built from a model (optim::param_model) it takes the model's space and param_table().
//   opt.step(exec)                                   one fused loop (one kernel on a device)
//   opt.step(exec, {.found_inf = flag})              a no-op when *flag != 0 (optim::StepGuard)
//   opt.template step<kiln::stance::force_eager>(exec)   kiln expressions, tensor by tensor
//
//   kiln::optim::SGD opt(table, {.lr = 0.1, .momentum = 0.9, .nesterov = true});
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
#include "kiln/core/view.hpp"
#include "kiln/expr/assign.hpp"
#include "kiln/expr/elementwise.hpp"
#include "kiln/optim/param.hpp"
#include "kiln/policy/stance.hpp"

namespace kiln::optim {

// Field order follows torch.optim.SGD's arguments, so designated initialisers read alike.
// lr defaults to 1e-3 as in PyTorch >= 2.2 (1.13 had no default).
struct SgdOptions {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
  bool maximize = false;
};

// The scalars of one SGD step, already in the parameter type, for sgd_update.
struct SgdParams {
  float lr;
  float momentum;
  float one_minus_dampening;
  float weight_decay;
  bool nesterov;
  bool maximize;
  bool init_buffer;  // true on the parameter's first step with momentum: buf = d (PyTorch's buffer start)
};

namespace detail {
// The gradient with maximize and L2 weight decay applied (skipped at weight_decay 0, as in
// PyTorch, so an infinite p cannot turn it into NaN through 0 * inf).
KILN_HOST_DEVICE float sgd_grad(float p, float g, const SgdParams& h) {
  if (h.maximize) g = -g;
  if (h.weight_decay != 0.0f) g = g + h.weight_decay * p;
  return g;
}
}  // namespace detail

// One element of an SGD step without momentum (h.momentum == 0).
KILN_HOST_DEVICE void sgd_update(float& p, float g, const SgdParams& h) { p = p - h.lr * detail::sgd_grad(p, g, h); }

// One element of an SGD step with momentum (h.momentum != 0); buf is its momentum buffer,
// overwritten with the gradient on the first step (h.init_buffer).
KILN_HOST_DEVICE void sgd_update(float& p, float g, float& buf, const SgdParams& h) {
  const float d = detail::sgd_grad(p, g, h);
  buf = h.init_buffer ? d : buf * h.momentum + h.one_minus_dampening * d;
  p = p - h.lr * (h.nesterov ? d + h.momentum * buf : buf);
}

namespace detail {

inline SgdParams sgd_params(const SgdOptions& o) {
  return {float(o.lr), float(o.momentum), float(1.0 - o.dampening), float(o.weight_decay), o.nesterov, o.maximize,
          false};
}

// The checks torch.optim.SGD makes, each naming its argument. `!(x >= 0)` also rejects NaN.
inline void check_sgd(const SgdOptions& o) {
  KILN_CHECK(std::isfinite(o.lr) && o.lr >= 0.0, ValueError, "SGD: lr must be finite and >= 0, got ", o.lr);
  KILN_CHECK(std::isfinite(o.momentum) && o.momentum >= 0.0, ValueError, "SGD: momentum must be finite and >= 0, got ",
             o.momentum);
  KILN_CHECK(std::isfinite(o.dampening), ValueError, "SGD: dampening must be finite, got ", o.dampening);
  KILN_CHECK(std::isfinite(o.weight_decay) && o.weight_decay >= 0.0, ValueError,
             "SGD: weight_decay must be finite and >= 0, got ", o.weight_decay);
  KILN_CHECK(!o.nesterov || (o.momentum > 0.0 && o.dampening == 0.0), ValueError,
             "SGD: nesterov needs momentum > 0 and dampening == 0, got momentum ", o.momentum, " and dampening ",
             o.dampening);
}

// Which parameters take part in a step and whose momentum buffer has started (PyTorch keeps
// state["momentum_buffer"] per parameter and creates it on the first step where that parameter
// has a gradient). The host's record on the CPU; on CUDA a mirror of the device's.
class SgdSlots {
 public:
  explicit SgdSlots(index_t count) : active_(std::size_t(count), 0), has_buffer_(std::size_t(count), 0) {}

  // Reads every slot's gradient flag for this step; returns the elements that will be updated.
  index_t read_flags(const ParamTable& table) {
    index_t n = 0;
    for (index_t k = 0; k < table.count(); ++k) {
      active_[std::size_t(k)] = table[k].has_gradient();
      if (active_[std::size_t(k)]) n += table[k].size;
    }
    return n;
  }
  // After a step with momentum: the buffers of the parameters it updated now exist.
  void mark_buffers() {
    for (std::size_t k = 0; k < active_.size(); ++k) has_buffer_[k] = has_buffer_[k] || active_[k];
  }
  bool any_active() const {
    for (char a : active_)
      if (a) return true;
    return false;
  }
  bool active(index_t k) const { return active_[std::size_t(k)] != 0; }
  bool has_buffer(index_t k) const { return has_buffer_[std::size_t(k)] != 0; }
  // One byte per parameter, 1 where its buffer has started (the device's layout too).
  std::vector<char>& buffer_bits() { return has_buffer_; }

 private:
  std::vector<char> active_, has_buffer_;  // char, not vector<bool>: threads read them side by side
};

// ---- force_eager: the update as kiln expressions, one parameter tensor at a time ------------------
// What PyTorch's single-tensor (foreach=False) SGD does, node by node; every node is one kernel
// (kiln::assign<stance::force_eager>). The same formulas as sgd_update, so results agree with the
// fused step to rounding. G is the gradient, P the value, B the buffer, D a scratch tensor:
//   maximize or weight_decay:  D = (maximize ? -G : G) [+ P * wd]      1 + 2 nodes at most
//   momentum:  B = B * mu + D [* (1 - dampening)]                      2, or 3 with dampening
//              P = P - (D + B * momentum) * lr  (nesterov)  or  P - B * lr     4 or 2
//   no momentum: P = P - D * lr                                        2
// A buffer's first step runs the same nodes with mu = 0 and 1 - dampening = 1 (its part of the
// buffer still reads 0), so every step launches the same number of kernels.
constexpr index_t sgd_eager_launches(const SgdOptions& o) {
  index_t n = (o.maximize ? 1 : 0) + (o.weight_decay != 0.0 ? 2 : 0);
  if (o.momentum != 0.0) n += (o.dampening != 0.0 ? 3 : 2) + (o.nesterov ? 4 : 2);
  else n += 2;
  return n;
}

// One parameter's eager SGD step. buf: its part of the momentum buffer (momentum only);
// scratch: s.size floats in the same space (maximize or weight decay only); started: whether its
// buffer has started.
template <class Exec>
void sgd_eager_tensor(Exec& exec, const ParamSlot& s, float* buf, float* scratch, const SgdOptions& o,
                      const SgdParams& h, bool started) {
  using S = typename Exec::space;
  using E = stance::force_eager;
  const Shape shape{s.size};
  const FlatView<S, float> p(s.value, shape);
  const FlatView<S, const float> g(s.grad, shape);
  FlatView<S, const float> d = g;
  if (o.maximize || o.weight_decay != 0.0) {
    const FlatView<S, float> t(scratch, shape);
    if (o.maximize && o.weight_decay != 0.0) assign<E>(t, -g + p * h.weight_decay, exec);
    else if (o.maximize) assign<E>(t, -g, exec);
    else assign<E>(t, g + p * h.weight_decay, exec);
    d = t;
  }
  if (o.momentum == 0.0) {
    assign<E>(p, p - d * h.lr, exec);
    return;
  }
  const FlatView<S, float> b(buf, shape);
  const float mu = started ? h.momentum : 0.0f;
  if (o.dampening != 0.0) assign<E>(b, b * mu + d * (started ? h.one_minus_dampening : 1.0f), exec);
  else assign<E>(b, b * mu + d, exec);
  if (o.nesterov) assign<E>(p, p - (d + b * h.momentum) * h.lr, exec);
  else assign<E>(p, p - b * h.lr, exec);
}

}  // namespace detail

// SGD in a memory space: SGD<kiln::host> below, SGD<kiln::cuda> in kiln/optim/cuda_step.cuh.
template <class Space = host>
class SGD;

template <>
class SGD<host> {
 public:
  using space = host;
  using Options = SgdOptions;
  static constexpr const char* name = "SGD";

  SGD(ParamTable table, const SgdOptions& options) : table_(std::move(table)), opt_(options), slots_(table_.count()) {
    detail::check_sgd(opt_);
  }
  // From a host model: its param_table().
  template <param_model M>
  SGD(const M& model, const SgdOptions& options) : SGD(model.param_table(), options) {
    static_assert(std::is_same_v<typename M::space, host>,
                  "kiln::optim::SGD<kiln::host>: the model's parameters live in another memory space; write "
                  "optim::SGD opt(model, ...) to take the model's space");
  }

  // Launches of one step() for `tensors` parameter tensors with a gradient: fused, one
  // kind::optimizer launch (counted even when nothing has a gradient or a guard skips it);
  // force_eager, the nodes of detail::sgd_eager_launches per tensor (none when a guard skips).
  static constexpr index_t launches(bool eager, const SgdOptions& options, index_t tensors) {
    return eager ? detail::sgd_eager_launches(options) * tensors : 1;
  }

  // One update of every parameter that has a gradient. Fused (the default stance): one loop,
  // one launch of kind::optimizer. force_eager: the update as kiln expressions, tensor by
  // tensor (detail::sgd_eager_tensor). With a guard whose flag is non-zero, nothing changes.
  template <class Stance = stance::fused>
  void step(CpuExecutor& exec, StepGuard guard = {}) {
    static_assert(stance::is_stance_v<Stance>, "kiln::optim::SGD::step: the template argument is a stance "
                  "(kiln::stance::fused or kiln::stance::force_eager)");
    ++steps_;
    const bool use_buffer = opt_.momentum != 0.0;
    const index_t work = slots_.read_flags(table_);
    if constexpr (std::is_same_v<Stance, stance::fused>)
      // bytes: read p and g, write p; with momentum also read and write buf.
      exec.stats().count(kind::optimizer, "sgd", work, std::size_t(work) * sizeof(float) * (use_buffer ? 5 : 3));
    if (detail::host_guard_skips(guard)) return;
    // The buffer is allocated on the first step that uses momentum; each parameter's part starts
    // (buf = d) on its own first step with a gradient, and reads 0 until then.
    if (use_buffer && momentum_buffer_.empty()) momentum_buffer_.assign(std::size_t(table_.total_size()), 0.0f);
    const SgdParams h = detail::sgd_params(opt_);
    if constexpr (std::is_same_v<Stance, stance::fused>) fused_step(exec, h, use_buffer);
    else eager_step(exec, h);
    if (use_buffer) slots_.mark_buffers();
  }

  // optim::zero_grad over the table: set_to_none clears flagged slots and zero-fills the others.
  void zero_grad(CpuExecutor& exec, bool set_to_none = true) const { optim::zero_grad(table_, exec, set_to_none); }

  double lr() const { return opt_.lr; }
  void set_lr(double lr) {
    SgdOptions next = opt_;
    next.lr = lr;
    detail::check_sgd(next);
    opt_ = next;
  }
  double momentum() const { return opt_.momentum; }
  // For momentum cycling (OneCycleLr::momentum).
  void set_momentum(double momentum) {
    SgdOptions next = opt_;
    next.momentum = momentum;
    detail::check_sgd(next);
    opt_ = next;
  }

  const SgdOptions& options() const { return opt_; }
  const ParamTable& table() const { return table_; }
  // Number of step() calls (guard-skipped ones included).
  index_t steps() const { return steps_; }
  // The momentum buffer, laid out by table().offset(k); empty until a step has used momentum, 0
  // where a parameter's buffer has not started.
  std::span<float> momentum_buffer() { return momentum_buffer_; }
  std::span<const float> momentum_buffer() const { return momentum_buffer_; }

  // Checkpoint state (optim::StateBuffer): the momentum buffer (created here when momentum is on)
  // and whether each parameter's buffer has started (0 or 1).
  static constexpr const char* counter_name = "momentum_started";
  std::vector<StateBuffer> state_buffers() {
    if (opt_.momentum == 0.0) return {};
    if (momentum_buffer_.empty()) momentum_buffer_.assign(std::size_t(table_.total_size()), 0.0f);
    return {{"momentum_buffer", momentum_buffer_.data()}};
  }
  std::vector<index_t> param_counters() const {
    std::vector<index_t> out;
    for (index_t k = 0; k < table_.count(); ++k) out.push_back(slots_.has_buffer(k) ? 1 : 0);
    return out;
  }
  // requires: one flag (0 or 1) per parameter of table().
  void set_param_counters(const std::vector<index_t>& started) {
    KILN_CHECK(index_t(started.size()) == table_.count(), ValueError, "SGD::set_param_counters: ", started.size(),
               " flags for ", table_.count(), " parameters");
    for (std::size_t k = 0; k < started.size(); ++k) slots_.buffer_bits()[k] = started[k] != 0;
  }
  void set_steps(index_t steps) { steps_ = steps; }
  // Whether parameter k's momentum buffer has started (PyTorch's state[p]["momentum_buffer"]).
  bool has_momentum_buffer(index_t k) const { return slots_.has_buffer(k); }

 private:
  void fused_step(CpuExecutor& exec, const SgdParams& h, bool use_buffer) {
    float* state = momentum_buffer_.data();
    exec.parallel_for(table_.total_size(), CpuExecutor::grain, [&](index_t b, index_t e) {
      table_.for_each_slot_span(b, e, [&](index_t k, const ParamSlot& s, index_t lb, index_t le, index_t fb) {
        if (!slots_.active(k)) return;
        if (use_buffer) momentum_span(s.value + lb, s.grad + lb, state + fb, le - lb, h, !slots_.has_buffer(k));
        else plain_span(s.value + lb, s.grad + lb, le - lb, h);
      });
    });
  }
  void eager_step(CpuExecutor& exec, const SgdParams& h) {
    index_t largest = 0;
    for (const ParamSlot& s : table_) largest = std::max(largest, s.size);
    auto scratch = exec.temps().take(std::size_t(largest) * sizeof(float));
    for (index_t k = 0; k < table_.count(); ++k) {
      if (!slots_.active(k)) continue;
      float* buf = momentum_buffer_.empty() ? nullptr : momentum_buffer_.data() + table_.offset(k);
      detail::sgd_eager_tensor(exec, table_[k], buf, static_cast<float*>(scratch.get()), opt_, h, slots_.has_buffer(k));
    }
  }

  // The loops over one piece of a parameter, each flag of h a compile-time constant in its own
  // instantiation: the loops are then branch-free and vectorise wherever they are inlined.
  // (Left to GCC's loop unswitching, the common version — momentum, no decay — stayed scalar in
  // some callers once init_buffer became per parameter: 5x slower.)
  static void plain_span(float* KILN_RESTRICT p, const float* KILN_RESTRICT g, index_t n, const SgdParams& h) {
    with_flags(
        [&](auto maximize, auto decay) {
          const SgdParams hl = constant_flags(h, false, false, maximize, decay);
          for (index_t i = 0; i < n; ++i) sgd_update(p[i], g[i], hl);
        },
        h.maximize, h.weight_decay != 0.0f);
  }
  static void momentum_span(float* KILN_RESTRICT p, const float* KILN_RESTRICT g, float* KILN_RESTRICT buf, index_t n,
                            const SgdParams& h, bool init) {
    with_flags(
        [&](auto init_c, auto nesterov, auto maximize, auto decay) {
          const SgdParams hl = constant_flags(h, init_c, nesterov, maximize, decay);
          for (index_t i = 0; i < n; ++i) sgd_update(p[i], g[i], buf[i], hl);
        },
        init, h.nesterov, h.maximize, h.weight_decay != 0.0f);
  }
  static SgdParams constant_flags(SgdParams h, bool init, bool nesterov, bool maximize, bool decay) {
    h.init_buffer = init;
    h.nesterov = nesterov;
    h.maximize = maximize;
    if (!decay) h.weight_decay = 0.0f;
    return h;
  }
  // f(std::bool_constant<b>...) for the run-time flags b...
  template <class F>
  static void with_flags(F&& f) {
    f();
  }
  template <class F, class... Bools>
  static void with_flags(F&& f, bool b, Bools... rest) {
    if (b) with_flags([&](auto... c) { f(std::true_type{}, c...); }, rest...);
    else with_flags([&](auto... c) { f(std::false_type{}, c...); }, rest...);
  }

  ParamTable table_;
  SgdOptions opt_;
  detail::SgdSlots slots_;
  std::vector<float> momentum_buffer_;
  index_t steps_ = 0;
};

// optim::SGD opt(table, {...}) is a host optimizer; optim::SGD opt(model, {...}) takes the model's space.
SGD(ParamTable, const SgdOptions&) -> SGD<host>;
template <param_model M>
SGD(const M&, const SgdOptions&) -> SGD<typename M::space>;

// Old spelling; examples move to SGD<...>.
using Sgd = SGD<host>;

}  // namespace kiln::optim
