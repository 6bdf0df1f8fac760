// kiln/data/file.hpp — whole-file reads with transparent gzip, and the data-error format.
//
// Data files are small next to training time, so they are read whole: parsers then work on a
// byte span and can name exact offsets in their errors. Offsets in parser errors count bytes of
// the decompressed content, which is what a reader of the format sees.
#pragma once

#include <kiln/config.hpp>
#include <kiln/core/error.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <span>
#include <string>
#include <vector>

#if defined(KILN_HAVE_ZLIB) && KILN_HAVE_ZLIB
#include <zlib.h>
#define KILN_DATA_ZLIB 1
#else
#define KILN_DATA_ZLIB 0
#endif

namespace kiln::data {

// Whether this build can read gzip files (the build found zlib and defined KILN_HAVE_ZLIB=1).
inline constexpr bool have_zlib = KILN_DATA_ZLIB != 0;

// Throws DataError "<file>: byte offset <offset>: <parts...>".
template <class... Parts>
[[noreturn]] void throw_data_error(const std::string& file, std::uint64_t offset,
                                   const Parts&... parts) {
  throw DataError(::kiln::detail::concat(file, ": byte offset ", offset, ": ", parts...));
}

// True when the bytes start with the gzip magic 1f 8b.
inline bool is_gzip(std::span<const std::uint8_t> bytes) {
  return bytes.size() >= 2 && bytes[0] == 0x1f && bytes[1] == 0x8b;
}

// The file's bytes exactly as stored. Throws DataError naming the file when it cannot be read.
KILN_COMPILED std::vector<std::uint8_t> read_raw_file(const std::filesystem::path& path);

// Inflates gzip data (one or more concatenated members, as `cat a.gz b.gz` makes). `name` only
// labels errors; their offsets count compressed bytes.
KILN_COMPILED std::vector<std::uint8_t> gunzip(std::span<const std::uint8_t> packed,
                                               const std::string& name);

// The file's content, decompressed when it starts with the gzip magic (whatever its name). A
// build without zlib reads "x" for "x.gz" when "x" exists (decompressed beside it, e.g. by
// `gunzip -k`), so a machine without zlib's headers can still run the examples.
KILN_COMPILED std::vector<std::uint8_t> read_file(const std::filesystem::path& path);

}  // namespace kiln::data

#if KILN_HEADER_BODIES
#include "kiln/data/file_bodies.hpp"
#endif
