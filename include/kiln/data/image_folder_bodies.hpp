// kiln/data/image_folder_bodies.hpp — the bodies of image_folder.hpp's functions: included by it
// when kiln is header-only, compiled once into kiln::kernels otherwise (KILN_COMPILED,
// kiln/config.hpp).
#pragma once

#include "kiln/data/image_folder.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <exception>
#include <fstream>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>

namespace kiln::data {
namespace detail {

namespace fs = std::filesystem;

inline bool is_image_file_name(const std::string& name) {
  std::string lower(name);
  for (char& ch : lower)
    if (ch >= 'A' && ch <= 'Z') ch = static_cast<char>(ch - 'A' + 'a');
  auto ends_with = [&](std::string_view ext) {
    return lower.size() > ext.size() && lower.compare(lower.size() - ext.size(), ext.size(), ext) == 0;
  };
  return ends_with(".jpg") || ends_with(".jpeg") || ends_with(".png");
}

inline bool is_hidden_name(const fs::path& p) {
  const std::string name = p.filename().string();
  return !name.empty() && name[0] == '.';
}

// Deeper than this is a symbolic-link loop rather than a data set.
inline constexpr int image_folder_max_depth = 32;

// Image files under `dir`, sub-folders included, as (folder, file name): sorting these pairs gives
// torchvision's order (os.walk's folders sorted by path, each folder's files by name; byte order).
inline void collect_image_files(const fs::path& dir, int depth, std::vector<std::pair<std::string, std::string>>& out) {
  if (depth > image_folder_max_depth)
    throw DataError(::kiln::detail::concat(dir.string(), ": folders nested more than ", image_folder_max_depth,
                                           " deep (a symbolic-link loop?)"));
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    if (is_hidden_name(entry.path())) continue;
    std::error_code type_ec;
    if (entry.is_directory(type_ec)) {
      collect_image_files(entry.path(), depth + 1, out);
    } else if (entry.is_regular_file(type_ec) && is_image_file_name(entry.path().filename().string())) {
      out.emplace_back(dir.generic_string(), entry.path().filename().string());
    }
  }
  if (ec) throw DataError(::kiln::detail::concat(dir.string(), ": cannot list the folder: ", ec.message()));
}

// The first `limit` bytes of a file (all of it when shorter) and its whole size.
inline std::vector<std::uint8_t> read_file_start(const fs::path& path, std::size_t limit, std::uintmax_t& size) {
  std::error_code ec;
  size = fs::file_size(path, ec);
  if (ec) throw DataError(::kiln::detail::concat(path.string(), ": cannot read: ", ec.message()));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(::kiln::detail::concat(path.string(), ": cannot open"));
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(std::min<std::uintmax_t>(size, limit)));
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  bytes.resize(static_cast<std::size_t>(in.gcount()));
  return bytes;
}

// What scanning checks of one file; throws DataError naming it.
inline void check_image_file(const fs::path& path, ImageCheck check, const DecodeOptions& decode) {
  if (check == ImageCheck::decode) {
    (void)read_image(path, decode);
    return;
  }
  // Headers sit in the first bytes; a JPEG with large metadata blocks first, or a bad file,
  // is read whole to be sure before it is reported.
  constexpr std::size_t head = std::size_t{64} << 10;
  std::uintmax_t size = 0;
  const std::vector<std::uint8_t> start = read_file_start(path, head, size);
  try {
    (void)read_image_info(start, path.string(), decode);
  } catch (const DataError&) {
    if (size <= start.size()) throw;
    (void)read_image_info(read_raw_file(path), path.string(), decode);
  }
}

}  // namespace detail

KILN_COMPILED ImageFolder::ImageFolder(const std::filesystem::path& root, const ImageFolderOptions& options)
    : root_(root), decode_(options.decode) {
  try {
    scan(options);
  } catch (const std::filesystem::filesystem_error& e) {  // a folder changing or vanishing mid-scan
    throw DataError(::kiln::detail::concat(e.path1().string(), ": cannot scan: ", e.code().message()));
  }
}

KILN_COMPILED void ImageFolder::scan(const ImageFolderOptions& options) {
  namespace fs = std::filesystem;
  const fs::path& root = root_;
  const std::string root_name = root.string();
  std::error_code ec;
  if (!fs::exists(root, ec))
    throw DataError(::kiln::detail::concat(root_name, ": no such folder (ImageFolder reads <root>/<class>/<image>)"));
  if (!fs::is_directory(root, ec)) throw DataError(::kiln::detail::concat(root_name, ": is not a folder"));
  for (const fs::directory_entry& entry : fs::directory_iterator(root, ec)) {
    std::error_code type_ec;
    if (!detail::is_hidden_name(entry.path()) && entry.is_directory(type_ec))
      classes_.push_back(entry.path().filename().string());
  }
  if (ec) throw DataError(::kiln::detail::concat(root_name, ": cannot list the folder: ", ec.message()));
  std::sort(classes_.begin(), classes_.end());
  if (classes_.empty())
    throw DataError(::kiln::detail::concat(root_name, ": has no class folders (ImageFolder reads one sub-folder "
                                                      "per class: <root>/<class>/<image>.jpg)"));

  std::vector<std::string> empty;
  for (std::size_t c = 0; c < classes_.size(); ++c) {
    std::vector<std::pair<std::string, std::string>> files;
    detail::collect_image_files(root / classes_[c], 0, files);
    std::sort(files.begin(), files.end());
    if (files.empty()) empty.push_back((root / classes_[c]).string());
    for (const auto& [folder, name] : files) {
      paths_.push_back(fs::path(folder) / name);
      labels_.push_back(static_cast<std::int32_t>(c));
    }
  }
  if (paths_.empty())
    throw DataError(::kiln::detail::concat(root_name, ": no images (.jpg, .jpeg or .png files) in any of its ",
                                           classes_.size(), " class folders"));
  if (!empty.empty()) {
    // The first few by name, then a count: the message stays readable for a wrong root.
    std::string others;
    constexpr std::size_t named = 4;
    for (std::size_t k = 1; k < std::min(empty.size(), named); ++k) others += (k == 1 ? "; also " : ", ") + empty[k];
    if (empty.size() > named) others += ::kiln::detail::concat(" and ", empty.size() - named, " more");
    throw DataError(::kiln::detail::concat(empty[0], ": class folder without images (.jpg, .jpeg or .png files)",
                                           others));
  }

  if (options.check == ImageCheck::none) return;
  // Check every file on a few threads; report in scan order, whatever the timing.
  const std::size_t n = paths_.size();
  std::vector<std::string> problems(n);
  std::atomic<std::size_t> next{0};
  std::exception_ptr failure;
  std::mutex failure_mutex;
  auto work = [&] {
    for (std::size_t i = next++; i < n; i = next++) {
      try {
        detail::check_image_file(paths_[i], options.check, decode_);
      } catch (const DataError& e) {
        problems[i] = e.what();
      } catch (...) {
        std::lock_guard lock(failure_mutex);
        if (!failure) failure = std::current_exception();
      }
    }
  };
  const unsigned hardware = std::max(1u, std::thread::hardware_concurrency());
  const std::size_t threads =
      std::min<std::size_t>(n, options.threads > 0 ? static_cast<std::size_t>(options.threads) : hardware);
  std::vector<std::thread> pool;
  for (std::size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  if (failure) std::rethrow_exception(failure);

  std::vector<std::filesystem::path> kept_paths;
  std::vector<std::int32_t> kept_labels;
  for (std::size_t i = 0; i < n; ++i) {
    if (problems[i].empty()) {
      kept_paths.push_back(std::move(paths_[i]));
      kept_labels.push_back(labels_[i]);
      continue;
    }
    if (!options.skip_bad_files) throw DataError(problems[i]);
    std::fprintf(stderr, "kiln: ImageFolder: skipping %s\n", problems[i].c_str());
    skipped_.push_back(paths_[i]);
  }
  paths_ = std::move(kept_paths);
  labels_ = std::move(kept_labels);
  const std::vector<index_t> counts = class_counts();
  for (std::size_t c = 0; c < counts.size(); ++c)
    if (counts[c] == 0)
      throw DataError(::kiln::detail::concat((root / classes_[c]).string(),
                                             ": class folder without images: every one of its files was skipped "
                                             "(they do not decode)"));
}

KILN_COMPILED std::vector<index_t> ImageFolder::class_counts() const {
  std::vector<index_t> counts(classes_.size(), 0);
  for (std::int32_t y : labels_) ++counts[static_cast<std::size_t>(y)];
  return counts;
}

KILN_COMPILED ImageFolder ImageFolder::subset(std::span<const index_t> indices) const {
  ImageFolder out;
  out.root_ = root_;
  out.classes_ = classes_;
  out.skipped_ = skipped_;
  out.decode_ = decode_;
  for (index_t i : indices) {
    KILN_CHECK(i >= 0 && i < size(), ValueError, "ImageFolder::subset: index ", i, " is outside [0, ", size(), ")");
    out.paths_.push_back(paths_[static_cast<std::size_t>(i)]);
    out.labels_.push_back(labels_[static_cast<std::size_t>(i)]);
  }
  return out;
}

KILN_COMPILED std::pair<std::vector<index_t>, std::vector<index_t>> ImageFolder::split_indices(
    double fraction_for_second, std::uint64_t seed) const {
  KILN_CHECK(fraction_for_second >= 0.0 && fraction_for_second <= 1.0, ValueError,
             "ImageFolder::split: fraction_for_second = ", fraction_for_second, " must be in [0, 1]");
  std::vector<std::vector<index_t>> by_class(classes_.size());
  for (index_t i = 0; i < size(); ++i) by_class[static_cast<std::size_t>(labels_[std::size_t(i)])].push_back(i);
  std::vector<char> second(static_cast<std::size_t>(size()), 0);
  Generator gen(seed);
  for (std::vector<index_t>& members : by_class) {
    gen.shuffle(members);
    const auto n = static_cast<index_t>(members.size());
    index_t k = std::llround(static_cast<double>(n) * fraction_for_second);
    if (n >= 2 && fraction_for_second > 0.0 && fraction_for_second < 1.0) k = std::clamp<index_t>(k, 1, n - 1);
    for (index_t j = 0; j < k; ++j) second[static_cast<std::size_t>(members[std::size_t(j)])] = 1;
  }
  std::pair<std::vector<index_t>, std::vector<index_t>> out;
  for (index_t i = 0; i < size(); ++i) (second[std::size_t(i)] ? out.second : out.first).push_back(i);
  return out;
}

KILN_COMPILED ImageFolderSplit ImageFolder::split(double fraction_for_second, std::uint64_t seed) const {
  const auto [first, second] = split_indices(fraction_for_second, seed);
  return ImageFolderSplit{subset(first), subset(second)};
}

KILN_COMPILED Dataset image_folder_dataset(const ImageFolder& folder, const ImageTransform& transform,
                                           std::uint64_t seed) {
  transform.validate();
  Dataset ds;
  ds.n = folder.size();
  ds.d = transform.features();
  ds.num_classes = folder.num_classes();
  ds.sample_shape = {3, transform.size, transform.size};
  ds.labels = folder.labels();
  auto paths = std::make_shared<const std::vector<std::filesystem::path>>(folder.paths());
  ds.produce = [paths, transform, seed, decode = folder.decode_options()](index_t row, index_t epoch,
                                                                           std::span<float> out) {
    const Image image = read_image((*paths)[static_cast<std::size_t>(row)], decode);
    transform.apply(image, out, seed, static_cast<std::uint64_t>(epoch), static_cast<std::uint64_t>(row));
  };
  return ds;
}

}  // namespace kiln::data
