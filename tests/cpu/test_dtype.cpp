// Bit-exact tests for kiln/core/dtype.hpp: every f16/bf16 pattern, random and tie inputs, against
// two oracles — the compiler's _Float16 (where it exists) and an exact reference written here in
// double arithmetic, independent of the header's bit shifting.
#include <kiln/core/bf16_bulk.hpp>
#include <kiln/core/dtype.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string_view>
#include <type_traits>
#include <vector>
#include <vector>

namespace {

using kiln::bf16;
using kiln::f16;

std::uint32_t bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
float float_of(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
double double_of(std::uint64_t u) {
  double x;
  std::memcpy(&x, &u, 8);
  return x;
}

struct format {
  int exp_bits, man_bits;
};
constexpr format half_fmt{5, 10};
constexpr format bf16_fmt{8, 7};

// Correctly rounded x -> format, by scaling to the destination quantum (exact: powers of two)
// and rounding the integer part with the exact fraction. NaN handled by the callers.
std::uint16_t reference_round(double x, format f) {
  const int bias = (1 << (f.exp_bits - 1)) - 1;
  const long inf_bits = long((1 << f.exp_bits) - 1) << f.man_bits;
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(x);
  if (std::isinf(a)) return std::uint16_t(sign | inf_bits);
  if (a == 0) return sign;
  int e2;
  std::frexp(a, &e2);
  const int unbiased = e2 - 1;
  const int emin = 1 - bias;
  const int quantum_exp = (unbiased < emin ? emin : unbiased) - f.man_bits;
  const double scaled = std::ldexp(a, -quantum_exp);
  double n = std::floor(scaled);
  const double frac = scaled - n;
  if (frac > 0.5 || (frac == 0.5 && std::fmod(n, 2.0) == 1.0)) n += 1;
  long b = unbiased < emin ? long(n) : (long(unbiased + bias - 1) << f.man_bits) + long(n);
  if (b > inf_bits) b = inf_bits;
  return std::uint16_t(sign | b);
}

bool is_nan16(std::uint16_t b, format f) {
  const unsigned exp_mask = ((1u << f.exp_bits) - 1) << f.man_bits;
  return (b & exp_mask) == exp_mask && (b & ((1u << f.man_bits) - 1)) != 0;
}

// Reports at most a few mismatches in detail so a broken rule does not flood the log.
struct mismatch_log {
  int count = 0;
  template <class... Parts>
  void add(const Parts&... parts) {
    if (count++ >= 5) return;
    std::ostringstream text;
    (text << ... << parts);
    FAIL_CHECK(text.str());
  }
};

std::mt19937_64& rng() {
  static std::mt19937_64 g(0x6b696c6eu);
  return g;
}

// Floats spread over (and a little beyond) the f16/bf16 ranges, with random mantissas.
std::vector<float> random_floats(int n, int min_exp, int max_exp) {
  std::vector<float> out;
  std::uniform_int_distribution<int> exp(min_exp + 127, max_exp + 127);
  std::uniform_int_distribution<std::uint32_t> man(0, (1u << 23) - 1);
  for (int i = 0; i < n; ++i) {
    const std::uint32_t s = std::uint32_t(rng()() & 1u) << 31;
    out.push_back(float_of(s | (std::uint32_t(exp(rng())) << 23) | man(rng())));
    out.push_back(float_of(std::uint32_t(rng()())));  // any pattern, NaNs included
  }
  return out;
}

// Each finite value's midpoint to its upper neighbour (a tie), and the float just either side.
// Midpoints need one bit more than the format, so they are exact in float and in double.
template <class H>
std::vector<double> ties(format f) {
  std::vector<double> out;
  const unsigned inf = ((1u << f.exp_bits) - 1) << f.man_bits;
  for (unsigned b = 0; b < inf; ++b) {
    const double lo = double(static_cast<float>(H::from_bits(std::uint16_t(b))));
    const double hi = b + 1 == inf ? std::ldexp(1.0, (1 << (f.exp_bits - 1))) :  // first inf step
                          double(static_cast<float>(H::from_bits(std::uint16_t(b + 1))));
    const double mid = (lo + hi) / 2;
    for (double m : {mid, -mid}) {
      out.push_back(m);
      out.push_back(double(std::nextafter(float(m), 0.0f)));
      out.push_back(double(std::nextafter(float(m), 2.0f * float(m))));
    }
  }
  return out;
}

template <class H>
void check_float_to(const std::vector<float>& xs, format f, mismatch_log& log) {
  for (float x : xs) {
    const std::uint16_t got = H(x).bits;
    if (std::isnan(x)) {
      const bool sign_ok = (got >> 15) == (bits(x) >> 31);
      const bool quiet = (got >> (f.man_bits - 1)) & 1u;
      if (!is_nan16(got, f) || !sign_ok || !quiet) log.add("NaN ", bits(x), " -> ", got);
    } else if (const std::uint16_t want = reference_round(double(x), f); got != want) {
      log.add("float bits 0x", std::hex, bits(x), " (", x, "): got 0x", got, " want 0x", want);
    }
  }
}

}  // namespace

TEST_CASE("f16 and bf16 are trivially copyable 16-bit storage") {
  static_assert(std::is_trivially_copyable_v<f16> && std::is_trivially_copyable_v<bf16>);
  static_assert(std::is_trivially_default_constructible_v<f16>);
  static_assert(std::is_standard_layout_v<f16> && std::is_standard_layout_v<bf16>);
  static_assert(sizeof(f16) == 2 && sizeof(bf16) == 2);
  static_assert(!std::is_convertible_v<float, f16>, "narrowing must be spelled out");
  static_assert(!std::is_convertible_v<f16, float>);
  CHECK(f16{}.bits == 0);
  CHECK(bf16{}.bits == 0);
  CHECK(f16::from_bits(0x3c00).bits == 0x3c00);
}

TEST_CASE("every f16 pattern widens exactly and narrows back to itself") {
  mismatch_log log;
  for (unsigned b = 0; b < 0x10000; ++b) {
    const f16 h = f16::from_bits(std::uint16_t(b));
    const float x = static_cast<float>(h);
    const std::uint16_t back = f16(x).bits;
    if (is_nan16(std::uint16_t(b), half_fmt)) {
      // Payload kept; narrowing sets the quiet bit.
      if (!std::isnan(x) || std::signbit(x) != bool(b >> 15)) log.add("NaN widened wrongly ", b);
      if (back != (b | 0x200u)) log.add("NaN 0x", std::hex, b, " came back as 0x", back);
      continue;
    }
    if (back != b) log.add("0x", std::hex, b, " came back as 0x", back);
    // The value by its definition: (-1)^s * m * 2^(e-25) for normals, m * 2^-24 subnormals.
    const unsigned e = (b >> 10) & 0x1f, m = b & 0x3ff;
    double want = e == 0x1f ? INFINITY : e == 0 ? std::ldexp(m, -24) : std::ldexp(m | 0x400, int(e) - 25);
    if (b >> 15) want = -want;
    if (bits(x) != bits(float(want))) log.add("0x", std::hex, b, " widened to ", x);
#if defined(__FLT16_MAX__)
    _Float16 oracle;
    std::memcpy(&oracle, &b, 2);
    if (bits(x) != bits(float(oracle))) log.add("0x", std::hex, b, " differs from _Float16");
#endif
  }
  CHECK(log.count == 0);
}

TEST_CASE("every bf16 pattern widens exactly and narrows back to itself") {
  mismatch_log log;
  for (unsigned b = 0; b < 0x10000; ++b) {
    const float x = static_cast<float>(bf16::from_bits(std::uint16_t(b)));
    const std::uint16_t back = bf16(x).bits;
    if (is_nan16(std::uint16_t(b), bf16_fmt)) {
      if (!std::isnan(x) || std::signbit(x) != bool(b >> 15)) log.add("NaN widened wrongly ", b);
      if (back != (b | 0x40u)) log.add("NaN 0x", std::hex, b, " came back as 0x", back);
      continue;
    }
    if (back != b) log.add("0x", std::hex, b, " came back as 0x", back);
    const unsigned e = (b >> 7) & 0xff, m = b & 0x7f;
    double want = e == 0xff ? INFINITY : e == 0 ? std::ldexp(m, -133) : std::ldexp(m | 0x80, int(e) - 134);
    if (b >> 15) want = -want;
    if (bits(x) != bits(float(want))) log.add("0x", std::hex, b, " widened to ", x);
  }
  CHECK(log.count == 0);
}

TEST_CASE("float -> f16 edge cases") {
  CHECK(f16(0.0f).bits == 0x0000);
  CHECK(f16(-0.0f).bits == 0x8000);
  CHECK(f16(1.0f).bits == 0x3c00);
  CHECK(f16(-2.0f).bits == 0xc000);
  CHECK(f16(65504.0f).bits == 0x7bff);                           // max finite
  CHECK(f16(65519.996f).bits == 0x7bff);                         // just below the inf tie
  CHECK(f16(65520.0f).bits == 0x7c00);                           // tie to even is inf
  CHECK(f16(-65520.0f).bits == 0xfc00);
  CHECK(f16(1e10f).bits == 0x7c00);
  CHECK(f16(INFINITY).bits == 0x7c00);
  CHECK(f16(-INFINITY).bits == 0xfc00);
  CHECK(f16(std::ldexp(1.0f, -24)).bits == 0x0001);             // smallest subnormal
  CHECK(f16(std::ldexp(1.0f, -25)).bits == 0x0000);             // tie to even: zero
  CHECK(f16(-std::ldexp(1.0f, -25)).bits == 0x8000);
  CHECK(f16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)).bits == 0x0001);
  CHECK(f16(std::ldexp(3.0f, -25)).bits == 0x0002);             // tie between 1 and 2 ulps
  CHECK(f16(std::ldexp(1.0f, -30)).bits == 0x0000);
  CHECK(f16(std::ldexp(1.0f, -14)).bits == 0x0400);             // smallest normal
  CHECK(f16(std::ldexp(1.0f, -14) - std::ldexp(1.0f, -25)).bits == 0x0400);  // tie, carries
  CHECK(f16(std::ldexp(1.0f, -14) - std::ldexp(1.0f, -24)).bits == 0x03ff);  // largest subnormal
  CHECK(f16(1.0f + std::ldexp(1.0f, -11)).bits == 0x3c00);      // tie to even, down
  CHECK(f16(1.0f + std::ldexp(3.0f, -11)).bits == 0x3c02);      // tie to even, up
  CHECK(f16(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f)).bits == 0x3c01);
  CHECK(f16(std::numeric_limits<float>::denorm_min()).bits == 0x0000);
  const f16 qnan(std::numeric_limits<float>::quiet_NaN());
  CHECK(is_nan16(qnan.bits, half_fmt));
  const f16 nnan(-std::numeric_limits<float>::quiet_NaN());
  CHECK((nnan.bits >> 15) == 1);
  // A signalling NaN whose payload lies only in dropped bits must stay NaN, not become inf.
  CHECK(f16(float_of(0x7f800001u)).bits == 0x7e00);
  CHECK(f16(float_of(0xff800001u)).bits == 0xfe00);
}

TEST_CASE("float -> f16 matches the references on random floats and every tie") {
  std::vector<float> xs = random_floats(1'000'000, -27, 17);
  for (double t : ties<f16>(half_fmt)) xs.push_back(float(t));
  mismatch_log log;
  check_float_to<f16>(xs, half_fmt, log);
#if defined(__FLT16_MAX__)
  for (float x : xs) {
    const _Float16 o = static_cast<_Float16>(x);
    std::uint16_t want;
    std::memcpy(&want, &o, 2);
    const std::uint16_t got = f16(x).bits;
    if (std::isnan(x) ? !is_nan16(got, half_fmt) : got != want)
      log.add("_Float16 disagrees at float bits 0x", std::hex, bits(x), ": 0x", got, " vs 0x", want);
  }
#else
  MESSAGE("no _Float16 on this compiler: checked against the exact reference only");
#endif
  CHECK(log.count == 0);
}

TEST_CASE("float -> bf16 matches the exact reference on random floats and every tie") {
  CHECK(bf16(1.0f).bits == 0x3f80);
  CHECK(bf16(-0.0f).bits == 0x8000);
  CHECK(bf16(float_of(0x3f808000u)).bits == 0x3f80);  // tie to even, down
  CHECK(bf16(float_of(0x3f818000u)).bits == 0x3f82);  // tie to even, up
  CHECK(bf16(float_of(0x3f808001u)).bits == 0x3f81);
  CHECK(bf16(float_of(0x7f7fffffu)).bits == 0x7f80);  // FLT_MAX rounds to inf
  CHECK(bf16(float_of(0x7f7f7fffu)).bits == 0x7f7f);
  CHECK(bf16(float_of(0x00000001u)).bits == 0x0000);  // float subnormals
  CHECK(bf16(float_of(0x00008000u)).bits == 0x0000);  // tie to even, zero
  CHECK(bf16(float_of(0x00018000u)).bits == 0x0002);
  CHECK(bf16(float_of(0x007fffffu)).bits == 0x0080);  // carries into the smallest normal
  CHECK(bf16(float_of(0x7f800001u)).bits == 0x7fc0);
  CHECK(bf16(-INFINITY).bits == 0xff80);

  std::vector<float> xs = random_floats(1'000'000, -140, 127);
  for (double t : ties<bf16>(bf16_fmt)) xs.push_back(float(t));
  mismatch_log log;
  check_float_to<bf16>(xs, bf16_fmt, log);
  CHECK(log.count == 0);
}

TEST_CASE("double -> f16/bf16 rounds once, from the double") {
  // Through float these round twice: float keeps the tie, then ties-to-even goes down.
  const double above_tie16 = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  CHECK(f16(above_tie16).bits == 0x3c01);
  CHECK(f16(float(above_tie16)).bits == 0x3c00);
  const double above_tie_bf = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40);
  CHECK(bf16(above_tie_bf).bits == 0x3f81);
  CHECK(bf16(float(above_tie_bf)).bits == 0x3f80);
  CHECK(f16(65520.0 - std::ldexp(1.0, -30)).bits == 0x7bff);
  CHECK(f16(65520.0).bits == 0x7c00);
  CHECK(f16(std::ldexp(1.0, -25) + std::ldexp(1.0, -60)).bits == 0x0001);
  CHECK(f16(std::ldexp(1.0, -25)).bits == 0x0000);
  CHECK(f16(1e-310).bits == 0x0000);   // double subnormal
  CHECK(f16(-1e-310).bits == 0x8000);
  CHECK(f16(1e300).bits == 0x7c00);
  CHECK(bf16(1e300).bits == 0x7f80);
  CHECK(bf16(std::ldexp(1.0, -133)).bits == 0x0001);  // smallest bf16 subnormal
  CHECK(bf16(std::ldexp(1.0, -134)).bits == 0x0000);  // tie to even
  CHECK(bf16(std::ldexp(1.0, -134) + std::ldexp(1.0, -180)).bits == 0x0001);
  CHECK(f16(double_of(0xfff0000000000001ull)).bits == 0xfe00);
  CHECK(is_nan16(bf16(std::nan("")).bits, bf16_fmt));

  // Ties and their neighbours a few double ulps away, where float's precision is not enough.
  mismatch_log log;
  auto run = [&](auto tag, format f) {
    using H = decltype(tag);
    std::vector<double> xs = ties<H>(f);
    std::uniform_int_distribution<int> ulps(1, 1 << 20);
    const std::size_t n = xs.size();
    for (std::size_t i = 0; i < n; i += 3) {
      const double t = xs[i];
      const double d = std::fabs(t) * std::ldexp(1.0, -52) * ulps(rng());
      xs.push_back(t + d);
      xs.push_back(t - d);
    }
    for (int i = 0; i < 1'000'000; ++i) xs.push_back(double_of(rng()()));
    std::uniform_real_distribution<double> mant(1.0, 2.0);
    std::uniform_int_distribution<int> exp(-160, 130);
    for (int i = 0; i < 1'000'000; ++i) xs.push_back(std::ldexp(mant(rng()), exp(rng())));
    for (double x : xs) {
      const std::uint16_t got = H(x).bits;
      if (std::isnan(x)) {
        if (!is_nan16(got, f) || (got >> 15) != unsigned(std::signbit(x))) log.add("NaN ", x);
      } else if (const std::uint16_t want = reference_round(x, f); got != want) {
        log.add("double ", x, ": got 0x", std::hex, got, " want 0x", want);
      }
    }
  };
  run(f16{}, half_fmt);
  run(bf16{}, bf16_fmt);
  CHECK(log.count == 0);
}

TEST_CASE("integers round once, also beyond double's 53 bits") {
  CHECK(f16(3).bits == 0x4200);
  CHECK(f16(-3).bits == 0xc200);
  CHECK(f16(65519).bits == 0x7bff);
  CHECK(f16(65520).bits == 0x7c00);
  CHECK(f16(std::numeric_limits<std::int64_t>::min()).bits == 0xfc00);
  CHECK(f16(std::uint8_t(255)).bits == 0x5bf8);
  // 2^60 + 2^52 + 1 sits just above a bf16 tie; through double it would become the tie.
  const std::int64_t v = (std::int64_t(1) << 60) + (std::int64_t(1) << 52) + 1;
  CHECK(bf16(v).bits == 0x5d81);
  CHECK(bf16(-v).bits == 0xdd81);
  CHECK(bf16(double(v)).bits == 0x5d80);
  CHECK(bf16((std::int64_t(1) << 60) + (std::int64_t(1) << 52)).bits == 0x5d80);
  CHECK(bf16(std::numeric_limits<std::int64_t>::min()).bits == 0xdf00);
  CHECK(bf16(std::numeric_limits<std::uint64_t>::max()).bits == 0x5f80);
  CHECK(bf16(std::uint64_t(0x80bfffffffffffffull)).bits == 0x5f01);  // below the tie, large

  mismatch_log log;
  for (int i = 0; i < 200'000; ++i) {
    const std::uint64_t u = rng()() >> (rng()() % 64);
    const std::int64_t s = std::int64_t(rng()()) >> (rng()() % 64);
    // The exact reference on integers: reduce to 53 bits with a sticky bit by hand.
    auto ref = [](std::uint64_t mag, bool neg, format f) {
      int drop = 0;
      std::uint64_t sticky = 0;
      while (mag >= (std::uint64_t(1) << 53)) {
        sticky |= mag & 1u;
        mag >>= 1;
        ++drop;
      }
      const double d = std::ldexp(double(mag | sticky), drop);
      return reference_round(neg ? -d : d, f);
    };
    const std::uint64_t smag = s < 0 ? std::uint64_t(0) - std::uint64_t(s) : std::uint64_t(s);
    if (bf16(u).bits != ref(u, false, bf16_fmt)) log.add("bf16(uint64 ", u, ")");
    if (bf16(s).bits != ref(smag, s < 0, bf16_fmt)) log.add("bf16(int64 ", s, ")");
    if (f16(s).bits != ref(smag, s < 0, half_fmt)) log.add("f16(int64 ", s, ")");
    const std::int32_t i32 = std::int32_t(s);
    if (f16(i32).bits != reference_round(double(i32), half_fmt)) log.add("f16(int32 ", i32, ")");
  }
  CHECK(log.count == 0);
}

TEST_CASE("convert works for every pair of element types") {
  auto from_all = [](auto to_tag) {
    using To = decltype(to_tag);
    auto one = [](auto from_tag) {
      using From = decltype(from_tag);
      const From x = kiln::convert<From>(std::int32_t(3));
      const To y = kiln::convert<To>(x);
      CHECK(kiln::convert<double>(y) == 3.0);
    };
    one(float{}), one(double{}), one(f16{}), one(bf16{});
    one(std::int32_t{}), one(std::int64_t{}), one(std::uint8_t{});
  };
  from_all(float{}), from_all(double{}), from_all(f16{}), from_all(bf16{});
  from_all(std::int32_t{}), from_all(std::int64_t{}), from_all(std::uint8_t{});

  CHECK(kiln::convert<std::int32_t>(f16(-2.75f)) == -2);  // truncates like static_cast
  CHECK(kiln::convert<std::uint8_t>(bf16(200.0f)) == 200);
  CHECK(kiln::convert<f16>(bf16(1e30f)).bits == 0x7c00);
  CHECK(kiln::convert<f16>(bf16::from_bits(0x3f81)).bits == 0x3c08);       // 1 + 2^-7, exact
  CHECK(kiln::convert<bf16>(f16::from_bits(0x3c01)).bits == 0x3f80);       // 1 + 2^-10 rounds
  CHECK(kiln::convert<bf16>(f16::from_bits(0x0001)).bits == 0x3380);       // 2^-24, exact
  CHECK(kiln::convert<f16>(1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40)).bits == 0x3c01);
  CHECK(kiln::convert<double>(f16::from_bits(0x7bff)) == 65504.0);
  CHECK(kiln::convert<float>(0.1) == 0.1f);
  CHECK(std::isnan(kiln::convert<double>(bf16::from_bits(0xffc1))));
}

TEST_CASE("dtype tags, names, sizes and compute types") {
  using kiln::dtype;
  static_assert(kiln::dtype_of<float> == dtype::f32);
  static_assert(kiln::dtype_of<double> == dtype::f64);
  static_assert(kiln::dtype_of<f16> == dtype::f16);
  static_assert(kiln::dtype_of<bf16> == dtype::bf16);
  static_assert(kiln::dtype_of<std::int32_t> == dtype::i32);
  static_assert(kiln::dtype_of<std::int64_t> == dtype::i64);
  static_assert(kiln::dtype_of<std::uint8_t> == dtype::u8);
  static_assert(kiln::dtype_of<const volatile f16> == dtype::f16);
  static_assert(std::is_same_v<kiln::compute_t<f16>, float>);
  static_assert(std::is_same_v<kiln::compute_t<bf16>, float>);
  static_assert(std::is_same_v<kiln::compute_t<double>, double>);
  static_assert(std::is_same_v<kiln::compute_t<std::int64_t>, std::int64_t>);
  static_assert(kiln::size_of(dtype::bf16) == 2);
  static_assert(std::string_view(kiln::name(dtype::bf16)) == "bf16");

  const dtype all[] = {dtype::f32, dtype::f64, dtype::f16, dtype::bf16,
                       dtype::i32, dtype::i64, dtype::u8};
  const char* names[] = {"f32", "f64", "f16", "bf16", "i32", "i64", "u8"};
  const std::size_t sizes[] = {4, 8, 2, 2, 4, 8, 1};
  for (int i = 0; i < 7; ++i) {
    CHECK(std::string_view(kiln::name(all[i])) == names[i]);
    CHECK(kiln::size_of(all[i]) == sizes[i]);
  }
  CHECK(kiln::size_of(kiln::dtype_of<double>) == sizeof(double));
  CHECK(kiln::size_of(kiln::dtype_of<f16>) == sizeof(f16));
}

TEST_CASE("round_to_bf16 and widen_bf16 over arrays are the scalar conversions, bit for bit") {
  // Every bf16 pattern's neighbourhood (ties, carries into the exponent, NaN payloads, denormals,
  // infinities) plus random floats; a length that leaves a scalar tail after the vector blocks.
  std::vector<std::uint32_t> bits;
  for (std::uint32_t h = 0; h < 0x10000u; ++h)
    for (std::uint32_t low : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) bits.push_back(h << 16 | low);
  std::mt19937 rng(5);
  for (int i = 0; i < 100003; ++i) bits.push_back(std::uint32_t(rng()));
  std::vector<float> x(bits.size());
  std::memcpy(x.data(), bits.data(), bits.size() * 4);
  std::vector<kiln::bf16> got(x.size());
  kiln::round_to_bf16(x.data(), got.data(), kiln::index_t(x.size()));
  std::size_t differ = 0;
  for (std::size_t i = 0; i < x.size(); ++i) differ += got[i].bits != kiln::bf16(x[i]).bits ? 1 : 0;
  CHECK(differ == 0);
  std::vector<float> back(x.size());
  kiln::widen_bf16(got.data(), back.data(), kiln::index_t(got.size()));
  differ = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float want = float(got[i]);
    differ += std::memcmp(&back[i], &want, 4) != 0 ? 1 : 0;
  }
  CHECK(differ == 0);
}
