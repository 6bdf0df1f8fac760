// kiln/io/safetensors_bodies.hpp — the bodies of safetensors.hpp's functions: included by it when
// kiln is header-only, compiled once into kiln::kernels otherwise (KILN_COMPILED, kiln/config.hpp).
#pragma once

#include "kiln/io/safetensors.hpp"

namespace kiln::io {

KILN_COMPILED const char* safetensors_name(dtype t) {
  switch (t) {
    case dtype::f32: return "F32";
    case dtype::f64: return "F64";
    case dtype::f16: return "F16";
    case dtype::bf16: return "BF16";
    case dtype::i32: return "I32";
    case dtype::i64: return "I64";
    case dtype::u8: return "U8";
  }
  return "?";
}

KILN_COMPILED std::size_t TensorInfo::elements() const {
  std::size_t n = 1;
  for (auto d : shape) n *= std::size_t(d);
  return n;
}

KILN_COMPILED std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

KILN_COMPILED SafetensorsFile SafetensorsFile::open(const std::string& path) {
  return parse(data::read_raw_file(path), path);
}

KILN_COMPILED SafetensorsFile SafetensorsFile::parse(std::vector<std::uint8_t> bytes, std::string name) {
  SafetensorsFile f;
  f.name_ = std::move(name);
  f.bytes_ = std::move(bytes);
  f.validate();
  return f;
}

KILN_COMPILED const TensorInfo* SafetensorsFile::find(const std::string& tensor) const {
  auto it = index_.find(tensor);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

KILN_COMPILED const TensorInfo& SafetensorsFile::info(const std::string& tensor) const {
  const TensorInfo* t = find(tensor);
  if (t == nullptr) fail("has no tensor named \"", tensor, "\"");
  return *t;
}

KILN_COMPILED void SafetensorsFile::read(const std::string& tensor, dtype type,
                                         const std::vector<std::int64_t>& expected_shape, void* dst) const {
  const TensorInfo& t = info(tensor);
  check(t, type, expected_shape);
  const auto b = bytes(t);
  if (!b.empty()) std::memcpy(dst, b.data(), b.size());
}

KILN_COMPILED void SafetensorsFile::check(const TensorInfo& t, dtype type,
                                          const std::vector<std::int64_t>& expected_shape) const {
  if (t.dtype != safetensors_name(type))
    fail("tensor \"", t.name, "\": expected dtype ", safetensors_name(type), ", found ", t.dtype);
  if (t.shape != expected_shape)
    fail("tensor \"", t.name, "\": expected shape ", shape_text(expected_shape), ", found ", shape_text(t.shape));
}

KILN_COMPILED std::uint64_t SafetensorsFile::read_u64_le(const std::uint8_t* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

KILN_COMPILED void SafetensorsFile::validate() {
  const std::uint64_t size = bytes_.size();
  if (size < 8)
    fail("truncated: ", size, " bytes, but a safetensors file starts with an 8-byte header length");
  const std::uint64_t n = read_u64_le(bytes_.data());
  if (n > max_header_bytes) fail_at(0, "header length ", n, " is over the format's limit of ", max_header_bytes);
  if (n > size - 8)
    fail_at(0, "header length ", n, " runs past the end of the file (", size, " bytes): truncated or not safetensors");
  data_start_ = std::size_t(8 + n);
  const std::string_view header(reinterpret_cast<const char*>(bytes_.data()) + 8, std::size_t(n));
  if (header.empty() || header[0] != '{') fail_at(8, "the header is not a JSON object (does not start with '{')");
  const JsonValue root = parse_json(header, name_ + ": header (from byte offset 8)");
  if (root.type != JsonValue::Type::object) fail_at(8, "the header is not a JSON object");
  const std::uint64_t data_size = size - 8 - n;
  for (const auto& [key, v] : root.members) {
    if (key == "__metadata__") {
      read_metadata(v);
      continue;
    }
    tensors_.push_back(read_entry(key, v, data_size));
    index_[key] = tensors_.size() - 1;
  }
  check_layout(data_size);
  if (has_checksum()) verify_checksum();
}

KILN_COMPILED void SafetensorsFile::read_metadata(const JsonValue& v) {
  if (v.type != JsonValue::Type::object) fail("__metadata__ is ", json_type_name(v.type), ", not an object");
  for (const auto& [k, s] : v.members) {
    if (s.type != JsonValue::Type::string)
      fail("__metadata__ \"", k, "\" is ", json_type_name(s.type), "; metadata values are strings");
    metadata_[k] = s.string;
  }
}

KILN_COMPILED TensorInfo SafetensorsFile::read_entry(const std::string& key, const JsonValue& v,
                                                     std::uint64_t data_size) const {
  if (v.type != JsonValue::Type::object) fail("tensor \"", key, "\": its entry is ", json_type_name(v.type));
  TensorInfo t;
  t.name = key;
  const JsonValue* type = v.find("dtype");
  const JsonValue* shape = v.find("shape");
  const JsonValue* offsets = v.find("data_offsets");
  if (type == nullptr || type->type != JsonValue::Type::string) fail("tensor \"", key, "\": no dtype string");
  if (shape == nullptr || shape->type != JsonValue::Type::array) fail("tensor \"", key, "\": no shape array");
  if (offsets == nullptr || offsets->type != JsonValue::Type::array || offsets->items.size() != 2 ||
      !non_negative_int(offsets->items[0]) || !non_negative_int(offsets->items[1]))
    fail("tensor \"", key, "\": data_offsets must be two non-negative integers [begin, end]");
  t.dtype = type->string;
  std::size_t item = 0;
  for (const auto& d : safetensors_dtypes)
    if (t.dtype == d.name) item = d.bytes;
  if (item == 0) fail("tensor \"", key, "\": unknown dtype \"", t.dtype, "\"");
  // The byte count the shape implies, refusing products that overflow (a header could
  // otherwise make a huge shape look like a small one).
  std::uint64_t count = item;
  for (const JsonValue& d : shape->items) {
    if (!non_negative_int(d)) fail("tensor \"", key, "\": shape entries must be non-negative integers");
    const auto dim = std::uint64_t(d.integer);
    if (dim != 0 && count > UINT64_MAX / dim) fail("tensor \"", key, "\": shape ", "overflows 64-bit sizes");
    count *= dim;
    t.shape.push_back(d.integer);
  }
  t.begin = std::uint64_t(offsets->items[0].integer);
  t.end = std::uint64_t(offsets->items[1].integer);
  if (t.begin > t.end) fail("tensor \"", key, "\": data_offsets [", t.begin, ", ", t.end, "] run backwards");
  if (t.end > data_size)
    fail("tensor \"", key, "\": data_offsets [", t.begin, ", ", t.end, "] run past the ", data_size,
         " bytes of data (file truncated?)");
  if (t.end - t.begin != count)
    fail("tensor \"", key, "\": ", t.dtype, " ", shape_text(t.shape), " needs ", count, " bytes but data_offsets [",
         t.begin, ", ", t.end, "] hold ", t.end - t.begin);
  return t;
}

KILN_COMPILED void SafetensorsFile::check_layout(std::uint64_t data_size) const {
  std::vector<const TensorInfo*> order;
  for (const auto& t : tensors_) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  std::uint64_t at = 0;
  const TensorInfo* prev = nullptr;
  for (const TensorInfo* t : order) {
    if (t->begin < at)
      fail("tensor \"", t->name, "\": data_offsets [", t->begin, ", ", t->end, "] overlap \"", prev->name, "\" [",
           prev->begin, ", ", prev->end, "]");
    if (t->begin > at) fail("data bytes [", at, ", ", t->begin, ") belong to no tensor (before \"", t->name, "\")");
    at = t->end;
    prev = t;
  }
  if (at != data_size) fail("data bytes [", at, ", ", data_size, ") after the last tensor belong to no tensor");
}

KILN_COMPILED void SafetensorsFile::verify_checksum() const {
  const std::string& want = metadata_.at(checksum_key);
  const std::uint32_t got = crc32c(bytes_.data() + data_start_, bytes_.size() - data_start_);
  char hex[16];
  std::snprintf(hex, sizeof hex, "%08x", got);
  if (want != hex)
    fail("checksum mismatch: the data's CRC-32C is ", hex, " but the header records ", want,
         " (the file is corrupted)");
}

KILN_COMPILED void SafetensorsWriter::add(std::string name, dtype type, std::vector<std::int64_t> shape,
                                          std::span<const std::uint8_t> bytes) {
  std::size_t count = size_of(type);
  for (auto d : shape) count *= std::size_t(d);
  KILN_CHECK(count == bytes.size(), ValueError, "SafetensorsWriter::add(\"", name, "\"): ", safetensors_name(type), " ",
             shape_text(shape), " needs ", count, " bytes, got ", bytes.size());
  for (const auto& e : entries_)
    KILN_CHECK(e.info.name != name, ValueError, "SafetensorsWriter::add: the name \"", name,
               "\" is already in the file");
  TensorInfo info{std::move(name), safetensors_name(type), std::move(shape), data_.size(), data_.size() + bytes.size()};
  data_.insert(data_.end(), bytes.begin(), bytes.end());
  entries_.push_back({std::move(info)});
}

KILN_COMPILED std::vector<std::uint8_t> SafetensorsWriter::serialize() const {
  auto meta = metadata_;
  char hex[16];
  std::snprintf(hex, sizeof hex, "%08x", crc32c(data_.data(), data_.size()));
  meta[checksum_key] = hex;
  // Appended piece by piece: GCC 12 warns falsely (-Wrestrict) on `"," + std::string`.
  std::string h = "{\"__metadata__\":{";
  bool first = true;
  for (const auto& [k, v] : meta) {
    if (!first) h += ',';
    h.append(json_quote(k)).append(":").append(json_quote(v));
    first = false;
  }
  h += '}';
  for (const auto& e : entries_) {
    h.append(",").append(json_quote(e.info.name)).append(":{\"dtype\":\"");
    h.append(e.info.dtype).append("\",\"shape\":[");
    for (std::size_t i = 0; i < e.info.shape.size(); ++i) {
      if (i) h += ',';
      h.append(std::to_string(e.info.shape[i]));
    }
    h.append("],\"data_offsets\":[").append(std::to_string(e.info.begin)).append(",");
    h.append(std::to_string(e.info.end)).append("]}");
  }
  h += '}';
  while ((8 + h.size()) % 8 != 0) h += ' ';
  // One allocation filled by memcpy (vector::insert after a sized vector draws GCC 12's false
  // -Warray-bounds).
  std::vector<std::uint8_t> out(8 + h.size() + data_.size());
  const std::uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out[std::size_t(i)] = std::uint8_t(n >> (8 * i));
  std::memcpy(out.data() + 8, h.data(), h.size());
  if (!data_.empty()) std::memcpy(out.data() + 8 + h.size(), data_.data(), data_.size());
  return out;
}

KILN_COMPILED void SafetensorsWriter::write(const std::string& path) const {
  const auto bytes = serialize();
  write_file_atomically(path, bytes);
}

}  // namespace kiln::io
