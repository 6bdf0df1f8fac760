// kiln/data/image_transforms_bodies.hpp — the bodies of image_transforms.hpp's functions: included
// by it when kiln is header-only, compiled once into kiln::kernels otherwise (KILN_COMPILED,
// kiln/config.hpp).
#pragma once

#include "kiln/data/image_transforms.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace kiln::data {
namespace detail {

inline void check_image(const Image& image, const char* what) {
  KILN_CHECK(image.height > 0 && image.width > 0 && image.channels > 0, ShapeError, what, ": the image is ",
             image.height, " x ", image.width, " x ", image.channels, " (every size must be positive)");
  KILN_CHECK(image.pixels.size() == static_cast<std::size_t>(image.height * image.width * image.channels), ShapeError,
             what, ": the image holds ", image.pixels.size(), " bytes, not ", image.height, " x ", image.width, " x ",
             image.channels);
}

// PIL's filter weights for one axis (Resample.c: precompute_coeffs, normalize_coeffs_8bpc),
// for output indices [first_out, first_out + count) of resizing in_size → out_size: output o
// reads inputs [first[k], first[k] + taps[k]) with weights at weights[offset[k] ...].
struct ResampleAxis {
  std::vector<index_t> first, taps, offset;
  std::vector<std::int32_t> weights;
};

inline constexpr int resample_precision_bits = 22;  // PIL's PRECISION_BITS = 32 - 8 - 2

inline ResampleAxis resample_axis(index_t in_size, index_t out_size, index_t first_out, index_t count) {
  ResampleAxis axis;
  // PIL computes the scale from float box coordinates; for sizes below 2^24 that is exact.
  const double scale = static_cast<double>(static_cast<float>(in_size)) / static_cast<double>(out_size);
  const double filterscale = std::max(scale, 1.0);
  const double support = 1.0 * filterscale;  // bilinear's support is 1
  std::vector<double> k;
  for (index_t o = first_out; o < first_out + count; ++o) {
    const double center = (static_cast<double>(o) + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    const index_t xmin = std::max<index_t>(static_cast<index_t>(center - support + 0.5), 0);
    const index_t xmax = std::min<index_t>(static_cast<index_t>(center + support + 0.5), in_size) - xmin;
    k.assign(static_cast<std::size_t>(std::max<index_t>(xmax, 0)), 0.0);
    double ww = 0.0;
    for (index_t x = 0; x < xmax; ++x) {
      const double t = std::abs((static_cast<double>(x + xmin) - center + 0.5) * ss);
      k[std::size_t(x)] = t < 1.0 ? 1.0 - t : 0.0;
      ww += k[std::size_t(x)];
    }
    axis.first.push_back(xmin);
    axis.taps.push_back(std::max<index_t>(xmax, 0));
    axis.offset.push_back(static_cast<index_t>(axis.weights.size()));
    for (double w : k) {
      if (ww != 0.0) w /= ww;
      const double fixed = w * double(1 << resample_precision_bits);
      axis.weights.push_back(static_cast<std::int32_t>(w < 0 ? -0.5 + fixed : 0.5 + fixed));
    }
  }
  return axis;
}

// PIL's clip8 of a fixed-point sum that already holds the rounding half.
inline std::uint8_t resample_clip8(std::int64_t sum) {
  if (sum <= 0) return 0;
  return static_cast<std::uint8_t>(std::min<std::int64_t>(sum >> resample_precision_bits, 255));
}

inline void check_box(const CropBox& b, const char* what) {
  KILN_CHECK(b.height > 0 && b.width > 0, ShapeError, what, ": the box is ", b.height, " x ", b.width,
             " (both must be positive)");
}

}  // namespace detail

KILN_COMPILED std::pair<index_t, index_t> shorter_side_size(index_t height, index_t width, index_t size) {
  KILN_CHECK(height > 0 && width > 0 && size > 0, ShapeError, "resize_shorter_side: image ", height, " x ", width,
             ", size ", size, " (all must be positive)");
  const index_t short_side = std::min(height, width), long_side = std::max(height, width);
  // torchvision: int(size * long / short), a float quotient truncated.
  const auto long_new = static_cast<index_t>(static_cast<double>(size * long_side) / static_cast<double>(short_side));
  return width <= height ? std::pair{long_new, size} : std::pair{size, long_new};
}

KILN_COMPILED Image crop(const Image& image, const CropBox& box) {
  detail::check_image(image, "crop");
  detail::check_box(box, "crop");
  const index_t c = image.channels;
  Image out{box.height, box.width, c, std::vector<std::uint8_t>(static_cast<std::size_t>(box.height * box.width * c))};
  const index_t x0 = std::clamp<index_t>(box.left, 0, image.width), x1 = std::clamp<index_t>(box.left + box.width, 0, image.width);
  for (index_t y = 0; y < box.height; ++y) {
    const index_t sy = box.top + y;
    if (sy < 0 || sy >= image.height || x0 >= x1) continue;
    std::copy_n(image.pixels.begin() + static_cast<std::ptrdiff_t>(image.offset(sy, x0, 0)), (x1 - x0) * c,
                out.pixels.begin() + static_cast<std::ptrdiff_t>(out.offset(y, x0 - box.left, 0)));
  }
  return out;
}

KILN_COMPILED CropBox center_crop_box(index_t image_height, index_t image_width, index_t height, index_t width) {
  KILN_CHECK(image_height > 0 && image_width > 0 && height > 0 && width > 0, ShapeError, "center_crop: image ",
             image_height, " x ", image_width, ", crop ", height, " x ", width, " (all must be positive)");
  // torchvision pads a dimension the crop exceeds by (crop − size) // 2 before and the rest after,
  // then crops from the padded image's start; otherwise the offset is round((size − crop) / 2),
  // round half to even (Python's round): 16.5 → 16, 17.5 → 18.
  auto offset = [](index_t size, index_t crop_size) {
    if (crop_size > size) return -((crop_size - size) / 2);
    const index_t d = size - crop_size, half = d / 2;
    return d % 2 == 0 ? half : half + (half & 1);
  };
  return CropBox{offset(image_height, height), offset(image_width, width), height, width};
}

KILN_COMPILED Image center_crop(const Image& image, index_t height, index_t width) {
  detail::check_image(image, "center_crop");
  return crop(image, center_crop_box(image.height, image.width, height, width));
}

KILN_COMPILED Image hflip(const Image& image) {
  detail::check_image(image, "hflip");
  Image out = image;
  const index_t c = image.channels;
  for (index_t y = 0; y < image.height; ++y)
    for (index_t x = 0; x < image.width; ++x)
      std::copy_n(image.pixels.begin() + static_cast<std::ptrdiff_t>(image.offset(y, image.width - 1 - x, 0)), c,
                  out.pixels.begin() + static_cast<std::ptrdiff_t>(out.offset(y, x, 0)));
  return out;
}

KILN_COMPILED Image resize_crop(const Image& image, const CropBox& region, index_t out_height, index_t out_width,
                                const CropBox& window) {
  detail::check_image(image, "resize");
  detail::check_box(region, "resize (source region)");
  detail::check_box(window, "resize (output window)");
  KILN_CHECK(region.top >= 0 && region.left >= 0 && region.top + region.height <= image.height &&
                 region.left + region.width <= image.width,
             ShapeError, "resize: the region ", region.height, " x ", region.width, " at (", region.top, ", ",
             region.left, ") leaves the ", image.height, " x ", image.width, " image");
  KILN_CHECK(out_height > 0 && out_width > 0, ShapeError, "resize: output ", out_height, " x ", out_width,
             " (both must be positive)");
  const index_t c = image.channels;
  Image out{window.height, window.width, c,
            std::vector<std::uint8_t>(static_cast<std::size_t>(window.height * window.width * c))};
  // The part of the window inside the resized image; the rest stays zero.
  const index_t y0 = std::max<index_t>(window.top, 0), y1 = std::min(window.top + window.height, out_height);
  const index_t x0 = std::max<index_t>(window.left, 0), x1 = std::min(window.left + window.width, out_width);
  if (y0 >= y1 || x0 >= x1) return out;
  const index_t rows = y1 - y0, cols = x1 - x0;
  const detail::ResampleAxis h = detail::resample_axis(region.width, out_width, x0, cols);
  const detail::ResampleAxis v = detail::resample_axis(region.height, out_height, y0, rows);
  // PIL's two passes — horizontal into 8-bit rows, then vertical — streamed: each source row the
  // window needs is resampled horizontally once, then added into every output row whose filter
  // reaches it (integer sums, so the order of the additions changes nothing). Memory is one
  // intermediate row and the window's sums, whatever the image's size.
  std::vector<std::uint8_t> mid(static_cast<std::size_t>(cols * c));
  std::vector<std::int64_t> sums(static_cast<std::size_t>(rows * cols * c), std::int64_t{1} << (detail::resample_precision_bits - 1));
  const index_t r_first = v.first.front(), r_last = v.first.back() + v.taps.back();
  index_t lo = 0;  // the first output row whose filter has not ended before row r
  for (index_t r = r_first; r < r_last; ++r) {
    while (lo < rows && v.first[std::size_t(lo)] + v.taps[std::size_t(lo)] <= r) ++lo;
    if (lo == rows || v.first[std::size_t(lo)] > r) continue;  // a row no filter reaches (zero taps)
    const std::uint8_t* src = image.pixels.data() + image.offset(region.top + r, region.left, 0);
    for (index_t j = 0; j < cols; ++j) {
      const std::int32_t* k = h.weights.data() + h.offset[std::size_t(j)];
      const index_t first = h.first[std::size_t(j)], taps = h.taps[std::size_t(j)];
      for (index_t ch = 0; ch < c; ++ch) {
        std::int64_t s = std::int64_t{1} << (detail::resample_precision_bits - 1);
        for (index_t t = 0; t < taps; ++t) s += std::int64_t{src[(first + t) * c + ch]} * k[t];
        mid[std::size_t(j * c + ch)] = detail::resample_clip8(s);
      }
    }
    for (index_t i = lo; i < rows && v.first[std::size_t(i)] <= r; ++i) {
      if (r >= v.first[std::size_t(i)] + v.taps[std::size_t(i)]) continue;
      const std::int64_t w = v.weights[std::size_t(v.offset[std::size_t(i)] + r - v.first[std::size_t(i)])];
      std::int64_t* dst = sums.data() + i * cols * c;
      for (index_t e = 0; e < cols * c; ++e) dst[e] += w * mid[std::size_t(e)];
    }
  }
  for (index_t i = 0; i < rows; ++i) {
    std::uint8_t* dst = out.pixels.data() + out.offset(y0 + i - window.top, x0 - window.left, 0);
    for (index_t e = 0; e < cols * c; ++e) dst[e] = detail::resample_clip8(sums[std::size_t(i * cols * c + e)]);
  }
  return out;
}

KILN_COMPILED Image resize(const Image& image, index_t height, index_t width) {
  detail::check_image(image, "resize");
  return resize_crop(image, CropBox{0, 0, image.height, image.width}, height, width, CropBox{0, 0, height, width});
}

KILN_COMPILED Image resize_shorter_side(const Image& image, index_t size) {
  detail::check_image(image, "resize_shorter_side");
  const auto [h, w] = shorter_side_size(image.height, image.width, size);
  return resize(image, h, w);
}

namespace detail {

inline PhiloxCounter image_block(std::uint64_t seed, std::uint64_t epoch, std::uint64_t sample, std::uint32_t block) {
  const PhiloxCounter counter{{static_cast<std::uint32_t>(sample), static_cast<std::uint32_t>(sample >> 32),
                               reserved_stream_base | static_cast<std::uint32_t>(epoch & 0x7fffffffu),
                               image_philox_family | (block << 8)}};
  return philox4x32(::kiln::detail::make_key(seed), counter);
}

inline double image_unit(std::uint32_t word) { return static_cast<double>(word) * (1.0 / 4294967296.0); }

// An integer in [0, range) from 32 random bits by multiply-shift (range <= 2^32; the bias is
// below range / 2^32), as kiln/data/augment.hpp draws its offsets.
inline index_t image_below(std::uint32_t word, std::uint64_t range) {
  return static_cast<index_t>((static_cast<std::uint64_t>(word) * range) >> 32);
}

// Python's round() of a non-negative double (half to even), as an index.
inline index_t image_round(double x) { return static_cast<index_t>(std::nearbyint(x)); }

inline void check_crop_options(const RandomResizedCropOptions& o) {
  KILN_CHECK(std::isfinite(o.scale_min) && std::isfinite(o.scale_max) && o.scale_min > 0 && o.scale_min <= o.scale_max,
             ValueError, "RandomResizedCrop: scale (", o.scale_min, ", ", o.scale_max,
             ") must be finite with 0 < min <= max");
  KILN_CHECK(std::isfinite(o.ratio_min) && std::isfinite(o.ratio_max) && o.ratio_min > 0 && o.ratio_min <= o.ratio_max,
             ValueError, "RandomResizedCrop: ratio (", o.ratio_min, ", ", o.ratio_max,
             ") must be finite with 0 < min <= max");
  KILN_CHECK(o.attempts >= 0 && o.attempts < (1 << 24) - 1, ValueError, "RandomResizedCrop: attempts = ", o.attempts,
             " must be in [0, 16777215)");
}

}  // namespace detail

KILN_COMPILED CropBox random_resized_crop_box(index_t image_height, index_t image_width,
                                              const RandomResizedCropOptions& options, std::uint64_t seed,
                                              std::uint64_t epoch, std::uint64_t sample) {
  KILN_CHECK(image_height > 0 && image_width > 0, ShapeError, "RandomResizedCrop: image ", image_height, " x ",
             image_width, " (both must be positive)");
  detail::check_crop_options(options);
  const double area = static_cast<double>(image_height) * static_cast<double>(image_width);
  const double log_lo = std::log(options.ratio_min), log_hi = std::log(options.ratio_max);
  for (int a = 0; a < options.attempts; ++a) {
    const PhiloxCounter r = detail::image_block(seed, epoch, sample, static_cast<std::uint32_t>(1 + a));
    const double target = area * (options.scale_min + (options.scale_max - options.scale_min) * detail::image_unit(r.v[0]));
    const double aspect = std::exp(log_lo + (log_hi - log_lo) * detail::image_unit(r.v[1]));
    const double wd = std::sqrt(target * aspect), hd = std::sqrt(target / aspect);
    if (!(wd <= double(image_width) + 0.5 && hd <= double(image_height) + 0.5)) continue;  // cannot round into the image
    const index_t w = detail::image_round(wd), h = detail::image_round(hd);
    if (0 < w && w <= image_width && 0 < h && h <= image_height) {
      const index_t top = detail::image_below(r.v[2], static_cast<std::uint64_t>(image_height - h + 1));
      const index_t left = detail::image_below(r.v[3], static_cast<std::uint64_t>(image_width - w + 1));
      return CropBox{top, left, h, w};
    }
  }
  // The fallback: the central crop, narrowed to the ratio range (at least one pixel each way).
  const double in_ratio = static_cast<double>(image_width) / static_cast<double>(image_height);
  index_t w = image_width, h = image_height;
  if (in_ratio < options.ratio_min)
    h = std::clamp<index_t>(detail::image_round(double(w) / options.ratio_min), 1, image_height);
  else if (in_ratio > options.ratio_max)
    w = std::clamp<index_t>(detail::image_round(double(h) * options.ratio_max), 1, image_width);
  return CropBox{(image_height - h) / 2, (image_width - w) / 2, h, w};
}

KILN_COMPILED bool flip_draw(double probability, std::uint64_t seed, std::uint64_t epoch, std::uint64_t sample) {
  KILN_CHECK(probability >= 0.0 && probability <= 1.0, ValueError, "flip: probability ", probability,
             " must be in [0, 1]");
  return detail::image_unit(detail::image_block(seed, epoch, sample, 0).v[0]) < probability;
}

KILN_COMPILED void to_tensor(const Image& image, std::span<float> out, std::span<const float> mean,
                             std::span<const float> stddev, bool mirror) {
  detail::check_image(image, "to_tensor");
  const index_t c = image.channels, h = image.height, w = image.width, plane = h * w;
  KILN_CHECK(out.size() == static_cast<std::size_t>(c * plane), ShapeError, "to_tensor: out holds ", out.size(),
             " values for a ", c, " x ", h, " x ", w, " image");
  KILN_CHECK(mean.size() == stddev.size() && (mean.empty() || mean.size() == static_cast<std::size_t>(c)), ShapeError,
             "to_tensor: ", mean.size(), " means and ", stddev.size(), " standard deviations for ", c,
             " channels (both empty, or one of each per channel)");
  for (index_t y = 0; y < h; ++y)
    for (index_t x = 0; x < w; ++x) {
      const std::uint8_t* p = image.pixels.data() + image.offset(y, mirror ? w - 1 - x : x, 0);
      for (index_t ch = 0; ch < c; ++ch) {
        // torchvision: img.float().div(255), then .sub_(mean).div_(std), all in float.
        float v = static_cast<float>(p[ch]) / 255.0f;
        if (!mean.empty()) v = (v - mean[std::size_t(ch)]) / stddev[std::size_t(ch)];
        out[std::size_t(ch * plane + y * w + x)] = v;
      }
    }
}

KILN_COMPILED void ImageTransform::validate() const {
  KILN_CHECK(size >= 1, ValueError, "ImageTransform: size = ", size, " must be at least 1");
  KILN_CHECK(resize >= 0, ValueError, "ImageTransform: resize = ", resize, " must not be negative (0: no resize)");
  detail::check_crop_options(crop);
  KILN_CHECK(flip_probability >= 0.0 && flip_probability <= 1.0, ValueError, "ImageTransform: flip_probability = ",
             flip_probability, " must be in [0, 1]");
  KILN_CHECK(mean.size() == stddev.size() && (mean.empty() || mean.size() == 3), ValueError, "ImageTransform: ",
             mean.size(), " means and ", stddev.size(), " standard deviations (both empty, or 3 of each)");
  for (std::size_t k = 0; k < mean.size(); ++k)
    KILN_CHECK(std::isfinite(mean[k]) && std::isfinite(stddev[k]) && stddev[k] > 0.0f, ValueError,
               "ImageTransform: mean[", k, "] = ", mean[k], ", stddev[", k, "] = ", stddev[k],
               " (both finite, the stddev positive)");
}

KILN_COMPILED void ImageTransform::apply(const Image& image, std::span<float> out, std::uint64_t seed,
                                         std::uint64_t epoch, std::uint64_t sample) const {
  validate();
  detail::check_image(image, "ImageTransform");
  KILN_CHECK(image.channels == 3, ShapeError, "ImageTransform: the image has ", image.channels,
             " channels (decoded images are RGB: 3)");
  KILN_CHECK(out.size() == static_cast<std::size_t>(features()), ShapeError, "ImageTransform: out holds ", out.size(),
             " values, the transform writes 3 x ", size, " x ", size, " = ", features());
  const CropBox square{0, 0, size, size};
  if (kind == Kind::train) {
    const CropBox box = random_resized_crop_box(image.height, image.width, crop, seed, epoch, sample);
    const Image patch = resize_crop(image, box, size, size, square);
    to_tensor(patch, out, mean, stddev, flip_draw(flip_probability, seed, epoch, sample));
    return;
  }
  const auto [h, w] = resize > 0 ? shorter_side_size(image.height, image.width, resize)
                                 : std::pair{image.height, image.width};
  const Image patch = resize_crop(image, CropBox{0, 0, image.height, image.width}, h, w,
                                  center_crop_box(h, w, size, size));
  to_tensor(patch, out, mean, stddev);
}

}  // namespace kiln::data
