// kiln/data/image_bodies.hpp — the bodies of image.hpp's functions: included by it when kiln is
// header-only, compiled once into kiln::kernels otherwise (KILN_COMPILED, kiln/config.hpp).
//
// libjpeg and libpng report errors by calling a handler that must not return; both are given one
// that records the message and longjmp()s back to the function that called setjmp(). To keep
// that well-defined in C++, each decoder's state (the library structs, the message, the scratch
// rows) lives in a struct owned by the CALLER of the setjmp function, whose destructor releases
// the library's memory; the setjmp function itself holds no object with a destructor, and only
// returns a status when the jump lands. The caller then throws.
#pragma once

#include "kiln/data/image.hpp"

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <type_traits>

#if KILN_DATA_JPEG
#include <jerror.h>
#include <jpeglib.h>
#endif
#if KILN_DATA_PNG
#include <png.h>
#endif

namespace kiln::data {
namespace detail {

enum class DecodeStatus { done, failed, too_large };

// What the header said, the same for both formats.
inline bool image_size_ok(index_t height, index_t width, index_t max_pixels) {
  return height > 0 && width > 0 && width <= max_pixels / height;
}

[[noreturn]] inline void throw_image_too_large(const std::string& name, index_t height, index_t width,
                                               index_t max_pixels) {
  if (height <= 0 || width <= 0)
    throw DataError(::kiln::detail::concat(name, ": the header gives ", height, " x ", width, " pixels (none)"));
  throw DataError(::kiln::detail::concat(name, ": ", height, " x ", width, " = ", height * width,
                                         " pixels is over the limit of ", max_pixels,
                                         " (DecodeOptions::max_pixels), refused before decoding"));
}

inline constexpr std::uint8_t jpeg_magic[3] = {0xFF, 0xD8, 0xFF};
inline constexpr std::uint8_t png_magic[8] = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};

template <std::size_t N>
bool starts_with(std::span<const std::uint8_t> bytes, const std::uint8_t (&magic)[N]) {
  return bytes.size() >= N && std::equal(magic, magic + N, bytes.begin());
}
// All of `bytes` (shorter than the magic) is the magic's beginning: a truncated file of that type.
template <std::size_t N>
bool is_prefix_of(std::span<const std::uint8_t> bytes, const std::uint8_t (&magic)[N]) {
  return bytes.size() < N && std::equal(bytes.begin(), bytes.end(), magic);
}

// A name for the common image formats kiln does not decode, so the error says what the file is.
inline const char* other_image_format(std::span<const std::uint8_t> b) {
  auto is = [&](std::size_t at, const char* s) {
    const std::size_t n = std::strlen(s);
    return b.size() >= at + n && std::memcmp(b.data() + at, s, n) == 0;
  };
  if (is(0, "GIF87a") || is(0, "GIF89a")) return "a GIF image";
  if (is(0, "RIFF") && is(8, "WEBP")) return "a WebP image";
  if (is(0, "BM")) return "a BMP image";
  if (is(0, "II*") || is(0, "MM")) return "a TIFF image";
  return nullptr;
}

// The format from the magic bytes; DataError for an empty, too short or other file.
inline ImageFormat sniff_image_format(std::span<const std::uint8_t> bytes, const std::string& name) {
  if (starts_with(bytes, jpeg_magic)) return ImageFormat::jpeg;
  if (starts_with(bytes, png_magic)) return ImageFormat::png;
  if (bytes.empty()) throw DataError(::kiln::detail::concat(name, ": truncated: the file is empty"));
  if (is_prefix_of(bytes, jpeg_magic) || is_prefix_of(bytes, png_magic))
    throw DataError(::kiln::detail::concat(name, ": truncated: ", bytes.size(),
                                           " bytes, the start of a JPEG or PNG signature"));
  if (const char* other = other_image_format(bytes))
    throw DataError(::kiln::detail::concat(name, ": not a JPEG or PNG file (its first bytes are those of ",
                                           other, "; convert it to JPEG or PNG)"));
  std::string hex;
  for (std::size_t i = 0; i < std::min<std::size_t>(bytes.size(), 4); ++i) {
    static constexpr char digits[] = "0123456789abcdef";
    if (i) hex += ' ';
    hex += digits[bytes[i] >> 4];
    hex += digits[bytes[i] & 15];
  }
  throw DataError(::kiln::detail::concat(name, ": not a JPEG or PNG file (it starts with bytes ", hex,
                                         "; JPEG starts ff d8 ff, PNG 89 50 4e 47)"));
}

[[noreturn]] inline void throw_missing_library(const std::string& name, const char* format, const char* library,
                                               const char* define, const char* package) {
  throw DataError(::kiln::detail::concat(name, ": is a ", format, " file, and kiln was built without ", library,
                                         " (", define, "): install ", package, " and rebuild"));
}

#if KILN_DATA_JPEG

// A progressive JPEG has about 10 scans; thousands of tiny ones are a known way to make a small
// file cost minutes of decoding. libjpeg-turbo's djpeg offers the same guard (-maxscan).
inline constexpr int jpeg_max_scans = 1000;

struct JpegErrors {
  jpeg_error_mgr pub;  // first member: libjpeg hands back &pub, which is then this struct
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
  bool truncated;
};
static_assert(std::is_standard_layout_v<JpegErrors>, "kiln: JpegErrors is reached from its first member");

inline JpegErrors& jpeg_errors(j_common_ptr cinfo) { return *reinterpret_cast<JpegErrors*>(cinfo->err); }

inline void jpeg_on_error(j_common_ptr cinfo) {
  JpegErrors& e = jpeg_errors(cinfo);
  (*cinfo->err->format_message)(cinfo, e.message);
  std::longjmp(e.jump, 1);
}

// Level -1 is a warning (the others are trace messages). Every warning but the JFIF revision
// one reports corrupt or missing data: it ends the decode as an error.
inline void jpeg_on_message(j_common_ptr cinfo, int level) {
  if (level != -1 || cinfo->err->msg_code == JWRN_JFIF_MAJOR) return;
  JpegErrors& e = jpeg_errors(cinfo);
  e.truncated = cinfo->err->msg_code == JWRN_JPEG_EOF;
  (*cinfo->err->format_message)(cinfo, e.message);
  std::longjmp(e.jump, 1);
}

inline void jpeg_on_progress(j_common_ptr cinfo) {
  if (reinterpret_cast<j_decompress_ptr>(cinfo)->input_scan_number <= jpeg_max_scans) return;
  JpegErrors& e = jpeg_errors(cinfo);
  std::snprintf(e.message, sizeof e.message, "more than %d scans", jpeg_max_scans);
  std::longjmp(e.jump, 1);
}

struct JpegDecoder {
  jpeg_decompress_struct cinfo;
  JpegErrors errors;
  jpeg_progress_mgr progress;
  std::vector<std::uint8_t> cmyk_row;
  JpegDecoder() {
    std::memset(&cinfo, 0, sizeof cinfo);
    std::memset(&errors, 0, sizeof errors);
    std::memset(&progress, 0, sizeof progress);
  }
  JpegDecoder(const JpegDecoder&) = delete;
  JpegDecoder& operator=(const JpegDecoder&) = delete;
  // Safe at any stage: on the zeroed struct (creation failed or never ran) it does nothing.
  ~JpegDecoder() { jpeg_destroy_decompress(&cinfo); }
};

// PIL's CMYK → RGB (Convert.c, cmyk2rgb) on Adobe's inverted values, as PIL reads every CMYK
// JPEG: with c and k the ink amounts 255 − stored, R = (255 − k) − round(c·(255 − k) / 255).
inline std::uint8_t cmyk_channel(std::uint8_t stored_ink, std::uint8_t stored_black) {
  const int ink = 255 - stored_ink, not_black = stored_black;  // 255 − k = stored_black
  const int t = ink * not_black + 128;
  return static_cast<std::uint8_t>(std::clamp(not_black - (((t >> 8) + t) >> 8), 0, 255));
}

// Header (out == nullptr) or the whole image. Locals here have no destructors (see the top).
inline DecodeStatus jpeg_decode_steps(JpegDecoder& d, std::span<const std::uint8_t> bytes, Image* out,
                                      index_t max_pixels) {
  d.cinfo.err = jpeg_std_error(&d.errors.pub);
  d.errors.pub.error_exit = jpeg_on_error;
  d.errors.pub.emit_message = jpeg_on_message;
  if (setjmp(d.errors.jump)) return DecodeStatus::failed;
  jpeg_create_decompress(&d.cinfo);
  d.progress.progress_monitor = jpeg_on_progress;
  d.cinfo.progress = &d.progress;
  jpeg_mem_src(&d.cinfo, bytes.data(), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&d.cinfo, TRUE);
  if (out == nullptr) return DecodeStatus::done;
  if (!image_size_ok(d.cinfo.image_height, d.cinfo.image_width, max_pixels)) return DecodeStatus::too_large;
  // Grey and CMYK are converted here rather than by libjpeg: IJG's libjpeg has no grey → RGB.
  if (d.cinfo.jpeg_color_space == JCS_GRAYSCALE) d.cinfo.out_color_space = JCS_GRAYSCALE;
  else if (d.cinfo.jpeg_color_space == JCS_CMYK || d.cinfo.jpeg_color_space == JCS_YCCK)
    d.cinfo.out_color_space = JCS_CMYK;
  else d.cinfo.out_color_space = JCS_RGB;
  jpeg_start_decompress(&d.cinfo);
  const index_t h = d.cinfo.output_height, w = d.cinfo.output_width, comps = d.cinfo.output_components;
  if (comps != 1 && comps != 3 && comps != 4) {
    std::snprintf(d.errors.message, sizeof d.errors.message, "%d colour components", int(comps));
    return DecodeStatus::failed;
  }
  out->height = h;
  out->width = w;
  out->channels = 3;
  out->pixels.resize(static_cast<std::size_t>(h * w * 3));
  if (comps == 4) d.cmyk_row.resize(static_cast<std::size_t>(w * 4));
  while (d.cinfo.output_scanline < d.cinfo.output_height) {
    std::uint8_t* dst = out->pixels.data() + index_t(d.cinfo.output_scanline) * w * 3;
    JSAMPROW row = comps == 4 ? d.cmyk_row.data() : dst;
    jpeg_read_scanlines(&d.cinfo, &row, 1);
    if (comps == 1) {  // grey in the row's first w bytes: spread from the end, never overwriting unread ones
      for (index_t x = w - 1; x >= 0; --x) dst[3 * x] = dst[3 * x + 1] = dst[3 * x + 2] = dst[x];
    } else if (comps == 4) {
      const std::uint8_t* s = d.cmyk_row.data();
      for (index_t x = 0; x < w; ++x)
        for (int c = 0; c < 3; ++c) dst[3 * x + c] = cmyk_channel(s[4 * x + c], s[4 * x + 3]);
    }
  }
  // No jpeg_finish_decompress: every pixel is in, and what follows the scan is not the image's.
  return DecodeStatus::done;
}

[[noreturn]] inline void throw_jpeg_error(const std::string& name, const JpegDecoder& d) {
  std::string_view why = d.errors.message;
  constexpr std::string_view prefix = "Corrupt JPEG data: ";  // libjpeg's own, said once
  if (why.substr(0, prefix.size()) == prefix) why.remove_prefix(prefix.size());
  throw DataError(::kiln::detail::concat(name, d.errors.truncated ? ": truncated JPEG data: " : ": corrupt JPEG data: ",
                                         why));
}

#endif  // KILN_DATA_JPEG

#if KILN_DATA_PNG

struct PngDecoder {
  png_structp png = nullptr;
  png_infop info = nullptr;
  std::span<const std::uint8_t> bytes;
  std::size_t pos = 0;
  bool truncated = false;
  char message[256] = {};
  std::vector<png_bytep> rows;
  PngDecoder() = default;
  PngDecoder(const PngDecoder&) = delete;
  PngDecoder& operator=(const PngDecoder&) = delete;
  ~PngDecoder() {
    if (png) png_destroy_read_struct(&png, info ? &info : nullptr, nullptr);
  }
};

inline void png_on_error(png_structp png, png_const_charp message) {
  auto* d = static_cast<PngDecoder*>(png_get_error_ptr(png));
  std::snprintf(d->message, sizeof d->message, "%s", message);
  png_longjmp(png, 1);
}
// libpng's warnings concern ancillary chunks (colour profiles, text, a bad CRC in one of them),
// never the pixels: ignored, as PIL ignores them.
inline void png_on_warning(png_structp, png_const_charp) {}

inline void png_read_bytes(png_structp png, png_bytep out, png_size_t n) {
  auto* d = static_cast<PngDecoder*>(png_get_io_ptr(png));
  if (n > d->bytes.size() - d->pos) {
    d->truncated = true;
    png_error(png, "the file ends early");
  }
  std::memcpy(out, d->bytes.data() + d->pos, n);
  d->pos += n;
}

// Deflate's best ratio is 1032:1 (a 258-byte match in two bits); a file that claims more raw
// scanline bytes than that times its own size cannot hold its pixels, so it is refused as
// truncated before the buffer is allocated.
inline bool png_data_fits(const PngDecoder& d, png_uint_32 height, png_uint_32 width, int bit_depth, int color_type) {
  const int channels = (color_type & PNG_COLOR_MASK_PALETTE) ? 1 : (color_type & PNG_COLOR_MASK_COLOR ? 3 : 1) +
                                                                       (color_type & PNG_COLOR_MASK_ALPHA ? 1 : 0);
  const double row_bytes = 1.0 + static_cast<double>((static_cast<std::uint64_t>(width) * unsigned(channels) *
                                                          unsigned(bit_depth) + 7) / 8);
  return static_cast<double>(height) * row_bytes <= 1032.0 * static_cast<double>(d.bytes.size()) + 1032.0;
}

inline DecodeStatus png_decode_steps(PngDecoder& d, Image* out, index_t max_pixels) {
  if (setjmp(png_jmpbuf(d.png))) return DecodeStatus::failed;
  png_set_read_fn(d.png, &d, png_read_bytes);
  png_read_info(d.png, d.info);
  if (out == nullptr) return DecodeStatus::done;
  const png_uint_32 h = png_get_image_height(d.png, d.info), w = png_get_image_width(d.png, d.info);
  if (!image_size_ok(h, w, max_pixels)) return DecodeStatus::too_large;
  const int bit_depth = png_get_bit_depth(d.png, d.info), color_type = png_get_color_type(d.png, d.info);
  if (!png_data_fits(d, h, w, bit_depth, color_type)) {
    d.truncated = true;
    return DecodeStatus::failed;
  }
  if (color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(d.png);
  if (color_type == PNG_COLOR_TYPE_GRAY && bit_depth < 8) png_set_expand_gray_1_2_4_to_8(d.png);
  if (bit_depth == 16) png_set_strip_16(d.png);
  png_set_strip_alpha(d.png);  // also the alpha that palette expansion makes of tRNS
  if (!(color_type & PNG_COLOR_MASK_COLOR)) png_set_gray_to_rgb(d.png);
  png_set_interlace_handling(d.png);
  png_read_update_info(d.png, d.info);
  if (png_get_rowbytes(d.png, d.info) != static_cast<png_size_t>(w) * 3) {
    std::snprintf(d.message, sizeof d.message, "colour type %d at %d bits does not convert to RGB8", color_type,
                  bit_depth);
    return DecodeStatus::failed;
  }
  out->height = h;
  out->width = w;
  out->channels = 3;
  out->pixels.resize(static_cast<std::size_t>(h) * w * 3);
  d.rows.resize(h);
  for (png_uint_32 y = 0; y < h; ++y) d.rows[y] = out->pixels.data() + static_cast<std::size_t>(y) * w * 3;
  png_read_image(d.png, d.rows.data());
  // No png_read_end: the pixels are in and zlib has checked them; a missing IEND is no reason to fail.
  return DecodeStatus::done;
}

[[noreturn]] inline void throw_png_error(const std::string& name, const PngDecoder& d) {
  if (d.truncated)
    throw DataError(::kiln::detail::concat(name, ": truncated PNG data: the file's ", d.bytes.size(),
                                           " bytes end before its pixel data does"));
  throw DataError(::kiln::detail::concat(name, ": corrupt PNG data: ", d.message));
}

inline void png_create(PngDecoder& d, std::span<const std::uint8_t> bytes, const std::string& name) {
  d.bytes = bytes;
  d.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &d, png_on_error, png_on_warning);
  if (d.png) d.info = png_create_info_struct(d.png);
  if (!d.png || !d.info) throw DataError(::kiln::detail::concat(name, ": libpng could not allocate its state"));
}

#endif  // KILN_DATA_PNG

// Header or whole image of either format; `out` null for the header only.
inline ImageInfo decode_into(std::span<const std::uint8_t> bytes, const std::string& name, const DecodeOptions& options,
                             Image* out) {
  KILN_CHECK(options.max_pixels > 0, ValueError, "DecodeOptions: max_pixels = ", options.max_pixels,
             " must be positive");
  ImageInfo info;
  info.format = sniff_image_format(bytes, name);
  if (info.format == ImageFormat::jpeg) {
#if KILN_DATA_JPEG
    JpegDecoder d;
    const DecodeStatus status = jpeg_decode_steps(d, bytes, out, options.max_pixels);
    if (status == DecodeStatus::failed) throw_jpeg_error(name, d);
    info.height = d.cinfo.image_height;
    info.width = d.cinfo.image_width;
#else
    (void)out;
    throw_missing_library(name, "JPEG", "libjpeg", "KILN_HAVE_JPEG", "libjpeg62-turbo-dev (Debian)");
#endif
  } else {
#if KILN_DATA_PNG
    PngDecoder d;
    png_create(d, bytes, name);
    const DecodeStatus status = png_decode_steps(d, out, options.max_pixels);
    if (status == DecodeStatus::failed) throw_png_error(name, d);
    info.height = png_get_image_height(d.png, d.info);
    info.width = png_get_image_width(d.png, d.info);
#else
    (void)out;
    throw_missing_library(name, "PNG", "libpng", "KILN_HAVE_PNG", "libpng-dev (Debian)");
#endif
  }
  if (!image_size_ok(info.height, info.width, options.max_pixels))
    throw_image_too_large(name, info.height, info.width, options.max_pixels);
  return info;
}

}  // namespace detail

KILN_COMPILED ImageInfo read_image_info(std::span<const std::uint8_t> bytes, const std::string& name,
                                        const DecodeOptions& options) {
  return detail::decode_into(bytes, name, options, nullptr);
}

KILN_COMPILED Image decode_image(std::span<const std::uint8_t> bytes, const std::string& name,
                                 const DecodeOptions& options) {
  Image image;
  detail::decode_into(bytes, name, options, &image);
  return image;
}

KILN_COMPILED Image read_image(const std::filesystem::path& path, const DecodeOptions& options) {
  const std::vector<std::uint8_t> bytes = read_raw_file(path);
  return decode_image(bytes, path.string(), options);
}

}  // namespace kiln::data
