// kiln/nn/half_io.hpp — the CPU convnet layers under mixed precision: bf16 / f16 activations in
// and out, float arithmetic inside.
//
// Under bf16_mixed / fp16_mixed a layer's input, output and saved activations are 2-byte values
// (what a step keeps between forward and backward halves), while the CPU kernels of convolution,
// batch norm and pooling compute in float: a layer widens what it reads into a float buffer that
// lives for one call, runs the float kernel, and rounds what it writes (round to nearest even,
// once). A convolution reads the bf16 / f16 copy of its weight, so its products are exactly the
// half-precision products a tensor-core convolution forms, summed in float; batch-norm statistics
// stay float. The buffers are transient: nothing a step keeps is float.
#pragma once

#include <algorithm>
#include <cstddef>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/core/bf16_bulk.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/core/memory.hpp"

namespace kiln::nn::detail {

// The allocator of a layer's transient float buffers: host blocks (kiln/core/memory.hpp, so the
// block cache hands a step the same blocks again instead of fresh pages from the system), and
// elements default-initialised — not zeroed — since every buffer is written before it is read.
// A bf16 ResNet-50 step spent a quarter of its time zeroing and faulting in such buffers.
template <class T>
struct scratch_allocator {
  using value_type = T;
  scratch_allocator() = default;
  template <class U>
  scratch_allocator(const scratch_allocator<U>&) noexcept {}
  T* allocate(std::size_t n) { return static_cast<T*>(memory_traits<host>::allocate(n * sizeof(T))); }
  void deallocate(T* p, std::size_t n) noexcept { memory_traits<host>::deallocate(p, n * sizeof(T)); }
  template <class U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... A>
  void construct(U* p, A&&... a) {
    ::new (static_cast<void*>(p)) U(std::forward<A>(a)...);
  }
  template <class U>
  bool operator==(const scratch_allocator<U>&) const noexcept {
    return true;
  }
};
template <class T>
using scratch_vector = std::vector<T, scratch_allocator<T>>;

// f(i) for i in [0, n), on `threads` OpenMP threads for a large n (each i independent, so the
// result is the same at any thread count).
template <class F>
void half_io_loop(index_t n, int threads, const F& f) {
#if defined(_OPENMP)
  if (threads > 1 && n >= (index_t{1} << 15)) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (index_t i = 0; i < n; ++i) f(i);
    return;
  }
#endif
  (void)threads;
  for (index_t i = 0; i < n; ++i) f(i);
}

// f(begin, end) over blocks of [0, n), on `threads` OpenMP threads for a large n.
template <class F>
void half_io_blocks(index_t n, int threads, const F& f) {
  constexpr index_t block = 4096;
  const index_t blocks = (n + block - 1) / block;
#if defined(_OPENMP)
  if (threads > 1 && n >= (index_t{1} << 15)) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (index_t b = 0; b < blocks; ++b) f(b * block, std::min(n, (b + 1) * block));
    return;
  }
#endif
  (void)threads;
  for (index_t b = 0; b < blocks; ++b) f(b * block, std::min(n, (b + 1) * block));
}

// n values of x as floats.
template <class X>
scratch_vector<float> widened(const X* x, index_t n, int threads = 1) {
  scratch_vector<float> out(static_cast<std::size_t>(n));
  float* o = out.data();
  if constexpr (std::is_same_v<X, bf16>) {
    half_io_blocks(n, threads, [=](index_t b, index_t e) { widen_bf16(x + b, o + b, e - b); });
  } else {
    half_io_loop(n, threads, [=](index_t i) { o[i] = static_cast<float>(x[i]); });
  }
  return out;
}

// dst = round(src), or with add dst = round(float(dst) + src): n values.
template <class X>
void store_rounded(X* dst, const float* src, index_t n, bool add = false, int threads = 1) {
  if constexpr (std::is_same_v<X, bf16>) {
    if (!add) {
      half_io_blocks(n, threads, [=](index_t b, index_t e) { round_to_bf16(src + b, dst + b, e - b); });
    } else {
      half_io_blocks(n, threads, [=](index_t b, index_t e) { add_round_to_bf16(src + b, dst + b, e - b); });
    }
    return;
  }
  if (add) half_io_loop(n, threads, [=](index_t i) { dst[i] = X(static_cast<float>(dst[i]) + src[i]); });
  else half_io_loop(n, threads, [=](index_t i) { dst[i] = X(src[i]); });
}

// The input gradient a float kernel computes (`compute(float* dx)`, overwriting) into xd's
// half-precision gradient: written, or added when one is valid.
template <class Node, class F>
void put_rounded_input_grad(Node& xd, const F& compute, int threads = 1) {
  const index_t n = xd.value.size();
  scratch_vector<float> dx(static_cast<std::size_t>(n));
  compute(dx.data());
  store_rounded(xd.ensure_grad(), dx.data(), n, xd.grad_valid, threads);
  xd.grad_valid = true;
}

}  // namespace kiln::nn::detail
