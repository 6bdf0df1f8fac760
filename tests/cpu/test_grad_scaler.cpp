// The dynamic loss scaler (issue 7, item 4): train::GradScaler<kiln::host> against a hand-written
// reference of torch.amp.GradScaler's state machine (growth, backoff on inf and on NaN, tracker
// reset, the floor), the unscale pass to the bit, found_inf for inf and NaN at each position, and
// a skipped AdamW step leaving parameters and moments untouched while training continues.
#include <kiln/optim/adam.hpp>
#include <kiln/optim/param.hpp>
#include <kiln/train/grad_scaler.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

using kiln::index_t;
using kiln::optim::ParamTable;
using kiln::train::GradScaler;
using kiln::train::GradScalerOptions;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Parameters with their own storage and a has_grad flag each; no_grad lists slots whose flag is false.
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
      for (float& x : grad[k]) x = u(rng);
      flag[k] = true;
    }
    for (std::size_t k = 0; k < sizes.size(); ++k)
      table.add(value[k].data(), grad[k].data(), index_t(sizes[k]), &flag[k]);
  }
};

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Runs one optimizer step's scaler part with the gradient of `p` slot 0 set to `g` everywhere.
void scaler_step(GradScaler<>& scaler, Params& p, kiln::CpuExecutor& exec, float g) {
  for (float& x : p.grad[0]) x = g;
  scaler.unscale_and_check(p.table, exec);
  scaler.update(exec);
}

}  // namespace

TEST_CASE("GradScaler options: PyTorch's defaults, each option checked by name") {
  const GradScalerOptions d;
  CHECK(d.enabled);
  CHECK(d.init_scale == 65536.0);
  CHECK(d.growth_factor == 2.0);
  CHECK(d.backoff_factor == 0.5);
  CHECK(d.growth_interval == 2000);
  CHECK(d.min_scale == 1.0);
  CHECK(GradScaler<>().scale() == 65536.0f);
  static_assert(GradScaler<kiln::host>::launches_per_step(true) == 2);
  static_assert(GradScaler<kiln::host>::launches_per_step(false) == 0);

  struct Bad {
    GradScalerOptions o;
    const char* name;
  };
  const Bad bad[] = {
      {{.init_scale = 0.0}, "init_scale"},        {{.init_scale = -1.0}, "init_scale"},
      {{.init_scale = 1e39}, "init_scale"},       {{.init_scale = kNaN}, "init_scale"},
      {{.growth_factor = 1.0}, "growth_factor"},  {{.growth_factor = kInf}, "growth_factor"},
      {{.backoff_factor = 1.0}, "backoff_factor"}, {{.backoff_factor = 0.0}, "backoff_factor"},
      {{.backoff_factor = kNaN}, "backoff_factor"}, {{.growth_interval = 0}, "growth_interval"},
      {{.min_scale = 0.0}, "min_scale"},          {{.min_scale = 1e5}, "min_scale"},  // above init_scale
      {{.min_scale = kNaN}, "min_scale"},
  };
  for (const Bad& b : bad) {
    CAPTURE(b.name);
    try {
      GradScaler<> s(b.o);
      FAIL("accepted a bad ", b.name);
    } catch (const kiln::ValueError& e) {
      CHECK(std::string(e.what()).find(b.name) != std::string::npos);
    }
  }
  CHECK_NOTHROW(GradScaler<>({.init_scale = 4.0, .min_scale = 4.0}));  // a floor at the initial scale is fine
}

TEST_CASE("GradScaler state machine step by step: growth, backoff on inf and NaN, tracker reset, floor") {
  kiln::CpuExecutor exec;
  Params p({4});
  GradScaler<> scaler({.init_scale = 8.0, .growth_factor = 2.0, .backoff_factor = 0.5, .growth_interval = 3,
                       .min_scale = 1.0});
  // Hand-written: the gradient fed to step k, then the state after its update (torch.amp.GradScaler
  // with growth_interval 3; the floor clamps). clean gradients are 0.75 * scale.
  struct Row {
    float g;  // 0: clean
    float scale;
    index_t tracker;
    index_t skipped;
    bool below_floor;
  };
  const Row rows[] = {
      {0, 8, 1, 0, false},     {0, 8, 2, 0, false},     {0, 16, 0, 0, false},  // growth after 3 clean steps
      {0, 16, 1, 0, false},    {kInf, 8, 0, 1, false},                          // backoff, tracker reset
      {0, 8, 1, 1, false},     {0, 8, 2, 1, false},     {kNaN, 4, 0, 2, false}, // NaN just before a growth
      {0, 4, 1, 2, false},     {0, 4, 2, 2, false},     {0, 8, 0, 2, false},
      {-kInf, 4, 0, 3, false}, {kNaN, 2, 0, 4, false},  {kInf, 1, 0, 5, false}, // at the floor: not below
      {0, 1, 1, 5, false},     {kInf, 1, 0, 6, true},                           // step 16: 0.5 < 1, clamped
      {kNaN, 1, 0, 7, true},   {0, 1, 1, 7, true},
  };
  index_t k = 0;
  for (const Row& r : rows) {
    ++k;
    CAPTURE(k);
    const float before = scaler.scale();
    const bool bad = r.g != 0.0f;
    for (float& x : p.grad[0]) x = bad ? r.g : 0.75f * before;
    exec.stats().reset();
    exec.stats().set_recording(true);
    scaler.unscale_and_check(p.table, exec);
    CHECK(scaler.found_inf() == bad);
    if (!bad)
      for (float x : p.grad[0]) CHECK(x == 0.75f);  // unscaled exactly
    scaler.update(exec);
    CHECK(!scaler.found_inf());  // cleared for the next step
    CHECK(exec.stats().launches() == std::size_t(GradScaler<>::launches_per_step(true)));
    CHECK(exec.stats().launches(kiln::kind::optimizer) == 2);
    REQUIRE(exec.stats().records().size() == 2);
    CHECK(exec.stats().records()[0].name == "unscale_check");
    CHECK(exec.stats().records()[1].name == "scaler_update");
    exec.stats().set_recording(false);
    CHECK(scaler.scale() == r.scale);
    CHECK(scaler.growth_tracker() == r.tracker);
    CHECK(scaler.skipped_steps() == r.skipped);
    CHECK(scaler.steps() == k);
    if (r.below_floor) {
      try {
        scaler.check();
        FAIL("check() did not throw after the scale fell below its floor");
      } catch (const kiln::NumericError& e) {
        const std::string m = e.what();
        CHECK(m.find("optimizer step 16") != std::string::npos);  // the first crossing, not this step
        CHECK(m.find("floor 1") != std::string::npos);
        CHECK(m.find("lower the learning rate") != std::string::npos);
      }
    } else {
      CHECK_NOTHROW(scaler.check());
    }
  }
}

TEST_CASE("GradScaler update: products in double, growth refused past float's range") {
  kiln::CpuExecutor exec;
  Params p({3});
  {  // backoff 0.1 from 3: PyTorch multiplies in double and rounds once to float
    GradScaler<> s({.init_scale = 3.0, .backoff_factor = 0.1, .min_scale = 0.25});
    scaler_step(s, p, exec, kNaN);
    CHECK(s.scale() == float(3.0 * 0.1));
    scaler_step(s, p, exec, kNaN);
    CHECK(s.scale() == 0.25f);  // 0.03 is below the floor 0.25: clamped
  }
  {  // 2^127 * 2 overflows: the scale stays, the tracker resets (torch's isfinite guard)
    GradScaler<> s({.init_scale = std::ldexp(1.0, 127), .growth_interval = 1});
    scaler_step(s, p, exec, 1.0f);
    CHECK(s.scale() == std::ldexp(1.0f, 127));
    CHECK(s.growth_tracker() == 0);
    CHECK(s.skipped_steps() == 0);
  }
  {  // growth_interval 1 grows every clean step
    GradScaler<> s({.init_scale = 2.0, .growth_factor = 3.0, .growth_interval = 1});
    scaler_step(s, p, exec, 1.0f);
    scaler_step(s, p, exec, 1.0f);
    CHECK(s.scale() == 18.0f);
  }
}

TEST_CASE("GradScaler unscale_and_check: g * float(1 / scale) to the bit; slots without a gradient untouched") {
  kiln::CpuExecutor exec;
  // A small slot, one long enough to be split between threads, an empty one, one without a
  // gradient (holding NaN and inf: it must neither change nor count), and a small last one.
  Params p({7, 100003, 0, 5, 3}, 7);
  p.flag[3] = false;
  p.grad[3] = {kNaN, kInf, -kInf, 1.0f, 2.0f};
  for (float scale : {3.0f, 65536.0f, 1.0f, 0.75f}) {
    CAPTURE(scale);
    GradScaler<> s({.init_scale = scale, .min_scale = 0.5});
    const std::vector<std::vector<float>> before = p.grad, values = p.value;
    const float inv = float(1.0 / double(scale));
    s.unscale_and_check(p.table, exec);
    CHECK(!s.found_inf());
    for (std::size_t k = 0; k < p.grad.size(); ++k) {
      CAPTURE(k);
      if (k == 3) {
        CHECK(same_bits(p.grad[k], before[k]));
        continue;
      }
      std::vector<float> expect = before[k];
      for (float& x : expect) x = x * inv;
      CHECK(same_bits(p.grad[k], expect));
    }
    for (std::size_t k = 0; k < p.value.size(); ++k) CHECK(same_bits(p.value[k], values[k]));
  }
}

TEST_CASE("GradScaler: inf and NaN at the first, a middle and the last element set found_inf; a clean step resets it") {
  kiln::CpuExecutor exec;
  Params p({7, 100003, 0, 5, 3}, 3);
  p.flag[3] = false;  // no gradient: an inf here counts for nothing
  struct Where {
    std::size_t slot;
    std::size_t i;
  };
  const Where where[] = {{0, 0}, {1, 50001}, {1, 100002}, {4, 2}};
  GradScaler<> s({.init_scale = 1048576.0, .growth_interval = 1000});  // 12 halvings stay above 1
  index_t skipped = 0;
  for (const Where& w : where)
    for (float bad : {kInf, -kInf, kNaN}) {
      CAPTURE(w.slot);
      CAPTURE(w.i);
      CAPTURE(bad);
      const float scale = s.scale();
      p.grad[w.slot][w.i] = bad;
      s.unscale_and_check(p.table, exec);
      CHECK(s.found_inf());
      s.update(exec);
      CHECK(!s.found_inf());
      CHECK(s.skipped_steps() == ++skipped);
      CHECK(s.scale() == scale * 0.5f);
      for (auto& g : p.grad) std::fill(g.begin(), g.end(), 0.5f);
      s.unscale_and_check(p.table, exec);  // clean: found_inf is 0 again, the scale holds
      CHECK(!s.found_inf());
      s.update(exec);
      CHECK(s.scale() == scale * 0.5f);
      CHECK(s.skipped_steps() == skipped);
    }
  // Only in a slot without a gradient: not seen.
  p.grad[3][0] = kInf;
  s.unscale_and_check(p.table, exec);
  CHECK(!s.found_inf());
  s.update(exec);
  // Finite scaled values that overflow when unscaled (a scale below 1) count too.
  GradScaler<> small({.init_scale = 0.5, .min_scale = 0.25});
  for (auto& g : p.grad) std::fill(g.begin(), g.end(), 0.5f);
  p.grad[1][7] = 3e38f;
  small.unscale_and_check(p.table, exec);
  CHECK(small.found_inf());
}

TEST_CASE("GradScaler: a skipped AdamW step leaves parameters and moments bit-for-bit; training continues") {
  kiln::CpuExecutor exec;
  // opt runs under the scaler on scaled gradients; ref on the true gradients, skipping the bad
  // step. Scales are powers of two, so the unscaled gradients are the true ones exactly and the
  // two must agree to the bit at every step.
  Params a({6, 40000, 3}, 11), b({6, 40000, 3}, 11);
  kiln::optim::AdamW<kiln::host> opt(a.table, {.lr = 1e-2, .weight_decay = 0.1});
  kiln::optim::AdamW<kiln::host> ref(b.table, {.lr = 1e-2, .weight_decay = 0.1});
  GradScaler<> scaler({.init_scale = 1024.0, .growth_interval = 2});
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int step = 0; step < 8; ++step) {
    CAPTURE(step);
    const bool inject = step == 2 || step == 5;
    const float scale = scaler.scale();
    for (std::size_t k = 0; k < a.grad.size(); ++k)
      for (std::size_t i = 0; i < a.grad[k].size(); ++i) {
        const float g = u(rng);
        b.grad[k][i] = g;
        a.grad[k][i] = g * scale;
      }
    if (inject) a.grad[1][12345] = step == 2 ? kNaN : kInf;
    const auto values = a.value;
    const std::vector<float> m(opt.exp_avg().begin(), opt.exp_avg().end());
    const std::vector<float> v(opt.exp_avg_sq().begin(), opt.exp_avg_sq().end());
    scaler.unscale_and_check(a.table, exec);
    opt.step(exec, {.found_inf = scaler.found_inf_ptr()});
    scaler.update(exec);
    if (inject) {
      for (std::size_t k = 0; k < a.value.size(); ++k) CHECK(same_bits(a.value[k], values[k]));
      CHECK(same_bits(opt.exp_avg(), m));
      CHECK(same_bits(opt.exp_avg_sq(), v));
      CHECK(scaler.scale() == scale * 0.5f);
    } else {
      ref.step(exec);
    }
    for (std::size_t k = 0; k < a.value.size(); ++k) CHECK(same_bits(a.value[k], b.value[k]));
    CHECK(same_bits(opt.exp_avg(), ref.exp_avg()));
    CHECK(same_bits(opt.exp_avg_sq(), ref.exp_avg_sq()));
  }
  CHECK(scaler.skipped_steps() == 2);
  CHECK(scaler.steps() == 8);
  CHECK_NOTHROW(scaler.check());
}

TEST_CASE("GradScaler disabled: scale 1, no launches, gradients untouched, found_inf stays 0") {
  kiln::CpuExecutor exec;
  Params p({5});
  p.grad[0][2] = kInf;
  const auto before = p.grad;
  GradScaler<> s({.enabled = false});
  CHECK(*s.scale_ptr() == 1.0f);
  exec.stats().reset();
  for (int i = 0; i < 3; ++i) {
    s.unscale_and_check(p.table, exec);
    s.unscale_and_check(p.table, exec);  // no call-order check either: nothing runs
    s.update(exec);
  }
  CHECK(exec.stats().launches() == std::size_t(GradScaler<>::launches_per_step(false)));
  CHECK(same_bits(p.grad[0], before[0]));
  CHECK(!s.found_inf());
  CHECK(s.scale() == 1.0f);
  CHECK(s.steps() == 0);
  CHECK_NOTHROW(s.check());
}

TEST_CASE("GradScaler call order: unscale twice, or update without a check, is a ValueError") {
  kiln::CpuExecutor exec;
  Params p({5});
  GradScaler<> s;
  CHECK_THROWS_AS(s.update(exec), kiln::ValueError);
  s.unscale_and_check(p.table, exec);
  const auto once = p.grad;
  CHECK_THROWS_AS(s.unscale_and_check(p.table, exec), kiln::ValueError);
  CHECK(same_bits(p.grad[0], once[0]));  // refused before touching anything
  s.update(exec);
  CHECK_NOTHROW(s.unscale_and_check(p.table, exec));
}
