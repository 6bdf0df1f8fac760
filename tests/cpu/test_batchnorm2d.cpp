// Tests for kiln::cpu::batchnorm2d_{train_forward,eval_forward,backward}: PyTorch golden values
// (tests/fixtures/golden_batchnorm.txt, float and double paths), finite differences of the
// backward in double, the eval formula, affine off (null gamma/beta), and the error cases.
#include <kiln/backend/cpu/batchnorm2d.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "fixture.hpp"

namespace {

using kiln::index_t;

const kiln_test::Fixture& golden_bn() {
  static const kiln_test::Fixture f =
      kiln_test::load_fixture(kiln_test::fixture_path("golden_batchnorm.txt"));
  return f;
}

template <class T>
std::vector<T> as(const std::vector<double>& v) {
  return std::vector<T>(v.begin(), v.end());
}

template <class T>
std::vector<T> random_vec(std::size_t size, std::mt19937_64& rng, double lo = -1.0,
                          double hi = 1.0) {
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<T> v(size);
  for (auto& e : v) e = T(dist(rng));
  return v;
}

// |got - want| <= atol + rtol * |want| elementwise.
template <class T>
void check_close(const std::vector<T>& got, const std::vector<double>& want, double rtol,
                 double atol, const char* what) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO(what, "[", i, "] got ", double(got[i]), " want ", want[i]);
    CHECK(std::abs(double(got[i]) - want[i]) <= atol + rtol * std::abs(want[i]));
  }
}

template <class T>
void golden_case(double rtol, double atol) {
  const auto& f = golden_bn();
  const auto& xb = f.at("bn.x");
  REQUIRE(xb.dims.size() == 4);
  const index_t n = xb.dims[0], c = xb.dims[1], hw = xb.dims[2] * xb.dims[3];
  const std::size_t uc = std::size_t(c);
  const auto x = as<T>(xb.values), dy = as<T>(f.at("bn.dy").values);
  const auto gamma = as<T>(f.at("bn.gamma").values), beta = as<T>(f.at("bn.beta").values);
  auto rm = as<T>(f.at("bn.running_mean0").values), rv = as<T>(f.at("bn.running_var0").values);
  std::vector<T> y(x.size()), sm(uc), si(uc);
  kiln::cpu::batchnorm2d_train_forward<T>(n, c, hw, x.data(), gamma.data(), beta.data(), 1e-5, 0.1,
                                          rm.data(), rv.data(), y.data(), sm.data(), si.data());
  check_close(y, f.at("bn.train.y").values, rtol, atol, "train.y");
  check_close(rm, f.at("bn.train.running_mean").values, rtol, atol, "running_mean");
  check_close(rv, f.at("bn.train.running_var").values, rtol, atol, "running_var");

  std::vector<T> ye(x.size());
  kiln::cpu::batchnorm2d_eval_forward<T>(n, c, hw, x.data(), gamma.data(), beta.data(), 1e-5,
                                         rm.data(), rv.data(), ye.data());
  check_close(ye, f.at("bn.eval.y").values, rtol, atol, "eval.y");

  std::vector<T> dx(x.size()), dg(uc), db(uc);
  kiln::cpu::batchnorm2d_backward<T>(n, c, hw, x.data(), dy.data(), gamma.data(), sm.data(),
                                     si.data(), dx.data(), dg.data(), db.data());
  check_close(dx, f.at("bn.dx").values, rtol, atol, "dx");
  check_close(dg, f.at("bn.dgamma").values, rtol, atol, "dgamma");
  check_close(db, f.at("bn.dbeta").values, rtol, atol, "dbeta");
}

// loss = sum(dy * y) of the training forward (running stats not tracked).
double bn_loss(index_t n, index_t c, index_t hw, const std::vector<double>& x,
               const std::vector<double>& g, const std::vector<double>& b,
               const std::vector<double>& dy) {
  std::vector<double> y(x.size());
  kiln::cpu::batchnorm2d_train_forward<double>(n, c, hw, x.data(), g.data(), b.data(), 1e-5, 0.1,
                                               nullptr, nullptr, y.data(), nullptr, nullptr);
  double s = 0.0;
  for (std::size_t i = 0; i < y.size(); ++i) s += y[i] * dy[i];
  return s;
}

}  // namespace

TEST_CASE("batchnorm2d matches PyTorch golden values (double)") { golden_case<double>(1e-12, 1e-12); }

TEST_CASE("batchnorm2d matches PyTorch golden values (float)") { golden_case<float>(2e-5, 2e-5); }

TEST_CASE("batchnorm2d backward matches finite differences (double)") {
  std::mt19937_64 rng(42);
  const index_t n = 2, c = 3, hw = 5;
  const std::size_t sz = std::size_t(n * c * hw);
  auto x = random_vec<double>(sz, rng, -2.0, 2.0), dy = random_vec<double>(sz, rng);
  auto g = random_vec<double>(std::size_t(c), rng, 0.5, 1.5), b = random_vec<double>(3, rng);
  std::vector<double> y(sz), sm(3), si(3), dx(sz), dg(3), db(3);
  kiln::cpu::batchnorm2d_train_forward<double>(n, c, hw, x.data(), g.data(), b.data(), 1e-5, 0.1,
                                               nullptr, nullptr, y.data(), sm.data(), si.data());
  kiln::cpu::batchnorm2d_backward<double>(n, c, hw, x.data(), dy.data(), g.data(), sm.data(),
                                          si.data(), dx.data(), dg.data(), db.data());
  const double h = 1e-6;
  auto fd = [&](std::vector<double>& v, std::size_t i) {
    const double keep = v[i];
    v[i] = keep + h;
    const double up = bn_loss(n, c, hw, x, g, b, dy);
    v[i] = keep - h;
    const double down = bn_loss(n, c, hw, x, g, b, dy);
    v[i] = keep;
    return (up - down) / (2 * h);
  };
  for (std::size_t i = 0; i < sz; ++i) {
    INFO("dx[", i, "]");
    CHECK(dx[i] == doctest::Approx(fd(x, i)).epsilon(1e-6));
  }
  for (std::size_t i = 0; i < 3; ++i) {
    INFO("channel ", i);
    CHECK(dg[i] == doctest::Approx(fd(g, i)).epsilon(1e-6));
    CHECK(db[i] == doctest::Approx(fd(b, i)).epsilon(1e-6));
  }
}

TEST_CASE("batchnorm2d eval forward follows the running-statistics formula") {
  std::mt19937_64 rng(7);
  const index_t n = 2, c = 4, hw = 6;
  const std::size_t sz = std::size_t(n * c * hw);
  const auto x = random_vec<double>(sz, rng, -3.0, 3.0);
  const auto g = random_vec<double>(4, rng), b = random_vec<double>(4, rng);
  const auto rm = random_vec<double>(4, rng), rv = random_vec<double>(4, rng, 0.1, 2.0);
  std::vector<double> y(sz), want(sz);
  const double eps = 1e-3;
  kiln::cpu::batchnorm2d_eval_forward<double>(n, c, hw, x.data(), g.data(), b.data(), eps,
                                              rm.data(), rv.data(), y.data());
  for (index_t i = 0; i < n; ++i)
    for (index_t ch = 0; ch < c; ++ch)
      for (index_t j = 0; j < hw; ++j) {
        const std::size_t k = std::size_t((i * c + ch) * hw + j);
        want[k] = (x[k] - rm[ch]) / std::sqrt(rv[ch] + eps) * g[ch] + b[ch];
      }
  check_close(y, want, 1e-14, 1e-14, "eval.y");
  // In place gives the same result.
  auto inplace = x;
  kiln::cpu::batchnorm2d_eval_forward<double>(n, c, hw, inplace.data(), g.data(), b.data(), eps,
                                              rm.data(), rv.data(), inplace.data());
  check_close(inplace, y, 0.0, 0.0, "eval.y in place");
}

TEST_CASE("batchnorm2d with gamma/beta null behaves as gamma=1, beta=0") {
  std::mt19937_64 rng(3);
  const index_t n = 3, c = 2, hw = 4;
  const std::size_t sz = std::size_t(n * c * hw);
  const auto x = random_vec<float>(sz, rng, -2.0, 2.0), dy = random_vec<float>(sz, rng);
  const std::vector<float> ones(2, 1.0f), zeros(2, 0.0f);
  std::vector<float> rm_a{0.1f, -0.2f}, rv_a{1.0f, 0.5f}, rm_b = rm_a, rv_b = rv_a;
  std::vector<float> ya(sz), yb(sz), sma(2), sia(2), smb(2), sib(2);
  kiln::cpu::batchnorm2d_train_forward<float>(n, c, hw, x.data(), nullptr, nullptr, 1e-5, 0.1,
                                              rm_a.data(), rv_a.data(), ya.data(), sma.data(),
                                              sia.data());
  kiln::cpu::batchnorm2d_train_forward<float>(n, c, hw, x.data(), ones.data(), zeros.data(), 1e-5,
                                              0.1, rm_b.data(), rv_b.data(), yb.data(), smb.data(),
                                              sib.data());
  CHECK(ya == yb);
  CHECK(rm_a == rm_b);
  CHECK(rv_a == rv_b);
  // Normalised output: per channel mean ~0 and biased variance ~1.
  for (index_t ch = 0; ch < c; ++ch) {
    double s = 0, s2 = 0;
    for (index_t i = 0; i < n; ++i)
      for (index_t j = 0; j < hw; ++j) {
        const double v = ya[std::size_t((i * c + ch) * hw + j)];
        s += v;
        s2 += v * v;
      }
    CHECK(s / double(n * hw) == doctest::Approx(0.0).epsilon(1e-5));
    CHECK(s2 / double(n * hw) == doctest::Approx(1.0).epsilon(1e-4));
  }
  std::vector<float> ea(sz), eb(sz);
  kiln::cpu::batchnorm2d_eval_forward<float>(n, c, hw, x.data(), nullptr, nullptr, 1e-5,
                                             rm_a.data(), rv_a.data(), ea.data());
  kiln::cpu::batchnorm2d_eval_forward<float>(n, c, hw, x.data(), ones.data(), zeros.data(), 1e-5,
                                             rm_a.data(), rv_a.data(), eb.data());
  CHECK(ea == eb);
  std::vector<float> dxa(sz), dxb(sz), dga(2), dba(2);
  kiln::cpu::batchnorm2d_backward<float>(n, c, hw, x.data(), dy.data(), nullptr, sma.data(),
                                         sia.data(), dxa.data(), nullptr, nullptr);
  kiln::cpu::batchnorm2d_backward<float>(n, c, hw, x.data(), dy.data(), ones.data(), sma.data(),
                                         sia.data(), dxb.data(), dga.data(), dba.data());
  CHECK(dxa == dxb);
}

TEST_CASE("batchnorm2d reports bad sizes and arguments") {
  std::vector<float> buf(64, 0.5f), ch(4, 1.0f);
  using kiln::cpu::batchnorm2d_backward;
  using kiln::cpu::batchnorm2d_eval_forward;
  using kiln::cpu::batchnorm2d_train_forward;
  float* p = buf.data();
  float* q = ch.data();
  auto train = [&](index_t n, index_t c, index_t hw, double eps = 1e-5, double mom = 0.1) {
    batchnorm2d_train_forward<float>(n, c, hw, p, q, q, eps, mom, q, q, p, q, q);
  };
  CHECK_THROWS_WITH_AS(train(0, 2, 4), doctest::Contains("n=0 c=2 hw=4"), kiln::ShapeError);
  CHECK_THROWS_WITH_AS(train(2, -1, 4), doctest::Contains("n=2 c=-1 hw=4"), kiln::ShapeError);
  CHECK_THROWS_WITH_AS(train(2, 2, 0), doctest::Contains("hw=0"), kiln::ShapeError);
  CHECK_THROWS_WITH_AS(train(1, 3, 1), doctest::Contains("more than 1 value per channel"),
                       kiln::ValueError);
  CHECK_THROWS_WITH_AS(train(1, 3, 1), doctest::Contains("n=1 c=3 hw=1"), kiln::ValueError);
  CHECK_NOTHROW(train(1, 3, 2));
  CHECK_NOTHROW(train(2, 3, 1));
  CHECK_THROWS_AS(train(2, 2, 4, -1e-5), kiln::ValueError);
  CHECK_THROWS_AS(train(2, 2, 4, 1e-5, 1.5), kiln::ValueError);
  CHECK_THROWS_AS(batchnorm2d_train_forward<float>(2, 2, 4, p, q, q, 1e-5, 0.1, q, nullptr, p, q, q),
                  kiln::ValueError);

  // Eval with a single value per channel is fine (PyTorch allows it too).
  CHECK_NOTHROW(batchnorm2d_eval_forward<float>(1, 3, 1, p, q, q, 1e-5, q, q, p));
  CHECK_THROWS_WITH_AS(batchnorm2d_eval_forward<float>(2, 0, 4, p, q, q, 1e-5, q, q, p),
                       doctest::Contains("c=0"), kiln::ShapeError);
  CHECK_THROWS_AS(batchnorm2d_eval_forward<float>(2, 2, 4, p, q, q, 1e-5, nullptr, q, p),
                  kiln::ValueError);

  CHECK_THROWS_WITH_AS(batchnorm2d_backward<float>(-1, 2, 4, p, p, q, q, q, p, q, q),
                       doctest::Contains("n=-1"), kiln::ShapeError);
  CHECK_THROWS_AS(batchnorm2d_backward<float>(2, 2, 4, p, p, q, nullptr, q, p, q, q),
                  kiln::ValueError);
}
