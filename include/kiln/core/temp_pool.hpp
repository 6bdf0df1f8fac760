// kiln/core/temp_pool.hpp — a cache of temporary buffers for one executor.
//
// Fusion boundaries and the force_eager stance need scratch buffers every step; taking them
// from a cache keeps steady-state steps free of allocations (and of the page faults fresh host
// memory costs), so eager-vs-fused comparisons measure kernels, not the allocator. The cache is a
// flat list, so taking and returning a buffer allocate nothing once it has grown.
//
// While a step is captured (mode::reduce_overhead, kiln/core/host_graph_pool.hpp) host buffers
// bypass the cache: they come from the graph's pool, which keeps each at its address for replay,
// and go back there.
#pragma once

#include <cstddef>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/core/memory.hpp"

namespace kiln {

template <class Space>
class TempPool {
 public:
  // One scratch allocation; returns itself to the pool when destroyed.
  class Buffer {
   public:
    Buffer() = default;
    Buffer(TempPool* pool, void* p, std::size_t bytes, bool direct = false)
        : pool_(pool), p_(p), bytes_(bytes), direct_(direct) {}
    Buffer(Buffer&& o) noexcept
        : pool_(std::exchange(o.pool_, nullptr)), p_(std::exchange(o.p_, nullptr)), bytes_(o.bytes_),
          direct_(o.direct_) {}
    Buffer& operator=(Buffer&& o) noexcept {
      if (this != &o) {
        release();
        pool_ = std::exchange(o.pool_, nullptr);
        p_ = std::exchange(o.p_, nullptr);
        bytes_ = o.bytes_;
        direct_ = o.direct_;
      }
      return *this;
    }
    ~Buffer() { release(); }
    void* get() const { return p_; }

   private:
    void release() {
      if (pool_ && direct_) memory_traits<Space>::deallocate(p_, bytes_);
      else if (pool_) pool_->give_back(p_, bytes_);
      pool_ = nullptr;
    }
    TempPool* pool_ = nullptr;
    void* p_ = nullptr;
    std::size_t bytes_ = 0;
    bool direct_ = false;  // taken while a step was captured: from and back to the graph's pool
  };

  TempPool() = default;
  TempPool(const TempPool&) = delete;
  TempPool& operator=(const TempPool&) = delete;
  ~TempPool() { clear(); }

  // A buffer of at least `bytes`. zero_fresh: a buffer the pool allocates now (not one it hands
  // out again) is zeroed first, once — for contents a consumer may read in places the producer
  // never writes (cuBLASLt's ReLU bit-mask rows past n). Not while a step is captured (the
  // graph's pool hands those out; zeroing then would be a device-wide wait inside the capture).
  Buffer take(std::size_t bytes, bool zero_fresh = false) {
    bytes = round_up(bytes);
    if (direct_) return Buffer(this, memory_traits<Space>::allocate(bytes), bytes, true);
    if constexpr (std::is_same_v<Space, host>)
      if (detail::capturing_host_pool()) return Buffer(this, memory_traits<Space>::allocate(bytes), bytes, true);
    for (std::size_t i = 0; i < free_.size(); ++i) {
      if (free_[i].first != bytes) continue;
      void* p = free_[i].second;
      free_[i] = free_.back();
      free_.pop_back();
      return Buffer(this, p, bytes);
    }
    Buffer fresh(this, memory_traits<Space>::allocate(bytes), bytes);
    if (zero_fresh) memory_traits<Space>::zero(fresh.get(), bytes);
    return fresh;
  }
  // Frees every cached buffer (buffers still taken are unaffected).
  void clear() {
    for (auto& [bytes, p] : free_) memory_traits<Space>::deallocate(p, bytes);
    free_.clear();
  }
  std::size_t cached_buffers() const { return free_.size(); }
  // While on, buffers bypass the cache (a CUDA executor capturing a graph: they come from the
  // graph's private pool and go back there).
  void set_direct(bool on) { direct_ = on; }

 private:
  static std::size_t round_up(std::size_t b) { return (b + 255) / 256 * 256; }
  void give_back(void* p, std::size_t bytes) {
    if (p) free_.emplace_back(bytes, p);
  }
  std::vector<std::pair<std::size_t, void*>> free_;
  bool direct_ = false;
};

}  // namespace kiln
