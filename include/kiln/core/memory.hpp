// kiln/core/memory.hpp — how each memory space allocates; host memory is 64-byte aligned so
// vector loads never straddle cache lines, and freed host blocks of 128 KiB and up are kept for
// the next allocation of their size (kiln/core/host_block_cache.hpp: what it saves and bounds).
#pragma once

#include <cstddef>
#include <cstring>
#include <new>

#include "kiln/core/error.hpp"
#include "kiln/core/host_block_cache.hpp"
#include "kiln/core/host_graph_pool.hpp"
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

template <>
struct memory_traits<host> {
  static constexpr std::size_t alignment = 64;
  static_assert(alignment == detail::HostBlockCache::alignment, "the block cache frees host blocks at this alignment");
  static void* allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    // While a step is captured on this thread its buffers stay put (kiln/core/host_graph_pool.hpp).
    if (detail::HostGraphPool* pool = detail::capturing_host_pool()) return detail::allocate_from_host_pool(*pool, bytes);
    if (bytes >= detail::HostBlockCache::min_bytes) return detail::HostBlockCache::get().take(bytes);
    return ::operator new(bytes, std::align_val_t(alignment));
  }
  // bytes: what allocate was given.
  static void deallocate(void* p, std::size_t bytes) noexcept {
    if (!p || detail::return_to_host_pool(p)) return;
    if (bytes >= detail::HostBlockCache::min_bytes) return detail::HostBlockCache::get().give(p, bytes);
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
  // Sets bytes to zero (a buffer whose every byte may be read before it is written).
  static void zero(void* dst, std::size_t bytes) {
    if (bytes) std::memset(dst, 0, bytes);
  }
};

}  // namespace kiln
