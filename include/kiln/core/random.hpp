// kiln/core/random.hpp — counter-based random numbers (Philox4x32-10) that agree on CPU and GPU.
//
// Why counter-based: a value is a pure function of (seed, offset), so a CUDA kernel thread i can
// draw uniform01(seed, base + i) with no generator state, and the host computes the same bits for
// a test or for a CPU fallback. The integer bits are identical everywhere; normal() goes through
// logf/cosf/sinf, whose device versions may differ from the host's by an ulp or two.
//
// Layout of the 128-bit Philox counter: words 0-1 hold offset / 4 (each block gives four 32-bit
// words, and offset % 4 picks one, so a kernel that makes four values per call matches one that
// makes one), word 2 holds the caller's stream, word 3 tells bits/uniform (0) from normal (1)
// and data augmentation (2, kiln/data/augment.hpp), so the families never reuse each other's
// bits. Streams 0x80000000 and above are kiln's own (the data loader's shuffles use them).
#pragma once

#include <kiln/config.hpp>

#include <cmath>
#include <cstdint>
#include <math.h>  // ::logf, ::sqrtf, ::cosf, ::sinf: the spellings host and nvcc device code share
#include <numeric>
#include <span>
#include <utility>
#include <vector>

namespace kiln {

// Four 32-bit counter words (or four output words) and the two 32-bit key words of Philox4x32.
struct PhiloxCounter {
  std::uint32_t v[4];
};
struct PhiloxKey {
  std::uint32_t v[2];
};

// Streams at or above this value are reserved for kiln itself.
inline constexpr std::uint32_t reserved_stream_base = 0x80000000u;

namespace detail {
inline constexpr std::uint32_t philox_m0 = 0xD2511F53u;  // multipliers and Weyl key increments
inline constexpr std::uint32_t philox_m1 = 0xCD9E8D57u;  // from Salmon et al., SC'11
inline constexpr std::uint32_t philox_w0 = 0x9E3779B9u;
inline constexpr std::uint32_t philox_w1 = 0xBB67AE85u;

KILN_HOST_DEVICE PhiloxCounter philox_round(PhiloxCounter c, PhiloxKey k) {
  // A 64-bit product gives hi and lo at once; nvcc turns it into mul.lo / mul.hi.
  const std::uint64_t p0 = static_cast<std::uint64_t>(philox_m0) * c.v[0];
  const std::uint64_t p1 = static_cast<std::uint64_t>(philox_m1) * c.v[2];
  const auto hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
  const auto hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
  return PhiloxCounter{{hi1 ^ c.v[1] ^ k.v[0], lo1, hi0 ^ c.v[3] ^ k.v[1], lo0}};
}

KILN_HOST_DEVICE PhiloxKey make_key(std::uint64_t seed) {
  return PhiloxKey{{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)}};
}

KILN_HOST_DEVICE PhiloxCounter make_counter(std::uint64_t offset, std::uint32_t stream,
                                            std::uint32_t family) {
  const std::uint64_t block = offset >> 2;
  return PhiloxCounter{
      {static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(block >> 32), stream, family}};
}

// 24 high bits → [0, 1) exactly representable in float (never rounds up to 1.0f).
KILN_HOST_DEVICE float unit_float_open1(std::uint32_t x) {
  return static_cast<float>(x >> 8) * (1.0f / 16777216.0f);
}
// Same bits shifted by one step → (0, 1], safe for log().
KILN_HOST_DEVICE float unit_float_open0(std::uint32_t x) {
  return static_cast<float>((x >> 8) + 1u) * (1.0f / 16777216.0f);
}
}  // namespace detail

// Philox4x32 with 10 rounds: the Random123 reference function (known-answer tested).
KILN_HOST_DEVICE PhiloxCounter philox4x32(PhiloxKey key, PhiloxCounter counter) {
  for (int round = 0; round < 9; ++round) {
    counter = detail::philox_round(counter, key);
    key.v[0] += detail::philox_w0;
    key.v[1] += detail::philox_w1;
  }
  return detail::philox_round(counter, key);
}

// All four words of the block that holds `offset` (offset % 4 indexes into it).
KILN_HOST_DEVICE PhiloxCounter random_block(std::uint64_t seed, std::uint64_t offset,
                                            std::uint32_t stream = 0) {
  return philox4x32(detail::make_key(seed), detail::make_counter(offset, stream, 0));
}

// 32 uniformly random bits, a pure function of (seed, offset, stream).
KILN_HOST_DEVICE std::uint32_t random_bits(std::uint64_t seed, std::uint64_t offset,
                                           std::uint32_t stream = 0) {
  return random_block(seed, offset, stream).v[offset & 3];
}

// Uniform float in [0, 1) with 24 random bits; built from random_bits(seed, offset, stream).
KILN_HOST_DEVICE float uniform01(std::uint64_t seed, std::uint64_t offset,
                                 std::uint32_t stream = 0) {
  return detail::unit_float_open1(random_bits(seed, offset, stream));
}

// Standard normal float (Box–Muller). One Philox block gives two uniform pairs and so four
// normals; offset % 4 picks cos/sin of the first or second pair. |result| < 5.8 by construction
// (the smallest u1 is 2^-24).
KILN_HOST_DEVICE float normal(std::uint64_t seed, std::uint64_t offset, std::uint32_t stream = 0) {
  const PhiloxCounter r =
      philox4x32(detail::make_key(seed), detail::make_counter(offset, stream, 1));
  const unsigned lane = static_cast<unsigned>(offset & 3);
  const unsigned pair = lane >> 1;
  const float u1 = detail::unit_float_open0(r.v[2 * pair]);
  const float u2 = detail::unit_float_open1(r.v[2 * pair + 1]);
  const float radius = ::sqrtf(-2.0f * ::logf(u1));
  const float angle = 6.28318530717958647692f * u2;
  return radius * ((lane & 1) ? ::sinf(angle) : ::cosf(angle));
}

// Host-side generator: a seed, a stream and an offset that advances with every value drawn.
// Values equal the free functions at the offsets consumed, so a host fill and a CUDA kernel that
// is handed `take(n)` produce the same numbers. Not thread-safe (one generator per thread).
class Generator {
 public:
  explicit Generator(std::uint64_t seed = 0, std::uint32_t stream = 0, std::uint64_t offset = 0)
      : seed_(seed), stream_(stream), offset_(offset) {}

  std::uint64_t seed() const { return seed_; }
  std::uint32_t stream() const { return stream_; }
  std::uint64_t offset() const { return offset_; }

  // Reserves n offsets and returns the first: give (seed(), that offset, stream()) to a kernel
  // whose element i draws at offset + i.
  std::uint64_t take(std::uint64_t n) {
    const std::uint64_t first = offset_;
    offset_ += n;
    return first;
  }

  std::uint32_t next_u32() { return random_bits(seed_, offset_++, stream_); }
  std::uint64_t next_u64() {
    const std::uint64_t hi = next_u32();
    return (hi << 32) | next_u32();
  }

  float uniform() { return uniform01(seed_, offset_++, stream_); }
  // Uniform in [a, b) (for a < b); rounding may give b itself when b - a is tiny relative to a.
  float uniform(float a, float b) { return a + (b - a) * uniform(); }
  float normal(float mean = 0.0f, float stddev = 1.0f) {
    return mean + stddev * kiln::normal(seed_, offset_++, stream_);
  }

  void fill_uniform(std::span<float> out, float a, float b) {
    for (float& x : out) x = uniform(a, b);
  }
  void fill_normal(std::span<float> out, float mean = 0.0f, float stddev = 1.0f) {
    for (float& x : out) x = normal(mean, stddev);
  }

  // Unbiased integer in [0, n), n > 0: masked rejection (fewer than two draws on average).
  std::uint64_t below(std::uint64_t n) {
    if (n <= 1) return 0;
    std::uint64_t mask = n - 1;
    mask |= mask >> 1;
    mask |= mask >> 2;
    mask |= mask >> 4;
    mask |= mask >> 8;
    mask |= mask >> 16;
    mask |= mask >> 32;
    for (;;) {
      const std::uint64_t x = (mask <= 0xffffffffu ? next_u32() : next_u64()) & mask;
      if (x < n) return x;
    }
  }

  // Fisher–Yates: every permutation equally likely, and the same one for the same state.
  template <class T>
  void shuffle(std::span<T> values) {
    for (std::size_t i = values.size(); i > 1; --i) {
      const auto j = static_cast<std::size_t>(below(i));
      using std::swap;
      swap(values[i - 1], values[j]);
    }
  }
  template <class T>
  void shuffle(std::vector<T>& values) {
    shuffle(std::span<T>(values));
  }

  // A uniformly random permutation of 0 .. n-1.
  std::vector<index_t> permutation(index_t n) {
    std::vector<index_t> order(static_cast<std::size_t>(n > 0 ? n : 0));
    std::iota(order.begin(), order.end(), index_t{0});
    shuffle(order);
    return order;
  }

 private:
  std::uint64_t seed_;
  std::uint32_t stream_;
  std::uint64_t offset_;
};

}  // namespace kiln
