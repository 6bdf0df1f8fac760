// tests/cpu/fixture.hpp — reads the golden fixture files written by scripts/golden_*.py.
//
// Format (scripts/README.md): `#` lines are comments; every other pair of lines is one block, a
// header `name rank dim0 dim1 ...` and then all values in row-major order on one line. Values are
// read as double (integers and `-0` included), so float64 references round-trip exactly.
//
//   const kiln_test::Fixture& f = kiln_test::golden_ops();
//   const auto& p = f.at("sgd.p");   // p.dims == {3, 5}, p.values.size() == 15
#pragma once

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#ifndef KILN_SOURCE_DIR
#error "the build defines KILN_SOURCE_DIR (the repository root) so tests find tests/fixtures/"
#endif

namespace kiln_test {

struct FixtureBlock {
  std::vector<std::int64_t> dims;  // empty for a scalar
  std::vector<double> values;      // row-major, product(dims) entries
};

using Fixture = std::map<std::string, FixtureBlock>;

// Reads a whole fixture file. Throws std::runtime_error naming the file and line when the file is
// missing or malformed (a value count that does not match the dims, a duplicate name, ...).
inline Fixture load_fixture(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open fixture " + path);
  auto fail = [&](int line, const std::string& why) {
    throw std::runtime_error(path + ":" + std::to_string(line) + ": " + why);
  };
  Fixture out;
  std::string header, values;
  int line = 0;
  while (std::getline(in, header)) {
    ++line;
    if (header.empty() || header[0] == '#') continue;
    std::istringstream h(header);
    std::string name;
    int rank = -1;
    if (!(h >> name >> rank) || rank < 0) fail(line, "expected `name rank dims...`, got `" + header + "`");
    FixtureBlock block;
    std::int64_t count = 1;
    for (int i = 0; i < rank; ++i) {
      std::int64_t d = -1;
      if (!(h >> d) || d < 0) fail(line, "block " + name + " needs " + std::to_string(rank) + " dims >= 0");
      block.dims.push_back(d);
      count *= d;
    }
    if (!std::getline(in, values)) fail(line, "block " + name + " has no value line");
    ++line;
    // from_chars: exact round-trip and no dependence on the C locale's decimal point.
    const char* p = values.data();
    const char* end = p + values.size();
    while (p < end) {
      while (p < end && (*p == ' ' || *p == '\r')) ++p;
      if (p == end) break;
      double v = 0;
      const auto [next, ec] = std::from_chars(p, end, v);
      if (ec != std::errc()) fail(line, "block " + name + ": bad number near `" + std::string(p, std::min<std::size_t>(20, std::size_t(end - p))) + "`");
      block.values.push_back(v);
      p = next;
    }
    if (std::int64_t(block.values.size()) != count)
      fail(line, "block " + name + " has " + std::to_string(block.values.size()) + " values, its dims need " +
                     std::to_string(count));
    if (!out.emplace(name, std::move(block)).second) fail(line, "duplicate block " + name);
  }
  return out;
}

// A file under tests/fixtures/ of the source tree.
inline std::string fixture_path(const std::string& file) {
  return std::string(KILN_SOURCE_DIR) + "/tests/fixtures/" + file;
}

// tests/fixtures/golden_ops.txt, read once per test binary.
inline const Fixture& golden_ops() {
  static const Fixture f = load_fixture(fixture_path("golden_ops.txt"));
  return f;
}

// tests/fixtures/golden_mlp.txt, read once per test binary.
inline const Fixture& golden_mlp() {
  static const Fixture f = load_fixture(fixture_path("golden_mlp.txt"));
  return f;
}

}  // namespace kiln_test
