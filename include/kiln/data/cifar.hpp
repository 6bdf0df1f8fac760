// kiln/data/cifar.hpp — the CIFAR-10 binary version (raw or gzip) as an image/label Dataset.
//
// Layout: a file is whole records of 3,073 bytes and nothing else: 1 label byte (0..9), then
// 3,072 pixel bytes — the 1,024 red values, then the green, then the blue, each plane 32 × 32
// row-major. The official files hold 10,000 records each: data_batch_1.bin … data_batch_5.bin
// (training) and test_batch.bin (test), all in one directory (cifar-10-batches-bin/). Every
// deviation is a DataError that names the file and the byte offset (of the decompressed content)
// where it was found, as in kiln/data/idx.hpp.
#pragma once

#include <kiln/config.hpp>
#include <kiln/core/error.hpp>
#include <kiln/data/dataset.hpp>
#include <kiln/data/file.hpp>

#include <array>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace kiln::data {

inline constexpr index_t cifar10_channels = 3;
inline constexpr index_t cifar10_side = 32;
inline constexpr index_t cifar10_image_bytes = cifar10_channels * cifar10_side * cifar10_side;
inline constexpr index_t cifar10_record_bytes = 1 + cifar10_image_bytes;  // 3,073
inline constexpr int cifar10_num_classes = 10;
inline constexpr index_t cifar10_records_per_file = 10000;  // in the official files

// The class of each label, as in the dataset's batches.meta.txt.
inline constexpr std::array<const char*, 10> cifar10_class_names = {
    "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"};

// The official file names in load order: the five training batches, or the test batch.
KILN_COMPILED std::vector<std::string> cifar10_file_names(bool train);

namespace detail {

// An empty CIFAR-10 Dataset: d = 3,072, sample_shape {3, 32, 32}, 10 classes.
KILN_COMPILED Dataset cifar10_empty();

// Checks the size and every label of CIFAR-10 bytes before `out` is touched, then appends their
// records to `out` (so a bad file leaves `out` as it was). `name` labels errors.
KILN_COMPILED void append_cifar10(std::span<const std::uint8_t> bytes, const std::string& name,
                                  Dataset& out);

}  // namespace detail

// CIFAR-10 bytes as a Dataset; `name` is the file name used in errors.
KILN_COMPILED Dataset parse_cifar10(std::span<const std::uint8_t> bytes, const std::string& name);

// One CIFAR-10 binary file (raw or gzip-compressed) as a Dataset of n = records images, like
// load_idx_classification's: features are the raw byte values 0..255 as float (scale them with
// kiln/data/normalize.hpp), d = 3,072 per image in the file's channel-planar order, so
// sample_shape = {3, 32, 32} (channels, rows, columns) and feature c·1024 + r·32 + x is channel c
// (0 red, 1 green, 2 blue) at row r, column x; labels 0..9, num_classes = 10. Throws DataError
// naming the file when it is missing or unreadable, empty, not whole 3,073-byte records (with the
// size and the trailing byte count), or holds a label above 9 (with the record and its offset).
KILN_COMPILED Dataset read_cifar10(const std::filesystem::path& path);

// The CIFAR-10 training set (data_batch_1.bin … data_batch_5.bin concatenated in that order) or
// the test set (test_batch.bin) from `dir`, as read_cifar10 reads each file. Files of any whole
// number of records are accepted (the official ones hold 10,000 each).
KILN_COMPILED Dataset load_cifar10(const std::filesystem::path& dir, bool train);

}  // namespace kiln::data

#if KILN_HEADER_BODIES
#include "kiln/data/cifar_bodies.hpp"
#endif
