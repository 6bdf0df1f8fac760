// kiln/core/dtype.hpp — element types: f16/bf16 storage, the runtime dtype tag, conversions.
//
// f16 and bf16 are storage types only: arithmetic on them runs in compute_t<T> (float), so a
// reduction over half values never accumulates in 11 or 8 bits. Their conversions are portable
// bit manipulation, so host tests and CUDA kernels round identically, and a host-only build
// needs no CUDA header. Narrowing rounds to nearest, ties to even, from the exact source value:
// double and 64-bit integers are never rounded through float first (that would round twice).
// NaNs stay NaN with their sign; narrowing sets the quiet bit and keeps the top payload bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kiln/config.hpp"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif
#if defined(__F16C__) && !defined(__CUDA_ARCH__)
#include <immintrin.h>  // _cvtss_sh / _cvtsh_ss: IEEE half conversions in hardware (x86 F16C)
#endif

namespace kiln {

namespace detail {

KILN_HOST_DEVICE std::uint32_t bits_of(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
KILN_HOST_DEVICE std::uint64_t bits_of(double x) {
  std::uint64_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
KILN_HOST_DEVICE float float_from_bits(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// Rounds an IEEE binary value (SrcExp exponent bits, SrcMan mantissa bits, stored in UInt) to a
// 16-bit format with DstExp/DstMan bits. Requires SrcMan > DstMan and a source exponent range
// at least as wide as the destination's (true for float/double -> f16/bf16).
template <int DstExp, int DstMan, int SrcExp, int SrcMan, class UInt>
KILN_HOST_DEVICE std::uint16_t narrow_bits(UInt x) {
  constexpr int src_exp_max = (1 << SrcExp) - 1;
  constexpr int src_bias = (1 << (SrcExp - 1)) - 1;
  constexpr int dst_exp_max = (1 << DstExp) - 1;
  constexpr int dst_bias = (1 << (DstExp - 1)) - 1;
  constexpr unsigned dst_inf = unsigned(dst_exp_max) << DstMan;

  const unsigned sign = unsigned(x >> (SrcExp + SrcMan)) << 15;
  const int exp = int((x >> SrcMan) & UInt(src_exp_max));
  UInt man = x & ((UInt(1) << SrcMan) - 1);
  if (exp == src_exp_max) {
    if (man == 0) return std::uint16_t(sign | dst_inf);
    // Quiet bit set so a NaN whose payload sits only in dropped low bits cannot become inf.
    const unsigned payload = unsigned(man >> (SrcMan - DstMan));
    return std::uint16_t(sign | dst_inf | (1u << (DstMan - 1)) | payload);
  }
  // value = man * 2^(e - SrcMan), with the implicit bit in man for normal inputs.
  const int e = exp == 0 ? 1 - src_bias : exp - src_bias;
  if (exp != 0) man |= UInt(1) << SrcMan;
  const int dst_exp = e + dst_bias;
  if (dst_exp >= dst_exp_max) return std::uint16_t(sign | dst_inf);
  // Below the normal range the destination quantum stops shrinking, so more bits drop.
  const int shift = (SrcMan - DstMan) + (dst_exp < 1 ? 1 - dst_exp : 0);
  if (shift > SrcMan + 1) return std::uint16_t(sign);  // under half the smallest subnormal
  const UInt rem = man & ((UInt(1) << shift) - 1);
  const UInt half = UInt(1) << (shift - 1);
  unsigned r = unsigned(man >> shift);
  // For normal results r carries the implicit bit, which adds the 1 missing from dst_exp - 1.
  if (dst_exp > 0) r += unsigned(dst_exp - 1) << DstMan;
  // A carry out of the mantissa bumps the exponent, up to inf: the encoding makes that exact.
  if (rem > half || (rem == half && (r & 1u))) ++r;
  return std::uint16_t(sign | r);
}

KILN_HOST_DEVICE float f16_bits_to_float(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return float_from_bits(sign | 0x7f800000u | (man << 13));  // payload kept
  if (exp != 0) return float_from_bits(sign | ((exp + (127 - 15)) << 23) | (man << 13));
  if (man == 0) return float_from_bits(sign);
  // Subnormal f16 values are normal floats; integer normalisation stays exact under FTZ/DAZ.
  std::uint32_t fexp = 127 - 14;
  while ((man & 0x400u) == 0) {
    man <<= 1;
    --fexp;
  }
  return float_from_bits(sign | (fexp << 23) | ((man & 0x3ffu) << 13));
}

// A double whose rounding to any format of at most 42 significand bits equals the rounding of
// v itself. Above 2^53 the low bits fold into a sticky bit, so no tie appears that v lacks.
template <class I>
KILN_HOST_DEVICE double int_for_narrowing(I v) {
  if constexpr (sizeof(I) < 8) {
    return double(v);
  } else {
    bool neg = false;
    if constexpr (std::is_signed_v<I>) neg = v < 0;
    std::uint64_t u = neg ? std::uint64_t(0) - std::uint64_t(v) : std::uint64_t(v);
    double d;
    if (u < (std::uint64_t(1) << 53)) {
      d = double(u);
    } else {
      u = (u >> 11) | std::uint64_t((u & 0x7ffu) != 0);
      d = double(u) * 2048.0;
    }
    return neg ? -d : d;
  }
}

}  // namespace detail

// IEEE binary16: 1 sign, 5 exponent, 10 mantissa bits. Max finite 65504.
struct f16 {
  std::uint16_t bits;

  f16() = default;
  KILN_HOST_DEVICE explicit f16(float x) : bits(from_float(x)) {}
  KILN_HOST_DEVICE explicit f16(double x)
      : bits(detail::narrow_bits<5, 10, 11, 52>(detail::bits_of(x))) {}
  template <class I>
    requires std::is_integral_v<I>
  KILN_HOST_DEVICE explicit f16(I v) : f16(detail::int_for_narrowing(v)) {}

  KILN_HOST_DEVICE explicit operator float() const {
#if defined(__CUDA_ARCH__)
    // Hardware for finite values; NaN goes the portable way so sign and payload survive.
    const float r = __half2float(__ushort_as_half(bits));
    if (r == r) return r;
#elif defined(__F16C__)
    if ((bits & 0x7c00u) != 0x7c00u || (bits & 0x3ffu) == 0) return _cvtsh_ss(bits);  // not NaN: exact in hardware
#endif
    return detail::f16_bits_to_float(bits);
  }

  static KILN_HOST_DEVICE f16 from_bits(std::uint16_t b) {
    f16 h;
    h.bits = b;
    return h;
  }

 private:
  static KILN_HOST_DEVICE std::uint16_t from_float(float x) {
#if defined(__CUDA_ARCH__)
    // The hardware conversion returns a canonical NaN without its sign; keep ours for NaN.
    if (x == x) return __half_as_ushort(__float2half_rn(x));
#elif defined(__F16C__)
    if (x == x) return _cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);  // round to nearest even
#endif
    return detail::narrow_bits<5, 10, 8, 23>(detail::bits_of(x));
  }
};

// bfloat16: the top half of a float (1 sign, 8 exponent, 7 mantissa bits); float's range.
struct bf16 {
  std::uint16_t bits;

  bf16() = default;
  KILN_HOST_DEVICE explicit bf16(float x) : bits(from_float(x)) {}
  KILN_HOST_DEVICE explicit bf16(double x)
      : bits(detail::narrow_bits<8, 7, 11, 52>(detail::bits_of(x))) {}
  template <class I>
    requires std::is_integral_v<I>
  KILN_HOST_DEVICE explicit bf16(I v) : bf16(detail::int_for_narrowing(v)) {}

  // Exact and payload-preserving: every bf16 is a float with 16 zero low bits.
  KILN_HOST_DEVICE explicit operator float() const {
    return detail::float_from_bits(std::uint32_t(bits) << 16);
  }

  static KILN_HOST_DEVICE bf16 from_bits(std::uint16_t b) {
    bf16 h;
    h.bits = b;
    return h;
  }

 private:
  static KILN_HOST_DEVICE std::uint16_t from_float(float x) {
#if defined(__CUDA_ARCH__)
    if (x == x) return __bfloat16_as_ushort(__float2bfloat16_rn(x));
#endif
    const std::uint32_t u = detail::bits_of(x);
    // Not NaN: round to nearest even in one add (a carry into the exponent is exactly the next
    // binade, and past the largest finite value it is inf); NaN keeps its sign and payload.
    if ((u & 0x7fffffffu) <= 0x7f800000u) return std::uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    return detail::narrow_bits<8, 7, 8, 23>(u);
  }
};

static_assert(std::is_trivially_copyable_v<f16> && sizeof(f16) == 2);
static_assert(std::is_trivially_copyable_v<bf16> && sizeof(bf16) == 2);

// The runtime tag of an element type, for storage, files and messages.
enum class dtype { f32, f64, f16, bf16, i32, i64, u8 };

namespace detail {
template <class T>
constexpr dtype dtype_of_impl() {
  if constexpr (std::is_same_v<T, float>) return dtype::f32;
  else if constexpr (std::is_same_v<T, double>) return dtype::f64;
  else if constexpr (std::is_same_v<T, kiln::f16>) return dtype::f16;
  else if constexpr (std::is_same_v<T, kiln::bf16>) return dtype::bf16;
  else if constexpr (std::is_same_v<T, std::int32_t>) return dtype::i32;
  else if constexpr (std::is_same_v<T, std::int64_t>) return dtype::i64;
  else if constexpr (std::is_same_v<T, std::uint8_t>) return dtype::u8;
  else {
    static_assert(dependent_false<T>,
                  "kiln::dtype_of<T>: T is not a kiln element type; use float, double, "
                  "kiln::f16, kiln::bf16, std::int32_t, std::int64_t or std::uint8_t");
    return dtype::f32;
  }
}
}  // namespace detail

// cv-qualifiers are ignored: a const float tensor still holds f32 elements.
template <class T>
inline constexpr dtype dtype_of = detail::dtype_of_impl<std::remove_cv_t<T>>();

constexpr const char* name(dtype t) {
  switch (t) {
    case dtype::f32: return "f32";
    case dtype::f64: return "f64";
    case dtype::f16: return "f16";
    case dtype::bf16: return "bf16";
    case dtype::i32: return "i32";
    case dtype::i64: return "i64";
    case dtype::u8: return "u8";
  }
  return "unknown";
}

constexpr std::size_t size_of(dtype t) {
  switch (t) {
    case dtype::f64:
    case dtype::i64: return 8;
    case dtype::f32:
    case dtype::i32: return 4;
    case dtype::f16:
    case dtype::bf16: return 2;
    case dtype::u8: return 1;
  }
  return 0;
}

namespace detail {
template <class T>
inline constexpr bool is_half_v = std::is_same_v<T, f16> || std::is_same_v<T, bf16>;
}  // namespace detail

// The type elementwise math on T runs in: half types widen to float, others stay themselves.
template <class T>
using compute_t = std::conditional_t<detail::is_half_v<T>, float, T>;

// Value conversion between any two of float, double, f16, bf16 and the integer types.
// Into f16/bf16 it rounds once from the exact source value (f16 <-> bf16 go through float,
// which holds both exactly). Into an integer it truncates like static_cast, and like
// static_cast requires the truncated value to fit in To.
template <class To, class From>
KILN_HOST_DEVICE To convert(From x) {
  if constexpr (std::is_same_v<To, From>) {
    return x;
  } else if constexpr (detail::is_half_v<From>) {
    return convert<To>(static_cast<float>(x));
  } else if constexpr (detail::is_half_v<To>) {
    return To(x);
  } else {
    return static_cast<To>(x);
  }
}

}  // namespace kiln
