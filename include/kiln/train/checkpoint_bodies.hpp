// kiln/train/checkpoint_bodies.hpp — the bodies of checkpoint.hpp's non-template helpers: included
// by it when kiln is header-only, compiled once into kiln::kernels otherwise (KILN_COMPILED,
// kiln/config.hpp).
#pragma once

#include "kiln/train/checkpoint.hpp"

namespace kiln::train::detail {

KILN_COMPILED std::vector<std::int64_t> dims_of(const Shape& s) {
  std::vector<std::int64_t> out;
  for (int i = 0; i < s.rank; ++i) out.push_back(std::int64_t(s[i]));
  return out;
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
