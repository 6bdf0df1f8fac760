// kiln/data/image.hpp — JPEG and PNG files decoded to 8-bit RGB (what data::ImageFolder reads).
//
//   kiln::data::Image img = kiln::data::read_image("train/cat/001.jpg");   // HWC, RGB8
//   std::uint8_t green = img.at(10, 20, 1);                                // row 10, column 20
//
// Every image comes out as 3-channel 8-bit RGB, as torchvision's loader makes it with PIL's
// convert("RGB"): grey repeated into R, G and B; a palette looked up; alpha (and tRNS
// transparency) dropped, not composited; 16-bit PNG samples reduced to their high byte (PIL
// does this for 16-bit RGB; for 16-bit grey PIL saturates, which turns most images white — the
// high byte is the useful reduction); CMYK and YCCK JPEGs converted with PIL's formula
// (R = (255 − K) − (255 − K)·C / 255, the stored values taken as Adobe's inverted CMYK, as PIL
// assumes for every CMYK JPEG). Colour profiles and gamma are ignored, as PIL ignores them.
//
// The format comes from the magic bytes (FF D8 FF: JPEG; 89 'PNG' 0D 0A 1A 0A: PNG), never from
// the file name. JPEG is decoded with libjpeg(-turbo), PNG with libpng, when the build found them
// (KILN_HAVE_JPEG / KILN_HAVE_PNG, set by CMake's kiln target); without one, decoding that format
// is a DataError that says so.
//
// Errors are DataError "<name>: <what>", never exit() or a silently grey image:
//   "truncated: ..."                      the file ends before its header or its pixel data does
//   "not a JPEG or PNG file ..."          other magic bytes (a GIF, BMP, WebP or TIFF is named)
//   "corrupt JPEG data: <libjpeg's message>", "truncated JPEG data: Premature end of JPEG file"
//   "corrupt PNG data: <libpng's message>"
//   "<h> x <w> = <n> pixels is over the limit of <m>"   (checked from the header, before any
//                                                        pixel memory is allocated)
// libjpeg's warnings are errors here: they report corrupt or missing entropy-coded data, which
// libjpeg would otherwise decode as grey blocks. The one exception is "unknown JFIF revision",
// which says nothing about the pixels. Nothing after the pixel data is read: a PNG without IEND
// decodes (zlib has checked every pixel byte by then), and so do bytes after a JPEG's last scan;
// but libjpeg reads a little past the last pixel, so a JPEG cut anywhere — even just its 2-byte
// end marker — is "truncated JPEG data".
#pragma once

#include <kiln/config.hpp>
#include <kiln/core/error.hpp>
#include <kiln/data/file.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#if defined(KILN_HAVE_JPEG) && KILN_HAVE_JPEG
#define KILN_DATA_JPEG 1
#else
#define KILN_DATA_JPEG 0
#endif
#if defined(KILN_HAVE_PNG) && KILN_HAVE_PNG
#define KILN_DATA_PNG 1
#else
#define KILN_DATA_PNG 0
#endif

namespace kiln::data {

// Whether this build decodes JPEG (libjpeg) and PNG (libpng).
inline constexpr bool have_jpeg = KILN_DATA_JPEG != 0;
inline constexpr bool have_png = KILN_DATA_PNG != 0;

// A decoded image: height × width pixels of `channels` bytes each, row-major and interleaved
// (HWC). Decoding always gives channels = 3 (RGB); the transforms accept any channel count.
struct Image {
  index_t height = 0;
  index_t width = 0;
  index_t channels = 3;
  std::vector<std::uint8_t> pixels;  // height × width × channels

  std::size_t offset(index_t y, index_t x, index_t c) const {
    return static_cast<std::size_t>((y * width + x) * channels + c);
  }
  std::uint8_t at(index_t y, index_t x, index_t c) const { return pixels[offset(y, x, c)]; }
  std::uint8_t& at(index_t y, index_t x, index_t c) { return pixels[offset(y, x, c)]; }
  bool operator==(const Image&) const = default;
};

enum class ImageFormat { jpeg, png };

// What the header says, without the pixels.
struct ImageInfo {
  ImageFormat format = ImageFormat::jpeg;
  index_t height = 0;
  index_t width = 0;
};

// 2^28 pixels (16384 × 16384, 768 MiB as RGB): far above any photograph a classifier trains on,
// far below what a hostile header can claim (65500 × 65500 for JPEG, 2^31 − 1 squared for PNG).
inline constexpr index_t default_max_image_pixels = index_t{1} << 28;

struct DecodeOptions {
  // Images whose header claims more pixels than this are refused before decoding.
  index_t max_pixels = default_max_image_pixels;
};

// The header's size and format. Reads no pixel data (a file truncated in its pixel data passes).
// Throws DataError as described above.
KILN_COMPILED ImageInfo read_image_info(std::span<const std::uint8_t> bytes, const std::string& name,
                                        const DecodeOptions& options = {});

// Decodes a whole JPEG or PNG file held in memory; `name` labels errors.
KILN_COMPILED Image decode_image(std::span<const std::uint8_t> bytes, const std::string& name,
                                 const DecodeOptions& options = {});

// Reads and decodes a file (the file is not decompressed: a .gz image is not an image).
KILN_COMPILED Image read_image(const std::filesystem::path& path, const DecodeOptions& options = {});

}  // namespace kiln::data

#if KILN_HEADER_BODIES
#include "kiln/data/image_bodies.hpp"
#endif
