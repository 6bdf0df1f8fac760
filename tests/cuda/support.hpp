// Helpers the CUDA suites share: moving test tensors between the host and an executor's space.
#pragma once

#include <kiln/cuda.cuh>

#include <cstddef>
#include <type_traits>
#include <vector>

namespace kiln_cuda_test {

// The values of a host or device tensor, as doubles (waits for the device first).
template <class T, class S, kiln::index_t... D>
std::vector<double> fetch(const kiln::Tensor<T, S, D...>& t) {
  std::vector<double> out(std::size_t(t.size()));
  if constexpr (std::is_same_v<S, kiln::host>) {
    for (kiln::index_t i = 0; i < t.size(); ++i) out[std::size_t(i)] = double(t.data()[i]);
  } else {
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    const auto h = kiln::to_host(t);
    for (kiln::index_t i = 0; i < h.size(); ++i) out[std::size_t(i)] = double(h.data()[i]);
  }
  return out;
}

// A copy of a host tensor in space S (kiln::host or kiln::cuda).
template <class S, class T, kiln::index_t... D>
kiln::Tensor<T, S, D...> to_space(const kiln::Tensor<T, kiln::host, D...>& t) {
  if constexpr (std::is_same_v<S, kiln::host>) return kiln::clone(t);
  else return kiln::to_device(t);
}

}  // namespace kiln_cuda_test
