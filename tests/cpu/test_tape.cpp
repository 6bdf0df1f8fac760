// The tape's semantics (autograd/tape.hpp): backward(loss) runs exactly loss's graph, two losses
// backwarded in turn give the gradients of their sum (separate heads and a shared trunk alike),
// freed graphs throw, retain_graph, graphs die with their results, the growth warning, and a
// force_eager tape in a file that compiled no force_eager forms.
//
// This file turns the ops' force_eager forms off (kiln/config.hpp): the last case needs ops whose
// forms no file of the suite compiles.
#define KILN_FORCE_EAGER_FORMS 0
#include <kiln.hpp>
#include <kiln/core/warning.hpp>
#include <kiln/nn/activation.hpp>
#include <kiln/nn/linear.hpp>
#include <kiln/nn/loss.hpp>
#include <kiln/nn/sequential.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

using namespace kiln;
using Tape = ag::Tape<CpuExecutor>;

namespace {

using Head = nn::Sequential<nn::Linear<4, 3>>;
using X = ag::Var<float, host, dyn, 4>;

X input() {
  X x(Tensor<float, host, dyn, 4>(2, 4));
  for (int i = 0; i < 8; ++i) x.value().data()[i] = 0.1f * float(i + 1);
  return x;
}
const std::int32_t labels[2] = {0, 2};

// Every gradient of a model, flattened in parameter order (empty entries: no gradient).
template <class M>
std::vector<std::vector<float>> grads_of(const M& m) {
  std::vector<std::vector<float>> out;
  m.for_each_parameter([&](const auto& v) {
    if (!v.has_grad()) out.emplace_back();
    else out.emplace_back(v.grad().data(), v.grad().data() + v.grad().size());
  });
  return out;
}

// Captures kiln warnings while alive.
struct WarningCapture {
  std::vector<std::string> seen;
  WarningHandler previous = set_warning_handler([this](const std::string& m) { seen.push_back(m); });
  ~WarningCapture() { set_warning_handler(previous); }
};

}  // namespace

TEST_CASE("tape: two losses backwarded in turn give both heads the gradients of one backward of their sum") {
  // The reproduction: before, the first backward cleared the tape and head b got nothing.
  CpuExecutor exec(1);
  Tape tape(exec);
  Head a(1), b(2);
  X x = input();
  auto la = nn::cross_entropy(tape, a.forward(tape, x), labels);
  auto lb = nn::cross_entropy(tape, b.forward(tape, x), labels);
  a.zero_grad();
  b.zero_grad();
  tape.backward(la);
  CHECK(a.layer<0>().weight().has_grad());
  CHECK_FALSE(b.layer<0>().weight().has_grad());  // b's graph was left for its own backward
  CHECK(tape.size() == 2);                         // lb's loss step and its Linear
  tape.backward(lb);
  CHECK(b.layer<0>().weight().has_grad());
  CHECK(tape.size() == 0);

  Head a2(1), b2(2);
  auto sum = ag::map(tape, nn::cross_entropy(tape, a2.forward(tape, x), labels) +
                               nn::cross_entropy(tape, b2.forward(tape, x), labels));
  tape.backward(sum);
  CHECK(grads_of(a) == grads_of(a2));
  CHECK(grads_of(b) == grads_of(b2));
}

TEST_CASE("tape: a shared trunk backwarded once per head accumulates exactly the sum's gradients") {
  using Trunk = nn::Sequential<nn::Linear<4, 5>, nn::ReLU>;
  using Top = nn::Sequential<nn::Linear<5, 3>>;
  CpuExecutor exec(1);
  Tape tape(exec);
  X x = input();

  Trunk trunk(7);
  Top a(8), b(9);
  {
    auto h = trunk.forward(tape, x);
    auto la = nn::cross_entropy(tape, a.forward(tape, h), labels);
    auto lb = nn::cross_entropy(tape, b.forward(tape, h), labels);
    tape.backward(la);  // the trunk's step stays: b's graph still consumes h
    CHECK(tape.size() == 3);
    tape.backward(lb);
    CHECK(tape.size() == 0);
  }

  Trunk trunk2(7);
  Top a2(8), b2(9);
  auto h = trunk2.forward(tape, x);
  tape.backward(ag::map(tape, nn::cross_entropy(tape, a2.forward(tape, h), labels) +
                                  nn::cross_entropy(tape, b2.forward(tape, h), labels)));
  // The same GEMMs in another grouping: equal to rounding, not bit for bit.
  const auto g1 = grads_of(trunk), g2 = grads_of(trunk2);
  REQUIRE(g1.size() == g2.size());
  for (std::size_t p = 0; p < g1.size(); ++p) {
    REQUIRE(g1[p].size() == g2[p].size());
    REQUIRE_FALSE(g1[p].empty());
    for (std::size_t i = 0; i < g1[p].size(); ++i) CHECK(g1[p][i] == doctest::Approx(g2[p][i]).epsilon(1e-6));
  }
  CHECK(grads_of(a) == grads_of(a2));
  CHECK(grads_of(b) == grads_of(b2));
}

TEST_CASE("tape: backward twice on a freed graph throws with a sentence; retain_graph keeps it") {
  CpuExecutor exec(1);
  Tape tape(exec);
  Head a(1);
  X x = input();
  auto loss = nn::cross_entropy(tape, a.forward(tape, x), labels);
  a.zero_grad();
  tape.backward(loss, {.retain_graph = true});
  const auto once = grads_of(a);
  tape.backward(loss);  // runs again: leaf gradients accumulate, as in PyTorch
  const auto twice = grads_of(a);
  for (std::size_t p = 0; p < once.size(); ++p)
    for (std::size_t i = 0; i < once[p].size(); ++i) CHECK(twice[p][i] == doctest::Approx(2 * once[p][i]));
  CHECK_THROWS_WITH_AS(tape.backward(loss), doctest::Contains("already backwarded and its graph freed"), ValueError);
  CHECK(grads_of(a) == twice);  // the failed call changed nothing
}

TEST_CASE("tape: intermediate gradients start afresh in each backward; leaf gradients accumulate") {
  CpuExecutor exec(1);
  Tape tape(exec);
  ag::Var<double, host, dyn, dyn> w(HostMatrix<double>(2, 3), true);
  for (index_t i = 0; i < 6; ++i) w.value().data()[i] = 0.5 * double(i) - 1.0;
  auto h = ag::map(tape, w * 3.0);
  auto loss = ag::sum(tape, ag::map(tape, h * h));
  tape.backward(loss, {.retain_graph = true});
  tape.backward(loss);
  for (index_t i = 0; i < 6; ++i) {
    const double wi = w.value().data()[i];
    CHECK(h.grad().data()[i] == doctest::Approx(2 * 3 * wi));       // d loss / d h, this backward only
    CHECK(w.grad().data()[i] == doctest::Approx(2 * (2 * 9 * wi)));  // two backwards' worth
  }
}

TEST_CASE("tape: a loss that depends on a freed result throws before running anything") {
  CpuExecutor exec(1);
  Tape tape(exec);
  ag::Var<double, host, dyn, dyn> w(HostMatrix<double>(2, 2), true);
  for (index_t i = 0; i < 4; ++i) w.value().data()[i] = double(i);
  auto h = ag::map(tape, w * 2.0);
  tape.backward(ag::sum(tape, h));
  w.zero_grad();
  auto again = ag::sum(tape, ag::map(tape, h * h));
  CHECK_THROWS_WITH_AS(tape.backward(again), doctest::Contains("graph an earlier backward() freed"), ValueError);
  CHECK_FALSE(w.has_grad());
}

TEST_CASE("tape: a graph lives as long as its result; steps from a destroyed tape still run") {
  CpuExecutor exec(1);
  Head a(1);
  X x = input();
  ag::Var<float, host, dyn, 3> logits;
  {
    Tape first(exec);
    {
      auto dropped = a.forward(first, x);
      CHECK(first.size() == 1);
    }
    CHECK(first.size() == 0);  // the result died, and its graph with it
    logits = a.forward(first, x);
  }
  Tape second(exec);
  a.zero_grad();
  second.backward(nn::cross_entropy(second, logits, labels));
  CHECK(a.layer<0>().weight().has_grad());
  CHECK(a.layer<0>().bias().has_grad());
}

TEST_CASE("tape: backward frees each result as soon as its step ran, not at the end; held results stay") {
  // PyTorch's order: by the time the first layer's gradients are final, the second layer's
  // output (whose step ran earlier) is gone with its gradient, so activations and gradients are
  // not all alive together at backward's peak. A result the caller holds keeps value and gradient.
  CpuExecutor exec(1);
  nn::Linear<4, 3> first(1);
  nn::Linear<3, 3> second(2);
  Tape tape(exec);
  auto h = first.forward(tape, input());
  auto y = second.forward(tape, h);
  const std::weak_ptr<ag::VarNode> y_node = y.data();
  auto loss = nn::cross_entropy(tape, y, labels);
  y = {};
  bool y_gone_when_first_ready = false, checked = false;
  tape.backward(loss, {.on_leaf_ready = [&](ag::VarNode& leaf) {
                  if (&leaf != first.weight().data().get()) return;
                  checked = true;
                  y_gone_when_first_ready = y_node.expired();
                }});
  CHECK(checked);
  CHECK(y_gone_when_first_ready);
  REQUIRE(h.has_grad());  // held by the caller: its gradient is still there
  CHECK(h.grad().size() == 6);
  CHECK(first.weight().has_grad());
}

TEST_CASE("tape: evaluation forwards whose results are dropped leave nothing behind and do not warn") {
  WarningCapture warnings;
  CpuExecutor exec(1);
  Tape tape(exec);
  Head a(1);
  X x = input();
  for (int i = 0; i < 2000; ++i) {
    auto logits = a.forward(tape, x);  // outside NoGrad: recorded, then freed with `logits`
    CHECK(logits.requires_grad());
  }
  CHECK(tape.size() == 0);
  for (int step = 0; step < 2000; ++step) {
    auto loss = nn::cross_entropy(tape, a.forward(tape, x), labels);
    a.zero_grad();
    tape.backward(loss);
  }
  CHECK(tape.size() == 0);
  CHECK(warnings.seen.empty());
}

TEST_CASE("tape: results kept alive without a backward make the tape warn, once") {
  WarningCapture warnings;
  CpuExecutor exec(1);
  Head a(1);
  X x = input();
  {
    Tape tape(exec, {.warn_alive_steps = 50});
    std::vector<ag::Var<float, host, dyn, 3>> kept;
    for (int i = 0; i < 50; ++i) kept.push_back(a.forward(tape, x));
    CHECK(warnings.seen.empty());
    for (int i = 0; i < 100; ++i) kept.push_back(a.forward(tape, x));
    CHECK(tape.size() == 150);
    REQUIRE(warnings.seen.size() == 1);
    CHECK(warnings.seen[0].find("51 backward steps") != std::string::npos);
    CHECK(warnings.seen[0].find("NoGrad") != std::string::npos);
  }
  {
    Tape tape(exec);  // the default limit
    std::vector<ag::Var<float, host, dyn, 3>> kept;
    for (int i = 0; i < 1100; ++i) kept.push_back(a.forward(tape, x));
    CHECK(warnings.seen.size() == 2);
  }
  {
    Tape tape(exec);
    ag::NoGrad no_grad;
    std::vector<ag::Var<float, host, dyn, 3>> kept;
    for (int i = 0; i < 1100; ++i) kept.push_back(a.forward(tape, x));
    CHECK(tape.size() == 0);
    CHECK(warnings.seen.size() == 2);
  }
}

TEST_CASE("Var::item reads a one-element variable; other shapes throw") {
  CpuExecutor exec(1);
  Tape tape(exec);
  Head a(1);
  X x = input();
  auto loss = nn::cross_entropy(tape, a.forward(tape, x), labels);
  CHECK(loss.item() == loss.value().data()[0]);
  CHECK(loss.item() > 0.0f);
  CHECK_THROWS_WITH_AS(x.item(), doctest::Contains("one-element variable, got shape [2, 4]"), ShapeError);
}

// An activation only this file uses (in a named namespace: ODR-safe with the forms off): a linear
// op's forms are compiled per activation and element type, whatever the sizes, so no other file
// of the suite compiles its force_eager form.
namespace tape_test {
struct Triple {
  static constexpr const char* name = "triple";
  template <class T> KILN_HOST_DEVICE T operator()(T x) const { return T(3) * x; }
  template <class T> KILN_HOST_DEVICE T d(T) const { return T(3); }
};
}  // namespace tape_test

// This file compiles no force_eager forms (KILN_FORCE_EAGER_FORMS 0), and no file of the suite
// runs these ops on these types: their forms are compiled nowhere (KILN_WEAK), and the ops say so.
TEST_CASE("force_eager: an op whose eager form no file compiled names the header that compiles it") {
  CpuExecutor exec(1);
  ag::Var<double, host, dyn, 5> x(Tensor<double, host, dyn, 5>(3, 5), true);
  for (int i = 0; i < 15; ++i) x.value().data()[i] = 0.25 * double(i) - 1.0;
  Tape fused(exec);
  const auto y = ag::map(fused, x * 7.0 - x);
  CHECK(y.value().data()[1] == doctest::Approx(6.0 * (0.25 - 1.0)));

  Tape eager(exec, {.force_eager = true});
  CHECK_THROWS_WITH_AS(ag::map(eager, x * 7.0 - x), doctest::Contains("reached ag::map"), ValueError);
  CHECK_THROWS_WITH_AS(ag::map(eager, x * 7.0 - x), doctest::Contains("#include <kiln/force_eager.hpp>"), ValueError);
  ag::Var<double, host, 2, 5> w(Tensor<double, host, 2, 5>(2, 5), true);
  ag::Var<double, host, 2> b(Tensor<double, host, 2>(2), true);
  for (int i = 0; i < 10; ++i) w.value().data()[i] = 0.1 * double(i);
  b.value().data()[0] = b.value().data()[1] = 0.5;
  CHECK_THROWS_WITH_AS(ag::linear<tape_test::Triple>(eager, x, w, b), doctest::Contains("reached ag::linear"),
                       ValueError);
  // The tape is left as it was: a fused tape still runs the same ops.
  const auto h = ag::linear<tape_test::Triple>(fused, x, w, b);
  REQUIRE(h.shape() == Shape{3, 2});
  double expected = 0.5;  // row 0, column 1: 3 (x0 · w1 + b1)
  for (int i = 0; i < 5; ++i) expected += x.value().data()[i] * w.value().data()[5 + i];
  CHECK(h.value().data()[1] == doctest::Approx(3.0 * expected));
}
