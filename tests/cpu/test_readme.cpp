// The README's snippets, compiled and checked so they never rot.
#include <doctest/doctest.h>

#include "kiln.hpp"

TEST_CASE("readme: fused expression") {
  // example-begin fused
  kiln::CpuExecutor exec;
  kiln::Tensor<float, kiln::host, kiln::dyn, 4> x(3, 4), y(3, 4);
  kiln::Tensor<float, kiln::host, 4> bias;
  kiln::assign(x, 1.5f, exec);
  kiln::assign(bias, 0.25f, exec);
  exec.stats().reset();
  // ((x·2 + bias) max 0)·3 − 1 : one kernel, bias broadcast over the rows.
  kiln::assign(y, kiln::maximum(x * 2.0f + bias, 0.0f) * 3.0f - 1.0f, exec);
  CHECK(exec.stats().launches() == 1);
  CHECK(y(2, 3) == doctest::Approx(8.75f));
  // The same expression, one kernel per node: the baseline fusion is measured against.
  kiln::assign<kiln::stance::force_eager>(y, kiln::maximum(x * 2.0f + bias, 0.0f) * 3.0f - 1.0f, exec);
  CHECK(exec.stats().launches() == 1 + 5);
  // example-end fused
}
