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
// double: last-bit differences), and do not depend on the thread count (blocks of channels are
// split across threads, each channel computed alone).
#pragma once

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kiln/backend/cpu/batchnorm2d.hpp"

namespace kiln::cpu {

namespace detail {

// Most channels per task: a row's block is one contiguous run for the vector adds.
inline constexpr index_t bn_nhwc_block = 32;

// f(c0, cb) for every block [c0, c0 + cb) of channels, split across threads. Each channel is
// computed alone, so the width changes no result: narrower blocks (down to 8) when there are
// threads to spare, so that 64 channels still keep 8 threads busy.
template <class F>
void batchnorm2d_nhwc_blocks(index_t c, int threads, const F& f) {
  index_t width = bn_nhwc_block;
  if (threads > 1) width = std::clamp<index_t>((c + 8 * threads - 1) / (8 * threads) * 8, 8, width);
  batchnorm2d_channels((c + width - 1) / width, threads, [&](index_t b) {
    const index_t c0 = b * width;
    f(c0, std::min(width, c - c0));
  });
}

// batchnorm2d_lane_sums for cb channels of one image at once: a[ch] += sum of u, b[ch] += sum
// of v over f(j, ch, u, v) for j < hw, in the same order per channel.
template <class T, class F>
void batchnorm2d_nhwc_lane_sums(index_t hw, index_t cb, double* a, double* b, const F& f) {
  constexpr index_t lanes = 16, bl = bn_nhwc_block;
  T ua[lanes * bl] = {}, va[lanes * bl] = {};
  index_t j = 0;
  for (; j + lanes <= hw; j += lanes)
    for (index_t l = 0; l < lanes; ++l)
      for (index_t ch = 0; ch < cb; ++ch) {
        T u, v;
        f(j + l, ch, u, v);
        ua[l * bl + ch] += u;
        va[l * bl + ch] += v;
      }
  for (; j < hw; ++j)
    for (index_t ch = 0; ch < cb; ++ch) {
      T u, v;
      f(j, ch, u, v);
      a[ch] += double(u);
      b[ch] += double(v);
    }
  for (index_t l = 0; l < lanes; ++l)
    for (index_t ch = 0; ch < cb; ++ch) {
      a[ch] += double(ua[l * bl + ch]);
      b[ch] += double(va[l * bl + ch]);
    }
}

// Mean and biased variance of channels [c0, c0 + cb): batchnorm2d_channel_stats per channel.
template <class T>
void batchnorm2d_nhwc_stats(index_t n, index_t c, index_t hw, const T* x, index_t c0, index_t cb,
                            double* mean, double* var) {
  constexpr index_t bl = bn_nhwc_block;
  double sum[bl] = {}, unused[bl] = {}, sq[bl] = {}, shift[bl] = {};
  for (index_t i = 0; i < n; ++i) {
    const T* p = x + i * hw * c + c0;
    batchnorm2d_nhwc_lane_sums<T>(hw, cb, sum, unused, [&](index_t j, index_t ch, T& u, T& v) {
      u = p[j * c + ch];
      v = T(0);
    });
  }
  const double m = double(n * hw);
  T mu[bl];
  for (index_t ch = 0; ch < cb; ++ch) mu[ch] = T(mean[ch] = sum[ch] / m);
  for (index_t i = 0; i < n; ++i) {
    const T* p = x + i * hw * c + c0;
    batchnorm2d_nhwc_lane_sums<T>(hw, cb, sq, shift, [&](index_t j, index_t ch, T& u, T& v) {
      const T d = p[j * c + ch] - mu[ch];
      u = d * d;
      v = d;
    });
  }
  // mu is mean rounded to T: sum((x - mu)^2) / m - (sum(x - mu) / m)^2 corrects for it.
  for (index_t ch = 0; ch < cb; ++ch) {
    const double dm = shift[ch] / m;
    var[ch] = std::max(0.0, sq[ch] / m - dm * dm);
  }
}

// y = act((x - mean) * scale + shift [+ res]) in T over channels [c0, c0 + cb), as
// batchnorm2d_channel_affine.
template <class T, class Act>
void batchnorm2d_nhwc_affine(index_t rows, index_t c, const T* x, index_t c0, index_t cb,
                             const double* mean, const double* scale, const double* shift, T* y,
                             Act act, const T* res = nullptr) {
  constexpr index_t bl = bn_nhwc_block;
  T m[bl], a[bl], b[bl];
  for (index_t ch = 0; ch < cb; ++ch)
    m[ch] = T(mean[ch]), a[ch] = T(scale[ch]), b[ch] = T(shift[ch]);
  for (index_t r = 0; r < rows; ++r) {
    const T* xr = x + r * c + c0;
    T* yr = y + r * c + c0;
    if (res) {
      const T* rr = res + r * c + c0;
      for (index_t ch = 0; ch < cb; ++ch) yr[ch] = act(T(T((xr[ch] - m[ch]) * a[ch] + b[ch]) + rr[ch]));
    } else {
      for (index_t ch = 0; ch < cb; ++ch) yr[ch] = act(T((xr[ch] - m[ch]) * a[ch] + b[ch]));
    }
  }
}

}  // namespace detail

// Training-mode forward, as batchnorm2d_train_forward.
template <class T, class Act = NoActivation>
void batchnorm2d_nhwc_train_forward(index_t n, index_t c, index_t hw, const T* x, const T* gamma,
                                    const T* beta, double eps, double momentum, T* running_mean,
                                    T* running_var, T* y, T* save_mean, T* save_invstd,
                                    int threads = 1, Act act = {}, const T* residual = nullptr) {
  static_assert(detail::batchnorm_type_ok<T>,
                "kiln::cpu::batchnorm2d_nhwc_train_forward: T must be float or double");
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
  detail::batchnorm2d_nhwc_blocks(c, threads, [&](index_t c0, index_t cb) {
    constexpr index_t bl = detail::bn_nhwc_block;
    double mean[bl], var[bl], invstd[bl], scale[bl], shift[bl];
    detail::batchnorm2d_nhwc_stats(n, c, hw, x, c0, cb, mean, var);
    for (index_t k = 0; k < cb; ++k) {
      const index_t ch = c0 + k;
      invstd[k] = 1.0 / std::sqrt(var[k] + eps);
      scale[k] = invstd[k] * (gamma ? double(gamma[ch]) : 1.0);
      shift[k] = beta ? double(beta[ch]) : 0.0;
      if (running_mean) {
        running_mean[ch] = T((1.0 - momentum) * double(running_mean[ch]) + momentum * mean[k]);
        running_var[ch] =
            T((1.0 - momentum) * double(running_var[ch]) + momentum * var[k] * m / (m - 1.0));
      }
      if (save_mean) save_mean[ch] = T(mean[k]);
      if (save_invstd) save_invstd[ch] = T(invstd[k]);
    }
    detail::batchnorm2d_nhwc_affine(n * hw, c, x, c0, cb, mean, scale, shift, y, act, residual);
  });
}

// Eval-mode forward, as batchnorm2d_eval_forward.
template <class T, class Act = NoActivation>
void batchnorm2d_nhwc_eval_forward(index_t n, index_t c, index_t hw, const T* x, const T* gamma,
                                   const T* beta, double eps, const T* running_mean,
                                   const T* running_var, T* y, int threads = 1, Act act = {},
                                   const T* residual = nullptr) {
  static_assert(detail::batchnorm_type_ok<T>,
                "kiln::cpu::batchnorm2d_nhwc_eval_forward: T must be float or double");
  constexpr const char* fn = "kiln::cpu::batchnorm2d_nhwc_eval_forward";
  detail::batchnorm2d_check_sizes(fn, n, c, hw);
  detail::batchnorm2d_check_eps(fn, eps);
  KILN_CHECK(running_mean != nullptr && running_var != nullptr, ValueError, fn,
             ": eval mode needs running_mean and running_var");
  detail::batchnorm2d_nhwc_blocks(c, threads, [&](index_t c0, index_t cb) {
    constexpr index_t bl = detail::bn_nhwc_block;
    double mean[bl], scale[bl], shift[bl];
    for (index_t k = 0; k < cb; ++k) {
      const index_t ch = c0 + k;
      mean[k] = double(running_mean[ch]);
      scale[k] = 1.0 / std::sqrt(double(running_var[ch]) + eps) * (gamma ? double(gamma[ch]) : 1.0);
      shift[k] = beta ? double(beta[ch]) : 0.0;
    }
    detail::batchnorm2d_nhwc_affine(n * hw, c, x, c0, cb, mean, scale, shift, y, act, residual);
  });
}

// Training-mode backward, as batchnorm2d_backward (beta is read only with an activation).
template <class T, class Act = NoActivation>
void batchnorm2d_nhwc_backward(index_t n, index_t c, index_t hw, const T* x, const T* dy,
                               const T* gamma, const T* save_mean, const T* save_invstd, T* dx,
                               T* dgamma, T* dbeta, int threads = 1, const T* beta = nullptr,
                               Act act = {}) {
  static_assert(detail::batchnorm_type_ok<T>,
                "kiln::cpu::batchnorm2d_nhwc_backward: T must be float or double");
  constexpr const char* fn = "kiln::cpu::batchnorm2d_nhwc_backward";
  constexpr bool has_act = !std::is_same_v<Act, NoActivation>;
  detail::batchnorm2d_check_sizes(fn, n, c, hw);
  KILN_CHECK(save_mean != nullptr && save_invstd != nullptr, ValueError, fn,
             ": needs save_mean and save_invstd from batchnorm2d_nhwc_train_forward");
  const double m = double(n * hw);
  detail::batchnorm2d_nhwc_blocks(c, threads, [&](index_t c0, index_t cb) {
    constexpr index_t bl = detail::bn_nhwc_block;
    T zm[bl], zs[bl], zb[bl];
    for (index_t k = 0; k < cb; ++k) {
      const index_t ch = c0 + k;
      const double g = gamma ? double(gamma[ch]) : 1.0;
      zm[k] = save_mean[ch];  // T(double(save_mean)) == save_mean
      zs[k] = T(double(save_invstd[ch]) * g);
      zb[k] = T(beta ? double(beta[ch]) : 0.0);
    }
    // dz at row r, channel k of the block: dy, or dy * act'(z) with z recomputed as the forward.
    auto dz = [&](index_t r, index_t k) {
      const index_t i = r * c + c0 + k;
      if constexpr (has_act) return T(dy[i] * act.d(T((x[i] - zm[k]) * zs[k] + zb[k])));
      else return dy[i];
    };
    double sum_dy[bl] = {}, sum_dy_xm[bl] = {};
    for (index_t i = 0; i < n; ++i) {
      double a[bl] = {}, b[bl] = {};  // per image, then added: batchnorm2d_backward's order
      detail::batchnorm2d_nhwc_lane_sums<T>(hw, cb, a, b, [&](index_t j, index_t k, T& u, T& v) {
        u = dz(i * hw + j, k);
        v = u * (x[(i * hw + j) * c + c0 + k] - zm[k]);
      });
      for (index_t k = 0; k < cb; ++k) sum_dy[k] += a[k], sum_dy_xm[k] += b[k];
    }
    T kk[bl], mean_dy[bl], slope[bl];
    for (index_t k = 0; k < cb; ++k) {
      const index_t ch = c0 + k;
      const double invstd = double(save_invstd[ch]), g = gamma ? double(gamma[ch]) : 1.0;
      const double sum_dy_xhat = sum_dy_xm[k] * invstd;
      if (dbeta) dbeta[ch] = T(sum_dy[k]);
      if (dgamma) dgamma[ch] = T(sum_dy_xhat);
      kk[k] = T(g * invstd), mean_dy[k] = T(sum_dy[k] / m), slope[k] = T(invstd * sum_dy_xhat / m);
    }
    if (!dx) return;
    for (index_t r = 0; r < n * hw; ++r)
      for (index_t k = 0; k < cb; ++k) {
        const index_t i = r * c + c0 + k;
        dx[i] = kk[k] * (dz(r, k) - mean_dy[k] - (x[i] - zm[k]) * slope[k]);
      }
  });
}

// Eval-mode backward, as batchnorm2d_eval_backward.
template <class T, class Act = NoActivation>
void batchnorm2d_nhwc_eval_backward(index_t n, index_t c, index_t hw, const T* x, const T* dy,
                                    const T* gamma, const T* beta, double eps,
                                    const T* running_mean, const T* running_var, T* dx, T* dgamma,
                                    T* dbeta, int threads = 1, Act act = {}) {
  static_assert(detail::batchnorm_type_ok<T>,
                "kiln::cpu::batchnorm2d_nhwc_eval_backward: T must be float or double");
  constexpr const char* fn = "kiln::cpu::batchnorm2d_nhwc_eval_backward";
  constexpr bool has_act = !std::is_same_v<Act, NoActivation>;
  detail::batchnorm2d_check_sizes(fn, n, c, hw);
  detail::batchnorm2d_check_eps(fn, eps);
  KILN_CHECK(running_mean != nullptr && running_var != nullptr, ValueError, fn,
             ": eval mode needs running_mean and running_var");
  detail::batchnorm2d_nhwc_blocks(c, threads, [&](index_t c0, index_t cb) {
    constexpr index_t bl = detail::bn_nhwc_block;
    double invstd[bl], mean[bl], g[bl], sum_dy[bl] = {}, sum_dy_xhat[bl] = {};
    T zm[bl], zs[bl], zb[bl];
    for (index_t k = 0; k < cb; ++k) {
      const index_t ch = c0 + k;
      invstd[k] = 1.0 / std::sqrt(double(running_var[ch]) + eps);
      mean[k] = double(running_mean[ch]);
      g[k] = gamma ? double(gamma[ch]) : 1.0;
      zm[k] = T(mean[k]), zs[k] = T(invstd[k] * g[k]), zb[k] = T(beta ? double(beta[ch]) : 0.0);
    }
    for (index_t r = 0; r < n * hw; ++r)
      for (index_t k = 0; k < cb; ++k) {
        const index_t i = r * c + c0 + k;
        double d;
        if constexpr (has_act) d = double(dy[i] * act.d(T((x[i] - zm[k]) * zs[k] + zb[k])));
        else d = double(dy[i]);
        sum_dy[k] += d;
        sum_dy_xhat[k] += d * (double(x[i]) - mean[k]) * invstd[k];
        if (dx) dx[i] = T(d * g[k] * invstd[k]);
      }
    for (index_t k = 0; k < cb; ++k) {
      if (dbeta) dbeta[c0 + k] = T(sum_dy[k]);
      if (dgamma) dgamma[c0 + k] = T(sum_dy_xhat[k]);
    }
  });
}

}  // namespace kiln::cpu
