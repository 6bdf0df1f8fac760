// kiln/core/host_graph_pool.hpp — the host memory a captured training step owns
// (mode::reduce_overhead on the CPU; see kiln/backend/cpu/step_graph.hpp).
//
// A captured step is replayed by running its launches again on the same addresses, as a CUDA
// graph is. So every buffer those launches touch must stay where it was: while a step is being
// captured on a thread, host allocations (memory_traits<host>, hence every Tensor and every
// scratch buffer) come from the capturing graph's pool. The pool reuses a block freed during the
// capture for a later request of the same size, exactly as eager execution would, and never
// gives its blocks back to the heap while the graph lives, nor hands them out again after the
// capture: a block freed later (the loss the caller dropped, a gradient buffer a model released)
// returns to the pool, and the graph's launches can keep writing it at replay.
//
// The pool outlives its graph until its last block comes back: a block may escape the capture
// (a parameter's gradient buffer first made inside it) and be freed long after the graph died.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <vector>

namespace kiln::detail {

class HostGraphPool;

// Every pool with blocks still alive, and one lock for pool state (deallocation may happen on any
// thread; captures are rare, so one lock costs nothing measurable).
struct HostGraphPools {
  std::mutex lock;
  std::vector<std::unique_ptr<HostGraphPool>> live;
  std::atomic<std::size_t> count{0};
  // Addresses every pool block ever made lies in, [lowest, highest_end) — only widened. A free
  // outside it (most frees: the heap is wide) skips the lock.
  std::atomic<std::uintptr_t> lowest{UINTPTR_MAX}, highest_end{0};
  // Never destroyed: a block may come back from a static object's destructor at exit, after
  // function-local statics are gone (reachable to the end, so not a leak to LeakSanitizer).
  static HostGraphPools& get() {
    static HostGraphPools* const pools = new HostGraphPools();
    return *pools;
  }
};

class HostGraphPool {
 public:
  static constexpr std::size_t alignment = 64;

  HostGraphPool() = default;
  HostGraphPool(const HostGraphPool&) = delete;
  HostGraphPool& operator=(const HostGraphPool&) = delete;
  ~HostGraphPool() {
    for (const Block& b : blocks_) ::operator delete(b.p, std::align_val_t(alignment));
  }

  // A block of at least `bytes` (called while capturing; under HostGraphPools::lock).
  void* allocate(std::size_t bytes) {
    for (Block& b : blocks_)
      if (!b.in_use && b.bytes == bytes) {
        b.in_use = true;
        ++in_use_;
        return b.p;
      }
    void* p = ::operator new(bytes, std::align_val_t(alignment));
    const auto at = std::lower_bound(blocks_.begin(), blocks_.end(), p, [](const Block& b, const void* q) {
      return std::less<const void*>()(b.p, q);
    });
    blocks_.insert(at, Block{p, bytes, true});
    HostGraphPools& pools = HostGraphPools::get();
    const auto begin = reinterpret_cast<std::uintptr_t>(p), end = begin + bytes;
    if (begin < pools.lowest.load(std::memory_order_relaxed)) pools.lowest.store(begin, std::memory_order_release);
    if (end > pools.highest_end.load(std::memory_order_relaxed)) pools.highest_end.store(end, std::memory_order_release);
    ++in_use_;
    bytes_ += bytes;
    return p;
  }
  // Takes p back when it is one of this pool's blocks (under HostGraphPools::lock).
  bool release(void* p) {
    const auto at = std::lower_bound(blocks_.begin(), blocks_.end(), p, [](const Block& b, const void* q) {
      return std::less<const void*>()(b.p, q);
    });
    if (at == blocks_.end() || at->p != p) return false;
    if (at->in_use) {
      at->in_use = false;
      --in_use_;
    }
    return true;
  }
  bool idle() const { return in_use_ == 0; }
  bool orphaned() const { return orphaned_; }
  void orphan() { orphaned_ = true; }
  std::size_t blocks() const { return blocks_.size(); }
  std::size_t bytes() const { return bytes_; }

 private:
  struct Block {
    void* p;
    std::size_t bytes;
    bool in_use;
  };
  std::vector<Block> blocks_;  // sorted by address
  std::size_t in_use_ = 0, bytes_ = 0;
  bool orphaned_ = false;
};

// The pool host allocations of this thread come from (null: the heap).
inline HostGraphPool*& capturing_host_pool() {
  thread_local HostGraphPool* pool = nullptr;
  return pool;
}

inline void* allocate_from_host_pool(HostGraphPool& pool, std::size_t bytes) {
  std::lock_guard guard(HostGraphPools::get().lock);
  return pool.allocate(bytes);
}

// True when p belonged to a graph's pool (and is back in it); frees a pool whose graph is gone
// once its last block is back.
inline bool return_to_host_pool(void* p) {
  HostGraphPools& pools = HostGraphPools::get();
  if (pools.count.load(std::memory_order_acquire) == 0) return false;
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  if (at < pools.lowest.load(std::memory_order_acquire) || at >= pools.highest_end.load(std::memory_order_acquire))
    return false;
  std::lock_guard guard(pools.lock);
  for (auto it = pools.live.begin(); it != pools.live.end(); ++it) {
    if (!(*it)->release(p)) continue;
    if ((*it)->orphaned() && (*it)->idle()) {
      pools.live.erase(it);
      pools.count.fetch_sub(1, std::memory_order_release);
    }
    return true;
  }
  return false;
}

// A graph's hold on its pool: made with the graph, let go when the graph dies (the pool itself
// goes when its blocks are all back, see return_to_host_pool).
class HostPoolHandle {
 public:
  HostPoolHandle() {
    HostGraphPools& pools = HostGraphPools::get();
    std::lock_guard guard(pools.lock);
    pools.live.push_back(std::make_unique<HostGraphPool>());
    pool_ = pools.live.back().get();
    pools.count.fetch_add(1, std::memory_order_release);
  }
  HostPoolHandle(const HostPoolHandle&) = delete;
  HostPoolHandle& operator=(const HostPoolHandle&) = delete;
  ~HostPoolHandle() {
    HostGraphPools& pools = HostGraphPools::get();
    std::lock_guard guard(pools.lock);
    pool_->orphan();
    if (!pool_->idle()) return;
    for (auto it = pools.live.begin(); it != pools.live.end(); ++it)
      if (it->get() == pool_) {
        pools.live.erase(it);
        pools.count.fetch_sub(1, std::memory_order_release);
        break;
      }
  }
  HostGraphPool& pool() const { return *pool_; }

 private:
  HostGraphPool* pool_;
};

}  // namespace kiln::detail
