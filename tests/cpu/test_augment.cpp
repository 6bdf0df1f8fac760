// data::augment (kiln/data/augment.hpp): random crop with zero padding, horizontal flip and
// per-channel normalisation as one executor launch, driven by Philox.
// - the choices (dy, dx, flip) are the documented Philox block (key = seed; counter = sample,
//   reserved_stream_base | epoch, family 2) mapped by multiply-shift, recomputed here by hand;
// - the output equals a naive host reference of the documented formula bit for bit, for several
//   seeds, c = 1 and 3, non-square images, pad 0 / 1 / 4, with and without flip, scale and
//   normalisation, float and double (bf16: the float result rounded once);
// - the device path (the functor through for_each_element, one element per call, as the CUDA
//   executor runs it) equals the CPU path bit for bit, on one thread and several;
// - the same (seed, epoch, sample) gives the same bytes however a batch is split into calls;
//   epochs, seeds and samples change the choices; the draws never reuse the loader's shuffle bits;
// - statistics decoded from actual outputs: flip rate near 1/2, crop offsets uniform on [0, 2·pad];
// - normalisation comes after padding (the padded zeros are normalised, as torchvision's);
// - one launch of kind copy named "augment"; every bad argument is an error naming the value.
#include <kiln.hpp>
#include <kiln/data/augment.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

using namespace kiln;
using data::AugmentChoice;
using data::AugmentOptions;

namespace {

// The documented draw, spelled out independently of the header.
AugmentChoice ref_choice(std::uint64_t seed, std::uint64_t epoch, std::uint64_t sample, index_t pad, bool flip) {
  const PhiloxKey key{{std::uint32_t(seed), std::uint32_t(seed >> 32)}};
  const PhiloxCounter ctr{{std::uint32_t(sample), std::uint32_t(sample >> 32),
                           0x80000000u | std::uint32_t(epoch % (std::uint64_t(1) << 31)), 2u}};
  const PhiloxCounter r = philox4x32(key, ctr);
  const std::uint64_t range = 2 * std::uint64_t(pad) + 1;
  AugmentChoice a;
  a.dy = index_t((std::uint64_t(r.v[0]) * range) >> 32);
  a.dx = index_t((std::uint64_t(r.v[1]) * range) >> 32);
  a.flip = flip && (r.v[2] & 0x80000000u) != 0;
  return a;
}

// The documented formula, element by element.
template <class T>
std::vector<T> reference(const std::vector<T>& src, index_t n, index_t c, index_t h, index_t w, const AugmentOptions& o,
                         std::uint64_t epoch, std::uint64_t first) {
  std::vector<T> out(src.size());
  const bool norm = !o.mean.empty();
  const bool affine = norm || o.scale != 1.0f;
  for (index_t i = 0; i < n; ++i) {
    const AugmentChoice a = ref_choice(o.seed, epoch, first + std::uint64_t(i), o.pad, o.flip);
    for (index_t ch = 0; ch < c; ++ch)
      for (index_t y = 0; y < h; ++y)
        for (index_t x = 0; x < w; ++x) {
          const index_t sy = y + a.dy - o.pad;
          const index_t xp = a.flip ? w - 1 - x : x;
          const index_t sx = xp + a.dx - o.pad;
          T v = 0;
          if (sy >= 0 && sy < h && sx >= 0 && sx < w) v = src[std::size_t(((i * c + ch) * h + sy) * w + sx)];
          if (affine) {
            const T m = norm ? T(o.mean[std::size_t(ch)]) : T(0);
            const T inv = norm ? T(1) / T(o.stddev[std::size_t(ch)]) : T(1);
            v = std::fma(v, T(o.scale), -m) * inv;
          }
          out[std::size_t(((i * c + ch) * h + y) * w + x)] = v;
        }
  }
  return out;
}

// Distinct non-zero values (so padding zeros and misplaced reads show), some negative.
template <class T>
std::vector<T> image_data(index_t count, std::uint64_t seed) {
  std::vector<T> v(static_cast<std::size_t>(count));
  Generator g(seed);
  for (std::size_t k = 0; k < v.size(); ++k) v[k] = T(float(k + 1) + g.uniform(-0.25f, 0.25f)) * (k % 7 == 3 ? T(-1) : T(1));
  return v;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

template <class T>
std::vector<T> run_augment(CpuExecutor& exec, const std::vector<T>& src, index_t n, index_t c, index_t h, index_t w,
                           const AugmentOptions& o, std::uint64_t epoch, std::uint64_t first) {
  std::vector<T> out(src.size(), T(-777));
  data::augment(exec, src.data(), out.data(), n, c, h, w, o, epoch, first);
  return out;
}

struct Shape4 {
  index_t n, c, h, w;
};

const std::uint64_t seeds[] = {0, 1, 42, (std::uint64_t(1) << 40) + 7};

template <class T>
void check_against_reference() {
  CpuExecutor exec(1);
  const Shape4 shapes[] = {{5, 1, 7, 5}, {4, 3, 6, 9}, {3, 3, 32, 32}, {6, 1, 1, 3}};
  int runs = 0;
  for (const Shape4& s : shapes) {
    const std::vector<T> src = image_data<T>(s.n * s.c * s.h * s.w, std::uint64_t(s.h * 100 + s.w));
    for (std::uint64_t seed : seeds)
      for (index_t pad : {index_t(0), index_t(1), index_t(4)})
        for (bool flip : {false, true})
          for (int norm = 0; norm < 3; ++norm) {  // none, scale only, scale + per-channel mean / stddev
            AugmentOptions o;
            o.pad = pad;
            o.flip = flip;
            o.seed = seed;
            if (norm >= 1) o.scale = 1.0f / 255;
            if (norm == 2)
              for (index_t ch = 0; ch < s.c; ++ch) {
                o.mean.push_back(0.45f + 0.01f * float(ch));
                o.stddev.push_back(0.25f - 0.003f * float(ch));
              }
            const std::uint64_t epoch = seed % 3, first = 1000 * seed % 977;
            INFO("n c h w = " << s.n << " " << s.c << " " << s.h << " " << s.w << ", seed " << seed << ", pad "
                              << pad << ", flip " << flip << ", norm " << norm);
            const std::vector<T> got = run_augment(exec, src, s.n, s.c, s.h, s.w, o, epoch, first);
            const std::vector<T> want = reference(src, s.n, s.c, s.h, s.w, o, epoch, first);
            CHECK(same_bits(got, want));
            // The textbook (v·scale - mean) / std to rounding: the fma and the reciprocal change an ulp
            // or two at most.
            if (norm == 2) {
              const std::vector<T> plain = reference(src, s.n, s.c, s.h, s.w, AugmentOptions{o.pad, o.flip, 1.0f, {}, {}, o.seed},
                                                     epoch, first);
              double worst = 0;
              for (std::size_t k = 0; k < got.size(); ++k) {
                const index_t ch = index_t(k / std::size_t(s.h * s.w)) % s.c;
                const double textbook = (double(plain[k]) * double(T(o.scale)) - double(T(o.mean[std::size_t(ch)]))) /
                                        double(T(o.stddev[std::size_t(ch)]));
                worst = std::max(worst, std::abs(double(got[k]) - textbook) / std::max(1.0, std::abs(textbook)));
              }
              CHECK(worst < (std::is_same_v<T, float> ? 1e-6 : 1e-14));
            }
            // Without scale / normalisation every output is a source value or a padding zero.
            if (norm == 0 && pad == 0 && !flip) CHECK(same_bits(got, src));
            ++runs;
          }
  }
  CHECK(runs == 4 * 4 * 3 * 2 * 3);
}

// (dy, dx, flip) read back from an output of a 1 × 12 × 12 source whose value at (r, col) is
// 1 + 12·r + col, with pad 4: output row 5 reads source row dy + 1, and output columns 5 and 6
// read source columns x' + dx - 4 with x' = 5, 6 (no flip) or 6, 5 (flip), all inside the image.
AugmentChoice decode(const float* img) {
  const auto at = [&](index_t x) {
    const index_t v = index_t(img[5 * 12 + x]) - 1;
    return std::array<index_t, 2>{v / 12, v % 12};
  };
  const auto p5 = at(5), p6 = at(6);
  AugmentChoice a;
  a.flip = p6[1] < p5[1];
  a.dy = p5[0] - 1;
  a.dx = p5[1] - (a.flip ? 6 : 5) + 4;
  return a;
}

}  // namespace

TEST_CASE("augment_choice: the documented Philox block (key seed; counter sample, epoch stream, family 2)") {
  int checked = 0;
  for (std::uint64_t seed : seeds)
    for (std::uint64_t epoch : {std::uint64_t(0), std::uint64_t(1), std::uint64_t(17), std::uint64_t(1) << 31})
      for (std::uint64_t sample : {std::uint64_t(0), std::uint64_t(1), std::uint64_t(5), std::uint64_t(49999),
                                   (std::uint64_t(1) << 32) + 3, ~std::uint64_t(0)})
        for (index_t pad : {index_t(0), index_t(1), index_t(2), index_t(4), index_t(100)}) {
          AugmentOptions o;
          o.seed = seed;
          o.pad = pad;
          const AugmentChoice a = data::augment_choice(o, epoch, sample);
          INFO("seed " << seed << ", epoch " << epoch << ", sample " << sample << ", pad " << pad);
          CHECK(a == ref_choice(seed, epoch, sample, pad, true));
          CHECK(a.dy >= 0);
          CHECK(a.dy <= 2 * pad);
          CHECK(a.dx >= 0);
          CHECK(a.dx <= 2 * pad);
          // flip = false keeps the crop and never flips.
          o.flip = false;
          const AugmentChoice b = data::augment_choice(o, epoch, sample);
          CHECK(b.dy == a.dy);
          CHECK(b.dx == a.dx);
          CHECK(!b.flip);
          ++checked;
        }
  CHECK(checked == 4 * 4 * 6 * 5);
  AugmentOptions o;
  o.pad = 0;
  for (std::uint64_t s = 0; s < 200; ++s) {
    const AugmentChoice a = data::augment_choice(o, 3, s);
    REQUIRE(a.dy == 0);
    REQUIRE(a.dx == 0);
  }
}

TEST_CASE("augment: float output equals the naive reference of the documented formula bit for bit") {
  check_against_reference<float>();
}

TEST_CASE("augment: double output equals the naive reference bit for bit") { check_against_reference<double>(); }

TEST_CASE("augment: bf16 storage is the float computation on the widened values, rounded once") {
  const index_t n = 5, c = 3, h = 6, w = 7;
  const std::vector<float> wide = image_data<float>(n * c * h * w, 12);
  std::vector<bf16> src(wide.size());
  std::vector<float> widened(wide.size());
  for (std::size_t k = 0; k < wide.size(); ++k) {
    src[k] = convert<bf16>(wide[k]);
    widened[k] = convert<float>(src[k]);
  }
  AugmentOptions o;
  o.seed = 4;
  o.pad = 2;
  o.scale = 0.25f;
  o.mean = {1.0f, 2.0f, 3.0f};
  o.stddev = {0.3f, 0.6f, 0.9f};
  CpuExecutor exec(1);
  std::vector<bf16> out(src.size());
  data::augment(exec, src.data(), out.data(), n, c, h, w, o, 1, 20);
  const std::vector<float> want = reference(widened, n, c, h, w, o, 1, 20);
  int mismatches = 0;
  for (std::size_t k = 0; k < out.size(); ++k) {
    const float got = convert<float>(out[k]), expect = convert<float>(convert<bf16>(want[k]));
    mismatches += std::memcmp(&got, &expect, sizeof(float)) != 0;
  }
  CHECK(mismatches == 0);
}

TEST_CASE("augment: the device path (functor through for_each_element) equals the CPU path bit for bit") {
  // A batch big enough to be split across threads (more than CpuExecutor::grain elements).
  const index_t n = 40, c = 3, h = 30, w = 34;
  const std::vector<float> src = image_data<float>(n * c * h * w, 5);
  AugmentOptions o;
  o.seed = 123;
  o.scale = 0.5f;
  o.mean = {1.0f, -2.0f, 3.0f};
  o.stddev = {0.5f, 2.0f, 7.0f};
  const std::vector<float> want = reference(src, n, c, h, w, o, 2, 77);
  for (int threads : {1, 3}) {
    CpuExecutor exec(threads);
    INFO("threads " << threads);
    const std::vector<float> host = run_augment(exec, src, n, c, h, w, o, 2, 77);
    std::vector<float> device(src.size(), -1.0f);
    const auto kernel = data::make_augment_kernel(src.data(), device.data(), n, c, h, w, o, 2, 77);
    exec.for_each_element(n * c, h * w, kernel, kind::copy, "augment", 0);
    CHECK(same_bits(host, want));
    CHECK(same_bits(device, want));
  }
}

TEST_CASE("augment: the same (seed, epoch, sample) gives the same bytes however the batch is split") {
  const index_t n = 10, c = 3, h = 8, w = 11;
  const index_t per = c * h * w;
  const std::vector<float> src = image_data<float>(n * per, 9);
  for (std::uint64_t seed : seeds) {
    AugmentOptions o;
    o.seed = seed;
    o.pad = 3;
    o.mean = {0.1f, 0.2f, 0.3f};
    o.stddev = {1.5f, 2.5f, 0.75f};
    const std::uint64_t first = 500;
    CpuExecutor one(1), two(2);
    const std::vector<float> whole = run_augment(one, src, n, c, h, w, o, 4, first);
    CHECK(same_bits(whole, run_augment(two, src, n, c, h, w, o, 4, first)));  // again, other threads
    // 3 + 7.
    std::vector<float> split(src.size(), -1.0f);
    data::augment(one, src.data(), split.data(), 3, c, h, w, o, 4, first);
    data::augment(two, src.data() + 3 * per, split.data() + 3 * per, 7, c, h, w, o, 4, first + 3);
    CHECK(same_bits(whole, split));
    // One image per call, in reverse order.
    std::vector<float> single(src.size(), -1.0f);
    for (index_t i = n - 1; i >= 0; --i)
      data::augment(one, src.data() + i * per, single.data() + i * per, 1, c, h, w, o, 4, first + std::uint64_t(i));
    CHECK(same_bits(whole, single));
    // The wrong first_sample_index for the second part gives other images.
    std::vector<float> wrong(src.size(), -1.0f);
    data::augment(one, src.data(), wrong.data(), 3, c, h, w, o, 4, first);
    data::augment(one, src.data() + 3 * per, wrong.data() + 3 * per, 7, c, h, w, o, 4, first);
    CHECK_FALSE(same_bits(whole, wrong));
  }
}

TEST_CASE("augment: epochs, seeds and sample indices change the choices; epochs repeat after 2^31") {
  const int samples = 400;
  const auto differing = [&](std::uint64_t s1, std::uint64_t e1, std::uint64_t o1, std::uint64_t s2,
                             std::uint64_t e2, std::uint64_t o2) {
    AugmentOptions a, b;
    a.seed = s1;
    b.seed = s2;
    int diff = 0;
    for (int k = 0; k < samples; ++k)
      diff += !(data::augment_choice(a, e1, o1 + std::uint64_t(k)) == data::augment_choice(b, e2, o2 + std::uint64_t(k)));
    return diff;
  };
  // Two independent draws agree with probability 1/81 · 1/2 (pad 4): nearly all differ.
  CHECK(differing(1, 0, 0, 1, 1, 0) > samples * 9 / 10);              // epoch
  CHECK(differing(1, 5, 0, 1, 6, 0) > samples * 9 / 10);              // epoch
  CHECK(differing(1, 0, 0, 2, 0, 0) > samples * 9 / 10);              // seed
  CHECK(differing(1, 0, 0, 1 + (std::uint64_t(1) << 32), 0, 0) > samples * 9 / 10);  // the seed's high word
  CHECK(differing(1, 0, 0, 1, 0, 1) > samples * 9 / 10);              // sample index
  CHECK(differing(1, 0, 0, 1, 0, std::uint64_t(1) << 32) > samples * 9 / 10);  // the index's high word
  CHECK(differing(1, 3, 0, 1, 3, 0) == 0);                            // the same inputs
  CHECK(differing(1, 3, 0, 1, 3 + (std::uint64_t(1) << 31), 0) == 0);  // epochs wrap at 2^31, as the loader's
  // And so do the images.
  const index_t n = 6, c = 1, h = 9, w = 7;
  const std::vector<float> src = image_data<float>(n * c * h * w, 3);
  CpuExecutor exec(1);
  AugmentOptions o;
  o.seed = 8;
  CHECK_FALSE(same_bits(run_augment(exec, src, n, c, h, w, o, 0, 0), run_augment(exec, src, n, c, h, w, o, 1, 0)));
  CHECK(same_bits(run_augment(exec, src, n, c, h, w, o, 1, 0), run_augment(exec, src, n, c, h, w, o, 1, 0)));
}

TEST_CASE("augment: the draws never reuse the loader's shuffle bits or dropout's for the same seed") {
  // The loader shuffles epoch e with Generator(seed, reserved_stream_base | e) (family 0), drawing
  // offsets 0, 1, 2, ...; dropout draws random_bits(seed, offset) (stream 0, family 0).
  int equal_words = 0, compared = 0;
  for (std::uint64_t seed : seeds)
    for (std::uint64_t epoch : {std::uint64_t(0), std::uint64_t(1), std::uint64_t(7)}) {
      Generator loader(seed, reserved_stream_base | std::uint32_t(epoch));
      for (std::uint64_t s = 0; s < 200; ++s) {
        const PhiloxCounter aug = data::detail::augment_block(seed, epoch, s);
        const PhiloxCounter shuffle = random_block(seed, 4 * s, reserved_stream_base | std::uint32_t(epoch));
        const PhiloxCounter drop = random_block(seed, 4 * s);
        for (int j = 0; j < 4; ++j) {
          equal_words += aug.v[j] == shuffle.v[j];
          equal_words += aug.v[j] == drop.v[j];
          equal_words += aug.v[j] == loader.next_u32();
          compared += 3;
        }
      }
    }
  CHECK(compared == 4 * 3 * 200 * 12);
  CHECK(equal_words == 0);  // 28,800 comparisons of 32-bit words: a chance equality is ~1e-5 likely
}

TEST_CASE("augment: flip rate near 1/2 and crop offsets uniform on [0, 2·pad], read back from the images") {
  // 6,000 images of 1 × 12 × 12 (values 1 + 12·row + col), pad 4: each output gives back its
  // (dy, dx, flip), which must be augment_choice's, and their distribution must be uniform.
  const index_t n = 6000, h = 12, w = 12, pad = 4;
  std::vector<float> src(std::size_t(n * h * w));
  for (std::size_t k = 0; k < src.size(); ++k) src[k] = float(1 + index_t(k) % (h * w));
  for (std::uint64_t seed : {std::uint64_t(11), std::uint64_t(99)}) {
    AugmentOptions o;
    o.seed = seed;
    o.pad = pad;
    CpuExecutor exec(2);
    const std::vector<float> out = run_augment(exec, src, n, 1, h, w, o, 3, 10000);
    int flips = 0, mismatches = 0;
    std::array<int, 9> dy_count{}, dx_count{};
    std::array<int, 81> joint{};
    for (index_t i = 0; i < n; ++i) {
      const AugmentChoice a = decode(out.data() + i * h * w);
      mismatches += !(a == data::augment_choice(o, 3, 10000 + std::uint64_t(i)));
      REQUIRE(a.dy >= 0);
      REQUIRE(a.dy <= 2 * pad);
      REQUIRE(a.dx >= 0);
      REQUIRE(a.dx <= 2 * pad);
      flips += a.flip;
      ++dy_count[std::size_t(a.dy)];
      ++dx_count[std::size_t(a.dx)];
      ++joint[std::size_t(a.dy * 9 + a.dx)];
    }
    INFO("seed " << seed);
    CHECK(mismatches == 0);
    // Binomial standard deviations: flip rate 0.0065, each offset's share 0.0041, each joint cell
    // 15.6 counts; the bounds are about 6 of them, so only a broken draw fails.
    CHECK(std::abs(double(flips) / double(n) - 0.5) < 0.04);
    for (int v = 0; v < 9; ++v) {
      INFO("offset " << v << ": dy " << dy_count[std::size_t(v)] << ", dx " << dx_count[std::size_t(v)]);
      CHECK(std::abs(double(dy_count[std::size_t(v)]) / double(n) - 1.0 / 9) < 0.025);
      CHECK(std::abs(double(dx_count[std::size_t(v)]) / double(n) - 1.0 / 9) < 0.025);
    }
    int worst = 0;
    for (int cell : joint) worst = std::max(worst, std::abs(cell - int(n / 81)));
    CHECK(worst < 100);  // dy and dx independent
  }
  // pad 1 through the helper: three offsets, a third each; flip on pad 0 still half the time.
  for (index_t p : {index_t(0), index_t(1)}) {
    AugmentOptions o;
    o.pad = p;
    o.seed = 5;
    const int m = 30000;
    std::array<int, 3> dy{}, dx{};
    int flips = 0;
    for (int s = 0; s < m; ++s) {
      const AugmentChoice a = data::augment_choice(o, 0, std::uint64_t(s));
      ++dy[std::size_t(a.dy)];
      ++dx[std::size_t(a.dx)];
      flips += a.flip;
    }
    INFO("pad " << p);
    CHECK(std::abs(double(flips) / m - 0.5) < 0.02);
    for (index_t v = 0; v <= 2 * p; ++v) {
      CHECK(std::abs(double(dy[std::size_t(v)]) / m - 1.0 / double(2 * p + 1)) < 0.02);
      CHECK(std::abs(double(dx[std::size_t(v)]) / m - 1.0 / double(2 * p + 1)) < 0.02);
    }
  }
}

TEST_CASE("augment: normalisation comes after padding, so the padded zeros are normalised too") {
  const index_t c = 3, h = 5, w = 6, pad = 2;
  AugmentOptions o;
  o.seed = 31;
  o.pad = pad;
  o.flip = false;
  o.scale = 1.0f / 255;
  o.mean = {0.4914f, 0.4822f, 0.4465f};
  o.stddev = {0.2470f, 0.2435f, 0.2616f};
  // A sample whose window starts at the top-left of the padded image (dy = dx = 0): its first
  // `pad` rows and columns are padding.
  std::uint64_t sample = 0;
  while (sample < 100000 && !(data::augment_choice(o, 0, sample) == AugmentChoice{0, 0, false})) ++sample;
  REQUIRE(sample < 100000);  // one sample in 25 has dy = dx = 0
  const std::vector<float> src(std::size_t(c * h * w), 200.0f);
  CpuExecutor exec(1);
  const std::vector<float> out = run_augment(exec, src, 1, c, h, w, o, 0, sample);
  int padded = 0;
  for (index_t ch = 0; ch < c; ++ch) {
    const float zero = std::fma(0.0f, o.scale, -o.mean[std::size_t(ch)]) * (1.0f / o.stddev[std::size_t(ch)]);
    const float inside = std::fma(200.0f, o.scale, -o.mean[std::size_t(ch)]) * (1.0f / o.stddev[std::size_t(ch)]);
    CHECK(zero == doctest::Approx(-o.mean[std::size_t(ch)] / o.stddev[std::size_t(ch)]).epsilon(1e-6));
    for (index_t y = 0; y < h; ++y)
      for (index_t x = 0; x < w; ++x) {
        const bool pad_here = y < pad || x < pad;
        const float v = out[std::size_t((ch * h + y) * w + x)];
        padded += pad_here;
        CHECK(v == (pad_here ? zero : inside));
      }
  }
  CHECK(padded == c * (h * w - (h - pad) * (w - pad)));
}

TEST_CASE("augment: one launch of kind copy named \"augment\"") {
  CpuExecutor exec(1);
  exec.stats().set_recording(true);
  const index_t n = 4, c = 3, h = 7, w = 9;
  const std::vector<float> src = image_data<float>(n * c * h * w, 1);
  std::vector<float> dst(src.size());
  AugmentOptions o;
  data::augment(exec, src.data(), dst.data(), n, c, h, w, o, 0, 0);
  CHECK(exec.stats().launches() == 1);
  CHECK(exec.stats().launches(kind::copy) == 1);
  REQUIRE(exec.stats().records().size() == 1);
  const LaunchRecord& r = exec.stats().records()[0];
  CHECK(r.name == "augment");
  CHECK(r.kind == kind::copy);
  CHECK(r.elements == n * c * h * w);
  CHECK(r.bytes == std::size_t(2 * n * c * h * w) * sizeof(float));
  static_assert(std::is_trivially_copyable_v<data::AugmentKernel<float>>);
  CHECK(sizeof(data::AugmentKernel<float>) <= 160);  // cheap to pass to a kernel by value
}

TEST_CASE("augment: bad arguments are errors that name the value, and nothing is written") {
  CpuExecutor exec(1);
  const index_t n = 2, c = 3, h = 4, w = 5;
  const std::vector<float> src = image_data<float>(n * c * h * w, 2);
  std::vector<float> dst(src.size(), -5.0f);
  const auto run = [&](const AugmentOptions& o, index_t nn = 2, index_t cc = 3, index_t hh = 4, index_t ww = 5,
                       const float* s = nullptr, float* d = nullptr) {
    data::augment(exec, s ? s : src.data(), d ? d : dst.data(), nn, cc, hh, ww, o, 0, 0);
  };
  AugmentOptions ok;
  ok.mean = {0.1f, 0.2f, 0.3f};
  ok.stddev = {1.0f, 2.0f, 3.0f};
  CHECK_NOTHROW(run(ok));
  std::fill(dst.begin(), dst.end(), -5.0f);
  exec.stats().reset();

  CHECK_THROWS_WITH_AS(run(ok, 0), doctest::Contains("n = 0, c = 3, h = 4, w = 5"), ShapeError);
  CHECK_THROWS_WITH_AS(run(ok, -1), doctest::Contains("n = -1"), ShapeError);
  CHECK_THROWS_WITH_AS(run(ok, n, 0), doctest::Contains("c = 0"), ShapeError);
  CHECK_THROWS_WITH_AS(run(ok, n, c, -4), doctest::Contains("h = -4"), ShapeError);
  CHECK_THROWS_WITH_AS(run(ok, n, c, h, 0), doctest::Contains("w = 0"), ShapeError);
  CHECK_THROWS_WITH_AS(run(AugmentOptions{}, index_t(1) << 40, 1, index_t(1) << 20, 1 << 10),
                       doctest::Contains("overflow"), ShapeError);
  AugmentOptions bad = ok;
  bad.pad = -1;
  CHECK_THROWS_WITH_AS(run(bad), doctest::Contains("pad = -1"), ValueError);
  CHECK_THROWS_WITH_AS(data::augment_choice(bad, 0, 0), doctest::Contains("pad = -1"), ValueError);
  bad = ok;
  bad.pad = index_t(1) << 31;
  CHECK_THROWS_WITH_AS(run(bad), doctest::Contains("pad = 2147483648"), ValueError);
  bad = ok;
  bad.stddev[1] = 0.0f;
  CHECK_THROWS_WITH_AS(run(bad), doctest::Contains("stddev[1] = 0"), ValueError);
  bad.stddev[1] = -0.5f;
  CHECK_THROWS_WITH_AS(run(bad), doctest::Contains("stddev[1] = -0.5"), ValueError);
  bad.stddev[1] = std::nanf("");
  CHECK_THROWS_WITH_AS(run(bad), doctest::Contains("stddev[1] = nan"), ValueError);
  bad = ok;
  bad.mean[2] = INFINITY;
  CHECK_THROWS_WITH_AS(run(bad), doctest::Contains("mean[2] = inf"), ValueError);
  bad = ok;
  bad.scale = NAN;
  CHECK_THROWS_WITH_AS(run(bad), doctest::Contains("scale = nan"), ValueError);
  bad = ok;
  bad.mean = {0.1f, 0.2f};
  bad.stddev = {1.0f, 2.0f};
  CHECK_THROWS_WITH_AS(run(bad), doctest::Contains("have 2 values for c = 3"), ShapeError);
  bad.stddev = {1.0f, 2.0f, 3.0f};
  CHECK_THROWS_WITH_AS(run(bad), doctest::Contains("mean has 2 values but stddev has 3"), ShapeError);
  bad = ok;
  bad.stddev.clear();
  CHECK_THROWS_WITH_AS(run(bad), doctest::Contains("mean has 3 values but stddev has 0"), ShapeError);
  // Five channels with normalisation: more than the functor holds.
  bad = ok;
  bad.mean = {0, 0, 0, 0, 0};
  bad.stddev = {1, 1, 1, 1, 1};
  const std::vector<float> five(std::size_t(1 * 5 * h * w), 1.0f);
  std::vector<float> five_out(five.size());
  CHECK_THROWS_WITH_AS(data::augment(exec, five.data(), five_out.data(), 1, 5, h, w, bad, 0, 0),
                       doctest::Contains("at most 4 channels, got c = 5"), ShapeError);
  // ... and without normalisation five channels are fine.
  CHECK_NOTHROW(data::augment(exec, five.data(), five_out.data(), 1, 5, h, w, AugmentOptions{}, 0, 0));
  exec.stats().reset();
  // Aliasing: in place, or overlapping by one image.
  std::vector<float> buf = src;
  CHECK_THROWS_WITH_AS(run(ok, n, c, h, w, buf.data(), buf.data()), doctest::Contains("overlap"), AliasError);
  std::vector<float> wide(src.size() + std::size_t(c * h * w));
  CHECK_THROWS_AS(run(ok, n, c, h, w, wide.data(), wide.data() + c * h * w), AliasError);
  CHECK_THROWS_AS(run(ok, n, c, h, w, wide.data() + c * h * w, wide.data()), AliasError);
  CHECK_NOTHROW(run(ok, 1, c, h, w, wide.data(), wide.data() + c * h * w));  // adjacent, not overlapping
  exec.stats().reset();
  CHECK_THROWS_WITH_AS(data::augment(exec, static_cast<const float*>(nullptr), dst.data(), n, c, h, w, ok, 0, 0),
                       doctest::Contains("must not be null"), ValueError);
  // Nothing ran and nothing was written.
  CHECK(exec.stats().launches() == 0);
  for (float v : dst) REQUIRE(v == -5.0f);
}
