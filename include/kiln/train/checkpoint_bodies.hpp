// kiln/train/checkpoint_bodies.hpp — the bodies of checkpoint.hpp's non-template helpers: included
// by it when kiln is header-only, compiled once into kiln::kernels otherwise (KILN_COMPILED,
// kiln/config.hpp).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "kiln/io/crc32c.hpp"
#include "kiln/train/checkpoint.hpp"

namespace kiln::train::detail {

KILN_COMPILED std::vector<std::int64_t> dims_of(const Shape& s) {
  std::vector<std::int64_t> out;
  for (int i = 0; i < s.rank; ++i) out.push_back(std::int64_t(s[i]));
  return out;
}

KILN_COMPILED void add_model_state(io::SafetensorsWriter& w, const io::ModelState& state) {
  for (const auto& t : state.tensors) {
    std::vector<std::uint8_t> bytes(t.bytes);
    t.copy_to_host(bytes.data(), t.data, t.bytes);
    w.add(t.name, t.type, dims_of(t.shape), bytes);
  }
}

KILN_COMPILED void stage_model_state(const io::SafetensorsFile& file, const io::ModelState& state, bool strict,
                                     std::vector<Apply>& apply) {
  std::map<std::string, bool> used;
  std::string missing;
  for (const auto& t : state.tensors) {
    const io::TensorInfo* info = file.find(t.name);
    if (info == nullptr) {
      missing += (missing.empty() ? "" : ", ") + t.name;
      continue;
    }
    used[t.name] = true;
    file.check(*info, t.type, dims_of(t.shape));
    const auto bytes = file.bytes(*info);
    apply.push_back([dst = t.data, copy = t.copy_from_host, bytes] { copy(dst, bytes.data(), bytes.size()); });
  }
  if (!missing.empty())
    file.fail("the model's tensors ", missing, " are not in the file (it holds: ", [&] {
      std::string have;
      for (const auto& t : file.tensors()) have += (have.empty() ? "" : ", ") + t.name;
      return have.empty() ? std::string("no tensors") : have;
    }(), "); a checkpoint of another model?");
  if (strict) {
    std::string extra;
    for (const auto& t : file.tensors())
      if (!used.count(t.name) && t.name.rfind(optimizer_prefix, 0) != 0) extra += (extra.empty() ? "" : ", ") + t.name;
    if (!extra.empty()) file.fail("holds tensors the model does not have: ", extra, "; a checkpoint of another model?");
  }
}

KILN_COMPILED std::vector<std::string> slot_names(const io::ModelState& state, const optim::ParamTable& table) {
  std::map<const void*, std::string> by_pointer;
  for (const auto& t : state.tensors)
    if (t.kind == io::state_kind::parameter) by_pointer[t.data] = t.name;
  std::vector<std::string> out;
  for (index_t k = 0; k < table.count(); ++k) {
    auto it = by_pointer.find(table[k].value);
    KILN_CHECK(it != by_pointer.end(), ValueError, "checkpoint: optimizer parameter ", k,
               " is not a parameter of the model (an optimizer over several models needs one checkpoint per model)");
    out.push_back(it->second);
  }
  return out;
}

KILN_COMPILED std::vector<std::int64_t> shape_of(const io::ModelState& state, const std::string& name) {
  for (const auto& t : state.tensors)
    if (t.name == name) return dims_of(t.shape);
  return {};
}

KILN_COMPILED std::string number_text(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

KILN_COMPILED const std::string& MetaReader::text(const std::string& key) const {
  auto it = file.metadata().find(key);
  if (it == file.metadata().end()) file.fail("metadata \"", key, "\" is missing: not a complete kiln checkpoint");
  return it->second;
}

KILN_COMPILED std::int64_t MetaReader::integer(const std::string& key) const {
  const std::string& s = text(key);
  std::int64_t v = 0;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  if (r.ec != std::errc{} || r.ptr != s.data() + s.size())
    file.fail("metadata \"", key, "\" = \"", s, "\" is not an integer");
  return v;
}

KILN_COMPILED std::uint64_t MetaReader::u64(const std::string& key) const {
  const std::string& s = text(key);
  std::uint64_t v = 0;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  if (r.ec != std::errc{} || r.ptr != s.data() + s.size())
    file.fail("metadata \"", key, "\" = \"", s, "\" is not an unsigned integer");
  return v;
}

KILN_COMPILED double MetaReader::real(const std::string& key) const {
  const std::string& s = text(key);
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size()) file.fail("metadata \"", key, "\" = \"", s, "\" is not a number");
  return v;
}

}  // namespace kiln::train::detail

namespace kiln::train {

KILN_COMPILED std::uint32_t state_checksum(const io::ModelState& state) {
  std::uint32_t crc = 0;
  std::vector<std::uint8_t> bytes;
  for (const auto& t : state.tensors) {
    bytes.resize(t.bytes);
    t.copy_to_host(bytes.data(), t.data, t.bytes);
    crc = io::crc32c(bytes.data(), bytes.size(), crc);
  }
  return crc;
}

}  // namespace kiln::train
