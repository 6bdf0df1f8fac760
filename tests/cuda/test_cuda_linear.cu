// ag::linear on the CUDA executor — cuBLASLt's RELU_AUX_BIAS / GELU_AUX_BIAS / BIAS forward and
// DRELU_BGRAD / DGELU_BGRAD / BGRADA backward, and the GEMM + kernel fallbacks for other
// activations — against the CPU executor running the same ops (whose fold path is itself tested
// against unfused ops in tests/cpu/test_linear_fold.cpp).
//
// Each case runs twice on the device: with cuBLASLt's epilogues, and with use_lt_epilogues(false)
// (plain GEMMs and kiln's kernels, the path taken when cuBLASLt has no kernel for an epilogue).
// Every consumer mix of the activation's gradient is run: one GEMM consumer (the fold), an
// elementwise consumer (the dact kernel), both, two GEMMs, and a consumer GEMM with k = 1
// (cuBLASLt's DRELU / DGELU refuse it, so the producer's dact kernel runs instead).
//
// Tolerance: fp32, different summation orders (cuBLASLt vs kiln's kernel, column sums in float
// vs double), tanh / exp within a few ulps: |got - ref| <= 2e-4 * (max |ref| + |ref|) per tensor.
#include <doctest/doctest.h>

#include <kiln/autograd/linear.hpp>
#include <kiln/cuda.cuh>
#include <kiln/nn/cuda.cuh>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "support.hpp"

namespace {

using kiln_cuda_test::fetch;

using kiln::dyn;
using kiln::host;
using kiln::index_t;
using Device = kiln::cuda;
namespace ag = kiln::ag;
namespace fn = kiln::fn;
namespace nn = kiln::nn;

enum class consumers { gemm, elementwise, gemm_and_elementwise, two_gemms, gemm_k1 };

template <class S>
using M = ag::Var<float, S, dyn, dyn>;
template <class S>
using B = ag::Var<float, S, dyn>;

template <class S, index_t... D>
ag::Var<float, S, D...> random_var(kiln::Shape shape, std::uint64_t seed, float scale) {
  kiln::Tensor<float, host, D...> t(shape);
  kiln::Generator g(seed);
  for (index_t i = 0; i < t.size(); ++i) t.data()[i] = g.uniform(-scale, scale);
  if constexpr (std::is_same_v<S, host>) return ag::Var<float, S, D...>(std::move(t), true);
  else return ag::Var<float, S, D...>(kiln::to_device(t), true);
}

struct Grads {
  std::vector<double> y, loss, dx, dw1, db1, dw2, db2, dw3;
};

template <class Act, class Exec>
Grads run(consumers c, bool bias, bool lt = true) {
  using S = typename Exec::space;
  const index_t out2 = c == consumers::gemm_k1 ? 1 : 9;
  auto x = random_var<S, dyn, dyn>(kiln::Shape{33, 40}, 1, 1.f);
  auto w1 = random_var<S, dyn, dyn>(kiln::Shape{24, 40}, 2, 0.3f);
  auto b1 = random_var<S, dyn>(kiln::Shape{24}, 3, 0.3f);
  auto w2 = random_var<S, dyn, dyn>(kiln::Shape{out2, 24}, 4, 0.3f);
  auto b2 = random_var<S, dyn>(kiln::Shape{out2}, 5, 0.3f);
  auto w3 = random_var<S, dyn, dyn>(kiln::Shape{7, 24}, 6, 0.3f);
  Exec exec;
  if constexpr (std::is_same_v<Exec, kiln::CudaExecutor>) exec.use_lt_epilogues(lt);
  ag::Tape<Exec> tape(exec);
  M<S> h = bias ? M<S>(ag::linear<Act>(tape, x, w1, b1)) : M<S>(ag::linear<Act>(tape, x, w1));
  auto square_sum = [&](const M<S>& v) { return ag::sum(tape, ag::map(tape, v * v)); };
  auto next = [&] { return M<S>(ag::linear<fn::Tanh>(tape, h, w2, b2)); };
  ag::Var<float, S> loss;
  switch (c) {
    case consumers::gemm:
    case consumers::gemm_k1: loss = square_sum(next()); break;
    case consumers::elementwise: loss = square_sum(h); break;
    case consumers::gemm_and_elementwise: loss = ag::map(tape, square_sum(next()) + square_sum(h)); break;
    case consumers::two_gemms:
      loss = ag::map(tape, square_sum(next()) + square_sum(M<S>(ag::matmul(tape, h, w3, false, true))));
      break;
  }
  tape.backward(loss);
  Grads g;
  g.y = fetch(h.value());
  g.loss = fetch(loss.value());
  g.dx = fetch(x.grad());
  g.dw1 = fetch(w1.grad());
  if (bias) g.db1 = fetch(b1.grad());
  if (w2.has_grad()) g.dw2 = fetch(w2.grad()), g.db2 = fetch(b2.grad());
  if (w3.has_grad()) g.dw3 = fetch(w3.grad());
  return g;
}

void check_close(const std::vector<double>& got, const std::vector<double>& ref, const char* what) {
  kiln_cuda_test::check_close(got, ref, 2e-4, what);
}

template <class Act>
void compare_all() {
  for (bool bias : {true, false}) {
    for (consumers c : {consumers::gemm, consumers::elementwise, consumers::gemm_and_elementwise,
                        consumers::two_gemms, consumers::gemm_k1}) {
      for (bool lt : {true, false}) {
        CAPTURE(bias);
        CAPTURE(int(c));
        CAPTURE(lt);
        const Grads ref = run<Act, kiln::CpuExecutor>(c, bias);
        const Grads got = run<Act, kiln::CudaExecutor>(c, bias, lt);
        check_close(got.y, ref.y, "y");
        check_close(got.loss, ref.loss, "loss");
        check_close(got.dx, ref.dx, "dx");
        check_close(got.dw1, ref.dw1, "dw1");
        check_close(got.db1, ref.db1, "db1");
        check_close(got.dw2, ref.dw2, "dw2");
        check_close(got.db2, ref.db2, "db2");
        check_close(got.dw3, ref.dw3, "dw3");
      }
    }
  }
}

}  // namespace

TEST_CASE("ag::linear on CudaExecutor matches the CPU: cuBLASLt epilogues and their fallbacks") {
  // What the executor's probes found decides whether the "lt" runs below use cuBLASLt's epilogue
  // or fall back to kiln's kernels (CudaExecutor::lt_relu_keeps_nan, lt_gelu_accurate): the values
  // are the CPU's either way.
  kiln::CudaExecutor probe;
  MESSAGE("observed: cuBLASLt ReLU epilogues keep kiln's NaN contract: " << probe.lt_relu_keeps_nan()
                                                                         << "; GELU epilogue float-accurate: "
                                                                         << probe.lt_gelu_accurate());
  SUBCASE("relu (RELU_AUX_BIAS / DRELU_BGRAD)") { compare_all<fn::Relu>(); }
  SUBCASE("gelu tanh (GELU_AUX_BIAS / DGELU_BGRAD)") { compare_all<fn::GeluTanh>(); }
  SUBCASE("sigmoid (GEMM + kernel)") { compare_all<fn::Sigmoid>(); }
  SUBCASE("no activation (BIAS / BGRADA)") { compare_all<fn::Identity>(); }
}

TEST_CASE("An MLP training step on CUDA is GEMMs with epilogues: the same launches as on the CPU") {
  using Mlp = nn::Sequential<nn::Linear<20, 16>, nn::ReLU, nn::Linear<16, 12>, nn::ReLU, nn::Linear<12, 5>>;
  Mlp::on<Device> model(3);
  kiln::CudaExecutor exec;
  ag::Tape<kiln::CudaExecutor> tape(exec);
  auto x = random_var<Device, dyn, dyn>(kiln::Shape{8, 20}, 4, 1.f);
  x.set_requires_grad(false);
  kiln::Tensor<std::int32_t, host, dyn> labels(8);
  for (index_t i = 0; i < 8; ++i) labels.data()[i] = std::int32_t(i % 5);
  const auto device_labels = kiln::to_device(labels);
  exec.stats().set_recording(true);
  auto loss = nn::cross_entropy(tape, model.forward(tape, x), device_labels);
  tape.backward(loss);
  exec.synchronize();
  std::vector<std::string> gemms;
  for (const auto& r : exec.stats().records())
    if (r.kind == kiln::kind::gemm) gemms.push_back(r.name);
  const std::vector<std::string> want{"gemm+bias+relu", "gemm+bias+relu", "gemm+bias",       "gemm+bgrada",
                                      "gemm+drelu+bgrad", "gemm",          "gemm+drelu+bgrad", "gemm"};
  CHECK(gemms == want);
}
