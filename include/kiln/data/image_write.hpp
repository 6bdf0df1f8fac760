// kiln/data/image_write.hpp — 8-bit images encoded as PNG or JPEG (torchvision.io's write_png /
// write_jpeg): what a program writes an image folder with (examples/finetune_resnet's demo data)
// and what tests make their own files with.
//
//   kiln::data::write_image("demo/train/7/0001.png", img);         // the extension picks the format
//   std::vector<std::uint8_t> jpg = kiln::data::encode_jpeg(img, 90);
//
// An image of 1 (grey) or 3 (RGB) channels; PNG is lossless (read_image gives the same pixels
// back, as RGB), JPEG at `quality` 1..100 with 4:2:0 chroma (libjpeg's default). Files are written
// atomically (kiln/io/atomic_file.hpp). Errors: ValueError for an image that is not 1 or 3
// channels or whose pixels do not match its size, DataError naming the file when it cannot be
// written or the build has no encoder for its format (KILN_HAVE_JPEG / KILN_HAVE_PNG).
#pragma once

#include <kiln/config.hpp>
#include <kiln/data/image.hpp>

#include <cstdint>
#include <filesystem>
#include <vector>

namespace kiln::data {

KILN_COMPILED std::vector<std::uint8_t> encode_png(const Image& image);
KILN_COMPILED std::vector<std::uint8_t> encode_jpeg(const Image& image, int quality = 90);

// Encodes by the path's extension (.png, .jpg or .jpeg, any case) and writes the file.
KILN_COMPILED void write_image(const std::filesystem::path& path, const Image& image, int quality = 90);

}  // namespace kiln::data

#if KILN_HEADER_BODIES
#include "kiln/data/image_write_bodies.hpp"
#endif
