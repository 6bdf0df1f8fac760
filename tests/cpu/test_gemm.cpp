// Tests for kiln::cpu::gemm / gemm_own against a naive fp64 reference.
//
// Every case fills the padding of A and B (the gap between a row's end and ld) with NaN, and C's
// padding with a sentinel, so a kernel that reads or writes outside the matrices fails. With
// beta == 0, C starts as NaN: BLAS semantics say C is not read then.
#include <kiln/backend/cpu/gemm.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace {

using kiln::index_t;
using kiln::cpu::trans;

enum class impl { own, cblas };

const char* name(trans t) { return t == trans::yes ? "yes" : "no"; }
const char* name(impl i) { return i == impl::own ? "own" : "cblas"; }

template <class T>
double to_double(T x) {
  if constexpr (std::is_floating_point_v<T>) {
    return static_cast<double>(x);
  } else {
    return static_cast<double>(static_cast<float>(x));
  }
}

template <class T>
T from_double(double x) {
  if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>(x);
  } else {
    return T(static_cast<float>(x));
  }
}

struct gemm_case {
  trans ta = trans::no, tb = trans::no;
  index_t m = 0, n = 0, k = 0;
  double alpha = 1, beta = 0;
  index_t pad = 0;  // added to each leading dimension
  int threads = 1;
  std::uint64_t seed = 1;
};

std::string describe(const gemm_case& g, impl i, const char* type) {
  return kiln::detail::concat(type, " ", name(i), " ta=", name(g.ta), " tb=", name(g.tb),
                              " m=", g.m, " n=", g.n, " k=", g.k, " alpha=", g.alpha,
                              " beta=", g.beta, " pad=", g.pad, " threads=", g.threads,
                              " seed=", g.seed);
}

// Result of one case: the worst error relative to its bound (<= 1 passes) and whether C's
// padding survived.
template <class T>
struct run_result {
  double worst = 0;  // max over elements of |c - ref| / bound
  index_t worst_at = -1;
  bool padding_intact = true;
  std::vector<kiln::cpu::gemm_acc_t<T>> c;  // the computed C (with padding), for bitwise checks
};

template <class T>
run_result<T> run_case(const gemm_case& g, impl which) {
  using Acc = kiln::cpu::gemm_acc_t<T>;
  const bool at = g.ta == trans::yes, bt = g.tb == trans::yes;
  // Stored shapes (row-major): A is m x k or k x m, B is k x n or n x k.
  const index_t a_rows = at ? g.k : g.m, a_cols = at ? g.m : g.k;
  const index_t b_rows = bt ? g.n : g.k, b_cols = bt ? g.k : g.n;
  const index_t lda = a_cols + g.pad, ldb = b_cols + g.pad, ldc = g.n + g.pad;

  std::mt19937_64 rng(g.seed);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Acc sentinel = Acc(12345.5);

  auto fill = [&](index_t rows, index_t cols, index_t ld) {
    std::vector<T> v(static_cast<std::size_t>(rows * ld + 1), from_double<T>(nan));
    for (index_t i = 0; i < rows; ++i)
      for (index_t j = 0; j < cols; ++j) v[i * ld + j] = from_double<T>(dist(rng));
    return v;
  };
  const std::vector<T> a = fill(a_rows, a_cols, lda), b = fill(b_rows, b_cols, ldb);
  std::vector<Acc> c0(static_cast<std::size_t>(g.m * ldc + 1), sentinel);
  for (index_t i = 0; i < g.m; ++i)
    for (index_t j = 0; j < g.n; ++j) c0[i * ldc + j] = g.beta == 0 ? Acc(nan) : Acc(dist(rng));

  run_result<T> r;
  r.c = c0;
  const Acc alpha = static_cast<Acc>(g.alpha), beta = static_cast<Acc>(g.beta);
  if (which == impl::own) {
    kiln::cpu::gemm_own(g.ta, g.tb, g.m, g.n, g.k, alpha, a.data(), lda, b.data(), ldb, beta,
                        r.c.data(), ldc, g.threads);
  } else {
    kiln::cpu::set_gemm_backend(kiln::cpu::gemm_backend::cblas);
    kiln::cpu::gemm(g.ta, g.tb, g.m, g.n, g.k, alpha, a.data(), lda, b.data(), ldb, beta,
                    r.c.data(), ldc, g.threads);
  }

  const double eps = std::numeric_limits<Acc>::epsilon();
  for (index_t i = 0; i < g.m; ++i) {
    for (index_t j = 0; j < g.n; ++j) {
      double sum = 0, mag = 0;
      for (index_t p = 0; p < g.k; ++p) {
        const double x = to_double(at ? a[p * lda + i] : a[i * lda + p]);
        const double y = to_double(bt ? b[j * ldb + p] : b[p * ldb + j]);
        sum += x * y;
        mag += std::abs(x * y);
      }
      const double start = g.beta == 0 ? 0.0 : static_cast<double>(c0[i * ldc + j]);
      const double ref = static_cast<double>(alpha) * sum + static_cast<double>(beta) * start;
      // Rounding of a k-term sum plus the alpha/beta update: (k + 2) * 2 eps, i.e. (k + 2) * 2^-22
      // for float, times sum |a b| (and the C term). The floor covers exact zeros and, for bf16 on
      // vdpbf16ps, denormal inputs and partial sums flushed to zero (under 2^-126 per step).
      const double bound = 2.0 * static_cast<double>(g.k + 2) * eps *
                               (std::abs(g.alpha) * mag + std::abs(g.beta * start)) +
                           2.0 * static_cast<double>(g.k + 1) * (1.0 + std::abs(g.alpha)) *
                               std::numeric_limits<Acc>::min();
      const double got = static_cast<double>(r.c[i * ldc + j]);
      const double err = std::isfinite(got) ? std::abs(got - ref) / bound : INFINITY;
      if (!(err <= r.worst)) {
        r.worst = err;
        r.worst_at = i * ldc + j;
      }
    }
    for (index_t j = g.n; j < ldc; ++j) r.padding_intact &= r.c[i * ldc + j] == sentinel;
  }
  r.padding_intact &= r.c.back() == sentinel;
  return r;
}

template <class T>
void check_case(const gemm_case& g, impl which, const char* type) {
  const run_result<T> r = run_case<T>(g, which);
  INFO(describe(g, which, type));
  INFO("worst element (flat index in C) = ", r.worst_at);
  CHECK(r.worst <= 1.0);
  CHECK(r.padding_intact);
}

// Cycles alpha, beta and padding over the cases so that each combination meets many shapes.
gemm_case make_case(trans ta, trans tb, index_t m, index_t n, index_t k, std::uint64_t index) {
  static constexpr double alphas[] = {1.0, -0.5, 2.0};
  static constexpr double betas[] = {0.0, 1.0, -1.5, 0.0};
  gemm_case g;
  g.ta = ta;
  g.tb = tb;
  g.m = m;
  g.n = n;
  g.k = k;
  g.alpha = alphas[index % 3];
  g.beta = betas[(index / 3) % 4];
  g.pad = (index / 12) % 2 ? 3 : 0;
  g.seed = 0x6b696c6eULL * 1000003ULL + index;
  return g;
}

constexpr trans both[] = {trans::no, trans::yes};

template <class T>
void sweep(impl which, const char* type, const std::vector<index_t>& sizes) {
  std::uint64_t index = 0;
  for (trans ta : both)
    for (trans tb : both)
      for (index_t m : sizes)
        for (index_t n : sizes)
          for (index_t k : sizes) check_case<T>(make_case(ta, tb, m, n, k, index++), which, type);
}

const std::vector<index_t> all_sizes = {0, 1, 2, 3, 7, 17, 31, 64, 65, 129, 300};
const std::vector<index_t> few_sizes = {0, 1, 3, 7, 17, 65, 130};

}  // namespace

TEST_CASE("gemm_own float: every shape in {0..300}^3, all transposes, alpha/beta/ld variants") {
  sweep<float>(impl::own, "float", all_sizes);
}

TEST_CASE("gemm_own float: sizes around the register tiles (6 x 16 AVX2, 12 x 32 AVX-512)") {
  // One short of, exactly and one past a tile edge in m and n, both as C's rows and columns and,
  // through the narrow-C transposition, swapped; k = 1 runs the k loop once.
  const std::vector<index_t> mn = {5, 6, 11, 12, 13, 15, 16, 24, 31, 32, 33, 48};
  std::uint64_t index = 101;
  for (trans ta : both)
    for (trans tb : both)
      for (index_t m : mn)
        for (index_t n : mn)
          for (index_t k : {1, 12, 33})
            check_case<float>(make_case(ta, tb, m, n, k, index++), impl::own, "float");
}

TEST_CASE("gemm_own double") { sweep<double>(impl::own, "double", few_sizes); }

TEST_CASE("gemm_own f16 and bf16 inputs sum and write float") {
  static_assert(std::is_same_v<kiln::cpu::gemm_acc_t<kiln::f16>, float>);
  static_assert(std::is_same_v<kiln::cpu::gemm_acc_t<kiln::bf16>, float>);
  sweep<kiln::f16>(impl::own, "f16", few_sizes);
  sweep<kiln::bf16>(impl::own, "bf16", few_sizes);
}

namespace {

// Sets the bf16 path for its lifetime, restoring the previous one after.
class bf16_path_scope {
 public:
  explicit bf16_path_scope(kiln::cpu::gemm_bf16_path p)
      : before_(kiln::cpu::current_gemm_bf16_path()) {
    kiln::cpu::set_gemm_bf16_path(p);
  }
  ~bf16_path_scope() { kiln::cpu::set_gemm_bf16_path(before_); }
  bf16_path_scope(const bf16_path_scope&) = delete;
  bf16_path_scope& operator=(const bf16_path_scope&) = delete;

 private:
  kiln::cpu::gemm_bf16_path before_;
};

const char* path_name(kiln::cpu::gemm_bf16_path p) {
  return p == kiln::cpu::gemm_bf16_path::native ? "bf16 native"
         : p == kiln::cpu::gemm_bf16_path::amx  ? "bf16 amx"
                                                 : "bf16 emulate";
}

// Every m, n, k in `sizes` (1..70: single values, both sides of the 12 x 32 tile and of odd k),
// all transposes, alpha in {1, -0.5, 2}, beta in {0, 1, -1.5}, leading dimensions padded or not;
// then products past one cache block in every direction (odd k over two k blocks, m > mc, n > nc).
void bf16_sweep(kiln::cpu::gemm_bf16_path path) {
  const bf16_path_scope scope(path);
  const std::vector<index_t> sizes = {1, 2, 3, 5, 12, 13, 17, 31, 32, 33, 64, 70};
  std::uint64_t index = 0;
  for (trans ta : both)
    for (trans tb : both)
      for (index_t m : sizes)
        for (index_t n : sizes)
          for (index_t k : sizes)
            check_case<kiln::bf16>(make_case(ta, tb, m, n, k, index++), impl::own, path_name(path));
  const index_t shapes[][3] = {{3, 5000, 5}, {300, 40, 1001}, {250, 37, 513}, {1, 1, 1000}};
  for (trans ta : both)
    for (trans tb : both)
      for (const auto& s : shapes)
        check_case<kiln::bf16>(make_case(ta, tb, s[0], s[1], s[2], index++), impl::own,
                               path_name(path));
}

// Threads 1 and 2 give the same bits, and so does the whole team.
void bf16_threads(kiln::cpu::gemm_bf16_path path) {
  const bf16_path_scope scope(path);
  const index_t shapes[][3] = {
      {200, 150, 301}, {1000, 37, 70}, {5, 513, 1001}, {64, 256, 400}, {256, 400, 64}};
  std::uint64_t index = 11;
  for (const auto& s : shapes) {
    for (trans ta : both) {
      gemm_case g = make_case(ta, trans::no, s[0], s[1], s[2], index++);
      g.threads = 1;
      const run_result<kiln::bf16> one = run_case<kiln::bf16>(g, impl::own);
      g.threads = 2;
      const run_result<kiln::bf16> two = run_case<kiln::bf16>(g, impl::own);
      g.threads = 0;
      const run_result<kiln::bf16> all = run_case<kiln::bf16>(g, impl::own);
      INFO(describe(g, impl::own, path_name(path)));
      CHECK(one.worst <= 1.0);
      CHECK(two.worst <= 1.0);
      CHECK(std::memcmp(one.c.data(), two.c.data(), one.c.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(one.c.data(), all.c.data(), one.c.size() * sizeof(float)) == 0);
    }
  }
}

}  // namespace

TEST_CASE("gemm_own bf16 on vdpbf16ps: edge sizes, transposes, alpha/beta, padding, big blocks") {
  if (!kiln::cpu::gemm_have_bf16_native) {
    MESSAGE("skipped: no vdpbf16ps kernel in this build (the target lacks AVX512-BF16, or "
            "KILN_GEMM_BF16_EMULATE is defined); bf16 runs on the emulation, tested below");
    return;
  }
  bf16_sweep(kiln::cpu::gemm_bf16_path::native);
}

TEST_CASE("gemm_own bf16 on AMX tiles: edge sizes, transposes, alpha/beta, padding, big blocks") {
  if (!kiln::cpu::gemm_have_bf16_amx()) {
    MESSAGE("skipped: no AMX kernel here (the target lacks AMX-TILE / AMX-BF16, or Linux refused "
            "the tile state); bf16 runs on vdpbf16ps or the emulation, tested beside");
    return;
  }
  bf16_sweep(kiln::cpu::gemm_bf16_path::amx);
}

TEST_CASE("gemm_own bf16 on the exact emulation: the same sizes") {
  bf16_sweep(kiln::cpu::gemm_bf16_path::emulate);
}

TEST_CASE("gemm_own bf16: the thread count changes nothing, bit for bit, on both paths") {
  bf16_threads(kiln::cpu::gemm_bf16_path::emulate);
  if (!kiln::cpu::gemm_have_bf16_native) {
    MESSAGE("native half skipped: no vdpbf16ps kernel in this build");
    return;
  }
  bf16_threads(kiln::cpu::gemm_bf16_path::native);
  if (!kiln::cpu::gemm_have_bf16_amx()) {
    MESSAGE("amx part skipped: no AMX kernel here");
    return;
  }
  bf16_threads(kiln::cpu::gemm_bf16_path::amx);
}

TEST_CASE("gemm_bf16_path: native only where compiled in; native flushes denormals, emulate not") {
  using kiln::cpu::gemm_bf16_path;
  const auto before = kiln::cpu::current_gemm_bf16_path();
  CHECK(before == (kiln::cpu::gemm_have_bf16_amx()      ? gemm_bf16_path::amx
                   : kiln::cpu::gemm_have_bf16_native ? gemm_bf16_path::native
                                                      : gemm_bf16_path::emulate));
  // 2^-130 is a bf16 (and float) denormal: the emulation keeps it, vdpbf16ps reads it as zero.
  const kiln::bf16 a[2] = {kiln::bf16(0x1p-130f), kiln::bf16(0.0f)};
  const kiln::bf16 b[2] = {kiln::bf16(1.0f), kiln::bf16(1.0f)};
  float c = std::numeric_limits<float>::quiet_NaN();
  {
    const bf16_path_scope scope(gemm_bf16_path::emulate);
    kiln::cpu::gemm_own(trans::no, trans::no, 1, 1, 2, 1.0f, a, 2, b, 1, 0.0f, &c, 1);
    CHECK(c == 0x1p-130f);
  }
  if (!kiln::cpu::gemm_have_bf16_native) {
    CHECK_THROWS_AS(kiln::cpu::set_gemm_bf16_path(gemm_bf16_path::native), kiln::ValueError);
    MESSAGE("native half skipped: no vdpbf16ps kernel in this build");
  } else {
    const bf16_path_scope scope(gemm_bf16_path::native);
    CHECK(kiln::cpu::current_gemm_bf16_path() == gemm_bf16_path::native);
    kiln::cpu::gemm_own(trans::no, trans::no, 1, 1, 2, 1.0f, a, 2, b, 1, 0.0f, &c, 1);
    CHECK(c == 0.0f);
  }
  if (!kiln::cpu::gemm_have_bf16_amx()) {
    CHECK_THROWS_AS(kiln::cpu::set_gemm_bf16_path(gemm_bf16_path::amx), kiln::ValueError);
  } else {  // tdpbf16ps reads denormal inputs as zero too
    const bf16_path_scope scope(gemm_bf16_path::amx);
    c = std::numeric_limits<float>::quiet_NaN();
    kiln::cpu::gemm_own(trans::no, trans::no, 1, 1, 2, 1.0f, a, 2, b, 1, 0.0f, &c, 1);
    CHECK(c == 0.0f);
  }
  CHECK(kiln::cpu::current_gemm_bf16_path() == before);
}

TEST_CASE("gemm_rounded: bf16 C is gemm's float C rounded once, on every bf16 path") {
  using kiln::cpu::gemm_bf16_path;
  std::vector<gemm_bf16_path> paths{gemm_bf16_path::emulate};
  if (kiln::cpu::gemm_have_bf16_native) paths.push_back(gemm_bf16_path::native);
  if (kiln::cpu::gemm_have_bf16_amx()) paths.push_back(gemm_bf16_path::amx);
  const index_t shapes[][3] = {{1, 1, 1}, {31, 33, 17}, {64, 64, 64}, {70, 96, 576}, {300, 40, 1001}, {33, 70, 2500}};
  std::uint64_t seed = 3;
  for (gemm_bf16_path path : paths) {
    const bf16_path_scope scope(path);
    for (trans ta : both)
      for (trans tb : both)
        for (const auto& sh : shapes) {
          const index_t m = sh[0], n = sh[1], k = sh[2];
          INFO(path_name(path) << " m " << m << " n " << n << " k " << k << (ta == trans::yes ? " A^T" : "")
                               << (tb == trans::yes ? " B^T" : ""));
          std::mt19937_64 rng(seed++);
          std::uniform_real_distribution<float> dist(-1.f, 1.f);
          std::vector<kiln::bf16> a(std::size_t(m * k)), b(std::size_t(k * n));
          for (auto& v : a) v = kiln::bf16(dist(rng));
          for (auto& v : b) v = kiln::bf16(dist(rng));
          const index_t lda = ta == trans::yes ? m : k, ldb = tb == trans::yes ? k : n, ldc = n + 3;
          std::vector<float> want(std::size_t(m * n));
          kiln::cpu::gemm_own(ta, tb, m, n, k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, want.data(), n, 2);
          std::vector<kiln::bf16> got(std::size_t(m * ldc), kiln::bf16(7.0f));
          kiln::cpu::gemm_rounded(ta, tb, m, n, k, a.data(), lda, b.data(), ldb, got.data(), ldc, 2);
          index_t off = 0, exact = 0;
          for (index_t i = 0; i < m; ++i)
            for (index_t j = 0; j < n; ++j) {
              const float w = want[std::size_t(i * n + j)], g = float(got[std::size_t(i * ldc + j)]);
              exact += g == float(kiln::bf16(w)) ? 1 : 0;
              // k within one block: the same sum, rounded; past it, a sum in another order.
              off += std::abs(g - w) > std::abs(w) * 0x1p-7f + 1e-5f ? 1 : 0;
            }
          CHECK(off == 0);
          if (k <= 512) CHECK(exact == m * n);
          for (index_t i = 0; i < m; ++i)  // the padding between rows is not written
            for (index_t j = n; j < ldc; ++j) CHECK(float(got[std::size_t(i * ldc + j)]) == 7.0f);
        }
  }
}

TEST_CASE("gemm_rounded with a column bias and accumulate: the sum plus its column's bias (plus C), rounded once") {
  using kiln::cpu::gemm_bf16_path;
  std::vector<gemm_bf16_path> paths{gemm_bf16_path::emulate};
  if (kiln::cpu::gemm_have_bf16_native) paths.push_back(gemm_bf16_path::native);
  if (kiln::cpu::gemm_have_bf16_amx()) paths.push_back(gemm_bf16_path::amx);
  const index_t shapes[][3] = {{1, 1, 1}, {31, 33, 17}, {70, 96, 288}, {33, 70, 500}};
  std::uint64_t seed = 91;
  for (gemm_bf16_path path : paths) {
    const bf16_path_scope scope(path);
    for (const auto& sh : shapes) {
      const index_t m = sh[0], n = sh[1], k = sh[2];
      INFO(path_name(path) << " m " << m << " n " << n << " k " << k);
      std::mt19937_64 rng(seed++);
      std::uniform_real_distribution<float> dist(-1.f, 1.f);
      std::vector<kiln::bf16> a(std::size_t(m * k)), b(std::size_t(n * k));
      std::vector<float> bias(static_cast<std::size_t>(n));
      for (auto& v : a) v = kiln::bf16(dist(rng));
      for (auto& v : b) v = kiln::bf16(dist(rng));
      for (auto& v : bias) v = 4.0f * dist(rng);
      std::vector<float> want(std::size_t(m * n));
      kiln::cpu::gemm_own(trans::no, trans::yes, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, want.data(), n, 2);
      std::vector<kiln::bf16> got(std::size_t(m * n));
      kiln::cpu::gemm_rounded(trans::no, trans::yes, m, n, k, a.data(), k, b.data(), k, got.data(), n, 2, bias.data());
      index_t exact = 0;
      for (index_t i = 0; i < m; ++i)
        for (index_t j = 0; j < n; ++j) {
          const float w = want[std::size_t(i * n + j)] + bias[std::size_t(j)];
          exact += float(got[std::size_t(i * n + j)]) == float(kiln::bf16(w)) ? 1 : 0;
        }
      CHECK(exact == m * n);  // k within one block: the same float sum, the bias added, rounded
      // accumulate: C's old value added too, round(float(old) + (sum + bias)).
      std::vector<kiln::bf16> old(std::size_t(m * n)), acc(std::size_t(m * n));
      for (auto& v : old) v = kiln::bf16(8.0f * dist(rng));
      acc = old;
      kiln::cpu::gemm_rounded(trans::no, trans::yes, m, n, k, a.data(), k, b.data(), k, acc.data(), n, 2, bias.data(),
                              true);
      index_t exact_acc = 0;
      for (index_t i = 0; i < m * n; ++i) {
        const float w = float(old[std::size_t(i)]) + (want[std::size_t(i)] + bias[std::size_t(i % n)]);
        exact_acc += float(acc[std::size_t(i)]) == float(kiln::bf16(w)) ? 1 : 0;
      }
      CHECK(exact_acc == m * n);
    }
    // A sum plus its bias that is a denormal float (2^-120 - (2^-120 - 2^-130) = 2^-130) rounds
    // to the denormal bf16 2^-130, not to zero (AMX's fast conversion reads denormals as zero).
    const kiln::bf16 a(std::ldexp(1.0f, -60)), b(std::ldexp(1.0f, -60));
    const float bias = -(std::ldexp(1.0f, -120) - std::ldexp(1.0f, -130));
    kiln::bf16 c(1.0f);
    kiln::cpu::gemm_rounded(trans::no, trans::yes, 1, 1, 1, &a, 1, &b, 1, &c, 1, 1, &bias);
    INFO(path_name(path));
    CHECK(float(c) == std::ldexp(1.0f, -130));
  }
}

// op(A) given by rows (gemm_bf16_row_source): rows of a matrix in memory, copied where the GEMM
// asks — so the result must be gemm_rounded's on that matrix, bit for bit.
struct MatrixRows {
  const kiln::bf16* a;
  index_t lda;
  static void rows(const void* ctx, index_t r0, index_t count, index_t p0, index_t kc, kiln::bf16* dst, index_t ld) {
    const MatrixRows& m = *static_cast<const MatrixRows*>(ctx);
    for (index_t r = 0; r < count; ++r) std::copy_n(m.a + (r0 + r) * m.lda + p0, kc, dst + r * ld);
  }
};

TEST_CASE("gemm_rounded_with_a_source: on AMX gemm_rounded's bits from rows written in place; elsewhere declined") {
  using kiln::cpu::gemm_bf16_path;
  std::vector<gemm_bf16_path> paths{gemm_bf16_path::emulate};
  if (kiln::cpu::gemm_have_bf16_native) paths.push_back(gemm_bf16_path::native);
  if (kiln::cpu::gemm_have_bf16_amx()) paths.push_back(gemm_bf16_path::amx);
  // k a multiple of the tiles' 32 and not (zero tails), m past whole 32-row panels and blocks.
  const index_t shapes[][3] = {{1, 1, 1}, {31, 33, 27}, {70, 64, 288}, {300, 40, 1001}, {97, 130, 2304}};
  std::uint64_t seed = 57;
  for (gemm_bf16_path path : paths) {
    const bf16_path_scope scope(path);
    for (const auto& sh : shapes)
      for (int threads : {1, 2})
        for (int variant = 0; variant < 3; ++variant) {  // plain, bias, bias + accumulate
          const bool with_bias = variant > 0, accumulate = variant == 2;
          const index_t m = sh[0], n = sh[1], k = sh[2], lda = k + 5, ldc = n + 2;
          INFO(path_name(path) << " m " << m << " n " << n << " k " << k << " threads " << threads
                               << (with_bias ? " bias" : "") << (accumulate ? " accumulate" : ""));
          std::mt19937_64 rng(seed++);
          std::uniform_real_distribution<float> dist(-1.f, 1.f);
          std::vector<kiln::bf16> a(std::size_t(m * lda)), b(std::size_t(n * k));
          std::vector<float> bias(static_cast<std::size_t>(n));
          for (auto& v : a) v = kiln::bf16(dist(rng));
          for (auto& v : b) v = kiln::bf16(dist(rng));
          for (auto& v : bias) v = dist(rng);
          const float* bp = with_bias ? bias.data() : nullptr;
          std::vector<kiln::bf16> want(std::size_t(m * ldc), kiln::bf16(7.0f)), got = want;
          kiln::cpu::gemm_rounded(trans::no, trans::yes, m, n, k, a.data(), lda, b.data(), k, want.data(), ldc, threads,
                                  bp, accumulate);
          const MatrixRows rows{a.data(), lda};
          const bool ran = kiln::cpu::gemm_rounded_with_a_source<kiln::bf16>(
              m, n, k, {&MatrixRows::rows, &rows}, trans::yes, b.data(), k, got.data(), ldc, threads, bp, accumulate);
          CHECK(ran == (path == gemm_bf16_path::amx));
          if (!ran) {
            CHECK(std::all_of(got.begin(), got.end(), [](kiln::bf16 v) { return float(v) == 7.0f; }));
            continue;
          }
          index_t same = 0;
          for (std::size_t i = 0; i < got.size(); ++i) same += got[i].bits == want[i].bits ? 1 : 0;
          CHECK(same == index_t(got.size()));  // the padding between rows untouched too
        }
  }
}

TEST_CASE("gemm with f16 inputs runs on the own kernel whatever the backend") {
  const kiln::f16 a[2] = {kiln::f16(1.5f), kiln::f16(2.0f)};
  const kiln::f16 b[2] = {kiln::f16(4.0f), kiln::f16(-1.0f)};
  // Both backends in turn (CBLAS where the build has it: it has no f16 GEMM, so kiln's runs).
  std::vector<kiln::cpu::gemm_backend> backends{kiln::cpu::gemm_backend::own};
  if (kiln::cpu::gemm_have_cblas) backends.push_back(kiln::cpu::gemm_backend::cblas);
  const auto before = kiln::cpu::current_gemm_backend();
  for (auto backend : backends) {
    kiln::cpu::set_gemm_backend(backend);
    INFO("backend " << (backend == kiln::cpu::gemm_backend::own ? "own" : "cblas"));
    CHECK(kiln::cpu::current_gemm_backend() == backend);
    float c = std::numeric_limits<float>::quiet_NaN();
    kiln::cpu::gemm(trans::no, trans::no, 1, 1, 2, 1.0f, a, 2, b, 1, 0.0f, &c, 1);
    CHECK(c == 4.0f);
  }
  kiln::cpu::set_gemm_backend(before);
}

TEST_CASE("gemm_own: blocks larger than one cache block in every direction") {
  // m > mc, n > nc (4080), k > kc: every loop of the blocked nest runs more than once.
  const index_t shapes[][3] = {{3, 5000, 5}, {300, 40, 700}, {1000, 37, 70}, {1, 1, 1000}};
  std::uint64_t index = 7;
  for (trans ta : both)
    for (trans tb : both)
      for (const auto& s : shapes)
        check_case<float>(make_case(ta, tb, s[0], s[1], s[2], index++), impl::own, "float");
}

TEST_CASE("gemm_own: the thread count changes nothing, bit for bit") {
  const index_t shapes[][3] = {
      {300, 300, 300}, {1000, 37, 70}, {5, 513, 1000}, {64, 256, 400}, {256, 400, 64}};
  std::uint64_t index = 11;
  for (const auto& s : shapes) {
    gemm_case g = make_case(trans::yes, trans::no, s[0], s[1], s[2], index++);
    g.threads = 1;
    const run_result<float> one = run_case<float>(g, impl::own);
    g.threads = 2;
    const run_result<float> two = run_case<float>(g, impl::own);
    g.threads = 0;  // every thread the machine has
    const run_result<float> all = run_case<float>(g, impl::own);
    INFO(describe(g, impl::own, "float"));
    CHECK(one.worst <= 1.0);
    CHECK(two.worst <= 1.0);
    CHECK(all.worst <= 1.0);
    CHECK(std::memcmp(one.c.data(), two.c.data(), one.c.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(one.c.data(), all.c.data(), one.c.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("gemm_own float: A read in place (row stride not a multiple of 512) gives the packed path's bits") {
  // The AVX-512 kernel reads whole 12-row tiles (the AVX2 kernel 6-row tiles) of an A whose rows
  // hold k contiguously where they lie, and packs them when the rows are a multiple of 2 KiB apart
  // (L1 sets): the same values at
  // lda 512 (packed) and lda k + 3 (in place) must give the same C, bit for bit, at 1 and 2 threads.
  const index_t shapes[][3] = {{37, 70, 300}, {300, 64, 64}, {250, 256, 257}, {13, 33, 512}};
  std::uint64_t seed = 41;
  for (const auto& sh : shapes)
    for (int threads : {1, 2}) {
      const index_t m = sh[0], n = sh[1], k = sh[2];
      INFO("m " << m << " n " << n << " k " << k << " threads " << threads);
      std::mt19937_64 rng(seed++);
      std::uniform_real_distribution<float> dist(-1.f, 1.f);
      const index_t packed_ld = 512 * ((k + 511) / 512), direct_ld = k + 3;
      std::vector<float> a_packed(std::size_t(m * packed_ld)), a_direct(std::size_t(m * direct_ld));
      std::vector<float> b(std::size_t(k * n));
      for (index_t i = 0; i < m; ++i)
        for (index_t p = 0; p < k; ++p) {
          const float v = dist(rng);
          a_packed[std::size_t(i * packed_ld + p)] = v;
          a_direct[std::size_t(i * direct_ld + p)] = v;
        }
      for (auto& v : b) v = dist(rng);
      std::vector<float> c1(std::size_t(m * n)), c2(std::size_t(m * n));
      kiln::cpu::gemm_own(trans::no, trans::no, m, n, k, 1.0f, a_packed.data(), packed_ld, b.data(), n, 0.0f,
                          c1.data(), n, threads);
      kiln::cpu::gemm_own(trans::no, trans::no, m, n, k, 1.0f, a_direct.data(), direct_ld, b.data(), n, 0.0f,
                          c2.data(), n, threads);
      CHECK(std::memcmp(c1.data(), c2.data(), c1.size() * sizeof(float)) == 0);
    }
}

TEST_CASE("gemm_own: alpha == 0 and k == 0 read neither A nor B") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> a(6, nan), b(6, nan), c = {1, 2, 3, 4};
  kiln::cpu::gemm_own(trans::no, trans::no, 2, 2, 3, 0.0f, a.data(), 3, b.data(), 2, 2.0f, c.data(),
                      2);
  CHECK(c == std::vector<float>{2, 4, 6, 8});
  kiln::cpu::gemm_own(trans::no, trans::no, 2, 2, 3, 0.0f, a.data(), 3, b.data(), 2, 0.0f, c.data(),
                      2);
  CHECK(c == std::vector<float>{0, 0, 0, 0});
  c = {nan, nan, nan, nan};
  kiln::cpu::gemm_own<float>(trans::no, trans::no, 2, 2, 0, 1.0f, nullptr, 0, nullptr, 2, 0.0f,
                             c.data(), 2);
  CHECK(c == std::vector<float>{0, 0, 0, 0});
}

#if defined(KILN_HAVE_CBLAS)
TEST_CASE("gemm through CBLAS matches the reference") {
  const auto before = kiln::cpu::current_gemm_backend();
  sweep<float>(impl::cblas, "float", few_sizes);
  sweep<double>(impl::cblas, "double", few_sizes);
  kiln::cpu::set_gemm_backend(before);
}

TEST_CASE("gemm_backend can be switched between own and cblas") {
  // The default (kiln's own kernel) is what gemm() starts with; other suites in this
  // binary may have switched it since, so only the round trip is checked here.
  CHECK(kiln::cpu::gemm_have_cblas);
  const auto before = kiln::cpu::current_gemm_backend();
  kiln::cpu::set_gemm_backend(kiln::cpu::gemm_backend::own);
  CHECK(kiln::cpu::current_gemm_backend() == kiln::cpu::gemm_backend::own);
  kiln::cpu::set_gemm_backend(kiln::cpu::gemm_backend::cblas);
  CHECK(kiln::cpu::current_gemm_backend() == kiln::cpu::gemm_backend::cblas);
  kiln::cpu::set_gemm_backend(before);
}
#else
TEST_CASE("gemm_backend is own without a CBLAS, and cblas is refused") {
  CHECK_FALSE(kiln::cpu::gemm_have_cblas);
  CHECK(kiln::cpu::current_gemm_backend() == kiln::cpu::gemm_backend::own);
  CHECK_THROWS_AS(kiln::cpu::set_gemm_backend(kiln::cpu::gemm_backend::cblas), kiln::ValueError);
}
#endif

TEST_CASE("gemm: bad arguments throw with the values in the message") {
  using doctest::Contains;
  std::vector<float> a(64), b(64), c(64);
  auto call = [&](trans ta, trans tb, index_t m, index_t n, index_t k, index_t lda, index_t ldb,
                  index_t ldc, int threads = 1) {
    kiln::cpu::gemm_own(ta, tb, m, n, k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, c.data(), ldc,
                        threads);
  };
  CHECK_THROWS_WITH_AS(call(trans::no, trans::no, -1, 2, 2, 2, 2, 2), Contains("m = -1"),
                       kiln::ShapeError);
  CHECK_THROWS_WITH_AS(call(trans::no, trans::no, 2, 2, -3, 2, 2, 2), Contains("k = -3"),
                       kiln::ShapeError);
  // A is m x k = 2 x 5 untransposed, k x m = 5 x 2 transposed.
  CHECK_THROWS_WITH_AS(call(trans::no, trans::no, 2, 3, 5, 4, 3, 3), Contains("lda = 4"),
                       kiln::ShapeError);
  CHECK_THROWS_WITH_AS(call(trans::no, trans::no, 2, 3, 5, 4, 3, 3), Contains("lda must be >= 5"),
                       kiln::ShapeError);
  CHECK_THROWS_WITH_AS(call(trans::yes, trans::no, 2, 3, 5, 1, 3, 3), Contains("lda must be >= 2"),
                       kiln::ShapeError);
  CHECK_NOTHROW(call(trans::yes, trans::no, 2, 3, 5, 2, 3, 3));
  // B is k x n = 5 x 3 untransposed, n x k = 3 x 5 transposed.
  CHECK_THROWS_WITH_AS(call(trans::no, trans::no, 2, 3, 5, 5, 2, 3), Contains("ldb must be >= 3"),
                       kiln::ShapeError);
  CHECK_THROWS_WITH_AS(call(trans::no, trans::yes, 2, 3, 5, 5, 3, 3), Contains("ldb = 3"),
                       kiln::ShapeError);
  CHECK_NOTHROW(call(trans::no, trans::yes, 2, 3, 5, 5, 5, 3));
  CHECK_THROWS_WITH_AS(call(trans::no, trans::no, 2, 3, 5, 5, 3, 2), Contains("ldc = 2"),
                       kiln::ShapeError);
  CHECK_THROWS_WITH_AS(call(trans::no, trans::no, 2, 3, 5, 5, 3, 3, -1), Contains("threads = -1"),
                       kiln::ValueError);
  CHECK_THROWS_AS(kiln::cpu::gemm<float>(trans::no, trans::no, 2, 2, 2, 1.0f, nullptr, 2, b.data(),
                                         2, 0.0f, c.data(), 2),
                  kiln::ValueError);
  // The dispatching entry checks the same way whichever backend is chosen.
  CHECK_THROWS_WITH_AS(kiln::cpu::gemm(trans::no, trans::no, 2, 3, 5, 1.0f, a.data(), 4, b.data(),
                                       3, 0.0f, c.data(), 3),
                       Contains("kiln::cpu::gemm: lda = 4"), kiln::ShapeError);
}
