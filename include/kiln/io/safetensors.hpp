// kiln/io/safetensors.hpp — the safetensors format (Hugging Face's; what safetensors.torch reads
// and writes): an 8-byte little-endian header length N, N bytes of JSON
//   {"__metadata__": {"key": "value", ...}, "name": {"dtype": "F32", "shape": [2, 3],
//    "data_offsets": [begin, end]}, ...}
// then the tensors' raw little-endian bytes; offsets count from the end of the header.
//
// The reader is written for hostile files: it never reads outside the file whatever the header
// claims, and every problem is a DataError naming the file and what is wrong (byte offset, tensor
// name, expected vs found). It checks what the reference implementation checks — header length
// within the file and under 100 MB, a JSON object, known dtypes, offsets that agree with dtype and
// shape, data that is indexed exactly once with no holes — and refuses duplicate names. A file
// carrying kiln's checksum (metadata "kiln.crc32c", CRC-32C of the data) is verified on open.
//
//   kiln::io::SafetensorsWriter w;
//   w.add("0.weight", kiln::dtype::f32, {256, 400}, bytes);
//   w.write("model.safetensors");                        // atomic (kiln/io/atomic_file.hpp)
//   kiln::io::SafetensorsFile f = kiln::io::SafetensorsFile::open("model.safetensors");
//   const kiln::io::TensorInfo& t = f.info("0.weight");  f.bytes(t) ...
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kiln/config.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/core/error.hpp"
#include "kiln/data/file.hpp"
#include "kiln/io/atomic_file.hpp"
#include "kiln/io/crc32c.hpp"
#include "kiln/io/json.hpp"

namespace kiln::io {

// The metadata key of kiln's checksum: 8 lowercase hex digits of the data's CRC-32C.
inline constexpr const char* checksum_key = "kiln.crc32c";
// The reference implementation's limit on the header (a larger one is refused unread).
inline constexpr std::uint64_t max_header_bytes = 100'000'000;

// The format's dtype names and their sizes; kiln reads and writes the ones kiln::dtype has.
struct SafetensorsDtype {
  const char* name;
  std::size_t bytes;
};
inline constexpr SafetensorsDtype safetensors_dtypes[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
    {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"F64", 8},     {"I64", 8}, {"U64", 8}};

KILN_COMPILED const char* safetensors_name(dtype t);

// One tensor's entry in the header.
struct TensorInfo {
  std::string name;
  std::string dtype;  // the format's name: "F32", "BF16", ...
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;  // data_offsets, from the end of the header
  std::size_t elements() const;
};

KILN_COMPILED std::string shape_text(const std::vector<std::int64_t>& shape);

// A safetensors file read whole and validated (see the header comment).
class SafetensorsFile {
 public:
  // throws: DataError naming the file for a file that cannot be read or is not valid.
  static SafetensorsFile open(const std::string& path);
  // The same from bytes in memory; `name` labels errors.
  static SafetensorsFile parse(std::vector<std::uint8_t> bytes, std::string name);

  const std::string& name() const { return name_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // in header order
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool has_checksum() const { return metadata_.count(checksum_key) != 0; }
  // The file's size and where the data begins (8 + header length).
  std::size_t size() const { return bytes_.size(); }
  std::size_t data_start() const { return data_start_; }

  const TensorInfo* find(const std::string& tensor) const;
  // throws: DataError naming the file and the missing tensor.
  const TensorInfo& info(const std::string& tensor) const;
  // The tensor's bytes (inside the file: validation checked the offsets).
  std::span<const std::uint8_t> bytes(const TensorInfo& t) const {
    return {bytes_.data() + data_start_ + t.begin, std::size_t(t.end - t.begin)};
  }

  // The tensor's values into dst after checking its dtype and shape against what the caller
  // expects; `expected_shape` empty means a scalar.
  // throws: DataError naming the file, the tensor, and expected vs found dtype or shape.
  void read(const std::string& tensor, dtype type, const std::vector<std::int64_t>& expected_shape, void* dst) const;
  void check(const TensorInfo& t, dtype type, const std::vector<std::int64_t>& expected_shape) const;

  template <class... Parts>
  [[noreturn]] void fail(const Parts&... parts) const {
    throw DataError(::kiln::detail::concat(name_, ": ", parts...));
  }

 private:
  template <class... Parts>
  [[noreturn]] void fail_at(std::uint64_t offset, const Parts&... parts) const {
    data::throw_data_error(name_, offset, parts...);
  }

  static std::uint64_t read_u64_le(const std::uint8_t* p);
  void validate();
  void read_metadata(const JsonValue& v);

  static bool non_negative_int(const JsonValue& v) {
    return v.type == JsonValue::Type::number && v.is_integer && v.integer >= 0;
  }

  TensorInfo read_entry(const std::string& key, const JsonValue& v, std::uint64_t data_size) const;

  // Every data byte belongs to exactly one tensor: no overlap, no gap, nothing after the last.
  void check_layout(std::uint64_t data_size) const;
  void verify_checksum() const;

  std::string name_;
  std::vector<std::uint8_t> bytes_;
  std::size_t data_start_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Collects tensors and metadata and writes them as one safetensors file, with kiln's checksum.
class SafetensorsWriter {
 public:
  // Appends a tensor; its data follows the previous one's. `bytes` holds its values in the
  // format's little-endian layout (kiln's host layout on x86-64 and Arm).
  // throws: ValueError for a repeated name or a byte count that disagrees with dtype and shape.
  void add(std::string name, dtype type, std::vector<std::int64_t> shape, std::span<const std::uint8_t> bytes);
  template <class T>
  void add_values(std::string name, std::vector<std::int64_t> shape, std::span<const T> values) {
    add(std::move(name), dtype_of<T>, std::move(shape),
        {reinterpret_cast<const std::uint8_t*>(values.data()), values.size() * sizeof(T)});
  }
  void set_metadata(const std::string& key, std::string value) { metadata_[key] = std::move(value); }

  // The whole file: header (padded with spaces to a multiple of 8 bytes, as the reference writer
  // does, so the data is aligned) and data.
  std::vector<std::uint8_t> serialize() const;

  // Writes the file atomically and durably (write_file_atomically).
  void write(const std::string& path) const;

 private:
  struct Entry {
    TensorInfo info;
  };
  std::vector<Entry> entries_;
  std::vector<std::uint8_t> data_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace kiln::io

#if KILN_HEADER_BODIES
#include "kiln/io/safetensors_bodies.hpp"
#endif
