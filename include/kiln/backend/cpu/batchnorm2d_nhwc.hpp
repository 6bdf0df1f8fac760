// kiln/backend/cpu/batchnorm2d_nhwc.hpp — BatchNorm2d on the CPU, channels-last (NHWC).
//
//   x, y, dy, dx [N, H, W, C] dense row-major; gamma, beta, running_*, save_* [C]; hw = H*W.
//   Same functions, parameters, semantics and errors as batchnorm2d.hpp, with _nhwc in the name.
//
// Every channel is computed with the arithmetic of the NCHW kernel, in its order — per image, 16
// lanes in T over the plane's hw values (value j into lane j % 16), the tail and then the lanes
// added in double — only vectorised across a block of channels instead of along the plane, since
// a row of x holds C contiguous channels. So the results are batchnorm2d.hpp's, bit for bit
// unless the compiler fuses different multiply-adds in the two loops (GCC tuned for Zen does in
// double: last-bit differences), and do not depend on the thread count: the sums split the
// images across threads and add their lanes in image order afterwards, the elementwise passes
// split the rows (eval-mode backward, whose sums run row by row, splits the channels).
//
// Storage types: x, y, the residual and dy may be kiln::bf16 where T is float (mixed precision,
// nn/half_io.hpp): values are widened as they are read and rounded once as they are written
// (kiln/core/bf16_bulk.hpp, row by row), the arithmetic stays T — the same bits as widening the
// whole tensor first and rounding the whole result after, without those two extra passes.
//
// Passes stream whole rows: an image is swept tile of rows by tile of rows (each tile
// L2-resident while its blocks of 32 channels are summed), and the elementwise passes walk rows
// in order — never one block of channels down the whole tensor, which reads 128 bytes of every
// row and ran at a third of copy bandwidth on tensors past the caches. Nor do two threads share
// the rows: with the channels split, both read every row, and at two threads the batch-norm
// passes of a bf16 ResNet-50 step took 1.5-1.65x the CPU time of one thread's.
#pragma once

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "kiln/backend/cpu/batchnorm2d.hpp"
#include "kiln/core/bf16_bulk.hpp"
#include "kiln/core/dtype.hpp"

namespace kiln::cpu {

namespace detail {

// Channels per inner block: a row's block is one contiguous run for the vector adds.
inline constexpr index_t bn_nhwc_block = 32, bn_nhwc_lanes = 16;

// A storage type S for compute type T: T itself, or bf16 for float.
template <class S, class T>
inline constexpr bool bn_storage_ok = std::is_same_v<S, T> || (std::is_same_v<S, bf16> && std::is_same_v<T, float>);

// A row of n values of storage type S as T: the row itself, or widened into buf.
template <class T, class S>
inline const T* bn_row_as(const S* row, index_t n, T* buf) {
  if constexpr (std::is_same_v<S, T>) {
    (void)n, (void)buf;
    return row;
  } else {
    widen_bf16(row, buf, n);
    return buf;
  }
}
// Where to compute a row of n values to be stored as S at row: there, or in buf (then bn_row_store).
template <class T, class S>
inline T* bn_row_target(S* row, T* buf) {
  if constexpr (std::is_same_v<S, T>) {
    (void)buf;
    return row;
  } else {
    return buf;
  }
}
template <class T, class S>
inline void bn_row_store(S* row, const T* buf, index_t n) {
  if constexpr (!std::is_same_v<S, T>) round_to_bf16(buf, row, n);
  else (void)row, (void)buf, (void)n;
}

// f(c0, c1) for contiguous ranges of channels, one per thread (whole vectors of 8 channels, the
// last range excepted). Each channel is computed alone, so the split changes no result.
template <class F>
void batchnorm2d_nhwc_parts(index_t c, int threads, const F& f) {
  const index_t units = (c + 7) / 8, parts = std::clamp<index_t>(threads, 1, std::max<index_t>(units, 1));
  batchnorm2d_channels(parts, threads, [&](index_t p) {
    const index_t base = units / parts, extra = units % parts;
    const index_t u0 = p * base + std::min(p, extra), u1 = u0 + base + (p < extra ? 1 : 0);
    f(std::min(c, u0 * 8), std::min(c, u1 * 8));
  });
}

// Rows per tile of a pass over channels [c0, c1): every channel block sweeps one tile before the
// next is read, so a tile (up to ~96 KiB of each operand) is read from memory once and from L2
// by the other blocks. At most 128 rows: a lane walks rows 16 apart, which for 64 or 256 channels
// are 4 or 16 KiB apart and share one L1 set; more than its 8 ways would evict each other.
template <class T>
index_t bn_nhwc_tile_rows(index_t channels) {
  constexpr index_t bytes = index_t(96) << 10, l = bn_nhwc_lanes;
  return std::clamp<index_t>(bytes / index_t(sizeof(T)) / std::max<index_t>(channels, 1) / l * l, l, 8 * l);
}

// Rows [j0, j1) (whole groups of 16) of cb channels into their lanes u_l / v_l [16][cb]: row j's
// values come from value(p, k) with p = j * c (its offset from the block's first element).
// For each lane and vector of 16 channels, the lane's rows j0 + l, j0 + l + 16, ... are summed
// in registers and the lane stored once (each lane still adds its rows in order).
template <class T, bool Two, class V>
inline void batchnorm2d_nhwc_lane_block(index_t j0, index_t j1, index_t cb, index_t c, T* __restrict u_l,
                                        T* __restrict v_l, const V& value) {
  constexpr index_t vec = 16;
  index_t k0 = 0;
  for (; k0 + vec <= cb; k0 += vec)
    for (index_t l = 0; l < bn_nhwc_lanes; ++l) {
      T au[vec], av[vec];
      for (index_t k = 0; k < vec; ++k) au[k] = u_l[l * cb + k0 + k], av[k] = Two ? v_l[l * cb + k0 + k] : T(0);
      for (index_t j = j0 + l; j < j1; j += bn_nhwc_lanes)
        for (index_t k = 0; k < vec; ++k) {
          T u, v;
          value(j * c, k0 + k, u, v);
          au[k] += u;
          if constexpr (Two) av[k] += v;
        }
      for (index_t k = 0; k < vec; ++k) {
        u_l[l * cb + k0 + k] = au[k];
        if constexpr (Two) v_l[l * cb + k0 + k] = av[k];
      }
    }
  if (k0 == cb) return;
  for (index_t j = j0; j < j1; j += bn_nhwc_lanes)  // the last channels, fewer than a vector
    for (index_t l = 0; l < bn_nhwc_lanes; ++l) {
      const index_t p = (j + l) * c;
      for (index_t k = k0; k < cb; ++k) {
        T u, v;
        value(p, k, u, v);
        u_l[l * cb + k] += u;
        if constexpr (Two) v_l[l * cb + k] += v;
      }
    }
}

// batchnorm2d_lane_sums for every channel of every image: a[k] += sum of u, b[k] += sum of v (b
// only when Two) over each image's hw rows, per channel in the NCHW kernel's order — value j into
// lane j % 16 below hw - hw % 16, then the tail and then the lanes added in double. The images'
// lanes are computed in parallel (each thread streams whole rows of its images), then added
// serially, image by image, so the bits do not depend on the thread count. blk_of(i)(k0) returns
// the value functor of image i's block starting at channel k0: value(p, k, u, v) for the element
// p + k past that block's first element of row 0 (p = j * c). per_image: each image's sums start
// from zero and are then added to a and b (batchnorm2d_backward's order); otherwise they add onto
// a and b directly (batchnorm2d_channel_stats').
template <class T, bool Two, class BlkOf>
void batchnorm2d_nhwc_image_sums(index_t n, index_t hw, index_t c, double* a, double* b, bool per_image, int threads,
                                 const BlkOf& blk_of) {
  constexpr index_t l_n = bn_nhwc_lanes, bl = bn_nhwc_block;
  const index_t main = hw - hw % l_n, tile = bn_nhwc_tile_rows<T>(c), per = (Two ? 2 : 1) * l_n * c;
  std::vector<T> lanes(static_cast<std::size_t>(n * per), T(0));
  batchnorm2d_channels(n, threads, [&](index_t i) {
    T* ua = lanes.data() + i * per;
    T* va = ua + l_n * c;
    const auto blk = blk_of(i);
    for (index_t j0 = 0; j0 < main; j0 += tile) {
      const index_t j1 = std::min(main, j0 + tile);
      for (index_t k0 = 0; k0 < c; k0 += bl) {
        const index_t cb = std::min(bl, c - k0), off = k0 * l_n;
        batchnorm2d_nhwc_lane_block<T, Two>(j0, j1, cb, c, ua + off, va + off, blk(k0));
      }
    }
  });
  std::vector<double> own(per_image ? std::size_t(2 * c) : 0);
  for (index_t i = 0; i < n; ++i) {
    double* ai = per_image ? own.data() : a;
    double* bi = per_image ? own.data() + c : b;
    if (per_image) std::fill(own.begin(), own.end(), 0.0);
    const auto value = blk_of(i)(0);
    for (index_t j = main; j < hw; ++j)
      for (index_t k = 0; k < c; ++k) {
        T u, v;
        value(j * c, k, u, v);
        ai[k] += double(u);
        if constexpr (Two) bi[k] += double(v);
      }
    const T* ua = lanes.data() + i * per;
    const T* va = ua + l_n * c;
    for (index_t k0 = 0; k0 < c; k0 += bl) {
      const index_t cb = std::min(bl, c - k0), off = k0 * l_n;
      for (index_t l = 0; l < l_n; ++l)
        for (index_t k = 0; k < cb; ++k) {
          ai[k0 + k] += double(ua[off + l * cb + k]);
          if constexpr (Two) bi[k0 + k] += double(va[off + l * cb + k]);
        }
    }
    if (per_image)
      for (index_t k = 0; k < c; ++k) {
        a[k] += ai[k];
        if constexpr (Two) b[k] += bi[k];
      }
  }
}

// Mean and biased variance of every channel: batchnorm2d_channel_stats per channel.
template <class T, class X>
void batchnorm2d_nhwc_stats(index_t n, index_t c, index_t hw, const X* x, double* mean, double* var, int threads) {
  const auto uc = static_cast<std::size_t>(c);
  std::vector<double> sum(uc, 0.0), sq(uc, 0.0), shift(uc, 0.0);
  std::vector<T> mu(uc);
  batchnorm2d_nhwc_image_sums<T, false>(n, hw, c, sum.data(), nullptr, false, threads, [&](index_t i) {
    return [xi = x + i * hw * c](index_t k0) {
      return [p0 = xi + k0](index_t p, index_t k, T& u, T&) { u = T(p0[p + k]); };
    };
  });
  const double m = double(n * hw);
  for (index_t k = 0; k < c; ++k) mu[std::size_t(k)] = T(mean[k] = sum[std::size_t(k)] / m);
  batchnorm2d_nhwc_image_sums<T, true>(n, hw, c, sq.data(), shift.data(), false, threads, [&](index_t i) {
    return [xi = x + i * hw * c, m = mu.data()](index_t k0) {
      return [p0 = xi + k0, m0 = m + k0](index_t p, index_t k, T& u, T& v) {
        const T d = T(p0[p + k]) - m0[k];
        u = d * d;
        v = d;
      };
    };
  });
  // mu is mean rounded to T: sum((x - mu)^2) / m - (sum(x - mu) / m)^2 corrects for it.
  for (index_t k = 0; k < c; ++k) {
    const double dm = shift[std::size_t(k)] / m;
    var[k] = std::max(0.0, sq[std::size_t(k)] / m - dm * dm);
  }
}

// f(r0, r1) for contiguous ranges of the rows [0, rows), one per thread: the elementwise passes,
// each thread streaming whole rows (a split of the channels had both threads read every row,
// and each one's lines brought the other's in with them).
template <class F>
void batchnorm2d_nhwc_row_parts(index_t rows, int threads, const F& f) {
  const index_t parts = std::clamp<index_t>(threads, 1, std::max<index_t>(rows / 64, 1));
  batchnorm2d_channels(parts, threads, [&](index_t p) { f(rows * p / parts, rows * (p + 1) / parts); });
}

// y = act((x - mean) * scale + shift [+ res]) in T over channels [c0, c1), as
// batchnorm2d_channel_affine; mean, scale, shift indexed ch - c0. Rows in order, each row's
// channels one contiguous run.
template <class T, class Act, class X, class Y>
void batchnorm2d_nhwc_affine(index_t rows, index_t c, const X* x, index_t c0, index_t c1,
                             const double* mean, const double* scale, const double* shift, Y* y,
                             Act act, const X* res = nullptr) {
  const index_t cw = c1 - c0;
  constexpr bool same = std::is_same_v<X, T> && std::is_same_v<Y, T>;
  std::vector<T> mab(std::size_t((same ? 3 : 6) * cw));  // with bf16 storage: rows of x, res, y in T
  T* m = mab.data();
  T* a = m + cw;
  T* b = a + cw;
  for (index_t k = 0; k < cw; ++k) m[k] = T(mean[k]), a[k] = T(scale[k]), b[k] = T(shift[k]);
  // y may be x's or res's own storage (in place: each element read, then written); the constants
  // are restrict, being nobody else's memory.
  auto row = [&](const T* xr, const T* rr, T* yr, const T* __restrict mk,
                 const T* __restrict ak, const T* __restrict bk) {
    if (rr) {
      for (index_t k = 0; k < cw; ++k) yr[k] = act(T(T((xr[k] - mk[k]) * ak[k] + bk[k]) + rr[k]));
    } else {
      for (index_t k = 0; k < cw; ++k) yr[k] = act(T((xr[k] - mk[k]) * ak[k] + bk[k]));
    }
  };
  if constexpr (same) {
    for (index_t r = 0; r < rows; ++r)
      row(x + r * c + c0, res ? res + r * c + c0 : nullptr, y + r * c + c0, m, a, b);
  } else {
    T* xb = b + cw;
    T* rb = xb + cw;
    T* yb = rb + cw;
    for (index_t r = 0; r < rows; ++r) {
      const index_t e = r * c + c0;
      const T* xr = bn_row_as<T>(x + e, cw, xb);
      const T* rr = res ? bn_row_as<T>(res + e, cw, rb) : nullptr;
      row(xr, rr, bn_row_target<T>(y + e, yb), m, a, b);
      bn_row_store(y + e, yb, cw);
    }
  }
}

}  // namespace detail

// Training-mode forward, as batchnorm2d_train_forward.
// x, y and residual: T, or bf16 where T is float (see the file comment).
template <class T, class Act = NoActivation, class X = T, class Y = T>
void batchnorm2d_nhwc_train_forward(index_t n, index_t c, index_t hw, const X* x, const T* gamma,
                                    const T* beta, double eps, double momentum, T* running_mean,
                                    T* running_var, Y* y, T* save_mean, T* save_invstd,
                                    int threads = 1, Act act = {}, const X* residual = nullptr,
                                    T* save_scale = nullptr) {
  static_assert(detail::batchnorm_type_ok<T>,
                "kiln::cpu::batchnorm2d_nhwc_train_forward: T must be float or double");
  static_assert(detail::bn_storage_ok<X, T> && detail::bn_storage_ok<Y, T>,
                "kiln::cpu::batchnorm2d_nhwc_train_forward: x and y are T, or bf16 where T is float");
  constexpr const char* fn = "kiln::cpu::batchnorm2d_nhwc_train_forward";
  detail::batchnorm2d_check_sizes(fn, n, c, hw);
  KILN_CHECK(n * hw > 1, ValueError, fn,
             ": expected more than 1 value per channel when training, got n=", n, " c=", c,
             " hw=", hw, " (n*hw=", n * hw, ")");
  detail::batchnorm2d_check_eps(fn, eps);
  KILN_CHECK(momentum >= 0.0 && momentum <= 1.0, ValueError, fn,
             ": momentum must be in [0, 1], got momentum=", momentum);
  KILN_CHECK((running_mean == nullptr) == (running_var == nullptr), ValueError, fn,
             ": running_mean and running_var must both be given or both be null");
  const double m = double(n * hw);
  const std::size_t cw = std::size_t(c);
  std::vector<double> mean(cw), var(cw), scale(cw), shift(cw);
  detail::batchnorm2d_nhwc_stats<T>(n, c, hw, x, mean.data(), var.data(), threads);
  {
    for (std::size_t k = 0; k < cw; ++k) {
      const index_t ch = index_t(k);
      const double invstd = 1.0 / std::sqrt(var[k] + eps);
      scale[k] = invstd * (gamma ? double(gamma[ch]) : 1.0);
      shift[k] = beta ? double(beta[ch]) : 0.0;
      if (running_mean) {
        running_mean[ch] = T((1.0 - momentum) * double(running_mean[ch]) + momentum * mean[k]);
        running_var[ch] =
            T((1.0 - momentum) * double(running_var[ch]) + momentum * var[k] * m / (m - 1.0));
      }
      if (save_mean) save_mean[ch] = T(mean[k]);
      if (save_invstd) save_invstd[ch] = T(invstd);
      if (save_scale) save_scale[ch] = T(scale[k]);
    }
  }
  detail::batchnorm2d_nhwc_row_parts(n * hw, threads, [&](index_t r0, index_t r1) {
    detail::batchnorm2d_nhwc_affine<T>(r1 - r0, c, x + r0 * c, 0, c, mean.data(), scale.data(), shift.data(),
                                       y + r0 * c, act, residual ? residual + r0 * c : nullptr);
  });
}

// Eval-mode forward, as batchnorm2d_eval_forward.
template <class T, class Act = NoActivation, class X = T, class Y = T>
void batchnorm2d_nhwc_eval_forward(index_t n, index_t c, index_t hw, const X* x, const T* gamma,
                                   const T* beta, double eps, const T* running_mean,
                                   const T* running_var, Y* y, int threads = 1, Act act = {},
                                   const X* residual = nullptr, T* save_scale = nullptr) {
  static_assert(detail::batchnorm_type_ok<T>,
                "kiln::cpu::batchnorm2d_nhwc_eval_forward: T must be float or double");
  static_assert(detail::bn_storage_ok<X, T> && detail::bn_storage_ok<Y, T>,
                "kiln::cpu::batchnorm2d_nhwc_eval_forward: x and y are T, or bf16 where T is float");
  constexpr const char* fn = "kiln::cpu::batchnorm2d_nhwc_eval_forward";
  detail::batchnorm2d_check_sizes(fn, n, c, hw);
  detail::batchnorm2d_check_eps(fn, eps);
  KILN_CHECK(running_mean != nullptr && running_var != nullptr, ValueError, fn,
             ": eval mode needs running_mean and running_var");
  const std::size_t cw = std::size_t(c);
  std::vector<double> mean(cw), scale(cw), shift(cw);
  for (std::size_t k = 0; k < cw; ++k) {
    const index_t ch = index_t(k);
    mean[k] = double(running_mean[ch]);
    scale[k] = 1.0 / std::sqrt(double(running_var[ch]) + eps) * (gamma ? double(gamma[ch]) : 1.0);
    shift[k] = beta ? double(beta[ch]) : 0.0;
    if (save_scale) save_scale[ch] = T(scale[k]);
  }
  detail::batchnorm2d_nhwc_row_parts(n * hw, threads, [&](index_t r0, index_t r1) {
    detail::batchnorm2d_nhwc_affine<T>(r1 - r0, c, x + r0 * c, 0, c, mean.data(), scale.data(), shift.data(),
                                       y + r0 * c, act, residual ? residual + r0 * c : nullptr);
  });
}

// y = act((x - mean) * scale + shift) with the constants a forward used, as batchnorm2d_apply:
// the forward's output, bit for bit, made again from its input.
template <class T, class Act = NoActivation>
void batchnorm2d_nhwc_apply(index_t n, index_t c, index_t hw, const T* x, const T* mean, const T* scale,
                            const T* shift, T* y, int threads = 1, Act act = {}) {
  static_assert(detail::batchnorm_type_ok<T>, "kiln::cpu::batchnorm2d_nhwc_apply: T must be float or double");
  detail::batchnorm2d_check_sizes("kiln::cpu::batchnorm2d_nhwc_apply", n, c, hw);
  const std::size_t cw = std::size_t(c);
  std::vector<double> m(cw), a(cw), b(cw);  // exact: T -> double -> T is the identity
  for (std::size_t k = 0; k < cw; ++k) m[k] = double(mean[k]), a[k] = double(scale[k]), b[k] = double(shift[k]);
  detail::batchnorm2d_nhwc_row_parts(n * hw, threads, [&](index_t r0, index_t r1) {
    detail::batchnorm2d_nhwc_affine<T>(r1 - r0, c, x + r0 * c, 0, c, m.data(), a.data(), b.data(), y + r0 * c, act);
  });
}

// Training-mode backward, as batchnorm2d_backward (beta is read only with an activation).
// x, dy and dx: T, or bf16 where T is float (see the file comment).
template <class T, class Act = NoActivation, class X = T, class G = T, class D = T>
void batchnorm2d_nhwc_backward(index_t n, index_t c, index_t hw, const X* x, const G* dy,
                               const T* gamma, const T* save_mean, const T* save_invstd, D* dx,
                               T* dgamma, T* dbeta, int threads = 1, const T* beta = nullptr,
                               Act act = {}) {
  static_assert(detail::batchnorm_type_ok<T>,
                "kiln::cpu::batchnorm2d_nhwc_backward: T must be float or double");
  static_assert(detail::bn_storage_ok<X, T> && detail::bn_storage_ok<G, T> && detail::bn_storage_ok<D, T>,
                "kiln::cpu::batchnorm2d_nhwc_backward: x, dy and dx are T, or bf16 where T is float");
  constexpr const char* fn = "kiln::cpu::batchnorm2d_nhwc_backward";
  constexpr bool has_act = !std::is_same_v<Act, NoActivation>;
  detail::batchnorm2d_check_sizes(fn, n, c, hw);
  KILN_CHECK(save_mean != nullptr && save_invstd != nullptr, ValueError, fn,
             ": needs save_mean and save_invstd from batchnorm2d_nhwc_train_forward");
  const double m = double(n * hw);
  const index_t cw = c;
  std::vector<T> consts(std::size_t(6 * cw));
  T* zm = consts.data();
  T* zs = zm + cw;
  T* zb = zs + cw;
  T* kk = zb + cw;
  T* mean_dy = kk + cw;
  T* slope = mean_dy + cw;
  for (index_t k = 0; k < cw; ++k) {
    const double g = gamma ? double(gamma[k]) : 1.0;
    zm[k] = save_mean[k];  // T(double(save_mean)) == save_mean
    zs[k] = T(double(save_invstd[k]) * g);
    zb[k] = T(beta ? double(beta[k]) : 0.0);
  }
  std::vector<double> sums(std::size_t(2 * cw), 0.0);
  double* sum_dy = sums.data();
  double* sum_dy_xm = sum_dy + cw;
  // dz: dy, or dy * act'(z) with z recomputed as the forward; then dz and dz * (x - mean), per
  // image from zero and then added (batchnorm2d_backward's order).
  detail::batchnorm2d_nhwc_image_sums<T, true>(n, hw, c, sum_dy, sum_dy_xm, true, threads, [&](index_t i) {
    return [&, e0 = i * hw * c](index_t k0) {
      return [xk = x + e0 + k0, dyk = dy + e0 + k0, mk = zm + k0, sk = zs + k0, bk = zb + k0, act](
                 index_t p, index_t k, T& u, T& v) {
        const T xm = T(xk[p + k]) - mk[k];
        if constexpr (!std::is_same_v<Act, NoActivation>) u = T(T(dyk[p + k]) * act.d(T(xm * sk[k] + bk[k])));
        else u = T(dyk[p + k]);
        v = u * xm;
      };
    };
  });
  for (index_t k = 0; k < cw; ++k) {
    const double invstd = double(save_invstd[k]), g = gamma ? double(gamma[k]) : 1.0;
    const double sum_dy_xhat = sum_dy_xm[k] * invstd;
    if (dbeta) dbeta[k] = T(sum_dy[k]);
    if (dgamma) dgamma[k] = T(sum_dy_xhat);
    kk[k] = T(g * invstd), mean_dy[k] = T(sum_dy[k] / m), slope[k] = T(invstd * sum_dy_xhat / m);
  }
  if (!dx) return;
  // dx may be dy's own storage (in place, element by element); the constants are restrict,
  // being nobody else's memory.
  auto row = [&](T* dxr, const T* xr, const T* dyr, const T* __restrict c_m, const T* __restrict c_s,
                 const T* __restrict c_b, const T* __restrict c_k, const T* __restrict c_mdy,
                 const T* __restrict c_sl) {
    for (index_t k = 0; k < cw; ++k) {
      T d = dyr[k];
      if constexpr (has_act) d = T(d * act.d(T((xr[k] - c_m[k]) * c_s[k] + c_b[k])));
      dxr[k] = c_k[k] * (d - c_mdy[k] - (xr[k] - c_m[k]) * c_sl[k]);
    }
  };
  detail::batchnorm2d_nhwc_row_parts(n * hw, threads, [&](index_t r0, index_t r1) {
    if constexpr (std::is_same_v<X, T> && std::is_same_v<G, T> && std::is_same_v<D, T>) {
      for (index_t r = r0; r < r1; ++r) {
        const index_t e = r * c;
        row(dx + e, x + e, dy + e, zm, zs, zb, kk, mean_dy, slope);
      }
    } else {
      std::vector<T> rows_buf(std::size_t(3 * cw));
      T* xb = rows_buf.data();
      T* gb = xb + cw;
      T* db = gb + cw;
      for (index_t r = r0; r < r1; ++r) {
        const index_t e = r * c;
        const T* xr = detail::bn_row_as<T>(x + e, cw, xb);
        const T* gr = detail::bn_row_as<T>(dy + e, cw, gb);
        row(detail::bn_row_target<T>(dx + e, db), xr, gr, zm, zs, zb, kk, mean_dy, slope);
        detail::bn_row_store(dx + e, db, cw);
      }
    }
  });
}

// Eval-mode backward, as batchnorm2d_eval_backward.
template <class T, class Act = NoActivation, class X = T, class G = T, class D = T>
void batchnorm2d_nhwc_eval_backward(index_t n, index_t c, index_t hw, const X* x, const G* dy,
                                    const T* gamma, const T* beta, double eps,
                                    const T* running_mean, const T* running_var, D* dx, T* dgamma,
                                    T* dbeta, int threads = 1, Act act = {}) {
  static_assert(detail::batchnorm_type_ok<T>,
                "kiln::cpu::batchnorm2d_nhwc_eval_backward: T must be float or double");
  static_assert(detail::bn_storage_ok<X, T> && detail::bn_storage_ok<G, T> && detail::bn_storage_ok<D, T>,
                "kiln::cpu::batchnorm2d_nhwc_eval_backward: x, dy and dx are T, or bf16 where T is float");
  constexpr const char* fn = "kiln::cpu::batchnorm2d_nhwc_eval_backward";
  constexpr bool has_act = !std::is_same_v<Act, NoActivation>;
  detail::batchnorm2d_check_sizes(fn, n, c, hw);
  detail::batchnorm2d_check_eps(fn, eps);
  KILN_CHECK(running_mean != nullptr && running_var != nullptr, ValueError, fn,
             ": eval mode needs running_mean and running_var");
  detail::batchnorm2d_nhwc_parts(c, threads, [&](index_t c0, index_t c1) {
    const std::size_t cw = std::size_t(c1 - c0);
    std::vector<double> dconsts(5 * cw, 0.0);
    std::vector<T> consts(3 * cw);
    // Per channel k = ch - c0 of the range.
    double* invstd = dconsts.data();
    double* mean = invstd + cw;
    double* g = mean + cw;
    double* sum_dy = g + cw;
    double* sum_dy_xhat = sum_dy + cw;
    T* zm = consts.data();
    T* zs = zm + cw;
    T* zb = zs + cw;
    for (std::size_t k = 0; k < cw; ++k) {
      const index_t ch = c0 + index_t(k);
      invstd[k] = 1.0 / std::sqrt(double(running_var[ch]) + eps);
      mean[k] = double(running_mean[ch]);
      g[k] = gamma ? double(gamma[ch]) : 1.0;
      zm[k] = T(mean[k]), zs[k] = T(invstd[k] * g[k]), zb[k] = T(beta ? double(beta[ch]) : 0.0);
    }
    std::vector<T> rows_buf(std::is_same_v<X, T> && std::is_same_v<G, T> && std::is_same_v<D, T> ? 0 : 3 * cw);
    T* xb = rows_buf.data();
    T* gb = xb + cw;
    T* db = gb + cw;
    for (index_t r = 0; r < n * hw; ++r) {
      const index_t e = r * c + c0;
      const T* xr = detail::bn_row_as<T>(x + e, index_t(cw), xb);
      const T* gr = detail::bn_row_as<T>(dy + e, index_t(cw), gb);
      T* dr = dx ? detail::bn_row_target<T>(dx + e, db) : nullptr;
      for (std::size_t k = 0; k < cw; ++k) {
        double d;
        if constexpr (has_act) d = double(gr[k] * act.d(T((xr[k] - zm[k]) * zs[k] + zb[k])));
        else d = double(gr[k]);
        sum_dy[k] += d;
        sum_dy_xhat[k] += d * (double(xr[k]) - mean[k]) * invstd[k];
        if (dr) dr[k] = T(d * g[k] * invstd[k]);
      }
      if (dx) detail::bn_row_store(dx + e, db, index_t(cw));
    }
    for (std::size_t k = 0; k < cw; ++k) {
      if (dbeta) dbeta[c0 + index_t(k)] = T(sum_dy[k]);
      if (dgamma) dgamma[c0 + index_t(k)] = T(sum_dy_xhat[k]);
    }
  });
}

}  // namespace kiln::cpu
