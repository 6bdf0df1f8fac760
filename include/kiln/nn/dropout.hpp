// kiln/nn/dropout.hpp — inverted dropout with a counter-based mask.
//
// Element i is kept when uniform01(seed, offset + i) >= p (kiln/core/random.hpp, Philox), and
// kept elements are scaled by 1 / (1 - p). The mask is a pure function of (seed, offset, i), so
// the CPU and a GPU draw the same mask. Forward is ONE kernel and backward ONE kernel, functors
// that run on every executor.
//
// Cost. One Philox4x32 block gives the words of four consecutive offsets, and all four are used:
// a work item is one byte of the mask, 8 elements, two Philox blocks (positions q = offset % 4 +
// i, so a byte never straddles a block whatever the offset). The test is on the integers:
// u = (bits >> 8) · 2^-24 exactly, so u >= p  <=>  (bits >> 8) >= ceil(p · 2^24). When the input
// needs a gradient the forward also stores the mask, bit-packed (n / 8 bytes), and the backward
// reads it instead of drawing it again. On the CPU the work items run in tiles of
// dropout_tile_blocks Philox blocks computed side by side, which the compiler vectorises.
//
// Mask or regenerate (bench/dropout.cpp measures both in one run): on the CPU the stored mask
// wins (forward + backward 0.63x of regenerating at [64, 256], 0.97x at [1024, 1024] where both
// are bound by memory), because Philox is most of the cost even vectorised and the mask is 1/32
// of the bytes the backward moves anyway. On a GPU both kernels are bound by memory (8 bytes per
// element): the mask adds 1/64 to the forward's and the backward's traffic, while regenerating
// adds 20 Philox rounds per 8 elements to a backward whose ALUs would otherwise wait on memory,
// so the two should be within a few percent there. One path for both backends keeps CPU and GPU
// results trivially identical, and the caching allocator makes the mask's buffer free in a
// steady training loop. (Not measured on a GPU yet; detail::dropout_stores_mask switches.)
#pragma once

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>

#include "kiln/core/random.hpp"
#include "kiln/nn/module.hpp"

namespace kiln::nn {

// Whether dropout keeps element i (the same bits on every backend): the definition.
KILN_HOST_DEVICE bool dropout_keeps(std::uint64_t seed, std::uint64_t offset, index_t i, float p) {
  return uniform01(seed, offset + std::uint64_t(i)) >= p;
}

// The same test on the random word: keep iff (bits >> 8) >= dropout_threshold(p), which equals
// uniform01(...) >= p bit for bit (p · 2^24 is exact in float, so is its ceiling).
// requires: 0 <= p <= 1 (the threshold is then in [0, 2^24]).
KILN_HOST_DEVICE std::uint32_t dropout_threshold(float p) {
  return static_cast<std::uint32_t>(::ceilf(p * 16777216.0f));
}
KILN_HOST_DEVICE bool dropout_keeps_bits(std::uint32_t bits, std::uint32_t threshold) {
  return (bits >> 8) >= threshold;
}

namespace detail {

// Philox blocks per CPU tile: 4 · 64 elements, 32 mask bytes. Fewer lanes vectorise worse (GCC
// 12 unrolls a 16-lane loop completely and then fails to vectorise its 64-bit products).
inline constexpr int dropout_tile_blocks = 64;

// Where n elements drawn from `offset` fall: element i is position q = lead + i, lead =
// offset % 4, and position q draws word q % 4 of Philox block block0 + q / 4. Mask byte j holds
// positions 8j .. 8j + 7 (bit t = position 8j + t), i.e. blocks block0 + 2j and block0 + 2j + 1;
// bits of positions outside [lead, lead + n) are 0.
struct DropoutDraw {
  std::uint64_t seed = 0;
  std::uint64_t block0 = 0;
  index_t lead = 0;
  index_t n = 0;
  std::uint32_t threshold = 0;

  static DropoutDraw make(std::uint64_t seed, std::uint64_t offset, index_t n, float p) {
    return {seed, offset >> 2, index_t(offset & 3), n, dropout_threshold(p)};
  }
  // Work items: mask bytes.
  KILN_HOST_DEVICE index_t items() const { return n == 0 ? 0 : (lead + n + 7) / 8; }

  // The keep bits of mask byte j (one work item: two Philox blocks).
  KILN_HOST_DEVICE unsigned byte(index_t j) const {
    const std::uint64_t b = block0 + 2 * std::uint64_t(j);
    const PhiloxCounter r0 = random_block(seed, b << 2), r1 = random_block(seed, (b + 1) << 2);
    unsigned m = 0;
    for (int t = 0; t < 4; ++t) {
      m |= unsigned(dropout_keeps_bits(r0.v[t], threshold)) << t;
      m |= unsigned(dropout_keeps_bits(r1.v[t], threshold)) << (t + 4);
    }
    const index_t q0 = 8 * j;  // clear the positions that are no element
    if (q0 < lead) m &= 0xffu << unsigned(lead - q0);
    if (q0 + 8 > lead + n) m &= 0xffu >> unsigned(q0 + 8 - lead - n);
    return m;
  }

  // Host: the random words of positions 8j .. 8j + 4·dropout_tile_blocks - 1, computed for all
  // the tile's blocks side by side (structure of arrays, so the lane loop vectorises).
  void tile(index_t j, std::uint32_t* w) const {
    constexpr int L = dropout_tile_blocks;
    std::uint32_t c0[L], c1[L], c2[L], c3[L];
    const std::uint64_t b = block0 + 2 * std::uint64_t(j);
    for (int l = 0; l < L; ++l) {
      const PhiloxCounter c = kiln::detail::make_counter((b + std::uint64_t(l)) << 2, 0, 0);
      c0[l] = c.v[0];
      c1[l] = c.v[1];
      c2[l] = c.v[2];
      c3[l] = c.v[3];
    }
    PhiloxKey key = kiln::detail::make_key(seed);
    for (int round = 0; round < 10; ++round) {
      // The same round as kiln::detail::philox_round, one lane per block.
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)  // nvcc does not know the pragma
#pragma GCC unroll 1
#endif
      for (int l = 0; l < L; ++l) {
        const std::uint64_t p0 = std::uint64_t(kiln::detail::philox_m0) * c0[l];
        const std::uint64_t p1 = std::uint64_t(kiln::detail::philox_m1) * c2[l];
        const std::uint32_t n0 = std::uint32_t(p1 >> 32) ^ c1[l] ^ key.v[0];
        const std::uint32_t n2 = std::uint32_t(p0 >> 32) ^ c3[l] ^ key.v[1];
        c1[l] = std::uint32_t(p1);
        c3[l] = std::uint32_t(p0);
        c0[l] = n0;
        c2[l] = n2;
      }
      key.v[0] += kiln::detail::philox_w0;
      key.v[1] += kiln::detail::philox_w1;
    }
    for (int l = 0; l < L; ++l) {
      w[4 * l] = c0[l];
      w[4 * l + 1] = c1[l];
      w[4 * l + 2] = c2[l];
      w[4 * l + 3] = c3[l];
    }
  }
};

// Host: keep ? v : T(0) without a branch or a blend for float and double (v's bits AND'ed with
// all-ones or zero: +0 for a dropped element, as the select gives), which GCC vectorises on every
// x86 level (a vector select of floats on AVX2 measured 10× slower here).
template <class T>
inline T dropout_select(std::uint32_t keep, T v) {
  if constexpr (std::is_same_v<T, float>) {
    return std::bit_cast<float>(std::bit_cast<std::uint32_t>(v) & (0u - keep));
  } else if constexpr (std::is_same_v<T, double>) {
    return std::bit_cast<double>(std::bit_cast<std::uint64_t>(v) & (std::uint64_t(0) - keep));
  } else {
    return keep ? v : T(0);
  }
}

// Host: out (=|+=) keep ? in · scale : 0 over the mask bytes [jb, je) of a tile whose words w start
// at position 8·j0, and the packed keep bits into mask[jb, je) when mask != nullptr. Byte ranges
// wholly inside the elements take the branch-free loop.
template <class T>
inline void dropout_apply_words(const DropoutDraw& d, const std::uint32_t* w, index_t j0, index_t jb, index_t je,
                                const T* KILN_RESTRICT in, T* KILN_RESTRICT out, T scale, bool add,
                                std::uint8_t* KILN_RESTRICT mask) {
  constexpr index_t tile = 4 * dropout_tile_blocks;
  const index_t qb = 8 * jb, qe = 8 * je, base = 8 * j0;
  if (qb >= d.lead && qe <= d.lead + d.n) {
    const std::int32_t thr = std::int32_t(d.threshold);  // (bits >> 8) < 2^24: a signed compare
    const index_t len = qe - qb;
    const std::uint32_t* KILN_RESTRICT ww = w + (qb - base);
    const T* KILN_RESTRICT src = in + (qb - d.lead);
    T* KILN_RESTRICT dst = out + (qb - d.lead);
    alignas(64) std::uint8_t keep[tile];
    for (index_t q = 0; q < len; ++q) keep[q] = std::uint8_t(std::int32_t(ww[q] >> 8) >= thr);
    if (add) {
      for (index_t q = 0; q < len; ++q) dst[q] = T(dst[q] + dropout_select<T>(keep[q], T(src[q] * scale)));
    } else {
      for (index_t q = 0; q < len; ++q) dst[q] = dropout_select<T>(keep[q], T(src[q] * scale));
    }
    if (mask) {
      // Eight 0/1 bytes to eight bits: byte t of v lands on bit 56 + t of the product, no carries.
      for (index_t j = 0; j < len / 8; ++j) {
        std::uint64_t v;
        std::memcpy(&v, keep + 8 * j, 8);
        mask[jb + j] = std::uint8_t((v * 0x0102040810204080ull) >> 56);
      }
    }
    return;
  }
  for (index_t j = jb; j < je; ++j) {
    unsigned m = 0;
    for (int t = 0; t < 8; ++t) {
      const index_t q = 8 * j + t, i = q - d.lead;
      if (i < 0 || i >= d.n) continue;
      const bool keep = dropout_keeps_bits(w[q - base], d.threshold);
      m |= unsigned(keep) << t;
      put_grad(out[i], dropout_select<T>(keep, T(in[i] * scale)), add);
    }
    if (mask) mask[j] = std::uint8_t(m);
  }
}

// dropout's kernels, as functors that run on every executor: one work item per mask byte
// (operator()), and on the CPU whole ranges of items in vectorised tiles (run(), the same results
// bit for bit).
// Forward: y = keep ? x · scale : 0, and when mask != nullptr the packed keep bits.
template <class T>
struct DropoutForward {
  DropoutDraw draw;
  const T* x;
  T* y;
  std::uint8_t* mask;  // nullptr: not stored
  T scale;

  KILN_HOST_DEVICE void operator()(index_t, index_t j) const {
    const unsigned m = draw.byte(j);
    for (int t = 0; t < 8; ++t) {
      const index_t i = 8 * j + t - draw.lead;
      if (i >= 0 && i < draw.n) y[i] = (m >> t) & 1u ? T(x[i] * scale) : T(0);
    }
    if (mask) mask[j] = std::uint8_t(m);
  }

  // The host's loop over items [jb, je) (below; compiled once per type in kiln::kernels).
  void run(index_t jb, index_t je) const;
};

// Backward: dx (=|+=) keep ? g · scale : 0, the keep bits read from mask, or drawn again when
// mask == nullptr.
template <class T>
struct DropoutBackward {
  DropoutDraw draw;
  T* dx;
  const T* g;
  const std::uint8_t* mask;  // nullptr: regenerate
  T scale;
  bool add;

  KILN_HOST_DEVICE void operator()(index_t, index_t j) const {
    const unsigned m = mask ? unsigned(mask[j]) : draw.byte(j);
    for (int t = 0; t < 8; ++t) {
      const index_t i = 8 * j + t - draw.lead;
      if (i >= 0 && i < draw.n) put_grad(dx[i], (m >> t) & 1u ? T(g[i] * scale) : T(0), add);
    }
  }

  void run(index_t jb, index_t je) const;  // as DropoutForward::run
};

template <class T>
void DropoutForward<T>::run(index_t jb, index_t je) const {
  constexpr index_t tile_items = dropout_tile_blocks / 2;
  alignas(64) std::uint32_t w[4 * dropout_tile_blocks];
  for (index_t j = jb; j < je; j += tile_items) {
    draw.tile(j, w);
    dropout_apply_words(draw, w, j, j, std::min(je, j + tile_items), x, y, scale, false, mask);
  }
}

template <class T>
void DropoutBackward<T>::run(index_t jb, index_t je) const {
  if (!mask) {
    constexpr index_t tile_items = dropout_tile_blocks / 2;
    alignas(64) std::uint32_t w[4 * dropout_tile_blocks];
    for (index_t j = jb; j < je; j += tile_items) {
      draw.tile(j, w);
      dropout_apply_words(draw, w, j, j, std::min(je, j + tile_items), g, dx, scale, add, nullptr);
    }
    return;
  }
  // The bytes wholly inside the elements, eight elements per byte, branch-free; the (at most
  // two) partial bytes at the ends one at a time.
  const index_t fb = std::clamp((draw.lead + 7) / 8, jb, je), fe = std::clamp((draw.lead + draw.n) / 8, fb, je);
  for (index_t j = jb; j < fb; ++j) (*this)(0, j);
  if (fe > fb) {
    const std::uint8_t* KILN_RESTRICT m = mask;
    const T* KILN_RESTRICT src = g + (8 * fb - draw.lead);
    T* KILN_RESTRICT dst = dx + (8 * fb - draw.lead);
    const index_t count = fe - fb;
    if (add) {
      for (index_t j = 0; j < count; ++j)
        for (int t = 0; t < 8; ++t)
          dst[8 * j + t] = T(dst[8 * j + t] + dropout_select<T>((m[fb + j] >> t) & 1u, T(src[8 * j + t] * scale)));
    } else {
      for (index_t j = 0; j < count; ++j)
        for (int t = 0; t < 8; ++t)
          dst[8 * j + t] = dropout_select<T>((m[fb + j] >> t) & 1u, T(src[8 * j + t] * scale));
    }
  }
  for (index_t j = fe; j < je; ++j) (*this)(0, j);
}

// kiln::kernels (kiln/config.hpp) compiles the host loops once per type (src/kernels/nn.cpp).
#define KILN_DROPOUT_INSTANCES(EXTERN, T) \
  EXTERN template struct DropoutForward<T>; \
  EXTERN template struct DropoutBackward<T>;
#if KILN_EXTERN_KERNELS
KILN_DROPOUT_INSTANCES(extern, float)
KILN_DROPOUT_INSTANCES(extern, double)
#endif

// Runs a dropout functor over all its work items as ONE launch of kind::elementwise: on the CPU
// ranges of items through run() (split across threads), elsewhere one item per work item.
template <class Exec, class F>
void launch_dropout(Exec& exec, const F& f, const char* name, std::size_t bytes) {
  const index_t items = f.draw.items();
  if constexpr (std::is_same_v<typename Exec::space, host>) {
    exec.stats().count(kind::elementwise, name, f.draw.n, bytes);
    exec.parallel_for(items, std::max<index_t>(1, Exec::grain / 8), [&](index_t b, index_t e) {
      const F local = f;  // a private copy keeps its pointers in registers
      local.run(b, e);
    });
  } else {
    exec.for_each_element(1, items, f, kind::elementwise, name, bytes);
  }
}

// Whether the forward stores the mask for the backward (true) or the backward draws it again.
inline constexpr bool dropout_stores_mask = true;

}  // namespace detail

// Returns x itself (no kernel) when !training or p == 0; p == 1 gives zeros.
// throws: ValueError when p is outside [0, 1].
template <class Exec, class T, class S, index_t... D>
ag::Var<T, S, D...> dropout(ag::Tape<Exec>& tape, const ag::Var<T, S, D...>& x, double p, std::uint64_t seed,
                            std::uint64_t offset, bool training = true) {
  KILN_CHECK(p >= 0.0 && p <= 1.0, ValueError, "dropout: p must be in [0, 1], got ", p);
  if (!training || p == 0.0) return x;
  using V = ag::Var<T, S, D...>;
  const Shape s = x.shape();
  const index_t n = s.size();
  V out{typename V::tensor_type(s)};
  const detail::DropoutDraw draw = detail::DropoutDraw::make(seed, offset, n, float(p));
  const T scale = p < 1.0 ? T(1.0 / (1.0 - p)) : T(0);
  const bool grad = x.requires_grad() && tape.recording();
  using Mask = Tensor<std::uint8_t, S, dyn>;
  std::shared_ptr<Mask> mask;
  if (grad && detail::dropout_stores_mask) mask = std::make_shared<Mask>(draw.items());
  const std::size_t bytes = std::size_t(n) * sizeof(T) * 2;
  detail::launch_dropout(tape.exec(),
                         detail::DropoutForward<T>{draw, x.value().data(), out.value().data(),
                                                   mask ? mask->data() : nullptr, scale},
                         "dropout", bytes + (mask ? std::size_t(draw.items()) : 0));
  if (!grad) return out;
  out.set_requires_grad(true);
  tape.record(out, {x.data()}, [xd = x.data(), draw, scale, mask, bytes](Exec& exec, auto& od) {
    if (!od.grad_valid || !xd->requires_grad) return;
    const bool add = xd->grad_valid;
    T* dx = xd->ensure_grad();
    detail::launch_dropout(
        exec, detail::DropoutBackward<T>{draw, dx, od.grad.data(), mask ? mask->data() : nullptr, scale, add},
        "dropout_backward", bytes + (mask ? std::size_t(draw.items()) : 0));
    xd->grad_valid = true;
  });
  return out;
}

// Dropout<P> as a layer: drops with probability P (PyTorch's 0.5 when nothing is said), a fresh
// mask every training forward (the offset advances by the number of elements), identity in eval
// mode. P is part of the type, so a model says it where it is defined:
//   nn::Sequential<nn::Linear<16, 256>, nn::GELU, nn::Dropout<0.1>, nn::Linear<256, 26>>
// and set_p() changes it at run time (a schedule, say).
template <double P = 0.5>
class Dropout {
  static_assert(P >= 0.0 && P <= 1.0,
                "kiln::nn::Dropout<P>: the drop probability P must be in [0, 1] (e.g. Dropout<0.1>)");

 public:
  // The probability the type was declared with.
  static constexpr double declared_p = P;
  // The output has the input's shape (nn/sample_shape.hpp).
  static constexpr bool keeps_shape = true;

  explicit Dropout(std::uint64_t seed = 0) : seed_(seed) {}
  // Sequential's constructor: the seed is the generator's next 64 bits.
  explicit Dropout(Generator& gen) : Dropout(gen.next_u64()) {}
  // Dropout(0.2, seed) was the spelling before P moved into the type; a floating-point first
  // argument would otherwise silently become the seed.
  template <std::floating_point F>
  explicit Dropout(F, std::uint64_t = 0) {
    static_assert(dependent_false<F>,
                  "kiln::nn::Dropout: the probability is a template argument, not a constructor argument: "
                  "write Dropout<0.2>(seed), or call set_p(p) at run time");
  }

  template <class Exec, class T, class S, index_t... D>
  ag::Var<T, S, D...> forward(ag::Tape<Exec>& tape, const ag::Var<T, S, D...>& x) {
    if (!training_) return x;
    tape.exec().stats().host_state("dropout's random offset");
    auto y = dropout(tape, x, p_, seed_, offset_, true);
    offset_ += std::uint64_t(x.value().size());
    return y;
  }

  void train(bool on = true) { training_ = on; }
  void eval() { training_ = false; }
  bool training() const { return training_; }
  double p() const { return p_; }
  // throws: ValueError when p is outside [0, 1].
  void set_p(double p) {
    KILN_CHECK(p >= 0.0 && p <= 1.0, ValueError, "Dropout: p must be in [0, 1], got ", p);
    p_ = p;
  }
  std::uint64_t seed() const { return seed_; }
  std::uint64_t offset() const { return offset_; }
  // The mask stream and where the next mask starts drawing in it: a run resumed from a checkpoint
  // (kiln/train/checkpoint.hpp) continues the uninterrupted run's masks.
  void set_rng(std::uint64_t seed, std::uint64_t offset) {
    seed_ = seed;
    offset_ = offset;
  }

  // In training mode one kernel each way (none at P = 0: the input passes through); none in eval
  // mode. (Counted for the P in the type; set_p(0) at run time launches nothing.)
  static constexpr Launches launches(const LaunchContext& c) {
    if (!c.training || P == 0.0) return {0, 0};
    return {1, c.input_grad ? 1 : 0};
  }

  // "Dropout<0.1>" (and ", p = 0.3" after a set_p), for Sequential::describe().
  std::string describe() const {
    std::string out = "Dropout<" + shortest(P) + ">";
    if (p_ != P) out += ", p = " + shortest(p_);
    return out;
  }

 private:
  static std::string shortest(double v) {
    char buf[32];
    const auto r = std::to_chars(buf, buf + sizeof buf, v);
    return std::string(buf, r.ptr);
  }

  double p_ = P;
  std::uint64_t seed_;
  std::uint64_t offset_ = 0;
  bool training_ = true;
};

}  // namespace kiln::nn
