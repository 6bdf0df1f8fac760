// The edges a training run meets sooner or later, each against what PyTorch does (or a decision
// written down where kiln differs): broadcasting one 2-D fold cannot express, empty batches
// through the losses and layers, extreme and non-finite logits, a constant row into layer_norm,
// NaN and inf through GEMM, gradients accumulated over two backward passes, an intermediate used
// after backward, and Flatten's backward.
#include <kiln.hpp>
#include <kiln/models/convnets.hpp>
#include <kiln/nn/activation.hpp>
#include <kiln/nn/dropout.hpp>
#include <kiln/nn/layernorm.hpp>
#include <kiln/nn/linear.hpp>
#include <kiln/nn/loss.hpp>
#include <kiln/nn/sequential.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

using namespace kiln;
using Tape = ag::Tape<CpuExecutor>;

namespace {

constexpr float inf = std::numeric_limits<float>::infinity();
constexpr float nan_f = std::numeric_limits<float>::quiet_NaN();

template <class T = float>
ag::Var<T, host, dyn, dyn> var(index_t rows, index_t cols, std::vector<T> values, bool requires_grad = false) {
  HostMatrix<T> m(rows, cols);
  REQUIRE(index_t(values.size()) == m.size());
  for (index_t i = 0; i < m.size(); ++i) m.data()[i] = values[std::size_t(i)];
  return ag::Var<T, host, dyn, dyn>(std::move(m), requires_grad);
}

template <class T = float>
ag::Var<T, host, dyn, dyn> random_var(index_t rows, index_t cols, std::uint64_t seed, bool requires_grad = false) {
  HostMatrix<T> m(rows, cols);
  Generator g(seed);
  for (index_t i = 0; i < m.size(); ++i) m.data()[i] = T(g.uniform(-1.f, 1.f));
  return ag::Var<T, host, dyn, dyn>(std::move(m), requires_grad);
}

template <class V>
std::vector<double> values(const V& t) {
  std::vector<double> out;
  for (index_t i = 0; i < t.size(); ++i) out.push_back(double(t.data()[i]));
  return out;
}

}  // namespace

TEST_CASE("broadcasting that one 2-D fold cannot express is a ShapeError naming both shapes") {
  CpuExecutor exec(1);
  Tensor<float, host, dyn, dyn, dyn> a(Shape{2, 1, 4}), out(Shape{2, 3, 4});
  Tensor<float, host, dyn, dyn, dyn> b(Shape{2, 3, 4});
  for (index_t i = 0; i < a.size(); ++i) a.data()[i] = float(i);
  for (index_t i = 0; i < b.size(); ++i) b.data()[i] = 1.f;
  // [2, 1, 4] against [2, 3, 4]: the middle axis would broadcast inside each of the 2 blocks.
  CHECK_THROWS_WITH_AS(assign(out, a + b, exec), doctest::Contains("[2, 1, 4]"), ShapeError);
  CHECK_THROWS_WITH_AS(assign(out, a + b, exec), doctest::Contains("[2, 3, 4]"), ShapeError);
  // What the fold can express still works: a row vector [4] over [2, 3, 4].
  Tensor<float, host, dyn> row(Shape{4});
  for (index_t i = 0; i < 4; ++i) row.data()[i] = float(10 * i);
  assign(out, b + row, exec);
  CHECK(out.data()[4 * 5 + 3] == 31.f);
}

TEST_CASE("an empty batch: the mean losses are NaN (0 / 0, as PyTorch), the sums 0, and nothing flows back") {
  CpuExecutor exec(1);
  Tape tape(exec);
  auto logits = var(0, 5, {}, true);
  const std::int32_t* no_labels = nullptr;  // 0 rows need no labels
  auto mean_ce = nn::cross_entropy(tape, logits, no_labels);
  CHECK(std::isnan(mean_ce.value().data()[0]));
  auto sum_ce = nn::cross_entropy(tape, logits, no_labels, {.reduction = nn::loss_reduction::sum});
  CHECK(sum_ce.value().data()[0] == 0.f);
  auto pred = var(0, 3, {}, true), target = var(0, 3, {});
  auto mean_mse = nn::mse_loss(tape, pred, target);
  CHECK(std::isnan(mean_mse.value().data()[0]));
  auto sum_mse = nn::mse_loss(tape, pred, target, nn::loss_reduction::sum);
  CHECK(sum_mse.value().data()[0] == 0.f);
  tape.backward(sum_ce);  // over no rows: runs, writes nothing
  CHECK(logits.value().size() == 0);
}

TEST_CASE("a batch of 0 rows through Linear, the activations, layer_norm, softmax, dropout and Flatten") {
  CpuExecutor exec(1);
  Tape tape(exec);
  nn::Sequential<nn::Linear<4, 6>, nn::ReLU, nn::Linear<6, 3>, nn::GELU> model(1);
  auto x = var(0, 4, {}, true);
  auto y = model.forward(tape, x);
  CHECK(y.dim(0) == 0);
  CHECK(y.dim(1) == 3);
  auto n = nn::layer_norm(tape, y);
  auto s = nn::softmax(tape, n);
  auto d = nn::dropout(tape, s, 0.5, 7, 0);
  CHECK(d.value().size() == 0);
  Tensor<float, host, dyn, dyn, dyn> images(Shape{0, 2, 3});
  ag::Var<float, host, dyn, dyn, dyn> vi(std::move(images), true);
  auto flat = nn::Flatten{}.forward(tape, vi);
  CHECK(flat.dim(0) == 0);
  CHECK(flat.dim(1) == 6);
  auto loss = nn::cross_entropy(tape, d, static_cast<const std::int32_t*>(nullptr), {.reduction = nn::loss_reduction::sum});
  tape.backward(loss);
  // The weights' gradients over no rows are zero.
  const auto& w = model.layer<0>().weight();
  REQUIRE(w.has_grad());
  for (double g : values(w.grad())) CHECK(g == 0.0);
}

namespace {
// Every parameter's gradient after a backward of sum(cross_entropy(model(x))) over `rows` random
// images, added to what the parameters hold (no zero_grad: the caller decides).
template <class Model>
std::vector<double> backward_over(Model& model, index_t rows, std::uint64_t seed) {
  CpuExecutor exec(2);
  Tape tape(exec);
  constexpr index_t d = Model::in_features;
  Tensor<float, host, dyn, d> m(Shape{rows, d});
  Generator g(seed);
  for (index_t i = 0; i < m.size(); ++i) m.data()[i] = g.uniform(-1.f, 1.f);
  ag::Var<float, host, dyn, d> x(std::move(m), true);
  std::vector<std::int32_t> labels(static_cast<std::size_t>(rows));
  for (index_t i = 0; i < rows; ++i) labels[std::size_t(i)] = std::int32_t(i % 10);
  auto y = model.forward(tape, x);
  CHECK(y.shape() == Shape{rows, 10});
  tape.backward(nn::cross_entropy(tape, y, labels.data(), {.reduction = nn::loss_reduction::sum}));
  CHECK(x.has_grad());
  std::vector<double> grads;
  model.for_each_parameter([&](const auto& v) {
    REQUIRE(v.has_grad());
    grads.insert(grads.end(), v.grad().data(), v.grad().data() + v.value().size());
  });
  return grads;
}
}  // namespace

// The ResNet-9 holds every image layer: convolution, batch norm, max pooling, residual blocks,
// global pooling (and Unflatten, Linear).
TEST_CASE("a batch of 0 images through convolution, batch norm, pooling and residual blocks: empty outputs and zero "
          "gradients, as PyTorch") {
  models::ResNet9<2> model(5);
  const auto empty = backward_over(model, 0, 1);
  REQUIRE(!empty.empty());
  for (double g : empty) CHECK(g == 0.0);  // every parameter took part, with a gradient of zero
  // A real batch after it, without zero_grad, gives what it gives alone: the empty batch added nothing.
  const auto after = backward_over(model, 3, 2);
  model.zero_grad();
  const auto alone = backward_over(model, 3, 2);
  CHECK(after == alone);
  CHECK(std::any_of(alone.begin(), alone.end(), [](double g) { return g != 0.0; }));
}

TEST_CASE("batch norm over 0 images keeps its running statistics (its count of batches moves, as PyTorch's); "
          "pooling and channels-last layers give empty outputs; bad sizes are still named") {
  CpuExecutor exec(1);
  Tape tape(exec);
  using Image = ag::Var<float, host, dyn, dyn, dyn, dyn>;
  auto images = [](Shape s) { return Image(Tensor<float, host, dyn, dyn, dyn, dyn>(s), true); };
  nn::BatchNorm2d<3> bn;
  const auto y = bn.forward(tape, images(Shape{0, 3, 4, 4}));
  CHECK(y.shape() == Shape{0, 3, 4, 4});
  for (int c = 0; c < 3; ++c) {
    CHECK(bn.buffers().running_mean.data()[c] == 0.0f);  // not NaN: no mean over nothing
    CHECK(bn.buffers().running_var.data()[c] == 1.0f);
  }
  CHECK(bn.buffers().batches_tracked == 1);
  bn.eval();
  CHECK(bn.forward(tape, images(Shape{0, 3, 4, 4})).shape() == Shape{0, 3, 4, 4});
  CHECK(bn.buffers().batches_tracked == 1);

  CHECK(nn::MaxPool2d<2>{}.forward(tape, images(Shape{0, 3, 5, 4})).shape() == Shape{0, 3, 2, 2});
  CHECK(nn::AvgPool2d<3, 2, 1>{}.forward(tape, images(Shape{0, 3, 5, 4})).shape() == Shape{0, 3, 3, 2});
  CHECK(nn::GlobalAvgPool{}.forward(tape, images(Shape{0, 3, 5, 4})).shape() == Shape{0, 3});
  CHECK(nn::Conv2d<3, 4, 3, 2, 1, 1, true, float, host, nn::layout::nhwc>{}.forward(tape, images(Shape{0, 7, 5, 3})).shape() ==
        Shape{0, 4, 3, 4});
  CHECK(nn::MaxPool2d<2, 2, 0, nn::layout::nhwc>{}.forward(tape, images(Shape{0, 4, 6, 3})).shape() ==
        Shape{0, 2, 3, 3});

  // An empty batch is no excuse for wrong sizes: channels, and images smaller than the window.
  nn::Conv2d<3, 4, 3> conv;
  CHECK_THROWS_WITH_AS(conv.forward(tape, images(Shape{0, 2, 5, 5})), doctest::Contains("[0, 2, 5, 5]"), ShapeError);
  CHECK_THROWS_WITH_AS(conv.forward(tape, images(Shape{0, 3, 2, 5})), doctest::Contains("h=2"), ShapeError);
  CHECK_THROWS_WITH_AS(nn::MaxPool2d<3>{}.forward(tape, images(Shape{0, 3, 2, 2})), doctest::Contains("h=2"),
                       ShapeError);
  CHECK_THROWS_WITH_AS(bn.forward(tape, images(Shape{0, 2, 4, 4})), doctest::Contains("[0, 2, 4, 4]"), ShapeError);
  CHECK_THROWS_AS(nn::GlobalAvgPool{}.forward(tape, images(Shape{0, 3, 0, 4})), ShapeError);
}

TEST_CASE("cross_entropy with large, infinite and NaN logits") {
  CpuExecutor exec(1);
  Tape tape(exec);
  const std::int32_t labels[4] = {0, 1, 2, 0};
  // Row 0: huge but finite (the log-sum-exp must not overflow); row 1: +inf at another class;
  // row 2: -inf at a non-label class (a masked logit: harmless); row 3: NaN.
  auto logits = var(4, 3, {1e30f, -1e30f, 0.f,  //
                           inf, 0.f, 0.f,        //
                           -inf, 1.f, 2.f,       //
                           nan_f, 0.f, 0.f},
                    true);
  auto rows = nn::cross_entropy(tape, logits, labels, {.reduction = nn::loss_reduction::sum});
  // PyTorch: row 0 loses 0, row 1 gives nan (inf - inf in the log-sum-exp), row 2 log(1 + e + e^2)
  // - 2 ... summed with a NaN row the total is NaN.
  CHECK(std::isnan(rows.value().data()[0]));
  Tape tape2(exec);
  auto finite_rows = var(2, 3, {1e30f, -1e30f, 0.f, -inf, 1.f, 2.f}, true);
  const std::int32_t finite_labels[2] = {0, 2};
  auto loss = nn::cross_entropy(tape2, finite_rows, finite_labels, {.reduction = nn::loss_reduction::sum});
  const double row2 = std::log(std::exp(1.0) + std::exp(2.0)) - 2.0;
  CHECK(loss.value().data()[0] == doctest::Approx(row2).epsilon(1e-6));
  tape2.backward(loss);
  const auto g = values(finite_rows.grad());
  // Row 0: softmax is one-hot at the label: gradient 0 everywhere. Row 2: softmax - onehot, with
  // exp(-inf) = 0 at the masked class.
  CHECK(g[0] == 0.0);
  CHECK(g[1] == 0.0);
  CHECK(g[2] == 0.0);
  CHECK(g[3] == 0.0);
  const double p1 = std::exp(1.0) / (std::exp(1.0) + std::exp(2.0));
  CHECK(g[4] == doctest::Approx(p1).epsilon(1e-6));
  CHECK(g[5] == doctest::Approx(-p1).epsilon(1e-6));  // p(class 2) - 1 = (1 - p1) - 1
}

TEST_CASE("layer_norm of a constant row: zeros (the variance is 0, eps keeps it finite), gradient finite") {
  CpuExecutor exec(1);
  Tape tape(exec);
  auto x = var<double>(2, 4, {3, 3, 3, 3, 1, 2, 3, 4}, true);
  auto y = nn::layer_norm(tape, x, 1e-5);
  for (index_t j = 0; j < 4; ++j) CHECK(y.value()(0, j) == 0.0);
  // Row 1: (x - 2.5) / sqrt(1.25 + 1e-5).
  CHECK(y.value()(1, 0) == doctest::Approx(-1.5 / std::sqrt(1.25 + 1e-5)).epsilon(1e-12));
  auto loss = ag::sum(tape, ag::map(tape, y * y * 0.5 + y));
  tape.backward(loss);
  for (double g : values(x.grad())) CHECK(std::isfinite(g));
  // eps is used as given: a larger eps shrinks row 1.
  Tape tape2(exec);
  auto wide = nn::layer_norm(tape2, x, 0.75);
  CHECK(wide.value()(1, 0) == doctest::Approx(-1.5 / std::sqrt(1.25 + 0.75)).epsilon(1e-12));
}

TEST_CASE("NaN and inf through GEMM reach exactly the outputs that read them") {
  CpuExecutor exec(1);
  Tensor<float, host, dyn, dyn> a(Shape{3, 4}), b(Shape{4, 2}), c(Shape{3, 2});
  for (index_t i = 0; i < a.size(); ++i) a.data()[i] = 1.f;
  for (index_t i = 0; i < b.size(); ++i) b.data()[i] = 1.f;
  a.view()(1, 2) = nan_f;  // row 1 of the product
  b.view()(0, 1) = inf;    // column 1 of the product
  assign(c, matmul(a, b), exec);
  CHECK(c.view()(0, 0) == 4.f);
  CHECK(c.view()(2, 0) == 4.f);
  CHECK(std::isinf(c.view()(0, 1)));
  CHECK(std::isinf(c.view()(2, 1)));
  CHECK(std::isnan(c.view()(1, 0)));
  CHECK(std::isnan(c.view()(1, 1)));
  // inf * 0 is NaN: a zero in A's column 0 meets B's inf.
  a.view()(2, 0) = 0.f;
  assign(c, matmul(a, b), exec);
  CHECK(std::isnan(c.view()(2, 1)));
  CHECK(c.view()(2, 0) == 3.f);
}

TEST_CASE("two backward passes without zero_grad add their gradients; an intermediate stays readable after backward") {
  CpuExecutor exec(1);
  auto x = var<double>(2, 3, {0.5, -1, 2, 1.5, 0.25, -0.75}, true);
  auto w = var<double>(3, 2, {1, 2, -1, 0.5, 0.25, -2}, true);
  auto once = [&](Tape& tape) {
    auto h = ag::map(tape, kiln::tanh(ag::matmul(tape, x, w)));
    auto loss = ag::sum(tape, ag::map(tape, h * h));
    tape.backward(loss);
    return h;
  };
  Tape t1(exec);
  auto h = once(t1);
  const auto first_x = values(x.grad()), first_w = values(w.grad());
  // The intermediate h keeps its values after backward released the graph.
  const auto h_values = values(h.value());
  CHECK(h_values.size() == 4);
  CHECK(h.value()(0, 0) == doctest::Approx(std::tanh(0.5 * 1 + -1 * -1 + 2 * 0.25)).epsilon(1e-12));
  Tape t2(exec);
  (void)once(t2);  // no zero_grad between: the gradients add, as PyTorch's .grad does
  const auto second_x = values(x.grad()), second_w = values(w.grad());
  for (std::size_t i = 0; i < first_x.size(); ++i) CHECK(second_x[i] == doctest::Approx(2 * first_x[i]).epsilon(1e-14));
  for (std::size_t i = 0; i < first_w.size(); ++i) CHECK(second_w[i] == doctest::Approx(2 * first_w[i]).epsilon(1e-14));
}

TEST_CASE("Flatten's backward puts every element's gradient back in place") {
  CpuExecutor exec(1);
  Tape tape(exec);
  Tensor<double, host, dyn, dyn, dyn> images(Shape{2, 3, 4});
  for (index_t i = 0; i < images.size(); ++i) images.data()[i] = double(i) * 0.1;
  ag::Var<double, host, dyn, dyn, dyn> x(std::move(images), true);
  auto flat = nn::Flatten{}.forward(tape, x);
  CHECK(flat.dim(1) == 12);
  // loss = sum(c_i * flat_i) gives flat the gradient c exactly: element i gets weight i + 1.
  Tensor<double, host, dyn, dyn> weights(Shape{2, 12});
  for (index_t i = 0; i < weights.size(); ++i) weights.data()[i] = double(i + 1);
  ag::Var<double, host, dyn, dyn> c(std::move(weights), false);
  auto loss = ag::sum(tape, ag::map(tape, flat * c));
  tape.backward(loss);
  const auto g = values(x.grad());
  REQUIRE(g.size() == 24);
  for (std::size_t i = 0; i < g.size(); ++i) CHECK(g[i] == double(i + 1));
}

TEST_CASE("the error paths of the tape, layer_norm, the losses, dropout and autograd matmul name what was wrong") {
  CpuExecutor exec(1);
  Tape tape(exec);
  auto x = random_var(3, 4, 1, true);
  // The tape: a non-scalar loss; a loss that needs no gradient; a second backward of a freed graph.
  CHECK_THROWS_WITH_AS(tape.backward(x), doctest::Contains("needs a scalar loss, got shape [3, 4]"), ShapeError);
  auto constant = ag::sum(tape, ag::map(tape, random_var(2, 2, 2) * 2.f));
  CHECK_THROWS_WITH_AS(tape.backward(constant), doctest::Contains("does not depend on any variable"), ValueError);
  auto loss = ag::sum(tape, ag::map(tape, x * x));
  tape.backward(loss);
  CHECK_THROWS_WITH_AS(tape.backward(loss), doctest::Contains("already backwarded and its graph freed"), ValueError);
  // layer_norm's eps; labels that are null for rows that need them; dropout's p.
  CHECK_THROWS_WITH_AS(nn::layer_norm(tape, x, 0.0), doctest::Contains("eps must be > 0, got 0"), ValueError);
  CHECK_THROWS_WITH_AS(nn::cross_entropy(tape, x, static_cast<const std::int32_t*>(nullptr)),
                       doctest::Contains("labels is null for 3 rows"), ValueError);
  const std::int32_t bad[3] = {0, 4, 1};
  CHECK_THROWS_WITH_AS(nn::cross_entropy(tape, x, bad), doctest::Contains("the label of row 1 is 4, outside [0, 4)"),
                       ValueError);
  CHECK_THROWS_WITH_AS(nn::dropout(tape, x, 1.5, 1, 0), doctest::Contains("p must be in [0, 1], got 1.5"), ValueError);
  // Autograd matmul: inner sizes, with the transposes named.
  auto w = random_var(5, 3, 3, true);
  CHECK_THROWS_WITH_AS(ag::matmul(tape, x, w, false, true),
                       doctest::Contains("inner sizes differ: op(a) is [3, 4] (a [3, 4]), op(b) is [3, 5] (b [5, 3] transposed)"),
                       ShapeError);
}
