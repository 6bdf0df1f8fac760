// kiln::matmul (ops/matmul.hpp), the expression, against a naive fp64 product computed here from
// the operands' elements: plain, transposed and strided views (the stride and transpose detection
// that picks GEMM's layout and leading dimensions), operands that are expressions (computed into
// scratch first), a matmul inside a larger expression, on both CPU GEMM backends' entry (kiln's
// kernel through the executor), and its four error paths.
//
// Tolerance: every product sums k terms of magnitude <= 1 in float; 4 k ulp-of-1 bounds the
// rounding of any summation order, so a wrong element (a transposed operand read straight, a
// leading dimension off by one) fails by orders of magnitude.
#include <kiln.hpp>
#include <kiln/core/random.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

using namespace kiln;

namespace {

using Mat = Tensor<float, host, dyn, dyn>;

Mat random_matrix(index_t rows, index_t cols, std::uint64_t seed) {
  Mat t(rows, cols);
  Generator g(seed);
  for (index_t i = 0; i < t.size(); ++i) t.data()[i] = g.uniform(-1.f, 1.f);
  return t;
}

// out(i, j) = sum_k a(i, k) b(k, j) in double, through the views' own element access (strides).
template <class A, class B>
std::vector<double> reference(const A& a, const B& b) {
  const index_t m = a.dim(0), k = a.dim(1), n = b.dim(1);
  REQUIRE(b.dim(0) == k);
  std::vector<double> out(std::size_t(m * n), 0.0);
  for (index_t i = 0; i < m; ++i)
    for (index_t j = 0; j < n; ++j) {
      double s = 0;
      for (index_t p = 0; p < k; ++p) s += double(a(i, p)) * double(b(p, j));
      out[std::size_t(i * n + j)] = s;
    }
  return out;
}

void check_product(const Mat& got, const std::vector<double>& want, index_t k) {
  REQUIRE(std::size_t(got.size()) == want.size());
  const double bound = 4.0 * double(std::max<index_t>(k, 1)) * std::numeric_limits<float>::epsilon();
  double worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::abs(double(got.data()[i]) - want[i]));
  CHECK_MESSAGE(worst <= bound, "largest difference ", worst, " above ", bound);
}

}  // namespace

TEST_CASE("matmul against an fp64 reference: every transpose, sizes across the kernel's tile edges") {
  CpuExecutor exec(2);
  struct Size {
    index_t m, n, k;
  };
  std::uint64_t seed = 1;
  for (Size s : {Size{1, 1, 1}, Size{3, 5, 7}, Size{17, 33, 9}, Size{64, 65, 66}, Size{100, 7, 129}}) {
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb) {
        INFO("m, n, k = " << s.m << ", " << s.n << ", " << s.k << "; ta = " << ta << ", tb = " << tb);
        const Mat a = ta ? random_matrix(s.k, s.m, seed++) : random_matrix(s.m, s.k, seed++);
        const Mat b = tb ? random_matrix(s.n, s.k, seed++) : random_matrix(s.k, s.n, seed++);
        auto op = [](const Mat& t, int trans) { return trans ? transpose(t.view()) : t.view(); };
        Mat c(s.m, s.n);
        assign(c, matmul(op(a, ta), op(b, tb)), exec);
        check_product(c, reference(op(a, ta), op(b, tb)), s.k);
      }
  }
}

TEST_CASE("matmul of strided views: column and row slices, and transposed slices, read with their strides") {
  CpuExecutor exec(1);
  const Mat big_a = random_matrix(20, 30, 11), big_b = random_matrix(30, 25, 12);
  // a = columns [3, 17) of a 20 x 30 matrix: 20 x 14 with row stride 30 (leading dimension 30).
  const auto a = columns(big_a.view(), 3, 17);
  const auto b = rows(columns(big_b.view(), 5, 24), 2, 16);  // 14 x 19, row stride 25
  Mat c(20, 19);
  assign(c, matmul(a, b), exec);
  check_product(c, reference(a, b), 14);
  // The transpose of a slice: unit stride down the columns, leading dimension 30.
  const auto at = transpose(columns(big_a.view(), 1, 21));  // 20 x 20, strides [1, 30]
  const auto b20 = rows(columns(big_b.view(), 5, 24), 2, 22);  // 20 x 19, row stride 25
  Mat d(20, 19);
  assign(d, matmul(at, b20), exec);
  check_product(d, reference(at, b20), 20);
  // ... and both transposed: b20ᵀ · atᵀ.
  Mat f(19, 20);
  assign(f, matmul(transpose(b20), transpose(at)), exec);
  check_product(f, reference(transpose(b20), transpose(at)), 20);
  // A destination with a leading dimension: columns [4, 23) of a 20 x 30 result.
  Mat out(20, 30);
  for (index_t i = 0; i < out.size(); ++i) out.data()[i] = 9.f;
  assign(columns(out.view(), 4, 23), matmul(a, b), exec);
  Mat packed(20, 19);
  assign(packed, columns(out.view(), 4, 23), exec);
  check_product(packed, reference(a, b), 14);
  CHECK(out.view()(0, 3) == 9.f);  // untouched outside the slice
  CHECK(out.view()(19, 23) == 9.f);
}

TEST_CASE("matmul of expression operands: each is computed into scratch first, then multiplied") {
  CpuExecutor exec(1);
  const Mat a = random_matrix(9, 13, 21), b = random_matrix(13, 6, 22), bias = random_matrix(9, 13, 23);
  // (2 a - bias) · tanh(b)
  Mat ea(9, 13), eb(13, 6);
  for (index_t i = 0; i < ea.size(); ++i) ea.data()[i] = 2.f * a.data()[i] - bias.data()[i];
  for (index_t i = 0; i < eb.size(); ++i) eb.data()[i] = std::tanh(b.data()[i]);
  Mat c(9, 6);
  assign(c, matmul(a * 2.f - bias, kiln::tanh(b)), exec);
  check_product(c, reference(ea.view(), eb.view()), 13 * 3);
  // An expression of a transposed view as an operand.
  Mat d(13, 13);
  assign(d, matmul(transpose(a.view()) * 1.f, a), exec);
  check_product(d, reference(transpose(a.view()), a.view()), 9);
}

TEST_CASE("matmul inside a larger expression: relu(a·b) * 2 + c, and a·b − (a·b) = 0") {
  CpuExecutor exec(2);
  const Mat a = random_matrix(31, 70, 31), b = random_matrix(70, 67, 32), c = random_matrix(31, 67, 33);
  Mat got(31, 67);
  assign(got, kiln::relu(matmul(a, b)) * 2.f + c, exec);
  const auto ab = reference(a.view(), b.view());
  const double bound = 8.0 * 70 * std::numeric_limits<float>::epsilon() + 1e-6;
  double worst = 0;
  for (index_t i = 0; i < got.size(); ++i) {
    const double want = std::max(ab[std::size_t(i)], 0.0) * 2.0 + double(c.data()[i]);
    worst = std::max(worst, std::abs(double(got.data()[i]) - want));
  }
  CHECK_MESSAGE(worst <= bound, "largest difference ", worst);
  Mat zero(31, 67);
  assign(zero, matmul(a, b) - matmul(a, b), exec);
  for (index_t i = 0; i < zero.size(); ++i) REQUIRE(zero.data()[i] == 0.f);
}

TEST_CASE("matmul's errors name the shapes and strides") {
  CpuExecutor exec(1);
  const Mat a = random_matrix(4, 5, 41), b = random_matrix(6, 3, 42);
  Mat c(4, 3);
  CHECK_THROWS_WITH_AS(assign(c, matmul(a, b), exec), doctest::Contains("inner sizes differ: a is [4, 5], b is [6, 3]"),
                       ShapeError);
  const Mat b5 = random_matrix(5, 3, 43);
  Mat wrong(3, 4);
  // assign() checks the destination's shape first; evaluate_into (what a fused kernel or another
  // boundary calls) checks it again.
  CHECK_THROWS_WITH_AS(assign(wrong, matmul(a, b5), exec),
                       doctest::Contains("cannot assign a result of shape [4, 3] to a tensor of shape [3, 4]"), ShapeError);
  CHECK_THROWS_WITH_AS(matmul(a, b5).evaluate_into<stance::fused>(wrong.view(), exec),
                       doctest::Contains("the result has shape [4, 3] but the destination is [3, 4]"), ShapeError);
  // Every other element of every other row: no unit stride in either dimension.
  const View<const float, host, extents<dyn, dyn>> gappy(a.data(), Shape{2, 2}, {10, 2});
  const Mat b2 = random_matrix(2, 3, 44);
  Mat c2(2, 3);
  CHECK_THROWS_WITH_AS(assign(c2, matmul(gappy, b2), exec),
                       doctest::Contains("operand a of shape [2, 2] has strides [10, 2]"), ShapeError);
  // A transposed (column-major) destination.
  Mat ct(3, 4);
  CHECK_THROWS_WITH_AS(assign(transpose(ct.view()), matmul(a, b5), exec),
                       doctest::Contains("the destination must be row-major"), ShapeError);
}
