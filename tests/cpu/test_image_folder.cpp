// Image folders for fine-tuning: JPEG / PNG decoding (against the encoders' own input), the
// transforms (against formulas, an independent resize and PIL's golden values), ImageFolder's
// scan, split and errors, and the on-demand Dataset through the Loader. Every file is written
// here, under a temporary folder, by libpng and libjpeg: nothing is downloaded.
#include <kiln/data/dataset.hpp>
#include <kiln/data/idx.hpp>
#include <kiln/data/image.hpp>
#include <kiln/data/image_folder.hpp>
#include <kiln/data/image_transforms.hpp>
#include <kiln/data/image_write.hpp>
#include <kiln/data/loader.hpp>
#include <kiln/data/normalize.hpp>

#include <doctest/doctest.h>

#include "data_helpers.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <csetjmp>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <tuple>
#include <vector>

#if KILN_HAVE_JPEG && KILN_HAVE_PNG && KILN_HAVE_ZLIB
#include <fcntl.h>
#include <jpeglib.h>
#include <png.h>
#include <unistd.h>
#include <zlib.h>
#endif

#ifndef KILN_SOURCE_DIR
#error "the build defines KILN_SOURCE_DIR (the repository root) so tests find data/"
#endif

namespace fs = std::filesystem;
using kiln::index_t;
using kiln::data::CropBox;
using kiln::data::Image;
using kiln_test::Bytes;
using kiln_test::check_data_error;

#if KILN_HAVE_JPEG && KILN_HAVE_PNG && KILN_HAVE_ZLIB

namespace {

// A fresh directory per test run, removed at exit, so concurrent runs do not collide.
const fs::path& temp_dir() {
  static const struct Dir {
    fs::path path;
    Dir() {
      const auto stamp = std::chrono::steady_clock::now().time_since_epoch().count();
      path = fs::temp_directory_path() / ("kiln_test_images_" + std::to_string(stamp));
      fs::create_directories(path);
    }
    ~Dir() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  } dir;
  return dir.path;
}

fs::path write_file(const fs::path& path, const Bytes& bytes) {
  fs::create_directories(path.parent_path());
  return kiln_test::write_bytes(path, bytes);
}

// The test images of scripts/golden_image_resize.py: (y*37 + x*91 + c*53 + ((x*y) % 7)*11 + salt) % 256.
Image pattern(index_t h, index_t w, int salt = 0) {
  Image img{h, w, 3, std::vector<std::uint8_t>(static_cast<std::size_t>(h * w * 3))};
  for (index_t y = 0; y < h; ++y)
    for (index_t x = 0; x < w; ++x)
      for (index_t c = 0; c < 3; ++c)
        img.at(y, x, c) = static_cast<std::uint8_t>((y * 37 + x * 91 + c * 53 + ((x * y) % 7) * 11 + salt) % 256);
  return img;
}

std::uint64_t fnv1a(const Image& img) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (std::uint8_t b : img.pixels) {
    h ^= b;
    h *= 0x100000001b3ull;
  }
  return h;
}

// ---- encoders (the test's own use of libpng and libjpeg) ----------------------------------------

void png_append(png_structp png, png_bytep data, png_size_t n) {
  auto* out = static_cast<Bytes*>(png_get_io_ptr(png));
  out->insert(out->end(), data, data + n);
}
void png_no_flush(png_structp) {}

struct PngSpec {
  int color_type = PNG_COLOR_TYPE_RGB;
  int bit_depth = 8;
  bool interlace = false;
  std::vector<png_color> palette;
  std::vector<png_byte> transparency;  // tRNS for a palette
};
PngSpec png_spec(int color_type, int bit_depth) {
  PngSpec spec;
  spec.color_type = color_type;
  spec.bit_depth = bit_depth;
  return spec;
}

// rows: each row's packed sample bytes as PNG stores them (big-endian 16-bit samples).
Bytes encode_png(index_t h, index_t w, const std::vector<Bytes>& rows, const PngSpec& spec) {
  Bytes out;
  std::vector<png_bytep> pointers;
  for (const Bytes& r : rows) pointers.push_back(const_cast<png_bytep>(r.data()));
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    return {};
  }
  png_set_write_fn(png, &out, png_append, png_no_flush);
  png_set_IHDR(png, info, png_uint_32(w), png_uint_32(h), spec.bit_depth, spec.color_type,
               spec.interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  if (!spec.palette.empty()) png_set_PLTE(png, info, spec.palette.data(), int(spec.palette.size()));
  if (!spec.transparency.empty())
    png_set_tRNS(png, info, spec.transparency.data(), int(spec.transparency.size()), nullptr);
  png_write_info(png, info);
  png_write_image(png, pointers.data());
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return out;
}

Bytes encode_png_rgb(const Image& img) {
  std::vector<Bytes> rows;
  for (index_t y = 0; y < img.height; ++y)
    rows.emplace_back(img.pixels.begin() + std::ptrdiff_t(img.offset(y, 0, 0)),
                      img.pixels.begin() + std::ptrdiff_t(img.offset(y, 0, 0) + std::size_t(img.width * 3)));
  return encode_png(img.height, img.width, rows, {});
}

struct JpegSpec {
  int quality = 95;
  bool full_chroma = false;  // 4:4:4 instead of libjpeg's default 4:2:0
  J_COLOR_SPACE in_space = JCS_RGB;
  int components = 3;
};

// samples: height × width × components bytes.
Bytes encode_jpeg(index_t h, index_t w, const std::vector<std::uint8_t>& samples, const JpegSpec& spec) {
  jpeg_compress_struct cinfo;
  jpeg_error_mgr err;
  cinfo.err = jpeg_std_error(&err);
  jpeg_create_compress(&cinfo);
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&cinfo, &buffer, &size);
  cinfo.image_width = JDIMENSION(w);
  cinfo.image_height = JDIMENSION(h);
  cinfo.input_components = spec.components;
  cinfo.in_color_space = spec.in_space;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, spec.quality, TRUE);
  if (spec.full_chroma)
    for (int c = 0; c < cinfo.num_components; ++c) cinfo.comp_info[c].h_samp_factor = cinfo.comp_info[c].v_samp_factor = 1;
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<JSAMPROW>(samples.data() + std::size_t(cinfo.next_scanline) * std::size_t(w * spec.components));
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  Bytes out(buffer, buffer + size);
  jpeg_destroy_compress(&cinfo);
  std::free(buffer);
  return out;
}

Bytes encode_jpeg_rgb(const Image& img, int quality = 95, bool full_chroma = false) {
  return encode_jpeg(img.height, img.width, img.pixels, {quality, full_chroma});
}

// A PNG chunk: length, type, data, CRC-32 of type and data.
void png_chunk(Bytes& out, const char* type, const Bytes& data) {
  for (int s = 24; s >= 0; s -= 8) out.push_back(std::uint8_t(data.size() >> s));
  Bytes body(type, type + 4);
  body.insert(body.end(), data.begin(), data.end());
  out.insert(out.end(), body.begin(), body.end());
  const auto crc = static_cast<std::uint32_t>(crc32(0, body.data(), uInt(body.size())));
  for (int s = 24; s >= 0; s -= 8) out.push_back(std::uint8_t(crc >> s));
}

// A PNG whose header claims width × height RGB8 and holds a few bytes of image data.
Bytes png_header_only(std::uint32_t width, std::uint32_t height) {
  Bytes out{0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};
  Bytes ihdr;
  for (std::uint32_t v : {width, height})
    for (int s = 24; s >= 0; s -= 8) ihdr.push_back(std::uint8_t(v >> s));
  ihdr.insert(ihdr.end(), {8, 2, 0, 0, 0});
  png_chunk(out, "IHDR", ihdr);
  png_chunk(out, "IDAT", {0x78, 0x9c, 0x63, 0x00, 0x00});
  png_chunk(out, "IEND", {});
  return out;
}

// Runs f with stderr sent to a file, and returns what was written there.
template <class F>
std::string capture_stderr(F f) {
  const fs::path path = temp_dir() / "stderr.txt";
  std::fflush(stderr);
  const int saved = dup(2);
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  dup2(fd, 2);
  close(fd);
  try {
    f();
  } catch (...) {
    std::fflush(stderr);
    dup2(saved, 2);
    close(saved);
    throw;
  }
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// ---- the digits folder ----------------------------------------------------------------------------

// The first 40 digits of digits20's training set, 20 × 20 grey, drawn at 64 × 64 as RGB
// (v, 255 − v, v / 2) so the channels differ.
std::vector<Image> digit_images() {
  static const std::vector<Image> images = [] {
    const kiln::data::IdxArray raw =
        kiln::data::read_idx(fs::path(KILN_SOURCE_DIR) / "data" / "digits20-train-images-idx3-ubyte.gz");
    std::vector<Image> out;
    for (index_t k = 0; k < 40; ++k) {
      Image img{64, 64, 3, std::vector<std::uint8_t>(64 * 64 * 3)};
      for (index_t y = 0; y < 64; ++y)
        for (index_t x = 0; x < 64; ++x) {
          const std::uint8_t v = raw.data[std::size_t(k * 400 + (y * 20 / 64) * 20 + x * 20 / 64)];
          img.at(y, x, 0) = v;
          img.at(y, x, 1) = std::uint8_t(255 - v);
          img.at(y, x, 2) = std::uint8_t(v / 2);
        }
      out.push_back(std::move(img));
    }
    return out;
  }();
  return images;
}

// Class folders named so that byte order differs from case-insensitive order: "Bird" < "ant" < "cat".
const std::vector<std::string> digit_classes = {"Bird", "ant", "cat"};

struct DigitFile {
  fs::path path;
  int label;
  int digit;
  bool png;
};

// Writes digits k = 0..39 to root/<class k % 3>/..., PNG for even k and JPEG (quality 95, 4:4:4) for
// odd k, with mixed-case extensions, every fifth in a sub-folder; plus files the scan must ignore.
// Returns the files in the order ImageFolder must list them.
std::vector<DigitFile> write_digit_folder(const fs::path& root) {
  const std::vector<Image> images = digit_images();
  std::vector<DigitFile> files;
  const char* png_ext[] = {".png", ".PNG"};
  const char* jpeg_ext[] = {".jpg", ".JPEG", ".Jpg", ".jpeg"};
  for (int k = 0; k < 40; ++k) {
    const int label = k % 3;
    const bool png = k % 2 == 0;
    char name[32];
    std::snprintf(name, sizeof name, "d%02d%s", 39 - k, png ? png_ext[k / 2 % 2] : jpeg_ext[k / 2 % 4]);
    const fs::path folder = root / digit_classes[std::size_t(label)] / (k % 5 == 0 ? "sub" : "");
    const fs::path path = folder / name;
    write_file(path, png ? encode_png_rgb(images[std::size_t(k)]) : encode_jpeg_rgb(images[std::size_t(k)], 95, true));
    files.push_back({path.lexically_normal(), label, k, png});
  }
  // Not images, or hidden: ignored.
  write_file(root / "ant" / "notes.txt", {'h', 'i'});
  write_file(root / "ant" / ".hidden.png", encode_png_rgb(images[0]));
  write_file(root / ".cache" / "x.png", encode_png_rgb(images[0]));
  write_file(root / "README.md", {'#'});
  // The expected order: by class, then files in the class folder by name, then sub/ by name.
  std::sort(files.begin(), files.end(), [](const DigitFile& a, const DigitFile& b) {
    const bool a_sub = a.path.parent_path().filename() == "sub", b_sub = b.path.parent_path().filename() == "sub";
    return std::tuple(a.label, a_sub, a.path.filename().string()) < std::tuple(b.label, b_sub, b.path.filename().string());
  });
  return files;
}

const fs::path& digit_root() {
  static const fs::path root = [] {
    const fs::path r = temp_dir() / "digits";
    write_digit_folder(r);
    return r;
  }();
  return root;
}

// Largest and mean absolute difference of two images of one size.
std::pair<int, double> image_difference(const Image& a, const Image& b) {
  REQUIRE(a.pixels.size() == b.pixels.size());
  int worst = 0;
  double total = 0;
  for (std::size_t i = 0; i < a.pixels.size(); ++i) {
    const int d = std::abs(int(a.pixels[i]) - int(b.pixels[i]));
    worst = std::max(worst, d);
    total += d;
  }
  return {worst, total / double(a.pixels.size())};
}

// An independent antialiased bilinear resize: every output pixel is the triangle-filter average
// (support scaled by the downscale factor) over all source pixels, separable, in double, rounded
// once. PIL's fixed point and 8-bit intermediate keep it within 1 of this.
Image reference_resize(const Image& src, index_t oh, index_t ow) {
  auto weights = [](index_t in, index_t out, index_t o) {
    const double scale = double(in) / double(out), fs_ = std::max(scale, 1.0), center = (o + 0.5) * scale;
    std::vector<double> w(static_cast<std::size_t>(in));
    double sum = 0;
    for (index_t i = 0; i < in; ++i) {
      const double t = std::abs((i + 0.5 - center) / fs_);
      w[std::size_t(i)] = t < 1 ? 1 - t : 0;
      sum += w[std::size_t(i)];
    }
    for (double& v : w) v /= sum;
    return w;
  };
  Image out{oh, ow, src.channels, std::vector<std::uint8_t>(std::size_t(oh * ow * src.channels))};
  for (index_t y = 0; y < oh; ++y) {
    const std::vector<double> wy = weights(src.height, oh, y);
    for (index_t x = 0; x < ow; ++x) {
      const std::vector<double> wx = weights(src.width, ow, x);
      for (index_t c = 0; c < src.channels; ++c) {
        double v = 0;
        for (index_t i = 0; i < src.height; ++i)
          if (wy[std::size_t(i)] != 0)
            for (index_t j = 0; j < src.width; ++j) v += wy[std::size_t(i)] * wx[std::size_t(j)] * src.at(i, j, c);
        out.at(y, x, c) = std::uint8_t(std::clamp(std::lround(v), 0l, 255l));
      }
    }
  }
  return out;
}

// scripts/golden_image_resize.py: Pillow 13.0.0, torchvision 0.29.2+cu132
// golden_down_4x5: 4 x 5
const std::vector<int> golden_down_4x5 = {
    102, 134, 147, 128, 149, 115, 116, 169, 121, 122, 148, 119, 117, 111, 142, 129, 133, 154, 126, 139,
    96,  113, 144, 96,  153, 135, 92,  122, 98,  109, 129, 140, 150, 130, 95,  140, 142, 150, 91,  126,
    112, 116, 113, 122, 118, 114, 119, 151, 120, 130, 132, 118, 171, 127, 120, 127, 140, 128, 114, 147};
constexpr std::uint64_t golden_mixed_14x6 = 0xf11c5cee40031446ull;  // 14 x 6
constexpr std::uint64_t golden_up_9x23 = 0x944c72990dfce2d9ull;     // 9 x 23
// golden_crop_resize_5x5: 5 x 5
const std::vector<int> golden_crop_resize_5x5 = {
    156, 209, 24,  99,  152, 115, 155, 198, 52,  144, 167, 108, 143, 159, 79,  123, 115, 58,  63,
    116, 118, 172, 137, 69,  141, 103, 115, 188, 70,  93,  165, 48,  101, 119, 172, 83,  181, 72,
    78,  98,  151, 90,  133, 101, 69,  98,  90,  143, 147, 200, 111, 107, 102, 108, 146, 126, 138,
    111, 109, 131, 51,  104, 157, 160, 213, 123, 78,  131, 137, 167, 106, 159, 114, 81,  134};
constexpr std::uint64_t golden_big_down_7x5 = 0x194b3620938dffbdull;  // 7 x 5
constexpr std::uint64_t golden_eval_30x45 = 0x45615de5b3d61de2ull;    // 16 x 16
constexpr std::uint64_t golden_eval_pad_7x5 = 0x58b140524d6df25cull;  // 9 x 9

std::vector<int> as_ints(const Image& img) { return {img.pixels.begin(), img.pixels.end()}; }

// What one epoch of a loader delivered.
struct Seen {
  std::vector<std::vector<index_t>> rows;
  std::vector<std::vector<float>> features;
  std::vector<std::vector<std::int32_t>> labels;
  bool operator==(const Seen&) const = default;
};

}  // namespace

// ---- decoding -----------------------------------------------------------------------------------

TEST_CASE("image: PNG decodes bit-exactly, every colour type becoming RGB8") {
  const Image rgb = pattern(13, 17);
  const fs::path path = write_file(temp_dir() / "rgb.png", encode_png_rgb(rgb));
  CHECK(kiln::data::read_image(path) == rgb);

  // Interlaced (Adam7).
  std::vector<Bytes> rgb_rows;
  for (index_t y = 0; y < rgb.height; ++y)
    rgb_rows.emplace_back(rgb.pixels.begin() + std::ptrdiff_t(rgb.offset(y, 0, 0)),
                          rgb.pixels.begin() + std::ptrdiff_t(rgb.offset(y + 1, 0, 0)));
  PngSpec interlaced;
  interlaced.interlace = true;
  CHECK(kiln::data::decode_image(encode_png(13, 17, rgb_rows, interlaced), "i.png") == rgb);

  // Grey 8-bit, grey 1-bit, grey + alpha, RGBA, 16-bit RGB and grey, a palette with tRNS.
  const index_t h = 5, w = 9;
  std::vector<Bytes> grey, bits, grey_alpha, rgba, rgb16, grey16, indexed;
  Image want_grey{h, w, 3, {}}, want_bits{h, w, 3, {}}, want_rgb16{h, w, 3, {}}, want_rgba{h, w, 3, {}},
      want_indexed{h, w, 3, {}};
  const std::vector<png_color> palette = {{10, 20, 30}, {200, 100, 0}, {7, 250, 128}, {255, 255, 255}};
  for (index_t y = 0; y < h; ++y) {
    Bytes g, b((w + 7) / 8, 0), ga, a, c16, g16, p((w + 3) / 4, 0);
    for (index_t x = 0; x < w; ++x) {
      const auto v = std::uint8_t(y * 50 + x * 3), u = std::uint8_t(255 - x * 20), s = std::uint8_t(x * 7 + y);
      g.push_back(v);
      want_grey.pixels.insert(want_grey.pixels.end(), {v, v, v});
      const bool on = (x + y) % 3 == 0;
      if (on) b[std::size_t(x / 8)] |= std::uint8_t(0x80 >> (x % 8));
      const std::uint8_t bit = on ? 255 : 0;
      want_bits.pixels.insert(want_bits.pixels.end(), {bit, bit, bit});
      ga.insert(ga.end(), {v, u});
      a.insert(a.end(), {v, u, s, std::uint8_t(x * 30)});  // alpha is dropped, not composited
      want_rgba.pixels.insert(want_rgba.pixels.end(), {v, u, s});
      c16.insert(c16.end(), {v, 0x7f, u, 0xff, s, 0x01});  // big-endian: the high byte is kept
      want_rgb16.pixels.insert(want_rgb16.pixels.end(), {v, u, s});
      g16.insert(g16.end(), {v, 0xee});
      const int index = int((x + 2 * y) % 4);
      p[std::size_t(x / 4)] |= std::uint8_t(index << (6 - 2 * (x % 4)));
      const png_color col = palette[std::size_t(index)];
      want_indexed.pixels.insert(want_indexed.pixels.end(), {col.red, col.green, col.blue});
    }
    grey.push_back(g);
    bits.push_back(b);
    grey_alpha.push_back(ga);
    rgba.push_back(a);
    rgb16.push_back(c16);
    grey16.push_back(g16);
    indexed.push_back(p);
  }
  auto decode = [&](const std::vector<Bytes>& rows, PngSpec spec) {
    const Bytes bytes = encode_png(h, w, rows, spec);
    REQUIRE(!bytes.empty());
    return kiln::data::decode_image(bytes, "t.png");
  };
  CHECK(decode(grey, png_spec(PNG_COLOR_TYPE_GRAY, 8)) == want_grey);
  CHECK(decode(bits, png_spec(PNG_COLOR_TYPE_GRAY, 1)) == want_bits);
  CHECK(decode(grey_alpha, png_spec(PNG_COLOR_TYPE_GRAY_ALPHA, 8)) == want_grey);
  CHECK(decode(rgba, png_spec(PNG_COLOR_TYPE_RGB_ALPHA, 8)) == want_rgba);
  CHECK(decode(rgb16, png_spec(PNG_COLOR_TYPE_RGB, 16)) == want_rgb16);
  CHECK(decode(grey16, png_spec(PNG_COLOR_TYPE_GRAY, 16)) == want_grey);
  PngSpec pal = png_spec(PNG_COLOR_TYPE_PALETTE, 2);
  pal.palette = palette;
  pal.transparency = {255, 0};  // entry 1 transparent: ignored, as PIL's convert("RGB") does
  CHECK(decode(indexed, pal) == want_indexed);

  const kiln::data::ImageInfo info = kiln::data::read_image_info(encode_png_rgb(rgb), "x.png");
  CHECK(info.format == kiln::data::ImageFormat::png);
  CHECK(info.height == 13);
  CHECK(info.width == 17);
}

TEST_CASE("image: JPEG at quality 95 stays close to its source; grey and CMYK JPEGs become RGB") {
  const Image img = digit_images()[3];
  // 4:4:4 at quality 95: close everywhere.
  const Image full = kiln::data::decode_image(encode_jpeg_rgb(img, 95, true), "q95.jpg");
  REQUIRE(full.height == 64);
  REQUIRE(full.width == 64);
  const auto [worst, mean] = image_difference(full, img);
  CAPTURE(worst);
  CAPTURE(mean);
  CHECK(worst <= 24);
  CHECK(mean < 1.5);
  // libjpeg's default 4:2:0 halves the colour resolution (these red / green edges are its worst
  // case), but keeps the luma: that stays close.
  const Image sub = kiln::data::decode_image(encode_jpeg_rgb(img), "q95.jpg");
  auto luma = [](const Image& m, index_t i) {
    return 0.299 * m.pixels[std::size_t(3 * i)] + 0.587 * m.pixels[std::size_t(3 * i + 1)] +
           0.114 * m.pixels[std::size_t(3 * i + 2)];
  };
  double luma_error = 0;
  for (index_t i = 0; i < 64 * 64; ++i) luma_error += std::abs(luma(sub, i) - luma(img, i));
  CHECK(luma_error / (64 * 64) < 1.5);

  // Grey: three equal channels close to the source.
  std::vector<std::uint8_t> grey(16 * 24);
  for (index_t i = 0; i < 16 * 24; ++i) grey[std::size_t(i)] = std::uint8_t(100 + (i % 24) * 3);
  const Image g = kiln::data::decode_image(encode_jpeg(16, 24, grey, {95, false, JCS_GRAYSCALE, 1}), "g.jpg");
  REQUIRE(g.pixels.size() == 16 * 24 * 3);
  int grey_worst = 0;
  for (index_t i = 0; i < 16 * 24; ++i) {
    CHECK(g.pixels[std::size_t(3 * i)] == g.pixels[std::size_t(3 * i + 1)]);
    CHECK(g.pixels[std::size_t(3 * i)] == g.pixels[std::size_t(3 * i + 2)]);
    grey_worst = std::max(grey_worst, std::abs(int(g.pixels[std::size_t(3 * i)]) - int(grey[std::size_t(i)])));
  }
  CHECK(grey_worst <= 3);

  // CMYK (libjpeg writes an Adobe marker): the stored values are read as Adobe's inverted inks,
  // then PIL's formula R = (255 - k) - round(c (255 - k) / 255).
  std::vector<std::uint8_t> cmyk;
  for (int i = 0; i < 16 * 16; ++i) cmyk.insert(cmyk.end(), {200, 100, 50, 220});
  const Image fromcmyk = kiln::data::decode_image(encode_jpeg(16, 16, cmyk, {95, true, JCS_CMYK, 4}), "c.jpg");
  auto pil = [](int stored, int stored_k) {
    const int t = (255 - stored) * stored_k + 128;
    return stored_k - (((t >> 8) + t) >> 8);
  };
  for (index_t c = 0; c < 3; ++c) {
    CAPTURE(c);
    CHECK(std::abs(int(fromcmyk.at(7, 7, c)) - pil(std::array{200, 100, 50}[std::size_t(c)], 220)) <= 2);
  }
}

TEST_CASE("image: the format comes from the magic bytes, not the file name") {
  const Image rgb = pattern(6, 7);
  const fs::path png_named_jpg = write_file(temp_dir() / "really_png.jpg", encode_png_rgb(rgb));
  CHECK(kiln::data::read_image(png_named_jpg) == rgb);
  const fs::path jpg_named_png = write_file(temp_dir() / "really_jpeg.png", encode_jpeg_rgb(rgb, 100, true));
  const kiln::data::ImageInfo info = kiln::data::read_image_info(kiln::data::read_raw_file(jpg_named_png), "x");
  CHECK(info.format == kiln::data::ImageFormat::jpeg);
  CHECK(kiln::data::read_image(jpg_named_png).width == 7);
}

TEST_CASE("image: errors name the file and what is wrong") {
  const fs::path dir = temp_dir() / "bad";
  auto check = [&](const std::string& name, const Bytes& bytes, std::initializer_list<std::string> parts,
                   kiln::data::DecodeOptions options = {}) {
    const fs::path path = write_file(dir / name, bytes);
    check_data_error([&] { kiln::data::read_image(path, options); }, path, parts);
  };
  const Image img = digit_images()[0];
  const Bytes png = encode_png_rgb(img), jpeg = encode_jpeg_rgb(img);

  check("empty.png", {}, {"truncated", "empty"});
  check("short.png", {0x89, 'P', 'N'}, {"truncated"});
  check("text.jpg", {'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd'},
        {"not a JPEG or PNG file", "68 65 6c 6c"});
  check("anim.png", {'G', 'I', 'F', '8', '9', 'a', 1, 0, 1, 0}, {"not a JPEG or PNG file", "GIF"});

  Bytes cut_png(png.begin(), png.begin() + std::ptrdiff_t(png.size() * 6 / 10));
  check("cut.png", cut_png, {"truncated PNG data"});
  // The header alone still reads (the scan's check), the pixels do not.
  CHECK(kiln::data::read_image_info(cut_png, "cut.png").width == 64);
  Bytes bad_crc = png;
  bad_crc[20] ^= 0x40;  // inside IHDR's data: its CRC no longer matches
  check("crc.png", bad_crc, {"corrupt PNG data", "CRC"});

  Bytes cut_jpeg(jpeg.begin(), jpeg.begin() + std::ptrdiff_t(jpeg.size() * 6 / 10));
  check("cut.jpg", cut_jpeg, {"truncated JPEG data", "Premature end of JPEG file"});
  // An RST marker in the middle of the entropy-coded data (there are no restart intervals).
  Bytes marker = jpeg;
  std::size_t sos = 0;
  for (std::size_t i = 0; i + 1 < marker.size(); ++i)
    if (marker[i] == 0xFF && marker[i + 1] == 0xDA) sos = i;
  REQUIRE(sos > 0);
  const std::size_t middle = sos + (marker.size() - sos) / 2;
  marker[middle] = 0xFF;
  marker[middle + 1] = 0xD3;
  check("marker.jpg", marker, {"corrupt JPEG data"});
  // Garbage in the scan: libjpeg's warnings are errors, never grey blocks.
  Bytes garbage = jpeg;
  for (std::size_t i = sos + 20; i < garbage.size() - 10; i += 3) garbage[i] = std::uint8_t(garbage[i] * 7 + 1);
  const fs::path garbage_path = write_file(dir / "garbage.jpg", garbage);
  check_data_error([&] { kiln::data::read_image(garbage_path); }, garbage_path, {"JPEG data"});
  Bytes precision = jpeg;  // SOF0's sample precision byte: 7 bits is not a JPEG libjpeg reads
  for (std::size_t i = 0; i + 4 < precision.size(); ++i)
    if (precision[i] == 0xFF && precision[i + 1] == 0xC0) {
      precision[i + 4] = 7;
      break;
    }
  check("precision.jpg", precision, {"corrupt JPEG data", "precision"});

  // Over the pixel limit, refused from the header: 100000 x 100000 RGB would be 30 GB.
  const Bytes huge = png_header_only(100000, 100000);
  check("huge.png", huge, {"100000 x 100000", "over the limit of 268435456"});
  const fs::path huge_path = dir / "huge.png";
  check_data_error([&] { kiln::data::read_image_info(kiln::data::read_raw_file(huge_path), huge_path.string()); },
                   huge_path, {"over the limit"});
  // Under the limit but far beyond what its bytes can hold (deflate's 1032:1): truncated, before
  // 300 MB are allocated.
  check("tall.png", png_header_only(10000, 10000), {"truncated PNG data"});
  // The limit is an option, for JPEG as well.
  check("limit.jpg", jpeg, {"64 x 64 = 4096 pixels is over the limit of 4095"}, {.max_pixels = 4095});
  CHECK_NOTHROW(kiln::data::decode_image(jpeg, "ok.jpg", {.max_pixels = 4096}));

  const fs::path missing = dir / "missing.png";
  check_data_error([&] { kiln::data::read_image(missing); }, missing, {"cannot open"});
}

// ---- transforms -----------------------------------------------------------------------------------

TEST_CASE("image transforms: crop, center crop and flip against their formulas") {
  const Image img = pattern(30, 45, 9);
  // Python's round((45 - 16) / 2) = round(14.5) = 14 (half to even); round(7.0) = 7.
  CHECK(kiln::data::center_crop_box(30, 45, 16, 16) == CropBox{7, 14, 16, 16});
  CHECK(kiln::data::center_crop_box(259, 257, 224, 224) == CropBox{18, 16, 224, 224});  // 17.5 → 18, 16.5 → 16
  CHECK(kiln::data::center_crop_box(7, 5, 9, 9) == CropBox{-1, -2, 9, 9});              // padded (2 // 2, 4 // 2)
  const Image cc = kiln::data::center_crop(img, 16, 16);
  int wrong = 0;
  for (index_t y = 0; y < 16; ++y)
    for (index_t x = 0; x < 16; ++x)
      for (index_t c = 0; c < 3; ++c) wrong += cc.at(y, x, c) != img.at(y + 7, x + 14, c);
  CHECK(wrong == 0);
  // Larger than the image: zeros around it.
  const Image small = pattern(7, 5, 3);
  const Image padded = kiln::data::center_crop(small, 9, 9);
  wrong = 0;
  for (index_t y = 0; y < 9; ++y)
    for (index_t x = 0; x < 9; ++x)
      for (index_t c = 0; c < 3; ++c) {
        const index_t sy = y - 1, sx = x - 2;
        const bool inside = sy >= 0 && sy < 7 && sx >= 0 && sx < 5;
        wrong += padded.at(y, x, c) != (inside ? small.at(sy, sx, c) : 0);
      }
  CHECK(wrong == 0);
  const Image flipped = kiln::data::hflip(img);
  wrong = 0;
  for (index_t y = 0; y < img.height; ++y)
    for (index_t x = 0; x < img.width; ++x)
      for (index_t c = 0; c < 3; ++c) wrong += flipped.at(y, x, c) != img.at(y, img.width - 1 - x, c);
  CHECK(wrong == 0);
  CHECK(kiln::data::hflip(flipped) == img);
  // Resize(s): the shorter side becomes s, the longer int(s * long / short).
  CHECK(kiln::data::shorter_side_size(375, 500, 256) == std::pair<index_t, index_t>{256, 341});
  CHECK(kiln::data::shorter_side_size(500, 375, 256) == std::pair<index_t, index_t>{341, 256});
  CHECK(kiln::data::shorter_side_size(7, 5, 6) == std::pair<index_t, index_t>{8, 6});
}

TEST_CASE("image transforms: resize is PIL's antialiased bilinear (golden values) and within 1 of a plain reference") {
  const Image a = pattern(9, 11);
  CHECK(as_ints(kiln::data::resize(a, 4, 5)) == golden_down_4x5);
  CHECK(fnv1a(kiln::data::resize(a, 14, 6)) == golden_mixed_14x6);
  CHECK(fnv1a(kiln::data::resize(a, 9, 23)) == golden_up_9x23);
  CHECK(as_ints(kiln::data::resize(kiln::data::crop(a, {2, 3, 6, 7}), 5, 5)) == golden_crop_resize_5x5);
  CHECK(as_ints(kiln::data::resize_crop(a, {2, 3, 6, 7}, 5, 5, {0, 0, 5, 5})) == golden_crop_resize_5x5);
  CHECK(fnv1a(kiln::data::resize(pattern(64, 48, 5), 7, 5)) == golden_big_down_7x5);
  CHECK(fnv1a(kiln::data::center_crop(kiln::data::resize_shorter_side(pattern(30, 45, 9), 20), 16, 16)) ==
        golden_eval_30x45);
  CHECK(fnv1a(kiln::data::center_crop(kiln::data::resize_shorter_side(pattern(7, 5, 3), 6), 9, 9)) ==
        golden_eval_pad_7x5);
  // The same size is a copy.
  CHECK(kiln::data::resize(a, 9, 11) == a);

  const Image digit = digit_images()[5];
  for (const auto& [h, w] : std::vector<std::pair<index_t, index_t>>{
           {64, 64}, {17, 23}, {5, 3}, {1, 1}, {100, 64}, {64, 150}, {31, 7}, {224, 224}}) {
    CAPTURE(h);
    CAPTURE(w);
    const auto [worst, mean] = image_difference(kiln::data::resize(digit, h, w), reference_resize(digit, h, w));
    CHECK(worst <= 1);
    CHECK(mean < 0.5);
  }
  // A window of a resize is the same pixels as the resize cropped, zeros outside it.
  const CropBox region{5, 9, 40, 33};
  const Image whole = kiln::data::resize(kiln::data::crop(digit, region), 27, 19);
  for (const CropBox window : {CropBox{0, 0, 27, 19}, CropBox{3, 4, 10, 11}, CropBox{-2, -3, 31, 25}, CropBox{20, 15, 9, 9}}) {
    CAPTURE(window.top);
    CAPTURE(window.left);
    CHECK(kiln::data::resize_crop(digit, region, 27, 19, window) == kiln::data::crop(whole, window));
  }
}

TEST_CASE("image transforms: ToTensor + Normalize are torchvision's float operations, planar") {
  const Image img = pattern(5, 6, 1);
  const std::vector<float> mean = kiln::data::imagenet_mean(), stddev = kiln::data::imagenet_std();
  std::vector<float> out(3 * 5 * 6), plain(3 * 5 * 6), mirrored(3 * 5 * 6);
  kiln::data::to_tensor(img, out, mean, stddev);
  kiln::data::to_tensor(img, plain);
  kiln::data::to_tensor(img, mirrored, mean, stddev, true);
  int wrong = 0;
  double worst = 0;
  for (index_t c = 0; c < 3; ++c)
    for (index_t y = 0; y < 5; ++y)
      for (index_t x = 0; x < 6; ++x) {
        const std::size_t at = std::size_t((c * 5 + y) * 6 + x);
        const float v = float(img.at(y, x, c)) / 255.0f;
        wrong += plain[at] != v;
        wrong += out[at] != (v - mean[std::size_t(c)]) / stddev[std::size_t(c)];
        wrong += mirrored[at] != (float(img.at(y, 5 - x, c)) / 255.0f - mean[std::size_t(c)]) / stddev[std::size_t(c)];
        worst = std::max(worst, std::abs(double(out[at]) - (img.at(y, x, c) / 255.0 - mean[std::size_t(c)]) /
                                                               stddev[std::size_t(c)]));
      }
  CHECK(wrong == 0);
  CHECK(worst < 1e-6);
  CHECK(mean == std::vector<float>{0.485f, 0.456f, 0.406f});
  CHECK(stddev == std::vector<float>{0.229f, 0.224f, 0.225f});
}

TEST_CASE("image transforms: RandomResizedCrop is torchvision's algorithm, a pure function of (seed, epoch, sample)") {
  const kiln::data::RandomResizedCropOptions opt;
  int moved = 0, fitted = 0, flips = 0;
  for (std::uint64_t s = 0; s < 400; ++s) {
    const CropBox b = kiln::data::random_resized_crop_box(120, 160, opt, 11, 3, s);
    CHECK(b == kiln::data::random_resized_crop_box(120, 160, opt, 11, 3, s));
    moved += !(b == kiln::data::random_resized_crop_box(120, 160, opt, 11, 4, s));
    moved += !(b == kiln::data::random_resized_crop_box(120, 160, opt, 12, 3, s));
    CHECK(b.top >= 0);
    CHECK(b.left >= 0);
    CHECK(b.top + b.height <= 120);
    CHECK(b.left + b.width <= 160);
    // A drawn box (not the fallback) has area and ratio within the ranges, up to the rounding of
    // its sides to whole pixels.
    const double area = double(b.height * b.width) / (120.0 * 160.0), ratio = double(b.width) / double(b.height);
    if (!(b == CropBox{0, 0, 120, 160})) {
      ++fitted;
      CHECK(area >= 0.08 * 0.97);
      CHECK(ratio >= 0.75 * 0.97);
      CHECK(ratio <= 4.0 / 3.0 * 1.03);
    }
    flips += kiln::data::flip_draw(0.5, 11, 3, s);
  }
  CHECK(moved >= 790);  // another epoch or seed: another box (almost always)
  CHECK(fitted >= 390);
  CHECK(flips > 150);
  CHECK(flips < 250);
  CHECK_FALSE(kiln::data::flip_draw(0.0, 1, 2, 3));
  CHECK(kiln::data::flip_draw(1.0, 1, 2, 3));

  // No attempt can fit (area fraction 2): the fallback is the central crop within the ratio range.
  kiln::data::RandomResizedCropOptions never;
  never.scale_min = never.scale_max = 2.0;
  CHECK(kiln::data::random_resized_crop_box(50, 200, never, 1, 0, 0) == CropBox{0, 66, 50, 67});  // round(50·4/3)
  CHECK(kiln::data::random_resized_crop_box(200, 50, never, 1, 0, 0) == CropBox{66, 0, 67, 50});  // round(50/(3/4))
  CHECK(kiln::data::random_resized_crop_box(90, 100, never, 1, 0, 0) == CropBox{0, 0, 90, 100});
  CHECK(kiln::data::random_resized_crop_box(90, 100, {.attempts = 0}, 1, 0, 0) == CropBox{0, 0, 90, 100});

  CHECK_THROWS_AS(kiln::data::random_resized_crop_box(9, 9, {.scale_min = 0.5, .scale_max = 0.1}, 0, 0, 0),
                  kiln::ValueError);
  CHECK_THROWS_AS(kiln::data::random_resized_crop_box(9, 9, {.ratio_min = 0}, 0, 0, 0), kiln::ValueError);
}

TEST_CASE("image transforms: the eval and train pipelines are the functions composed") {
  const Image img = digit_images()[7];
  const auto eval = kiln::data::ImageTransform::eval(32, 40);
  std::vector<float> got(std::size_t(eval.features())), want(std::size_t(eval.features()));
  eval.apply(img, got, 5, 0, 1);
  kiln::data::to_tensor(kiln::data::center_crop(kiln::data::resize_shorter_side(img, 40), 32, 32), want, eval.mean,
                        eval.stddev);
  CHECK(got == want);
  std::vector<float> again(got.size());
  eval.apply(img, again, 9, 4, 2);  // no randomness in eval
  CHECK(again == got);

  const auto train = kiln::data::ImageTransform::train(24);
  CHECK(train.features() == 3 * 24 * 24);
  std::vector<float> t(std::size_t(train.features())), u(t.size());
  int differ = 0;
  for (std::uint64_t s = 0; s < 8; ++s) {
    train.apply(img, t, 5, 2, s);
    const CropBox box = kiln::data::random_resized_crop_box(64, 64, train.crop, 5, 2, s);
    kiln::data::to_tensor(kiln::data::resize(kiln::data::crop(img, box), 24, 24), u, train.mean, train.stddev,
                          kiln::data::flip_draw(0.5, 5, 2, s));
    CHECK(t == u);
    train.apply(img, u, 5, 3, s);
    differ += t != u;
  }
  CHECK(differ >= 7);

  kiln::data::ImageTransform bad = eval;
  bad.mean = {0.5f};
  CHECK_THROWS_AS(bad.validate(), kiln::ValueError);
  bad = eval;
  bad.stddev[1] = 0;
  CHECK_THROWS_AS(bad.validate(), kiln::ValueError);
  std::vector<float> short_out(10);
  CHECK_THROWS_AS(eval.apply(img, short_out), kiln::ShapeError);
}

// ---- ImageFolder ------------------------------------------------------------------------------------

TEST_CASE("ImageFolder: classes in byte order, files in torchvision's order, labels, decoding") {
  const fs::path root = temp_dir() / "order";
  const std::vector<DigitFile> files = write_digit_folder(root);
  const kiln::data::ImageFolder folder(root);
  CHECK(folder.class_names() == digit_classes);  // "Bird" < "ant" < "cat"; .cache is hidden
  CHECK(folder.num_classes() == 3);
  REQUIRE(folder.size() == 40);
  CHECK(folder.skipped() == 0);
  CHECK(folder.class_counts() == std::vector<index_t>{14, 13, 13});
  const std::vector<Image> images = digit_images();
  for (index_t i = 0; i < 40; ++i) {
    const DigitFile& f = files[std::size_t(i)];
    CAPTURE(f.path);
    CHECK(folder.path(i).lexically_normal() == f.path);
    CHECK(folder.label(i) == f.label);
    const Image img = folder.load(i);
    if (f.png) {
      CHECK(img == images[std::size_t(f.digit)]);
    } else {
      CHECK(image_difference(img, images[std::size_t(f.digit)]).second < 2.0);  // quality 95, 4:4:4
    }
  }
  // Sub-folders come after the class folder's own files.
  CHECK(folder.path(13).parent_path().filename() == "sub");
  CHECK(folder.path(10).parent_path().filename() == "Bird");
}

TEST_CASE("ImageFolder: every scan error is a DataError naming the folder or file") {
  const fs::path base = temp_dir() / "errors";
  const Bytes png = encode_png_rgb(pattern(8, 8));
  const fs::path missing = base / "missing";
  check_data_error([&] { kiln::data::ImageFolder f(missing); }, missing, {"no such folder"});
  const fs::path file = write_file(base / "file.png", png);
  check_data_error([&] { kiln::data::ImageFolder f(file); }, file, {"not a folder"});
  const fs::path flat = base / "flat";
  write_file(flat / "a.png", png);
  check_data_error([&] { kiln::data::ImageFolder f(flat); }, flat, {"no class folders"});
  const fs::path none = base / "none";
  write_file(none / "a" / "readme.txt", {'x'});
  fs::create_directories(none / "b");
  check_data_error([&] { kiln::data::ImageFolder f(none); }, none, {"no images", "2 class folders"});
  const fs::path one_empty = base / "one_empty";
  write_file(one_empty / "cat" / "1.png", png);
  write_file(one_empty / "dog" / "notes.txt", {'x'});
  fs::create_directories(one_empty / "eel");
  check_data_error([&] { kiln::data::ImageFolder f(one_empty); }, one_empty / "dog",
                   {"class folder without images", (one_empty / "eel").string()});

  // Bad files: the first (in scan order) fails the scan by default; skip_bad_files leaves each out
  // with a warning line naming it.
  const fs::path bad = base / "bad";
  write_digit_folder(bad);
  const fs::path text = write_file(bad / "ant" / "d99.jpg", {'n', 'o', 't', ' ', 'a', 'n', ' ', 'i', 'm', 'g'});
  const Bytes jpeg = encode_jpeg_rgb(digit_images()[1]);
  std::size_t sos = 0;
  for (std::size_t i = 0; i + 1 < jpeg.size(); ++i)
    if (jpeg[i] == 0xFF && jpeg[i + 1] == 0xDA) sos = i;
  REQUIRE(sos > 0);
  // Cut soon after the start of scan: the header is whole, the pixel data is not.
  const fs::path cut = write_file(bad / "cat" / "d98.jpg", Bytes(jpeg.begin(), jpeg.begin() + std::ptrdiff_t(sos + 40)));
  check_data_error([&] { kiln::data::ImageFolder f(bad); }, text, {"not a JPEG or PNG file"});
  std::string warnings;
  kiln::data::ImageFolderOptions skip;
  skip.skip_bad_files = true;
  skip.threads = 2;
  index_t kept = 0, skipped = 0;
  warnings = capture_stderr([&] {
    const kiln::data::ImageFolder f(bad, skip);
    kept = f.size();
    skipped = f.skipped();
    CHECK(f.skipped_files() == std::vector<fs::path>{text});
  });
  CHECK(kept == 41);  // the truncated JPEG's header is sound: the header check keeps it
  CHECK(skipped == 1);
  CHECK(warnings.find(text.string()) != std::string::npos);
  CHECK(warnings.find("not a JPEG or PNG file") != std::string::npos);
  // Decoding every file while scanning finds the truncated one too.
  skip.check = kiln::data::ImageCheck::decode;
  warnings = capture_stderr([&] {
    const kiln::data::ImageFolder f(bad, skip);
    kept = f.size();
    CHECK(f.skipped_files() == std::vector<fs::path>{text, cut});
  });
  CHECK(kept == 40);
  CHECK(warnings.find(cut.string() + ": truncated JPEG data") != std::string::npos);
  // Without a check the scan takes the names only; the loader meets the bad file.
  const kiln::data::ImageFolder unchecked(bad, {.check = kiln::data::ImageCheck::none});
  CHECK(unchecked.size() == 42);
  const kiln::data::Dataset ds = kiln::data::image_folder_dataset(unchecked, kiln::data::ImageTransform::eval(16, 16));
  kiln::data::Loader loader(ds, {.batch_size = 8, .shuffle = false, .workers = 2});
  loader.start_epoch(0);
  check_data_error([&] { while (loader.next()) {} }, text, {"not a JPEG or PNG file"});
  // A class whose every file is bad is still an error with skipping.
  const fs::path all_bad = base / "all_bad";
  write_file(all_bad / "a" / "1.png", png);
  write_file(all_bad / "b" / "1.png", {'x', 'y', 'z'});
  capture_stderr([&] {
    check_data_error([&] { kiln::data::ImageFolder f(all_bad, {.skip_bad_files = true}); }, all_bad / "b",
                     {"every one of its files was skipped"});
  });
}

TEST_CASE("ImageFolder: a stratified split, deterministic by seed") {
  const kiln::data::ImageFolder folder(digit_root());
  const auto [first, second] = folder.split_indices(0.25, 7);
  CHECK(first.size() + second.size() == 40);
  std::vector<index_t> all(first);
  all.insert(all.end(), second.begin(), second.end());
  std::sort(all.begin(), all.end());
  for (index_t i = 0; i < 40; ++i) CHECK(all[std::size_t(i)] == i);
  CHECK(std::is_sorted(first.begin(), first.end()));
  CHECK(std::is_sorted(second.begin(), second.end()));
  // Each class in proportion: round(14 / 4) = 4 (3.5 rounds away from zero), round(13 / 4) = 3.
  std::vector<int> per_class(3, 0);
  for (index_t i : second) ++per_class[std::size_t(folder.label(i))];
  CHECK(per_class == std::vector<int>{4, 3, 3});
  CHECK(folder.split_indices(0.25, 7) == std::pair{first, second});
  CHECK_FALSE(folder.split_indices(0.25, 8).second == second);
  const kiln::data::ImageFolderSplit parts = folder.split(0.25, 7);
  REQUIRE(parts.second.size() == 10);
  CHECK(parts.second.class_names() == folder.class_names());
  for (std::size_t k = 0; k < second.size(); ++k) {
    CHECK(parts.second.path(index_t(k)) == folder.path(second[k]));
    CHECK(parts.second.label(index_t(k)) == folder.label(second[k]));
  }
  // Both parts see every class while it has two images; the edges are exact.
  CHECK(folder.split_indices(0.01, 1).second.size() == 3);
  CHECK(folder.split_indices(0.99, 1).first.size() == 3);
  CHECK(folder.split_indices(0.0, 1).second.empty());
  CHECK(folder.split_indices(1.0, 1).first.empty());
  CHECK_THROWS_AS(folder.split_indices(1.5, 1), kiln::ValueError);
}

TEST_CASE("ImageFolder dataset: rows produced on demand, the same batches with 0 and 2 workers") {
  const kiln::data::ImageFolder folder(digit_root());
  const auto train = kiln::data::ImageTransform::train(24);
  const kiln::data::Dataset ds = kiln::data::image_folder_dataset(folder, train, 17);
  CHECK(ds.n == 40);
  CHECK(ds.d == 3 * 24 * 24);
  CHECK(ds.num_classes == 3);
  CHECK(ds.sample_shape == std::vector<index_t>{3, 24, 24});
  CHECK(ds.features.empty());
  CHECK(ds.on_demand());
  CHECK(ds.labels == folder.labels());
  CHECK_NOTHROW(ds.validate());

  auto run = [&](int workers, index_t epoch) {
    kiln::data::Loader loader(ds, {.batch_size = 7, .seed = 3, .workers = workers, .prefetch = 2});
    Seen seen;
    loader.start_epoch(epoch);
    while (const kiln::data::Batch* b = loader.next()) {
      seen.rows.emplace_back(b->rows.begin(), b->rows.end());
      seen.features.emplace_back(b->features.begin(), b->features.end());
      seen.labels.emplace_back(b->labels.begin(), b->labels.end());
    }
    return seen;
  };
  const Seen serial = run(0, 1), parallel = run(2, 1);
  CHECK(serial.rows.size() == 6);
  CHECK(serial == parallel);
  const Seen next_epoch = run(2, 2);
  CHECK_FALSE(next_epoch.features == serial.features);
  // Each row is the transform of its file, with the draws of (seed, epoch, row).
  std::vector<float> want(std::size_t(ds.d));
  for (std::size_t k = 0; k < 7; ++k) {
    const index_t row = serial.rows[0][k];
    train.apply(folder.load(row), want, 17, 1, std::uint64_t(row));
    CHECK(std::equal(want.begin(), want.end(), serial.features[0].begin() + std::ptrdiff_t(k * want.size())));
    CHECK(serial.labels[0][k] == folder.label(row));
  }
  // A subset keeps producing, through its row map; split() works on the dataset as well.
  const std::vector<index_t> rows = {5, 2, 5};
  const kiln::data::Dataset sub = kiln::data::subset(ds, rows);
  CHECK(sub.on_demand());
  CHECK(sub.features.empty());
  CHECK_NOTHROW(sub.validate());
  std::vector<float> a(std::size_t(ds.d)), b(std::size_t(ds.d));
  sub.read_row(1, 4, a);
  ds.read_row(2, 4, b);
  CHECK(a == b);
  CHECK(sub.labels == std::vector<std::int32_t>{folder.label(5), folder.label(2), folder.label(5)});
  const kiln::data::Split halves = kiln::data::split(ds, 30, {.seed = 2, .stratified = true});
  CHECK(halves.first.n == 30);
  CHECK(halves.second.on_demand());
  // An on-demand dataset has no features to hold as well, or to fit statistics on.
  kiln::data::Dataset both = ds;
  both.features.assign(std::size_t(ds.n * ds.d), 0.0f);
  CHECK_THROWS_AS(both.validate(), kiln::ValueError);
  CHECK_THROWS_AS(kiln::data::fit_normalizer(ds, {.standardize = kiln::data::Standardize::global}), kiln::ValueError);
}

#else  // a build without libjpeg, libpng or zlib: decoding says what is missing

TEST_CASE("image: a build without libjpeg or libpng names the library it lacks") {
  const Bytes jpeg = {0xFF, 0xD8, 0xFF, 0xE0, 0, 16};
  if (!kiln::data::have_jpeg)
    check_data_error([&] { kiln::data::decode_image(jpeg, "x.jpg"); }, "x.jpg", {"built without libjpeg"});
  const Bytes png = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A, 0};
  if (!kiln::data::have_png)
    check_data_error([&] { kiln::data::decode_image(png, "x.png"); }, "x.png", {"built without libpng"});
}

#endif

// ---- writing ----------------------------------------------------------------------------------------

TEST_CASE("image: write_image encodes PNG losslessly and JPEG closely, by the extension; bad input is refused") {
  const Image rgb = pattern(13, 17);
  const fs::path png = temp_dir() / "written.png";
  kiln::data::write_image(png, rgb);
  CHECK(kiln::data::read_image(png) == rgb);
  Image grey{.height = 5, .width = 4, .channels = 1, .pixels = {}};
  for (int i = 0; i < 20; ++i) grey.pixels.push_back(std::uint8_t(i * 12));
  const fs::path grey_png = temp_dir() / "grey.PNG";
  kiln::data::write_image(grey_png, grey);
  const Image back = kiln::data::read_image(grey_png);  // read as RGB: grey repeated
  REQUIRE(back.channels == 3);
  for (index_t y = 0; y < 5; ++y)
    for (index_t x = 0; x < 4; ++x)
      for (index_t c = 0; c < 3; ++c) CHECK(back.at(y, x, c) == grey.at(y, x, 0));
  // JPEG on a smooth image (a gradient per channel): close to its source at quality 95.
  Image smooth{.height = 24, .width = 32, .channels = 3, .pixels = {}};
  for (index_t y = 0; y < 24; ++y)
    for (index_t x = 0; x < 32; ++x)
      for (index_t c = 0; c < 3; ++c) smooth.pixels.push_back(std::uint8_t(40 + 4 * y + 3 * x + 20 * c));
  const fs::path jpg = temp_dir() / "written.jpeg";
  kiln::data::write_image(jpg, smooth, 95);
  const Image lossy = kiln::data::read_image(jpg);
  REQUIRE(lossy.height == smooth.height);
  REQUIRE(lossy.width == smooth.width);
  double mean = 0;
  for (std::size_t i = 0; i < smooth.pixels.size(); ++i)
    mean += std::abs(int(lossy.pixels[i]) - int(smooth.pixels[i]));
  mean /= double(smooth.pixels.size());
  CHECK(mean < 3);
  const fs::path gif = temp_dir() / "written.gif";
  check_data_error([&] { kiln::data::write_image(gif, rgb); }, gif, {"the extension must be .png, .jpg or .jpeg"});
  CHECK(!fs::exists(gif));
  Image two{.height = 2, .width = 2, .channels = 2, .pixels = std::vector<std::uint8_t>(8)};
  CHECK_THROWS_AS(kiln::data::encode_png(two), kiln::ValueError);
  CHECK_THROWS_AS(kiln::data::encode_jpeg(rgb, 0), kiln::ValueError);
}
