// Optimizers, gradient clipping, lr schedules and batch-size rules: against PyTorch's values
// (tests/fixtures/golden_ops.txt), against their formulas on hand-worked single elements and a
// double-precision reference, and for the properties the fused loop promises (a table of many
// parameters equals each parameter alone, any thread count gives the same bits, one launch a step).
#include <kiln/backend/cpu/executor.hpp>
#include <kiln/core/error.hpp>
#include <kiln/core/stats.hpp>
#include <kiln/nn/linear.hpp>
#include <kiln/nn/sequential.hpp>
#include <kiln/optim/adam.hpp>
#include <kiln/optim/batch_scaling.hpp>
#include <kiln/optim/clip.hpp>
#include <kiln/optim/param.hpp>
#include <kiln/optim/schedule.hpp>
#include <kiln/optim/sgd.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <numbers>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "fixture.hpp"

using kiln::index_t;
using kiln::optim::ParamTable;

namespace {

// |got - want| <= rel * max(|want|, floor): relative, with an absolute floor for values near 0.
bool close(double got, double want, double rel, double floor = 1e-9) {
  return std::fabs(got - want) <= rel * std::max(std::fabs(want), floor);
}

// One parameter with its own storage.
struct Param {
  std::vector<float> value, grad;
  explicit Param(index_t n = 0) : value(std::size_t(n)), grad(std::size_t(n)) {}
  kiln::optim::ParamSlot slot() { return {value.data(), grad.data(), index_t(value.size())}; }
};

// Fills v in place: a ParamTable points into v, so v must keep its buffer.
void randomize(std::vector<float>& v, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> u(lo, hi);
  for (float& x : v) x = u(rng);
}

// Runs three fixture steps of `make(table)` on opt.p0 with opt.grads and checks each row of `block`.
template <class Make>
void check_against_fixture(const char* block, Make make) {
  const auto& f = kiln_test::golden_ops();
  const auto& p0 = f.at("opt.p0");
  const auto& grads = f.at("opt.grads");
  const auto& want = f.at(block);
  REQUIRE(want.dims == std::vector<std::int64_t>{3, 5});
  Param p(5);
  for (int i = 0; i < 5; ++i) p.value[std::size_t(i)] = float(p0.values[std::size_t(i)]);
  auto opt = make(ParamTable{p.slot()});
  kiln::CpuExecutor exec;
  for (int k = 0; k < 3; ++k) {
    for (int i = 0; i < 5; ++i) p.grad[std::size_t(i)] = float(grads.values[std::size_t(k * 5 + i)]);
    opt.step(exec);
    for (int i = 0; i < 5; ++i) {
      const double w = want.values[std::size_t(k * 5 + i)];
      INFO(block, " step ", k + 1, " element ", i, ": got ", p.value[std::size_t(i)], ", PyTorch ", w);
      CHECK(close(p.value[std::size_t(i)], w, 1e-6));
    }
  }
}

// Double-precision reference of torch's single-tensor Adam / AdamW, one element.
struct RefAdam {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, wd = 0.0;
  bool decoupled = false, amsgrad = false, maximize = false;
  double m = 0, v = 0, vmax = 0;
  int t = 0;
  void step(double& p, double g) {
    ++t;
    if (maximize) g = -g;
    if (decoupled) p *= 1 - lr * wd;
    else g += wd * p;
    m = beta1 * m + (1 - beta1) * g;
    v = beta2 * v + (1 - beta2) * g * g;
    vmax = std::max(vmax, v);
    const double denom = std::sqrt(amsgrad ? vmax : v) / std::sqrt(1 - std::pow(beta2, t)) + eps;
    p -= lr / (1 - std::pow(beta1, t)) * m / denom;
  }
};

}  // namespace

// ---- PyTorch fixture ---------------------------------------------------------------------------

TEST_CASE("optim: SGD (momentum 0.9, nesterov, weight_decay 1e-4) matches torch.optim.SGD") {
  check_against_fixture("sgd.p", [](ParamTable t) {
    return kiln::optim::SGD(std::move(t), {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-4, .nesterov = true});
  });
}

TEST_CASE("optim: Adam (defaults, lr 1e-3) matches torch.optim.Adam") {
  check_against_fixture("adam.p", [](ParamTable t) { return kiln::optim::Adam(std::move(t), {}); });
}

TEST_CASE("optim: AdamW (lr 1e-3, weight_decay 1e-2) matches torch.optim.AdamW") {
  check_against_fixture("adamw.p", [](ParamTable t) { return kiln::optim::AdamW(std::move(t), {.lr = 1e-3}); });
}

TEST_CASE("optim: defaults are PyTorch's") {
  const kiln::optim::AdamOptions a;
  CHECK(a.lr == 1e-3);
  CHECK(a.beta1 == 0.9);
  CHECK(a.beta2 == 0.999);
  CHECK(a.eps == 1e-8);
  CHECK(a.weight_decay == 0.0);
  CHECK_FALSE(a.amsgrad);
  const kiln::optim::AdamWOptions w;
  CHECK(w.weight_decay == 1e-2);
  CHECK(w.lr == 1e-3);
  const kiln::optim::SgdOptions s;
  CHECK(s.momentum == 0.0);
  CHECK(s.dampening == 0.0);
  CHECK_FALSE(s.nesterov);
}

// ---- formulas on single elements -----------------------------------------------------------------

TEST_CASE("optim: SGD single-element cases worked by hand") {
  kiln::CpuExecutor exec;
  auto run = [&](kiln::optim::SgdOptions o, std::vector<float> grads) {
    Param p(1);
    p.value[0] = 1.0f;
    kiln::optim::SGD opt(ParamTable{p.slot()}, o);
    for (float g : grads) {
      p.grad[0] = g;
      opt.step(exec);
    }
    return double(p.value[0]);
  };
  // plain: 1 - 0.1 * 0.5
  CHECK(run({.lr = 0.1}, {0.5f}) == doctest::Approx(0.95).epsilon(1e-7));
  // weight decay: d = 0.5 + 0.1 * 1 = 0.6
  CHECK(run({.lr = 0.1, .weight_decay = 0.1}, {0.5f}) == doctest::Approx(0.94).epsilon(1e-7));
  // maximize climbs
  CHECK(run({.lr = 0.1, .maximize = true}, {0.5f}) == doctest::Approx(1.05).epsilon(1e-7));
  // momentum with dampening: buf1 = 0.5 (no dampening on the first step), p = 0.95;
  // buf2 = 0.9 * 0.5 + 0.9 * 0.5 = 0.9, p = 0.95 - 0.09 = 0.86
  CHECK(run({.lr = 0.1, .momentum = 0.9, .dampening = 0.1}, {0.5f, 0.5f}) == doctest::Approx(0.86).epsilon(1e-7));
  // nesterov: buf1 = 0.5, d = 0.5 + 0.9 * 0.5 = 0.95, p = 1 - 0.095
  CHECK(run({.lr = 0.1, .momentum = 0.9, .nesterov = true}, {0.5f}) == doctest::Approx(0.905).epsilon(1e-7));
  // nesterov step 2 with g = -1: buf = 0.45 - 1 = -0.55, d = -1 - 0.495 = -1.495, p = 0.905 + 0.1495
  CHECK(run({.lr = 0.1, .momentum = 0.9, .nesterov = true}, {0.5f, -1.0f}) ==
        doctest::Approx(1.0545).epsilon(1e-7));
}

TEST_CASE("optim: Adam and AdamW single-element first steps worked by hand") {
  kiln::CpuExecutor exec;
  // After step 1 the bias corrections make m_hat = g and v_hat = g^2, so
  // p1 = p0 - lr * g / (|g| + eps) (Adam, wd 0), and AdamW first scales p0 by 1 - lr * wd.
  Param p(2);
  p.value = {1.0f, -2.0f};
  p.grad = {0.5f, -0.25f};
  kiln::optim::Adam adam(ParamTable{p.slot()}, {.lr = 0.01});
  adam.step(exec);
  CHECK(p.value[0] == doctest::Approx(1.0 - 0.01 * 0.5 / (0.5 + 1e-8)).epsilon(1e-7));
  CHECK(p.value[1] == doctest::Approx(-2.0 + 0.01 * 0.25 / (0.25 + 1e-8)).epsilon(1e-7));
  CHECK(adam.exp_avg()[0] == doctest::Approx(0.05).epsilon(1e-7));
  CHECK(adam.exp_avg_sq()[0] == doctest::Approx(0.00025).epsilon(1e-7));
  CHECK(adam.steps() == 1);

  p.value = {1.0f, -2.0f};
  kiln::optim::AdamW adamw(ParamTable{p.slot()}, {.lr = 0.01, .weight_decay = 0.1});
  adamw.step(exec);
  CHECK(p.value[0] == doctest::Approx(1.0 * (1 - 0.001) - 0.01 * 0.5 / (0.5 + 1e-8)).epsilon(1e-7));
  CHECK(p.value[1] == doctest::Approx(-2.0 * (1 - 0.001) + 0.01 * 0.25 / (0.25 + 1e-8)).epsilon(1e-7));

  // Adam's L2 decay goes into the gradient instead: g = 0.5 + 0.1 * 1 = 0.6, still a step of lr.
  p.value = {1.0f, -2.0f};
  kiln::optim::Adam adam_l2(ParamTable{p.slot()}, {.lr = 0.01, .weight_decay = 0.1});
  adam_l2.step(exec);
  CHECK(p.value[0] == doctest::Approx(1.0 - 0.01 * 0.6 / (0.6 + 1e-8)).epsilon(1e-7));
  CHECK(adam_l2.exp_avg()[0] == doctest::Approx(0.06).epsilon(1e-7));
}

TEST_CASE("optim: Adam / AdamW follow the double reference over many steps (amsgrad, maximize)") {
  struct Case {
    bool decoupled, amsgrad, maximize;
    double wd;
  };
  const Case cases[] = {{false, false, false, 0.0}, {false, false, false, 0.05}, {true, false, false, 0.01},
                        {false, true, false, 0.0},  {true, true, false, 0.02},   {false, false, true, 0.01},
                        {true, false, true, 0.01}};
  kiln::CpuExecutor exec;
  for (const Case& c : cases) {
    CAPTURE(c.decoupled);
    CAPTURE(c.amsgrad);
    CAPTURE(c.maximize);
    std::mt19937 rng(7);
    Param p(3);
    p.value = {0.5f, -1.5f, 0.0f};
    std::vector<double> ref_p(p.value.begin(), p.value.end());
    std::vector<RefAdam> ref(3);
    for (auto& r : ref) {
      r.lr = 1e-2;
      r.wd = c.wd;
      r.decoupled = c.decoupled;
      r.amsgrad = c.amsgrad;
      r.maximize = c.maximize;
    }
    auto run = [&](auto& opt) {
      for (int t = 0; t < 20; ++t) {
        // Large early gradients then small ones: v decays, so amsgrad's v_max differs from v.
        const float scale = t < 5 ? 1.0f : 0.01f;
        randomize(p.grad, rng, -scale, scale);
        opt.step(exec);
        for (int i = 0; i < 3; ++i) ref[std::size_t(i)].step(ref_p[std::size_t(i)], p.grad[std::size_t(i)]);
      }
      for (int i = 0; i < 3; ++i) {
        INFO("element ", i, ": got ", p.value[std::size_t(i)], ", reference ", ref_p[std::size_t(i)]);
        CHECK(close(p.value[std::size_t(i)], ref_p[std::size_t(i)], 2e-6));
      }
    };
    if (c.decoupled) {
      kiln::optim::AdamW opt(ParamTable{p.slot()},
                             {.lr = 1e-2, .weight_decay = c.wd, .amsgrad = c.amsgrad, .maximize = c.maximize});
      run(opt);
      CHECK(opt.max_exp_avg_sq().size() == (c.amsgrad ? 3u : 0u));
    } else {
      kiln::optim::Adam opt(ParamTable{p.slot()},
                            {.lr = 1e-2, .weight_decay = c.wd, .amsgrad = c.amsgrad, .maximize = c.maximize});
      run(opt);
    }
  }
}

TEST_CASE("optim: the per-element update functions are usable on their own") {
  // What a CUDA kernel calls: one element, scalars precomputed by make_adam_params.
  const auto h = kiln::optim::make_adam_params(1e-3, 0.9, 0.999, 1e-8, 1e-2, true, false, 1);
  float p = 2.0f, m = 0.0f, v = 0.0f;
  kiln::optim::adamw_update(p, 0.0f, m, v, h);
  CHECK(p == doctest::Approx(2.0 * (1 - 1e-5)).epsilon(1e-7));  // zero gradient: only the decay acts
  CHECK(m == 0.0f);
  CHECK(v == 0.0f);

  const kiln::optim::SgdParams plain{0.1f, 0.0f, 1.0f, 0.0f, false, false, false};
  float q = 1.0f;
  kiln::optim::sgd_update(q, 2.0f, plain);
  CHECK(q == doctest::Approx(0.8).epsilon(1e-7));
  // With momentum: the first step sets buf to the gradient whatever it held.
  const kiln::optim::SgdParams first{0.1f, 0.9f, 1.0f, 0.0f, false, false, true};
  float r = 1.0f, buf = 42.0f;
  kiln::optim::sgd_update(r, 2.0f, buf, first);
  CHECK(buf == 2.0f);
  CHECK(r == doctest::Approx(0.8).epsilon(1e-7));
}

// ---- the fused loop over a table ------------------------------------------------------------------

namespace {

// Parameter sizes chosen to cross chunk boundaries: empty, single, odd, and large enough that
// the executor splits the flat range across threads in the middle of a parameter.
const std::vector<index_t> kSizes = {3, 0, 1, 1000, 70001, 17};

std::vector<Param> make_params(std::mt19937& rng) {
  std::vector<Param> ps;
  for (index_t n : kSizes) {
    Param p(n);
    randomize(p.value, rng);
    ps.push_back(std::move(p));
  }
  return ps;
}

// Three steps of make(table) over all params in one table, with the given thread count.
template <class Make>
std::vector<Param> run_table(Make make, int threads) {
  std::mt19937 rng(42);
  std::vector<Param> ps = make_params(rng);
  ParamTable table;
  for (Param& p : ps) table.add(p.slot());
  auto opt = make(table);
  kiln::CpuExecutor exec(threads);
  for (int t = 0; t < 3; ++t) {
    for (Param& p : ps) randomize(p.grad, rng);
    opt.step(exec);
  }
  return ps;
}

// The same, each parameter with its own optimizer (same random draws, same order).
template <class Make>
std::vector<Param> run_separately(Make make) {
  std::mt19937 rng(42);
  std::vector<Param> ps = make_params(rng);
  std::vector<decltype(make(ParamTable{}))> opts;
  for (Param& p : ps) opts.push_back(make(ParamTable{p.slot()}));
  kiln::CpuExecutor exec(1);
  for (int t = 0; t < 3; ++t) {
    for (Param& p : ps) randomize(p.grad, rng);
    for (auto& o : opts) o.step(exec);
  }
  return ps;
}

template <class Make>
void check_table_equals_separate(Make make) {
  const auto together = run_table(make, 4);
  const auto alone = run_separately(make);
  const auto one_thread = run_table(make, 1);
  for (std::size_t k = 0; k < kSizes.size(); ++k) {
    CAPTURE(k);
    // Bitwise: the per-element math is the same whatever the table or thread split.
    CHECK(together[k].value == alone[k].value);
    CHECK(together[k].value == one_thread[k].value);
  }
}

}  // namespace

TEST_CASE("optim: one table of many parameters equals each parameter alone, at any thread count") {
  SUBCASE("SGD") {
    check_table_equals_separate(
        [](ParamTable t) { return kiln::optim::SGD(std::move(t), {.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3}); });
  }
  SUBCASE("Adam") {
    check_table_equals_separate([](ParamTable t) { return kiln::optim::Adam(std::move(t), {.weight_decay = 1e-3}); });
  }
  SUBCASE("AdamW amsgrad") {
    check_table_equals_separate([](ParamTable t) { return kiln::optim::AdamW(std::move(t), {.amsgrad = true}); });
  }
}

TEST_CASE("optim: ParamTable offsets, spans and argument checks") {
  Param a(3), b(0), c(5);
  ParamTable t{a.slot(), b.slot(), c.slot()};
  CHECK(t.count() == 3);
  CHECK(t.total_size() == 8);
  CHECK(t.offset(0) == 0);
  CHECK(t.offset(1) == 3);
  CHECK(t.offset(2) == 3);
  std::vector<std::vector<index_t>> spans;
  t.for_each_span(2, 6, [&](const kiln::optim::ParamSlot& s, index_t lb, index_t le, index_t fb) {
    spans.push_back({s.size, lb, le, fb});
  });
  CHECK(spans == std::vector<std::vector<index_t>>{{3, 2, 3, 2}, {5, 0, 3, 3}});
  CHECK_THROWS_WITH_AS(t.add(nullptr, nullptr, 4), doctest::Contains("non-null"), kiln::ValueError);
  CHECK_THROWS_WITH_AS(t.add(a.value.data(), a.grad.data(), -1), doctest::Contains("size -1"), kiln::ValueError);
}

TEST_CASE("optim: each step is one optimizer launch; zero_grad is one launch and zeroes every grad") {
  std::mt19937 rng(3);
  std::vector<Param> ps = make_params(rng);
  ParamTable table;
  for (Param& p : ps) {
    randomize(p.grad, rng);
    table.add(p.slot());
  }
  kiln::CpuExecutor exec(4);
  kiln::optim::AdamW adamw(table, {});
  kiln::optim::SGD sgd(table, {.lr = 0.1, .momentum = 0.9});
  adamw.step(exec);
  CHECK(exec.stats().launches() == 1);
  CHECK(exec.stats().launches(kiln::kind::optimizer) == 1);
  sgd.step(exec);
  CHECK(exec.stats().launches(kiln::kind::optimizer) == 2);
  CHECK(exec.stats().launches() == 2);

  exec.stats().reset();
  adamw.zero_grad(exec);
  CHECK(exec.stats().launches() == 1);
  for (const Param& p : ps)
    CHECK(std::all_of(p.grad.begin(), p.grad.end(), [](float g) { return g == 0.0f; }));
}

TEST_CASE("optim: set_lr, set_momentum and set_beta1 take effect at the next step") {
  kiln::CpuExecutor exec;
  Param p(1);
  p.value[0] = 1.0f;
  p.grad[0] = 1.0f;
  kiln::optim::SGD sgd(ParamTable{p.slot()}, {.lr = 0.1});
  sgd.set_lr(0.25);
  CHECK(sgd.lr() == 0.25);
  sgd.step(exec);
  CHECK(p.value[0] == doctest::Approx(0.75));
  // Momentum switched on later: the buffer starts then, from that step's gradient.
  CHECK(sgd.momentum_buffer().empty());
  sgd.set_momentum(0.5);
  sgd.step(exec);
  CHECK(sgd.momentum_buffer().size() == 1);
  CHECK(sgd.momentum_buffer()[0] == 1.0f);
  CHECK(p.value[0] == doctest::Approx(0.5));

  kiln::optim::Adam adam(ParamTable{p.slot()}, {});
  adam.set_beta1(0.5);
  adam.step(exec);
  CHECK(adam.exp_avg()[0] == doctest::Approx(0.5));
}

TEST_CASE("optim: bad arguments throw ValueError naming the argument") {
  Param p(2);
  const ParamTable t{p.slot()};
  using kiln::ValueError;
  using kiln::optim::Adam;
  using kiln::optim::AdamW;
  using kiln::optim::SGD;
  CHECK_THROWS_WITH_AS(SGD(t, {.lr = -0.1}), doctest::Contains("lr must"), ValueError);
  CHECK_THROWS_WITH_AS(SGD(t, {.lr = std::nan("")}), doctest::Contains("lr must"), ValueError);
  CHECK_THROWS_WITH_AS(SGD(t, {.lr = 0.1, .momentum = -1}), doctest::Contains("momentum must"), ValueError);
  CHECK_THROWS_WITH_AS(SGD(t, {.lr = 0.1, .weight_decay = -1}), doctest::Contains("weight_decay must"), ValueError);
  CHECK_THROWS_WITH_AS(SGD(t, {.lr = 0.1, .nesterov = true}), doctest::Contains("nesterov"), ValueError);
  CHECK_THROWS_WITH_AS(SGD(t, {.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .nesterov = true}),
                       doctest::Contains("nesterov"), ValueError);
  CHECK_THROWS_WITH_AS(Adam(t, {.lr = -1e-3}), doctest::Contains("Adam: lr must"), ValueError);
  CHECK_THROWS_WITH_AS(Adam(t, {.beta1 = 1.0}), doctest::Contains("beta1 must"), ValueError);
  CHECK_THROWS_WITH_AS(Adam(t, {.beta1 = -0.1}), doctest::Contains("beta1 must"), ValueError);
  CHECK_THROWS_WITH_AS(AdamW(t, {.beta2 = 1.5}), doctest::Contains("AdamW: beta2 must"), ValueError);
  CHECK_THROWS_WITH_AS(AdamW(t, {.eps = 0.0}), doctest::Contains("eps must"), ValueError);
  CHECK_THROWS_WITH_AS(AdamW(t, {.eps = -1e-8}), doctest::Contains("eps must"), ValueError);
  CHECK_THROWS_WITH_AS(AdamW(t, {.weight_decay = -0.01}), doctest::Contains("weight_decay must"), ValueError);

  // Setters check too, and leave the optimizer unchanged when they throw.
  SGD sgd(t, {.lr = 0.1, .momentum = 0.9, .nesterov = true});
  CHECK_THROWS_WITH_AS(sgd.set_lr(-1), doctest::Contains("lr must"), ValueError);
  CHECK_THROWS_WITH_AS(sgd.set_momentum(0.0), doctest::Contains("nesterov"), ValueError);
  CHECK(sgd.lr() == 0.1);
  CHECK(sgd.momentum() == 0.9);
  AdamW adamw(t, {});
  CHECK_THROWS_WITH_AS(adamw.set_beta1(1.0), doctest::Contains("beta1 must"), ValueError);
  CHECK(adamw.beta1() == 0.9);
}

// ---- one API in every memory space ------------------------------------------------------------

namespace {
// Anything with param_table() and a memory space is a model to an optimizer.
struct TableModel {
  using space = kiln::host;
  Param* p;
  ParamTable param_table() const { return ParamTable{p->slot()}; }
};
}  // namespace

TEST_CASE("optim: SGD, Adam and AdamW deduce their memory space from a table or a model") {
  using kiln::host;
  using namespace kiln::optim;
  Param p(3);
  std::fill(p.value.begin(), p.value.end(), 1.0f);
  const ParamTable t{p.slot()};
  // From a table: host optimizers.
  SGD sgd(t, {.lr = 0.1});
  Adam adam(t, {});
  AdamW adamw(t, {.lr = 1e-2});
  static_assert(std::is_same_v<decltype(sgd), SGD<host>>);
  static_assert(std::is_same_v<decltype(adam), Adam<host>>);
  static_assert(std::is_same_v<decltype(adamw), AdamW<host>>);
  static_assert(std::is_same_v<SGD<>, SGD<host>> && std::is_same_v<AdamW<>, AdamW<host>>);
  static_assert(std::is_same_v<Sgd, SGD<host>>);  // the old spelling
  static_assert(std::is_same_v<decltype(adamw)::Options, AdamWOptions> && std::is_same_v<SGD<>::Options, SgdOptions>);
  static_assert(std::is_same_v<decltype(adamw)::space, host>);

  // From a model: its space and its param_table().
  using Net = kiln::nn::Sequential<kiln::nn::Linear<4, 3>, kiln::nn::Linear<3, 2>>;
  static_assert(param_model<Net> && !param_model<ParamTable>);
  Net net(1);
  AdamW from_net(net, {.lr = 1e-2, .weight_decay = 0.5});
  SGD sgd_net(net, {.lr = 0.1, .momentum = 0.9});
  static_assert(std::is_same_v<decltype(from_net), AdamW<host>>);
  static_assert(std::is_same_v<decltype(sgd_net), SGD<host>>);
  CHECK(from_net.table().count() == 4);
  CHECK(from_net.table().total_size() == net.param_table().total_size());
  CHECK(from_net.table()[0].value == net.param_table()[0].value);
  kiln::CpuExecutor exec;
  const float w0 = net.param_table()[0].value[0];
  from_net.zero_grad(exec, /*set_to_none=*/false);  // zeros that count: AdamW decays every parameter
  from_net.step(exec);
  CHECK(net.param_table()[0].value[0] == w0 * float(1.0 - 1e-2 * 0.5));
  CHECK(from_net.param_steps(3) == 1);

  TableModel m{&p};
  Adam adam_m(m, {.lr = 0.5});
  static_assert(std::is_same_v<decltype(adam_m), Adam<host>>);
  p.grad = {1.0f, -1.0f, 0.0f};
  adam_m.step(exec);
  CHECK(p.value[0] == doctest::Approx(0.5));  // Adam's first step moves by lr * sign(g)
  CHECK(p.value[1] == doctest::Approx(1.5));
  CHECK(p.value[2] == 1.0f);
}

// The launches of one step are known at compile time, for constexpr options.
static_assert(kiln::optim::AdamW<>::launches(false, {.lr = 1e-3}, 6) == 1);
static_assert(kiln::optim::AdamW<>::launches(true, {.lr = 1e-3}, 6) == 14 * 6);  // decay, m 3, v 4, p 6
static_assert(kiln::optim::AdamW<>::launches(true, {.weight_decay = 0.0, .amsgrad = true}, 2) == 14 * 2);
static_assert(kiln::optim::Adam<>::launches(true, {.weight_decay = 0.1, .maximize = true}, 1) == 3 + 13);
static_assert(kiln::optim::SGD<>::launches(true, {.lr = 0.1}, 5) == 2 * 5);
static_assert(kiln::optim::SGD<>::launches(true, {.lr = 0.1, .momentum = 0.9, .nesterov = true}, 2) == 6 * 2);
static_assert(kiln::optim::SGD<>::launches(true, {.momentum = 0.9, .dampening = 0.1, .weight_decay = 1e-4}, 1) == 7);
static_assert(kiln::optim::SGD<>::launches(false, {.momentum = 0.9}, 100) == 1);

// ---- gradient clipping -----------------------------------------------------------------------------

namespace {
struct ClipSetup {
  std::vector<Param> ps;
  ParamTable table;
  explicit ClipSetup(float scale) {
    std::mt19937 rng(11);
    ps = make_params(rng);
    for (Param& p : ps) {
      randomize(p.grad, rng, -scale, scale);
      table.add(p.slot());
    }
  }
  // The p-norm computed directly in long double, one flat loop.
  long double direct_norm(double p) const {
    long double acc = 0;
    for (const Param& q : ps)
      for (float g : q.grad) {
        const long double a = std::fabs((long double)g);
        acc = std::isinf(p) ? std::max(acc, a) : acc + std::pow(a, (long double)p);
      }
    return std::isinf(p) ? acc : std::pow(acc, 1.0L / (long double)p);
  }
};
}  // namespace

TEST_CASE("optim: clip_grad_norm returns the total norm and scales by max_norm / (norm + 1e-6)") {
  ClipSetup s(1.0f);
  const auto before = s.ps;
  const long double want = s.direct_norm(2.0);
  kiln::CpuExecutor exec(4);
  const double norm = kiln::optim::clip_grad_norm(s.table, 1.0, exec);
  CHECK(close(norm, double(want), 1e-12));
  CHECK(exec.stats().launches(kiln::kind::reduce) == 1);
  CHECK(exec.stats().launches() == 2);  // the reduction and the scaling pass
  const float coef = float(1.0 / (norm + 1e-6));
  for (std::size_t k = 0; k < s.ps.size(); ++k)
    for (std::size_t i = 0; i < s.ps[k].grad.size(); ++i) REQUIRE(s.ps[k].grad[i] == before[k].grad[i] * coef);
  // Afterwards the norm is max_norm (up to the 1e-6 and float rounding).
  CHECK(close(kiln::optim::grad_norm(s.table, exec), 1.0, 1e-5));
}

TEST_CASE("optim: clip_grad_norm leaves small gradients alone and runs no scaling pass") {
  ClipSetup s(1e-4f);
  const auto before = s.ps;
  kiln::CpuExecutor exec;
  const double norm = kiln::optim::clip_grad_norm(s.table, 10.0, exec);
  CHECK(close(norm, double(s.direct_norm(2.0)), 1e-12));
  CHECK(exec.stats().launches() == 1);
  for (std::size_t k = 0; k < s.ps.size(); ++k) CHECK(s.ps[k].grad == before[k].grad);
}

TEST_CASE("optim: grad_norm for norm types 1, 3 and infinity; the result does not depend on threads") {
  ClipSetup s(1.0f);
  kiln::CpuExecutor one(1), many(4);
  const double inf = std::numeric_limits<double>::infinity();
  for (double p : {1.0, 2.0, 3.0, inf}) {
    CAPTURE(p);
    const double got = kiln::optim::grad_norm(s.table, many, p);
    CHECK(close(got, double(s.direct_norm(p)), 1e-12));
    CHECK(got == kiln::optim::grad_norm(s.table, one, p));
  }
}

TEST_CASE("optim: clip_grad_norm on a tiny hand case, on NaN, and bad arguments") {
  Param p(2);
  p.grad = {3.0f, 4.0f};
  const ParamTable t{p.slot()};
  kiln::CpuExecutor exec;
  CHECK(kiln::optim::clip_grad_norm(t, 1.0, exec) == 5.0);
  CHECK(p.grad[0] == float(3.0 * float(1.0 / (5.0 + 1e-6))));
  CHECK(p.grad[1] == doctest::Approx(0.8).epsilon(1e-6));

  p.grad = {3.0f, std::nanf("")};
  CHECK_THROWS_AS(kiln::optim::clip_grad_norm(t, 1.0, exec, 2.0, true), kiln::NumericError);
  CHECK(p.grad[0] == 3.0f);  // untouched when it throws
  CHECK(std::isnan(kiln::optim::clip_grad_norm(t, 1.0, exec)));
  CHECK(std::isnan(p.grad[0]));  // as torch: a NaN norm poisons the gradients visibly

  CHECK_THROWS_WITH_AS(kiln::optim::clip_grad_norm(t, -1.0, exec), doctest::Contains("max_norm"), kiln::ValueError);
  CHECK_THROWS_WITH_AS(kiln::optim::clip_grad_norm(t, 1.0, exec, 0.0), doctest::Contains("norm_type"),
                       kiln::ValueError);
}

// ---- schedules ------------------------------------------------------------------------------------------

TEST_CASE("schedule: OneCycleLr lr and momentum match torch's OneCycleLR(max_lr 0.1, total_steps 20)") {
  const auto& f = kiln_test::golden_ops();
  const auto& lr = f.at("onecycle.lr").values;
  const auto& mom = f.at("onecycle.momentum").values;
  REQUIRE(lr.size() == 20);
  const kiln::optim::OneCycleLr s(0.1, 20);
  for (index_t k = 0; k < 20; ++k) {
    CAPTURE(k);
    CHECK(close(s.lr(k), lr[std::size_t(k)], 1e-12));
    CHECK(close(s.momentum(k), mom[std::size_t(k)], 1e-12));
  }
  CHECK(s.initial_lr() == doctest::Approx(0.004));
  // Relative (scale 0): doctest's default Approx adds 1.2e-5 absolute, which 0 would pass.
  CHECK(s.min_lr() == doctest::Approx(4e-7).scale(0).epsilon(1e-6));
  CHECK_NOTHROW(s.lr(20));  // torch computes it too, after the last step
  CHECK_THROWS_WITH_AS(s.lr(21), doctest::Contains("past total_steps"), kiln::ValueError);
  CHECK_THROWS_WITH_AS(s.lr(-1), doctest::Contains("step must"), kiln::ValueError);
}

TEST_CASE("schedule: OneCycleLr three_phase and linear anneal follow PyTorch's phase boundaries") {
  // total 10, pct 0.3: phase ends at 2, 4, 9. initial 1, max 10 (div 10), min 0.1 (final_div 10).
  const kiln::optim::OneCycleLr s(10.0, 10,
                                  {.anneal = kiln::optim::Anneal::linear, .div_factor = 10.0, .final_div_factor = 10.0,
                                   .three_phase = true});
  CHECK(s.lr(0) == doctest::Approx(1.0));
  CHECK(s.lr(1) == doctest::Approx(5.5));
  CHECK(s.lr(2) == doctest::Approx(10.0));
  CHECK(s.lr(3) == doctest::Approx(5.5));
  CHECK(s.lr(4) == doctest::Approx(1.0));
  CHECK(s.lr(9) == doctest::Approx(0.1));
  CHECK(s.momentum(2) == doctest::Approx(0.85));
  CHECK(s.momentum(4) == doctest::Approx(0.95));
  CHECK(s.momentum(7) == doctest::Approx(0.95));
  // A warmup phase of zero length (pct_start * total == 1) starts at the peak instead of dividing by 0.
  const kiln::optim::OneCycleLr z(1.0, 10, {.pct_start = 0.1});
  CHECK(z.lr(0) == doctest::Approx(1.0));
  CHECK_THROWS_WITH_AS(kiln::optim::OneCycleLr(0.1, 0), doctest::Contains("total_steps"), kiln::ValueError);
  CHECK_THROWS_WITH_AS(kiln::optim::OneCycleLr(0.1, 10, {.pct_start = 1.5}), doctest::Contains("pct_start"),
                       kiln::ValueError);
  CHECK_THROWS_WITH_AS(kiln::optim::OneCycleLr(-0.1, 10), doctest::Contains("max_lr"), kiln::ValueError);
}

TEST_CASE("schedule: CosineAnnealingLr matches torch's CosineAnnealingLR(T_max 10, eta_min 0.001)") {
  const auto& want = kiln_test::golden_ops().at("cosine.lr").values;
  REQUIRE(want.size() == 11);
  const kiln::optim::CosineAnnealingLr s(0.1, 10, 0.001);
  for (index_t k = 0; k <= 10; ++k) {
    CAPTURE(k);
    CHECK(close(s.lr(k), want[std::size_t(k)], 1e-12));
  }
  CHECK(s.lr(20) == doctest::Approx(0.1));  // periodic past t_max, as torch's
  CHECK_THROWS_WITH_AS(kiln::optim::CosineAnnealingLr(0.1, 0), doctest::Contains("t_max"), kiln::ValueError);
}

TEST_CASE("schedule: StepLr, ConstantLr and WarmupCosineLr by hand") {
  const kiln::optim::StepLr st(0.1, 3, 0.5);
  CHECK(st.lr(0) == 0.1);
  CHECK(st.lr(2) == 0.1);
  CHECK(st.lr(3) == 0.05);
  CHECK(st.lr(8) == 0.025);
  CHECK(st.lr(9) == doctest::Approx(0.0125));
  CHECK(kiln::optim::ConstantLr(0.3).lr(1000) == 0.3);

  const kiln::optim::WarmupCosineLr wc(4, 14, 1.0, 0.1);
  CHECK(wc.lr(0) == 0.25);
  CHECK(wc.lr(1) == 0.5);
  CHECK(wc.lr(3) == 1.0);
  CHECK(wc.lr(4) == doctest::Approx(1.0));                                      // cosine starts at base_lr
  CHECK(wc.lr(9) == doctest::Approx(0.55));                                     // halfway: (1 + 0.1) / 2
  CHECK(wc.lr(6) == doctest::Approx(0.1 + 0.9 * (1 + std::cos(std::numbers::pi * 0.2)) / 2));
  CHECK(wc.lr(14) == 0.1);
  CHECK(wc.lr(100) == 0.1);
  const kiln::optim::WarmupCosineLr no_warmup(0, 10, 1.0);
  CHECK(no_warmup.lr(0) == 1.0);
  CHECK(no_warmup.lr(5) == doctest::Approx(0.5));

  static_assert(kiln::optim::LrSchedule<kiln::optim::OneCycleLr>);
  static_assert(kiln::optim::LrSchedule<kiln::optim::WarmupCosineLr>);
  CHECK_THROWS_WITH_AS(kiln::optim::StepLr(0.1, 0), doctest::Contains("step_size"), kiln::ValueError);
  CHECK_THROWS_WITH_AS(kiln::optim::StepLr(-0.1, 1), doctest::Contains("base_lr"), kiln::ValueError);
  CHECK_THROWS_WITH_AS(kiln::optim::WarmupCosineLr(5, 4, 1.0), doctest::Contains("total_steps"), kiln::ValueError);
  CHECK_THROWS_WITH_AS(kiln::optim::WarmupCosineLr(-1, 4, 1.0), doctest::Contains("warmup_steps"), kiln::ValueError);
  CHECK_THROWS_WITH_AS(kiln::optim::WarmupCosineLr(1, 4, 1.0, -1.0), doctest::Contains("min_lr"), kiln::ValueError);
  CHECK_THROWS_WITH_AS(kiln::optim::ConstantLr(-1.0), doctest::Contains("lr must"), kiln::ValueError);
}

TEST_CASE("schedule: driving an optimizer from a schedule") {
  Param p(1);
  kiln::optim::SGD opt(ParamTable{p.slot()}, {.lr = 0.1, .momentum = 0.9});
  const kiln::optim::OneCycleLr s(0.1, 20);
  kiln::CpuExecutor exec;
  for (index_t k = 0; k < 20; ++k) {
    opt.set_lr(s.lr(k));
    opt.set_momentum(s.momentum(k));
    opt.step(exec);
  }
  CHECK(opt.lr() == doctest::Approx(4e-7).scale(0).epsilon(1e-6));
  CHECK(opt.momentum() == doctest::Approx(0.95));
  CHECK(opt.steps() == 20);
}

// ---- batch-size scaling -----------------------------------------------------------------------------------

TEST_CASE("batch scaling: linear (Goyal et al.) and square-root rules") {
  using kiln::optim::BatchScaling;
  CHECK(kiln::optim::linear_scaling(0.1, 256, 1024) == doctest::Approx(0.4));
  CHECK(kiln::optim::linear_scaling(0.1, 256, 64) == doctest::Approx(0.025));
  CHECK(kiln::optim::sqrt_scaling(1e-3, 64, 256) == doctest::Approx(2e-3).scale(0).epsilon(1e-12));
  CHECK(kiln::optim::sqrt_scaling(1e-3, 256, 64) == doctest::Approx(5e-4).scale(0).epsilon(1e-12));
  CHECK(kiln::optim::scale_lr(BatchScaling::linear, 0.1, 100, 300) == doctest::Approx(0.3));
  CHECK(kiln::optim::scale_lr(BatchScaling::sqrt, 0.1, 100, 400) == doctest::Approx(0.2));
  CHECK(kiln::optim::linear_scaling(0.1, 32, 32) == 0.1);
  CHECK_THROWS_WITH_AS(kiln::optim::linear_scaling(0.1, 0, 32), doctest::Contains("base_batch"), kiln::ValueError);
  CHECK_THROWS_WITH_AS(kiln::optim::sqrt_scaling(0.1, 32, -4), doctest::Contains("batch must"), kiln::ValueError);
  CHECK_THROWS_WITH_AS(kiln::optim::linear_scaling(-0.1, 32, 64), doctest::Contains("base_lr"), kiln::ValueError);
}

// ---- the fixture reader ----------------------------------------------------------------------------------

TEST_CASE("fixture: golden_ops.txt reads with dims and values") {
  const auto& f = kiln_test::golden_ops();
  const auto& g = f.at("opt.grads");
  CHECK(g.dims == std::vector<std::int64_t>{3, 5});
  CHECK(g.values.size() == 15);
  CHECK(g.values[4] == 1.0);
  CHECK(f.at("ce.target").values == std::vector<double>{1, 0, 4});
  CHECK(f.count("x") == 1);
}
