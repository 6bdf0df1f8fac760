// kiln/core/temp_pool.hpp — a cache of temporary buffers for one executor.
//
// Fusion boundaries and the force_eager stance need scratch buffers every step; taking them
// from a cache keeps steady-state steps free of allocations (and of the page faults fresh host
// memory costs), so eager-vs-fused comparisons measure kernels, not the allocator.
#pragma once

#include <cstddef>
#include <map>
#include <utility>

#include "kiln/core/memory.hpp"

namespace kiln {

template <class Space>
class TempPool {
 public:
  // One scratch allocation; returns itself to the pool when destroyed.
  class Buffer {
   public:
    Buffer() = default;
    Buffer(TempPool* pool, void* p, std::size_t bytes) : pool_(pool), p_(p), bytes_(bytes) {}
    Buffer(Buffer&& o) noexcept
        : pool_(std::exchange(o.pool_, nullptr)), p_(std::exchange(o.p_, nullptr)), bytes_(o.bytes_) {}
    Buffer& operator=(Buffer&& o) noexcept {
      if (this != &o) {
        release();
        pool_ = std::exchange(o.pool_, nullptr);
        p_ = std::exchange(o.p_, nullptr);
        bytes_ = o.bytes_;
      }
      return *this;
    }
    ~Buffer() { release(); }
    void* get() const { return p_; }

   private:
    void release() {
      if (pool_) pool_->give_back(p_, bytes_);
      pool_ = nullptr;
    }
    TempPool* pool_ = nullptr;
    void* p_ = nullptr;
    std::size_t bytes_ = 0;
  };

  TempPool() = default;
  TempPool(const TempPool&) = delete;
  TempPool& operator=(const TempPool&) = delete;
  ~TempPool() { clear(); }

  Buffer take(std::size_t bytes) {
    bytes = round_up(bytes);
    auto it = free_.find(bytes);
    if (it != free_.end()) {
      void* p = it->second;
      free_.erase(it);
      return Buffer(this, p, bytes);
    }
    return Buffer(this, memory_traits<Space>::allocate(bytes), bytes);
  }
  // Frees every cached buffer (buffers still taken are unaffected).
  void clear() {
    for (auto& [bytes, p] : free_) memory_traits<Space>::deallocate(p, bytes);
    free_.clear();
  }
  std::size_t cached_buffers() const { return free_.size(); }

 private:
  static std::size_t round_up(std::size_t b) { return (b + 255) / 256 * 256; }
  void give_back(void* p, std::size_t bytes) {
    if (p) free_.emplace(bytes, p);
  }
  std::multimap<std::size_t, void*> free_;
};

}  // namespace kiln
