// Helpers the CUDA suites share: moving test tensors between the host and an executor's space,
// comparing a device's results with a reference element by element, and a kernel that holds a
// stream back (so work queued behind it races ahead of it on another stream).
#pragma once

#include <kiln/cuda.cuh>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <type_traits>
#include <vector>

namespace kiln_cuda_test {

// Holds its stream for about `cycles` clock ticks: work queued behind it waits that long.
// (A template: one definition whichever suites include this.)
template <int = 0>
__global__ void spin(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

// The values of a host or device tensor, as doubles (waits for the device first).
template <class T, class S, kiln::index_t... D>
std::vector<double> fetch(const kiln::Tensor<T, S, D...>& t) {
  std::vector<double> out(std::size_t(t.size()));
  if constexpr (std::is_same_v<S, kiln::host>) {
    for (kiln::index_t i = 0; i < t.size(); ++i) out[std::size_t(i)] = kiln::convert<double>(t.data()[i]);
  } else {
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    const auto h = kiln::to_host(t);
    for (kiln::index_t i = 0; i < h.size(); ++i) out[std::size_t(i)] = kiln::convert<double>(h.data()[i]);
  }
  return out;
}

// A copy of a host tensor in space S (kiln::host or kiln::cuda).
template <class S, class T, kiln::index_t... D>
kiln::Tensor<T, S, D...> to_space(const kiln::Tensor<T, kiln::host, D...>& t) {
  if constexpr (std::is_same_v<S, kiln::host>) return kiln::clone(t);
  else return kiln::to_device(t);
}

// Every element within |got - ref| <= tol * (|ref| + floor), floor = a tenth of the largest finite
// |ref|: relative for each element, and an absolute floor only for those that cancelled to under a
// tenth of the largest, whose rounding is that of the larger values they were summed from. (The
// old bound, tol * (max |ref| + |ref|), let an element a thousandth of the largest be 20% wrong at
// tol = 2e-4; this one, 2%.) The tenth was measured on the CPU: float kernels against double
// references (softmax, layer_norm, the losses, the shapes of test_cuda_kernels.cu) use at most 0.3
// of this bound, two float GEMMs (kiln's and OpenBLAS's, test_cuda_nn.cu's MLP gradients) 0.015.
// NaN must meet NaN and an infinity itself. One CHECK per vector, naming the number of misses and
// the first.
inline void check_close(const std::vector<double>& got, const std::vector<double>& ref, double tol,
                        const std::string& what = "") {
  REQUIRE(got.size() == ref.size());
  double largest = 0;
  for (double v : ref)
    if (std::isfinite(v)) largest = std::max(largest, std::abs(v));
  const double floor = 0.1 * largest;
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const bool ok = std::isnan(ref[i])   ? std::isnan(got[i])
                    : std::isinf(ref[i]) ? got[i] == ref[i]
                                         : std::abs(got[i] - ref[i]) <= tol * (std::abs(ref[i]) + floor);
    if (!ok && bad++ == 0) first = i;
  }
  if (bad > 0) {
    INFO(what << ": " << bad << " of " << ref.size() << " elements differ; the first, element " << first << ": got "
              << got[first] << ", want " << ref[first] << " (tolerance " << tol << " of |want| + " << floor << ")");
    CHECK(bad == 0);
  }
}

}  // namespace kiln_cuda_test
