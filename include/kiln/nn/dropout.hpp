// kiln/nn/dropout.hpp — inverted dropout with a counter-based mask.
//
// Element i is kept when uniform01(seed, offset + i) >= p (kiln/core/random.hpp, Philox), and
// kept elements are scaled by 1 / (1 - p). The mask is a pure function of (seed, offset, i), so
// the CPU and a GPU draw the same mask, and backward recomputes it instead of storing it:
// forward ONE kernel, backward ONE kernel, both functors that run on every executor.
#pragma once

#include <cstdint>

#include "kiln/core/random.hpp"
#include "kiln/nn/module.hpp"

namespace kiln::nn {

// Whether dropout keeps element i (the same bits on every backend).
KILN_HOST_DEVICE bool dropout_keeps(std::uint64_t seed, std::uint64_t offset, index_t i, float p) {
  return uniform01(seed, offset + std::uint64_t(i)) >= p;
}

namespace detail {
// dropout's kernels, as functors so that they run on every executor (one work item per element).
template <class T>
struct DropoutForward {
  const T* x;
  T* y;
  std::uint64_t seed, offset;
  float p;
  T scale;
  KILN_HOST_DEVICE void operator()(index_t, index_t i) const {
    y[i] = dropout_keeps(seed, offset, i, p) ? T(x[i] * scale) : T(0);
  }
};
template <class T>
struct DropoutBackward {
  T* dx;
  const T* g;
  std::uint64_t seed, offset;
  float p;
  T scale;
  bool add;
  KILN_HOST_DEVICE void operator()(index_t, index_t i) const {
    put_grad(dx[i], dropout_keeps(seed, offset, i, p) ? T(g[i] * scale) : T(0), add);
  }
};
}  // namespace detail

// Returns x itself (no kernel) when !training or p == 0; p == 1 gives zeros.
// throws: ValueError when p is outside [0, 1].
template <class Exec, class T, class S, index_t... D>
ag::Var<T, S, D...> dropout(ag::Tape<Exec>& tape, const ag::Var<T, S, D...>& x, double p, std::uint64_t seed,
                            std::uint64_t offset, bool training = true) {
  KILN_CHECK(p >= 0.0 && p <= 1.0, ValueError, "dropout: p must be in [0, 1], got ", p);
  if (!training || p == 0.0) return x;
  using V = ag::Var<T, S, D...>;
  const Shape s = x.shape();
  const index_t n = s.size();
  V out{typename V::tensor_type(s)};
  const float pf = float(p);
  const T scale = p < 1.0 ? T(1.0 / (1.0 - p)) : T(0);
  const detail::DropoutForward<T> kernel{x.value().data(), out.value().data(), seed, offset, pf, scale};
  tape.exec().for_each_element(1, n, kernel, kind::elementwise, "dropout", std::size_t(n) * sizeof(T) * 2);
  if (!x.requires_grad() || !tape.recording()) return out;
  out.set_requires_grad(true);
  tape.record(out, {x.data()}, [xd = x.data(), n, pf, scale, seed, offset](Exec& exec, auto& od) {
    if (!od.grad_valid || !xd->requires_grad) return;
    const bool add = xd->grad_valid;
    T* dx = xd->ensure_grad();
    exec.for_each_element(1, n, detail::DropoutBackward<T>{dx, od.grad.data(), seed, offset, pf, scale, add},
                          kind::elementwise, "dropout_backward", std::size_t(n) * sizeof(T) * 2);
    xd->grad_valid = true;
  });
  return out;
}

// Dropout(p) as a layer: a fresh mask every training forward (the offset advances by the
// number of elements), identity in eval mode.
class Dropout {
 public:
  explicit Dropout(double p = 0.5, std::uint64_t seed = 0) : p_(p), seed_(seed) {
    KILN_CHECK(p >= 0.0 && p <= 1.0, ValueError, "Dropout: p must be in [0, 1], got ", p);
  }
  explicit Dropout(Generator& gen) : Dropout(0.5, gen.next_u64()) {}

  template <class Exec, class T, class S, index_t... D>
  ag::Var<T, S, D...> forward(ag::Tape<Exec>& tape, const ag::Var<T, S, D...>& x) {
    if (!training_) return x;
    auto y = dropout(tape, x, p_, seed_, offset_, true);
    offset_ += std::uint64_t(x.value().size());
    return y;
  }

  void train(bool on = true) { training_ = on; }
  void eval() { training_ = false; }
  bool training() const { return training_; }
  double p() const { return p_; }
  void set_p(double p) {
    KILN_CHECK(p >= 0.0 && p <= 1.0, ValueError, "Dropout: p must be in [0, 1], got ", p);
    p_ = p;
  }
  std::uint64_t seed() const { return seed_; }
  std::uint64_t offset() const { return offset_; }

 private:
  double p_;
  std::uint64_t seed_;
  std::uint64_t offset_ = 0;
  bool training_ = true;
};

}  // namespace kiln::nn
