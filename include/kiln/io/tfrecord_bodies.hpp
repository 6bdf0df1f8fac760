// kiln/io/tfrecord_bodies.hpp — the bodies of tfrecord.hpp's functions: included by it when kiln
// is header-only, compiled once into kiln::kernels otherwise (KILN_COMPILED, kiln/config.hpp).
#pragma once

#include "kiln/io/tfrecord.hpp"

namespace kiln::io {

KILN_COMPILED void append_tfrecord(std::string& out, std::string_view data) {
  std::string length;
  detail::put_le(length, data.size(), 8);
  out += length;
  detail::put_le(out, masked_crc32c(length.data(), length.size()), 4);
  out.append(data);
  detail::put_le(out, masked_crc32c(data.data(), data.size()), 4);
}

KILN_COMPILED std::vector<std::string> read_tfrecords(std::string_view bytes, const std::string& file) {
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
