// The convnet layers' device functors (kiln/nn/convnet_functors.hpp: what a CUDA executor runs for
// batch norm, pooling and the convolution's epilogue) run here on the CPU executor and are compared
// with the CPU loops of kiln/backend/cpu (themselves checked against fp64 references and PyTorch
// golden values), in both layouts: the device path's arithmetic is tested on every machine.
#include <kiln/backend/cpu/batchnorm2d.hpp>
#include <kiln/backend/cpu/executor.hpp>
#include <kiln/backend/cpu/batchnorm2d_nhwc.hpp>
#include <kiln/backend/cpu/pool2d.hpp>
#include <kiln/backend/cpu/pool2d_nhwc.hpp>
#include <kiln/core/row_parts.hpp>
#include <kiln/expr/functors.hpp>
#include <kiln/nn/convnet_functors.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

using namespace kiln;
using namespace kiln::nn::detail;

namespace {

std::vector<float> random_values(std::size_t n, unsigned seed, bool integers = false) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-2, 2);
  std::uniform_int_distribution<int> idist(0, 3);
  std::vector<float> v(n);
  for (float& e : v) e = integers ? float(idist(rng)) : dist(rng);
  return v;
}

void check_close(const std::vector<float>& got, const std::vector<float>& want, double tol, const std::string& what) {
  REQUIRE(got.size() == want.size());
  double scale = 0;
  for (float v : want) scale = std::max(scale, double(std::abs(v)));
  int bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(std::abs(double(got[i]) - double(want[i])) <= tol * (scale + 1)) && bad++ < 3)
      FAIL_CHECK(what, " element ", i, ": functor ", got[i], ", CPU loop ", want[i]);
  CHECK(bad == 0);
}

struct Dims {
  index_t n, c, h, w;
};

// A team of one thread: what a device block's team computes, in the element order of a serial loop.
struct SerialTeam {
  static int rank() { return 0; }
  static int size() { return 1; }
  template <class V>
  static V sum(V v) {
    return v;
  }
};

// What a device's for_each_row_in_parts computes (rowwise.cuh): each part of each row reduced on
// its own, then the row's partials combined in part order by f.finish.
template <class F>
void run_in_parts(const F& f, index_t rows, index_t len, RowParts parts) {
  std::vector<typename F::part_type> partial(static_cast<std::size_t>(parts.count));
  for (index_t r = 0; r < rows; ++r) {
    for (index_t p = 0; p < parts.count; ++p)
      partial[std::size_t(p)] = f.part(SerialTeam{}, r, parts.begin(p), parts.end(p, len));
    f.finish(r, partial.data(), parts.count);
  }
}

// ceil(len / count) elements per part, as RowParts::of makes them (a given count, for the tests).
RowParts parts_of(index_t count, index_t len) {
  const index_t chunk = (len + count - 1) / count;
  return {(len + chunk - 1) / chunk, chunk};
}

}  // namespace

TEST_CASE("batch-norm functors match the CPU loops: training and evaluation, with an activation, both layouts") {
  CpuExecutor exec(2);
  for (bool nhwc : {false, true})
    for (const Dims d : {Dims{3, 5, 4, 7}, Dims{2, 17, 3, 3}}) {
      INFO("nhwc ", nhwc, " n ", d.n, " c ", d.c, " h ", d.h, " w ", d.w);
      const index_t hw = d.h * d.w, m = d.n * hw, size = d.n * d.c * hw;
      const auto x = random_values(static_cast<std::size_t>(size), 1), dy = random_values(static_cast<std::size_t>(size), 2);
      auto gamma = random_values(static_cast<std::size_t>(d.c), 3), beta = random_values(static_cast<std::size_t>(d.c), 4);
      const ImageIndex ix{d.c, hw, nhwc};
      // The CPU loops.
      std::vector<float> rm(static_cast<std::size_t>(d.c), 0.5f), rv(static_cast<std::size_t>(d.c), 2.0f), y(static_cast<std::size_t>(size)),
          sm(static_cast<std::size_t>(d.c)), si(static_cast<std::size_t>(d.c)), dx(static_cast<std::size_t>(size)), dg(static_cast<std::size_t>(d.c)), db(static_cast<std::size_t>(d.c));
      auto rm2 = rm, rv2 = rv;
      if (nhwc) {
        cpu::batchnorm2d_nhwc_train_forward(d.n, d.c, hw, x.data(), gamma.data(), beta.data(), 1e-5, 0.1, rm.data(),
                                            rv.data(), y.data(), sm.data(), si.data(), 1, fn::Silu{});
        cpu::batchnorm2d_nhwc_backward(d.n, d.c, hw, x.data(), dy.data(), gamma.data(), sm.data(), si.data(), dx.data(),
                                       dg.data(), db.data(), 1, beta.data(), fn::Silu{});
      } else {
        cpu::batchnorm2d_train_forward(d.n, d.c, hw, x.data(), gamma.data(), beta.data(), 1e-5, 0.1, rm.data(),
                                       rv.data(), y.data(), sm.data(), si.data(), 1, fn::Silu{});
        cpu::batchnorm2d_backward(d.n, d.c, hw, x.data(), dy.data(), gamma.data(), sm.data(), si.data(), dx.data(),
                                  dg.data(), db.data(), 1, beta.data(), fn::Silu{});
      }
      // The functors.
      std::vector<float> mean(static_cast<std::size_t>(d.c)), invstd(static_cast<std::size_t>(d.c)), y2(static_cast<std::size_t>(size)),
          sums(static_cast<std::size_t>(2 * d.c)), dx2(static_cast<std::size_t>(size)), dg2(static_cast<std::size_t>(d.c)), db2(static_cast<std::size_t>(d.c));
      nn::detail::launch_lines<false>(exec, d.c, m,
                                      BnStatsRows<float>{x.data(), mean.data(), invstd.data(), rm2.data(), rv2.data(),
                                                         ix, m, 1e-5, 0.1},
                                      "bn_stats", 0);
      const BnApply<float, fn::Silu> apply{x.data(), y2.data(), gamma.data(), beta.data(), mean.data(), invstd.data(), ix};
      exec.for_each_element(1, size, apply, kind::norm, "bn_apply", 0);
      nn::detail::launch_lines<false>(exec, d.c, m,
                                      BnBackwardRows<float, fn::Silu>{apply, dy.data(), sums.data(), dg2.data(),
                                                                      db2.data(), false, false, m},
                                      "bn_backward_sums", 0);
      exec.for_each_element(1, size,
                            BnBackwardDx<float, fn::Silu>{apply, dy.data(), sums.data(), dx2.data(), m, true, false},
                            kind::norm, "bn_backward_dx", 0);
      check_close(mean, sm, 1e-6, "batch mean");
      check_close(invstd, si, 1e-6, "batch invstd");
      check_close(rm2, rm, 1e-6, "running mean");
      check_close(rv2, rv, 1e-6, "running var");
      check_close(y2, y, 2e-6, "forward");
      check_close(dg2, dg, 2e-5, "dgamma");
      check_close(db2, db, 2e-5, "dbeta");
      check_close(dx2, dx, 2e-5, "dx");
      // Evaluation: the running statistics, and dx = dz * gamma * invstd.
      std::vector<float> ye(static_cast<std::size_t>(size)), dxe(static_cast<std::size_t>(size)), ye2(static_cast<std::size_t>(size)), dxe2(static_cast<std::size_t>(size));
      if (nhwc) {
        cpu::batchnorm2d_nhwc_eval_forward(d.n, d.c, hw, x.data(), gamma.data(), beta.data(), 1e-5, rm.data(), rv.data(),
                                           ye.data(), 1, fn::Relu{});
        cpu::batchnorm2d_nhwc_eval_backward(d.n, d.c, hw, x.data(), dy.data(), gamma.data(), beta.data(), 1e-5,
                                            rm.data(), rv.data(), dxe.data(), static_cast<float*>(nullptr), static_cast<float*>(nullptr), 1, fn::Relu{});
      } else {
        cpu::batchnorm2d_eval_forward(d.n, d.c, hw, x.data(), gamma.data(), beta.data(), 1e-5, rm.data(), rv.data(),
                                      ye.data(), 1, fn::Relu{});
        cpu::batchnorm2d_eval_backward(d.n, d.c, hw, x.data(), dy.data(), gamma.data(), beta.data(), 1e-5, rm.data(),
                                       rv.data(), dxe.data(), static_cast<float*>(nullptr), static_cast<float*>(nullptr), 1, fn::Relu{});
      }
      exec.for_each_element(1, d.c, BnRunningStats<float>{rm.data(), rv.data(), mean.data(), invstd.data(), 1e-5},
                            kind::norm, "bn_running", 0);
      const BnApply<float, fn::Relu> eval{x.data(), ye2.data(), gamma.data(), beta.data(), mean.data(), invstd.data(), ix};
      exec.for_each_element(1, size, eval, kind::norm, "bn_eval", 0);
      exec.for_each_element(1, size, BnBackwardDx<float, fn::Relu>{eval, dy.data(), sums.data(), dxe2.data(), m, false, false},
                            kind::norm, "bn_eval_dx", 0);
      check_close(ye2, ye, 2e-6, "evaluation forward");
      check_close(dxe2, dxe, 2e-6, "evaluation dx");
    }
}

TEST_CASE("pooling functors match the CPU loops, argmax and ties included, both layouts") {
  CpuExecutor exec(2);
  struct P {
    index_t k, stride, pad;
  };
  for (bool nhwc : {false, true})
    for (const P p : {P{2, 2, 0}, P{3, 2, 1}, P{3, 1, 1}, P{2, 1, 0}})
      for (bool integers : {false, true}) {
        const Dims d{2, 3, 7, 6};
        const cpu::Pool2dShape s{.n = d.n, .c = d.c, .h = d.h, .w = d.w, .kh = p.k, .kw = p.k, .stride_h = p.stride,
                                 .stride_w = p.stride, .pad_h = p.pad, .pad_w = p.pad};
        INFO("nhwc ", nhwc, " kernel ", p.k, " stride ", p.stride, " pad ", p.pad, " integers ", integers);
        const PoolGeometry g{d.n, d.c, d.h, d.w, s.out_h(), s.out_w(), p.k, p.stride, p.pad, nhwc};
        const index_t in = d.n * d.c * d.h * d.w, out = d.n * d.c * s.out_h() * s.out_w();
        auto x = random_values(static_cast<std::size_t>(in), 5, integers);
        if (!integers) x[7] = NAN;
        const auto dy = random_values(static_cast<std::size_t>(out), 6);
        std::vector<float> y(static_cast<std::size_t>(out)), y2(static_cast<std::size_t>(out)), dx(static_cast<std::size_t>(in)), dx2(static_cast<std::size_t>(in));
        std::vector<std::int64_t> arg(static_cast<std::size_t>(out)), arg2(static_cast<std::size_t>(out));
        if (nhwc) {
          cpu::max_pool2d_nhwc_forward(s, x.data(), y.data(), arg.data());
          cpu::max_pool2d_nhwc_backward(s, dy.data(), arg.data(), dx.data());
        } else {
          cpu::max_pool2d_forward(s, x.data(), y.data(), arg.data());
          cpu::max_pool2d_backward(s, dy.data(), arg.data(), dx.data());
        }
        exec.for_each_element(1, out, MaxPoolForward<float>{x.data(), y2.data(), arg2.data(), g}, kind::other, "max", 0);
        exec.for_each_element(1, in, MaxPoolBackward<float>{x.data(), dy.data(), dx2.data(), g, false}, kind::other,
                              "max_backward", 0);
        CHECK(arg2 == arg);
        for (std::size_t i = 0; i < y.size(); ++i) CHECK((y2[i] == y[i] || (std::isnan(y2[i]) && std::isnan(y[i]))));
        check_close(dx2, dx, 1e-6, "max pool backward");
        for (bool include : {true, false}) {
          if (!integers) x[7] = 0.5f;
          if (nhwc) {
            cpu::avg_pool2d_nhwc_forward(s, x.data(), y.data(), include);
            cpu::avg_pool2d_nhwc_backward(s, dy.data(), dx.data(), include);
          } else {
            cpu::avg_pool2d_forward(s, x.data(), y.data(), include);
            cpu::avg_pool2d_backward(s, dy.data(), dx.data(), include);
          }
          exec.for_each_element(1, out, AvgPoolForward<float>{x.data(), y2.data(), g, include}, kind::other, "avg", 0);
          exec.for_each_element(1, in, AvgPoolBackward<float>{dy.data(), dx2.data(), g, include, false}, kind::other,
                                "avg_backward", 0);
          check_close(y2, y, 1e-6, "avg pool forward");
          check_close(dx2, dx, 1e-6, "avg pool backward");
        }
      }
}

TEST_CASE("global average pooling and the convolution epilogue functors, both layouts") {
  CpuExecutor exec(2);
  for (bool nhwc : {false, true}) {
    const Dims d{3, 4, 5, 6};
    const index_t plane = d.h * d.w, size = d.n * d.c * plane;
    const ImageIndex ix{d.c, plane, nhwc};
    const auto x = random_values(static_cast<std::size_t>(size), 9), g = random_values(static_cast<std::size_t>(d.n * d.c), 10);
    std::vector<float> y(static_cast<std::size_t>(d.n * d.c)), y2(y.size()), dx(static_cast<std::size_t>(size)), dx2(dx.size());
    if (nhwc) {
      cpu::global_avg_pool_nhwc_forward(d.n, d.c, d.h, d.w, x.data(), y.data());
      cpu::global_avg_pool_nhwc_backward(d.n, d.c, d.h, d.w, g.data(), dx.data());
    } else {
      cpu::global_avg_pool_forward(d.n, d.c, d.h, d.w, x.data(), y.data());
      cpu::global_avg_pool_backward(d.n, d.c, d.h, d.w, g.data(), dx.data());
    }
    nn::detail::launch_lines<false>(exec, d.n * d.c, plane, GlobalAvgRows<float>{x.data(), y2.data(), d.c, plane, nhwc},
                                    "global_avg", 0);
    exec.for_each_element(1, size, GlobalAvgBackward<float>{g.data(), dx2.data(), ix, false}, kind::other, "gap_bwd", 0);
    check_close(y2, y, 1e-6, "global average");
    check_close(dx2, dx, 1e-6, "global average backward");

    // Bias + ReLU in place, then its derivative and the bias gradient, against plain loops.
    const auto bias = random_values(static_cast<std::size_t>(d.c), 11);
    std::vector<float> z = x, keep(static_cast<std::size_t>(size)), dz(static_cast<std::size_t>(size)), db(static_cast<std::size_t>(d.c), 7.0f);
    exec.for_each_element(1, size, ConvBiasAct<float, fn::Relu>{z.data(), keep.data(), bias.data(), ix}, kind::other,
                          "bias_act", 0);
    exec.for_each_element(1, size, ConvDAct<float, fn::Relu>{x.data(), keep.data(), dz.data()}, kind::other, "dact", 0);
    nn::detail::launch_lines<false>(exec, d.c, d.n * plane, ConvBiasGradRows<float>{dz.data(), db.data(), ix, d.n * plane, true},
                                    "bias_grad", 0);
    std::vector<double> want_db(static_cast<std::size_t>(d.c), 7.0);
    for (index_t i = 0; i < size; ++i) {
      const index_t ch = nhwc ? i % d.c : (i / plane) % d.c;
      const float pre = x[std::size_t(i)] + bias[std::size_t(ch)];
      CHECK(keep[std::size_t(i)] == pre);
      CHECK(z[std::size_t(i)] == std::max(pre, 0.0f));
      CHECK(dz[std::size_t(i)] == (pre > 0 ? x[std::size_t(i)] : 0.0f));
      want_db[std::size_t(ch)] += double(dz[std::size_t(i)]);
    }
    for (index_t ch = 0; ch < d.c; ++ch) CHECK(db[std::size_t(ch)] == doctest::Approx(want_db[std::size_t(ch)]));
  }
}

TEST_CASE("ImageIndex: walk visits a team member's share of a channel as at() names it, channel() in 32 and 64 bits") {
  // The device teams' walk (no division per element) against at(k) for k = first, first + step, ...:
  // steps below, at and past a plane, shares that start mid-image, both layouts.
  for (bool nhwc : {false, true})
    for (index_t plane : {1, 7, 49, 256})
      for (index_t step : {1, 5, 49, 256, 300}) {
        const index_t c = 3, images = 4, m = images * plane;
        const ImageIndex ix{c, plane, nhwc};
        for (index_t ch = 0; ch < c; ++ch)
          for (index_t first = 0; first < std::min(step, m); first += std::max<index_t>(1, step / 3)) {
            std::vector<index_t> got, want;
            ix.walk(ch, m, first, step, [&](index_t i) { got.push_back(i); });
            for (index_t k = first; k < m; k += step) want.push_back(ix.at(ch, k));
            INFO((nhwc ? "nhwc" : "nchw") << " plane " << plane << " step " << step << " first " << first << " ch " << ch);
            CHECK(got == want);
          }
      }
  // channel(): the 32-bit form below 2^32, the 64-bit one past it, the same channel as the formula.
  for (bool nhwc : {false, true}) {
    const ImageIndex ix{96, 56 * 56, nhwc};
    for (index_t i : {index_t(0), index_t(12345), index_t(0xFFFFFFFF), index_t(0x100000000), index_t(0x1234567890)}) {
      const index_t want = nhwc ? i % 96 : (i / (56 * 56)) % 96;
      CHECK(ix.channel(i) == want);
    }
  }
}

TEST_CASE("RowParts: long channels split into parts of at least 4096 elements, enough of them for 1024 blocks") {
  // ResNet-50 at batch 32: layer1's 64 channels of 100,352 take 16 parts each; layer4's 1,568 one.
  CHECK(RowParts::of(64, 32 * 56 * 56).count == 16);
  CHECK(RowParts::of(64, 32 * 56 * 56).chunk == 6272);
  CHECK(RowParts::of(256, 32 * 56 * 56).count == 4);
  CHECK(RowParts::of(512, 32 * 7 * 7).count == 1);
  CHECK(RowParts::of(4, 8191).count == 1);
  CHECK(RowParts::of(4, 8192).count == 2);
  for (index_t rows : {1, 3, 64, 2048})
    for (index_t len : {0, 1, 4095, 4096, 10000, 100352, 1000003}) {
      const RowParts p = RowParts::of(rows, len);
      INFO("rows ", rows, " len ", len, ": ", p.count, " parts of ", p.chunk);
      CHECK(p.count >= 1);
      CHECK((p.count == 1 || p.chunk >= RowParts::min_part));
      CHECK((p.count == 1 || rows * (p.count - 1) < RowParts::target_blocks));
      // Consecutive, none empty, covering [0, len).
      CHECK(p.begin(0) == 0);
      CHECK(p.end(p.count - 1, len) == len);
      for (index_t k = 0; k + 1 < p.count; ++k) CHECK(p.end(k, len) == p.begin(k + 1));
      if (len > 0)
        for (index_t k = 0; k < p.count; ++k) CHECK(p.end(k, len) > p.begin(k));
    }
}

TEST_CASE("per-channel reductions in parts (a device's long channels) match the whole channel's, both layouts") {
  CpuExecutor exec(1);
  for (bool nhwc : {false, true})
    for (const Dims d : {Dims{6, 3, 5, 7}, Dims{32, 2, 56, 56}}) {
      const index_t hw = d.h * d.w, m = d.n * hw, size = d.n * d.c * hw;
      const ImageIndex ix{d.c, hw, nhwc};
      // Each image shifted by 3 x its index: the parts' means differ by many standard deviations,
      // so a merge that dropped the between-parts term (or weighted it wrongly) is far off.
      auto x = random_values(static_cast<std::size_t>(size), 21);
      const auto dy = random_values(static_cast<std::size_t>(size), 22), gamma = random_values(std::size_t(d.c), 23),
                 beta = random_values(std::size_t(d.c), 24);
      for (index_t i = 0; i < size; ++i) x[std::size_t(i)] += 3.0f * float(i / (d.c * hw));
      const auto c = std::size_t(d.c);
      for (const RowParts parts : {parts_of(1, m), parts_of(4, m), parts_of(7, m), RowParts::of(d.c, m)}) {
        INFO((nhwc ? "nhwc" : "nchw"), " c ", d.c, " m ", m, ": ", parts.count, " parts of ", parts.chunk);
        // Statistics (with the running statistics' update).
        std::vector<float> mean(c), invstd(c), rm(c, 0.5f), rv(c, 2.0f), mean2(c), invstd2(c), rm2 = rm, rv2 = rv;
        nn::detail::launch_lines<false>(
            exec, d.c, m, BnStatsRows<float>{x.data(), mean.data(), invstd.data(), rm.data(), rv.data(), ix, m, 1e-5, 0.1},
            "bn_stats", 0);
        run_in_parts(BnStatsRows<float>{x.data(), mean2.data(), invstd2.data(), rm2.data(), rv2.data(), ix, m, 1e-5, 0.1},
                     d.c, m, parts);
        // Backward sums and parameter gradients; the bias gradient.
        const BnApply<float, fn::Silu> apply{x.data(), nullptr, gamma.data(), beta.data(), mean.data(), invstd.data(), ix};
        std::vector<float> sums(2 * c), dg(c), db(c), sums2(2 * c), dg2(c), db2(c), cb(c, 1.0f), cb2(c, 1.0f);
        nn::detail::launch_lines<false>(
            exec, d.c, m, BnBackwardRows<float, fn::Silu>{apply, dy.data(), sums.data(), dg.data(), db.data(), false, false, m},
            "bn_sums", 0);
        run_in_parts(BnBackwardRows<float, fn::Silu>{apply, dy.data(), sums2.data(), dg2.data(), db2.data(), false, false, m},
                     d.c, m, parts);
        nn::detail::launch_lines<false>(exec, d.c, m, ConvBiasGradRows<float>{dy.data(), cb.data(), ix, m, true}, "bias_grad", 0);
        run_in_parts(ConvBiasGradRows<float>{dy.data(), cb2.data(), ix, m, true}, d.c, m, parts);
        if (parts.count == 1) {
          // One part is the whole channel in the serial loop's order: the same bits.
          CHECK(mean2 == mean);
          CHECK(invstd2 == invstd);
          CHECK(rv2 == rv);
          CHECK(sums2 == sums);
          CHECK(cb2 == cb);
        } else {
          check_close(mean2, mean, 1e-6, "mean");
          check_close(invstd2, invstd, 1e-6, "invstd");
          check_close(rm2, rm, 1e-6, "running mean");
          check_close(rv2, rv, 1e-6, "running var");
          check_close(sums2, sums, 1e-6, "backward sums");
          check_close(dg2, dg, 1e-6, "dgamma");
          check_close(db2, db, 1e-6, "dbeta");
          check_close(cb2, cb, 1e-6, "bias gradient");
        }
      }
    }
}
