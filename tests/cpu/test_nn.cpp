// nn ops and layers: against PyTorch's values (tests/fixtures/golden_ops.txt), their launch
// counts (forward and backward one kernel each where promised), their errors, and the layer
// machinery (Sequential sizes, fusion, parameters, train / eval, seeded init).
#include <kiln.hpp>
#include <kiln/nn/activation.hpp>
#include <kiln/nn/dropout.hpp>
#include <kiln/nn/layernorm.hpp>
#include <kiln/nn/linear.hpp>
#include <kiln/nn/loss.hpp>
#include <kiln/nn/sequential.hpp>
#include <kiln/nn/softmax.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "fixture.hpp"

using namespace kiln;
using Tape = ag::Tape<CpuExecutor>;

namespace {

const kiln_test::FixtureBlock& golden(const std::string& name) { return kiln_test::golden_ops().at(name); }

// A [rows, cols] variable of T from a fixture block (rank 1 blocks become one row).
template <class T>
ag::Var<T, host, dyn, dyn> var_of(const kiln_test::FixtureBlock& b, bool requires_grad = false) {
  const index_t rows = b.dims.size() >= 2 ? b.dims[0] : 1;
  const index_t cols = b.dims.empty() ? 1 : b.dims.back();
  HostMatrix<T> m(rows, cols);
  for (index_t i = 0; i < m.size(); ++i) m.data()[i] = T(b.values[std::size_t(i)]);
  return ag::Var<T, host, dyn, dyn>(std::move(m), requires_grad);
}

template <class T>
ag::Var<T, host, dyn, dyn> filled(index_t rows, index_t cols, std::uint64_t seed, double lo = -2, double hi = 2,
                                  bool requires_grad = true) {
  HostMatrix<T> m(rows, cols);
  Generator g(seed);
  for (index_t i = 0; i < m.size(); ++i) m.data()[i] = T(g.uniform(float(lo), float(hi)));
  return ag::Var<T, host, dyn, dyn>(std::move(m), requires_grad);
}

// Every element within tol * max(1, |want|).
template <class T>
void check_values(const T* got, const std::vector<double>& want, double tol, const char* what) {
  for (std::size_t i = 0; i < want.size(); ++i) {
    INFO(what << " element " << i << ": got " << double(got[i]) << ", want " << want[i]);
    CHECK(std::abs(double(got[i]) - want[i]) <= tol * std::max(1.0, std::abs(want[i])));
  }
}

std::vector<std::int32_t> labels_of(const kiln_test::FixtureBlock& b) {
  std::vector<std::int32_t> l;
  for (double v : b.values) l.push_back(std::int32_t(v));
  return l;
}

}  // namespace

TEST_CASE_TEMPLATE("log_softmax and softmax match PyTorch", T, float, double) {
  const double tol = std::is_same_v<T, float> ? 2e-6 : 1e-13;
  CpuExecutor exec;
  Tape tape(exec);
  auto x = var_of<T>(golden("x"));
  auto ls = nn::log_softmax(tape, x);
  check_values(ls.value().data(), golden("log_softmax").values, tol, "log_softmax");
  auto sm = nn::softmax(tape, x);
  std::vector<double> want;
  for (double v : golden("log_softmax").values) want.push_back(std::exp(v));
  check_values(sm.value().data(), want, tol, "softmax");
  // Rows of softmax sum to one, even for huge logits.
  auto big = nn::softmax(tape, ag::map(tape, x * T(1000)));
  for (index_t r = 0; r < 3; ++r) {
    double s = 0;
    for (index_t c = 0; c < 5; ++c) s += double(big.value()(r, c));
    CHECK(s == doctest::Approx(1.0).epsilon(1e-6));
  }
}

TEST_CASE_TEMPLATE("cross_entropy matches PyTorch: loss and dlogits, mean / sum, label smoothing", T, float, double) {
  const double tol = std::is_same_v<T, float> ? 3e-6 : 1e-12;
  const auto labels = labels_of(golden("ce.target"));
  for (const char* tag : {"ce", "ce_ls0.1"})
    for (const char* red : {"mean", "sum"}) {
      const std::string name = std::string(tag) + "." + red;
      CAPTURE(name);
      CpuExecutor exec;
      Tape tape(exec);
      auto x = var_of<T>(golden("x"), true);
      nn::CrossEntropyOptions opt{.label_smoothing = std::string(tag) == "ce" ? 0.0 : 0.1,
                                  .reduction = std::string(red) == "mean" ? nn::loss_reduction::mean
                                                                          : nn::loss_reduction::sum};
      auto loss = nn::cross_entropy(tape, x, labels.data(), opt);
      check_values(loss.value().data(), golden(name).values, tol, "loss");
      tape.backward(loss);
      REQUIRE(x.has_grad());
      check_values(x.grad().data(), golden(name + ".dlogits").values, tol, "dlogits");
    }
}

TEST_CASE_TEMPLATE("layer_norm matches PyTorch: y, dx, dweight, dbias", T, float, double) {
  const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-12;
  CpuExecutor exec;
  Tape tape(exec);
  auto x = var_of<T>(golden("x"), true);
  auto w = var_of<T>(golden("ln.weight"), true);
  auto b = var_of<T>(golden("ln.bias"), true);
  auto dy = var_of<T>(golden("ln.dy"));
  auto y = nn::layer_norm(tape, x, w, b);
  check_values(y.value().data(), golden("ln.y").values, tol, "ln.y");
  // loss = sum(y * dy) seeds y's gradient with dy.
  tape.backward(ag::sum(tape, ag::map(tape, y * dy)));
  check_values(x.grad().data(), golden("ln.dx").values, tol, "ln.dx");
  check_values(w.grad().data(), golden("ln.dweight").values, tol, "ln.dweight");
  check_values(b.grad().data(), golden("ln.dbias").values, tol, "ln.dbias");
}

TEST_CASE("activations match PyTorch: values and derivatives") {
  for (const char* name : {"gelu", "gelu_tanh", "softplus", "silu"}) {
    CAPTURE(name);
    CpuExecutor exec;
    Tape tape(exec);
    auto x = var_of<double>(golden("act.x"), true);
    ag::Var<double, host, dyn, dyn> y;
    const std::string n = name;
    if (n == "gelu") y = nn::gelu(tape, x);
    else if (n == "gelu_tanh") y = nn::gelu_tanh(tape, x);
    else if (n == "softplus") y = nn::softplus(tape, x);
    else y = nn::silu(tape, x);
    check_values(y.value().data(), golden(n).values, 1e-12, "value");
    tape.backward(ag::sum(tape, y));
    check_values(x.grad().data(), golden(n + ".d").values, 1e-12, "derivative");
  }
}

TEST_CASE("one kernel forward and one kernel backward per row-wise op") {
  CpuExecutor exec;
  Tape tape(exec);
  auto x = filled<float>(8, 10, 1);
  auto count = [&](auto&& run) {
    const auto before = exec.stats().launches();
    run();
    return exec.stats().launches() - before;
  };
  const std::int32_t labels[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  ag::Var<float, host> loss;
  CHECK(count([&] { loss = nn::cross_entropy(tape, x, labels); }) == 1);
  CHECK(count([&] { tape.backward(loss); }) == 2);  // the seed fill + ONE backward kernel
  CHECK(exec.stats().launches(kind::loss) == 2);

  ag::Var<float, host, dyn, dyn> y;
  CHECK(count([&] { y = nn::log_softmax(tape, x); }) == 1);
  CHECK(count([&] { y = nn::softmax(tape, y); }) == 1);
  CHECK(count([&] { y = nn::dropout(tape, y, 0.5, 1, 0); }) == 1);
  CHECK(count([&] { loss = nn::mse_loss(tape, y, x); }) == 1);
  // seed + mse, dropout, softmax, log_softmax backward: one kernel each.
  CHECK(count([&] { tape.backward(loss); }) == 5);

  auto w = filled<float>(1, 10, 2), b = filled<float>(1, 10, 3);
  CHECK(count([&] { y = nn::layer_norm(tape, x, w, b); }) == 1);
  CHECK(count([&] { tape.backward(ag::sum(tape, y)); }) == 1 + 1 + 1 + 2);  // sum, seed, sum backward, dx + affine
  CHECK(count([&] { y = nn::dropout(tape, x, 0.5, 1, 0, false); }) == 0);  // eval: x itself
  CHECK(y.data() == x.data());
}

TEST_CASE("cross_entropy rejects bad labels with the row and the label") {
  CpuExecutor exec;
  Tape tape(exec);
  auto x = filled<float>(3, 4, 5);
  const std::int32_t bad[3] = {0, 3, 4};
  CHECK_THROWS_WITH_AS(nn::cross_entropy(tape, x, bad), doctest::Contains("row 2 is 4, outside [0, 4)"), ValueError);
  const std::int32_t negative[3] = {-1, 0, 0};
  CHECK_THROWS_WITH_AS(nn::cross_entropy(tape, x, negative), doctest::Contains("row 0 is -1"), ValueError);
  Tensor<std::int32_t, host, dyn> two(2);
  two.data()[0] = two.data()[1] = 0;
  CHECK_THROWS_AS(nn::cross_entropy(tape, x, two), ShapeError);
  const std::int32_t good[3] = {0, 1, 3};
  CHECK_THROWS_AS(nn::cross_entropy(tape, x, good, {.label_smoothing = 1.5}), ValueError);
  Tensor<std::int32_t, host, 3> t;
  for (int i = 0; i < 3; ++i) t.data()[i] = good[i];
  CHECK(nn::cross_entropy(tape, x, t).value().data()[0] == nn::cross_entropy(tape, x, good).value().data()[0]);
}

TEST_CASE("backward of a non-scalar dynamic loss is a ShapeError") {
  CpuExecutor exec;
  Tape tape(exec);
  auto x = filled<float>(3, 4, 6);
  auto y = nn::relu(tape, x);
  CHECK_THROWS_WITH_AS(tape.backward(y), doctest::Contains("scalar loss"), ShapeError);
  CHECK_THROWS_AS(nn::dropout(tape, x, 1.5, 0, 0), ValueError);
  CHECK_THROWS_AS(nn::mse_loss(tape, x, filled<float>(4, 3, 7)), ShapeError);
  CHECK_THROWS_AS(nn::layer_norm(tape, x, filled<float>(1, 3, 8), filled<float>(1, 4, 9)), ShapeError);
}

TEST_CASE("Linear: PyTorch layout, U(-1/sqrt(In), 1/sqrt(In)) init, seeded") {
  nn::Linear<16, 4> a(5), b(5), c(6);
  const float bound = 1.0f / 4.0f;
  for (index_t i = 0; i < 64; ++i) {
    CHECK(std::abs(a.weight().value().data()[i]) <= bound);
    CHECK(a.weight().value().data()[i] == b.weight().value().data()[i]);
  }
  CHECK(a.weight().shape() == Shape{4, 16});
  CHECK(a.bias().shape() == Shape{4});
  CHECK(std::abs(a.bias().value().data()[3]) <= bound);
  CHECK_FALSE(std::equal(a.weight().value().data(), a.weight().value().data() + 64, c.weight().value().data()));
  // The weight draws first, then the bias, from one generator.
  Generator g(5);
  for (int i = 0; i < 64; ++i) (void)g.uniform();
  CHECK(a.bias().value().data()[0] == g.uniform(-bound, bound));

  CpuExecutor exec;
  Tape tape(exec);
  auto x = filled<float>(3, 16, 11, -1, 1, false);
  auto y = a.forward(tape, x);
  for (index_t r = 0; r < 3; ++r)
    for (index_t o = 0; o < 4; ++o) {
      double want = a.bias().value()(o);
      for (index_t i = 0; i < 16; ++i) want += double(x.value()(r, i)) * double(a.weight().value()(o, i));
      CHECK(double(y.value()(r, o)) == doctest::Approx(want).epsilon(1e-5));
    }
  CHECK_THROWS_WITH_AS(a.forward(tape, filled<float>(3, 15, 12)), doctest::Contains("Linear<16, 4>"), ShapeError);
}

TEST_CASE("Sequential: sizes, fused Linear + activation, parameters, zero_grad, train / eval") {
  using Model = nn::Sequential<nn::Linear<12, 16>, nn::ReLU, nn::Dropout<>, nn::Linear<16, 8>, nn::GELU,
                               nn::LayerNorm<8>, nn::Linear<8, 4>>;
  static_assert(Model::in_features == 12 && Model::out_features == 4);
  static_assert(std::is_same_v<Model::value_type, float>);
  static_assert(nn::Sequential<nn::ReLU, nn::Tanh>::in_features == dyn);
  Model model(1);
  CHECK(model.parameter_count() == 12 * 16 + 16 + 16 * 8 + 8 + 8 + 8 + 8 * 4 + 4);
  const auto params = model.parameters();
  CHECK(params.size() == 8);
  CHECK(model.param_table().total_size() == model.parameter_count());

  CpuExecutor exec;
  exec.stats().set_recording(true);
  Tape tape(exec);
  auto x = filled<float>(5, 12, 13, -1, 1, false);
  model.eval();
  auto y = model.forward(tape, x);
  // eval: Linear+ReLU (one gemm with its epilogue), Dropout (none), Linear+GELU (one), LayerNorm (1), Linear (one).
  CHECK(exec.stats().launches() == 4);
  CHECK(exec.stats().launches(kind::gemm) == 3);
  CHECK(exec.stats().records()[0].name == "gemm+bias+relu");
  CHECK(exec.stats().records()[1].name == "gemm+bias+gelu");
  CHECK(exec.stats().records()[3].name == "gemm+bias");
  CHECK(y.shape() == Shape{5, 4});

  // Same values as running the layers one by one without fusion.
  auto h0 = model.layer<0>().forward(tape, x);
  auto h1 = model.layer<3>().forward(tape, nn::relu(tape, h0));
  auto h2 = model.layer<5>().forward(tape, nn::gelu(tape, h1));
  auto h3 = model.layer<6>().forward(tape, h2);
  for (index_t i = 0; i < 20; ++i) CHECK(h3.value().data()[i] == doctest::Approx(y.value().data()[i]).epsilon(1e-6));

  const std::int32_t labels[5] = {0, 1, 2, 3, 0};
  auto loss = nn::cross_entropy(tape, model.forward(tape, x), labels);
  tape.backward(loss);
  for (const auto& p : model.parameters()) CHECK(p.node->grad_valid);
  model.zero_grad();
  for (const auto& p : model.parameters()) CHECK_FALSE(p.node->grad_valid);

  model.train();
  CHECK(model.training());
  CHECK(model.layer<2>().training());
  model.eval();
  CHECK_FALSE(model.layer<2>().training());

  // Same seed, same parameters; a different seed, different ones.
  Model again(1), other(2);
  const auto pa = again.parameters(), po = other.parameters();
  CHECK(std::equal(params[0].value, params[0].value + params[0].size, pa[0].value));
  CHECK_FALSE(std::equal(params[0].value, params[0].value + params[0].size, po[0].value));
}

TEST_CASE("Flatten: identity for 2-D, one copy kernel each way for 4-D; Sequential from layer values") {
  CpuExecutor exec;
  Tape tape(exec);
  auto x2 = filled<float>(3, 4, 21);
  CHECK(nn::Flatten{}.forward(tape, x2).data() == x2.data());

  Tensor<double, host, dyn, 2, 3, 2> t(4, 2, 3, 2);
  for (index_t i = 0; i < t.size(); ++i) t.data()[i] = 0.1 * double(i) - 1.0;
  ag::Var<double, host, dyn, 2, 3, 2> x4(std::move(t), true);
  const auto before = exec.stats().launches();
  auto flat = nn::Flatten{}.forward(tape, x4);
  static_assert(std::is_same_v<decltype(flat), ag::Var<double, host, dyn, 12>>);
  CHECK(exec.stats().launches() - before == 1);
  CHECK(flat.shape() == Shape{4, 12});
  CHECK(flat.value()(2, 7) == x4.value()(2, 1, 0, 1));
  auto w = filled<double>(1, 12, 22, -1, 1, false);
  tape.backward(ag::sum(tape, ag::map(tape, flat * w)));
  CHECK(x4.grad()(3, 1, 0, 1) == w.value()(0, 7));

  // A Sequential built from layer values (a custom dropout probability and seed).
  nn::Sequential<nn::Linear<12, 5>, nn::Dropout<0.2>, nn::Sigmoid> seq(nn::Linear<12, 5>(3), nn::Dropout<0.2>(99),
                                                                       nn::Sigmoid{});
  CHECK(seq.layer<1>().p() == 0.2);
  CHECK(seq.layer<1>().seed() == 99);
  auto y = seq.forward(tape, filled<float>(2, 12, 23));
  CHECK(y.shape() == Shape{2, 5});
}
