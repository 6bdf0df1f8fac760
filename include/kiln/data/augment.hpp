// kiln/data/augment.hpp — image augmentation (random crop with zero padding, horizontal flip,
// per-channel normalisation) that runs where the model runs and draws the same images on every
// executor.
//
//   kiln::data::AugmentOptions aug{.pad = 4, .flip = true, .scale = 1.0f / 255,
//                                  .mean = {0.4914f, 0.4822f, 0.4465f},
//                                  .stddev = {0.2470f, 0.2435f, 0.2616f}, .seed = 7};
//   kiln::data::augment(exec, batch.features.data(), out, batch.size, 3, 32, 32, aug, batch.epoch,
//                       std::uint64_t(batch.index) * batch_size);
//
// Layout: src and dst hold n images of c × h × w values, NCHW planar and dense (a CIFAR batch
// from kiln/data/cifar.hpp: sample_shape {3, 32, 32}); both live in the executor's memory space
// (host pointers for CpuExecutor, device pointers for CudaExecutor). dst keeps the input's size.
//
// The formula. Image i of a call is global sample s = first_sample_index + i. Its choices
// (dy, dx, flip) = augment_choice(options, epoch, s) (below), and output element (i, ch, y, x) is
//
//     v = src(i, ch, y + dy - pad, x' + dx - pad),   x' = flip ? w - 1 - x : x,
//     v = 0 when that row or column lies outside [0, h) × [0, w)   (the zero padding)
//     dst(i, ch, y, x) = fma(v, scale, -mean[ch]) · inv_std[ch],   inv_std[ch] = 1 / stddev[ch]
//
// i.e. dst = normalise(flip(crop(pad(src)))), torchvision's CIFAR pipeline ToTensor,
// RandomCrop(h × w, padding = pad, fill = 0), RandomHorizontalFlip, Normalize(mean, std): the crop
// takes the h × w window at (dy, dx) of the zero-padded (h + 2·pad) × (w + 2·pad) image, the flip
// mirrors that window, and normalisation comes LAST, so the padded zeros are normalised too (they
// become (0 - mean) / std, as in torchvision, where the fill happens before Normalize). `scale`
// plays ToTensor's 1/255 for kiln's 0..255 CIFAR floats (1 by default). The multiply-add is an
// explicit fma and inv_std is rounded to the compute type once on the host, so the CPU and the GPU
// produce the same bits (a plain a·b + c would be contracted by nvcc and not by the host
// compiler); against torchvision's (x - mean) / std the result can differ by an ulp or two. With
// mean and stddev empty and scale == 1 the output is a bit-exact copy of the chosen source values.
// Arithmetic runs in compute_t<T> (float for float, f16 and bf16; double for double).
//
// Randomness. The choices of sample s in epoch e are one Philox4x32-10 block
// (kiln/core/random.hpp) with key = options.seed and counter words
//     word 0, 1: s (low, high 32 bits)
//     word 2:    reserved_stream_base | (e & 0x7fffffff)   (epochs repeat after 2^31, as the loader's)
//     word 3:    augment_philox_family = 2
// and dy = (word0 · (2·pad + 1)) >> 32, dx = (word1 · (2·pad + 1)) >> 32 (uniform on [0, 2·pad]
// up to a bias below (2·pad + 1) / 2^32), flip = top bit of word2 when options.flip (else false).
// Turning flip off or changing pad does not change which words are drawn, and the choice depends
// on nothing else: not on the batch split, the executor, the thread count or the data, so a run
// restarted at epoch e, or split into batches differently, sees the same images.
//
// Why a family word and not a stream of its own: the data loader (kiln/data/loader.hpp) shuffles
// epoch e with Generator(seed, reserved_stream_base | (e & 0x7fffffff)), which occupies EVERY
// reserved stream value (one per epoch), so no reserved stream is free for a fixed augmentation
// stream. Word 3 separates the draws instead: random_bits/uniform01/Generator use 0, normal()
// uses 1, augmentation uses 2, so augmentation never reuses the bits of the loader's shuffle (nor
// of dropout or any Generator) even when both are given the same seed. Word 2 still holds a
// reserved stream value (the epoch's), marking the draw as kiln's own.
//
// Cost. ONE launch (kind::copy, name "augment", counted in exec.stats()): AugmentKernel<T> is a
// trivially copyable functor of pointers, sizes and at most augment_max_channels per-channel
// constants. A device executor runs it through for_each_element(n·c, h·w, ...) with one thread
// per output element (each thread recomputes its image's Philox block: 10 rounds, cheap next to
// the memory traffic); the CPU runs the same value() formula image by image with the block drawn
// once per image (the same bits: test_augment.cpp runs both paths).
#pragma once

#include <kiln/config.hpp>
#include <kiln/core/dtype.hpp>
#include <kiln/core/error.hpp>
#include <kiln/core/random.hpp>
#include <kiln/core/space.hpp>
#include <kiln/core/stats.hpp>
#include <kiln/core/tensor.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <math.h>  // ::fmaf, ::fma: the spellings host and nvcc device code share
#include <type_traits>
#include <vector>

namespace kiln::data {

// Per-channel mean / stddev are held in the functor as fixed arrays of this many values: enough
// for grey, RGB and RGBA images. More channels with normalisation is a ShapeError (without
// normalisation any channel count is fine).
inline constexpr index_t augment_max_channels = 4;

// Philox counter word 3 of augmentation draws (random.hpp uses 0 for bits/uniform and 1 for
// normal); see the header comment for why.
inline constexpr std::uint32_t augment_philox_family = 2;

struct AugmentOptions {
  // Random crop with this much zero padding on every side (dy, dx uniform in [0, 2·pad]); 0 = no
  // crop. Must be in [0, 2^31 - 1).
  index_t pad = 4;
  // Horizontal flip with probability 1/2.
  bool flip = true;
  // Multiplies every value (padding zeros included, where it changes nothing) before the mean is
  // subtracted: 1/255 turns kiln's 0..255 CIFAR floats into ToTensor's 0..1. Must be finite.
  float scale = 1.0f;
  // Per-channel normalisation (v·scale - mean[ch]) / stddev[ch]: both empty (none) or both of
  // size c (at most augment_max_channels); every stddev finite and > 0, every mean finite.
  std::vector<float> mean;
  std::vector<float> stddev;
  // Philox key of the random choices.
  std::uint64_t seed = 0;
};

// The random choices for one image: the crop window's top-left corner (dy, dx) in the padded
// image, each in [0, 2·pad], and whether the window is mirrored left-right.
struct AugmentChoice {
  index_t dy = 0;
  index_t dx = 0;
  bool flip = false;
};

KILN_HOST_DEVICE bool operator==(const AugmentChoice& a, const AugmentChoice& b) {
  return a.dy == b.dy && a.dx == b.dx && a.flip == b.flip;
}

namespace detail {

// The Philox block of sample `sample` in epoch `epoch` (layout in the header comment).
KILN_HOST_DEVICE PhiloxCounter augment_block(std::uint64_t seed, std::uint64_t epoch, std::uint64_t sample) {
  const PhiloxCounter counter{{static_cast<std::uint32_t>(sample), static_cast<std::uint32_t>(sample >> 32),
                               reserved_stream_base | static_cast<std::uint32_t>(epoch & 0x7fffffffu),
                               augment_philox_family}};
  return philox4x32(kiln::detail::make_key(seed), counter);
}

// A value in [0, range) from 32 random bits by multiply-shift (range <= 2^32).
KILN_HOST_DEVICE index_t augment_below(std::uint32_t word, std::uint64_t range) {
  return static_cast<index_t>((static_cast<std::uint64_t>(word) * range) >> 32);
}

// The choices of one sample; the definition both augment_choice and the kernel use.
// requires: 0 <= pad < 2^31 - 1.
KILN_HOST_DEVICE AugmentChoice augment_draw(std::uint64_t seed, std::uint64_t epoch, std::uint64_t sample,
                                            index_t pad, bool flip) {
  const PhiloxCounter r = augment_block(seed, epoch, sample);
  const std::uint64_t range = 2 * static_cast<std::uint64_t>(pad) + 1;
  AugmentChoice a;
  a.dy = augment_below(r.v[0], range);
  a.dx = augment_below(r.v[1], range);
  a.flip = flip && (r.v[2] >> 31) != 0;
  return a;
}

// fma in the compute type, identical on host and device (a single rounding).
KILN_HOST_DEVICE float augment_fma(float a, float b, float c) { return ::fmaf(a, b, c); }
KILN_HOST_DEVICE double augment_fma(double a, double b, double c) { return ::fma(a, b, c); }

inline void check_augment_pad(index_t pad) {
  KILN_CHECK(pad >= 0 && pad < index_t(0x7fffffff), ValueError, "augment: pad = ", pad,
             " must be in [0, 2147483647) (0 = no crop)");
}

}  // namespace detail

// The (dy, dx, flip) of global sample `sample_index` in epoch `epoch` under `options` (only
// seed, pad and flip matter): what augment() applies to that sample. Throws ValueError for a bad
// pad.
inline AugmentChoice augment_choice(const AugmentOptions& options, std::uint64_t epoch, std::uint64_t sample_index) {
  detail::check_augment_pad(options.pad);
  return detail::augment_draw(options.seed, epoch, sample_index, options.pad, options.flip);
}

// The augmentation kernel: dst = normalise(flip(crop(src))) for images [0, n) of one call, image i
// being global sample first_sample + i. Trivially copyable; build it with make_augment_kernel
// (which validates) and run it with augment(), or hand it to any executor's
// for_each_element(n·c, h·w, kernel, ...): element (plane, pixel) writes dst[plane·h·w + pixel].
template <class T>
struct AugmentKernel {
  using compute_type = compute_t<T>;

  const T* src;
  T* dst;
  index_t c, h, w, pad;
  std::uint64_t seed, epoch, first_sample;
  bool flip;
  bool affine;     // false: dst is the chosen source value itself (scale 1, no mean/std)
  index_t groups;  // per-channel constants (c) or one set for all (1)
  compute_type scale;
  compute_type mean[augment_max_channels];
  compute_type inv_std[augment_max_channels];

  // The choices of image i of this call.
  KILN_HOST_DEVICE AugmentChoice choice(index_t i) const {
    return detail::augment_draw(seed, epoch, first_sample + static_cast<std::uint64_t>(i), pad, flip);
  }

  // Output (plane = i·c + ch, y, x) given image i's choices: the documented formula.
  KILN_HOST_DEVICE T value(index_t plane, index_t y, index_t x, const AugmentChoice& a) const {
    const index_t sy = y + a.dy - pad;
    const index_t sx = (a.flip ? w - 1 - x : x) + a.dx - pad;
    const bool inside = sy >= 0 && sy < h && sx >= 0 && sx < w;
    const T v = inside ? src[(plane * h + sy) * w + sx] : convert<T>(compute_type(0));
    if (!affine) return v;
    const index_t k = plane % groups;
    return convert<T>(detail::augment_fma(convert<compute_type>(v), scale, -mean[k]) * inv_std[k]);
  }

  // One output element (the device path: one thread each).
  KILN_HOST_DEVICE void operator()(index_t plane, index_t pixel) const {
    const AugmentChoice a = choice(plane / c);
    const index_t y = pixel / w;
    dst[plane * h * w + pixel] = value(plane, y, pixel - y * w, a);
  }

  // Host: every element of images [ib, ie), each image's choices drawn once.
  void run(index_t ib, index_t ie) const {
    for (index_t i = ib; i < ie; ++i) {
      const AugmentChoice a = choice(i);
      for (index_t plane = i * c; plane < (i + 1) * c; ++plane) {
        T* KILN_RESTRICT out = dst + plane * h * w;
        for (index_t y = 0; y < h; ++y)
          for (index_t x = 0; x < w; ++x) out[y * w + x] = value(plane, y, x, a);
      }
    }
  }
};

static_assert(std::is_trivially_copyable_v<AugmentKernel<float>> && std::is_trivially_copyable_v<AugmentKernel<double>>,
              "kiln: AugmentKernel is passed to CUDA kernels by value");

// Validates the arguments and builds the kernel. Throws ShapeError for a non-positive n, c, h or
// w, a size whose element count overflows, mean / stddev sizes other than c, or more than
// augment_max_channels channels with normalisation; ValueError for a null pointer, a bad pad, a
// non-finite scale or mean, a stddev that is not finite and > 0; AliasError when src and dst
// overlap (the kernel reads neighbours of the element it writes: write to another buffer).
template <class T>
AugmentKernel<T> make_augment_kernel(const T* src, T* dst, index_t n, index_t c, index_t h, index_t w,
                                     const AugmentOptions& options, std::uint64_t epoch,
                                     std::uint64_t first_sample_index) {
  using C = compute_t<T>;
  KILN_CHECK(n > 0 && c > 0 && h > 0 && w > 0, ShapeError, "augment: sizes n = ", n, ", c = ", c, ", h = ", h,
             ", w = ", w, " must all be positive");
  constexpr index_t big = std::numeric_limits<index_t>::max() / index_t(sizeof(T)) / 2;
  KILN_CHECK(c <= big / n && h <= big / (n * c) && w <= big / (n * c * h), ShapeError, "augment: n × c × h × w = ",
             n, " × ", c, " × ", h, " × ", w, " elements overflow");
  detail::check_augment_pad(options.pad);
  KILN_CHECK(src != nullptr && dst != nullptr, ValueError, "augment: src (", static_cast<const void*>(src),
             ") and dst (", static_cast<const void*>(dst), ") must not be null");
  KILN_CHECK(std::isfinite(options.scale), ValueError, "augment: scale = ", options.scale, " must be finite");
  const std::size_t elements = static_cast<std::size_t>(n * c * h * w);
  const auto s0 = reinterpret_cast<std::uintptr_t>(src), d0 = reinterpret_cast<std::uintptr_t>(dst);
  const std::uintptr_t bytes = elements * sizeof(T);
  KILN_CHECK(s0 + bytes <= d0 || d0 + bytes <= s0, AliasError, "augment: src (", static_cast<const void*>(src),
             ") and dst (", static_cast<const void*>(dst), ") overlap within the ", bytes,
             " bytes of the batch; augment reads other elements than it writes, so dst must be a separate buffer");
  KILN_CHECK(options.mean.size() == options.stddev.size(), ShapeError, "augment: mean has ", options.mean.size(),
             " values but stddev has ", options.stddev.size(), " (both empty, or both one per channel)");
  const bool normalise = !options.mean.empty();
  if (normalise) {
    KILN_CHECK(options.mean.size() == static_cast<std::size_t>(c), ShapeError, "augment: mean and stddev have ",
               options.mean.size(), " values for c = ", c, " channels (one per channel)");
    KILN_CHECK(c <= augment_max_channels, ShapeError, "augment: normalisation supports at most ",
               augment_max_channels, " channels, got c = ", c);
    for (std::size_t k = 0; k < options.mean.size(); ++k) {
      KILN_CHECK(std::isfinite(options.mean[k]), ValueError, "augment: mean[", k, "] = ", options.mean[k],
                 " must be finite");
      KILN_CHECK(std::isfinite(options.stddev[k]) && options.stddev[k] > 0.0f, ValueError, "augment: stddev[", k,
                 "] = ", options.stddev[k], " must be finite and positive");
    }
  }
  AugmentKernel<T> k{};
  k.src = src;
  k.dst = dst;
  k.c = c;
  k.h = h;
  k.w = w;
  k.pad = options.pad;
  k.seed = options.seed;
  k.epoch = epoch;
  k.first_sample = first_sample_index;
  k.flip = options.flip;
  k.affine = normalise || options.scale != 1.0f;
  k.groups = normalise ? c : 1;
  k.scale = C(options.scale);
  for (index_t j = 0; j < augment_max_channels; ++j) {
    k.mean[j] = C(0);
    k.inv_std[j] = C(1);
  }
  if (normalise)
    for (index_t j = 0; j < c; ++j) {
      k.mean[j] = C(options.mean[static_cast<std::size_t>(j)]);
      k.inv_std[j] = C(1) / C(options.stddev[static_cast<std::size_t>(j)]);
    }
  return k;
}

// Writes dst = normalise(flip(crop(src))) for n images of c × h × w (image i = global sample
// first_sample_index + i of `epoch`), as ONE launch of kind::copy named "augment" on `exec`
// (CpuExecutor, CudaExecutor, ...; src and dst in its memory space). Errors: make_augment_kernel's,
// thrown before anything runs.
template <class Exec, class T>
void augment(Exec& exec, const T* src, T* dst, index_t n, index_t c, index_t h, index_t w,
             const AugmentOptions& options, std::uint64_t epoch, std::uint64_t first_sample_index) {
  const AugmentKernel<T> kernel = make_augment_kernel(src, dst, n, c, h, w, options, epoch, first_sample_index);
  const index_t elements = n * c * h * w;
  const std::size_t bytes = 2 * static_cast<std::size_t>(elements) * sizeof(T);
  if constexpr (std::is_same_v<typename Exec::space, host>) {
    exec.stats().count(kind::copy, "augment", elements, bytes);
    exec.parallel_for(n, std::max<index_t>(1, Exec::grain / (c * h * w)), [&](index_t ib, index_t ie) {
      const AugmentKernel<T> local = kernel;  // a private copy keeps its pointers in registers
      local.run(ib, ie);
    });
  } else {
    exec.for_each_element(n * c, h * w, kernel, kind::copy, "augment", bytes);
  }
}

// A training loop's use: batch b (a host data::Batch or a DeviceBatch: `features`, `size`, `dim`,
// `index`, `epoch`) with its features replaced by their augmentation, written into `images` (a
// Tensor<float, Space, dyn> in the batch's space, resized to fit and reused across batches). Image
// i of the batch is sample b.index * batch_size + i of epoch b.epoch: the choices follow the
// position in the epoch, so a rerun of the same epoch augments the same way.
//   Tensor<float, Space, dyn> images;
//   while (const auto* batch = loader.next()) step(data::augment_batch(exec, *batch, images, 3, 32, 32, aug, 128));
template <class Exec, class B, class Images>
B augment_batch(Exec& exec, const B& b, Images& images, index_t c, index_t h, index_t w, const AugmentOptions& options,
                index_t batch_size) {
  KILN_CHECK(b.dim == c * h * w, ShapeError, "augment_batch: the batch has ", b.dim, " features per row, not ", c,
             " x ", h, " x ", w);
  const index_t n = b.size * b.dim;
  if (images.size() < n) images = Images(Shape{n});
  const float* src = nullptr;
  if constexpr (requires { b.features.data(); }) src = b.features.data();
  else src = b.features;
  augment(exec, src, images.data(), b.size, c, h, w, options, std::uint64_t(b.epoch),
          std::uint64_t(b.index) * std::uint64_t(batch_size));
  B out = b;
  if constexpr (requires { b.features.data(); }) out.features = {images.data(), static_cast<std::size_t>(n)};
  else out.features = images.data();
  return out;
}

}  // namespace kiln::data
