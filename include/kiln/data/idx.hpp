// kiln/data/idx.hpp — MNIST's IDX format (raw or gzip) and image/label classification sets.
//
// Layout: bytes 0-1 zero, byte 2 the element type (0x08 = unsigned byte, the only one read
// here), byte 3 the number of dimensions, then one big-endian int32 size per dimension, then the
// elements in row-major order and nothing after them. Every deviation is a DataError that names
// the file and the byte offset (of the decompressed content) where it was found.
#pragma once

#include <kiln/config.hpp>
#include <kiln/core/error.hpp>
#include <kiln/data/dataset.hpp>
#include <kiln/data/file.hpp>

#include <cstdint>
#include <filesystem>
#include <limits>
#include <span>
#include <string>
#include <vector>

namespace kiln::data {

inline constexpr std::uint8_t idx_type_u8 = 0x08;

// An IDX array of unsigned bytes.
struct IdxArray {
  std::vector<index_t> dims;       // e.g. {n, rows, cols} for images, {n} for labels
  std::vector<std::uint8_t> data;  // product(dims) bytes, row-major
  index_t header_bytes = 0;        // offset of data[0] in the (decompressed) file

  index_t size() const { return static_cast<index_t>(data.size()); }
};

// Parses IDX bytes; `name` is the file name used in errors.
KILN_COMPILED IdxArray parse_idx(std::span<const std::uint8_t> bytes, const std::string& name);

// Reads an IDX file, raw or gzip-compressed.
KILN_COMPILED IdxArray read_idx(const std::filesystem::path& path);

// Images [n, ...] (u8) and labels [n] (u8) as a Dataset: features are the raw byte values
// 0..255 as float (scale them with kiln/data/normalize.hpp), sample_shape is the image shape.
// Throws DataError when the files disagree on n or a label is >= num_classes, naming the file,
// the label's byte offset and its value; ValueError when num_classes is not in [1, 256].
KILN_COMPILED Dataset load_idx_classification(const std::filesystem::path& images_path,
                                              const std::filesystem::path& labels_path, int num_classes);

}  // namespace kiln::data

#if KILN_HEADER_BODIES
#include "kiln/data/idx_bodies.hpp"
#endif
