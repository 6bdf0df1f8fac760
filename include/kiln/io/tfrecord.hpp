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

#include "kiln/config.hpp"
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
KILN_COMPILED void append_tfrecord(std::string& out, std::string_view data);

// The records of a whole TFRecord file, in order.
// throws: DataError naming `file` and the byte offset of a truncated record or a CRC mismatch.
KILN_COMPILED std::vector<std::string> read_tfrecords(std::string_view bytes, const std::string& file);

}  // namespace kiln::io

#if KILN_HEADER_BODIES
#include "kiln/io/tfrecord_bodies.hpp"
#endif
