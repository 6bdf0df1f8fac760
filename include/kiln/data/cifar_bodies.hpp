// kiln/data/cifar_bodies.hpp — the bodies of cifar.hpp's functions: included by it when kiln
// is header-only, compiled once into kiln::kernels otherwise (KILN_COMPILED, kiln/config.hpp).
#pragma once

#include "kiln/data/cifar.hpp"

namespace kiln::data {

KILN_COMPILED std::vector<std::string> cifar10_file_names(bool train) {
  if (!train) return {"test_batch.bin"};
  std::vector<std::string> names;
  for (int i = 1; i <= 5; ++i) names.push_back("data_batch_" + std::to_string(i) + ".bin");
  return names;
}

KILN_COMPILED Dataset detail::cifar10_empty() {
  Dataset ds;
  ds.d = cifar10_image_bytes;
  ds.num_classes = cifar10_num_classes;
  ds.sample_shape = {cifar10_channels, cifar10_side, cifar10_side};
  return ds;
}

KILN_COMPILED void detail::append_cifar10(std::span<const std::uint8_t> bytes, const std::string& name,
                                          Dataset& out) {
  const auto size = static_cast<std::uint64_t>(bytes.size());
  const auto record = static_cast<std::uint64_t>(cifar10_record_bytes);
  if (size == 0)
    throw_data_error(name, 0, "empty file: a CIFAR-10 file holds records of ", record,
                     " bytes (1 label + 3,072 pixels)");
  if (const std::uint64_t trailing = size % record; trailing != 0)
    throw_data_error(name, size - trailing, "file size ", size, " is not a whole number of ",
                     record, "-byte CIFAR-10 records: ", size / record, " records and ", trailing,
                     " trailing bytes");
  const auto n = static_cast<index_t>(size / record);
  for (index_t i = 0; i < n; ++i) {
    const std::uint8_t y = bytes[static_cast<std::size_t>(i * cifar10_record_bytes)];
    if (y >= cifar10_num_classes)
      throw_data_error(name, static_cast<std::uint64_t>(i * cifar10_record_bytes), "label ",
                       unsigned{y}, " of record ", i, " is not below ", cifar10_num_classes,
                       " (is this a CIFAR-10 binary file? CIFAR-100 records are 3,074 bytes)");
  }
  const std::size_t first = out.features.size();
  out.features.resize(first + static_cast<std::size_t>(n * cifar10_image_bytes));
  out.labels.reserve(out.labels.size() + static_cast<std::size_t>(n));
  float* dst = out.features.data() + first;
  for (index_t i = 0; i < n; ++i) {
    const std::uint8_t* src = bytes.data() + i * cifar10_record_bytes;
    out.labels.push_back(src[0]);
    for (index_t k = 0; k < cifar10_image_bytes; ++k) *dst++ = src[1 + k];
  }
  out.n += n;
}

KILN_COMPILED Dataset parse_cifar10(std::span<const std::uint8_t> bytes, const std::string& name) {
  Dataset ds = detail::cifar10_empty();
  detail::append_cifar10(bytes, name, ds);
  return ds;
}

KILN_COMPILED Dataset read_cifar10(const std::filesystem::path& path) {
  return parse_cifar10(read_file(path), path.string());
}

KILN_COMPILED Dataset load_cifar10(const std::filesystem::path& dir, bool train) {
  Dataset ds = detail::cifar10_empty();
  std::vector<std::filesystem::path> paths;
  std::vector<std::vector<std::uint8_t>> files;  // all read first, so features grow only once
  std::size_t total = 0;
  for (const std::string& name : cifar10_file_names(train)) {
    paths.push_back(dir / name);
    files.push_back(read_file(paths.back()));
    total += files.back().size() / static_cast<std::size_t>(cifar10_record_bytes);
  }
  ds.features.reserve(total * static_cast<std::size_t>(cifar10_image_bytes));
  ds.labels.reserve(total);
  for (std::size_t f = 0; f < files.size(); ++f) {
    detail::append_cifar10(files[f], paths[f].string(), ds);
    files[f] = {};  // release each file's bytes once decoded
  }
  return ds;
}

}  // namespace kiln::data
