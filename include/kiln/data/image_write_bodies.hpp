// kiln/data/image_write_bodies.hpp — the bodies of image_write.hpp: included by it when kiln is
// header-only, compiled once into kiln::kernels otherwise (src/kernels/bodies_image.cpp).
#pragma once

#include "kiln/data/image_bodies.hpp"  // its JPEG error handler (detail::JpegErrors)
#include "kiln/data/image_write.hpp"
#include "kiln/io/atomic_file.hpp"

#include <algorithm>
#include <cctype>
#include <csetjmp>
#include <string>

#if KILN_DATA_JPEG
#include <jpeglib.h>
#endif
#if KILN_DATA_PNG
#include <png.h>
#endif

namespace kiln::data {
namespace detail {

inline void check_encodable(const Image& image) {
  KILN_CHECK(image.channels == 1 || image.channels == 3, ValueError, "encode: an image of ", image.channels,
             " channels (1 or 3 can be encoded)");
  KILN_CHECK(image.height > 0 && image.width > 0 &&
                 image.pixels.size() == std::size_t(image.height * image.width * image.channels),
             ValueError, "encode: a ", image.height, " x ", image.width, " x ", image.channels, " image holds ",
             image.pixels.size(), " bytes");
}

#if KILN_DATA_PNG
extern "C" inline void png_write_to_vector(png_structp png, png_bytep data, png_size_t n) {
  auto* out = static_cast<std::vector<std::uint8_t>*>(png_get_io_ptr(png));
  out->insert(out->end(), data, data + n);
}
extern "C" inline void png_write_no_flush(png_structp) {}
extern "C" [[noreturn]] inline void png_write_fail(png_structp png, png_const_charp message) {
  auto* text = static_cast<std::string*>(png_get_error_ptr(png));
  *text = message;
  png_longjmp(png, 1);
}
#endif

}  // namespace detail

KILN_COMPILED std::vector<std::uint8_t> encode_png(const Image& image) {
  detail::check_encodable(image);
#if KILN_DATA_PNG
  std::vector<std::uint8_t> out;
  std::string message;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &message, detail::png_write_fail, nullptr);
  png_infop info = png ? png_create_info_struct(png) : nullptr;
  KILN_CHECK(png && info, DataError, "encode_png: libpng could not start (out of memory)");
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    throw DataError("encode_png: " + message);
  }
  png_set_write_fn(png, &out, detail::png_write_to_vector, detail::png_write_no_flush);
  png_set_IHDR(png, info, png_uint_32(image.width), png_uint_32(image.height), 8,
               image.channels == 3 ? PNG_COLOR_TYPE_RGB : PNG_COLOR_TYPE_GRAY, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  for (index_t y = 0; y < image.height; ++y)
    png_write_row(png, image.pixels.data() + std::size_t(y * image.width * image.channels));
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return out;
#else
  throw DataError("encode_png: kiln was built without libpng (install libpng-dev and reconfigure)");
#endif
}

KILN_COMPILED std::vector<std::uint8_t> encode_jpeg(const Image& image, int quality) {
  detail::check_encodable(image);
  KILN_CHECK(quality >= 1 && quality <= 100, ValueError, "encode_jpeg: quality ", quality, " is outside 1..100");
#if KILN_DATA_JPEG
  jpeg_compress_struct cinfo{};
  detail::JpegErrors error{};
  cinfo.err = jpeg_std_error(&error.pub);
  error.pub.error_exit = detail::jpeg_on_error;
  unsigned char* buffer = nullptr;
  unsigned long size = 0;  // NOLINT(google-runtime-int): libjpeg's type
  if (setjmp(error.jump)) {
    jpeg_destroy_compress(&cinfo);
    std::free(buffer);
    throw DataError(std::string("encode_jpeg: ") + error.message);
  }
  jpeg_create_compress(&cinfo);
  jpeg_mem_dest(&cinfo, &buffer, &size);
  cinfo.image_width = JDIMENSION(image.width);
  cinfo.image_height = JDIMENSION(image.height);
  cinfo.input_components = int(image.channels);
  cinfo.in_color_space = image.channels == 3 ? JCS_RGB : JCS_GRAYSCALE;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, quality, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<JSAMPROW>(image.pixels.data() + std::size_t(cinfo.next_scanline) *
                                                                  std::size_t(image.width * image.channels));
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  std::vector<std::uint8_t> out(buffer, buffer + size);
  jpeg_destroy_compress(&cinfo);
  std::free(buffer);
  return out;
#else
  (void)quality;
  throw DataError("encode_jpeg: kiln was built without libjpeg (install libjpeg62-turbo-dev and reconfigure)");
#endif
}

KILN_COMPILED void write_image(const std::filesystem::path& path, const Image& image, int quality) {
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  std::vector<std::uint8_t> bytes;
  try {
    if (ext == ".png") bytes = encode_png(image);
    else if (ext == ".jpg" || ext == ".jpeg") bytes = encode_jpeg(image, quality);
    else throw DataError("the extension must be .png, .jpg or .jpeg to choose a format");
  } catch (const DataError& e) {
    throw DataError(path.string() + ": " + e.what());
  }
  io::write_file_atomically(path.string(), {bytes.data(), bytes.size()});
}

}  // namespace kiln::data
