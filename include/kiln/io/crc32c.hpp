// kiln/io/crc32c.hpp — CRC-32C (Castagnoli), the checksum of TensorBoard's TFRecord framing and of
// kiln's checkpoints. The SSE4.2 instruction computes it when the compiler targets it (x86-64 with
// -march=native on every machine kiln runs on); a table-driven loop otherwise, with the same bits.
//
//   std::uint32_t c = kiln::io::crc32c(data, n);          // one buffer
//   c = kiln::io::crc32c(more, m, c);                      // continued over a second one
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kiln/config.hpp"

namespace kiln::io {

namespace detail {
// Byte-at-a-time table of the reflected polynomial 0x82F63B78.
constexpr std::array<std::uint32_t, 256> crc32c_table() {
  std::array<std::uint32_t, 256> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}
inline constexpr std::array<std::uint32_t, 256> crc32c_bytes = crc32c_table();
}  // namespace detail

// The portable loop (also the reference the hardware path is tested against).
KILN_COMPILED std::uint32_t crc32c_portable(const void* data, std::size_t n, std::uint32_t crc = 0);

// CRC-32C of n bytes, continuing from `crc` (the value returned for the bytes before).
KILN_COMPILED std::uint32_t crc32c(const void* data, std::size_t n, std::uint32_t crc = 0);

// TFRecord's masked form: a CRC stored beside the data it covers, rotated and offset so that a
// CRC computed over bytes that themselves contain CRCs does not degenerate.
KILN_COMPILED std::uint32_t masked_crc32c(const void* data, std::size_t n);

}  // namespace kiln::io

#if KILN_HEADER_BODIES
#include "kiln/io/crc32c_bodies.hpp"
#endif
