// kiln/data/csv_bodies.hpp — the bodies of csv.hpp's functions: included by it when kiln
// is header-only, compiled once into kiln::kernels otherwise (KILN_COMPILED, kiln/config.hpp).
#pragma once

#include "kiln/data/csv.hpp"

namespace kiln::data {

KILN_COMPILED Dataset parse_csv_classification(std::string_view text, const std::string& name,
                                               const CsvOptions& options) {
  KILN_CHECK(options.num_classes >= 0, ValueError,
             "CsvOptions: num_classes = ", options.num_classes, " must not be negative");
  Dataset ds;
  std::size_t fields_expected = 0;  // set by the first data row
  index_t first_data_line = 0;
  index_t line = 0;
  std::int32_t max_label = -1;
  std::vector<std::string_view> fields;
  std::vector<std::size_t> field_offsets;
  std::size_t pos = 0;
  while (pos < text.size()) {
    ++line;
    const std::size_t line_start = pos;
    std::size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    pos = end + 1;
    if (line <= options.skip_lines) continue;
    std::size_t content_offset = line_start;
    if (detail::trim(text.substr(line_start, end - line_start), content_offset).empty()) continue;

    fields.clear();
    field_offsets.clear();
    for (std::size_t f = line_start;;) {
      std::size_t stop = text.find(options.delimiter, f);
      if (stop == std::string_view::npos || stop > end) stop = end;
      std::size_t at = f;
      fields.push_back(detail::trim(text.substr(f, stop - f), at));
      field_offsets.push_back(at);
      if (stop == end) break;
      f = stop + 1;
    }
    if (fields_expected == 0) {
      if (fields.size() < 2)
        detail::throw_csv_error(name, line, line_start,
                                "a row needs a label and at least one "
                                "feature, found ",
                                fields.size(), " field");
      fields_expected = fields.size();
      first_data_line = line;
      ds.d = static_cast<index_t>(fields.size() - 1);
    } else if (fields.size() != fields_expected) {
      detail::throw_csv_error(name, line, line_start, fields.size(), " fields, expected ",
                              fields_expected, " (as on line ", first_data_line, ")");
    }

    const std::size_t label_at = options.label_column == LabelColumn::first ? 0 : fields.size() - 1;
    const std::string_view label_text = fields[label_at];
    std::int32_t label = -1;
    if (options.label_kind == LabelKind::letter) {
      if (label_text.size() != 1 || label_text[0] < 'A' || label_text[0] > 'Z')
        detail::throw_csv_error(name, line, field_offsets[label_at], "label '", label_text,
                                "' is not a single capital letter A-Z");
      label = label_text[0] - 'A';
    } else {
      const auto [ptr, ec] =
          std::from_chars(label_text.data(), label_text.data() + label_text.size(), label);
      if (ec != std::errc{} || ptr != label_text.data() + label_text.size() || label < 0)
        detail::throw_csv_error(name, line, field_offsets[label_at], "label '", label_text,
                                "' is not a non-negative integer");
    }
    const int limit = options.num_classes > 0                   ? options.num_classes
                      : options.label_kind == LabelKind::letter ? 26
                                                                : 0;
    if (limit > 0 && label >= limit)
      detail::throw_csv_error(name, line, field_offsets[label_at], "label ", label_text,
                              " is not below num_classes = ", limit);
    max_label = std::max(max_label, label);
    ds.labels.push_back(label);

    for (std::size_t j = 0; j < fields.size(); ++j) {
      if (j == label_at) continue;
      std::string_view v = fields[j];
      if (!v.empty() && v.front() == '+') v.remove_prefix(1);  // from_chars rejects a '+' sign
      float x = 0.0f;
      const auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
      if (v.empty() || ec != std::errc{} || ptr != v.data() + v.size() || !std::isfinite(x))
        detail::throw_csv_error(name, line, field_offsets[j], "field ", j + 1, " '", fields[j],
                                "' is not a finite number");
      ds.features.push_back(x);
    }
  }
  if (fields_expected == 0)
    detail::throw_csv_error(name, line == 0 ? 1 : line, text.size(),
                            text.empty() ? "file is empty" : "file has no data rows");
  ds.n = static_cast<index_t>(ds.labels.size());
  ds.num_classes = options.num_classes > 0                   ? options.num_classes
                   : options.label_kind == LabelKind::letter ? 26
                                                             : max_label + 1;
  ds.sample_shape = {ds.d};
  return ds;
}

KILN_COMPILED Dataset load_csv_classification(const std::filesystem::path& path,
                                              const CsvOptions& options) {
  const std::vector<std::uint8_t> bytes = read_file(path);
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  return parse_csv_classification(text, path.string(), options);
}

}  // namespace kiln::data
