// kiln/data/image_folder.hpp — torchvision's ImageFolder: one class per sub-folder, JPEG and PNG
// files, and a Dataset whose rows are decoded and transformed by the loader's workers.
//
//   kiln::data::ImageFolder all("flowers/train");             // flowers/train/<class>/*.jpg
//   auto [train, val] = all.split(0.2, /*seed=*/1);           // no val/ folder: 20% of each class
//   kiln::data::Dataset train_ds = kiln::data::image_folder_dataset(train, kiln::data::ImageTransform::train(), 7);
//   kiln::data::Dataset val_ds = kiln::data::image_folder_dataset(val, kiln::data::ImageTransform::eval(), 7);
//   kiln::data::Loader loader(train_ds, {.batch_size = 64, .seed = 1, .workers = 4, .prefetch = 4});
//   // batches: 64 rows of 3 × 224 × 224 normalised floats (sample_shape {3, 224, 224}), labels
//
// The scan follows torchvision.datasets.ImageFolder: classes are the root's sub-folders sorted by
// name in byte order (Python's sorted(): "Zebra" before "ant"), class i being label i; a class's
// images are the files under its folder, sub-folders included (os.walk, following symbolic
// links), whose names end in .jpg, .jpeg or .png in any case, sorted by folder path and then by
// name. Other files are ignored (torchvision also reads .bmp, .ppm, .tif and .webp: kiln decodes
// JPEG and PNG only). One deliberate difference: names starting with '.' are skipped, so a
// `.ipynb_checkpoints` or `.DS_Store` does not become a class or an image.
//
// Errors (DataError naming the path): the root is missing or not a folder; it has no class
// folders; no image at all in any class folder; a class folder without images (each one named —
// torchvision refuses this too, as a class that can never be predicted). Each image's header is
// read while scanning (ImageCheck::header, the default): a file that is not a JPEG or PNG, is
// truncated before its pixels or is over the size limit is then an error naming it — or, with
// skip_bad_files, a warning line on stderr and the file is left out (skipped() counts them). A
// file whose header is sound but whose pixel data is corrupt fails when it is decoded, in the
// loader (next() rethrows the DataError naming it); ImageCheck::decode decodes every file while
// scanning (in parallel) so that cannot happen during training.
#pragma once

#include <kiln/config.hpp>
#include <kiln/core/error.hpp>
#include <kiln/data/dataset.hpp>
#include <kiln/data/image.hpp>
#include <kiln/data/image_transforms.hpp>

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace kiln::data {

// What scanning checks of each image file.
enum class ImageCheck {
  none,    // the name only (torchvision): a bad file fails when the loader reaches it
  header,  // the format and the size from the header: cheap (the file's first 64 KiB)
  decode,  // the whole image, decoded once on `threads` threads
};

struct ImageFolderOptions {
  ImageCheck check = ImageCheck::header;
  // false: the first bad file (in scan order) is a DataError naming it. true: each bad file is a
  // warning line on stderr and is left out; an error only if a class is then left without images.
  bool skip_bad_files = false;
  DecodeOptions decode = {};  // the pixel limit, for the check and for the dataset's decoding
  int threads = 0;            // checking threads; 0 = the machine's hardware threads
};

class ImageFolder;

struct ImageFolderSplit;

class ImageFolder {
 public:
  // Scans `root`; throws DataError as described in the header comment.
  explicit ImageFolder(const std::filesystem::path& root, const ImageFolderOptions& options = {});

  const std::filesystem::path& root() const { return root_; }
  // Class i's folder name: label i.
  const std::vector<std::string>& class_names() const { return classes_; }
  int num_classes() const { return static_cast<int>(classes_.size()); }
  // Images, in scan order (by class, then path).
  index_t size() const { return static_cast<index_t>(paths_.size()); }
  // Image i's label and file; ValueError for i outside [0, size()).
  std::int32_t label(index_t i) const { return labels_[checked(i)]; }
  const std::filesystem::path& path(index_t i) const { return paths_[checked(i)]; }
  const std::vector<std::int32_t>& labels() const { return labels_; }
  const std::vector<std::filesystem::path>& paths() const { return paths_; }
  // Images per class.
  std::vector<index_t> class_counts() const;
  // Files left out by skip_bad_files (each was named on stderr), in scan order.
  index_t skipped() const { return static_cast<index_t>(skipped_.size()); }
  const std::vector<std::filesystem::path>& skipped_files() const { return skipped_; }
  const DecodeOptions& decode_options() const { return decode_; }

  // Image i, read and decoded.
  Image load(index_t i) const { return read_image(path(i), decode_); }

  // Images `indices` (in that order), with the same classes. Throws ValueError for an index
  // outside [0, size()).
  ImageFolder subset(std::span<const index_t> indices) const;

  // A stratified split for a train/ folder that has no val/: each class's images are shuffled by
  // Generator(seed) (one permutation per class, classes in label order) and round(n_c ·
  // fraction_for_second) of them go to the second part — at least one and at most n_c − 1 when
  // the class has two or more images and 0 < fraction < 1, so both parts see every class (a class
  // of one image stays in the first). Both parts keep scan order. Same seed, same split, on every
  // machine. Throws ValueError for a fraction outside [0, 1].
  std::pair<std::vector<index_t>, std::vector<index_t>> split_indices(double fraction_for_second,
                                                                      std::uint64_t seed) const;
  ImageFolderSplit split(double fraction_for_second, std::uint64_t seed) const;

 private:
  ImageFolder() = default;
  void scan(const ImageFolderOptions& options);
  std::size_t checked(index_t i) const {
    KILN_CHECK(i >= 0 && i < size(), ValueError, "ImageFolder: image ", i, " is outside [0, ", size(), ")");
    return static_cast<std::size_t>(i);
  }

  std::filesystem::path root_;
  std::vector<std::string> classes_;
  std::vector<std::filesystem::path> paths_;
  std::vector<std::int32_t> labels_;
  std::vector<std::filesystem::path> skipped_;
  DecodeOptions decode_;
};

struct ImageFolderSplit {
  ImageFolder first, second;
};

// A Dataset over `folder`'s images: n = size(), labels, num_classes, d = 3 × S × S, sample_shape
// {3, S, S} with S = transform.size, and `produce` = read the file, decode, `transform` with the
// random choices of (seed, epoch, row) — so the loader decodes on its worker threads. The dataset
// holds copies of the paths and the transform: the folder may go away. Throws ValueError for an
// invalid transform.
KILN_COMPILED Dataset image_folder_dataset(const ImageFolder& folder, const ImageTransform& transform,
                                           std::uint64_t seed = 0);

}  // namespace kiln::data

#if KILN_HEADER_BODIES
#include "kiln/data/image_folder_bodies.hpp"
#endif
