// kiln/io/crc32c_bodies.hpp — the bodies of crc32c.hpp's functions: included by it when kiln is
// header-only, compiled once into kiln::kernels otherwise (KILN_COMPILED, kiln/config.hpp).
#pragma once

#include "kiln/io/crc32c.hpp"

#if defined(__SSE4_2__) && !defined(__CUDA_ARCH__)
#include <nmmintrin.h>
#endif

namespace kiln::io {

KILN_COMPILED std::uint32_t crc32c_portable(const void* data, std::size_t n, std::uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (std::size_t i = 0; i < n; ++i) crc = detail::crc32c_bytes[(crc ^ p[i]) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}

KILN_COMPILED std::uint32_t crc32c(const void* data, std::size_t n, std::uint32_t crc) {
#if defined(__SSE4_2__) && defined(__x86_64__) && !defined(__CUDA_ARCH__)
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint64_t c = ~crc;
  for (; n >= 8; n -= 8, p += 8) {
    std::uint64_t word;
    std::memcpy(&word, p, 8);
    c = _mm_crc32_u64(c, word);
  }
  auto c32 = static_cast<std::uint32_t>(c);
  for (; n > 0; --n, ++p) c32 = _mm_crc32_u8(c32, *p);
  return ~c32;
#else
  return crc32c_portable(data, n, crc);
#endif
}

KILN_COMPILED std::uint32_t masked_crc32c(const void* data, std::size_t n) {
  const std::uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

}  // namespace kiln::io
