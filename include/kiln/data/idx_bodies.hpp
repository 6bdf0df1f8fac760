// kiln/data/idx_bodies.hpp — the bodies of idx.hpp's functions: included by it when kiln
// is header-only, compiled once into kiln::kernels otherwise (KILN_COMPILED, kiln/config.hpp).
#pragma once

#include "kiln/data/idx.hpp"

namespace kiln::data {

KILN_COMPILED IdxArray parse_idx(std::span<const std::uint8_t> bytes, const std::string& name) {
  const auto size = static_cast<std::uint64_t>(bytes.size());
  if (size < 4)
    throw_data_error(name, size, "truncated IDX header: the 4-byte magic needs 4 bytes, file has ",
                     size);
  if (bytes[0] != 0 || bytes[1] != 0)
    throw_data_error(name, 0, "bad IDX magic 0x", std::hex, (unsigned{bytes[0]} << 8 | bytes[1]),
                     std::dec, " in bytes 0-1 (must be zero; is this an IDX file?)");
  if (bytes[2] != idx_type_u8)
    throw_data_error(name, 2, "unsupported IDX element type 0x", std::hex, unsigned{bytes[2]},
                     std::dec, " (only unsigned byte, 0x08, is read)");
  const unsigned ndim = bytes[3];
  if (ndim == 0) throw_data_error(name, 3, "bad IDX magic: zero dimensions");

  IdxArray out;
  out.header_bytes = 4 + 4 * static_cast<index_t>(ndim);
  if (size < static_cast<std::uint64_t>(out.header_bytes))
    throw_data_error(name, size, "truncated IDX header: ", ndim, " dimensions need ",
                     out.header_bytes, " header bytes, file has ", size);
  index_t count = 1;
  for (unsigned i = 0; i < ndim; ++i) {
    const std::size_t at = 4 + 4 * std::size_t{i};
    const auto raw = std::uint32_t{bytes[at]} << 24 | std::uint32_t{bytes[at + 1]} << 16 |
                     std::uint32_t{bytes[at + 2]} << 8 | std::uint32_t{bytes[at + 3]};
    const auto dim = static_cast<std::int32_t>(raw);  // IDX sizes are signed int32
    if (dim <= 0)
      throw_data_error(name, at, "IDX dimension ", i, " is ", dim, " (sizes must be positive)");
    if (count > std::numeric_limits<index_t>::max() / dim)
      throw_data_error(name, at, "IDX dimension ", i, " = ", dim,
                       " makes the element count overflow 64 bits");
    count *= dim;
    out.dims.push_back(dim);
  }
  const std::uint64_t have = size - static_cast<std::uint64_t>(out.header_bytes);
  if (have < static_cast<std::uint64_t>(count))
    throw_data_error(name, size, "truncated IDX data: dimensions need ", count,
                     " bytes after the header, file has ", have);
  if (have > static_cast<std::uint64_t>(count))
    throw_data_error(name, static_cast<std::uint64_t>(out.header_bytes + count), have - count,
                     " trailing bytes after the IDX data");
  out.data.assign(bytes.begin() + out.header_bytes, bytes.end());
  return out;
}

KILN_COMPILED IdxArray read_idx(const std::filesystem::path& path) {
  return parse_idx(read_file(path), path.string());
}

KILN_COMPILED Dataset load_idx_classification(const std::filesystem::path& images_path,
                                              const std::filesystem::path& labels_path, int num_classes) {
  KILN_CHECK(num_classes > 0 && num_classes <= 256, ValueError,
             "load_idx_classification: num_classes = ", num_classes,
             " must be in [1, 256] for byte labels");
  const std::string images_name = images_path.string(), labels_name = labels_path.string();
  const IdxArray images = read_idx(images_path);
  const IdxArray labels = read_idx(labels_path);
  if (images.dims.size() < 2)
    throw_data_error(images_name, 3,
                     "images need at least 2 dimensions (n, features...), file has ",
                     images.dims.size());
  if (labels.dims.size() != 1)
    throw_data_error(labels_name, 3, "labels need exactly 1 dimension (n), file has ",
                     labels.dims.size());
  if (images.dims[0] != labels.dims[0])
    throw_data_error(labels_name, 4, "holds ", labels.dims[0], " labels but ", images_name,
                     " holds ", images.dims[0], " images");

  Dataset ds;
  ds.n = images.dims[0];
  ds.d = images.size() / ds.n;
  ds.num_classes = num_classes;
  ds.sample_shape.assign(images.dims.begin() + 1, images.dims.end());
  ds.features.assign(images.data.begin(), images.data.end());
  ds.labels.resize(static_cast<std::size_t>(ds.n));
  for (index_t i = 0; i < ds.n; ++i) {
    const std::uint8_t y = labels.data[static_cast<std::size_t>(i)];
    if (y >= num_classes)
      throw_data_error(labels_name, static_cast<std::uint64_t>(labels.header_bytes + i), "label ",
                       unsigned{y}, " of sample ", i, " is not below num_classes = ", num_classes);
    ds.labels[static_cast<std::size_t>(i)] = y;
  }
  return ds;
}

}  // namespace kiln::data
