// kiln/data/image_transforms.hpp — torchvision's ImageNet transforms on decoded images: resize
// (PIL's antialiased bilinear), center crop, RandomResizedCrop, horizontal flip, ToTensor and
// Normalize, and the two standard pipelines composed.
//
//   const auto train = kiln::data::ImageTransform::train();   // RandomResizedCrop(224), flip
//   const auto eval = kiln::data::ImageTransform::eval();     // Resize(256), CenterCrop(224)
//   std::vector<float> chw(train.features());                 // 3 × 224 × 224, planar
//   train.apply(image, chw, seed, epoch, sample_index);
//
// Each function is the torchvision transform of the same name on a PIL image, which is what
// torchvision's ImageFolder hands its transforms:
// - resize: PIL's Image.resize(BILINEAR) bit for bit — a separable triangle filter whose support
//   grows with the downscale factor (so downscaling averages, "antialias"), weights in PIL's
//   22-bit fixed point, the horizontal pass first, rounded to 8 bits between the passes.
//   torchvision's tensor path (antialias=True) is a float version of the same filter, at most 1
//   of 255 away (measured at ImageNet sizes). scripts/golden_image_resize.py prints PIL's values
//   for the test.
// - resize_shorter_side(s): Resize(s): the shorter side becomes s, the longer int(s·long/short).
// - center_crop: CenterCrop: top = round((H − h) / 2) with Python's round-half-to-even, and a
//   crop larger than the image pads it with zeros first, as torchvision does.
// - random_resized_crop_box: RandomResizedCrop.get_params: up to `attempts` (10) draws of an area
//   fraction uniform in [scale_min, scale_max] and an aspect ratio log-uniform in [ratio_min,
//   ratio_max]; the first box that fits is placed uniformly; if none fits, the central crop
//   clamped to the ratio range. The box is then resized to size × size (resize of the crop).
// - horizontal flip with probability flip_probability (0.5).
// - to_tensor: ToTensor + Normalize: out[c][y][x] = (v / 255 − mean[c]) / stddev[c] in float, the
//   same operations as torchvision's (float32 divide, subtract, divide), so the values match
//   torchvision's for the same pixels exactly. Planar CHW, the layout kiln's convolutions read.
//
// Randomness is a pure function of (seed, epoch, sample): Philox4x32-10 (kiln/core/random.hpp)
// with key = seed and counter words
//     word 0, 1: sample (low, high 32 bits)
//     word 2:    reserved_stream_base | (epoch & 0x7fffffff)
//     word 3:    image_philox_family (3) | block << 8
// block 0 is the flip (word 0 < p · 2^32), block 1 + a is crop attempt a (words: area fraction,
// log aspect ratio, top, left). Word 3 keeps these draws apart from every other kiln draw:
// uniform/bits use 0, normal() 1, kiln/data/augment.hpp 2 (whose high bits are always zero), and
// the loader's shuffle is a Generator (family 0). So the same seed may be given to the loader,
// augment() and these transforms. The sample is the dataset row, not its position in a batch:
// the result does not depend on the batch split, the worker count or thread timing.
#pragma once

#include <kiln/config.hpp>
#include <kiln/core/error.hpp>
#include <kiln/core/random.hpp>
#include <kiln/data/image.hpp>

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace kiln::data {

// Philox counter word 3's low byte for image-transform draws (see the header comment).
inline constexpr std::uint32_t image_philox_family = 3;

// A rectangle of an image: rows [top, top + height), columns [left, left + width).
struct CropBox {
  index_t top = 0;
  index_t left = 0;
  index_t height = 0;
  index_t width = 0;
  bool operator==(const CropBox&) const = default;
};

struct RandomResizedCropOptions {
  double scale_min = 0.08, scale_max = 1.0;              // area fraction of the image
  double ratio_min = 3.0 / 4.0, ratio_max = 4.0 / 3.0;  // width / height
  int attempts = 10;
};

// ImageNet's channel statistics (torchvision's reference scripts), for Normalize.
inline const std::vector<float>& imagenet_mean() {
  static const std::vector<float> mean{0.485f, 0.456f, 0.406f};
  return mean;
}
inline const std::vector<float>& imagenet_std() {
  static const std::vector<float> stddev{0.229f, 0.224f, 0.225f};
  return stddev;
}

// (height, width) after Resize(size): the shorter side becomes `size`.
KILN_COMPILED std::pair<index_t, index_t> shorter_side_size(index_t height, index_t width, index_t size);

// The pixels of `box`; zeros where it leaves the image.
KILN_COMPILED Image crop(const Image& image, const CropBox& box);

// The box CenterCrop(height, width) takes (it may extend past the image: those pixels are 0).
KILN_COMPILED CropBox center_crop_box(index_t image_height, index_t image_width, index_t height, index_t width);
KILN_COMPILED Image center_crop(const Image& image, index_t height, index_t width);

KILN_COMPILED Image hflip(const Image& image);

// PIL's antialiased bilinear resize to height × width.
KILN_COMPILED Image resize(const Image& image, index_t height, index_t width);
KILN_COMPILED Image resize_shorter_side(const Image& image, index_t size);

// crop(resize(crop(image, region), out_height, out_width), window), computing only the window's
// pixels: what a crop after a resize costs when the resized image is never needed whole.
// `region` must lie inside the image; `window` may leave the resized image (zeros there).
KILN_COMPILED Image resize_crop(const Image& image, const CropBox& region, index_t out_height, index_t out_width,
                                const CropBox& window);

// RandomResizedCrop's box for sample `sample` of epoch `epoch` (before the resize).
KILN_COMPILED CropBox random_resized_crop_box(index_t image_height, index_t image_width,
                                              const RandomResizedCropOptions& options, std::uint64_t seed,
                                              std::uint64_t epoch, std::uint64_t sample);

// Whether sample `sample` of epoch `epoch` is mirrored, with probability `probability`.
KILN_COMPILED bool flip_draw(double probability, std::uint64_t seed, std::uint64_t epoch, std::uint64_t sample);

// ToTensor (+ Normalize when mean and stddev are given, one value per channel; both empty: only
// / 255), written planar into out (channels × height × width values), mirrored when `mirror`.
KILN_COMPILED void to_tensor(const Image& image, std::span<float> out, std::span<const float> mean = {},
                             std::span<const float> stddev = {}, bool mirror = false);

// A whole pipeline, image in, normalised planar floats out.
struct ImageTransform {
  enum class Kind {
    eval,   // Resize(resize) (skipped when resize = 0), CenterCrop(size)
    train,  // RandomResizedCrop(size, crop), RandomHorizontalFlip(flip_probability)
  };
  Kind kind = Kind::eval;
  index_t size = 224;    // the output is 3 × size × size
  index_t resize = 256;  // eval: the shorter side before the center crop
  RandomResizedCropOptions crop = {};
  double flip_probability = 0.5;
  // Normalize's per-channel statistics; both empty: ToTensor's v / 255 only.
  std::vector<float> mean = imagenet_mean();
  std::vector<float> stddev = imagenet_std();

  // torchvision's standard ImageNet evaluation and training pipelines.
  static ImageTransform eval(index_t size = 224, index_t resize = 256) {
    ImageTransform t;
    t.size = size;
    t.resize = resize;
    return t;
  }
  static ImageTransform train(index_t size = 224) {
    ImageTransform t;
    t.kind = Kind::train;
    t.size = size;
    return t;
  }

  // Values per output image: 3 × size × size.
  index_t features() const { return 3 * size * size; }

  // Throws ValueError for a size below 1, a negative resize, bad crop ranges or attempts, a flip
  // probability outside [0, 1], or mean / stddev not both empty or both of 3 finite values with
  // every stddev > 0.
  void validate() const;

  // Writes the transformed `image` (3 channels) into out (features() values). The random choices
  // are those of (seed, epoch, sample); an eval transform has none.
  void apply(const Image& image, std::span<float> out, std::uint64_t seed = 0, std::uint64_t epoch = 0,
             std::uint64_t sample = 0) const;
};

}  // namespace kiln::data

#if KILN_HEADER_BODIES
#include "kiln/data/image_transforms_bodies.hpp"
#endif
