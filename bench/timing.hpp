// bench/timing.hpp — the benchmarks' shared timing: a median and a wall-clock interval.
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace kiln_bench {

// The median of v (the mean of the middle two for an even count); machines here are noisy.
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// Seconds f() takes on the host's steady clock.
template <class F>
double seconds(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace kiln_bench
