// kiln/core/host_block_cache.hpp — host blocks kept for reuse instead of going back to the system.
//
// A training step allocates the same large buffers every step (activations, their gradients, a
// convolution's columns) and frees them by the end of it. glibc hands blocks of 128 KiB and up
// back to the kernel when they are freed (munmap, or trimming the heap's top), so the next step
// gets fresh pages: one page fault and one zeroed 4 KiB page at a time — 178,000 faults, 730 MB
// zeroed, per ResNet-50 step at batch 8. Kept here, a freed block of the size a later allocation
// asks for is handed back as it is: the same run with jemalloc told to keep its memory took
// 2,948 ms per step against 3,400-3,700 with glibc's default (a 2-core AMD EPYC Zen 4, one thread).
// PyTorch's CUDA allocator caches the same way; on the CPU PyTorch leaves it to the allocator.
//
// What is kept: blocks of at least min_bytes, by exact size (a step asks for the same sizes
// again), up to a limit — by default such that the blocks in use and those kept together never
// pass the most bytes the program has had in use at once plus slack_bytes (256 MiB): a block is
// kept only within that room, and an allocation the cache cannot serve first frees kept blocks
// (largest first) beyond it. So the cache adds at most slack_bytes of resident memory above the
// program's own peak, whatever the batch (a bound on the kept bytes alone put a size that is kept
// but not asked for at the busiest moment on top of it: +23 MiB per image of ResNet-50's peak
// resident memory). The slack: with none, a step whose busiest moment leaves little room (a
// fine-tuning step, its frozen forward's activations of many sizes beside the weights and AdamW
// state) missed 44 blocks per step and 27 in full training, each mapped and zeroed again;
// 128 MiB brings that to 5, and at two threads, where a thread zeroing a fresh 2 MiB page holds
// its team at the next barrier, the ResNet-50 step went 1,351 / 1,386 -> 1,313 / 1,288 ms and
// the fine-tuning step 707 -> 651 ms (batch 8, AMD EPYC Zen 4; one thread: no change). 256 MiB
// brings both to 0 misses at batch 8 (88 MB a step no longer faulted in and zeroed): fine-tuning
// at two threads 554 -> 473 ms (medians of 5, alternating), the training step 1,224 -> 1,146 ms,
// for 36 MiB more peak resident memory (batch 32: 10 misses instead of 16, +135 MiB; the bound
// adds at most 128 MiB over 128 MiB of slack, whatever the batch; Intel Xeon, 2026-12-07).
// Reshaping a kept block of another size to the size missed (cut, or grown with mremap) was
// tried: no misses at 128 MiB, but the pages unmapped and faulted back were the same, and so was
// the time.
// set_host_cache_limit(bytes)
// sets another limit (0 keeps nothing, and frees what is kept; host_cache_default_limit goes back
// to the peak in use plus slack_bytes); release_cached_host_memory()
// frees what is kept now. Under AddressSanitizer nothing is kept unless a limit is set, so a use
// of a freed block is still caught.
//
// Memory figures: a kept block is still allocated to the process (peak resident memory counts
// it, as it counts what a caching allocator keeps). host_cache_stats() says how much is kept; the
// tests and benchmarks that measure the heap's peak as the memory planner models it (live
// tensors; tests/memory, bench/memory_plan, bench/gpt_scaling) set the limit to 0.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <new>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace kiln {

struct HostCacheStats {
  std::size_t kept_bytes = 0;      // in the cache now
  std::size_t kept_blocks = 0;
  std::size_t in_use_bytes = 0;    // blocks of min_bytes and up handed out and not yet freed
  std::size_t peak_in_use_bytes = 0;
  std::size_t limit_bytes = 0;     // the limit set, or by default the peak in use + slack (bounding in use + kept)
  std::size_t hits = 0, misses = 0;  // allocations served from the cache / from the system
};

// set_host_cache_limit's value for the default limit: in use + kept within the most bytes of
// cacheable blocks in use at once so far plus HostBlockCache::slack_bytes.
inline constexpr std::size_t host_cache_default_limit = SIZE_MAX;

namespace detail {

class HostBlockCache {
 public:
  static constexpr std::size_t min_bytes = std::size_t(128) << 10;  // glibc's first mmap threshold
  static constexpr std::size_t slack_bytes = std::size_t(256) << 20;  // above the peak in use (above)
  static constexpr std::size_t huge_page_min_bytes = std::size_t(4) << 20;  // two 2 MiB pages
  // Every host block's alignment (memory_traits<host>::alignment, which kiln/core/memory.hpp
  // checks is the same): blocks differ only in size.
  static constexpr std::size_t alignment = 64;
  // False under AddressSanitizer: a freed block goes back to the sanitizer, which catches its use.
  static constexpr bool keeps_by_default =
#if defined(__SANITIZE_ADDRESS__)
      false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
      false;
#else
      true;
#endif
#else
      true;
#endif

  // Never destroyed: blocks come back from static destructors at exit.
  static HostBlockCache& get() {
    static HostBlockCache* const cache = new HostBlockCache();
    return *cache;
  }

  // A block of `bytes`: a kept one of exactly that size, else a fresh one (mapped from the system
  // while the cache is on, see map_now). Throws std::bad_alloc when the system has no memory.
  // requires: bytes >= min_bytes. Out of line, as give: every tensor's constructor inlines the
  // allocation, which should stay a call.
  [[gnu::noinline]] void* take(std::size_t bytes) {
    std::lock_guard guard(lock_);
    const auto it = free_.find(bytes);
    if (it == free_.end() || it->second.empty()) {
      ++misses_;
      // Fresh memory: by default, kept blocks go back to the system first so that what is in use
      // and what is kept together stay within the peak in use plus slack_bytes.
      if (!limit_set_) evict_above(default_limit() - std::min(default_limit(), in_use_ + bytes));
      void* p = fresh(bytes);
      in_use_ += bytes;
      peak_in_use_ = std::max(peak_in_use_, in_use_);
      return p;
    }
    in_use_ += bytes;
    peak_in_use_ = std::max(peak_in_use_, in_use_);
    ++hits_;
    void* p = it->second.back();
    it->second.pop_back();
    kept_ -= bytes;
    --blocks_;
    return p;
  }

  // Takes back p (a block of `bytes` from take): kept when the limit allows, else freed.
  [[gnu::noinline]] void give(void* p, std::size_t bytes) noexcept {
    std::lock_guard guard(lock_);
    in_use_ -= std::min(in_use_, bytes);
    // By default: while in use plus kept stays within the peak in use plus slack_bytes (the
    // process never holds much more than its busiest moment needed); with a limit set: while kept
    // stays within it.
    if (kept_ + bytes <= room()) {
      try {
        free_[bytes].push_back(p);
        kept_ += bytes;
        ++blocks_;
        return;
      } catch (...) {  // no memory to keep it: free it
      }
    }
    free_block(p, bytes);
  }

  void set_limit(std::size_t bytes) {
    {
      std::lock_guard guard(lock_);
      limit_ = bytes;
      limit_set_ = bytes != host_cache_default_limit;
    }
    if (bytes == 0) release();
    else trim();
  }

  // Frees every kept block.
  void release() {
    std::lock_guard guard(lock_);
    for (auto& sized : free_)
      for (void* p : sized.second) free_block(p, sized.first);
    free_.clear();
    kept_ = 0;
    blocks_ = 0;
  }

  HostCacheStats stats() {
    std::lock_guard guard(lock_);
    return {kept_, blocks_, in_use_, peak_in_use_, limit_now(), hits_, misses_};
  }

 private:
  HostBlockCache() = default;

  // By default, in use + kept stays within this.
  std::size_t default_limit() const { return peak_in_use_ + slack_bytes; }
  std::size_t limit_now() const { return limit_set_ ? limit_ : keeps_by_default ? default_limit() : 0; }

  // Frees kept blocks, largest sizes first, until within the limit.
  void trim() {
    std::lock_guard guard(lock_);
    evict_above(room());
  }
  // The most bytes that may be kept now.
  std::size_t room() const {
    if (limit_set_) return limit_;
    return keeps_by_default ? default_limit() - std::min(default_limit(), in_use_) : 0;
  }
  // Frees kept blocks, largest sizes first, until at most `limit` bytes are kept. Called locked.
  void evict_above(std::size_t limit) {
    while (kept_ > limit) {
      auto largest = free_.end();
      for (auto it = free_.begin(); it != free_.end(); ++it)
        if (!it->second.empty() && (largest == free_.end() || it->first > largest->first)) largest = it;
      if (largest == free_.end()) break;
      free_block(largest->second.back(), largest->first);
      largest->second.pop_back();
      kept_ -= largest->first;
      --blocks_;
    }
  }

  // While the cache is on, fresh blocks are mapped from the system (mmap) rather than taken from
  // malloc, and a block the cache lets go is unmapped at once: glibc serves a block freed above
  // its mmap threshold by raising that threshold, after which such blocks come from its heap,
  // whose freed middle stays resident — ResNet-50 kept ~4.6 MiB per image of its peak resident
  // memory that way (MALLOC_MMAP_THRESHOLD_ pinned measured the same gain). With the cache off
  // (limit 0, as the memory tests set, whose counting operator new must see every byte) and under
  // AddressSanitizer, blocks come from operator new.
  bool map_now() const {
#if defined(__linux__)
    return keeps_by_default && !(limit_set_ && limit_ == 0);
#else
    return false;
#endif
  }
  // A fresh block. Called locked.
  void* fresh(std::size_t bytes) {
#if defined(__linux__)
    if (map_now()) {
      void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) throw std::bad_alloc();
      // Transparent huge pages where the system gives them on request: a block is faulted in
      // again after each unmap, and 2 MiB pages make that 512x fewer faults (ResNet-50 at
      // batch 8, Zen 4: step 2,705 -> 2,545 ms, fine-tuning 1,248 -> 1,164 ms, same peak RSS).
      // Small blocks are left to 4 KiB pages: compaction and zeroing whole huge pages for them
      // measured slower when the system gave every allocation huge pages.
      if (bytes >= huge_page_min_bytes) ::madvise(p, bytes, MADV_HUGEPAGE);
      try {
        mapped_.insert(p);
      } catch (...) {
        ::munmap(p, bytes);
        throw;
      }
      return p;
    }
#endif
    return ::operator new(bytes, std::align_val_t(alignment));
  }
  // Frees a block of `bytes` the way it was made. Called locked.
  void free_block(void* p, std::size_t bytes) noexcept {
#if defined(__linux__)
    if (mapped_.erase(p)) {
      ::munmap(p, bytes);
      return;
    }
#endif
    ::operator delete(p, std::align_val_t(alignment));
  }

  std::mutex lock_;
  std::unordered_set<void*> mapped_;  // blocks fresh() mapped, until freed
  std::unordered_map<std::size_t, std::vector<void*>> free_;  // by block size
  std::size_t kept_ = 0, blocks_ = 0, in_use_ = 0, peak_in_use_ = 0, limit_ = 0, hits_ = 0, misses_ = 0;
  bool limit_set_ = false;
};

}  // namespace detail

// The most bytes of freed host blocks kiln keeps for reuse (0: none, and what is kept is freed;
// host_cache_default_limit: in use + kept within the most bytes of such blocks in use at once so
// far plus HostBlockCache::slack_bytes, 256 MiB).
inline void set_host_cache_limit(std::size_t bytes) { detail::HostBlockCache::get().set_limit(bytes); }
// Frees the host blocks kept for reuse now (the limit stays).
inline void release_cached_host_memory() { detail::HostBlockCache::get().release(); }
inline HostCacheStats host_cache_stats() { return detail::HostBlockCache::get().stats(); }

}  // namespace kiln
