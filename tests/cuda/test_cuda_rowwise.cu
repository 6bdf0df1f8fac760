// The row-wise nn ops on the CUDA executor against the CPU executor: softmax and log_softmax,
// layer_norm with and without weight and bias (forward, and every gradient), Dropout's mask
// for the same seed, LayerNorm / Dropout inside a Sequential rebound to the device, and
// BatchNorm2d's per-channel sums split over several blocks (kiln/core/row_parts.hpp).
//
// Tolerances: the CPU sums each row (or column) in order; the CUDA kernels sum a row as a warp or
// block tree and a column in tiles (kiln/backend/cuda/rowwise.cuh), which is no less accurate:
// the CPU's own float error against double stays under 1e-6 for these shapes, so the order adds
// at most about that. The seed gradient is exact on both (loss = sum(y * dy) gives y the
// gradient dy). What differs besides: CUDA's expf / logf are a couple of ulps from
// glibc's (sqrt and division are correctly rounded on both), and nvcc fuses a * b + c into FMAs
// where the host compiler may not. Over rows of up to 1000 elements that stays within
// 1e-5 * (max |ref| + |ref|) per tensor in float and 1e-12 in double (CPU float against double
// stays under 1e-6 for these shapes), times max(1, |x| / 10) for softmax inputs as large as
// |x| = 300, where an ulp of log_softmax's lse is an ulp of |x|. Dropout is compared
// exactly: the mask is the same Philox bits, and a kept element is one rounded multiply. The
// Sequential goes through cuBLASLt GEMMs (other summation orders), hence 1e-4 as in
// test_cuda_nn.cu.
#include <doctest/doctest.h>

#include <kiln/cuda.cuh>
#include <kiln/nn/cuda.cuh>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <type_traits>
#include <utility>
#include <vector>

#include "support.hpp"

namespace {

using kiln_cuda_test::fetch;
using kiln_cuda_test::to_space;

using kiln::dyn;
using kiln::host;
using kiln::index_t;
using Cpu = kiln::CpuExecutor;
using Gpu = kiln::CudaExecutor;
using Device = kiln::cuda;  // spelled out: a bare `cuda` is ambiguous with libcu++'s namespace
namespace nn = kiln::nn;
namespace ag = kiln::ag;

template <class T>
using HMat = kiln::Tensor<T, host, dyn, dyn>;

static_assert(std::is_same_v<nn::LayerNorm<8>::on<Device>, nn::LayerNorm<8, float, Device>>);
static_assert(std::is_same_v<nn::LayerNorm<8>::on<Device>::on<host>, nn::LayerNorm<8>>);

template <class T>
HMat<T> random_matrix(index_t rows, index_t cols, double lo, double hi, std::mt19937& rng) {
  HMat<T> m(rows, cols);
  std::uniform_real_distribution<double> u(lo, hi);
  for (index_t i = 0; i < m.size(); ++i) m.data()[i] = T(u(rng));
  return m;
}

// |got - ref| <= tol * (max |ref| + |ref|) element by element.
void check_close(const std::vector<double>& got, const std::vector<double>& ref, double tol) {
  REQUIRE(got.size() == ref.size());
  double scale = 0;
  for (double v : ref) scale = std::max(scale, std::abs(v));
  for (std::size_t i = 0; i < ref.size(); ++i) {
    INFO("element " << i << ": got " << got[i] << ", want " << ref[i]);
    CHECK(std::abs(got[i] - ref[i]) <= tol * (scale + std::abs(ref[i])));
  }
}

using Results = std::vector<std::vector<double>>;

void check_all(const Results& got, const Results& ref, double tol) {
  REQUIRE(got.size() == ref.size());
  for (std::size_t k = 0; k < ref.size(); ++k) {
    INFO("result " << k);
    check_close(got[k], ref[k], tol);
  }
}

// y = (log_)softmax(x), then the gradient of sum(y * dy): y, dx, and the norm launches.
template <class T, class Exec>
Results softmax_run(Exec& exec, bool log, const HMat<T>& x, const HMat<T>& dy) {
  using S = typename Exec::space;
  ag::Tape<Exec> tape(exec);
  ag::Var<T, S, dyn, dyn> vx(to_space<S>(x), true);
  const auto vdy = to_space<S>(dy);
  const auto before = exec.stats().launches(kiln::kind::norm);
  auto y = log ? nn::log_softmax(tape, vx) : nn::softmax(tape, vx);
  tape.backward(ag::sum(tape, ag::map(tape, y * vdy)));
  const double launches = double(exec.stats().launches(kiln::kind::norm) - before);
  return {fetch(y.value()), fetch(vx.grad()), {launches}};
}

// y = layer_norm(x[, w, b]), then the gradient of sum(y * dy): y, dx[, dw, db], and the norm
// launches.
template <class T, class Exec>
Results layer_norm_run(Exec& exec, bool affine, const HMat<T>& x, const HMat<T>& w, const HMat<T>& b,
                       const HMat<T>& dy) {
  using S = typename Exec::space;
  ag::Tape<Exec> tape(exec);
  ag::Var<T, S, dyn, dyn> vx(to_space<S>(x), true), vw(to_space<S>(w), true), vb(to_space<S>(b), true);
  const auto vdy = to_space<S>(dy);
  const auto before = exec.stats().launches(kiln::kind::norm);
  auto y = affine ? nn::layer_norm(tape, vx, vw, vb, 1e-5) : nn::layer_norm(tape, vx, 1e-5);
  tape.backward(ag::sum(tape, ag::map(tape, y * vdy)));
  const double launches = double(exec.stats().launches(kiln::kind::norm) - before);
  Results r{fetch(y.value()), fetch(vx.grad())};
  if (affine) {
    r.push_back(fetch(vw.grad()));
    r.push_back(fetch(vb.grad()));
  } else {
    CHECK_FALSE(vw.has_grad());
    CHECK_FALSE(vb.has_grad());
  }
  r.push_back({launches});
  return r;
}

const std::pair<index_t, index_t> shapes[] = {{1, 1}, {3, 5}, {33, 37}, {300, 65}, {8, 1000}};

template <class T>
void compare_softmax(double tol) {
  std::mt19937 rng(2024);
  for (auto [rows, cols] : shapes)
    for (double range : {3.0, 300.0}) {  // 300: exp(x) overflows without the max shift
      INFO("shape [" << rows << ", " << cols << "], x in +-" << range);
      // log_softmax's y = x - lse is exact only to an ulp of |x|, and an ulp of a differently
      // rounded lse moves the whole row by that much: dx's error grows with |x|.
      const double row_tol = tol * std::max(1.0, range / 10);
      const HMat<T> x = random_matrix<T>(rows, cols, -range, range, rng);
      const HMat<T> dy = random_matrix<T>(rows, cols, -1, 1, rng);
      for (bool log : {false, true}) {
        INFO((log ? "log_softmax" : "softmax"));
        Cpu cpu;
        Gpu gpu;
        const Results ref = softmax_run(cpu, log, x, dy);
        const Results got = softmax_run(gpu, log, x, dy);
        CHECK(ref.back()[0] == 2);  // one kernel forward, one backward
        CHECK(got.back()[0] == ref.back()[0]);
        check_all(got, ref, row_tol);
      }
    }
}

template <class T>
void compare_layer_norm(double tol) {
  std::mt19937 rng(77);
  for (auto [rows, cols] : shapes) {
    INFO("shape [" << rows << ", " << cols << "]");
    const HMat<T> x = random_matrix<T>(rows, cols, -3, 3, rng);
    const HMat<T> w = random_matrix<T>(1, cols, 0.5, 1.5, rng);
    const HMat<T> b = random_matrix<T>(1, cols, -1, 1, rng);
    const HMat<T> dy = random_matrix<T>(rows, cols, -1, 1, rng);
    for (bool affine : {true, false}) {
      INFO((affine ? "with weight and bias" : "without"));
      Cpu cpu;
      Gpu gpu;
      const Results ref = layer_norm_run(cpu, affine, x, w, b, dy);
      const Results got = layer_norm_run(gpu, affine, x, w, b, dy);
      CHECK(ref.back()[0] == (affine ? 3 : 2));  // forward, dx, and the affine column kernel
      CHECK(got.back()[0] == ref.back()[0]);
      check_all(got, ref, tol);
    }
  }
}

// Two Dropout layer forwards (the offset advances) and a dropout(p = 1), each of its own copy
// of x, then the gradient of sum((a + b + c) * dy): a, b, c, the three dx, the layer's offset.
// Separate inputs keep every gradient one rounded multiply (no sum the device could fuse).
template <class Exec>
Results dropout_run(Exec& exec, const HMat<float>& x, const HMat<float>& dy) {
  using S = typename Exec::space;
  ag::Tape<Exec> tape(exec);
  ag::Var<float, S, dyn, dyn> x1(to_space<S>(x), true), x2(to_space<S>(x), true), x3(to_space<S>(x), true);
  const auto vdy = to_space<S>(dy);
  nn::Dropout<0.3> layer(1234);
  auto a = layer.forward(tape, x1);
  auto b = layer.forward(tape, x2);
  auto c = nn::dropout(tape, x3, 1.0, 99, 5);
  tape.backward(ag::sum(tape, ag::map(tape, (a + b + c) * vdy)));
  return {fetch(a.value()), fetch(b.value()),  fetch(c.value()),
          fetch(x1.grad()), fetch(x2.grad()), fetch(x3.grad()), {double(layer.offset())}};
}

// BatchNorm2d<C> in training mode on [n, C, H, W], then the backward of sum(y * dy): the output,
// every gradient and the running statistics, from the executor of space S.
template <class S, index_t C, index_t H, index_t W>
std::vector<std::vector<double>> batch_norm_run(index_t n, std::uint64_t seed) {
  using Exec = std::conditional_t<std::is_same_v<S, host>, Cpu, Gpu>;
  using Img = ag::Var<float, S, dyn, C, H, W>;
  kiln::Tensor<float, host, dyn, C, H, W> hx(kiln::Shape{n, C, H, W}), hdy(kiln::Shape{n, C, H, W});
  std::mt19937 rng{unsigned(seed)};
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  // Each image shifted by its index: a channel's parts have means many deviations apart, which a
  // wrong merge of the parts' statistics would not survive.
  for (index_t i = 0; i < hx.size(); ++i) hx.data()[i] = u(rng) + float(i / (C * H * W));
  for (index_t i = 0; i < hdy.size(); ++i) hdy.data()[i] = u(rng);
  Exec exec;
  ag::Tape<Exec> tape(exec);
  Img x(to_space<S>(hx), true);
  const Img dy(to_space<S>(hdy), false);
  const nn::BatchNorm2d<C, float, S> bn;
  auto y = bn.forward(tape, x);
  tape.backward(ag::sum(tape, ag::map(tape, y * dy)));
  return {fetch(y.value()),       fetch(x.grad()),
          fetch(bn.weight().grad()), fetch(bn.bias().grad()),
          fetch(bn.buffers().running_mean), fetch(bn.buffers().running_var)};
}

// The layer on the device against the CPU's loops (which sum each channel in order), and a second
// device run against the first, bit for bit: the split (kiln/core/row_parts.hpp) and the merge
// order are functions of the shape alone.
template <index_t C, index_t H, index_t W>
void compare_batch_norm(index_t n) {
  INFO("batch norm on [", n, ", ", C, ", ", H, ", ", W, "]: ", kiln::RowParts::of(C, n * H * W).count,
       " parts per channel");
  const auto cpu = batch_norm_run<host, C, H, W>(n, 3), gpu = batch_norm_run<Device, C, H, W>(n, 3);
  const auto again = batch_norm_run<Device, C, H, W>(n, 3);
  const char* names[] = {"y", "dx", "dweight", "dbias", "running mean", "running var"};
  for (std::size_t k = 0; k < cpu.size(); ++k) {
    kiln_cuda_test::check_close(gpu[k], cpu[k], 1e-5, names[k]);
    CHECK_MESSAGE(again[k] == gpu[k], names[k], " differs between two device runs");
  }
}

}  // namespace

TEST_CASE("row-wise nn on CudaExecutor: batch norm's channels split over several blocks match the CPU, run to run") {
  static_assert(kiln::RowParts::of(2, 8 * 32 * 32).count == 2);
  compare_batch_norm<2, 32, 32>(8);
}

TEST_CASE("row-wise nn on CudaExecutor: batch norm at ResNet-50 layer1's plane, 24 parts per channel (large)") {
  static_assert(kiln::RowParts::of(4, 32 * 56 * 56).count == 24);
  compare_batch_norm<4, 56, 56>(32);
}

TEST_CASE("row-wise nn on CudaExecutor: softmax and log_softmax, forward and backward, match the CPU") {
  compare_softmax<float>(1e-5);
  compare_softmax<double>(1e-12);
}

TEST_CASE("row-wise nn on CudaExecutor: layer_norm with and without affine, forward and backward, match the CPU") {
  compare_layer_norm<float>(1e-5);
  compare_layer_norm<double>(1e-12);
}

TEST_CASE("row-wise nn on CudaExecutor: Dropout draws the CPU's mask for the same seed and offset") {
  std::mt19937 rng(5);
  const index_t rows = 37, cols = 129;  // not a multiple of 4: offsets straddle Philox blocks
  const HMat<float> x = random_matrix<float>(rows, cols, 0.5, 1.5, rng);  // never 0: y == 0 means dropped
  const HMat<float> dy = random_matrix<float>(rows, cols, -1, 1, rng);
  Cpu cpu;
  Gpu gpu;
  const Results ref = dropout_run(cpu, x, dy);
  const Results got = dropout_run(gpu, x, dy);
  REQUIRE(got.size() == ref.size());
  for (std::size_t k = 0; k < ref.size(); ++k) {
    INFO("result " << k);
    CHECK(got[k] == ref[k]);  // bit for bit
  }
  // The mask is dropout_keeps(seed, offset, i): the first forward at offset 0, the second at n.
  const index_t n = rows * cols;
  CHECK(ref[6][0] == double(2 * n));
  index_t kept = 0;
  for (index_t i = 0; i < n; ++i) {
    const bool keep = nn::dropout_keeps(1234, 0, i, 0.3f);
    REQUIRE((got[0][std::size_t(i)] != 0) == keep);
    REQUIRE((got[1][std::size_t(i)] != 0) == nn::dropout_keeps(1234, std::uint64_t(n), i, 0.3f));
    REQUIRE(got[2][std::size_t(i)] == 0);  // p = 1 drops everything
    REQUIRE((got[3][std::size_t(i)] != 0) == keep);  // dy is never 0 where x is kept (almost surely)
    kept += keep;
  }
  CHECK(double(kept) / double(n) == doctest::Approx(0.7).epsilon(0.05));
  CHECK(got[0] != got[1]);  // the offset advanced: another mask
}

TEST_CASE("row-wise nn on CudaExecutor: a Sequential with Dropout and LayerNorm matches the CPU") {
  using Net = nn::Sequential<nn::Linear<12, 16>, nn::GELU, nn::Dropout<>, nn::LayerNorm<16>, nn::Linear<16, 4>>;
  static_assert(std::is_same_v<Net::space, host>);
  static_assert(std::is_same_v<Net::on<Device>::space, Device>);
  std::mt19937 rng(11);
  const HMat<float> x = random_matrix<float>(9, 12, -1, 1, rng);
  kiln::Tensor<std::int32_t, host, dyn> labels(9);
  for (index_t i = 0; i < 9; ++i) labels.data()[i] = std::int32_t(rng() % 4);
  const auto once = [&](auto& model, auto& exec) {
    using Exec = std::remove_reference_t<decltype(exec)>;
    using S = typename Exec::space;
    ag::Tape<Exec> tape(exec);
    ag::Var<float, S, dyn, dyn> vx(to_space<S>(x), true);
    const auto lab = to_space<S>(labels);
    auto loss = nn::cross_entropy(tape, model.forward(tape, vx), lab);
    tape.backward(loss);
    Results r{fetch(loss.value()), fetch(vx.grad())};
    model.for_each_parameter([&](const auto& v) {
      r.push_back(fetch(v.value()));
      r.push_back(fetch(v.grad()));
    });
    return r;
  };
  Cpu cpu;
  Gpu gpu;
  Net host_model(3);
  Net::on<Device> device_model(3);
  const Results ref = once(host_model, cpu);
  const Results got = once(device_model, gpu);
  REQUIRE(got.size() == ref.size());
  REQUIRE(ref.size() == 2 + 2 * 6);  // loss, dx, and (value, grad) of 6 parameters
  CHECK(got[0][0] == doctest::Approx(ref[0][0]).epsilon(1e-5));
  for (std::size_t k = 1; k < ref.size(); ++k) {
    INFO("result " << k);
    check_close(got[k], ref[k], 1e-4);
  }
  CHECK(gpu.stats().launches(kiln::kind::norm) == cpu.stats().launches(kiln::kind::norm));
}
