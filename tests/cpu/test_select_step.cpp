// A training step chosen at run time (kiln/train/select_step.hpp) over its policy-independent
// base (kiln/train/step_base.hpp): the same numbers, bit for bit, as the typed Step of that
// policy; the policy it reports; the names it refuses, naming what is built.
#include <kiln/train.hpp>
#include <kiln/train/memory_plan.hpp>
#include <kiln/train/select_step.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "step_helpers.hpp"

using namespace kiln;
using kiln_step_test::OwnedBatch;
using kiln_step_test::random_batch;
using kiln_step_test::values_of;

namespace {
using Mlp = nn::Sequential<nn::Linear<12, 16>, nn::ReLU, nn::Linear<16, 8>, nn::ReLU, nn::Linear<8, 4>>;
using Base = train::StepBase<Mlp, optim::AdamW<host>, CpuExecutor>;

// Six micro-batches through `step` (a Step or a StepBase): the losses, then the parameters.
std::vector<float> train_six(Base& step) {
  std::vector<float> out;
  for (int s = 0; s < 6; ++s) {
    OwnedBatch b = random_batch(5, 30 + std::uint64_t(s));
    step(b.batch());
  }
  out = step.take_losses(true);
  const auto v = values_of(step.model());
  out.insert(out.end(), v.begin(), v.end());
  return out;
}
}  // namespace

TEST_CASE("select_step: a step chosen by name trains as the typed Step of that policy, bit for bit") {
  using train::combo;  // four of every_combo's six pairs: each one compiled costs this file's build
  using built = train::combos<combo<stance::fused, mode::default_>, combo<stance::force_eager, mode::default_>,
                              combo<stance::fused, mode::reduce_overhead>, combo<stance::fused, mode::max_autotune>>;
  struct Case {
    const char *precision, *stance, *mode;
  };
  for (const Case c : {Case{"fp32", "fused", "default"}, Case{"bf16_mixed", "force_eager", "default"},
                       Case{"fp16_mixed", "fused", "reduce_overhead"}, Case{"tf32", "fused", "max_autotune"}}) {
    CAPTURE(c.precision);
    CAPTURE(c.stance);
    CAPTURE(c.mode);
    std::vector<float> chosen, typed;
    index_t chosen_launches = 0, typed_launches = 0;
    std::string chosen_report, typed_report;
    {
      CpuExecutor exec(1);
      Mlp model(5);
      optim::AdamW opt(model, {.lr = 1e-2});
      auto step = train::select_step<built, accumulate<dyn>>(c.precision, c.stance, c.mode, model, opt, exec, {},
                                                                   {.accumulate = 2, .autotune = {.use_cache = false}});
      CHECK(std::string(step->policy().precision) == c.precision);
      CHECK(std::string(step->policy().stance) == c.stance);
      CHECK(std::string(step->policy().mode) == c.mode);
      CHECK(step->policy().tf32 == (std::string(c.precision) == "tf32"));  // fp32's code, told it is tf32
      CHECK(step->describe().find(c.precision) == 0);
      CHECK(step->mode_report().find(std::string("mode ") + c.mode) == 0);
      chosen = train_six(*step);
      CHECK(step->optimizer_steps() == 3);
      chosen_launches = step->predicted_launches();
      chosen_report = step->mode_report();
    }
    {
      CpuExecutor exec(1);
      Mlp model(5);
      optim::AdamW opt(model, {.lr = 1e-2});
      auto run = [&]<class Policy>() {
        train::Step step(model, opt, exec, Policy{}, {}, {.accumulate = 2, .autotune = {.use_cache = false}});
        typed = train_six(step);
        typed_launches = step.predicted_launches();
        typed_report = step.mode_report();
      };
      const std::string p = c.precision, s = c.stance, m = c.mode;
      if (p == "fp32") run.operator()<policy<accumulate<dyn>>>();
      else if (p == "bf16_mixed") run.operator()<policy<precision::bf16_mixed, stance::force_eager, accumulate<dyn>>>();
      else if (p == "fp16_mixed") run.operator()<policy<precision::fp16_mixed, mode::reduce_overhead, accumulate<dyn>>>();
      else run.operator()<policy<precision::tf32, mode::max_autotune, accumulate<dyn>>>();
    }
    CHECK(chosen == typed);
    // One Step type runs all four pairs (stance and mode at run time): its counts and its
    // report are still the typed policy's.
    CHECK(chosen_launches == typed_launches);
    if (std::string(c.mode) != "max_autotune") CHECK(chosen_report == typed_report);  // the tuner's report has timings
  }
}

TEST_CASE("select_step: the recompile stances, chosen by name, meet a new batch shape as their typed Steps do") {
  auto steps_of = [](const char* stance, std::vector<index_t> rows) {
    CpuExecutor exec(1);
    Mlp model(5);
    optim::AdamW opt(model, {.lr = 1e-2});
    auto step = train::select_step<train::every_combo>("fp32", stance, "reduce_overhead", model, opt, exec);
    for (std::size_t k = 0; k < rows.size(); ++k) {
      OwnedBatch b = random_batch(rows[k], 40 + std::uint64_t(k));
      (*step)(b.batch());
    }
    return step->mode_report();
  };
  // eager_on_recompile: the first shape captured and replayed, the second through the tape.
  const std::string eager = steps_of("eager_on_recompile", {5, 5, 5, 3, 3});
  CHECK(eager.find("captured shapes [5, 12]") != std::string::npos);
  CHECK(eager.find("2 through the tape") != std::string::npos);
  // fail_on_recompile: the second shape is an error naming it.
  CHECK_THROWS_WITH_AS(steps_of("fail_on_recompile", {5, 5, 3}), doctest::Contains("fail_on_recompile met batch shape [3, 12]"),
                       ValueError);
  // fused: both shapes captured.
  CHECK(steps_of("fused", {5, 5, 3, 3}).find("captured shapes [5, 12], [3, 12]") != std::string::npos);
}

TEST_CASE("select_step: a name nothing selects is a ValueError naming it and what is built") {
  CpuExecutor exec(1);
  Mlp model(1);
  optim::AdamW opt(model, {});
  using train::combo;
  using fused_only = train::combos<combo<stance::fused, mode::default_>>;
  auto make = [&](const char* p, const char* s, const char* m) {
    return train::select_step<fused_only, accumulate<dyn>>(p, s, m, model, opt, exec, {}, {.accumulate = 1});
  };
  CHECK(make("fp32", "fused", "default") != nullptr);
  CHECK_THROWS_WITH_AS(make("fp64", "fused", "default"), doctest::Contains("unknown precision \"fp64\""), ValueError);
  CHECK_THROWS_WITH_AS(make("fp32", "fusd", "default"), doctest::Contains("unknown stance \"fusd\""), ValueError);
  CHECK_THROWS_WITH_AS(make("fp32", "fused", "fast"), doctest::Contains("unknown mode \"fast\""), ValueError);
  CHECK_THROWS_WITH_AS(make("fp32", "fail_on_recompile", "default"),
                       doctest::Contains("is about recompiling a captured step: it needs mode reduce_overhead"),
                       ValueError);
  CHECK_THROWS_WITH_AS(make("fp32", "force_eager", "default"),
                       doctest::Contains("stance force_eager with mode default is not built into this program; it has "
                                         "fused with mode default"),
                       ValueError);
}

TEST_CASE("StepBase: checkpoints, reports and the memory plan take the base, whatever the policy") {
  CpuExecutor exec(1);
  Mlp model(2);
  optim::AdamW opt(model, {});
  auto step = train::make_step<policy<precision::bf16_mixed, accumulate<2>>>(model, opt, exec);
  step->record_next_step();
  for (int s = 0; s < 2; ++s) {
    OwnedBatch b = random_batch(4, 9 + std::uint64_t(s));
    (*step)(b.batch());
  }
  const auto rep = train::report(*step);
  CHECK(rep.precision == "bf16_mixed");
  CHECK(rep.kernels_per_step == doctest::Approx(double(rep.predicted)));
  const auto plan = train::plan_memory<optim::AdamW<host>>(model, opt.options(), 1, step->policy());
  CHECK(plan.low_copies > 0);  // the Linear weights' bf16 copies
  CHECK(step->at_step_boundary());
}
