#!/usr/bin/env python3
"""Print PIL's / torchvision's resize and center-crop results for tests/cpu/test_image_folder.cpp.

kiln's image resize is PIL's Image.resize(BILINEAR) (antialiased: the triangle filter's support
grows with the downscale factor; 22-bit fixed-point weights; horizontal pass first, rounded to
8 bits between the passes), which is what torchvision's Resize does to the PIL images its
ImageFolder loads. This script computes reference outputs with PIL and torchvision.transforms.
functional on small synthetic RGB images and prints them as C++ initialisers for the test: small
cases in full, larger ones as an FNV-1a 64-bit hash of the HWC bytes.

The input images are pattern(h, w, salt): pixel (y, x, c) = (y*37 + x*91 + c*53 + ((x*y) % 7)*11
+ salt) % 256 (the test builds the same ones).

Run with: .venv-bench/bin/python scripts/golden_image_resize.py
"""
import PIL
import torchvision
import torchvision.transforms.functional as F
from PIL import Image


def pattern(h, w, salt=0):
    data = bytes((y * 37 + x * 91 + c * 53 + ((x * y) % 7) * 11 + salt) % 256
                 for y in range(h) for x in range(w) for c in range(3))
    return Image.frombytes("RGB", (w, h), data)


def fnv1a(data):
    h = 0xcbf29ce484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def emit(name, img, full):
    w, h = img.size
    data = img.tobytes()
    if full:
        print(f"// {name}: {h} x {w}")
        print(f"const std::vector<int> {name} = {{{', '.join(str(b) for b in data)}}};")
    else:
        print(f"constexpr std::uint64_t {name} = 0x{fnv1a(data):016x}ull;  // {h} x {w}")


def main():
    print(f"// scripts/golden_image_resize.py: Pillow {PIL.__version__}, torchvision {torchvision.__version__}")
    a = pattern(9, 11)
    emit("golden_down_4x5", a.resize((5, 4), Image.BILINEAR), True)
    emit("golden_mixed_14x6", a.resize((6, 14), Image.BILINEAR), False)
    emit("golden_up_9x23", a.resize((23, 9), Image.BILINEAR), False)
    # torchvision's resized_crop: crop (top 2, left 3, 6 x 7), then resize to 5 x 5.
    emit("golden_crop_resize_5x5", F.resized_crop(a, 2, 3, 6, 7, [5, 5], F.InterpolationMode.BILINEAR), True)
    b = pattern(64, 48, 5)
    emit("golden_big_down_7x5", b.resize((5, 7), Image.BILINEAR), False)
    # The eval pipeline: Resize(20) (shorter side) then CenterCrop(16), on 30 x 45.
    c = pattern(30, 45, 9)
    emit("golden_eval_30x45", F.center_crop(F.resize(c, 20, F.InterpolationMode.BILINEAR), [16, 16]), False)
    # A crop larger than the resized image (7 x 5 -> Resize(6) = 8 x 6 -> CenterCrop(9): zero padding).
    d = pattern(7, 5, 3)
    emit("golden_eval_pad_7x5", F.center_crop(F.resize(d, 6, F.InterpolationMode.BILINEAR), [9, 9]), False)


if __name__ == "__main__":
    main()
