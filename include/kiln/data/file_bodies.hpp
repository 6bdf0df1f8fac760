// kiln/data/file_bodies.hpp — the bodies of file.hpp's functions: included by it when kiln
// is header-only, compiled once into kiln::kernels otherwise (KILN_COMPILED, kiln/config.hpp).
#pragma once

#include "kiln/data/file.hpp"

namespace kiln::data {

KILN_COMPILED std::vector<std::uint8_t> read_raw_file(const std::filesystem::path& path) {
  const std::string name = path.string();
  // A directory opens as a stream on Linux and reports a size of 2^63 - 1: refuse it by name
  // before reading it would ask for that much memory.
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw DataError(::kiln::detail::concat(name, ": is a directory, not a data file"));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(::kiln::detail::concat(name, ": cannot open: ", std::strerror(errno)));
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size < 0) throw DataError(::kiln::detail::concat(name, ": cannot determine the file size"));
  in.seekg(0, std::ios::beg);
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(size));
  if (size > 0 && !in.read(reinterpret_cast<char*>(bytes.data()), size))
    throw DataError(
        ::kiln::detail::concat(name, ": read failed after ", in.gcount(), " of ", size, " bytes"));
  return bytes;
}

KILN_COMPILED std::vector<std::uint8_t> gunzip(std::span<const std::uint8_t> packed,
                                               const std::string& name) {
#if KILN_DATA_ZLIB
  std::vector<std::uint8_t> out;
  // The last four bytes of an intact single-member file hold its size mod 2^32: a good first
  // guess. A truncated or corrupt file's "trailer" is arbitrary, so a guess beyond deflate's
  // largest ratio (about 1032:1) is not believed; the buffer doubles as needed either way.
  std::size_t guess = packed.size() * 4;
  if (packed.size() >= 4) {
    const std::size_t n = packed.size();
    const std::size_t trailer = std::size_t{packed[n - 4]} | std::size_t{packed[n - 3]} << 8 |
                                std::size_t{packed[n - 2]} << 16 | std::size_t{packed[n - 1]} << 24;
    if (trailer <= n * 1032) guess = trailer;
  }
  out.resize(std::max<std::size_t>(guess, 1024));

  z_stream zs{};
  // 15 + 16: a gzip wrapper is required (a raw zlib stream is not a .gz file).
  if (inflateInit2(&zs, 15 + 16) != Z_OK)
    throw DataError(::kiln::detail::concat(name, ": zlib init failed"));
  std::size_t in_pos = 0, out_pos = 0;
  // zlib counts in 32-bit uInt: feed at most 1 GiB at a time.
  constexpr std::size_t chunk = std::size_t{1} << 30;
  for (;;) {
    if (out_pos == out.size()) out.resize(out.size() * 2);
    zs.next_in = const_cast<Bytef*>(packed.data() + in_pos);  // zlib's API is not const-correct
    zs.avail_in = static_cast<uInt>(std::min(chunk, packed.size() - in_pos));
    zs.next_out = out.data() + out_pos;
    zs.avail_out = static_cast<uInt>(std::min(chunk, out.size() - out_pos));
    const uInt in_before = zs.avail_in, out_before = zs.avail_out;
    const int rc = inflate(&zs, Z_NO_FLUSH);
    in_pos += in_before - zs.avail_in;
    out_pos += out_before - zs.avail_out;
    if (rc == Z_STREAM_END) {
      // Another member may follow; anything else after the end is an error (not silently kept).
      if (in_pos == packed.size()) break;
      if (!is_gzip(packed.subspan(in_pos))) {
        inflateEnd(&zs);
        throw_data_error(name, in_pos, "unexpected bytes after the end of the gzip stream");
      }
      inflateReset(&zs);
      continue;
    }
    if (rc == Z_OK) continue;
    if (rc == Z_BUF_ERROR && in_pos == packed.size() && zs.avail_out > 0) {
      inflateEnd(&zs);
      throw_data_error(name, in_pos, "gzip stream is truncated (compressed file ends early)");
    }
    if (rc == Z_BUF_ERROR) continue;  // no progress possible yet: more output room next turn
    const std::string why = zs.msg ? zs.msg : "error " + std::to_string(rc);
    inflateEnd(&zs);
    throw_data_error(name, in_pos, "corrupt gzip data: ", why);
  }
  inflateEnd(&zs);
  out.resize(out_pos);
  return out;
#else
  (void)packed;
  throw DataError(
      ::kiln::detail::concat(name,
                             ": is gzip-compressed, and reading gzip requires zlib: "
                             "build with zlib (KILN_HAVE_ZLIB=1) or decompress it first"));
#endif
}

KILN_COMPILED std::vector<std::uint8_t> read_file(const std::filesystem::path& path) {
  if (!have_zlib && path.extension() == ".gz") {
    std::filesystem::path plain = path;
    plain.replace_extension();
    std::error_code ec;
    if (std::filesystem::is_regular_file(plain, ec)) return read_raw_file(plain);
  }
  std::vector<std::uint8_t> bytes = read_raw_file(path);
  if (is_gzip(bytes)) return gunzip(bytes, path.string());
  return bytes;
}

}  // namespace kiln::data
