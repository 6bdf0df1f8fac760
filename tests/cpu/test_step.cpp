// kiln::train::Step on the CPU: it equals the hand-written loop it replaces, accumulation of N
// micro-batches equals one batch N times larger, every stance gives the same parameters within
// rounding and exactly the launches predicted at compile time, the loss window, schedules, the
// loss scaler's skip, and the errors a step gives at start.
#include <kiln/train.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "step_helpers.hpp"

using namespace kiln;

namespace {

using kiln_step_test::OwnedBatch;
using kiln_step_test::random_batch;
using kiln_step_test::values_of;

using Mlp = nn::Sequential<nn::Linear<12, 16>, nn::ReLU, nn::Linear<16, 8>, nn::ReLU, nn::Linear<8, 4>>;

void check_close(const std::vector<float>& a, const std::vector<float>& b, double tol) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(double(a[i]) - double(b[i])));
  CHECK_MESSAGE(worst <= tol, "largest difference ", worst);
}

}  // namespace

TEST_CASE("Step: one micro-batch per step equals the hand-written loop, bit for bit") {
  CpuExecutor exec(1);
  Mlp by_step(3), by_hand(3);
  optim::AdamW opt_step(by_step, {.lr = 1e-2});
  optim::AdamW opt_hand(by_hand, {.lr = 1e-2});
  train::Step step(by_step, opt_step, exec);
  ag::Tape<CpuExecutor> tape(exec);
  for (int s = 0; s < 5; ++s) {
    OwnedBatch b = random_batch(6, 10 + s);
    const float loss = step(b.batch()).item();
    Tensor<float, host, dyn, 12> xt(6, 12);
    std::copy(b.x.begin(), b.x.end(), xt.data());
    ag::Var<float, host, dyn, 12> x(std::move(xt));
    auto hand_loss = nn::cross_entropy(tape, by_hand.forward(tape, x), b.y.data());
    CHECK(hand_loss.item() == loss);
    by_hand.zero_grad();
    tape.backward(hand_loss);
    opt_hand.step(exec);
    CHECK(step.stepped());
  }
  CHECK(values_of(by_step) == values_of(by_hand));
  CHECK(step.optimizer_steps() == 5);
}

TEST_CASE("Step: accumulating 4 micro-batches of 8 equals one batch of 32, within fp32 rounding") {
  CpuExecutor exec(1);
  Mlp small(5), large(5);
  optim::SGD opt_small(small, {.lr = 0.1, .momentum = 0.9});
  optim::SGD opt_large(large, {.lr = 0.1, .momentum = 0.9});
  train::Step accumulating(small, opt_small, exec, kiln::policy<kiln::accumulate<4>>{});
  train::Step whole(large, opt_large, exec);
  for (int s = 0; s < 3; ++s) {
    OwnedBatch b = random_batch(32, 40 + s);
    for (int part = 0; part < 4; ++part) {
      OwnedBatch quarter;
      quarter.x.assign(b.x.begin() + part * 8 * 12, b.x.begin() + (part + 1) * 8 * 12);
      quarter.y.assign(b.y.begin() + part * 8, b.y.begin() + (part + 1) * 8);
      accumulating(quarter.batch());
      CHECK(accumulating.stepped() == (part == 3));
    }
    whole(b.batch());
  }
  CHECK(accumulating.optimizer_steps() == 3);
  CHECK(accumulating.micro_batches() == 12);
  check_close(values_of(small), values_of(large), 2e-6);
}

TEST_CASE("Step: force_eager trains to the same parameters as fused, with the launches predicted for each") {
  CpuExecutor fused_exec(1), eager_exec(1);
  Mlp a(7), b(7);
  optim::AdamW opt_a(a, {.lr = 1e-2});
  optim::AdamW opt_b(b, {.lr = 1e-2});
  train::Step fused(a, opt_a, fused_exec, kiln::policy<kiln::accumulate<2>>{});
  train::Step eager(b, opt_b, eager_exec, kiln::policy<kiln::stance::force_eager, kiln::accumulate<2>>{});
  for (int s = 0; s < 6; ++s) {
    OwnedBatch batch = random_batch(5, 70 + s);
    const auto before_f = fused_exec.stats().launches(), before_e = eager_exec.stats().launches();
    fused(batch.batch());
    fused(batch.batch());
    eager(batch.batch());
    eager(batch.batch());
    CHECK(fused_exec.stats().launches() - before_f == std::size_t(fused.predicted_launches()));
    CHECK(eager_exec.stats().launches() - before_e == std::size_t(eager.predicted_launches()));
  }
  check_close(values_of(a), values_of(b), 1e-5);
  CHECK(eager.predicted_launches() >= 3 * fused.predicted_launches());
  // The MLP's fused step on the CPU: per micro-batch 3 GEMMs forward, 5 backward, the loss each way
  // and the seed; then ONE optimizer launch.
  static_assert(train::launches_per_step<Mlp, optim::AdamW<>, kiln::policy<>>({}) == 3 + 5 + 2 + 1 + 1);
  static_assert(train::launches_per_step<Mlp, optim::AdamW<>, kiln::policy<kiln::accumulate<2>>>({}) == 2 * 11 + 1);
}

TEST_CASE("Step: the loss window holds the latest micro-batches' losses until they are read") {
  CpuExecutor exec(1);
  Mlp model(2);
  optim::SGD opt(model, {.lr = 0.05});
  train::Step step(model, opt, exec, kiln::policy<>{}, {}, {.loss_window = 3});
  std::vector<float> returned;
  for (int s = 0; s < 3; ++s) {
    OwnedBatch b = random_batch(4, 90 + s);
    returned.push_back(step(b.batch()).item());
  }
  CHECK(step.window_full());
  CHECK(step.take_losses() == returned);
  CHECK(step.losses_pending() == 0);
  returned.clear();
  for (int s = 0; s < 5; ++s) {  // two more than the window: the two oldest are dropped
    OwnedBatch b = random_batch(4, 95 + s);
    returned.push_back(step(b.batch()).item());
  }
  CHECK(step.losses_dropped() == 2);
  CHECK(step.take_losses() == std::vector<float>(returned.begin() + 2, returned.end()));
}

TEST_CASE("Step: a NaN loss is named by its micro-batch when the window is read with require_finite") {
  CpuExecutor exec(1);
  Mlp model(2);
  optim::SGD opt(model, {.lr = 1e30});  // diverges at once
  train::Step step(model, opt, exec);
  for (int s = 0; s < 4; ++s) {
    OwnedBatch b = random_batch(4, 30 + s);
    step(b.batch());
  }
  CHECK_THROWS_WITH_AS(step.take_losses(true), doctest::Contains("at micro-batch 2"), NumericError);
}

TEST_CASE("Step: checks at start — accumulation counts and schedules it cannot honour") {
  CpuExecutor exec(1);
  Mlp model(1);
  optim::AdamW opt(model, {});
  CHECK_THROWS_WITH_AS(train::Step(model, opt, exec, kiln::policy<kiln::accumulate<kiln::dyn>>{}),
                       doctest::Contains("StepOptions::accumulate must be >= 1, got 0"), ValueError);
  CHECK_THROWS_WITH_AS(train::Step(model, opt, exec, kiln::policy<kiln::accumulate<2>>{}, {}, {.accumulate = 3}),
                       doctest::Contains("give the count in one place"), ValueError);
  train::Step step(model, opt, exec, kiln::policy<kiln::accumulate<kiln::dyn>>{}, {}, {.accumulate = 4});
  CHECK(step.accumulation() == 4);
  CHECK_THROWS_WITH_AS(step.set_schedule(optim::ConstantLr(0.1), 10), doctest::Contains("the last 2 would never"),
                       ValueError);
  step.set_schedule(optim::StepLr(0.1, 1, 0.5), 8);
  CHECK(opt.lr() == doctest::Approx(0.1));
  OwnedBatch bad = random_batch(3, 5);
  data::Batch b = bad.batch();
  b.dim = 11;
  CHECK_THROWS_WITH_AS(step(b), doctest::Contains("11 features per row but the model's input size is 12"), ShapeError);
}

TEST_CASE("Step: a schedule sets the learning rate of each optimizer step, not of each micro-batch") {
  CpuExecutor exec(1);
  Mlp model(1);
  optim::SGD opt(model, {.lr = 1.0});
  train::Step step(model, opt, exec, kiln::policy<kiln::accumulate<2>>{});
  step.set_schedule(optim::StepLr(0.1, 1, 0.5));
  std::vector<double> lrs;
  for (int s = 0; s < 6; ++s) {
    OwnedBatch b = random_batch(3, 60 + s);
    lrs.push_back(opt.lr());
    step(b.batch());
  }
  CHECK(lrs == std::vector<double>{0.1, 0.1, 0.05, 0.05, 0.025, 0.025});
}

TEST_CASE("Step: every precision × stance runs exactly the launches predicted at compile time") {
  for (const char* precision : {"fp32", "tf32", "bf16_mixed", "fp16_mixed"})
    for (const char* stance : {"fused", "force_eager"})
      for (const index_t accumulate : {1, 3})
        kiln::select_policy<kiln::accumulate<kiln::dyn>>(precision, stance, [&]<class Policy>() {
          CAPTURE(precision);
          CAPTURE(stance);
          CAPTURE(accumulate);
          CpuExecutor exec(1);
          Mlp model(4);
          optim::AdamW opt(model, {});
          train::Step step(model, opt, exec, Policy{}, {}, {.accumulate = accumulate});
          for (int s = 0; s < 2; ++s) {
            const auto before = exec.stats().launches();
            for (index_t m = 0; m < accumulate; ++m) {
              OwnedBatch b = random_batch(6, 20 + std::uint64_t(m));
              step(b.batch());
            }
            CHECK(exec.stats().launches() - before == std::size_t(step.predicted_launches()));
          }
        });
}

TEST_CASE("Step: inf or NaN in a gradient at any micro-batch of an accumulated step skips that step") {
  // With a dynamic loss scaler (legal with fp32, and said to be pointless at start).
  for (index_t position = 1; position <= 3; ++position) {
    CAPTURE(position);
    CpuExecutor exec(1);
    Mlp model(8);
    optim::AdamW opt(model, {.lr = 1e-2});
    float* grad = model.parameters()[4].grad;  // the last Linear's weight gradient
    index_t calls = 0;
    train::Step step(model, opt, exec, kiln::policy<kiln::loss_scaling::dynamic, kiln::accumulate<3>>{}, {},
                     {.after_backward = [&](index_t micro) {
                        ++calls;
                        if (micro == 3 + position) grad[1] = position == 2 ? std::numeric_limits<float>::quiet_NaN()
                                                                           : std::numeric_limits<float>::infinity();
                      }});
    CHECK(step.describe().find("pointless") != std::string::npos);
    auto run_step = [&](int seed) {
      for (int m = 0; m < 3; ++m) {
        OwnedBatch b = random_batch(5, std::uint64_t(seed * 10 + m));
        step(b.batch());
      }
    };
    run_step(1);
    const auto before = values_of(model);
    const std::vector<float> moments(opt.exp_avg_sq().begin(), opt.exp_avg_sq().end());
    const float scale = step.scaler().scale();
    run_step(2);  // the poisoned one
    CHECK(values_of(model) == before);
    CHECK(std::vector<float>(opt.exp_avg_sq().begin(), opt.exp_avg_sq().end()) == moments);
    CHECK(step.scaler().scale() == scale / 2);
    run_step(3);  // training goes on
    CHECK(values_of(model) != before);
    CHECK(step.scaler().skipped_steps() == 1);
  }
}

namespace {
struct Halve {
  static constexpr const char* name = "halve";
  template <class Tape, class X>
  auto operator()(Tape& tape, const X& x) const {
    return ag::map(tape, x * 0.5f);
  }
};
}  // namespace

TEST_CASE("Step: an opaque function is a boundary the report names; its launches are not known at compile time") {
  using Model = nn::Sequential<nn::Linear<12, 16>, nn::ReLU, nn::Opaque<Halve>, nn::Linear<16, 4>>;
  static_assert(Model::has_opaque && !Model::counts_launches);
  CpuExecutor exec(1);
  Model model(3);
  optim::SGD opt(model, {.lr = 0.1});
  train::Step step(model, opt, exec);
  CHECK(step.predicted_launches() == -1);
  step.record_next_step();
  OwnedBatch b = random_batch(4, 1);
  step(b.batch());
  const train::Report r = train::report(step);
  bool named = false, backward_named = false;
  for (const auto& k : r.kernels) {
    if (k.name == "opaque(halve): fused[mul]") named = k.why.find("does not fuse across") != std::string::npos;
    if (k.name == "opaque(halve): backward[mul]") backward_named = true;
  }
  CHECK(named);
  CHECK(backward_named);
  CHECK(r.str().find("not known at compile time") != std::string::npos);
  CHECK(model.describe().find("opaque(halve)") != std::string::npos);
}

TEST_CASE("Step: the report adds up what the executor counted, with a reason for every kernel") {
  CpuExecutor exec(1);
  Mlp model(3);
  optim::AdamW opt(model, {});
  train::Step step(model, opt, exec, kiln::policy<kiln::accumulate<2>>{});
  step.record_next_step();
  for (int s = 0; s < 2; ++s) {
    OwnedBatch b = random_batch(8, 7 + std::uint64_t(s));
    step(b.batch());
  }
  const train::Report r = train::report(step);
  CHECK(r.kernels_per_step == double(step.predicted_launches()));
  double total = 0;
  for (const auto& [kind_name, n] : r.by_kind) total += n;
  CHECK(total == r.kernels_per_step);
  CHECK(r.effective_batch() == 16);
  for (const auto& k : r.kernels) CHECK_FALSE(k.why.empty());
  CHECK(r.str().find("fusion report: 23.0 kernels per training step") != std::string::npos);
}
