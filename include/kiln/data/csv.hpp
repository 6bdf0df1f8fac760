// kiln/data/csv.hpp — CSV files of labelled numeric rows (raw or gzip), e.g. UCI's
// letter-recognition: `T,2,8,3,5,1,8,13,0,6,6,10,8,0,8,0,8` (class letter, then 16 integers).
//
// Deliberately small: one delimiter, no quoting, one label column (first or last), every other
// field a finite number. Blank lines are skipped. Every row must have as many fields as the first
// one. Errors are DataError "<file>: line L, byte offset O: ..." with O the offset of the bad
// field in the (decompressed) text, so an editor jumps straight to it.
#pragma once

#include <kiln/config.hpp>
#include <kiln/core/error.hpp>
#include <kiln/data/dataset.hpp>
#include <kiln/data/file.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace kiln::data {

enum class LabelColumn { first, last };
enum class LabelKind {
  integer,  // a class index 0, 1, 2, ...
  letter,   // a single capital letter, A → 0 ... Z → 25
};

struct CsvOptions {
  LabelColumn label_column = LabelColumn::last;
  LabelKind label_kind = LabelKind::integer;
  // 0: 26 for letters, the largest label + 1 for integers. Otherwise a label >= num_classes is
  // an error.
  int num_classes = 0;
  char delimiter = ',';
  index_t skip_lines = 0;  // header lines to ignore before the data

  // UCI letter-recognition: the class letter first, then 16 integer features.
  static CsvOptions letter_recognition() {
    CsvOptions o;
    o.label_column = LabelColumn::first;
    o.label_kind = LabelKind::letter;
    o.num_classes = 26;
    return o;
  }
};

namespace detail {
template <class... Parts>
[[noreturn]] void throw_csv_error(const std::string& file, index_t line, std::size_t offset,
                                  const Parts&... parts) {
  throw DataError(
      ::kiln::detail::concat(file, ": line ", line, ", byte offset ", offset, ": ", parts...));
}

inline std::string_view trim(std::string_view s, std::size_t& offset) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) {
    s.remove_prefix(1);
    ++offset;
  }
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}
}  // namespace detail

// Parses CSV text; `name` is the file name used in errors.
KILN_COMPILED Dataset parse_csv_classification(std::string_view text, const std::string& name,
                                               const CsvOptions& options = {});

// Reads a CSV file, raw or gzip-compressed.
KILN_COMPILED Dataset load_csv_classification(const std::filesystem::path& path,
                                              const CsvOptions& options = {});

}  // namespace kiln::data

#if KILN_HEADER_BODIES
#include "kiln/data/csv_bodies.hpp"
#endif
