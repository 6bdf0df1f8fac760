// kiln/core/memory.hpp — how each memory space allocates; host memory is 64-byte aligned so
// vector loads never straddle cache lines.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstring>
#include <new>

#include "kiln/core/error.hpp"
#include "kiln/core/space.hpp"

namespace kiln {

// memory_traits<Space>::allocate / deallocate. The cuda specialisation lives in
// kiln/backend/cuda/memory.cuh; naming a cuda tensor without it is a compile error that says so.
template <class Space>
struct memory_traits {
  static_assert(dependent_false<Space>,
                "kiln: allocating cuda tensors needs #include <kiln/cuda.cuh> in a file compiled "
                "by nvcc");
};

// What kiln's host tensors and scratch buffers hold now and the most they held: the counting
// side of the memory planner (kiln/train/memory_plan.hpp). Relaxed atomics, one add per
// allocation; reset_peak() starts a new high-water mark from what is in use.
struct HostMemoryStats {
  std::atomic<std::size_t> in_use{0}, peak{0};
  void reset_peak() { peak.store(in_use.load(std::memory_order_relaxed), std::memory_order_relaxed); }
};
inline HostMemoryStats& host_memory_stats() {
  static HostMemoryStats stats;
  return stats;
}

template <>
struct memory_traits<host> {
  static constexpr std::size_t alignment = 64;
  static void* allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    void* p = ::operator new(bytes, std::align_val_t(alignment));
    auto& s = host_memory_stats();
    const std::size_t now = s.in_use.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    std::size_t peak = s.peak.load(std::memory_order_relaxed);
    while (now > peak && !s.peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
    return p;
  }
  static void deallocate(void* p, std::size_t bytes) noexcept {
    if (p == nullptr) return;
    host_memory_stats().in_use.fetch_sub(bytes, std::memory_order_relaxed);
    ::operator delete(p, std::align_val_t(alignment));
  }
  // Copies bytes of this space into host memory (Var::item()).
  static void copy_to_host(void* dst, const void* src, std::size_t bytes) {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  // Copies host bytes into this space (a checkpoint's tensors into a model).
  static void copy_from_host(void* dst, const void* src, std::size_t bytes) {
    if (bytes) std::memcpy(dst, src, bytes);
  }
};

}  // namespace kiln
