// kiln/backend/cuda/pinned.cuh — page-locked host memory that owns itself.
//
// Why pinned: cudaMemcpyAsync from pageable memory is staged through a driver buffer and is not
// asynchronous; from page-locked memory the copy engine reads it directly, so a data loader can
// overlap the next batch's upload with the current step.
//
// Pinned memory is a scarce system resource (it cannot be swapped): allocate staging buffers
// once and reuse them, not one per batch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <span>
#include <type_traits>
#include <utility>

#include "kiln/backend/cuda/check.cuh"
#include "kiln/config.hpp"
#include "kiln/core/error.hpp"

namespace kiln::cu {

// `size()` elements of T in page-locked host memory (cudaMallocHost / cudaFreeHost); move-only.
// The memory is uninitialised; T must be trivially copyable (it is moved with cudaMemcpy).
template <class T>
class PinnedBuffer {
  static_assert(std::is_trivially_copyable_v<T>,
                "PinnedBuffer<T> is filled by cudaMemcpy: T must be trivially copyable");

 public:
  PinnedBuffer() noexcept = default;

  // requires: count >= 0. Throws kiln::ValueError for a negative count, OutOfMemoryError when
  // the host cannot pin that much, CudaError for any other runtime failure (e.g. no device).
  explicit PinnedBuffer(index_t count) {
    KILN_CHECK(count >= 0, ValueError, "kiln::cu::PinnedBuffer: element count ", count,
               " is negative");
    if (count == 0) return;
    const auto n = static_cast<std::size_t>(count);
    if (n > static_cast<std::size_t>(-1) / sizeof(T))
      throw OutOfMemoryError(::kiln::detail::concat("kiln: pinned host allocation of ", count,
                                                    " elements of ", sizeof(T),
                                                    " bytes exceeds the address space"));
    void* ptr = nullptr;
    const cudaError_t status = cudaMallocHost(&ptr, n * sizeof(T));
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // handled here; must not resurface in a later check
      throw OutOfMemoryError(
          ::kiln::detail::concat("kiln: pinned host memory exhausted: requested ", n * sizeof(T),
                                 " bytes (cudaMallocHost)"));
    }
    if (status != cudaSuccess)
      detail::throw_cuda_error(status, "cudaMallocHost", __FILE__, __LINE__);
    data_ = static_cast<T*>(ptr);
    size_ = count;
  }

  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  PinnedBuffer(PinnedBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept {
    if (this != &other) {
      reset();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }

  ~PinnedBuffer() { reset(); }

  // Frees the memory now. cudaFreeHost waits for copies that still read it; a failure (the
  // runtime already shutting down at exit) is cleared, since nothing can be done about it here.
  void reset() noexcept {
    if (data_ != nullptr && cudaFreeHost(data_) != cudaSuccess) (void)cudaGetLastError();
    data_ = nullptr;
    size_ = 0;
  }

  T* data() noexcept { return data_; }
  const T* data() const noexcept { return data_; }
  index_t size() const noexcept { return size_; }
  std::size_t size_bytes() const noexcept { return static_cast<std::size_t>(size_) * sizeof(T); }
  bool empty() const noexcept { return size_ == 0; }

  T& operator[](index_t i) noexcept { return data_[i]; }
  const T& operator[](index_t i) const noexcept { return data_[i]; }
  T* begin() noexcept { return data_; }
  T* end() noexcept { return data_ + size_; }
  const T* begin() const noexcept { return data_; }
  const T* end() const noexcept { return data_ + size_; }
  std::span<T> span() noexcept { return {data_, static_cast<std::size_t>(size_)}; }
  std::span<const T> span() const noexcept { return {data_, static_cast<std::size_t>(size_)}; }

 private:
  T* data_ = nullptr;
  index_t size_ = 0;
};

}  // namespace kiln::cu
