// CIFAR-10 binary reader: synthetic files in a temporary directory, checked for exact labels and
// channel-planar pixel layout, the training files' concatenation order, and one malformed file
// per error the reader promises to report (type, file name, offset and counts in the message).
#include <kiln/data/cifar.hpp>

#include <doctest/doctest.h>

#include "data_helpers.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <vector>


namespace fs = std::filesystem;
using kiln::index_t;
using kiln_test::Bytes;
using kiln_test::check_data_error;

namespace {

constexpr std::size_t kRecord = 3073;

// A fresh directory for one test, removed when it goes out of scope.
struct TempDir {
  fs::path path;
  TempDir() {
    static std::atomic<int> counter{0};
    const auto stamp = std::chrono::steady_clock::now().time_since_epoch().count();
    path = fs::temp_directory_path() /
           ("kiln_test_cifar_" + std::to_string(stamp) + "_" + std::to_string(counter++));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  fs::path write(const std::string& name, const Bytes& bytes) const {
    return kiln_test::write_bytes(path / name, bytes);
  }
};

// The pixel byte at channel c, row r, column x of synthetic record `tag`.
std::uint8_t pixel(int tag, int c, int r, int x) {
  return static_cast<std::uint8_t>((tag * 31 + c * 97 + r * 13 + x * 5) % 256);
}

// Appends one record, built from an image indexed (c, r, x), in the file's planar order.
void append_record(Bytes& b, std::uint8_t label, int tag) {
  b.push_back(label);
  for (int c = 0; c < 3; ++c)
    for (int r = 0; r < 32; ++r)
      for (int x = 0; x < 32; ++x) b.push_back(pixel(tag, c, r, x));
}

Bytes records(std::initializer_list<std::uint8_t> labels, int first_tag) {
  Bytes b;
  int tag = first_tag;
  for (std::uint8_t y : labels) append_record(b, y, tag++);
  return b;
}

// Feature (c, r, x) of sample i, by the documented sample_shape {3, 32, 32}.
float feature(const kiln::data::Dataset& ds, index_t i, int c, int r, int x) {
  return ds.row(i)[static_cast<std::size_t>(c * 1024 + r * 32 + x)];
}

// Checks every pixel of sample i against synthetic record `tag`.
bool matches(const kiln::data::Dataset& ds, index_t i, int tag) {
  for (int c = 0; c < 3; ++c)
    for (int r = 0; r < 32; ++r)
      for (int x = 0; x < 32; ++x)
        if (feature(ds, i, c, r, x) != static_cast<float>(pixel(tag, c, r, x))) return false;
  return true;
}


}  // namespace

TEST_CASE("cifar10: one file decodes labels and channel-planar pixels exactly") {
  TempDir dir;
  const fs::path path = dir.write("three.bin", records({3, 0, 9}, 100));
  const auto ds = kiln::data::read_cifar10(path);
  CHECK(ds.n == 3);
  CHECK(ds.d == 3072);
  CHECK(ds.num_classes == 10);
  CHECK(ds.sample_shape == std::vector<index_t>{3, 32, 32});
  CHECK(ds.labels == std::vector<std::int32_t>{3, 0, 9});
  CHECK(ds.features.size() == 3u * 3072u);
  CHECK_NOTHROW(ds.validate());
  for (index_t i = 0; i < 3; ++i) CHECK(matches(ds, i, 100 + static_cast<int>(i)));

  // One lit pixel: green (channel 1), row 2, column 5 sits at feature 1024 + 64 + 5 = 1093.
  Bytes one(kRecord, 0);
  one[0] = 7;
  one[1 + 1093] = 200;
  one[1 + 1023] = 11;  // last red pixel (row 31, column 31)
  one[1 + 2048] = 22;  // first blue pixel
  const auto lit = kiln::data::read_cifar10(dir.write("lit.bin", one));
  CHECK(lit.labels == std::vector<std::int32_t>{7});
  CHECK(feature(lit, 0, 1, 2, 5) == 200.0f);
  CHECK(feature(lit, 0, 0, 31, 31) == 11.0f);
  CHECK(feature(lit, 0, 2, 0, 0) == 22.0f);
  float sum = 0;
  for (float v : lit.features) sum += v;
  CHECK(sum == 233.0f);

  // parse_cifar10 on bytes gives the same.
  const auto parsed = kiln::data::parse_cifar10(records({3, 0, 9}, 100), "mem");
  CHECK(parsed.features == ds.features);
  CHECK(parsed.labels == ds.labels);
}

TEST_CASE("cifar10: load_cifar10 concatenates data_batch_1..5 in order, or reads test_batch") {
  TempDir dir;
  // data_batch_k holds k records; record j of file k has label (k + j) % 10 and tag 10k + j.
  std::vector<std::int32_t> want_labels;
  std::vector<int> want_tags;
  for (int k = 1; k <= 5; ++k) {
    Bytes b;
    for (int j = 0; j < k; ++j) {
      append_record(b, static_cast<std::uint8_t>((k + j) % 10), 10 * k + j);
      want_labels.push_back((k + j) % 10);
      want_tags.push_back(10 * k + j);
    }
    dir.write("data_batch_" + std::to_string(k) + ".bin", b);
  }
  dir.write("test_batch.bin", records({9, 8}, 200));

  const auto train = kiln::data::load_cifar10(dir.path, true);
  CHECK(train.n == 15);
  CHECK(train.d == 3072);
  CHECK(train.sample_shape == std::vector<index_t>{3, 32, 32});
  CHECK(train.labels == want_labels);
  CHECK(train.features.size() == 15u * 3072u);
  CHECK_NOTHROW(train.validate());
  for (index_t i = 0; i < train.n; ++i) {
    CAPTURE(i);
    CHECK(matches(train, i, want_tags[static_cast<std::size_t>(i)]));
  }

  const auto test = kiln::data::load_cifar10(dir.path, false);
  CHECK(test.n == 2);
  CHECK(test.labels == std::vector<std::int32_t>{9, 8});
  CHECK(matches(test, 0, 200));
  CHECK(matches(test, 1, 201));

  CHECK(kiln::data::cifar10_file_names(true) ==
        std::vector<std::string>{"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin",
                                 "data_batch_4.bin", "data_batch_5.bin"});
  CHECK(std::string(kiln::data::cifar10_class_names[9]) == "truck");
}

TEST_CASE("cifar10: malformed files are DataErrors naming the file and offset") {
  TempDir dir;
  const fs::path missing = dir.path / "nope.bin";
  check_data_error([&] { kiln::data::read_cifar10(missing); }, missing, {"cannot open"});

  const fs::path empty = dir.write("empty.bin", {});
  check_data_error([&] { kiln::data::read_cifar10(empty); }, empty,
                   {"byte offset 0", "empty file"});

  // Two records and 5 bytes: the partial record starts at 6146 and the file is 6151 bytes.
  Bytes ragged = records({1, 2}, 0);
  ragged.insert(ragged.end(), {4, 0, 0, 0, 0});
  const fs::path ragged_path = dir.write("ragged.bin", ragged);
  check_data_error([&] { kiln::data::read_cifar10(ragged_path); }, ragged_path,
                   {"byte offset 6146", "file size 6151", "2 records and 5 trailing bytes"});
  // Less than one record.
  const fs::path short_path = dir.write("short.bin", Bytes(100, 1));
  check_data_error([&] { kiln::data::read_cifar10(short_path); }, short_path,
                   {"byte offset 0", "file size 100", "0 records and 100 trailing bytes"});
  // One byte short of a whole record.
  const fs::path minus_path = dir.write("minus.bin", Bytes(kRecord - 1, 0));
  check_data_error([&] { kiln::data::read_cifar10(minus_path); }, minus_path,
                   {"file size 3072", "3072 trailing bytes"});

  // Label 10 in record 2 (byte 6146); label 255 in record 0.
  const fs::path label_path = dir.write("label.bin", records({0, 9, 10, 1}, 0));
  check_data_error([&] { kiln::data::read_cifar10(label_path); }, label_path,
                   {"byte offset 6146", "label 10", "record 2"});
  const fs::path label0_path = dir.write("label0.bin", records({255}, 0));
  check_data_error([&] { kiln::data::read_cifar10(label0_path); }, label0_path,
                   {"byte offset 0", "label 255", "record 0"});
}

TEST_CASE("cifar10: load_cifar10 names the file at fault") {
  TempDir dir;
  for (int k = 1; k <= 5; ++k)
    if (k != 3) dir.write("data_batch_" + std::to_string(k) + ".bin", records({1}, k));
  check_data_error([&] { kiln::data::load_cifar10(dir.path, true); },
                   dir.path / "data_batch_3.bin", {"cannot open"});
  check_data_error([&] { kiln::data::load_cifar10(dir.path, false); }, dir.path / "test_batch.bin",
                   {"cannot open"});

  dir.write("data_batch_3.bin", records({2, 3}, 0));
  dir.write("data_batch_4.bin", records({4, 5, 12}, 0));
  check_data_error([&] { kiln::data::load_cifar10(dir.path, true); },
                   dir.path / "data_batch_4.bin",
                   {"byte offset " + std::to_string(2 * kRecord), "label 12", "record 2"});
  dir.write("data_batch_4.bin", records({4}, 0));
  Bytes ragged = records({5}, 0);
  ragged.push_back(5);
  dir.write("data_batch_5.bin", ragged);
  check_data_error([&] { kiln::data::load_cifar10(dir.path, true); },
                   dir.path / "data_batch_5.bin", {"byte offset 3073", "1 trailing bytes"});
  dir.write("data_batch_5.bin", records({5}, 0));
  CHECK(kiln::data::load_cifar10(dir.path, true).labels ==
        std::vector<std::int32_t>{1, 1, 2, 3, 4, 5});
}

// Registered in every build, skipped (and counted as skipped) without zlib.
TEST_CASE("cifar10: a gzip-compressed file reads like the raw one" * doctest::skip(!kiln::data::have_zlib)) {
#if KILN_HAVE_ZLIB
  TempDir dir;
  const Bytes raw = records({6, 2}, 50);
  const Bytes packed = kiln_test::gzip(raw);
  const auto ds = kiln::data::read_cifar10(dir.write("packed.bin.gz", packed));
  CHECK(ds.labels == std::vector<std::int32_t>{6, 2});
  CHECK(matches(ds, 0, 50));
  CHECK(matches(ds, 1, 51));
#endif
}
