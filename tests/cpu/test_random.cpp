// Philox4x32-10 against Random123's known answers, and the distributions built on it.
#include <kiln/core/random.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <vector>

namespace {

void check_philox(kiln::PhiloxKey key, kiln::PhiloxCounter ctr, kiln::PhiloxCounter expected) {
  const kiln::PhiloxCounter got = kiln::philox4x32(key, ctr);
  for (int i = 0; i < 4; ++i) {
    CAPTURE(i);
    CHECK(got.v[i] == expected.v[i]);
  }
}

struct Moments {
  double mean = 0, var = 0;
};
template <class F>
Moments moments(int count, F draw) {
  double sum = 0, sum_sq = 0;
  for (int i = 0; i < count; ++i) {
    const double x = draw(i);
    sum += x;
    sum_sq += x * x;
  }
  const double mean = sum / count;
  return {mean, sum_sq / count - mean * mean};
}

}  // namespace

TEST_CASE("philox4x32-10 matches the Random123 known-answer vectors") {
  check_philox({{0, 0}}, {{0, 0, 0, 0}}, {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}});
  check_philox({{0xffffffff, 0xffffffff}}, {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}},
               {{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}});
  check_philox({{0xa4093822, 0x299f31d0}}, {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}},
               {{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}});
}

TEST_CASE("random_bits: offset % 4 picks a word of the block at offset / 4") {
  const std::uint64_t seed = 0x0123456789abcdefull;
  for (std::uint64_t block : {0ull, 1ull, 12345ull, 0x3fffffffffffffffull}) {
    const kiln::PhiloxCounter words = kiln::random_block(seed, block * 4);
    for (unsigned j = 0; j < 4; ++j) CHECK(kiln::random_bits(seed, block * 4 + j) == words.v[j]);
  }
  // Every part of the key, the offset and the stream changes the result.
  const std::uint32_t base = kiln::random_bits(seed, 5);
  CHECK(kiln::random_bits(seed ^ (1ull << 40), 5) != base);
  CHECK(kiln::random_bits(seed ^ 1ull, 5) != base);
  CHECK(kiln::random_bits(seed, 5 + (1ull << 40)) != base);
  CHECK(kiln::random_bits(seed, 5, 1) != base);
}

TEST_CASE("uniform01 lies in [0, 1) with mean 1/2 and variance 1/12") {
  CHECK(kiln::detail::unit_float_open1(0xffffffffu) < 1.0f);
  CHECK(kiln::detail::unit_float_open1(0u) == 0.0f);
  CHECK(kiln::detail::unit_float_open0(0u) > 0.0f);
  float lo = 1, hi = 0;
  const int count = 1 << 20;
  const Moments m = moments(count, [&](int i) {
    const float u = kiln::uniform01(42, static_cast<std::uint64_t>(i));
    lo = std::min(lo, u);
    hi = std::max(hi, u);
    return double{u};
  });
  CHECK(lo >= 0.0f);
  CHECK(hi < 1.0f);
  // Standard error of the mean is sqrt(1/12 / 2^20) ≈ 2.8e-4: the bounds are > 7 sigma.
  CHECK(std::abs(m.mean - 0.5) < 2e-3);
  CHECK(std::abs(m.var - 1.0 / 12) < 1e-3);
  // Ten equal bins each hold about a tenth.
  std::vector<int> bins(10, 0);
  for (int i = 0; i < count; ++i)
    ++bins[static_cast<int>(kiln::uniform01(7, static_cast<std::uint64_t>(i)) * 10)];
  for (int b : bins) CHECK(std::abs(b / double(count) - 0.1) < 3e-3);
}

TEST_CASE("normal has mean 0, variance 1 and the 68-95 rule") {
  const int count = 1 << 20;
  int within1 = 0, within2 = 0;
  float largest = 0;
  const Moments m = moments(count, [&](int i) {
    const float z = kiln::normal(3, static_cast<std::uint64_t>(i));
    within1 += std::abs(z) < 1.0f;
    within2 += std::abs(z) < 2.0f;
    largest = std::max(largest, std::abs(z));
    return double{z};
  });
  CHECK(std::abs(m.mean) < 5e-3);
  CHECK(std::abs(m.var - 1.0) < 1e-2);
  CHECK(std::abs(within1 / double(count) - 0.6827) < 3e-3);
  CHECK(std::abs(within2 / double(count) - 0.9545) < 2e-3);
  CHECK(std::isfinite(largest));
  CHECK(largest < 5.8f);
  // The four normals of one block are not copies of each other (cos and sin of two pairs).
  CHECK(kiln::normal(3, 0) != kiln::normal(3, 1));
  CHECK(kiln::normal(3, 0) != kiln::normal(3, 2));
}

TEST_CASE("Generator draws the free functions' values at its offsets") {
  kiln::Generator gen(99, 4, 10);
  CHECK(gen.uniform() == kiln::uniform01(99, 10, 4));
  CHECK(gen.normal() == kiln::normal(99, 11, 4));
  CHECK(gen.next_u32() == kiln::random_bits(99, 12, 4));
  CHECK(gen.offset() == 13);
  const std::uint64_t first = gen.take(100);
  CHECK(first == 13);
  CHECK(gen.offset() == 113);

  std::vector<float> host(37);
  kiln::Generator fill(5);
  fill.fill_normal(host, 1.0f, 2.0f);
  for (std::size_t i = 0; i < host.size(); ++i)
    CHECK(host[i] == doctest::Approx(1.0f + 2.0f * kiln::normal(5, i)));
  fill.fill_uniform(host, -3.0f, 3.0f);
  for (float x : host) {
    CHECK(x >= -3.0f);
    CHECK(x < 3.0f);
  }

  kiln::Generator a(1), b(1), c(2);
  std::vector<float> xa(16), xb(16), xc(16);
  a.fill_uniform(xa, 0, 1);
  b.fill_uniform(xb, 0, 1);
  c.fill_uniform(xc, 0, 1);
  CHECK(xa == xb);
  CHECK(xa != xc);
}

TEST_CASE("Generator::below is in range and unbiased; shuffle permutes") {
  kiln::Generator gen(11);
  CHECK(gen.below(1) == 0);
  std::vector<int> counts(6, 0);
  const int draws = 600000;
  bool in_range = true;
  for (int i = 0; i < draws; ++i) {
    const std::uint64_t x = gen.below(6);
    in_range = in_range && x < 6;
    ++counts[std::min<std::uint64_t>(x, 5)];
  }
  CHECK(in_range);
  for (int c : counts) CHECK(std::abs(c / double(draws) - 1.0 / 6) < 3e-3);
  const std::uint64_t big = (1ull << 40) + 3;
  bool big_in_range = true;
  for (int i = 0; i < 1000; ++i) big_in_range = big_in_range && gen.below(big) < big;
  CHECK(big_in_range);

  const std::vector<kiln::index_t> p1 = kiln::Generator(5).permutation(1000);
  const std::vector<kiln::index_t> p2 = kiln::Generator(5).permutation(1000);
  const std::vector<kiln::index_t> p3 = kiln::Generator(6).permutation(1000);
  CHECK(p1 == p2);
  CHECK(p1 != p3);
  std::vector<kiln::index_t> sorted = p1;
  std::sort(sorted.begin(), sorted.end());
  for (kiln::index_t i = 0; i < 1000; ++i) CHECK(sorted[static_cast<std::size_t>(i)] == i);
  CHECK(kiln::Generator(5).permutation(0).empty());

  // Each of the 6 orders of three items comes up about equally often.
  std::set<std::vector<int>> seen;
  std::vector<int> order_counts(6, 0);
  kiln::Generator shuffler(8);
  for (int t = 0; t < 60000; ++t) {
    std::vector<int> v{0, 1, 2};
    shuffler.shuffle(v);
    seen.insert(v);
    ++order_counts[v[0] * 2 + (v[1] > v[2])];
  }
  CHECK(seen.size() == 6);
  for (int c : order_counts) CHECK(std::abs(c / 60000.0 - 1.0 / 6) < 1e-2);
}
