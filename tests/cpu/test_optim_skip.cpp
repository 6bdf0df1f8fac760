// Parameters without a gradient this step (issue 16, item 2: "optimizers apply stale gradients"),
// and ParamTable concatenation. A slot whose has_grad flag is false must be skipped by every
// optimizer, grad_norm and clipping exactly as PyTorch skips `.grad is None`: value and state
// untouched bit for bit, Adam's t and SGD's momentum buffer kept per parameter. Checked against
// torch.optim (tests/fixtures/golden_optim_skip.txt, scripts/golden_optim_skip.py), against a
// per-parameter double-precision reference over random gradient patterns, and on the issue's
// two-heads model.
#include <kiln.hpp>
#include <kiln/nn/linear.hpp>
#include <kiln/nn/loss.hpp>
#include <kiln/nn/sequential.hpp>
#include <kiln/optim/adam.hpp>
#include <kiln/optim/clip.hpp>
#include <kiln/optim/param.hpp>
#include <kiln/optim/sgd.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "fixture.hpp"

using kiln::index_t;
using kiln::optim::ParamTable;

namespace {

// Parameters with their own storage and a has_grad flag each (flags live apart from the vectors,
// so the table's pointers survive moves).
struct Params {
  std::vector<std::vector<float>> value, grad;
  std::unique_ptr<bool[]> flag;
  ParamTable table;

  explicit Params(const std::vector<index_t>& sizes, std::uint32_t seed = 1)
      : flag(std::make_unique<bool[]>(sizes.size())) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      value.emplace_back(std::size_t(sizes[k]));
      grad.emplace_back(std::size_t(sizes[k]));
      for (float& x : value[k]) x = u(rng);
      flag[k] = true;
    }
    for (std::size_t k = 0; k < sizes.size(); ++k)
      table.add(value[k].data(), grad[k].data(), index_t(sizes[k]), &flag[k]);
  }
  std::size_t count() const { return value.size(); }
};

// Every state buffer an optimizer keeps (copied), in a fixed order.
std::vector<std::vector<float>> state_of(const kiln::optim::SGD<>& o) {
  return {std::vector<float>(o.momentum_buffer().begin(), o.momentum_buffer().end())};
}
template <class Adam>
std::vector<std::vector<float>> state_of(const Adam& o) {
  auto copy = [](std::span<const float> s) { return std::vector<float>(s.begin(), s.end()); };
  return {copy(o.exp_avg()), copy(o.exp_avg_sq()), copy(o.max_exp_avg_sq())};
}

// Parameter k's piece of a flat state buffer (empty when the buffer is).
std::vector<float> piece(const std::vector<float>& flat, const ParamTable& t, index_t k) {
  if (flat.empty()) return {};
  return std::vector<float>(flat.begin() + t.offset(k), flat.begin() + t.offset(k) + t[k].size);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// The configurations the issue names, as one type so the tests can loop over them.
struct Config {
  std::string name;
  // One step in either stance, with a guard (set by make()).
  std::function<void(kiln::CpuExecutor&, kiln::optim::StepGuard, bool eager)> run;
  std::function<std::vector<std::vector<float>>()> state;  // every state buffer
  std::function<index_t(index_t)> param_steps;             // Adam's per-parameter t (0 for SGD)
  std::function<bool(index_t)> started;                    // SGD's buffer starts (false for Adam)
  std::function<index_t(bool, index_t)> launches;          // Opt::launches(eager, options, tensors)
  std::shared_ptr<void> holder;
  void step(kiln::CpuExecutor& exec, kiln::optim::StepGuard guard = {}, bool eager = false) const {
    run(exec, guard, eager);
  }
};

template <class Opt, class Options>
Config make_config(const std::string& name, ParamTable table, const Options& o) {
  auto opt = std::make_shared<Opt>(std::move(table), o);
  Config c;
  c.name = name;
  c.run = [opt](kiln::CpuExecutor& exec, kiln::optim::StepGuard guard, bool eager) {
    if (eager) opt->template step<kiln::stance::force_eager>(exec, guard);
    else opt->step(exec, guard);
  };
  c.state = [opt] { return state_of(*opt); };
  if constexpr (requires { opt->param_steps(0); }) c.param_steps = [opt](index_t k) { return opt->param_steps(k); };
  else c.param_steps = [](index_t) { return index_t(0); };
  if constexpr (requires { opt->has_momentum_buffer(0); })
    c.started = [opt](index_t k) { return opt->has_momentum_buffer(k); };
  else c.started = [](index_t) { return false; };
  c.launches = [o](bool eager, index_t tensors) { return Opt::launches(eager, o, tensors); };
  c.holder = opt;
  return c;
}

const char* const kConfigNames[] = {"sgd",  "sgd_momentum",  "sgd_nesterov_wd", "sgd_maximize_dampened",
                                    "adam", "adam_amsgrad",  "adamw",           "adamw_amsgrad"};
// More option sets for the guard, stance and launch-count tests (no fixture or reference of their own).
const char* const kExtraConfigNames[] = {"sgd_maximize", "adam_maximize_l2_amsgrad", "adamw_maximize_no_decay",
                                         "adamw_defaults"};

Config make_named(const std::string& name, ParamTable t) {
  using namespace kiln::optim;
  if (name == "sgd") return make_config<SGD<>>(name, std::move(t), SgdOptions{.lr = 0.1});
  if (name == "sgd_momentum")
    return make_config<SGD<>>(name, std::move(t), SgdOptions{.lr = 0.1, .momentum = 0.9, .dampening = 0.1});
  if (name == "sgd_nesterov_wd")
    return make_config<SGD<>>(name, std::move(t),
                              SgdOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true});
  if (name == "sgd_maximize_dampened")
    return make_config<SGD<>>(
        name, std::move(t), SgdOptions{.lr = 0.05, .momentum = 0.5, .dampening = 0.3, .weight_decay = 0.1, .maximize = true});
  if (name == "sgd_maximize") return make_config<SGD<>>(name, std::move(t), SgdOptions{.lr = 0.05, .maximize = true});
  if (name == "adam") return make_config<Adam<>>(name, std::move(t), AdamOptions{.lr = 1e-2, .weight_decay = 0.1});
  if (name == "adam_amsgrad") return make_config<Adam<>>(name, std::move(t), AdamOptions{.lr = 1e-2, .amsgrad = true});
  if (name == "adam_maximize_l2_amsgrad")
    return make_config<Adam<>>(name, std::move(t),
                               AdamOptions{.lr = 1e-2, .weight_decay = 0.05, .amsgrad = true, .maximize = true});
  if (name == "adamw") return make_config<AdamW<>>(name, std::move(t), AdamWOptions{.lr = 1e-2, .weight_decay = 0.1});
  if (name == "adamw_amsgrad")
    return make_config<AdamW<>>(name, std::move(t), AdamWOptions{.lr = 1e-2, .weight_decay = 0.1, .amsgrad = true});
  if (name == "adamw_maximize_no_decay")
    return make_config<AdamW<>>(name, std::move(t), AdamWOptions{.lr = 1e-2, .weight_decay = 0.0, .maximize = true});
  if (name == "adamw_defaults") return make_config<AdamW<>>(name, std::move(t), AdamWOptions{});
  FAIL("unknown optimizer configuration ", name);
  return {};
}

std::vector<std::string> all_config_names() {
  std::vector<std::string> out(std::begin(kConfigNames), std::end(kConfigNames));
  out.insert(out.end(), std::begin(kExtraConfigNames), std::end(kExtraConfigNames));
  return out;
}

// Per-parameter double-precision reference of torch.optim's single-tensor SGD / Adam / AdamW:
// state is created and advanced only on steps where the parameter has a gradient.
struct RefParam {
  std::vector<double> p, buf, m, v, vmax;
  bool has_buf = false;
  int t = 0;
  explicit RefParam(const std::vector<float>& init)
      : p(init.begin(), init.end()), buf(init.size()), m(init.size()), v(init.size()), vmax(init.size()) {}

  void step(const std::string& cfg, const std::vector<float>& grad) {
    struct S {
      double lr, momentum, dampening, wd;
      bool nesterov, maximize;
    };
    struct A {
      double lr, wd;
      bool decoupled, amsgrad;
    };
    if (cfg.rfind("sgd", 0) == 0) {
      const S s = cfg == "sgd"                   ? S{0.1, 0, 0, 0, false, false}
                  : cfg == "sgd_momentum"        ? S{0.1, 0.9, 0.1, 0, false, false}
                  : cfg == "sgd_nesterov_wd"     ? S{0.1, 0.9, 0, 0.01, true, false}
                                                 : S{0.05, 0.5, 0.3, 0.1, false, true};
      for (std::size_t i = 0; i < p.size(); ++i) {
        double d = s.maximize ? -double(grad[i]) : double(grad[i]);
        if (s.wd != 0) d += s.wd * p[i];
        if (s.momentum != 0) {
          buf[i] = has_buf ? s.momentum * buf[i] + (1 - s.dampening) * d : d;
          d = s.nesterov ? d + s.momentum * buf[i] : buf[i];
        }
        p[i] -= s.lr * d;
      }
      has_buf = has_buf || s.momentum != 0;
      return;
    }
    const A a = cfg == "adam"           ? A{1e-2, 0.1, false, false}
                : cfg == "adam_amsgrad" ? A{1e-2, 0.0, false, true}
                : cfg == "adamw"        ? A{1e-2, 0.1, true, false}
                                        : A{1e-2, 0.1, true, true};
    ++t;
    const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
    for (std::size_t i = 0; i < p.size(); ++i) {
      double g = grad[i];
      if (a.decoupled) p[i] *= 1 - a.lr * a.wd;
      else g += a.wd * p[i];
      m[i] = b1 * m[i] + (1 - b1) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      vmax[i] = std::max(vmax[i], v[i]);
      const double denom = std::sqrt(a.amsgrad ? vmax[i] : v[i]) / std::sqrt(1 - std::pow(b2, t)) + eps;
      p[i] -= a.lr / (1 - std::pow(b1, t)) * m[i] / denom;
    }
  }
};

const kiln_test::Fixture& golden_skip() {
  static const kiln_test::Fixture f = kiln_test::load_fixture(kiln_test::fixture_path("golden_optim_skip.txt"));
  return f;
}

}  // namespace

TEST_CASE("optim skip: per-parameter semantics match torch.optim when .grad is None on some steps") {
  // Steps {a, b}, {a, c}, {a, b, c}, {b}: b skips a step, c starts late (its momentum buffer
  // and Adam's t begin at step 2), a skips the last.
  const auto& f = golden_skip();
  const std::vector<std::string> names = {"a", "b", "c"};
  const auto& active = f.at("skip.active").values;
  for (const std::string cfg : kConfigNames) {
    if (cfg == "sgd_maximize_dampened") continue;  // not in the fixture
    CAPTURE(cfg);
    std::vector<index_t> sizes;
    for (const auto& n : names) sizes.push_back(index_t(f.at("skip.p0." + n).values.size()));
    Params ps(sizes);
    for (std::size_t k = 0; k < 3; ++k)
      for (std::size_t i = 0; i < ps.value[k].size(); ++i) ps.value[k][i] = float(f.at("skip.p0." + names[k]).values[i]);
    Config c = make_named(cfg, ps.table);
    kiln::CpuExecutor exec(2);
    for (std::size_t s = 0; s < 4; ++s) {
      for (std::size_t k = 0; k < 3; ++k) {
        ps.flag[k] = active[s * 3 + k] != 0;
        // A parameter without a gradient keeps a stale buffer: the previous step's values, doubled.
        const auto& g = f.at("skip.grad." + names[k]).values;
        for (std::size_t i = 0; i < ps.grad[k].size(); ++i)
          ps.grad[k][i] = ps.flag[k] ? float(g[s * ps.grad[k].size() + i]) : 2.0f * ps.grad[k][i] + 1.0f;
      }
      c.step(exec);
      for (std::size_t k = 0; k < 3; ++k) {
        const auto& want = f.at(std::string("skip.") + cfg + "." + names[k]).values;
        for (std::size_t i = 0; i < ps.value[k].size(); ++i) {
          const double w = want[s * ps.value[k].size() + i], got = ps.value[k][i];
          INFO(cfg, " step ", s + 1, " parameter ", names[k], "[", i, "]: got ", got, ", PyTorch ", w);
          CHECK(std::fabs(got - w) <= 2e-6 * std::max(std::fabs(w), 1.0));
        }
      }
    }
    // Adam's t per parameter: a 3, b 3, c 2 — while step() ran 4 times.
    if (c.param_steps(0) != 0) {
      CHECK(c.param_steps(0) == 3);
      CHECK(c.param_steps(1) == 3);
      CHECK(c.param_steps(2) == 2);
    }
  }
}

TEST_CASE("optim skip: a parameter without a gradient is bit-for-bit unchanged, value and state") {
  // Sizes large enough that the executor splits the flat range inside a parameter.
  const std::vector<index_t> sizes = {5, 70001, 0, 3, 40000};
  for (const std::string cfg : kConfigNames) {
    CAPTURE(cfg);
    Params ps(sizes, 3);
    Config c = make_named(cfg, ps.table);
    kiln::CpuExecutor exec(4);
    std::mt19937 rng(9);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    auto new_grads = [&] {
      for (auto& g : ps.grad)
        for (float& x : g) x = u(rng);
    };
    new_grads();
    c.step(exec);  // everyone has a gradient: every state buffer is populated
    for (index_t skipped : {index_t(1), index_t(3)}) {
      CAPTURE(skipped);
      new_grads();  // the skipped parameter's buffer holds a stale, non-zero gradient
      for (std::size_t k = 0; k < ps.count(); ++k) ps.flag[k] = index_t(k) != skipped;
      const auto before_value = ps.value;
      const auto before_state = c.state();
      const index_t t_before = c.param_steps(skipped);
      c.step(exec);
      const auto after_state = c.state();
      for (std::size_t k = 0; k < ps.count(); ++k) {
        CAPTURE(k);
        if (ps.value[k].empty()) continue;
        if (index_t(k) == skipped) {
          CHECK(same_bits(ps.value[k], before_value[k]));
          for (std::size_t b = 0; b < after_state.size(); ++b)
            CHECK(same_bits(piece(after_state[b], ps.table, index_t(k)), piece(before_state[b], ps.table, index_t(k))));
          CHECK(c.param_steps(index_t(k)) == t_before);
        } else {
          CHECK_FALSE(same_bits(ps.value[k], before_value[k]));
        }
      }
      for (std::size_t k = 0; k < ps.count(); ++k) ps.flag[k] = true;
    }
  }
}

TEST_CASE("optim skip: random gradient patterns follow the per-parameter double reference") {
  const std::vector<index_t> sizes = {4, 0, 9000, 1, 33};
  for (const std::string cfg : kConfigNames) {
    CAPTURE(cfg);
    Params ps(sizes, 5);
    std::vector<RefParam> ref;
    for (const auto& v : ps.value) ref.emplace_back(v);
    Config c = make_named(cfg, ps.table);
    kiln::CpuExecutor exec(3);
    std::mt19937 rng(17);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (int s = 0; s < 12; ++s) {
      for (std::size_t k = 0; k < ps.count(); ++k) {
        ps.flag[k] = s == 0 ? (k % 2 == 0) : (rng() % 3 != 0);  // some start late
        const float scale = s < 4 ? 1.0f : 0.05f;                 // amsgrad's max then differs from v
        for (float& x : ps.grad[k]) x = scale * u(rng);           // stale for the skipped ones
        if (ps.flag[k]) ref[k].step(cfg, ps.grad[k]);
      }
      c.step(exec);
    }
    for (std::size_t k = 0; k < ps.count(); ++k)
      for (std::size_t i = 0; i < ps.value[k].size(); ++i) {
        INFO("parameter ", k, "[", i, "]: got ", ps.value[k][i], ", reference ", ref[k].p[i]);
        CHECK(std::fabs(ps.value[k][i] - ref[k].p[i]) <= 1e-5 * std::max(std::fabs(ref[k].p[i]), 1.0));
      }
    if (cfg.rfind("adam", 0) == 0)
      for (std::size_t k = 0; k < ps.count(); ++k) CHECK(c.param_steps(index_t(k)) == ref[k].t);
  }
}

TEST_CASE("optim skip: SGD starts each momentum buffer on its parameter's first gradient") {
  Params ps({2, 3});
  kiln::optim::SGD opt(ps.table, {.lr = 0.1, .momentum = 0.9});
  kiln::CpuExecutor exec;
  ps.flag[1] = false;
  ps.grad[0] = {1.0f, 2.0f};
  ps.grad[1] = {5.0f, 5.0f, 5.0f};
  opt.step(exec);
  CHECK(opt.has_momentum_buffer(0));
  CHECK_FALSE(opt.has_momentum_buffer(1));
  CHECK(opt.momentum_buffer()[2] == 0.0f);  // not started: reads 0
  ps.flag[1] = true;
  ps.grad[1] = {0.5f, -1.0f, 2.0f};
  const std::vector<float> p1 = ps.value[1];
  opt.step(exec);
  // First step of parameter 1's buffer: buf = d, no momentum term from the stale 5s.
  CHECK(opt.momentum_buffer()[2] == 0.5f);
  CHECK(opt.momentum_buffer()[4] == 2.0f);
  CHECK(ps.value[1][0] == p1[0] - 0.1f * 0.5f);
  CHECK(opt.steps() == 2);
}

// ---- the reproduction: two heads in one table ----------------------------------------------

namespace {

using Head = kiln::nn::Sequential<kiln::nn::Linear<4, 3>>;
using Tape = kiln::ag::Tape<kiln::CpuExecutor>;
using X = kiln::ag::Var<float, kiln::host, kiln::dyn, 4>;

X make_input() {
  kiln::Tensor<float, kiln::host, kiln::dyn, 4> x(5, 4);
  for (index_t i = 0; i < x.size(); ++i) x.data()[i] = float(std::sin(0.7 * double(i) + 0.3));
  return X(std::move(x));
}

std::vector<float> flat_values(const Head& h) {
  std::vector<float> out;
  for (const auto& p : h.parameters()) out.insert(out.end(), p.value, p.value + p.size);
  return out;
}

// One step's gradients: zero_grad() on both heads, then the loss of the two heads' summed logits
// or, when !use_b, of head a alone (head b's gradient is then none).
void backward(Head& a, Head& b, bool use_b, kiln::CpuExecutor& exec, const X& x, const std::vector<std::int32_t>& y) {
  Tape tape(exec);
  a.zero_grad();
  b.zero_grad();
  auto la = a.forward(tape, x);
  if (use_b) {
    auto lb = b.forward(tape, x);
    auto loss = kiln::nn::cross_entropy(tape, kiln::ag::map(tape, la + lb), y.data());
    tape.backward(loss);
  } else {
    auto loss = kiln::nn::cross_entropy(tape, la, y.data());
    tape.backward(loss);
  }
}

}  // namespace

TEST_CASE("optim skip: two heads in one table — the head the loss did not use stays put (issue 16)") {
  const X x = make_input();
  const std::vector<std::int32_t> y = {0, 2, 1, 1, 0};
  kiln::CpuExecutor exec;
  SUBCASE("AdamW") {
    Head a(1), b(2);
    kiln::optim::AdamW opt(a.param_table() + b.param_table(), {.lr = 1e-2, .weight_decay = 0.1});
    // The reference: PyTorch's semantics as separate optimizers, b's simply not called at step 2.
    Head ra(1), rb(2);
    kiln::optim::AdamW ref_a(ra.param_table(), {.lr = 1e-2, .weight_decay = 0.1});
    kiln::optim::AdamW ref_b(rb.param_table(), {.lr = 1e-2, .weight_decay = 0.1});

    backward(a, b, true, exec, x, y);  // step 1: both heads
    opt.step(exec);
    backward(ra, rb, true, exec, x, y);
    ref_a.step(exec);
    ref_b.step(exec);

    const std::vector<float> a1 = flat_values(a), b1 = flat_values(b);
    backward(a, b, false, exec, x, y);  // step 2: head a only; b was zero_grad()ed and not reached
    opt.step(exec);
    backward(ra, rb, false, exec, x, y);
    ref_a.step(exec);
    CHECK(same_bits(flat_values(b), b1));    // the bug: b moved by step 1's gradient and decayed
    CHECK_FALSE(same_bits(flat_values(a), a1));
    CHECK(opt.param_steps(0) == 2);
    CHECK(opt.param_steps(2) == 1);  // b's weight

    backward(a, b, true, exec, x, y);  // step 3: both again, b at its own t = 2
    opt.step(exec);
    backward(ra, rb, true, exec, x, y);
    ref_a.step(exec);
    ref_b.step(exec);
    CHECK(same_bits(flat_values(a), flat_values(ra)));
    CHECK(same_bits(flat_values(b), flat_values(rb)));
    CHECK(opt.steps() == 3);
  }
  SUBCASE("SGD with momentum") {
    Head a(1), b(2);
    kiln::optim::SGD opt(a.param_table() + b.param_table(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01});
    Head ra(1), rb(2);
    kiln::optim::SGD ref_a(ra.param_table(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01});
    kiln::optim::SGD ref_b(rb.param_table(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01});
    backward(a, b, true, exec, x, y);
    opt.step(exec);
    backward(ra, rb, true, exec, x, y);
    ref_a.step(exec);
    ref_b.step(exec);
    const std::vector<float> b1 = flat_values(b);
    backward(a, b, false, exec, x, y);
    opt.step(exec);
    backward(ra, rb, false, exec, x, y);
    ref_a.step(exec);
    CHECK(same_bits(flat_values(b), b1));
    backward(a, b, true, exec, x, y);
    opt.step(exec);
    backward(ra, rb, true, exec, x, y);
    ref_a.step(exec);
    ref_b.step(exec);
    CHECK(same_bits(flat_values(a), flat_values(ra)));
    CHECK(same_bits(flat_values(b), flat_values(rb)));
  }
}

TEST_CASE("optim skip: Sequential::param_table points each slot at its variable's grad_valid") {
  Head h(4);
  const ParamTable t = h.param_table();
  const auto params = h.parameters();
  REQUIRE(t.count() == index_t(params.size()));
  for (index_t k = 0; k < t.count(); ++k) {
    CHECK(t[k].has_grad == &params[std::size_t(k)].node->grad_valid);
    CHECK(t[k].value == params[std::size_t(k)].value);
  }
  h.zero_grad();
  CHECK_FALSE(t[0].has_gradient());
  kiln::CpuExecutor exec;
  const X x = make_input();
  Head other(5);
  backward(h, other, false, exec, x, {0, 1, 2, 0, 1});
  CHECK(t[0].has_gradient());
  CHECK(t[1].has_gradient());
}

// ---- grad_norm and clipping ------------------------------------------------------------------------------

TEST_CASE("optim skip: grad_norm and clip_grad_norm leave out parameters without a gradient") {
  Params ps({3, 5000, 2});
  ps.grad[0] = {3.0f, 0.0f, 4.0f};
  std::fill(ps.grad[1].begin(), ps.grad[1].end(), 1e3f);  // stale: would dominate the norm
  ps.grad[2] = {-12.0f, 0.0f};
  ps.flag[1] = false;
  kiln::CpuExecutor exec(2);
  CHECK(kiln::optim::grad_norm(ps.table, exec) == 13.0);
  CHECK(kiln::optim::grad_norm(ps.table, exec, 1.0) == 19.0);
  CHECK(kiln::optim::grad_norm(ps.table, exec, std::numeric_limits<double>::infinity()) == 12.0);
  exec.stats().reset();
  CHECK(kiln::optim::clip_grad_norm(ps.table, 1.0, exec) == 13.0);
  CHECK(exec.stats().launches() == 2);
  const float coef = float(1.0 / (13.0 + 1e-6));
  CHECK(ps.grad[0][0] == 3.0f * coef);
  CHECK(ps.grad[2][0] == -12.0f * coef);
  CHECK(std::all_of(ps.grad[1].begin(), ps.grad[1].end(), [](float g) { return g == 1e3f; }));  // not scaled

  // No parameter has a gradient: the norm is 0 (torch's for an empty list) and nothing scales.
  for (std::size_t k = 0; k < ps.count(); ++k) ps.flag[k] = false;
  CHECK(kiln::optim::clip_grad_norm(ps.table, 1.0, exec) == 0.0);
  CHECK(ps.grad[2][0] == -12.0f * coef);
}

// ---- zero_grad --------------------------------------------------------------------------------------------

TEST_CASE("optim skip: zero_grad sets flagged gradients to none and zero-fills the others") {
  Params flagged({4, 2});
  std::vector<float> w(3, 7.0f), dw(3, 7.0f);
  ParamTable t = flagged.table;
  t.add(w.data(), dw.data(), 3);  // no flag: always holds a gradient
  for (auto& g : flagged.grad) std::fill(g.begin(), g.end(), 5.0f);
  kiln::CpuExecutor exec;
  kiln::optim::AdamW opt(t, {.lr = 0.1, .weight_decay = 0.5});

  SUBCASE("set_to_none (the default): flags cleared, flagged buffers untouched, one fill") {
    opt.zero_grad(exec);
    CHECK_FALSE(flagged.flag[0]);
    CHECK_FALSE(flagged.flag[1]);
    CHECK(flagged.grad[0][0] == 5.0f);  // no kernel touched it: the next backward writes it
    CHECK(std::all_of(dw.begin(), dw.end(), [](float g) { return g == 0.0f; }));
    CHECK(exec.stats().launches() == 1);
    // Only flagged slots: no launch at all.
    exec.stats().reset();
    kiln::optim::zero_grad(flagged.table, exec);
    CHECK(exec.stats().launches() == 0);
    // A step now moves only the unflagged parameter (its zero gradient: AdamW's decay alone).
    const auto v0 = flagged.value;
    opt.step(exec);
    CHECK(flagged.value == v0);
    CHECK(w[0] == 7.0f * float(1.0 - 0.1 * 0.5));
  }
  SUBCASE("set_to_none = false: every gradient zero-filled, flagged ones hold a gradient") {
    for (std::size_t k = 0; k < flagged.count(); ++k) flagged.flag[k] = false;
    opt.zero_grad(exec, false);
    CHECK(exec.stats().launches() == 1);
    CHECK(flagged.flag[0]);
    CHECK(flagged.flag[1]);
    for (const auto& g : flagged.grad) CHECK(std::all_of(g.begin(), g.end(), [](float x) { return x == 0.0f; }));
    // PyTorch's set_to_none=False: the zeros are applied, so AdamW still decays every parameter.
    const float p0 = flagged.value[0][0];
    opt.step(exec);
    CHECK(flagged.value[0][0] == p0 * float(1.0 - 0.1 * 0.5));
    CHECK(opt.param_steps(0) == 1);
  }
}

// ---- concatenation -----------------------------------------------------------------------------------------

TEST_CASE("optim: ParamTables concatenate with offsets recomputed and flags kept") {
  Params a({3, 0, 2}), b({4, 1});
  const ParamTable ab = a.table + b.table;
  CHECK(ab.count() == 5);
  CHECK(ab.total_size() == 10);
  const std::vector<index_t> offsets = {0, 3, 3, 5, 9};
  for (index_t k = 0; k < 5; ++k) CHECK(ab.offset(k) == offsets[std::size_t(k)]);
  CHECK(ab[3].value == b.value[0].data());
  CHECK(ab[3].has_grad == &b.flag[0]);
  CHECK(ab[0].has_grad == &a.flag[0]);

  ParamTable c;
  c += b.table;
  c.append(a.table);
  CHECK(c.count() == 5);
  CHECK(c.offset(2) == 5);
  CHECK(c[2].value == a.value[0].data());

  // Three modules as one table, each parameter once.
  Params d({6});
  const ParamTable all = a.table + b.table + d.table;
  CHECK(all.total_size() == 16);
  CHECK(all.offset(5) == 10);

  // The same parameter twice would be stepped twice.
  CHECK_THROWS_WITH_AS(a.table + a.table, doctest::Contains("appear in a table only once"), kiln::ValueError);
  CHECK_THROWS_WITH_AS(c.append(b.table), doctest::Contains("value pointer of parameter 0"), kiln::ValueError);

  // An optimizer over the concatenation equals one per part (the flat state is just laid end to end).
  kiln::CpuExecutor exec;
  Params p({3, 2}, 7), q({3, 2}, 7);
  for (std::size_t k = 0; k < 2; ++k) {
    std::fill(p.grad[k].begin(), p.grad[k].end(), 0.25f * float(k + 1));
    q.grad[k] = p.grad[k];
  }
  ParamTable q0, q1;
  q0.add(q.table[0]);
  q1.add(q.table[1]);
  kiln::optim::Adam joint(q0 + q1, {.lr = 0.1});
  kiln::optim::Adam alone(p.table, {.lr = 0.1});
  joint.step(exec);
  alone.step(exec);
  CHECK(p.value == q.value);
}

// ---- step guard, force_eager and launch counts (issue 7) ----------------------------------------------------

namespace {

// Every piece of an optimizer's state, and the values, of two runs compared bit for bit.
void check_same_run(const Params& a, const Config& ca, const Params& b, const Config& cb) {
  for (std::size_t k = 0; k < a.count(); ++k) {
    CAPTURE(k);
    CHECK(same_bits(a.value[k], b.value[k]));
    CHECK(ca.param_steps(index_t(k)) == cb.param_steps(index_t(k)));
    CHECK(ca.started(index_t(k)) == cb.started(index_t(k)));
  }
  const auto sa = ca.state(), sb = cb.state();
  REQUIRE(sa.size() == sb.size());
  for (std::size_t i = 0; i < sa.size(); ++i) CHECK(same_bits(sa[i], sb[i]));
}

// Elements where |a - b| > rel * max(|b|) over the whole buffer (a normwise comparison: terms that
// nearly cancel leave small results with large relative error), NaN matching NaN.
index_t count_far(const std::vector<float>& a, const std::vector<float>& b, double rel) {
  REQUIRE(a.size() == b.size());
  double scale = 0.0;
  for (float x : b) scale = std::max(scale, std::fabs(double(x)));
  index_t bad = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (!(std::fabs(double(a[i]) - double(b[i])) <= rel * scale)) {
      if (bad == 0) MESSAGE("element ", i, ": ", a[i], " vs ", b[i], " (largest |b| ", scale, ")");
      ++bad;
    }
  }
  return bad;
}

}  // namespace

TEST_CASE("optim guard: a step whose found_inf is set changes nothing, and the run goes on as if it never ran") {
  // Sizes large enough that the executor splits the flat range inside a parameter. Parameter 3
  // first has a gradient on the skipped step: its buffer / count must not start there.
  const std::vector<index_t> sizes = {5, 70001, 0, 3, 40000, 2};
  for (const std::string& cfg : all_config_names())
    for (const bool eager : {false, true}) {
      CAPTURE(cfg);
      CAPTURE(eager);
      Params a(sizes, 3), b(sizes, 3);  // a sees the skipped steps, b never does
      const Config ca = make_named(cfg, a.table), cb = make_named(cfg, b.table);
      kiln::CpuExecutor exec(4);
      std::mt19937 rng(21);
      std::uniform_real_distribution<float> u(-1.0f, 1.0f);
      float found_inf = 0.0f;
      const kiln::optim::StepGuard guard{&found_inf};
      auto new_grads = [&](int s) {
        for (std::size_t k = 0; k < a.count(); ++k) {
          a.flag[k] = b.flag[k] = !(k == 3 && s < 2) && !(k == 5 && s == 1);
          for (std::size_t i = 0; i < a.grad[k].size(); ++i) a.grad[k][i] = b.grad[k][i] = u(rng);
        }
      };
      for (int s = 0; s < 2; ++s) {
        new_grads(s);
        ca.step(exec, guard, eager);  // the flag reads 0: a normal step
        cb.step(exec, {}, eager);
      }
      check_same_run(a, ca, b, cb);
      for (const float flag : {1.0f, std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
        CAPTURE(flag);
        new_grads(2);
        const auto value_before = a.value;
        const auto state_before = ca.state();
        std::vector<index_t> t_before;
        std::vector<bool> started_before;
        for (std::size_t k = 0; k < a.count(); ++k) {
          t_before.push_back(ca.param_steps(index_t(k)));
          started_before.push_back(ca.started(index_t(k)));
        }
        found_inf = flag;
        exec.stats().reset();
        ca.step(exec, guard, eager);
        found_inf = 0.0f;
        // The fused step's launch is counted (on a device it runs and decides there); an eager
        // step reads the flag first and launches nothing.
        CHECK(exec.stats().launches() == (eager ? 0u : 1u));
        for (std::size_t k = 0; k < a.count(); ++k) {
          CAPTURE(k);
          CHECK(same_bits(a.value[k], value_before[k]));
          CHECK(ca.param_steps(index_t(k)) == t_before[k]);
          CHECK(ca.started(index_t(k)) == started_before[k]);
        }
        const auto state_after = ca.state();
        for (std::size_t i = 0; i < state_after.size(); ++i) CHECK(same_bits(state_after[i], state_before[i]));
      }
      check_same_run(a, ca, b, cb);
      for (int s = 3; s < 6; ++s) {
        new_grads(s);
        ca.step(exec, guard, eager);
        cb.step(exec, {}, eager);
        check_same_run(a, ca, b, cb);
      }
      if (cfg.rfind("adam", 0) == 0) CHECK(ca.param_steps(3) == 3);
      if (cfg == "sgd_momentum") CHECK(ca.started(3));
    }
}

TEST_CASE("optim eager: force_eager steps equal the fused step to rounding, parameters without a gradient included") {
  const std::vector<index_t> sizes = {4, 0, 9000, 1, 33, 5000};
  for (const std::string& cfg : all_config_names()) {
    CAPTURE(cfg);
    Params f(sizes, 5), e(sizes, 5);
    const Config cf = make_named(cfg, f.table), ce = make_named(cfg, e.table);
    kiln::CpuExecutor exec(3);
    std::mt19937 rng(17);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (int s = 0; s < 10; ++s) {
      for (std::size_t k = 0; k < f.count(); ++k) {
        f.flag[k] = e.flag[k] = s == 0 ? (k % 2 == 0) : (rng() % 3 != 0);  // some start late
        const float scale = s < 4 ? 1.0f : 0.05f;                           // amsgrad's max then differs from v
        for (std::size_t i = 0; i < f.grad[k].size(); ++i) f.grad[k][i] = e.grad[k][i] = scale * u(rng);
      }
      cf.step(exec);
      ce.step(exec, {}, true);
    }
    // The same formulas node by node: built with -ffp-contract=off the two agree to the bit; the
    // fused loops may contract a * b + c into FMAs (-march=native), which the nodes cannot.
    for (std::size_t k = 0; k < f.count(); ++k) {
      CAPTURE(k);
      CHECK(count_far(e.value[k], f.value[k], 1e-6) == 0);
      CHECK(ce.param_steps(index_t(k)) == cf.param_steps(index_t(k)));
      CHECK(ce.started(index_t(k)) == cf.started(index_t(k)));
    }
    const auto sf = cf.state(), se = ce.state();
    for (std::size_t i = 0; i < sf.size(); ++i) CHECK(count_far(se[i], sf[i], 1e-6) == 0);
  }
}

TEST_CASE("optim launches: Opt::launches(eager, options, tensors) is what step() counts") {
  const std::vector<index_t> sizes = {3, 0, 5000, 7};
  // Which parameters have a gradient at each step: all, some, none, only the empty one, all.
  auto active = [](int s, std::size_t k) {
    switch (s) {
      case 1: return k % 2 == 0;
      case 2: return false;
      case 3: return k == 1;
      default: return true;
    }
  };
  for (const std::string& cfg : all_config_names())
    for (const bool eager : {false, true}) {
      CAPTURE(cfg);
      CAPTURE(eager);
      Params ps(sizes, 9);
      const Config c = make_named(cfg, ps.table);
      kiln::CpuExecutor exec(2);
      for (int s = 0; s < 5; ++s) {
        CAPTURE(s);
        index_t tensors = 0;
        for (std::size_t k = 0; k < ps.count(); ++k) {
          ps.flag[k] = active(s, k);
          tensors += ps.flag[k] ? 1 : 0;
          std::fill(ps.grad[k].begin(), ps.grad[k].end(), 0.125f * float(s + 1));
        }
        exec.stats().reset();
        c.step(exec, {}, eager);
        CHECK(exec.stats().launches() == std::size_t(c.launches(eager, tensors)));
        CHECK(exec.stats().launches(kiln::kind::optimizer) == (eager ? 0u : 1u));
      }
    }
}
