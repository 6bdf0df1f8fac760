// The global operator new / delete of the kiln_tests_memory binary (and bench/memory_plan),
// counting (counting_new.hpp). Sizes are malloc's usable sizes, so a block counts what it really
// holds.

#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <new>

#include "counting_new.hpp"

namespace {
std::atomic<std::size_t> in_use{0}, peak{0}, allocations{0};
void* counted(void* p) {
  if (p == nullptr) throw std::bad_alloc();
  allocations.fetch_add(1);
  const std::size_t now = in_use.fetch_add(malloc_usable_size(p)) + malloc_usable_size(p);
  std::size_t seen = peak.load();
  while (now > seen && !peak.compare_exchange_weak(seen, now)) {
  }
  return p;
}
void uncounted(void* p) noexcept {
  if (p == nullptr) return;
  in_use.fetch_sub(malloc_usable_size(p));
  std::free(p);
}
void* aligned(std::size_t n, std::align_val_t a) {
  const std::size_t al = std::max<std::size_t>(std::size_t(a), sizeof(void*));
  return counted(std::aligned_alloc(al, (std::max<std::size_t>(n, 1) + al - 1) / al * al));
}
}  // namespace

namespace kiln_memory_test {
std::size_t heap_in_use() { return in_use.load(); }
std::size_t heap_peak() { return peak.load(); }
void reset_heap_peak() { peak.store(in_use.load()); }
std::size_t heap_allocations() { return allocations.load(); }
}  // namespace kiln_memory_test

void* operator new(std::size_t n) { return counted(std::malloc(std::max<std::size_t>(n, 1))); }
void* operator new[](std::size_t n) { return counted(std::malloc(std::max<std::size_t>(n, 1))); }
void* operator new(std::size_t n, std::align_val_t a) { return aligned(n, a); }
void* operator new[](std::size_t n, std::align_val_t a) { return aligned(n, a); }
void operator delete(void* p) noexcept { uncounted(p); }
void operator delete[](void* p) noexcept { uncounted(p); }
void operator delete(void* p, std::size_t) noexcept { uncounted(p); }
void operator delete[](void* p, std::size_t) noexcept { uncounted(p); }
void operator delete(void* p, std::align_val_t) noexcept { uncounted(p); }
void operator delete[](void* p, std::align_val_t) noexcept { uncounted(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { uncounted(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { uncounted(p); }
