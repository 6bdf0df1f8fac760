// kiln/optim/sgd.hpp — stochastic gradient descent with PyTorch's semantics and defaults.
//
// Per element, as torch.optim.SGD (1.13, single-tensor path):
//   d = maximize ? -g : g;   d += weight_decay * p
//   buf = first step with momentum ? d : momentum * buf + (1 - dampening) * d
//   d = nesterov ? d + momentum * buf : buf          (only when momentum != 0)
//   p -= lr * d
// One step() is one fused loop over every parameter in the table.
//
//   kiln::optim::Sgd opt(table, {.lr = 0.1, .momentum = 0.9, .nesterov = true});
//   opt.step(exec);
#pragma once

#include <cmath>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "kiln/backend/cpu/executor.hpp"
#include "kiln/config.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/stats.hpp"
#include "kiln/optim/param.hpp"

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
  bool init_buffer;  // true on the first step with momentum: buf = d (PyTorch's buffer start)
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

class Sgd {
 public:
  Sgd(ParamTable table, const SgdOptions& options) : table_(std::move(table)), opt_(options) { check(opt_); }

  // One update of every parameter from its current grad: one launch of kind::optimizer.
  void step(CpuExecutor& exec) {
    const index_t n = table_.total_size();
    const bool use_buffer = opt_.momentum != 0.0;
    // The buffer starts on the first step that uses momentum, as PyTorch creates it lazily.
    const bool init = use_buffer && momentum_buffer_.empty();
    if (init) momentum_buffer_.assign(std::size_t(n), 0.0f);
    const SgdParams h{float(opt_.lr),           float(opt_.momentum), float(1.0 - opt_.dampening),
                      float(opt_.weight_decay), opt_.nesterov,        opt_.maximize,
                      init};
    // bytes: read p and g, write p; with momentum also read and write buf.
    exec.stats().count(kind::optimizer, "sgd", n, std::size_t(n) * sizeof(float) * (use_buffer ? 5 : 3));
    float* state = momentum_buffer_.data();
    exec.parallel_for(n, CpuExecutor::grain, [&](index_t b, index_t e) {
      table_.for_each_span(b, e, [&](const ParamSlot& s, index_t lb, index_t le, index_t fb) {
        const SgdParams hl = h;  // a private copy: stores through p cannot change it, so it stays in registers
        float* KILN_RESTRICT p = s.value;
        const float* KILN_RESTRICT g = s.grad;
        if (use_buffer) {
          float* KILN_RESTRICT buf = state + (fb - lb);
          for (index_t i = lb; i < le; ++i) sgd_update(p[i], g[i], buf[i], hl);
        } else {
          for (index_t i = lb; i < le; ++i) sgd_update(p[i], g[i], hl);
        }
      });
    });
    ++steps_;
  }

  // Sets every gradient to 0 (one launch).
  void zero_grad(CpuExecutor& exec) const { optim::zero_grad(table_, exec); }

  double lr() const { return opt_.lr; }
  void set_lr(double lr) {
    SgdOptions next = opt_;
    next.lr = lr;
    check(next);
    opt_ = next;
  }
  double momentum() const { return opt_.momentum; }
  // For momentum cycling (OneCycleLr::momentum).
  void set_momentum(double momentum) {
    SgdOptions next = opt_;
    next.momentum = momentum;
    check(next);
    opt_ = next;
  }

  const SgdOptions& options() const { return opt_; }
  const ParamTable& table() const { return table_; }
  index_t steps() const { return steps_; }
  // The momentum buffer, laid out by table().offset(k); empty until a step has used momentum.
  std::span<float> momentum_buffer() { return momentum_buffer_; }
  std::span<const float> momentum_buffer() const { return momentum_buffer_; }

 private:
  // The checks torch.optim.SGD makes, each naming its argument. `!(x >= 0)` also rejects NaN.
  static void check(const SgdOptions& o) {
    KILN_CHECK(std::isfinite(o.lr) && o.lr >= 0.0, ValueError, "Sgd: lr must be finite and >= 0, got ", o.lr);
    KILN_CHECK(std::isfinite(o.momentum) && o.momentum >= 0.0, ValueError,
               "Sgd: momentum must be finite and >= 0, got ", o.momentum);
    KILN_CHECK(std::isfinite(o.dampening), ValueError, "Sgd: dampening must be finite, got ", o.dampening);
    KILN_CHECK(std::isfinite(o.weight_decay) && o.weight_decay >= 0.0, ValueError,
               "Sgd: weight_decay must be finite and >= 0, got ", o.weight_decay);
    KILN_CHECK(!o.nesterov || (o.momentum > 0.0 && o.dampening == 0.0), ValueError,
               "Sgd: nesterov needs momentum > 0 and dampening == 0, got momentum ", o.momentum, " and dampening ",
               o.dampening);
  }

  ParamTable table_;
  SgdOptions opt_;
  std::vector<float> momentum_buffer_;
  index_t steps_ = 0;
};

}  // namespace kiln::optim
