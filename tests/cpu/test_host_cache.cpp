// The host block cache (kiln/core/host_block_cache.hpp): a freed block of 128 KiB and up comes
// back for the next allocation of its size, within a limit; small blocks and a zero limit keep
// nothing.
#include <kiln/core/memory.hpp>
#include <kiln/core/tensor.hpp>

#include <doctest/doctest.h>

#include <cstring>

using kiln::host;
using kiln::memory_traits;

namespace {

constexpr std::size_t MiB = std::size_t(1) << 20;

// Restores the default limit however the test case ends.
struct DefaultLimitAfter {
  ~DefaultLimitAfter() { kiln::set_host_cache_limit(kiln::host_cache_default_limit); }
};

}  // namespace

TEST_CASE("host cache: a freed large block is handed back for the next allocation of its size") {
  DefaultLimitAfter restore;
  kiln::set_host_cache_limit(64 * MiB);
  void* a = memory_traits<host>::allocate(MiB + 64);
  std::memset(a, 7, MiB + 64);
  memory_traits<host>::deallocate(a, MiB + 64);
  const kiln::HostCacheStats before = kiln::host_cache_stats();
  CHECK(before.kept_bytes >= MiB + 64);
  void* b = memory_traits<host>::allocate(MiB + 64);
  CHECK(b == a);
  const kiln::HostCacheStats after = kiln::host_cache_stats();
  CHECK(after.hits == before.hits + 1);
  CHECK(after.kept_bytes == before.kept_bytes - (MiB + 64));
  void* c = memory_traits<host>::allocate(MiB + 128);  // another size: not that block
  CHECK(c != b);
  CHECK(kiln::host_cache_stats().misses >= after.misses);
  memory_traits<host>::deallocate(b, MiB + 64);
  memory_traits<host>::deallocate(c, MiB + 128);
}

TEST_CASE("host cache: tensors of one shape reuse their storage across steps") {
  DefaultLimitAfter restore;
  kiln::set_host_cache_limit(64 * MiB);
  const float* first = nullptr;
  for (int step = 0; step < 3; ++step) {
    kiln::Tensor<float, host, kiln::dyn, kiln::dyn> t(kiln::Shape{512, 512});
    if (step == 0) first = t.data();
    else CHECK(t.data() == first);
  }
}

TEST_CASE("host cache: small blocks are not kept, the limit bounds what is, and a zero limit frees it") {
  DefaultLimitAfter restore;
  kiln::set_host_cache_limit(0);
  CHECK(kiln::host_cache_stats().kept_bytes == 0);
  kiln::set_host_cache_limit(3 * MiB);
  const std::size_t small = kiln::detail::HostBlockCache::min_bytes - 64;
  void* s = memory_traits<host>::allocate(small);
  memory_traits<host>::deallocate(s, small);
  CHECK(kiln::host_cache_stats().kept_bytes == 0);

  void* blocks[3];
  for (void*& p : blocks) p = memory_traits<host>::allocate(2 * MiB);
  for (void* p : blocks) memory_traits<host>::deallocate(p, 2 * MiB);
  CHECK(kiln::host_cache_stats().kept_bytes == 2 * MiB);  // a second 2 MiB block would pass 3 MiB
  CHECK(kiln::host_cache_stats().kept_blocks == 1);

  kiln::set_host_cache_limit(0);
  CHECK(kiln::host_cache_stats().kept_bytes == 0);
  void* d = memory_traits<host>::allocate(2 * MiB);
  memory_traits<host>::deallocate(d, 2 * MiB);
  CHECK(kiln::host_cache_stats().kept_bytes == 0);
}

TEST_CASE("host cache: by default it keeps at most the most bytes ever in use at once") {
  DefaultLimitAfter restore;
  kiln::set_host_cache_limit(0);
  kiln::set_host_cache_limit(kiln::host_cache_default_limit);
  const kiln::HostCacheStats s = kiln::host_cache_stats();
  using Cache = kiln::detail::HostBlockCache;
  CHECK(s.limit_bytes == (Cache::keeps_by_default ? s.peak_in_use_bytes + Cache::slack_bytes : 0));
  void* p = memory_traits<host>::allocate(s.peak_in_use_bytes + 4 * MiB);  // a new peak
  memory_traits<host>::deallocate(p, s.peak_in_use_bytes + 4 * MiB);
  const kiln::HostCacheStats t = kiln::host_cache_stats();
  CHECK(t.peak_in_use_bytes >= s.peak_in_use_bytes + 4 * MiB);
  CHECK(t.kept_bytes <= t.limit_bytes);
}

TEST_CASE("host cache: by default what is in use and what is kept never pass the peak in use plus the slack together") {
  if (!kiln::detail::HostBlockCache::keeps_by_default) return;  // AddressSanitizer: nothing is kept
  constexpr std::size_t slack = kiln::detail::HostBlockCache::slack_bytes;
  DefaultLimitAfter restore;
  kiln::set_host_cache_limit(0);
  kiln::set_host_cache_limit(kiln::host_cache_default_limit);
  const kiln::HostCacheStats s = kiln::host_cache_stats();
  const std::size_t big = s.peak_in_use_bytes + slack + 4 * MiB;  // a new peak, then kept
  void* p = memory_traits<host>::allocate(big);
  memory_traits<host>::deallocate(p, big);
  CHECK(kiln::host_cache_stats().kept_bytes >= big);
  // Within the slack another size is served fresh and the kept block stays.
  void* r = memory_traits<host>::allocate(2 * MiB);
  CHECK(kiln::host_cache_stats().kept_bytes >= big);
  memory_traits<host>::deallocate(r, 2 * MiB);
  // Past it (the block in use and the kept one together pass the peak by more than the slack):
  // the kept block goes back to the system. Pages are never touched: nothing becomes resident.
  const std::size_t past = slack + 4 * MiB;
  void* q = memory_traits<host>::allocate(past);
  const kiln::HostCacheStats t = kiln::host_cache_stats();
  CHECK(t.kept_bytes < big);
  CHECK(t.kept_bytes + t.in_use_bytes <= t.peak_in_use_bytes + slack);
  memory_traits<host>::deallocate(q, past);
  const kiln::HostCacheStats u = kiln::host_cache_stats();
  CHECK(u.kept_bytes + u.in_use_bytes <= u.peak_in_use_bytes + slack);
}
