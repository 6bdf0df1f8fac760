// kiln/backend/cuda/memory.cuh — cuda tensors allocate from the caching device allocator, and
// tensors move between spaces with explicit copies.
#pragma once

#include <cuda_runtime.h>

#include "kiln/backend/cuda/allocator.cuh"
#include "kiln/backend/cuda/check.cuh"
#include "kiln/core/memory.hpp"
#include "kiln/core/tensor.hpp"

namespace kiln {

template <>
struct memory_traits<cuda> {
  static void* allocate(std::size_t bytes) { return bytes ? cu::default_allocator().allocate(bytes) : nullptr; }
  static void deallocate(void* p, std::size_t) noexcept {
    if (p) {
      try {
        cu::default_allocator().deallocate(p);
      } catch (...) {
      }
    }
  }
  // Copies device bytes into host memory after ALL work on the device has finished (Var::item()
  // synchronises: the value may come from any stream, and cudaMemcpy alone does not wait for a
  // non-blocking one).
  static void copy_to_host(void* dst, const void* src, std::size_t bytes) {
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    if (bytes) KILN_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
  }
};

// Host → device copy (blocking: the host tensor may be freed right after).
template <class T, index_t... D>
Tensor<T, cuda, D...> to_device(const Tensor<T, host, D...>& t) {
  Tensor<T, cuda, D...> r(t.shape());
  if (t.size()) KILN_CUDA_CHECK(cudaMemcpy(r.data(), t.data(), t.bytes(), cudaMemcpyHostToDevice));
  return r;
}

// Device → host copy (blocking: waits for the work that produced the tensor).
template <class T, index_t... D>
Tensor<T, host, D...> to_host(const Tensor<T, cuda, D...>& t) {
  Tensor<T, host, D...> r(t.shape());
  if (t.size()) KILN_CUDA_CHECK(cudaMemcpy(r.data(), t.data(), t.bytes(), cudaMemcpyDeviceToHost));
  return r;
}

}  // namespace kiln
