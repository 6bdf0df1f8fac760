// kiln/backend/cuda/memory.cuh — cuda tensors allocate from the caching device allocator, and
// tensors move between spaces with explicit copies.
#pragma once

#include <cuda_runtime.h>

#include <concepts>

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
  // Copies host bytes into device memory after all queued work (which may still read dst) has
  // finished; returns once the copy is done.
  static void copy_from_host(void* dst, const void* src, std::size_t bytes) {
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    if (bytes) KILN_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
  }
  // Sets device bytes to zero after all queued work has finished; returns once done. For buffers
  // read before anything writes them (compute-sanitizer's initcheck reports such reads).
  static void zero(void* dst, std::size_t bytes) {
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    if (bytes) KILN_CUDA_CHECK(cudaMemset(dst, 0, bytes));
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
  }
};

// Host ↔ device copies. Each takes the stream (or the executor) whose work it must be ordered
// with, copies on it with the async call, and waits for that stream before it returns, as its
// contract says: to_device's host tensor may be freed right after, and to_host's result is read
// by the host. Without a stream they are device-wide: they wait for every stream before the
// copy (a caching-allocator block may still be in use by work queued on another stream) and
// after it — meant for set-up and tests, not for a training loop.

template <class T, index_t... D>
Tensor<T, cuda, D...> to_device(const Tensor<T, host, D...>& t, cudaStream_t stream) {
  Tensor<T, cuda, D...> r(t.shape());
  if (t.size()) {
    KILN_CUDA_CHECK(cudaMemcpyAsync(r.data(), t.data(), t.bytes(), cudaMemcpyHostToDevice, stream));
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  return r;
}

template <class T, index_t... D>
Tensor<T, host, D...> to_host(const Tensor<T, cuda, D...>& t, cudaStream_t stream) {
  Tensor<T, host, D...> r(t.shape());
  if (t.size()) {
    KILN_CUDA_CHECK(cudaMemcpyAsync(r.data(), t.data(), t.bytes(), cudaMemcpyDeviceToHost, stream));
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  return r;
}

// On an executor's stream (anything with a stream() member: kiln::CudaExecutor).
template <class Exec, class T, index_t... D>
  requires requires(const Exec& e) { { e.stream() } -> std::convertible_to<cudaStream_t>; }
Tensor<T, cuda, D...> to_device(const Tensor<T, host, D...>& t, const Exec& exec) {
  return to_device(t, exec.stream());
}
template <class Exec, class T, index_t... D>
  requires requires(const Exec& e) { { e.stream() } -> std::convertible_to<cudaStream_t>; }
Tensor<T, host, D...> to_host(const Tensor<T, cuda, D...>& t, const Exec& exec) {
  return to_host(t, exec.stream());
}

// Device-wide (no stream named).
template <class T, index_t... D>
Tensor<T, cuda, D...> to_device(const Tensor<T, host, D...>& t) {
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  Tensor<T, cuda, D...> r = to_device(t, cudaStream_t{});
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  return r;
}

template <class T, index_t... D>
Tensor<T, host, D...> to_host(const Tensor<T, cuda, D...>& t) {
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  return to_host(t, cudaStream_t{});
}

}  // namespace kiln
