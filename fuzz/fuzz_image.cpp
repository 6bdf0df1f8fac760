// libFuzzer harness: the JPEG / PNG decoder on any bytes — the header reader ImageFolder's scan
// uses, the whole decode, and the eval and train transforms on whatever decodes. Every failure
// must be a kiln::DataError; anything else (a crash, a sanitizer report, another exception, an
// image whose size disagrees with its pixels) is a finding. scripts/fuzz.sh builds and runs it
// with libjpeg and libpng.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kiln/data/image.hpp"
#include "kiln/data/image_transforms.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> bytes(data, size);
  // 4 Mpixels (12 MB decoded) rather than 2^28: the limit's check is what is tested, and a run
  // stays fast and within libFuzzer's memory limit.
  const kiln::data::DecodeOptions options{.max_pixels = kiln::index_t{1} << 22};
  try {
    (void)kiln::data::read_image_info(bytes, "fuzz.img", options);
  } catch (const kiln::DataError&) {
  }
  try {
    const kiln::data::Image image = kiln::data::decode_image(bytes, "fuzz.img", options);
    if (image.channels != 3 || image.height <= 0 || image.width <= 0 ||
        image.pixels.size() != static_cast<std::size_t>(image.height * image.width * 3))
      __builtin_trap();
    std::vector<float> out(3 * 16 * 16);
    kiln::data::ImageTransform::eval(16, 20).apply(image, out);
    kiln::data::ImageTransform::train(16).apply(image, out, 1, 2, size);
  } catch (const kiln::DataError&) {
  }
  return 0;
}
