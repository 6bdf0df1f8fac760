// tests/cpu/data_helpers.hpp — what the data-reader suites share: writing byte files, gzip
// (with zlib), and checking that a reader's DataError names the file and what went wrong.
#pragma once

#include <kiln/core/error.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <vector>

#if KILN_HAVE_ZLIB
#include <zlib.h>
#endif

namespace kiln_test {

using Bytes = std::vector<std::uint8_t>;

inline std::filesystem::path write_bytes(const std::filesystem::path& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  return path;
}

#if KILN_HAVE_ZLIB
inline Bytes gzip(const Bytes& raw) {
  z_stream zs{};
  REQUIRE(deflateInit2(&zs, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) == Z_OK);
  Bytes out(deflateBound(&zs, static_cast<uLong>(raw.size())) + 64);
  zs.next_in = const_cast<Bytef*>(raw.data());
  zs.avail_in = static_cast<uInt>(raw.size());
  zs.next_out = out.data();
  zs.avail_out = static_cast<uInt>(out.size());
  REQUIRE(deflate(&zs, Z_FINISH) == Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}
#endif

// Runs `f`, which must throw DataError whose message names `file` and contains each of `parts`.
template <class F>
void check_data_error(F f, const std::filesystem::path& file, std::initializer_list<std::string> parts) {
  std::string message;
  CHECK_THROWS_AS(
      [&] {
        try {
          f();
        } catch (const kiln::DataError& e) {
          message = e.what();
          throw;
        }
      }(),
      kiln::DataError);
  CAPTURE(message);
  CHECK(message.find(file.string()) != std::string::npos);
  for (const std::string& p : parts) {
    CAPTURE(p);
    CHECK(message.find(p) != std::string::npos);
  }
}

}  // namespace kiln_test
