// The nn MLP path on the CUDA executor against the CPU executor: the same model type, rebound
// to the device with Sequential<...>::on<kiln::cuda>, starts from the same initial parameters
// (drawn on the host, copied), and one forward + cross_entropy + backward gives the same loss
// and every parameter's gradient within fp32 tolerance. The golden MLP (PyTorch's numbers,
// tests/fixtures/golden_mlp.txt) runs on the device against its fixture too.
//
// Tolerances: initial parameters are copies, so they agree exactly. The loss and gradients go
// through cuBLASLt GEMMs (other summation orders than the CPU kernel) and CUDA's expf / logf /
// erff (a few ulps), so results are compared with |got - ref| <= 1e-4 * (|ref| + max |ref| / 10)
// per element (tests/cuda/support.hpp); the loss with a relative 1e-5.
#include <doctest/doctest.h>

#include <kiln/cuda.cuh>
#include <kiln/nn/cuda.cuh>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "../cpu/fixture.hpp"

#include "support.hpp"

namespace {

using kiln_cuda_test::check_close;
using kiln_cuda_test::fetch;
using kiln_cuda_test::to_space;

using kiln::dyn;
using kiln::host;
using kiln::index_t;
using Cpu = kiln::CpuExecutor;
using Gpu = kiln::CudaExecutor;
using Device = kiln::cuda;  // spelled out: a bare `cuda` is ambiguous with libcu++'s namespace
namespace nn = kiln::nn;

using Mlp = nn::Sequential<nn::Linear<400, 256>, nn::ReLU, nn::Linear<256, 128>, nn::ReLU, nn::Linear<128, 10>>;
using GoldenMlp = nn::Sequential<nn::Linear<12, 16>, nn::ReLU, nn::Linear<16, 8>, nn::GELU, nn::Linear<8, 4>>;

static_assert(std::is_same_v<Mlp::space, host>);
static_assert(std::is_same_v<Mlp::on<Device>::space, Device>);
static_assert(std::is_same_v<Mlp::on<Device>::on<host>, Mlp>);
static_assert(std::is_same_v<nn::Linear<3, 4>::on<Device>, nn::Linear<3, 4, true, float, Device>>);

struct Result {
  std::vector<double> loss;
  std::vector<std::vector<double>> values, grads;
};

// One forward + cross_entropy + backward of `model` on `exec`.
template <class Model, class Exec>
Result run(Model& model, Exec& exec, const kiln::Tensor<float, host, dyn, dyn>& x,
           const kiln::Tensor<std::int32_t, host, dyn>& labels, nn::CrossEntropyOptions options) {
  using S = typename Model::space;
  static_assert(std::is_same_v<S, typename Exec::space>);
  Result r;
  model.for_each_parameter([&](const auto& v) { r.values.push_back(fetch(v.value())); });
  kiln::ag::Tape<Exec> tape(exec);
  model.zero_grad();
  kiln::ag::Var<float, S, dyn, dyn> vx(to_space<S>(x));
  const auto lab = to_space<S>(labels);  // device labels on the CUDA executor
  auto loss = nn::cross_entropy(tape, model.forward(tape, vx), lab, options);
  tape.backward(loss);
  r.loss = fetch(loss.value());
  model.for_each_parameter([&](const auto& v) {
    REQUIRE(v.has_grad());
    r.grads.push_back(fetch(v.grad()));
  });
  return r;
}


}  // namespace

TEST_CASE("nn on CudaExecutor: the MLP 400-256-128-10 matches the CPU (parameters, loss, every gradient)") {
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  const index_t batch = 64;
  kiln::Tensor<float, host, dyn, dyn> x(batch, 400);
  for (index_t i = 0; i < x.size(); ++i) x.data()[i] = u(rng);
  kiln::Tensor<std::int32_t, host, dyn> labels(batch);
  for (index_t i = 0; i < batch; ++i) labels.data()[i] = std::int32_t(rng() % 10);

  for (int variant = 0; variant < 2; ++variant) {
    const nn::CrossEntropyOptions options = variant == 0 ? nn::CrossEntropyOptions{}
                                                         : nn::CrossEntropyOptions{0.1, nn::loss_reduction::sum};
    INFO("variant " << variant);
    Cpu cpu;
    Gpu gpu;
    Mlp host_model(42);
    Mlp::on<Device> device_model(42);
    CHECK(device_model.parameter_count() == host_model.parameter_count());
    const Result ref = run(host_model, cpu, x, labels, options);
    const Result got = run(device_model, gpu, x, labels, options);
    REQUIRE(got.values.size() == 6);
    REQUIRE(ref.values.size() == 6);
    for (std::size_t k = 0; k < 6; ++k) {
      INFO("parameter " << k);
      CHECK(got.values[k] == ref.values[k]);  // the same host draws, copied
      check_close(got.grads[k], ref.grads[k], 1e-4);
    }
    REQUIRE(got.loss.size() == 1);
    CHECK(got.loss[0] == doctest::Approx(ref.loss[0]).epsilon(1e-5));
  }
}

TEST_CASE("nn on CudaExecutor: param_table() holds device pointers") {
  Mlp::on<Device> model(7);
  const kiln::optim::ParamTable table = model.param_table();
  CHECK(table.count() == 6);
  CHECK(table.total_size() == model.parameter_count());
  for (const auto& slot : table) {
    for (const float* p : {static_cast<const float*>(slot.value), static_cast<const float*>(slot.grad)}) {
      cudaPointerAttributes attr{};
      REQUIRE(cudaPointerGetAttributes(&attr, p) == cudaSuccess);
      CHECK(attr.type == cudaMemoryTypeDevice);
    }
    // Gradients never written by a backward read as zeros (set-to-none, zero-filled buffers).
    std::vector<float> g(std::size_t(slot.size), 1.f);
    KILN_CUDA_CHECK(cudaMemcpy(g.data(), slot.grad, g.size() * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK(std::all_of(g.begin(), g.end(), [](float v) { return v == 0.f; }));
  }
}

TEST_CASE("nn on CudaExecutor: the golden MLP matches PyTorch's loss and gradients") {
  const auto golden = [](const std::string& name) -> const kiln_test::FixtureBlock& {
    return kiln_test::golden_mlp().at(name);
  };
  const char* const names[] = {"l0.weight", "l0.bias", "l1.weight", "l1.bias", "l2.weight", "l2.bias"};
  GoldenMlp::on<Device> model;
  const auto params = model.parameters();
  REQUIRE(params.size() == 6);
  for (std::size_t k = 0; k < 6; ++k) {
    const auto& b = golden(names[k]);
    REQUIRE(index_t(b.values.size()) == params[k].size);
    std::vector<float> h(b.values.begin(), b.values.end());
    KILN_CUDA_CHECK(cudaMemcpy(params[k].value, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
  }
  const auto& xb = golden("x");
  kiln::Tensor<float, host, dyn, dyn> x(index_t(xb.values.size() / 12), 12);
  for (index_t i = 0; i < x.size(); ++i) x.data()[i] = float(xb.values[std::size_t(i)]);
  const auto& lb = golden("labels");
  kiln::Tensor<std::int32_t, host, dyn> labels(index_t(lb.values.size()));
  for (index_t i = 0; i < labels.size(); ++i) labels.data()[i] = std::int32_t(lb.values[std::size_t(i)]);
  Gpu gpu;
  const Result got = run(model, gpu, x, labels, {.label_smoothing = 0.1});
  CHECK(got.loss[0] == doctest::Approx(golden("loss0").values[0]).epsilon(1e-5));
  for (std::size_t k = 0; k < 6; ++k) {
    INFO("grad." << names[k]);
    const auto& want = golden(std::string("grad.") + names[k]).values;
    REQUIRE(got.grads[k].size() == want.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
      INFO("element " << i << ": got " << got.grads[k][i] << ", want " << want[i]);
      CHECK(std::abs(got.grads[k][i] - want[i]) <= 2e-6 + 1e-4 * std::abs(want[i]));
    }
  }
}

TEST_CASE("nn on CudaExecutor: Flatten and mse_loss (a target that requires a gradient) match the CPU") {
  using Net = nn::Sequential<nn::Flatten, nn::Linear<12, 8>, nn::Tanh, nn::Linear<8, 4>>;
  static_assert(std::is_same_v<Net::on<Device>::space, Device>);
  std::mt19937 rng(99);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  kiln::Tensor<float, host, dyn, 3, 4> x(5, 3, 4);
  kiln::Tensor<float, host, dyn, dyn> t(5, 4);
  for (index_t i = 0; i < x.size(); ++i) x.data()[i] = u(rng);
  for (index_t i = 0; i < t.size(); ++i) t.data()[i] = u(rng);
  const auto once = [&](auto& model, auto& exec) {
    using Exec = std::remove_reference_t<decltype(exec)>;
    using S = typename Exec::space;
    kiln::ag::Tape<Exec> tape(exec);
    kiln::ag::Var<float, S, dyn, 3, 4> vx(to_space<S>(x), true);
    kiln::ag::Var<float, S, dyn, dyn> vt(to_space<S>(t), true);
    auto loss = nn::mse_loss(tape, model.forward(tape, vx), vt);
    tape.backward(loss);
    std::vector<std::vector<double>> r{fetch(loss.value()), fetch(vx.grad()), fetch(vt.grad())};
    model.for_each_parameter([&](const auto& v) { r.push_back(fetch(v.grad())); });
    return r;
  };
  Cpu cpu;
  Gpu gpu;
  Net host_model(5);
  Net::on<Device> device_model(5);
  const auto ref = once(host_model, cpu);
  const auto got = once(device_model, gpu);
  REQUIRE(got.size() == ref.size());
  CHECK(got[0][0] == doctest::Approx(ref[0][0]).epsilon(1e-5));
  for (std::size_t k = 1; k < ref.size(); ++k) {
    INFO("result " << k);
    check_close(got[k], ref[k], 1e-4);
  }
}

namespace {

// Dropout on one executor: a and b = dropout(x1) and dropout(x2) with the same seed and offset,
// c = dropout(x2) with another seed and offset, then the gradient of sum(a·w + b·w + c·w2):
// x1's gradient is written by one dropout backward (through the stored mask), x2's written by
// one and added to by the other. Returns a, b, c, x1's and x2's gradients.
template <class Exec>
std::vector<std::vector<double>> dropout_once(Exec& exec, const kiln::Tensor<float, host, dyn, dyn>& x,
                                              const kiln::Tensor<float, host, dyn, dyn>& w,
                                              const kiln::Tensor<float, host, dyn, dyn>& w2, std::uint64_t offset) {
  using S = typename Exec::space;
  kiln::ag::Tape<Exec> tape(exec);
  kiln::ag::Var<float, S, dyn, dyn> x1(to_space<S>(x), true), x2(to_space<S>(x), true);
  kiln::ag::Var<float, S, dyn, dyn> vw(to_space<S>(w)), vw2(to_space<S>(w2));
  auto a = nn::dropout(tape, x1, 0.3, 1234, offset);
  auto b = nn::dropout(tape, x2, 0.3, 1234, offset);
  auto c = nn::dropout(tape, x2, 0.6, 77, offset + 7);
  tape.backward(kiln::ag::sum(tape, kiln::ag::map(tape, a * vw + b * vw + c * vw2)));
  return {fetch(a.value()), fetch(b.value()), fetch(c.value()), fetch(x1.grad()), fetch(x2.grad())};
}

}  // namespace

TEST_CASE("nn on CudaExecutor: dropout's device mask is the CPU's for any offset and size (forward, backward)") {
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> u(0.5f, 1.5f);  // never 0: y == 0 means dropped
  const index_t shapes[][2] = {{1, 1}, {1, 9}, {3, 7}, {37, 129}, {64, 256}, {5, 70001}};
  for (const auto& shape : shapes) {
    const index_t rows = shape[0], cols = shape[1], n = rows * cols;
    kiln::Tensor<float, host, dyn, dyn> x(rows, cols), w(rows, cols), w2(rows, cols);
    for (index_t i = 0; i < n; ++i) {
      x.data()[i] = u(rng);
      w.data()[i] = u(rng) - 1.0f;
      w2.data()[i] = u(rng);
    }
    for (std::uint64_t offset : {std::uint64_t(0), std::uint64_t(3), std::uint64_t(1001), std::uint64_t(1) << 40}) {
      INFO("[" << rows << ", " << cols << "] at offset " << offset);
      Cpu cpu;
      Gpu gpu;
      const auto ref = dropout_once(cpu, x, w, w2, offset);
      const auto got = dropout_once(gpu, x, w, w2, offset);
      REQUIRE(got.size() == 5);
      for (std::size_t k = 0; k < 4; ++k) {
        INFO("result " << k);
        CHECK(got[k] == ref[k]);  // bit for bit: the same Philox words, one rounded multiply
      }
      check_close(got[4], ref[4], 1e-6);  // a sum the device may fuse into an FMA
      for (index_t i = 0; i < n; ++i) {
        REQUIRE((got[0][std::size_t(i)] != 0) == nn::dropout_keeps(1234, offset, i, 0.3f));
        REQUIRE((got[2][std::size_t(i)] != 0) == nn::dropout_keeps(77, offset + 7, i, 0.6f));
      }
    }
  }
}
