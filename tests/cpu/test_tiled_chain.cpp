// Fused chains of two or more costly functors run tile by tile on the CPU (Evaluator::flat_tile,
// CpuExecutor::flat_tile elements at a time, then element by element for the tail). Checked
// against the functors applied element by element in double, at sizes around the tile, in
// place, with broadcast scalars, three-operand nodes, a bf16 destination, and 1 or 2 threads.
// The reference applies the same float functors one element at a time, so the two agree to the
// last bit but for FMA contraction, which the compiler may choose differently in either loop.
#include <kiln.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <vector>

namespace {

using kiln::host;
using kiln::index_t;
using Vec = kiln::Tensor<float, host, kiln::dyn>;

Vec ramp(index_t n, float lo, float hi) {
  Vec v(n);
  for (index_t i = 0; i < n; ++i) v.data()[i] = lo + (hi - lo) * float(i) / float(std::max<index_t>(n - 1, 1));
  return v;
}

// |got - want| <= 2 ULP of want.
void check_close(const float* got, const std::vector<float>& want) {
  for (std::size_t i = 0; i < want.size(); ++i) {
    const float tol = 2 * std::ldexp(1.f, std::ilogb(std::max(std::abs(want[i]), 1e-37f)) - 23);
    if (!(std::abs(got[i] - want[i]) <= tol)) {
      FAIL_CHECK("element " << i << ": got " << got[i] << ", want " << want[i]);
      return;
    }
  }
}

}  // namespace

TEST_CASE("tiled fused chains match element-by-element evaluation") {
  // A wrong tile offset or a tail left unwritten shows as a wrong element, not a rounding.
  static_assert(kiln::Evaluator<decltype(kiln::sigmoid(kiln::tanh(kiln::exp(std::declval<const Vec&>()))))>::costly_ops ==
                3);
  const kiln::fn::Sigmoid sig;
  const kiln::fn::Tanh th;
  const kiln::fn::Exp ex;
  const kiln::fn::Log1p l1p;
  for (int threads : {1, 2}) {
    kiln::CpuExecutor exec(threads);
    for (index_t n : {index_t(1), index_t(255), index_t(256), index_t(257), index_t(1000), index_t(70001)}) {
      CAPTURE(n);
      CAPTURE(threads);
      const Vec x = ramp(n, -6.f, 6.f), y = ramp(n, 3.f, -2.f);
      Vec out(n);

      kiln::assign(out, kiln::sigmoid(kiln::tanh(kiln::exp(x))), exec);
      std::vector<float> want(static_cast<std::size_t>(n));
      for (index_t i = 0; i < n; ++i) want[std::size_t(i)] = sig(th(ex(x.data()[i])));
      check_close(out.data(), want);

      // Binary and ternary nodes, broadcast scalars, a leaf used twice.
      kiln::assign(out, kiln::where(kiln::gt(x, 0.f), kiln::exp(x * 0.5f) * 2.f, kiln::tanh(y) - kiln::log1p(kiln::exp(x))),
                   exec);
      for (index_t i = 0; i < n; ++i) {
        const float a = x.data()[i], b = y.data()[i];
        want[std::size_t(i)] = a > 0 ? ex(a * 0.5f) * 2.f : th(b) - l1p(ex(a));
      }
      check_close(out.data(), want);

      // In place: the destination is also the leaf.
      Vec z = ramp(n, -3.f, 3.f);
      for (index_t i = 0; i < n; ++i) want[std::size_t(i)] = th(sig(z.data()[i])) + z.data()[i];
      kiln::assign(z, kiln::tanh(kiln::sigmoid(z)) + z, exec);
      check_close(z.data(), want);

      // A bf16 destination takes the copy-out path of the tile loop; it must equal the float
      // result rounded once.
      kiln::Tensor<kiln::bf16, host, kiln::dyn> h(n);
      kiln::assign(out, kiln::softplus(kiln::tanh(x)), exec);
      kiln::assign(h, kiln::softplus(kiln::tanh(x)), exec);
      for (index_t i = 0; i < n; ++i) REQUIRE(float(h.data()[i]) == float(kiln::bf16(out.data()[i])));
    }
  }
}
