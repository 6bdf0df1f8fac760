// kiln/optim/batch_scaling.hpp — carrying a tuned learning rate to another batch size.
//
// linear: lr ∝ batch (Goyal et al. 2017, "Accurate, Large Minibatch SGD"): the usual rule for SGD
//         with momentum, best paired with a warmup at large batches.
// sqrt:   lr ∝ sqrt(batch) (Krizhevsky 2014; Hoffer et al. 2017): keeps the gradient noise
//         scale, the usual starting point for Adam-style optimizers.
//
//   const double lr = kiln::optim::linear_scaling(0.1, 256, 1024);   // 0.4
#pragma once

#include <cmath>
#include <string_view>

#include "kiln/config.hpp"
#include "kiln/core/error.hpp"

namespace kiln::optim {

enum class BatchScaling { none, linear, sqrt };

namespace detail {
inline void check_batch_scaling(double base_lr, index_t base_batch, index_t batch, const char* fn) {
  KILN_CHECK(std::isfinite(base_lr) && base_lr >= 0.0, ValueError, fn, ": base_lr must be finite and >= 0, got ",
             base_lr);
  KILN_CHECK(base_batch > 0, ValueError, fn, ": base_batch must be > 0, got ", base_batch);
  KILN_CHECK(batch > 0, ValueError, fn, ": batch must be > 0, got ", batch);
}
}  // namespace detail

// base_lr * batch / base_batch.
inline double linear_scaling(double base_lr, index_t base_batch, index_t batch) {
  detail::check_batch_scaling(base_lr, base_batch, batch, "linear_scaling");
  return base_lr * double(batch) / double(base_batch);
}

// base_lr * sqrt(batch / base_batch).
inline double sqrt_scaling(double base_lr, index_t base_batch, index_t batch) {
  detail::check_batch_scaling(base_lr, base_batch, batch, "sqrt_scaling");
  return base_lr * std::sqrt(double(batch) / double(base_batch));
}

// The rule chosen at run time (a command-line flag, a config file); none keeps base_lr.
inline double scale_lr(BatchScaling rule, double base_lr, index_t base_batch, index_t batch) {
  if (rule == BatchScaling::none) {
    detail::check_batch_scaling(base_lr, base_batch, batch, "scale_lr");
    return base_lr;
  }
  return rule == BatchScaling::linear ? linear_scaling(base_lr, base_batch, batch)
                                      : sqrt_scaling(base_lr, base_batch, batch);
}

// The rule named "none", "linear" or "sqrt"; another name is a ValueError listing them.
inline BatchScaling batch_scaling(std::string_view name) {
  if (name == "none") return BatchScaling::none;
  if (name == "linear") return BatchScaling::linear;
  KILN_CHECK(name == "sqrt", ValueError, "unknown batch scaling rule \"", name, "\"; the rules are none, linear and sqrt");
  return BatchScaling::sqrt;
}

}  // namespace kiln::optim
