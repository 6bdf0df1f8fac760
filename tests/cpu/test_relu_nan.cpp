// kiln's ReLU and NaN (README, "Design choices"): relu(NaN) is NaN, as torch.relu; its derivative
// at a NaN input is 0 (the gradient passes where z > 0 only). Checked on every CPU path a ReLU
// takes: an expression, nn::relu (ag::map) and ag::linear's fused epilogue, forward and backward.
// The upstream gradient is finite (loss = sum(y * dy) gives y the gradient dy exactly), so the
// backward checks the derivative itself, not NaN spreading through a NaN loss.
// tests/cuda/test_cuda_kernels.cu checks the same contract on CUDA's kernel and cuBLASLt paths.
#include <kiln.hpp>
#include <kiln/autograd/linear.hpp>
#include <kiln/core/random.hpp>
#include <kiln/nn/activation.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

using namespace kiln;
using Tape = ag::Tape<CpuExecutor>;

namespace {

constexpr float nan_f = std::numeric_limits<float>::quiet_NaN();

Tensor<float, host, dyn, dyn> matrix(index_t rows, index_t cols, std::uint64_t seed, float scale) {
  Tensor<float, host, dyn, dyn> t(rows, cols);
  Generator g(seed);
  for (index_t i = 0; i < t.size(); ++i) t.data()[i] = g.uniform(-scale, scale);
  return t;
}

}  // namespace

TEST_CASE("relu contract: the functor keeps NaN and has derivative 0 there") {
  const fn::Relu relu;
  CHECK(std::isnan(relu(nan_f)));
  CHECK(std::isnan(relu(-nan_f)));
  CHECK(relu.d(nan_f) == 0.f);
  CHECK(relu(-1.f) == 0.f);
  CHECK(relu(2.f) == 2.f);
  CHECK(relu.d(2.f) == 1.f);
  CHECK(relu.d(0.f) == 0.f);
  CHECK(std::isnan(fn::Relu{}(std::numeric_limits<double>::quiet_NaN())));
}

TEST_CASE("relu contract: an expression propagates NaN") {
  CpuExecutor exec(1);
  Tensor<float, host, dyn> x(4), y(4);
  const float in[4] = {nan_f, -1.f, 0.5f, -nan_f};
  for (int i = 0; i < 4; ++i) x.data()[i] = in[i];
  assign(y, kiln::relu(x), exec);
  CHECK(std::isnan(y.data()[0]));
  CHECK(y.data()[1] == 0.f);
  CHECK(y.data()[2] == 0.5f);
  CHECK(std::isnan(y.data()[3]));
}

TEST_CASE("relu contract: nn::relu forward keeps NaN, backward gives 0 at NaN") {
  CpuExecutor exec(1);
  Tape tape(exec);
  auto xt = matrix(3, 5, 7, 1.f);
  xt.data()[1] = nan_f;
  xt.data()[7] = nan_f;
  const auto dy = matrix(3, 5, 8, 1.f);
  ag::Var<float, host, dyn, dyn> x(std::move(xt), true);
  auto y = nn::relu(tape, x);
  tape.backward(ag::sum(tape, ag::map(tape, y * dy)));
  for (index_t i = 0; i < 15; ++i) {
    const float xi = x.value().data()[i], yi = y.value().data()[i], gi = x.grad().data()[i];
    INFO("element " << i << ": x " << xi << ", y " << yi << ", dx " << gi);
    if (std::isnan(xi)) {
      CHECK(std::isnan(yi));
      CHECK(gi == 0.f);
    } else {
      CHECK(yi == (xi > 0 ? xi : 0.f));
      CHECK(gi == (xi > 0 ? dy.data()[i] : 0.f));
    }
  }
}

TEST_CASE("relu contract: ag::linear's fused ReLU epilogue keeps NaN, its backward gives 0 at NaN") {
  // A NaN bias entry makes column j0 of z NaN in every row; x and w are finite.
  const index_t rows = 6, in = 4, out = 5, j0 = 2;
  CpuExecutor exec(1);
  Tape tape(exec);
  ag::Var<float, host, dyn, dyn> x(matrix(rows, in, 1, 1.f), true), w(matrix(out, in, 2, 0.5f), true);
  Tensor<float, host, dyn> bt(out);
  for (index_t j = 0; j < out; ++j) bt.data()[j] = 0.1f * float(j) - 0.2f;
  bt.data()[j0] = nan_f;
  ag::Var<float, host, dyn> b(std::move(bt), true);
  const auto dy = matrix(rows, out, 3, 1.f);
  auto h = ag::linear<fn::Relu>(tape, x, w, b);
  tape.backward(ag::sum(tape, ag::map(tape, h * dy)));
  // The reference in double: z = x w^T + b, dz = dy * [z > 0].
  std::vector<double> dz(std::size_t(rows * out));
  for (index_t i = 0; i < rows; ++i)
    for (index_t j = 0; j < out; ++j) {
      double z = b.value().data()[j];
      for (index_t p = 0; p < in; ++p) z += double(x.value().data()[i * in + p]) * w.value().data()[j * in + p];
      const float hij = h.value().data()[i * out + j];
      INFO("h[" << i << ", " << j << "] = " << hij << ", z = " << z);
      if (j == j0) CHECK(std::isnan(hij));
      else CHECK(hij == doctest::Approx(z > 0 ? z : 0.0).epsilon(1e-5));
      dz[std::size_t(i * out + j)] = j != j0 && z > 0 ? dy.data()[i * out + j] : 0.0;
    }
  for (index_t j = 0; j < out; ++j) {
    double db = 0;
    for (index_t i = 0; i < rows; ++i) db += dz[std::size_t(i * out + j)];
    INFO("db[" << j << "]");
    CHECK(b.grad().data()[j] == doctest::Approx(db).epsilon(1e-5));
  }
  CHECK(b.grad().data()[j0] == 0.f);
  for (index_t p = 0; p < in; ++p) CHECK(w.grad().data()[j0 * in + p] == 0.f);  // row j0 of dz^T x
  for (index_t i = 0; i < x.grad().size(); ++i) CHECK(std::isfinite(x.grad().data()[i]));
}
