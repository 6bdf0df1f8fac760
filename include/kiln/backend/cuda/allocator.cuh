// kiln/backend/cuda/allocator.cuh — a caching device allocator and the buffer that owns one
// allocation from it.
//
// Why cache: cudaMalloc and cudaFree synchronise the device and cost tens of microseconds to
// milliseconds; a training step frees and re-requests the same sizes every iteration. Blocks are
// kept after release and handed out again by best fit, so a steady-state step calls cudaMalloc
// zero times.
//
// Contract (the same as PyTorch's allocator with one stream):
//   - Blocks are NOT stream-aware. A block released while kernels that use it are still queued
//     may be handed out again at once; that is safe when all work runs on one stream (or the
//     legacy default stream), because the next user's work queues behind it. Code that uses a
//     buffer on several streams must synchronise before releasing it.
//   - One allocator serves one device: the device current at cudaMalloc time. Do not change the
//     current device under a live allocator.
//   - Blocks are never split: a request takes a whole cached block (at most twice its rounded
//     size, so a 1 GiB block is not spent on a 2 MiB request) or a fresh cudaMalloc.
//   - Thread-safe: one mutex guards the pools and the statistics.
//   - CUDA-graph capture (mode::reduce_overhead, kiln/backend/cuda/step_graph.cuh): while a thread
//     captures, its requests come from a private pool the graph owns (begin_private); a block
//     freed during the capture serves a later request of it, as eager execution would reuse it,
//     and no block of the pool goes to anyone else while the graph lives, since its replays
//     write them. The pool is freed when its graph has gone and its last block is back.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include "kiln/backend/cuda/check.cuh"
#include "kiln/config.hpp"
#include "kiln/core/error.hpp"

namespace kiln::cu {

// A snapshot of the allocator's counters; all sizes are rounded block sizes in bytes.
struct AllocatorStats {
  std::size_t in_use_bytes = 0;  // handed out and not yet released
  std::size_t peak_bytes = 0;    // high-water mark of in_use_bytes (since start or reset_peak())
  std::size_t cached_bytes = 0;  // released blocks held for reuse
  std::size_t allocations = 0;   // allocate() calls that returned memory
  std::size_t cache_hits = 0;    // of those, served from the cache without cudaMalloc
};

class CachingAllocator {
 public:
  // Requests up to small_limit bytes round up to small_granularity and live in their own pool, so
  // small tensors (biases, scalars) never pin down large blocks; larger requests round up to
  // large_granularity (2 MiB: the driver's own large-page size, so nothing is lost to rounding).
  static constexpr std::size_t small_limit = std::size_t{1} << 20;
  static constexpr std::size_t small_granularity = 512;
  static constexpr std::size_t large_granularity = std::size_t{2} << 20;

  CachingAllocator() = default;
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Frees the cached blocks. Blocks still handed out are left alone (a buffer that outlives its
  // allocator keeps valid memory until the process ends).
  ~CachingAllocator() {
    std::lock_guard<std::mutex> lock(mutex_);
    release_cache_locked();
  }

  // The size a request of `bytes` occupies. requires: bytes <= max_request().
  static constexpr std::size_t round_size(std::size_t bytes) noexcept {
    const std::size_t g = bytes <= small_limit ? small_granularity : large_granularity;
    return (bytes + g - 1) / g * g;
  }
  static constexpr std::size_t max_request() noexcept {
    return std::numeric_limits<std::size_t>::max() - large_granularity;
  }

  // Returns device memory of at least `bytes` bytes, aligned to 256 bytes (cudaMalloc's
  // alignment: blocks are never split). bytes == 0 returns nullptr.
  // On cudaMalloc failure: frees the whole cache and retries once; if that fails too, throws
  // kiln::OutOfMemoryError stating requested, in-use and cached bytes. The allocator (and the
  // CUDA runtime's error state) stays usable afterwards.
  void* allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    if (bytes > max_request()) throw_oom(bytes, bytes, 0);
    const std::size_t size = round_size(bytes);

    std::lock_guard<std::mutex> lock(mutex_);
    if (capturing_ != 0 && std::this_thread::get_id() == capture_thread_) return allocate_private_locked(bytes, size);
    Pool& pool = pool_for(size);
    auto it = pool.lower_bound(size);  // best fit: the smallest cached block that is big enough
    if (it != pool.end() && it->first / 2 <= size) {
      const std::size_t block = it->first;
      void* ptr = it->second;
      pool.erase(it);
      stats_.cached_bytes -= block;
      ++stats_.cache_hits;
      hand_out_locked(ptr, block);
      return ptr;
    }

    void* ptr = nullptr;
    cudaError_t status = cudaMalloc(&ptr, size);
    if (status == cudaErrorMemoryAllocation) {
      // A failed cudaMalloc is not sticky, but it is recorded as the last error: clear it, so
      // the next KILN_CUDA_CHECK(cudaGetLastError()) does not report our handled failure.
      (void)cudaGetLastError();
      const std::size_t released = stats_.cached_bytes;
      release_cache_locked();
      status = cudaMalloc(&ptr, size);
      if (status == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        throw_oom(bytes, size, released);
      }
    }
    if (status != cudaSuccess) detail::throw_cuda_error(status, "cudaMalloc", __FILE__, __LINE__);
    hand_out_locked(ptr, size);
    return ptr;
  }

  // Returns a block from allocate() to the cache. nullptr is ignored.
  // throws: kiln::ValueError for a pointer this allocator did not hand out (a double release or
  // a foreign pointer) — continuing would corrupt the pools.
  void deallocate(void* ptr) {
    if (ptr == nullptr) return;
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(ptr);
    KILN_CHECK(it != live_.end(), ValueError, "kiln::cu::CachingAllocator::deallocate: pointer ",
               ptr, " was not handed out by this allocator (released twice?)");
    const auto [block, owner] = it->second;
    live_.erase(it);
    stats_.in_use_bytes -= block;
    if (owner != 0) {
      Private& pool = privates_.at(owner);
      (block <= small_limit ? pool.small : pool.large).emplace(block, ptr);
      --pool.in_use;
      if (pool.released && pool.in_use == 0) free_private_locked(owner);
      return;
    }
    pool_for(block).emplace(block, ptr);
    stats_.cached_bytes += block;
  }

  // ---- Private pools for CUDA-graph capture (see the header comment) -------------------------
  using PoolId = std::uint64_t;
  // A new pool for one graph.
  PoolId create_private_pool() {
    std::lock_guard<std::mutex> lock(mutex_);
    const PoolId id = ++last_pool_id_;
    privates_[id];
    return id;
  }
  // From now until end_private(), this thread's requests come from pool `id`.
  // throws: ValueError when another capture is under way.
  void begin_private(PoolId id) {
    std::lock_guard<std::mutex> lock(mutex_);
    KILN_CHECK(capturing_ == 0, ValueError, "kiln::cu::CachingAllocator: a graph capture is already under way");
    KILN_CHECK(privates_.count(id) == 1, ValueError, "kiln::cu::CachingAllocator: no private pool ", id);
    capturing_ = id;
    capture_thread_ = std::this_thread::get_id();
  }
  void end_private() {
    std::lock_guard<std::mutex> lock(mutex_);
    capturing_ = 0;
  }
  // The graph of pool `id` is gone: its blocks are freed once none is handed out.
  void release_private_pool(PoolId id) noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = privates_.find(id);
    if (it == privates_.end()) return;
    it->second.released = true;
    if (it->second.in_use == 0) free_private_locked(id);
  }
  // Bytes a private pool holds (handed out or cached in it).
  std::size_t private_bytes(PoolId id) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = privates_.find(id);
    return it == privates_.end() ? 0 : it->second.bytes;
  }

  AllocatorStats stats() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

  // Gives every cached block back to the driver (cudaFree synchronises the device).
  void empty_cache() {
    std::lock_guard<std::mutex> lock(mutex_);
    release_cache_locked();
  }

  // Restarts the high-water mark from what is in use now.
  void reset_peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.peak_bytes = stats_.in_use_bytes;
  }

 private:
  using Pool = std::multimap<std::size_t, void*>;  // block size -> block, ordered for best fit

  Pool& pool_for(std::size_t size) noexcept { return size <= small_limit ? small_ : large_; }

  void hand_out_locked(void* ptr, std::size_t block, std::uint64_t owner = 0) {
    live_.emplace(ptr, Live{block, owner});
    stats_.in_use_bytes += block;
    if (stats_.in_use_bytes > stats_.peak_bytes) stats_.peak_bytes = stats_.in_use_bytes;
    ++stats_.allocations;
  }

  void release_cache_locked() noexcept {
    for (Pool* pool : {&small_, &large_}) {
      for (auto& [size, ptr] : *pool) {
        // Failure here (e.g. the runtime is already shutting down at exit) leaves nothing to
        // recover; clear the error so it does not surface in an unrelated check.
        if (cudaFree(ptr) != cudaSuccess) (void)cudaGetLastError();
      }
      pool->clear();
    }
    stats_.cached_bytes = 0;
  }

  // Private pools: what a graph's capture holds.
  struct Private {
    Pool small, large;  // its cached blocks
    std::size_t in_use = 0, bytes = 0;
    bool released = false;  // its graph is gone
  };

  void* allocate_private_locked(std::size_t bytes, std::size_t size) {
    Private& pool = privates_.at(capturing_);
    Pool& cached = size <= small_limit ? pool.small : pool.large;
    auto it = cached.lower_bound(size);
    if (it != cached.end() && it->first / 2 <= size) {
      const std::size_t block = it->first;
      void* ptr = it->second;
      cached.erase(it);
      ++pool.in_use;
      ++stats_.cache_hits;
      hand_out_locked(ptr, block, capturing_);
      return ptr;
    }
    // cudaMalloc is legal during a relaxed-mode capture; the shared cache cannot be released
    // here (cudaFree is not), so a failure is out of memory at once.
    void* ptr = nullptr;
    const cudaError_t status = cudaMalloc(&ptr, size);
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      throw_oom(bytes, size, 0);
    }
    if (status != cudaSuccess) detail::throw_cuda_error(status, "cudaMalloc", __FILE__, __LINE__);
    ++pool.in_use;
    pool.bytes += size;
    hand_out_locked(ptr, size, capturing_);
    return ptr;
  }
  void free_private_locked(std::uint64_t id) noexcept {
    auto it = privates_.find(id);
    for (Pool* cached : {&it->second.small, &it->second.large})
      for (auto& [size, ptr] : *cached)
        if (cudaFree(ptr) != cudaSuccess) (void)cudaGetLastError();
    privates_.erase(it);
  }

  [[noreturn]] void throw_oom(std::size_t requested, std::size_t rounded,
                              std::size_t released) const {
    throw OutOfMemoryError(::kiln::detail::concat(
        "kiln: CUDA out of memory: requested ", requested, " bytes (", rounded,
        " after rounding); in use ", stats_.in_use_bytes, " bytes, cached ", stats_.cached_bytes,
        " bytes (", released,
        " cached bytes were released before the retry). Reduce the batch size, or free "
        "buffers that are no longer needed."));
  }

  mutable std::mutex mutex_;
  Pool small_;
  Pool large_;
  struct Live {
    std::size_t size;
    std::uint64_t owner;  // 0: the shared pools; otherwise a graph's private pool
  };
  std::unordered_map<void*, Live> live_;  // handed-out block -> its size and pool
  AllocatorStats stats_;
  std::unordered_map<std::uint64_t, Private> privates_;
  std::uint64_t last_pool_id_ = 0, capturing_ = 0;
  std::thread::id capture_thread_;
};

// The process-wide allocator used by default by DeviceBuffer and the cuBLASLt workspace.
// It is deliberately never destroyed: static destructors run after (or during) the CUDA
// runtime's own teardown, where cudaFree fails; the driver reclaims the memory at exit anyway.
inline CachingAllocator& default_allocator() {
  static CachingAllocator* const allocator = new CachingAllocator();
  return *allocator;
}

// Owns `size()` elements of T in device memory from a CachingAllocator; move-only. The memory is
// uninitialised. T must be trivially copyable (it is moved with cudaMemcpy, never constructed).
template <class T>
class DeviceBuffer {
  static_assert(std::is_trivially_copyable_v<T>,
                "DeviceBuffer<T> holds raw device memory copied with cudaMemcpy: T must be "
                "trivially copyable");

 public:
  DeviceBuffer() noexcept = default;

  // requires: count >= 0. Throws kiln::ValueError for a negative count, OutOfMemoryError when the
  // allocator cannot find the memory.
  explicit DeviceBuffer(index_t count, CachingAllocator& allocator = default_allocator())
      : allocator_(&allocator) {
    KILN_CHECK(count >= 0, ValueError, "kiln::cu::DeviceBuffer: element count ", count,
               " is negative");
    const auto n = static_cast<std::size_t>(count);
    if (n > CachingAllocator::max_request() / sizeof(T))
      throw OutOfMemoryError(::kiln::detail::concat("kiln: CUDA out of memory: requested ", count,
                                                    " elements of ", sizeof(T),
                                                    " bytes, more than the address space"));
    d_data_ = static_cast<T*>(allocator.allocate(n * sizeof(T)));
    size_ = count;
  }

  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  DeviceBuffer(DeviceBuffer&& other) noexcept
      : d_data_(std::exchange(other.d_data_, nullptr)),
        size_(std::exchange(other.size_, 0)),
        allocator_(std::exchange(other.allocator_, nullptr)) {}

  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      reset();
      d_data_ = std::exchange(other.d_data_, nullptr);
      size_ = std::exchange(other.size_, 0);
      allocator_ = std::exchange(other.allocator_, nullptr);
    }
    return *this;
  }

  ~DeviceBuffer() { reset(); }

  // Returns the memory to the allocator now; the buffer becomes empty.
  void reset() noexcept {
    if (d_data_ != nullptr) allocator_->deallocate(d_data_);  // cannot fail for our own block
    d_data_ = nullptr;
    size_ = 0;
  }

  T* data() noexcept { return d_data_; }
  const T* data() const noexcept { return d_data_; }
  index_t size() const noexcept { return size_; }
  std::size_t size_bytes() const noexcept { return static_cast<std::size_t>(size_) * sizeof(T); }
  bool empty() const noexcept { return size_ == 0; }
  CachingAllocator* allocator() const noexcept { return allocator_; }

 private:
  T* d_data_ = nullptr;
  index_t size_ = 0;
  CachingAllocator* allocator_ = nullptr;
};

}  // namespace kiln::cu
