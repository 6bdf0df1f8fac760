// The convnet layers on kiln::cuda (cuDNN convolution, batch norm / pooling / epilogue functors)
// against the same models on the CPU: the digits CNN and a small ResNet-9 train three optimizer
// steps to the same parameters within tolerance (cuDNN and kiln's GEMM sum in other orders; fp32
// engines only), in training and in evaluation mode, and run exactly the launches predicted at
// compile time for kiln::cuda. Needs cuDNN (KILN_HAVE_CUDNN); skipped with a message otherwise.
#include <doctest/doctest.h>

#include <kiln/models/convnets.hpp>
#include <kiln/nn/cuda.cuh>
#include <kiln/train.cuh>

#include <algorithm>
#include <cmath>
#include <vector>

#if defined(KILN_HAVE_CUDNN)
namespace {

using kiln::index_t;

template <class M>
std::vector<float> values_of(const M& m) {
  std::vector<float> out;
  m.for_each_parameter([&](const auto& v) {
    if constexpr (std::is_same_v<typename std::remove_cvref_t<decltype(v)>::space, kiln::host>) {
      out.insert(out.end(), v.value().data(), v.value().data() + v.value().size());
    } else {
      const auto h = kiln::to_host(v.value());
      out.insert(out.end(), h.data(), h.data() + h.size());
    }
  });
  return out;
}

kiln::data::Dataset images(index_t n, index_t c, index_t side) {
  kiln::data::Dataset d;
  d.n = n;
  d.d = c * side * side;
  d.num_classes = 10;
  d.sample_shape = {c, side, side};
  kiln::Generator g(5);
  for (index_t i = 0; i < n * d.d; ++i) d.features.push_back(g.uniform(-1.f, 1.f));
  for (index_t i = 0; i < n; ++i) d.labels.push_back(std::int32_t(g.below(10)));
  return d;
}

struct Run {
  std::vector<float> params;
  double accuracy;
  index_t launches, predicted;
};

template <class Model, class Space>
Run train(const kiln::data::Dataset& data) {
  auto exec = kiln::make_executor<Space>(1);
  typename Model::template on<Space> model(3);
  // eps 1e-3, not 1e-8: every convolution here has a bias and a batch norm after it, so in
  // training the bias's gradient is 0 in exact arithmetic and rounding noise (1e-9..1e-8) as
  // computed — different noise on the CPU and the device. Adam with eps 1e-8 would turn that noise
  // into steps of up to lr of either sign; with 1e-3 it moves a bias by about lr * 1e-5, while the
  // real gradients still take steps of a good part of lr.
  kiln::optim::AdamW opt(model, {.lr = 1e-3, .eps = 1e-3});
  kiln::train::Step step(model, opt, exec, kiln::policy<>{});
  kiln::data::BatchLoader<Space> loader(data, {.batch_size = 16, .shuffle = false, .workers = 0}, exec);
  Run r{};
  loader.start_epoch(0);
  const auto before = exec.stats().launches();
  index_t steps = 0;
  while (const auto* b = loader.next()) {
    step(*b);
    ++steps;
  }
  r.launches = index_t(exec.stats().launches() - before) / steps;
  r.predicted = step.predicted_launches();
  (void)step.take_losses(true);
  r.params = values_of(model);
  r.accuracy = kiln::train::accuracy(model, exec, data);  // evaluation mode: running statistics
  return r;
}

template <class Model>
void compare(const kiln::data::Dataset& data, double tolerance) {
  const Run cpu = train<Model, kiln::host>(data), gpu = train<Model, kiln::cuda>(data);
  REQUIRE(cpu.params.size() == gpu.params.size());
  double worst = 0;
  for (std::size_t i = 0; i < cpu.params.size(); ++i)
    worst = std::max(worst, std::abs(double(cpu.params[i]) - double(gpu.params[i])));
  CHECK_MESSAGE(worst <= tolerance, "largest parameter difference ", worst);
  // Evaluation mode (running statistics): parameters equal within the tolerance can still flip a
  // near-tie prediction, so one sample's worth.
  MESSAGE("observed: accuracy after training, CPU " << cpu.accuracy << ", device " << gpu.accuracy);
  CHECK(std::abs(gpu.accuracy - cpu.accuracy) <= 1.0 / double(data.n) + 1e-12);
  CHECK(cpu.launches == cpu.predicted);
  CHECK(gpu.launches == gpu.predicted);
}

}  // namespace

TEST_CASE("the digits CNN trains on CUDA as on the CPU, with the predicted launches") {
  compare<kiln::models::DigitsCnn>(images(48, 1, 20), 2e-4);
}

TEST_CASE("a ResNet-9 (width 4) trains on CUDA as on the CPU, with the predicted launches") {
  compare<kiln::models::ResNet9<4>>(images(32, 3, 32), 5e-4);
}

// As on the CPU (tests/cpu/test_edge_cases.cpp): no cuDNN call sees the empty batch, backward
// gives every parameter a gradient of zero, and batch norm's running statistics stay as they were.
TEST_CASE("a batch of 0 images through the ResNet-9 on CUDA: an empty output and zero gradients") {
  using Model = kiln::models::ResNet9<4>;  // the width trained above: its layers are compiled once
  kiln::CudaExecutor exec;
  kiln::ag::Tape<kiln::CudaExecutor> tape(exec);
  Model::on<kiln::cuda> model(3);
  const auto before = values_of(model);
  using Input = kiln::ag::Var<float, kiln::cuda, kiln::dyn, Model::in_features>;
  Input x(typename Input::tensor_type(kiln::Shape{0, Model::in_features}), true);
  const auto y = model.forward(tape, x);
  CHECK(y.shape() == kiln::Shape{0, 10});
  tape.backward(kiln::nn::cross_entropy(tape, y, static_cast<const std::int32_t*>(nullptr),
                                        {.reduction = kiln::nn::loss_reduction::sum}));
  exec.synchronize();
  index_t checked = 0;
  model.for_each_parameter([&](const auto& v) {
    REQUIRE(v.has_grad());
    const auto g = kiln::to_host(v.grad());
    for (index_t i = 0; i < g.size(); ++i) CHECK(g.data()[i] == 0.0f);
    checked += g.size();
  });
  CHECK(checked == index_t(before.size()));
  CHECK(values_of(model) == before);
  const auto& bn = model.template layer<1>().template layer<1>();
  const auto mean = kiln::to_host(bn.buffers().running_mean), var = kiln::to_host(bn.buffers().running_var);
  for (index_t c = 0; c < mean.size(); ++c) {
    CHECK(mean.data()[c] == 0.0f);
    CHECK(var.data()[c] == 1.0f);
  }
}
#else
TEST_CASE("convnets on CUDA: this build has no cuDNN") {
  MESSAGE("kiln was built without cuDNN: the convnet layers have no convolution backend on kiln::cuda");
}
#endif
