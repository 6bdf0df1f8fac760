// kiln/autograd/tape.hpp — a minimal tape over materialised nodes (each a kernel or a library
// call), replayed in reverse by backward().
#pragma once

#include <functional>
#include <utility>
#include <vector>

#include "kiln/autograd/var.hpp"
#include "kiln/expr/assign.hpp"

namespace kiln::ag {

namespace detail {
inline bool& grad_mode() {
  thread_local bool enabled = true;
  return enabled;
}
}  // namespace detail

inline bool grad_enabled() { return detail::grad_mode(); }

// Within its scope nothing is recorded and results need no gradient (evaluation, metrics).
class NoGrad {
 public:
  NoGrad() : previous_(detail::grad_mode()) { detail::grad_mode() = false; }
  ~NoGrad() { detail::grad_mode() = previous_; }
  NoGrad(const NoGrad&) = delete;
  NoGrad& operator=(const NoGrad&) = delete;

 private:
  bool previous_;
};

template <class Exec>
class Tape {
 public:
  using executor_type = Exec;
  explicit Tape(Exec& exec) : exec_(&exec) {}

  Exec& exec() const { return *exec_; }
  bool recording() const { return grad_enabled(); }
  std::size_t size() const { return backward_.size(); }
  void clear() { backward_.clear(); }

  // Adds a backward rule; rules run in reverse order of recording.
  void record(std::function<void(Exec&)> rule) {
    if (recording()) backward_.push_back(std::move(rule));
  }

  // Seeds d(loss)/d(loss) = 1, runs every rule in reverse and clears the tape.
  template <class T, class S, index_t... D>
  void backward(const Var<T, S, D...>& loss) {
    static_assert(((D == 1 || D == dyn) && ...),
                  "kiln: backward() needs a scalar loss; reduce it first (kiln::ag::mean or kiln::ag::sum)");
    KILN_CHECK(loss.value().size() == 1, ShapeError, "backward() needs a scalar loss, got shape ",
               loss.shape().str(), "; reduce it first (kiln::ag::mean or kiln::ag::sum)");
    KILN_CHECK(loss.requires_grad(), ValueError,
               "backward(): the loss does not depend on any variable that requires a gradient");
    auto& d = *loss.data();
    d.ensure_grad();
    assign(d.grad, 1.0, *exec_);
    d.grad_valid = true;
    for (auto it = backward_.rbegin(); it != backward_.rend(); ++it) (*it)(*exec_);
    backward_.clear();
  }

 private:
  Exec* exec_;
  std::vector<std::function<void(Exec&)>> backward_;
};

}  // namespace kiln::ag
