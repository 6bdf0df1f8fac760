// kiln/backend/cpu/batchnorm2d.hpp — BatchNorm2d on the CPU, NCHW, float or double.
//
//   x, y, dy, dx [N, C, H, W] dense row-major; gamma, beta, running_*, save_* [C]; hw = H*W.
//   Statistics are per channel over the M = N*H*W values of that channel.
//
//   kiln::cpu::batchnorm2d_train_forward(n, c, hw, x, gamma, beta, 1e-5, 0.1,
//                                        run_mean, run_var, y, save_mean, save_invstd);
//   kiln::cpu::batchnorm2d_backward(n, c, hw, x, dy, gamma, save_mean, save_invstd,
//                                   dx, dgamma, dbeta);
//
// PyTorch semantics: training normalises with the biased batch variance,
//   invstd = 1 / sqrt(var_biased + eps),  y = (x - mean) * invstd * gamma + beta,
// and updates running_mean = (1 - momentum) * running_mean + momentum * mean,
//            running_var  = (1 - momentum) * running_var  + momentum * var_biased * M / (M - 1).
// Training needs M > 1 (PyTorch: "Expected more than 1 value per channel when training").
// Eval normalises with the running statistics instead.
//
// gamma == nullptr and beta == nullptr mean affine off (gamma 1, beta 0); running_mean and
// running_var may both be nullptr (track_running_stats off); save_mean / save_invstd may be
// nullptr when no backward follows. In backward, dgamma / dbeta may be nullptr.
// Sums accumulate in double for both types (two passes: mean, then centred squares).
// In-place use (y == x, dx == dy) is allowed: every element is read before it is written.
// Runs on the calling thread.
#pragma once

#include <algorithm>
#include <cmath>
#include <type_traits>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "kiln/config.hpp"
#include "kiln/core/error.hpp"

namespace kiln::cpu {

namespace detail {

template <class T>
inline constexpr bool batchnorm_type_ok = std::is_same_v<T, float> || std::is_same_v<T, double>;

inline void batchnorm2d_check_sizes(const char* fn, index_t n, index_t c, index_t hw) {
  KILN_CHECK(n > 0 && c > 0 && hw > 0, ShapeError, fn, ": sizes must be positive, got n=", n,
             " c=", c, " hw=", hw);
}

inline void batchnorm2d_check_eps(const char* fn, double eps) {
  KILN_CHECK(eps >= 0.0 && std::isfinite(eps), ValueError, fn,
             ": eps must be finite and >= 0, got eps=", eps);
}

// Mean and biased variance of channel ch: two passes (mean, then centred squares), each plane
// summed in T over lanes and the planes added in double (batchnorm2d_lane_sums).
template <class T>
void batchnorm2d_channel_stats(index_t n, index_t c, index_t hw, const T* x, index_t ch,
                               double& mean, double& var);

// y = act((x - mean) * scale + shift [+ r]) over channel ch, computed in T (mean, scale and
// shift rounded once; the normalised value rounded before r is added, as a separate add would);
// subtracting first keeps a constant channel at exactly shift, as PyTorch. r (nullable) is a
// residual of x's shape added before the activation.
template <class T, class Act>
void batchnorm2d_channel_affine(index_t n, index_t c, index_t hw, const T* x, index_t ch,
                                double mean, double scale, double shift, T* y, Act act,
                                const T* r = nullptr) {
  const T m = T(mean), a = T(scale), b = T(shift);
  for (index_t i = 0; i < n; ++i) {
    const index_t off = (i * c + ch) * hw;
    if (r) {
      for (index_t j = 0; j < hw; ++j) y[off + j] = act(T(T((x[off + j] - m) * a + b) + r[off + j]));
    } else {
      for (index_t j = 0; j < hw; ++j) y[off + j] = act(T((x[off + j] - m) * a + b));
    }
  }
}

// a += sum of u, b += sum of v over f(j, u, v) for j < len: 16 lanes in T, then the lanes in
// double — a plane's sums vectorise without -ffast-math, and the plane is short enough for T.
template <class T, class F>
void batchnorm2d_lane_sums(index_t len, double& a, double& b, const F& f) {
  constexpr index_t lanes = 16;
  T ua[lanes] = {}, va[lanes] = {};
  index_t j = 0;
  for (; j + lanes <= len; j += lanes)
    for (index_t l = 0; l < lanes; ++l) {
      T u, v;
      f(j + l, u, v);
      ua[l] += u;
      va[l] += v;
    }
  for (; j < len; ++j) {
    T u, v;
    f(j, u, v);
    a += double(u);
    b += double(v);
  }
  for (index_t l = 0; l < lanes; ++l) {
    a += double(ua[l]);
    b += double(va[l]);
  }
}

template <class T>
void batchnorm2d_channel_stats(index_t n, index_t c, index_t hw, const T* x, index_t ch,
                               double& mean, double& var) {
  double sum = 0.0, unused = 0.0;
  for (index_t i = 0; i < n; ++i) {
    const T* p = x + (i * c + ch) * hw;
    batchnorm2d_lane_sums<T>(hw, sum, unused, [&](index_t j, T& u, T& v) {
      u = p[j];
      v = T(0);
    });
  }
  const double m = double(n * hw);
  mean = sum / m;
  const T mu = T(mean);
  double sq = 0.0, shift = 0.0;
  for (index_t i = 0; i < n; ++i) {
    const T* p = x + (i * c + ch) * hw;
    batchnorm2d_lane_sums<T>(hw, sq, shift, [&](index_t j, T& u, T& v) {
      const T d = p[j] - mu;
      u = d * d;
      v = d;
    });
  }
  // mu is mean rounded to T: sum((x - mu)^2) / m - (sum(x - mu) / m)^2 corrects for it.
  const double dm = shift / m;
  var = std::max(0.0, sq / m - dm * dm);
}

// f(ch) for every channel, split across threads (channels are independent, so the result does
// not depend on the thread count).
template <class F>
void batchnorm2d_channels(index_t c, int threads, const F& f) {
#if defined(_OPENMP)
  if (threads > 1 && c > 1) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (index_t ch = 0; ch < c; ++ch) f(ch);
    return;
  }
#endif
  (void)threads;
  for (index_t ch = 0; ch < c; ++ch) f(ch);
}

}  // namespace detail

// No activation after the normalisation (an activation is a kiln::fn unary functor: a value
// and its derivative d() at the pre-activation, as kiln/nn/activation.hpp describes).
struct NoActivation {
  template <class V>
  V operator()(V v) const {
    return v;
  }
  template <class V>
  V d(V) const {
    return V(1);
  }
};

namespace detail {

}  // namespace detail

// Training-mode forward, y = act(normalised x [+ residual]); act defaults to none, residual
// (nullable, x's shape) is a skip connection's other branch, added before the activation. Throws ShapeError for
// non-positive sizes, ValueError when n * hw == 1, eps < 0, or momentum outside [0, 1].
template <class T, class Act = NoActivation>
void batchnorm2d_train_forward(index_t n, index_t c, index_t hw, const T* x, const T* gamma,
                               const T* beta, double eps, double momentum, T* running_mean,
                               T* running_var, T* y, T* save_mean, T* save_invstd,
                               int threads = 1, Act act = {}, const T* residual = nullptr,
                               T* save_scale = nullptr) {
  static_assert(detail::batchnorm_type_ok<T>,
                "kiln::cpu::batchnorm2d_train_forward: T must be float or double");
  constexpr const char* fn = "kiln::cpu::batchnorm2d_train_forward";
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
  detail::batchnorm2d_channels(c, threads, [&](index_t ch) {
    double mean = 0.0, var = 0.0;
    detail::batchnorm2d_channel_stats(n, c, hw, x, ch, mean, var);
    const double invstd = 1.0 / std::sqrt(var + eps);
    const double g = gamma ? double(gamma[ch]) : 1.0;
    const double b = beta ? double(beta[ch]) : 0.0;
    detail::batchnorm2d_channel_affine(n, c, hw, x, ch, mean, invstd * g, b, y, act, residual);
    if (running_mean) {
      running_mean[ch] = T((1.0 - momentum) * double(running_mean[ch]) + momentum * mean);
      running_var[ch] =
          T((1.0 - momentum) * double(running_var[ch]) + momentum * var * m / (m - 1.0));
    }
    if (save_mean) save_mean[ch] = T(mean);
    if (save_invstd) save_invstd[ch] = T(invstd);
    if (save_scale) save_scale[ch] = T(invstd * g);
  });
}

// Eval-mode forward: y = act((x - running_mean) / sqrt(running_var + eps) * gamma + beta
// [+ residual]).
template <class T, class Act = NoActivation>
void batchnorm2d_eval_forward(index_t n, index_t c, index_t hw, const T* x, const T* gamma,
                              const T* beta, double eps, const T* running_mean,
                              const T* running_var, T* y, int threads = 1, Act act = {},
                              const T* residual = nullptr, T* save_scale = nullptr) {
  static_assert(detail::batchnorm_type_ok<T>,
                "kiln::cpu::batchnorm2d_eval_forward: T must be float or double");
  constexpr const char* fn = "kiln::cpu::batchnorm2d_eval_forward";
  detail::batchnorm2d_check_sizes(fn, n, c, hw);
  detail::batchnorm2d_check_eps(fn, eps);
  KILN_CHECK(running_mean != nullptr && running_var != nullptr, ValueError, fn,
             ": eval mode needs running_mean and running_var");
  detail::batchnorm2d_channels(c, threads, [&](index_t ch) {
    const double invstd = 1.0 / std::sqrt(double(running_var[ch]) + eps);
    const double g = gamma ? double(gamma[ch]) : 1.0;
    const double b = beta ? double(beta[ch]) : 0.0;
    const double scale = invstd * g;
    detail::batchnorm2d_channel_affine(n, c, hw, x, ch, double(running_mean[ch]), scale, b, y,
                                       act, residual);
    if (save_scale) save_scale[ch] = T(scale);
  });
}

// y = act((x - mean) * scale + shift) with the constants a forward used, in T (save_mean or the
// running mean, save_scale, beta): the same elements, bit for bit, as the forward that wrote
// them without a residual — its output made again from its input (nn::BatchNorm2d's remade
// output, kiln/autograd/remake.hpp).
template <class T, class Act = NoActivation>
void batchnorm2d_apply(index_t n, index_t c, index_t hw, const T* x, const T* mean, const T* scale,
                       const T* shift, T* y, int threads = 1, Act act = {}) {
  static_assert(detail::batchnorm_type_ok<T>, "kiln::cpu::batchnorm2d_apply: T must be float or double");
  detail::batchnorm2d_check_sizes("kiln::cpu::batchnorm2d_apply", n, c, hw);
  detail::batchnorm2d_channels(c, threads, [&](index_t ch) {
    detail::batchnorm2d_channel_affine(n, c, hw, x, ch, double(mean[ch]), double(scale[ch]), double(shift[ch]), y,
                                       act);
  });
}

// Training-mode backward (the batch statistics depend on x). With xhat = (x - mean) * invstd
// and dz = dy * act'(z) at the pre-activation z = xhat * gamma + beta (dz = dy without act):
//   dbeta = sum(dz), dgamma = sum(dz * xhat),
//   dx = gamma * invstd / M * (M * dz - dbeta - xhat * dgamma).
// save_mean / save_invstd are the ones batchnorm2d_train_forward wrote; beta is read only with
// an activation (it recomputes z). dx is overwritten (or skipped when nullptr).
template <class T, class Act = NoActivation>
void batchnorm2d_backward(index_t n, index_t c, index_t hw, const T* x, const T* dy,
                          const T* gamma, const T* save_mean, const T* save_invstd, T* dx,
                          T* dgamma, T* dbeta, int threads = 1, const T* beta = nullptr,
                          Act act = {}) {
  static_assert(detail::batchnorm_type_ok<T>,
                "kiln::cpu::batchnorm2d_backward: T must be float or double");
  constexpr const char* fn = "kiln::cpu::batchnorm2d_backward";
  constexpr bool has_act = !std::is_same_v<Act, NoActivation>;
  detail::batchnorm2d_check_sizes(fn, n, c, hw);
  KILN_CHECK(save_mean != nullptr && save_invstd != nullptr, ValueError, fn,
             ": needs save_mean and save_invstd from batchnorm2d_train_forward");
  const double m = double(n * hw);
  detail::batchnorm2d_channels(c, threads, [&](index_t ch) {
    const double mean = double(save_mean[ch]), invstd = double(save_invstd[ch]);
    const double g = gamma ? double(gamma[ch]) : 1.0;
    const T zm = T(mean), zs = T(invstd * g), zb = T(beta ? double(beta[ch]) : 0.0);
    // dz at one element: dy, or dy * act'(z) with z recomputed as the forward did.
    auto dz = [&](index_t i) {
      if constexpr (has_act) return T(dy[i] * act.d(T((x[i] - zm) * zs + zb)));
      else return dy[i];
    };
    // sum(dz) and sum(dz * (x - mean)): per plane in T over lanes (vectorised), planes added in
    // double.
    double sum_dy = 0.0, sum_dy_xm = 0.0;
    for (index_t i = 0; i < n; ++i) {
      const index_t off = (i * c + ch) * hw;
      double a = 0.0, b = 0.0;
      detail::batchnorm2d_lane_sums<T>(hw, a, b, [&](index_t j, T& u, T& v) {
        u = dz(off + j);
        v = u * (x[off + j] - zm);
      });
      sum_dy += a;
      sum_dy_xm += b;
    }
    const double sum_dy_xhat = sum_dy_xm * invstd;
    if (dbeta) dbeta[ch] = T(sum_dy);
    if (dgamma) dgamma[ch] = T(sum_dy_xhat);
    if (!dx) return;
    // dx = k * (dz - mean_dy - (x - mean) * invstd * mean_dy_xhat), in T.
    const T k = T(g * invstd), mean_dy = T(sum_dy / m), slope = T(invstd * sum_dy_xhat / m);
    for (index_t i = 0; i < n; ++i) {
      const index_t off = (i * c + ch) * hw;
      for (index_t j = 0; j < hw; ++j) dx[off + j] = k * (dz(off + j) - mean_dy - (x[off + j] - zm) * slope);
    }
  });
}

// Eval-mode backward (the running statistics are constants): with
// invstd = 1 / sqrt(running_var + eps), xhat = (x - running_mean) * invstd and dz as above,
//   dx = dz * gamma * invstd, dgamma = sum(dz * xhat), dbeta = sum(dz).
// Any of dx, dgamma, dbeta may be nullptr; the others are overwritten.
template <class T, class Act = NoActivation>
void batchnorm2d_eval_backward(index_t n, index_t c, index_t hw, const T* x, const T* dy,
                               const T* gamma, const T* beta, double eps, const T* running_mean,
                               const T* running_var, T* dx, T* dgamma, T* dbeta,
                               int threads = 1, Act act = {}) {
  static_assert(detail::batchnorm_type_ok<T>,
                "kiln::cpu::batchnorm2d_eval_backward: T must be float or double");
  constexpr const char* fn = "kiln::cpu::batchnorm2d_eval_backward";
  constexpr bool has_act = !std::is_same_v<Act, NoActivation>;
  detail::batchnorm2d_check_sizes(fn, n, c, hw);
  detail::batchnorm2d_check_eps(fn, eps);
  KILN_CHECK(running_mean != nullptr && running_var != nullptr, ValueError, fn,
             ": eval mode needs running_mean and running_var");
  detail::batchnorm2d_channels(c, threads, [&](index_t ch) {
    const double invstd = 1.0 / std::sqrt(double(running_var[ch]) + eps);
    const double mean = double(running_mean[ch]);
    const double g = gamma ? double(gamma[ch]) : 1.0;
    const T zm = T(mean), zs = T(invstd * g), zb = T(beta ? double(beta[ch]) : 0.0);
    auto dz = [&](index_t i) {
      if constexpr (has_act) return double(dy[i] * act.d(T((x[i] - zm) * zs + zb)));
      else return double(dy[i]);
    };
    double sum_dy = 0.0, sum_dy_xhat = 0.0;
    for (index_t i = 0; i < n; ++i) {
      const index_t off = (i * c + ch) * hw;
      for (index_t j = 0; j < hw; ++j) {
        const double d = dz(off + j);
        sum_dy += d;
        sum_dy_xhat += d * (double(x[off + j]) - mean) * invstd;
        if (dx) dx[off + j] = T(d * g * invstd);
      }
    }
    if (dbeta) dbeta[ch] = T(sum_dy);
    if (dgamma) dgamma[ch] = T(sum_dy_xhat);
  });
}

}  // namespace kiln::cpu
