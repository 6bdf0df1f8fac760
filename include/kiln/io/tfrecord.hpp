// kiln/io/tfrecord.hpp — TFRecord framing, the container of TensorBoard event files: each record
// is a little-endian u64 length, the masked CRC-32C of those 8 bytes, the data, and the masked
// CRC-32C of the data. The reader checks both CRCs and never reads past the buffer.
//
//   std::string file;  kiln::io::append_tfrecord(file, payload);
//   for (auto& rec : kiln::io::read_tfrecords(bytes, "events.out...")) ...
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/io/crc32c.hpp"

namespace kiln::io {

namespace detail {
inline void put_le(std::string& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(char((v >> (8 * i)) & 0xFFu));
}
inline std::uint64_t get_le(std::string_view in, std::size_t at, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= std::uint64_t(static_cast<unsigned char>(in[at + std::size_t(i)])) << (8 * i);
  return v;
}
}  // namespace detail

// Appends one framed record holding `data` to `out`.
inline void append_tfrecord(std::string& out, std::string_view data) {
  std::string length;
  detail::put_le(length, data.size(), 8);
  out += length;
  detail::put_le(out, masked_crc32c(length.data(), length.size()), 4);
  out.append(data);
  detail::put_le(out, masked_crc32c(data.data(), data.size()), 4);
}

// The records of a whole TFRecord file, in order.
// throws: DataError naming `file` and the byte offset of a truncated record or a CRC mismatch.
inline std::vector<std::string> read_tfrecords(std::string_view bytes, const std::string& file) {
  std::vector<std::string> records;
  std::size_t at = 0;
  while (at < bytes.size()) {
    KILN_CHECK(bytes.size() - at >= 12, DataError, file, ": record at offset ", at, " is truncated (",
               bytes.size() - at, " bytes left, a header needs 12)");
    const std::uint64_t n = detail::get_le(bytes, at, 8);
    const auto length_crc = std::uint32_t(detail::get_le(bytes, at + 8, 4));
    KILN_CHECK(length_crc == masked_crc32c(bytes.data() + at, 8), DataError, file, ": record at offset ", at,
               " has a length CRC mismatch");
    KILN_CHECK(n <= bytes.size() - at - 12 && bytes.size() - at - 12 - n >= 4, DataError, file, ": record at offset ",
               at, " claims ", n, " bytes but only ", bytes.size() - at - 12, " remain");
    const std::string_view data = bytes.substr(at + 12, std::size_t(n));
    const auto data_crc = std::uint32_t(detail::get_le(bytes, at + 12 + std::size_t(n), 4));
    KILN_CHECK(data_crc == masked_crc32c(data.data(), data.size()), DataError, file, ": record at offset ", at,
               " has a data CRC mismatch");
    records.emplace_back(data);
    at += 16 + std::size_t(n);
  }
  return records;
}

}  // namespace kiln::io
