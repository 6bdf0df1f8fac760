// kiln/nn/convnet_functors.hpp — the convnet layers' work as executor functors: batch norm,
// pooling, the convolution's bias + activation epilogue and its bias gradient.
//
// The CPU runs the tuned loops of kiln/backend/cpu (conv2d, batchnorm2d, pool2d and their _nhwc
// twins); a device executor (CUDA) runs these functors — elementwise ones through
// for_each_element, per-channel reductions through launch_lines (a team of threads per channel,
// `row(team, r)`, or per part of a long channel, `part(team, r, begin, end)` and `finish`;
// nn/module.hpp, kiln/core/row_parts.hpp). They run on the CPU executor as well, which is how
// tests/cpu/test_convnet_functors.cpp checks them against the CPU loops on every machine.
//
// Layout: an element's channel is (i / plane) % c in NCHW and i % c in NHWC (plane = H*W);
// a channel's m-th element (m < N*H*W) sits at (m / plane * c + ch) * plane + m % plane in NCHW
// and at m * c + ch in NHWC. Statistics are summed in double, as the CPU loops do.
#pragma once

#include <cstdint>

#include "kiln/config.hpp"
#include "kiln/expr/math.hpp"
#include "kiln/nn/module.hpp"

namespace kiln::nn::detail {

struct ImageIndex {
  index_t c, plane;
  bool nhwc;
  // Element i's channel. In 32 bits where everything fits (every real image batch): a GPU has no
  // 64-bit divide, and the software one is several times the cost of the 32-bit one, per element
  // of every batch-norm pass. The same integer either way.
  KILN_HOST_DEVICE index_t channel(index_t i) const {
    if ((std::uint64_t(i) | std::uint64_t(plane) | std::uint64_t(c)) <= 0xFFFFFFFFu) {
      const std::uint32_t u = std::uint32_t(i), cu = std::uint32_t(c);
      return index_t(nhwc ? u % cu : u / std::uint32_t(plane) % cu);
    }
    return nhwc ? i % c : (i / plane) % c;
  }
  // Channel ch's m-th element.
  KILN_HOST_DEVICE index_t at(index_t ch, index_t m) const {
    return nhwc ? m * c + ch : (m / plane * c + ch) * plane + m % plane;
  }
  // f(at(ch, k)) for k = first, first + step, ... below m, in that order — a team member's share
  // of a channel — with no division per element: NCHW steps its (image, pixel) position by the
  // step's quotient and remainder, computed once. (Per element, at()'s 64-bit divide and modulo
  // were most of a device batch norm's statistics and backward sums.)
  template <class F>
  KILN_HOST_DEVICE void walk(index_t ch, index_t m, index_t first, index_t step, const F& f) const {
    if (nhwc) {
      for (index_t k = first; k < m; k += step) f(k * c + ch);
      return;
    }
    const index_t image = c * plane, dp = step % plane, dimg = step / plane * image;
    index_t p = first % plane, base = (first / plane * c + ch) * plane;
    for (index_t k = first; k < m; k += step) {
      f(base + p);
      p += dp;
      base += dimg;
      if (p >= plane) {
        p -= plane;
        base += image;
      }
    }
  }
};

// ---- batch norm ------------------------------------------------------------------------------

// Row ch: the batch mean and 1/sqrt(var + eps) of channel ch into mean[ch], invstd[ch], and the
// running statistics' update (PyTorch's, unbiased variance) when running_mean is set.
template <class T>
struct BnStatsRows {
  const T* x;
  T* mean;
  T* invstd;
  T* running_mean;
  T* running_var;
  ImageIndex ix;
  index_t m;  // N*H*W
  double eps, momentum;
  KILN_HOST_DEVICE void write(index_t ch, double mu, double var) const {
    mean[ch] = T(mu);
    invstd[ch] = T(1.0 / math::sqrt(var + eps));
    if (running_mean) {
      running_mean[ch] = T((1.0 - momentum) * double(running_mean[ch]) + momentum * mu);
      running_var[ch] = T((1.0 - momentum) * double(running_var[ch]) + momentum * var * double(m) / double(m - 1));
    }
  }
  KILN_HOST_DEVICE void operator()(index_t ch, index_t) const {
    double s = 0;
    for (index_t k = 0; k < m; ++k) s += double(x[ix.at(ch, k)]);
    const double mu = s / double(m);
    double q = 0;
    for (index_t k = 0; k < m; ++k) {
      const double d = double(x[ix.at(ch, k)]) - mu;
      q += d * d;
    }
    write(ch, mu, q / double(m));
  }
  // A part of a channel (kiln/core/row_parts.hpp): its count, its mean, and the sum of squared
  // deviations from that mean — two passes over the part, as the whole channel's are.
  struct Moments {
    double n, mean, m2;
  };
  using part_type = Moments;
  template <class Team>
  KILN_DEVICE Moments part(const Team& t, index_t ch, index_t begin, index_t end) const {
    double s = 0;
    ix.walk(ch, end, begin + t.rank(), t.size(), [&](index_t i) { s += double(x[i]); });
    const double n = double(end - begin), mu = t.sum(s) / n;
    double q = 0;
    ix.walk(ch, end, begin + t.rank(), t.size(), [&](index_t i) {
      const double d = double(x[i]) - mu;
      q += d * d;
    });
    return {n, mu, t.sum(q)};
  }
  // The parts merged in order by Chan, Golub and LeVeque's pairwise update (the mean moves by the
  // difference of the means, the squared deviations gain its square times n_a n_b / n): no
  // sum-of-squares cancellation, and one part gives exactly the two-pass mean and variance.
  KILN_HOST_DEVICE void finish(index_t ch, const Moments* parts, index_t count) const {
    Moments a = parts[0];
    for (index_t p = 1; p < count; ++p) {
      const Moments& b = parts[p];
      const double n = a.n + b.n, d = b.mean - a.mean;
      a.mean += d * (b.n / n);
      a.m2 += b.m2 + d * d * (a.n * b.n / n);
      a.n = n;
    }
    write(ch, a.mean, a.m2 / double(m));
  }
  template <class Team>
  KILN_DEVICE void row(const Team& t, index_t ch) const {
    const Moments p = part(t, ch, 0, m);
    if (t.rank() == 0) finish(ch, &p, 1);
  }
};

// Evaluation: mean[ch] = running_mean[ch], invstd[ch] = 1/sqrt(running_var[ch] + eps).
template <class T>
struct BnRunningStats {
  const T* running_mean;
  const T* running_var;
  T* mean;
  T* invstd;
  double eps;
  KILN_HOST_DEVICE void operator()(index_t, index_t ch) const {
    mean[ch] = running_mean[ch];
    invstd[ch] = T(1.0 / math::sqrt(double(running_var[ch]) + eps));
  }
};

// y = act((x - mean) * invstd * gamma + beta), gamma / beta null: 1 / 0.
template <class T, class Act>
struct BnApply {
  const T* x;
  T* y;
  const T* gamma;
  const T* beta;
  const T* mean;
  const T* invstd;
  ImageIndex ix;
  KILN_HOST_DEVICE T pre(index_t i, index_t ch) const {
    const T scale = invstd[ch] * (gamma ? gamma[ch] : T(1));
    return T((x[i] - mean[ch]) * scale + (beta ? beta[ch] : T(0)));
  }
  KILN_HOST_DEVICE void operator()(index_t, index_t i) const { y[i] = Act{}(pre(i, ix.channel(i))); }
};

// Row ch: sum(dz) and sum(dz * xhat) over channel ch into sums[ch], sums[c + ch], and the
// parameter gradients (either may be null; add: accumulate), dz = dy * act'(pre-activation).
template <class T, class Act>
struct BnBackwardRows {
  BnApply<T, Act> fwd;  // x, gamma, beta, mean, invstd and the layout (its y is unused)
  const T* dy;
  T* sums;
  T* dgamma;
  T* dbeta;
  bool add_gamma, add_beta;
  index_t m;
  KILN_HOST_DEVICE void terms(index_t ch, index_t i, double& a, double& b) const {  // element i of channel ch
    const double dz = double(dy[i]) * double(Act{}.d(fwd.pre(i, ch)));
    a += dz;
    b += dz * (double(fwd.x[i]) - double(fwd.mean[ch])) * double(fwd.invstd[ch]);
  }
  KILN_HOST_DEVICE void write(index_t ch, double a, double b) const {
    sums[ch] = T(a);
    sums[fwd.ix.c + ch] = T(b);
    if (dbeta) put_grad(dbeta[ch], T(a), add_beta);
    if (dgamma) put_grad(dgamma[ch], T(b), add_gamma);
  }
  KILN_HOST_DEVICE void operator()(index_t ch, index_t) const {
    double a = 0, b = 0;
    for (index_t k = 0; k < m; ++k) terms(ch, fwd.ix.at(ch, k), a, b);
    write(ch, a, b);
  }
  // A part of a channel (kiln/core/row_parts.hpp): its two sums; the parts add in order.
  struct Sums {
    double a, b;
  };
  using part_type = Sums;
  template <class Team>
  KILN_DEVICE Sums part(const Team& t, index_t ch, index_t begin, index_t end) const {
    double a = 0, b = 0;
    fwd.ix.walk(ch, end, begin + t.rank(), t.size(), [&](index_t i) { terms(ch, i, a, b); });
    a = t.sum(a);
    return {a, t.sum(b)};
  }
  KILN_HOST_DEVICE void finish(index_t ch, const Sums* parts, index_t count) const {
    double a = parts[0].a, b = parts[0].b;
    for (index_t p = 1; p < count; ++p) {
      a += parts[p].a;
      b += parts[p].b;
    }
    write(ch, a, b);
  }
  template <class Team>
  KILN_DEVICE void row(const Team& t, index_t ch) const {
    const Sums p = part(t, ch, 0, m);
    if (t.rank() == 0) finish(ch, &p, 1);
  }
};

// dx from the sums: training, k * (dz - mean(dz) - xhat * mean(dz * xhat)); evaluation (the
// statistics are constants), k * dz; k = gamma * invstd.
template <class T, class Act>
struct BnBackwardDx {
  BnApply<T, Act> fwd;
  const T* dy;
  const T* sums;
  T* dx;
  index_t m;
  bool train, add;
  KILN_HOST_DEVICE void operator()(index_t, index_t i) const {
    const index_t ch = fwd.ix.channel(i);
    const T dz = T(dy[i] * Act{}.d(fwd.pre(i, ch)));
    const T k = fwd.invstd[ch] * (fwd.gamma ? fwd.gamma[ch] : T(1));
    T v = k * dz;
    if (train) {
      const T xhat = (fwd.x[i] - fwd.mean[ch]) * fwd.invstd[ch];
      v = k * (dz - T(sums[ch] / T(m)) - xhat * T(sums[fwd.ix.c + ch] / T(m)));
    }
    put_grad(dx[i], v, add);
  }
};

// ---- pooling ---------------------------------------------------------------------------------

// The window geometry of a pooling layer over [N, C, H, W] (or NHWC), PyTorch's floor mode.
struct PoolGeometry {
  index_t n, c, h, w, oh, ow, k, stride, pad;
  bool nhwc;
  // Element (img, ch, y, x) of the input or (with oh, ow) the output.
  KILN_HOST_DEVICE index_t in_at(index_t img, index_t ch, index_t y, index_t x) const {
    return nhwc ? ((img * h + y) * w + x) * c + ch : ((img * c + ch) * h + y) * w + x;
  }
  KILN_HOST_DEVICE void out_coords(index_t o, index_t& img, index_t& ch, index_t& y, index_t& x) const {
    if (nhwc) {
      ch = o % c;
      x = (o / c) % ow;
      y = (o / (c * ow)) % oh;
      img = o / (c * ow * oh);
    } else {
      x = o % ow;
      y = (o / ow) % oh;
      ch = (o / (ow * oh)) % c;
      img = o / (ow * oh * c);
    }
  }
  KILN_HOST_DEVICE void in_coords(index_t i, index_t& img, index_t& ch, index_t& y, index_t& x) const {
    if (nhwc) {
      ch = i % c;
      x = (i / c) % w;
      y = (i / (c * w)) % h;
      img = i / (c * w * h);
    } else {
      x = i % w;
      y = (i / w) % h;
      ch = (i / (w * h)) % c;
      img = i / (w * h * c);
    }
  }
  KILN_HOST_DEVICE index_t out_at(index_t img, index_t ch, index_t y, index_t x) const {
    return nhwc ? ((img * oh + y) * ow + x) * c + ch : ((img * c + ch) * oh + y) * ow + x;
  }
  // The outputs whose windows hold input row (or column) v: [lo, hi].
  KILN_HOST_DEVICE void covering(index_t v, index_t out_n, index_t& lo, index_t& hi) const {
    const index_t a = v + pad - k + 1;  // o*stride >= a
    lo = a <= 0 ? 0 : (a + stride - 1) / stride;
    hi = (v + pad) / stride;
    if (hi > out_n - 1) hi = out_n - 1;
  }
};

// The maximum of output o's window and its place y*W + x in the image plane: the first maximum
// wins ties, the first NaN wins over everything (row-major window order, as the CPU loops).
template <class T>
KILN_HOST_DEVICE T window_max(const T* x, const PoolGeometry& g, index_t img, index_t ch, index_t oy, index_t ox,
                              index_t& at) {
  const index_t y0 = oy * g.stride - g.pad, x0 = ox * g.stride - g.pad;
  bool found = false;
  T best = T(0);
  at = 0;
  for (index_t yy = y0 < 0 ? 0 : y0; yy < y0 + g.k && yy < g.h; ++yy)
    for (index_t xx = x0 < 0 ? 0 : x0; xx < x0 + g.k && xx < g.w; ++xx) {
      const T v = x[g.in_at(img, ch, yy, xx)];
      if (!found || (v > best) || (v != v && best == best)) {
        best = v;
        at = yy * g.w + xx;
        found = true;
      }
    }
  return best;
}

// Output o: the maximum of its window, and its place when argmax is set.
template <class T>
struct MaxPoolForward {
  const T* x;
  T* y;
  std::int64_t* argmax;
  PoolGeometry g;
  KILN_HOST_DEVICE void operator()(index_t, index_t o) const {
    index_t img, ch, oy, ox, at;
    g.out_coords(o, img, ch, oy, ox);
    y[o] = window_max(x, g, img, ch, oy, ox, at);
    if (argmax) argmax[o] = at;
  }
};

// Input i: the sum of the gradients of the outputs whose maximum it is (a gather, no atomics; the
// maximum's place is recomputed from x, so nothing is stored between forward and backward).
template <class T>
struct MaxPoolBackward {
  const T* x;
  const T* dy;
  T* dx;
  PoolGeometry g;
  bool add;
  KILN_HOST_DEVICE void operator()(index_t, index_t i) const {
    index_t img, ch, iy, ix;
    g.in_coords(i, img, ch, iy, ix);
    index_t ylo, yhi, xlo, xhi;
    g.covering(iy, g.oh, ylo, yhi);
    g.covering(ix, g.ow, xlo, xhi);
    T s = T(0);
    const index_t me = iy * g.w + ix;
    for (index_t oy = ylo; oy <= yhi; ++oy)
      for (index_t ox = xlo; ox <= xhi; ++ox) {
        index_t at;
        window_max(x, g, img, ch, oy, ox, at);
        if (at == me) s += dy[g.out_at(img, ch, oy, ox)];
      }
    put_grad(dx[i], s, add);
  }
};

// Average pooling: the divisor of output (oy, ox) as PyTorch computes it.
KILN_HOST_DEVICE index_t avg_divisor(const PoolGeometry& g, index_t oy, index_t ox, bool count_include_pad) {
  const index_t y0 = oy * g.stride - g.pad, x0 = ox * g.stride - g.pad;
  const index_t y1 = y0 + g.k < g.h + g.pad ? y0 + g.k : g.h + g.pad;
  const index_t x1 = x0 + g.k < g.w + g.pad ? x0 + g.k : g.w + g.pad;
  if (count_include_pad) return (y1 - y0) * (x1 - x0);
  const index_t ry = (y1 < g.h ? y1 : g.h) - (y0 < 0 ? 0 : y0), rx = (x1 < g.w ? x1 : g.w) - (x0 < 0 ? 0 : x0);
  return ry * rx;
}

template <class T>
struct AvgPoolForward {
  const T* x;
  T* y;
  PoolGeometry g;
  bool count_include_pad;
  KILN_HOST_DEVICE void operator()(index_t, index_t o) const {
    index_t img, ch, oy, ox;
    g.out_coords(o, img, ch, oy, ox);
    const index_t y0 = oy * g.stride - g.pad, x0 = ox * g.stride - g.pad;
    T s = T(0);
    for (index_t yy = y0 < 0 ? 0 : y0; yy < y0 + g.k && yy < g.h; ++yy)
      for (index_t xx = x0 < 0 ? 0 : x0; xx < x0 + g.k && xx < g.w; ++xx) s += x[g.in_at(img, ch, yy, xx)];
    y[o] = s / T(avg_divisor(g, oy, ox, count_include_pad));
  }
};

template <class T>
struct AvgPoolBackward {
  const T* dy;
  T* dx;
  PoolGeometry g;
  bool count_include_pad, add;
  KILN_HOST_DEVICE void operator()(index_t, index_t i) const {
    index_t img, ch, iy, ix;
    g.in_coords(i, img, ch, iy, ix);
    index_t ylo, yhi, xlo, xhi;
    g.covering(iy, g.oh, ylo, yhi);
    g.covering(ix, g.ow, xlo, xhi);
    T s = T(0);
    for (index_t oy = ylo; oy <= yhi; ++oy)
      for (index_t ox = xlo; ox <= xhi; ++ox)
        s += dy[g.out_at(img, ch, oy, ox)] / T(avg_divisor(g, oy, ox, count_include_pad));
    put_grad(dx[i], s, add);
  }
};

// Row (img * c + ch): the mean of that plane into y[img * c + ch] ([N, C]).
template <class T>
struct GlobalAvgRows {
  const T* x;
  T* y;
  index_t c, plane;
  bool nhwc;
  KILN_HOST_DEVICE index_t at(index_t r, index_t k) const {
    return nhwc ? (r / c * plane + k) * c + r % c : r * plane + k;
  }
  KILN_HOST_DEVICE void operator()(index_t r, index_t) const {
    double s = 0;
    for (index_t k = 0; k < plane; ++k) s += double(x[at(r, k)]);
    y[r] = T(s / double(plane));
  }
  template <class Team>
  KILN_DEVICE void row(const Team& t, index_t r) const {
    double s = 0;
    for (index_t k = t.rank(); k < plane; k += t.size()) s += double(x[at(r, k)]);
    s = t.sum(s);
    if (t.rank() == 0) y[r] = T(s / double(plane));
  }
};

template <class T>
struct GlobalAvgBackward {
  const T* dy;
  T* dx;
  ImageIndex ix;
  bool add;
  KILN_HOST_DEVICE void operator()(index_t, index_t i) const {
    const index_t img = i / (ix.c * ix.plane);
    put_grad(dx[i], T(dy[img * ix.c + ix.channel(i)] / T(ix.plane)), add);
  }
};

// ---- convolution epilogue ----------------------------------------------------------------------

// y = act(y + bias[channel]) in place, keeping the pre-activation in keep when it is set.
template <class T, class Act>
struct ConvBiasAct {
  T* y;
  T* keep;
  const T* bias;
  ImageIndex ix;
  KILN_HOST_DEVICE void operator()(index_t, index_t i) const {
    const T v = T(y[i] + (bias ? bias[ix.channel(i)] : T(0)));
    if (keep) keep[i] = v;
    y[i] = Act{}(v);
  }
};

// dz = dy * act'(pre).
template <class T, class Act>
struct ConvDAct {
  const T* dy;
  const T* pre;
  T* dz;
  KILN_HOST_DEVICE void operator()(index_t, index_t i) const { dz[i] = T(dy[i] * Act{}.d(pre[i])); }
};

// Row ch: the bias gradient sum(dz) over channel ch.
template <class T>
struct ConvBiasGradRows {
  const T* dz;
  T* db;
  ImageIndex ix;
  index_t m;
  bool add;
  KILN_HOST_DEVICE void operator()(index_t ch, index_t) const {
    double s = 0;
    for (index_t k = 0; k < m; ++k) s += double(dz[ix.at(ch, k)]);
    put_grad(db[ch], T(s), add);
  }
  // A part of a channel (kiln/core/row_parts.hpp): its sum; the parts add in order.
  using part_type = double;
  template <class Team>
  KILN_DEVICE double part(const Team& t, index_t ch, index_t begin, index_t end) const {
    double s = 0;
    ix.walk(ch, end, begin + t.rank(), t.size(), [&](index_t i) { s += double(dz[i]); });
    return t.sum(s);
  }
  KILN_HOST_DEVICE void finish(index_t ch, const double* parts, index_t count) const {
    double s = parts[0];
    for (index_t p = 1; p < count; ++p) s += parts[p];
    put_grad(db[ch], T(s), add);
  }
  template <class Team>
  KILN_DEVICE void row(const Team& t, index_t ch) const {
    const double s = part(t, ch, 0, m);
    if (t.rank() == 0) finish(ch, &s, 1);
  }
};

}  // namespace kiln::nn::detail
