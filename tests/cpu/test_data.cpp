// Data readers: the real digits20 and letter-recognition files, and one malformed file per error
// the readers promise to report (checking the error type, the file name and the offset).
#include <kiln/data/csv.hpp>
#include <kiln/data/dataset.hpp>
#include <kiln/data/file.hpp>
#include <kiln/data/idx.hpp>
#include <kiln/data/normalize.hpp>

#include <doctest/doctest.h>

#include "data_helpers.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <vector>

#if KILN_HAVE_ZLIB
#include <zlib.h>
#endif

#ifndef KILN_SOURCE_DIR
#error "the build defines KILN_SOURCE_DIR (the repository root) so tests find data/"
#endif

namespace fs = std::filesystem;
using kiln::index_t;
using kiln_test::Bytes;
using kiln_test::check_data_error;
#if KILN_HAVE_ZLIB
using kiln_test::gzip;
#endif

namespace {

fs::path data_file(const char* name) { return fs::path(KILN_SOURCE_DIR) / "data" / name; }

// A fresh directory per test run, removed at exit, so concurrent runs do not collide.
const fs::path& temp_dir() {
  static const struct Dir {
    fs::path path;
    Dir() {
      const auto stamp = std::chrono::steady_clock::now().time_since_epoch().count();
      path = fs::temp_directory_path() / ("kiln_test_data_" + std::to_string(stamp));
      fs::create_directories(path);
    }
    ~Dir() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  } dir;
  return dir.path;
}

fs::path write_file(const std::string& name, const Bytes& bytes) { return kiln_test::write_bytes(temp_dir() / name, bytes); }
fs::path write_text(const std::string& name, const std::string& text) {
  return write_file(name, Bytes(text.begin(), text.end()));
}


void append_be32(Bytes& b, std::uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) b.push_back(static_cast<std::uint8_t>(v >> shift));
}
Bytes idx_header(std::uint8_t type, std::initializer_list<std::uint32_t> dims) {
  Bytes b{0, 0, type, static_cast<std::uint8_t>(dims.size())};
  for (std::uint32_t d : dims) append_be32(b, d);
  return b;
}


void check_idx_error(const std::string& name, const Bytes& bytes,
                     std::initializer_list<std::string> parts) {
  const fs::path path = write_file(name, bytes);
  check_data_error([&] { kiln::data::read_idx(path); }, path, parts);
}

}  // namespace

TEST_CASE("digits20: 4000 train / 1000 test images of 20x20 with balanced labels") {
  if (!kiln::data::have_zlib) {  // the repository keeps them gzip-compressed
    const auto path = data_file("digits20-test-labels-idx1-ubyte.gz");
    check_data_error([&] { kiln::data::read_idx(path); }, path, {"requires zlib"});
    return;
  }
  const auto train =
      kiln::data::load_idx_classification(data_file("digits20-train-images-idx3-ubyte.gz"),
                                          data_file("digits20-train-labels-idx1-ubyte.gz"), 10);
  const auto test =
      kiln::data::load_idx_classification(data_file("digits20-test-images-idx3-ubyte.gz"),
                                          data_file("digits20-test-labels-idx1-ubyte.gz"), 10);
  CHECK(train.n == 4000);
  CHECK(test.n == 1000);
  for (const auto* ds : {&train, &test}) {
    CHECK(ds->d == 400);
    CHECK(ds->num_classes == 10);
    CHECK(ds->sample_shape == std::vector<index_t>{20, 20});
    CHECK(ds->features.size() == static_cast<std::size_t>(ds->n * 400));
    CHECK_NOTHROW(ds->validate());
    const auto [lo, hi] = std::minmax_element(ds->features.begin(), ds->features.end());
    CHECK(*lo == 0.0f);
    CHECK(*hi == 255.0f);
  }
  for (index_t c : train.class_counts()) CHECK(c == 400);
  for (index_t c : test.class_counts()) CHECK(c == 100);
}

TEST_CASE("IDX: a raw file reads the same as its gzip original") {
  const Bytes packed = kiln::data::read_raw_file(data_file("digits20-test-labels-idx1-ubyte.gz"));
  REQUIRE(kiln::data::is_gzip(packed));
  if (!kiln::data::have_zlib) {
    check_data_error([&] { kiln::data::gunzip(packed, "x.gz"); }, "x.gz", {"requires zlib"});
    return;
  }
  const Bytes raw = kiln::data::gunzip(packed, "labels.gz");
  CHECK(raw.size() == 8 + 1000);
  const auto path = write_file("labels-raw-idx1-ubyte", raw);
  const auto a = kiln::data::read_idx(path);
  const auto b = kiln::data::read_idx(data_file("digits20-test-labels-idx1-ubyte.gz"));
  CHECK(a.dims == std::vector<index_t>{1000});
  CHECK(a.header_bytes == 8);
  CHECK(a.data == b.data);
}

TEST_CASE("IDX: every malformed header or body is a DataError with file and offset") {
  check_idx_error("empty.idx", {}, {"byte offset 0", "truncated IDX header"});
  check_idx_error("short-magic.idx", {0, 0}, {"byte offset 2", "truncated IDX header"});
  check_idx_error("bad-magic.idx", {0x12, 0x34, 0x08, 0x01, 0, 0, 0, 1, 7},
                  {"byte offset 0", "bad IDX magic"});
  check_idx_error("float-type.idx", {0, 0, 0x0d, 0x01, 0, 0, 0, 1, 0, 0, 0, 0},
                  {"byte offset 2", "unsupported IDX element type 0xd"});
  check_idx_error("zero-ndim.idx", {0, 0, 0x08, 0x00}, {"byte offset 3", "zero dimensions"});
  // Three dimensions need 16 header bytes; the file stops after 10.
  Bytes short_dims = idx_header(0x08, {2, 2, 2});
  short_dims.resize(10);
  check_idx_error("short-dims.idx", short_dims, {"byte offset 10", "need 16 header bytes"});
  Bytes short_data = idx_header(0x08, {2, 2, 2});
  short_data.insert(short_data.end(), 5, 1);  // 8 needed
  check_idx_error("short-data.idx", short_data, {"byte offset 21", "truncated IDX data", "need 8"});
  Bytes trailing = idx_header(0x08, {3});
  trailing.insert(trailing.end(), {1, 2, 3, 9, 9});
  check_idx_error("trailing.idx", trailing, {"byte offset 11", "2 trailing bytes"});
  check_idx_error("zero-dim.idx", idx_header(0x08, {4, 0, 5}),
                  {"byte offset 8", "dimension 1 is 0"});
  check_idx_error("negative-dim.idx", idx_header(0x08, {0xffffffffu}),
                  {"byte offset 4", "dimension 0 is -1"});
  check_idx_error("overflow-dims.idx", idx_header(0x08, {0x7fffffff, 0x7fffffff, 0x7fffffff}),
                  {"byte offset 12", "overflow"});
  const fs::path missing = temp_dir() / "does-not-exist.idx";
  check_data_error([&] { kiln::data::read_idx(missing); }, missing, {"cannot open"});
  // A directory opens as a stream on Linux: it must be named, not read (it once was a bad_alloc).
  check_data_error([&] { kiln::data::read_idx(temp_dir()); }, temp_dir(), {"is a directory"});
}

// Skipped, and counted as skipped, in a build without zlib.
TEST_CASE("gzip: truncated, corrupt or padded streams are DataErrors naming the file" *
          doctest::skip(!kiln::data::have_zlib)) {
  const Bytes packed = kiln::data::read_raw_file(data_file("digits20-train-labels-idx1-ubyte.gz"));
  Bytes cut(packed.begin(), packed.begin() + static_cast<std::ptrdiff_t>(packed.size() / 2));
  const fs::path cut_path = write_file("cut-idx1-ubyte.gz", cut);
  check_data_error([&] { kiln::data::read_idx(cut_path); }, cut_path,
                   {"byte offset " + std::to_string(cut.size()), "truncated"});

  Bytes corrupt = packed;
  for (std::size_t i = 30; i < 60; ++i) corrupt[i] ^= 0x5a;
  const fs::path corrupt_path = write_file("corrupt-idx1-ubyte.gz", corrupt);
  check_data_error([&] { kiln::data::read_idx(corrupt_path); }, corrupt_path,
                   {"byte offset", "corrupt gzip data"});

  Bytes padded = packed;
  padded.insert(padded.end(), {0, 0, 0});
  const fs::path padded_path = write_file("padded-idx1-ubyte.gz", padded);
  check_data_error([&] { kiln::data::read_idx(padded_path); }, padded_path,
                   {"byte offset " + std::to_string(packed.size()), "after the end of the gzip"});

  // Two members, as `cat a.gz b.gz` makes, are one stream.
#if KILN_HAVE_ZLIB
  const Bytes part1 = idx_header(0x08, {4}), part2{1, 2, 3, 4};
  Bytes two = gzip(part1);
  const Bytes second = gzip(part2);
  two.insert(two.end(), second.begin(), second.end());
  const auto joined = kiln::data::read_idx(write_file("two-members.gz", two));
  CHECK(joined.data == part2);
#endif
}

TEST_CASE("load_idx_classification checks counts and label range") {
  Bytes images = idx_header(0x08, {4, 2, 3});
  for (int i = 0; i < 24; ++i) images.push_back(static_cast<std::uint8_t>(i * 10));
  Bytes labels = idx_header(0x08, {4});
  labels.insert(labels.end(), {0, 2, 1, 2});
  const auto images_path = write_file("small-images", images);
  const auto labels_path = write_file("small-labels", labels);

  const auto ds = kiln::data::load_idx_classification(images_path, labels_path, 3);
  CHECK(ds.n == 4);
  CHECK(ds.d == 6);
  CHECK(ds.sample_shape == std::vector<index_t>{2, 3});
  CHECK(ds.labels == std::vector<std::int32_t>{0, 2, 1, 2});
  CHECK(ds.features[7] == 70.0f);

  // Label 2 of sample 1 sits at byte 8 + 1 = 9.
  check_data_error([&] { kiln::data::load_idx_classification(images_path, labels_path, 2); },
                   labels_path, {"byte offset 9", "label 2", "sample 1"});

  Bytes five = idx_header(0x08, {5});
  five.insert(five.end(), {0, 0, 0, 0, 0});
  const auto five_path = write_file("five-labels", five);
  check_data_error([&] { kiln::data::load_idx_classification(images_path, five_path, 3); },
                   five_path, {"byte offset 4", "5 labels", "4 images", images_path.string()});

  // Image and label files swapped: the shapes say so.
  check_data_error([&] { kiln::data::load_idx_classification(labels_path, images_path, 3); },
                   labels_path, {"byte offset 3", "at least 2 dimensions"});
  check_data_error([&] { kiln::data::load_idx_classification(images_path, images_path, 3); },
                   images_path, {"byte offset 3", "labels need exactly 1 dimension (n), file has 3"});
  CHECK_THROWS_AS(kiln::data::load_idx_classification(images_path, labels_path, 0),
                  kiln::ValueError);
}

// gzip-compressed: skipped without zlib (whose error is checked above).
TEST_CASE("letter-recognition: 20000 rows, 16 features, 26 classes" * doctest::skip(!kiln::data::have_zlib)) {
  const auto ds = kiln::data::load_csv_classification(data_file("letter-recognition.data.gz"),
                                                      kiln::data::CsvOptions::letter_recognition());
  CHECK(ds.n == 20000);
  CHECK(ds.d == 16);
  CHECK(ds.num_classes == 26);
  CHECK_NOTHROW(ds.validate());
  // The first line is `T,2,8,3,5,1,8,13,0,6,6,10,8,0,8,0,8`.
  CHECK(ds.labels[0] == 'T' - 'A');
  const std::vector<float> first(ds.features.begin(), ds.features.begin() + 16);
  CHECK(first == std::vector<float>{2, 8, 3, 5, 1, 8, 13, 0, 6, 6, 10, 8, 0, 8, 0, 8});
  index_t total = 0;
  for (index_t c : ds.class_counts()) {
    CHECK(c > 600);
    total += c;
  }
  CHECK(total == 20000);
}

TEST_CASE("CSV: label last or first, integer or letter, CRLF, blank lines, header, gzip") {
  const std::string text = "id,a,b,label\r\n1, 2.5 ,3,1\r\n\r\n-4,5e-1,+6,0\r\n7,8,9,2\r\n\r\n";
  const auto path = write_text("int-last.csv", text);
  kiln::data::CsvOptions options;
  options.skip_lines = 1;
  const auto ds = kiln::data::load_csv_classification(path, options);
  CHECK(ds.n == 3);
  CHECK(ds.d == 3);
  CHECK(ds.num_classes == 3);  // largest label + 1
  CHECK(ds.labels == std::vector<std::int32_t>{1, 0, 2});
  CHECK(ds.features == std::vector<float>{1, 2.5f, 3, -4, 0.5f, 6, 7, 8, 9});

  const std::string letters = "B,1,2\nZ,3,4\n";
  const auto lds = kiln::data::parse_csv_classification(
      letters, "mem", kiln::data::CsvOptions::letter_recognition());
  CHECK(lds.labels == std::vector<std::int32_t>{1, 25});
  CHECK(lds.num_classes == 26);

#if KILN_HAVE_ZLIB
  const auto gz_path = write_file("int-last.csv.gz", gzip(Bytes(text.begin(), text.end())));
  const auto gz = kiln::data::load_csv_classification(gz_path, options);
  CHECK(gz.features == ds.features);
  CHECK(gz.labels == ds.labels);
#endif
}

TEST_CASE("CSV: malformed rows are DataErrors naming file, line and byte offset") {
  const auto letters = kiln::data::CsvOptions::letter_recognition();
  auto check_csv = [](const std::string& name, const std::string& text,
                      const kiln::data::CsvOptions& options,
                      std::initializer_list<std::string> parts) {
    const fs::path path = write_text(name, text);
    check_data_error([&] { kiln::data::load_csv_classification(path, options); }, path, parts);
  };
  // Line 3 starts at byte 12 and has one field too few.
  check_csv("short-row.csv", "A,1,2\nB,3,4\nC,5\n", letters,
            {"line 3, byte offset 12", "2 fields, expected 3"});
  check_csv("long-row.csv", "A,1,2\nB,3,4,5\n", letters, {"line 2, byte offset 6", "4 fields"});
  // "x7" is field 3 of line 2, at byte 6 + 4 = 10.
  check_csv("text-field.csv", "A,1,2\nB,3,x7\n", letters,
            {"line 2, byte offset 10", "field 3 'x7' is not a finite number"});
  check_csv("empty-field.csv", "A,1,2\nB,,2\n", letters, {"line 2, byte offset 8", "field 2"});
  check_csv("inf-field.csv", "A,1,inf\n", letters, {"line 1, byte offset 4", "finite"});
  check_csv("bad-letter.csv", "A,1,2\nb,3,4\n", letters, {"line 2, byte offset 6", "label 'b'"});
  check_csv("two-letters.csv", "AB,1,2\n", letters, {"line 1, byte offset 0", "capital letter"});
  check_csv("empty.csv", "", letters, {"line 1, byte offset 0", "empty"});
  check_csv("blank.csv", "\n  \n", letters, {"line 2, byte offset 4", "no data rows"});
  check_csv("one-field.csv", "7\n", {}, {"line 1, byte offset 0", "at least one feature"});

  kiln::data::CsvOptions ints;
  check_csv("neg-label.csv", "1,2,0\n1,2,-1\n", ints, {"line 2, byte offset 10", "label '-1'"});
  check_csv("frac-label.csv", "1,2,0.5\n", ints, {"line 1, byte offset 4", "label '0.5'"});
  ints.num_classes = 2;
  check_csv("big-label.csv", "1,2,0\n1,2,2\n", ints,
            {"line 2, byte offset 10", "label 2 is not below num_classes = 2"});
}

TEST_CASE("Dataset: validate, subset and a deterministic (stratified) split") {
  kiln::data::Dataset ds;
  ds.n = 100;
  ds.d = 2;
  ds.num_classes = 4;
  for (index_t i = 0; i < ds.n; ++i) {
    ds.features.push_back(static_cast<float>(i));
    ds.features.push_back(static_cast<float>(-i));
    ds.labels.push_back(static_cast<std::int32_t>(i < 70 ? 0 : 1 + i % 3));
  }
  CHECK_NOTHROW(ds.validate());

  const std::vector<index_t> rows{5, 2, 5};
  const auto sub = kiln::data::subset(ds, rows);
  CHECK(sub.n == 3);
  CHECK(sub.features == std::vector<float>{5, -5, 2, -2, 5, -5});
  CHECK_THROWS_AS(kiln::data::subset(ds, std::vector<index_t>{100}), kiln::ValueError);

  const auto s1 = kiln::data::split(ds, 30, {.seed = 7});
  const auto s2 = kiln::data::split(ds, 30, {.seed = 7});
  const auto s3 = kiln::data::split(ds, 30, {.seed = 8});
  CHECK(s1.first.n == 30);
  CHECK(s1.second.n == 70);
  CHECK(s1.first.features == s2.first.features);
  CHECK(s1.first.features != s3.first.features);
  // Together the halves hold every row once.
  std::vector<float> ids;
  for (const auto* part : {&s1.first, &s1.second})
    for (index_t i = 0; i < part->n; ++i)
      ids.push_back(part->features[static_cast<std::size_t>(2 * i)]);
  std::sort(ids.begin(), ids.end());
  for (index_t i = 0; i < 100; ++i)
    CHECK(ids[static_cast<std::size_t>(i)] == static_cast<float>(i));

  const auto plain = kiln::data::split(ds, 10, {.shuffle = false});
  CHECK(plain.first.features[0] == 0.0f);
  CHECK(plain.second.features[0] == 10.0f);

  // 30% of 70/10/10/10 → 21/3/3/3.
  const auto strat = kiln::data::split(ds, 30, {.seed = 3, .stratified = true});
  CHECK(strat.first.class_counts() == std::vector<index_t>{21, 3, 3, 3});
  CHECK(strat.second.class_counts() == std::vector<index_t>{49, 7, 7, 7});

  CHECK_THROWS_AS(kiln::data::split(ds, 101), kiln::ValueError);
  ds.labels[3] = 4;
  CHECK_THROWS_AS(ds.validate(), kiln::ValueError);
  ds.labels[3] = 0;
  ds.features.pop_back();
  CHECK_THROWS_AS(ds.validate(), kiln::ValueError);
}

TEST_CASE("normalize: statistics fitted on train are applied unchanged to test") {
  kiln::data::Dataset train, test;
  train.n = 4;
  train.d = 2;
  train.num_classes = 1;
  train.labels.assign(4, 0);
  train.features = {0, 10, 2, 10,
                    4, 10, 6, 10};  // column 0: mean 3, std sqrt(5); column 1 constant
  test = train;
  test.n = 1;
  test.labels.assign(1, 0);
  test.features = {8, 20};

  using kiln::data::Standardize;
  const auto per =
      kiln::data::fit_normalizer(train, {.scale = 0.5f, .standardize = Standardize::per_feature});
  // Scaled column 0 is {0, 1, 2, 3}: mean 1.5, population std sqrt(1.25).
  CHECK(per.mean[0] == doctest::Approx(1.5));
  CHECK(per.inv_std[0] == doctest::Approx(1 / std::sqrt(1.25)));
  CHECK(per.inv_std[1] == 1.0f);  // constant column: centred only
  per.apply(test);
  CHECK(test.features[0] == doctest::Approx((4 - 1.5) / std::sqrt(1.25)));
  CHECK(test.features[1] == doctest::Approx(10 - 5));

  auto copy = train;
  const auto global = kiln::data::fit_normalizer(train, {.standardize = Standardize::global});
  global.apply(copy);
  double sum = 0, sum_sq = 0;
  for (float x : copy.features) {
    sum += x;
    sum_sq += double{x} * x;
  }
  CHECK(sum / 8 == doctest::Approx(0).epsilon(1e-6));
  CHECK(sum_sq / 8 == doctest::Approx(1));

  const auto scale_only = kiln::data::fit_normalizer(train, {.scale = 1.0f / 255});
  auto scaled = train;
  scale_only.apply(scaled);
  CHECK(scaled.features[2] == doctest::Approx(2.0 / 255));

  kiln::data::Dataset wide = train;
  wide.d = 4;
  wide.n = 2;
  wide.labels.assign(2, 0);
  CHECK_THROWS_WITH_AS(per.apply(wide), doctest::Contains("fitted on 2 features, applied to 4"), kiln::ValueError);
  std::vector<float> ragged(5, 1.0f);
  CHECK_THROWS_WITH_AS(per.apply(ragged, 2), doctest::Contains("5 values are not whole rows of 2"),
                       kiln::ValueError);
  CHECK(ragged == std::vector<float>(5, 1.0f));  // refused before any value changed
  kiln::data::Dataset none;
  none.d = 2;
  CHECK_THROWS_WITH_AS(kiln::data::fit_normalizer(none, {.standardize = Standardize::global}),
                       doctest::Contains("non-empty dataset (n = 0, d = 2)"), kiln::ValueError);
  CHECK_NOTHROW(kiln::data::fit_normalizer(none, {.scale = 0.5f}));  // scaling alone needs no statistics
}
