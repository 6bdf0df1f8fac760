// mode::reduce_overhead on the CPU (kiln/train/captures.hpp, kiln/backend/cpu/step_graph.hpp):
// replayed steps give the parameters and losses eager steps give, bit for bit, for every
// precision and stance, with accumulation, schedules, several batch shapes and a model frozen
// after its capture; the stances' answers to a new shape; the cap; a layer a replay cannot run
// again (dropout) keeps its shape eager and the step says which launch. The allocation count of
// a replayed step is in tests/memory (it needs a counting operator new).
#include <kiln/train.hpp>

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "step_helpers.hpp"

using namespace kiln;

namespace {

using kiln_step_test::OwnedBatch;
using kiln_step_test::random_batch;
using kiln_step_test::values_of;

using Mlp = nn::Sequential<nn::Linear<12, 16>, nn::ReLU, nn::Linear<16, 8>, nn::GELU, nn::Linear<8, 4>>;
using NormMlp = nn::Sequential<nn::Linear<12, 16>, nn::LayerNorm<16>, nn::ReLU, nn::Linear<16, 4>>;
using DropMlp = nn::Sequential<nn::Linear<12, 16>, nn::ReLU, nn::Dropout<0.25>, nn::Linear<16, 4>>;
// An opaque function whose host work no launch shows: a replay would skip it.
struct CountCalls {
  static constexpr const char* name = "count_calls";
  int* calls;
  template <class Tape, class X>
  auto operator()(Tape& tape, const X& x) const {
    ++*calls;
    return ag::map(tape, x * 0.5f);
  }
};

struct Run {
  std::vector<float> params;
  std::vector<float> losses;
  train::CaptureCounts counts;
  std::string not_replayable;
};

// `rows[i]` rows in micro-batch i (a fresh random batch each), `Policy`'s step, AdamW with a
// schedule that changes the rate every optimizer step.
template <class Model, class Policy>
Run train_run(const std::vector<index_t>& rows, index_t accumulate = 1, train::StepOptions options = {}) {
  CpuExecutor exec(2);
  Model model(7);
  optim::AdamW opt(model, {.lr = 1e-2, .weight_decay = 0.01});
  options.accumulate = Policy::accumulate == dyn ? accumulate : 0;
  train::Step step(model, opt, exec, Policy{}, train::CrossEntropy{}, options);
  step.set_schedule(optim::CosineAnnealingLr(1e-2, index_t(rows.size()) / accumulate, 1e-4));
  Run out;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    OwnedBatch b = random_batch(rows[i], 100 + i);
    step(b.batch());
    for (float l : step.take_losses()) out.losses.push_back(l);
  }
  out.params = values_of(model);
  if constexpr (decltype(step)::captures) {
    out.counts = step.captures_made().counts();
    for (const auto& c : step.captures_made().all())
      if (!c->graph.replayable()) out.not_replayable = c->graph.not_replayable();
  }
  return out;
}

template <class Model, class... Tags>
void check_replay_equals_default(const std::vector<index_t>& rows, index_t accumulate = 1) {
  const Run eager = train_run<Model, policy<Tags...>>(rows, accumulate);
  const Run replayed = train_run<Model, policy<mode::reduce_overhead, Tags...>>(rows, accumulate);
  CHECK(replayed.params == eager.params);
  CHECK(replayed.losses == eager.losses);
  CHECK(replayed.not_replayable.empty());
  CHECK(replayed.counts.replays > 0);
  CHECK(replayed.counts.eager_steps == 0);
}

}  // namespace

TEST_CASE("reduce_overhead: replayed steps equal eager steps bit for bit, every precision and stance") {
  const std::vector<index_t> rows(9, 10);
  SUBCASE("fp32") { check_replay_equals_default<Mlp>(rows); }
  SUBCASE("fp32, LayerNorm") { check_replay_equals_default<NormMlp>(rows); }
  SUBCASE("force_eager") { check_replay_equals_default<Mlp, stance::force_eager>(rows); }
  SUBCASE("bf16_mixed") { check_replay_equals_default<Mlp, precision::bf16_mixed>(rows); }
  SUBCASE("fp16_mixed with its loss scaler") { check_replay_equals_default<Mlp, precision::fp16_mixed>(rows); }
  SUBCASE("accumulate<3>: one capture per micro-batch position") {
    check_replay_equals_default<Mlp, accumulate<3>>(rows, 3);
    const Run r = train_run<Mlp, policy<mode::reduce_overhead, accumulate<3>>>(rows, 3);
    CHECK(r.counts.captured_steps == 3);
    CHECK(r.counts.replays == 6);
  }
}

TEST_CASE("reduce_overhead: each batch shape is captured once, and the last partial batch too") {
  const std::vector<index_t> rows{16, 16, 5, 16, 5, 16, 9, 9};
  check_replay_equals_default<Mlp>(rows);
  const Run r = train_run<Mlp, policy<mode::reduce_overhead>>(rows);
  CHECK(r.counts.captured_steps == 3);
  CHECK(r.counts.replays == 5);
}

TEST_CASE("reduce_overhead: stances at a new shape — eager_on_recompile runs it eagerly, fail_on_recompile refuses it") {
  const std::vector<index_t> rows{16, 16, 5, 16, 5};
  const Run eager = train_run<Mlp, policy<>>(rows);
  const Run r = train_run<Mlp, policy<mode::reduce_overhead, stance::eager_on_recompile>>(rows);
  CHECK(r.params == eager.params);
  CHECK(r.counts.captured_steps == 1);
  CHECK(r.counts.replays == 2);
  CHECK(r.counts.eager_steps == 2);
  CHECK_THROWS_WITH_AS((train_run<Mlp, policy<mode::reduce_overhead, stance::fail_on_recompile>>(rows)),
                       doctest::Contains("met batch shape [5, 12], which was not captured; captured: [16, 12]"),
                       ValueError);
}

TEST_CASE("reduce_overhead: past the cap on captured shapes is an error naming them") {
  train::StepOptions options;
  options.max_captured_shapes = 2;
  CHECK_THROWS_WITH_AS((train_run<Mlp, policy<mode::reduce_overhead>>({4, 5, 6}, 1, options)),
                       doctest::Contains("would capture a 3th batch shape, [6, 12], past the cap of 2"), ValueError);
  options.max_captured_shapes = 0;
  CHECK_THROWS_AS((train_run<Mlp, policy<mode::reduce_overhead>>({4}, 1, options)), ValueError);
}

TEST_CASE("reduce_overhead: dropout cannot be replayed on the CPU; its shape stays eager and the step says why") {
  const std::vector<index_t> rows(5, 10);
  const Run eager = train_run<DropMlp, policy<>>(rows);
  const Run r = train_run<DropMlp, policy<mode::reduce_overhead>>(rows);
  CHECK(r.params == eager.params);
  CHECK(r.counts.replays == 0);
  CHECK(r.counts.captured_steps == 1);
  CHECK(r.counts.eager_steps == 4);
  CHECK(r.not_replayable.find("dropout") != std::string::npos);
}

TEST_CASE("reduce_overhead: an opaque function keeps its shape eager (it runs every step) and the report names it") {
  using Model = nn::Sequential<nn::Linear<12, 16>, nn::ReLU, nn::Opaque<CountCalls>, nn::Linear<16, 4>>;
  int calls = 0;
  CpuExecutor exec(1);
  Model model(nn::Linear<12, 16>(1), nn::ReLU{}, nn::Opaque<CountCalls>(CountCalls{&calls}), nn::Linear<16, 4>(2));
  optim::SGD opt(model, {.lr = 0.1});
  train::Step step(model, opt, exec, policy<mode::reduce_overhead>{});
  OwnedBatch b = random_batch(6, 3);
  for (int s = 0; s < 4; ++s) step(b.batch());
  CHECK(calls == 4);
  CHECK(step.captures_made().counts().replays == 0);
  CHECK(step.mode_report().find("[6, 12] runs through the tape at every step: opaque(count_calls) cannot be captured") !=
        std::string::npos);
}

TEST_CASE("reduce_overhead: a bad label is still caught at replay, naming its row") {
  CpuExecutor exec(1);
  Mlp model(1);
  optim::SGD opt(model, {.lr = 0.1});
  train::Step step(model, opt, exec, policy<mode::reduce_overhead>{});
  OwnedBatch b = random_batch(6, 3);
  step(b.batch());
  step(b.batch());
  b.y[4] = 9;
  CHECK_THROWS_WITH_AS(step(b.batch()), doctest::Contains("the label of row 4 is 9"), ValueError);
  CHECK(step.captures_made().counts().replays == 1);  // the third step threw inside its replay
}

TEST_CASE("reduce_overhead: freezing a layer after the capture captures again, as the frozen model's steps") {
  auto run = [](bool capture) {
    CpuExecutor exec(1);
    Mlp model(5);
    optim::SGD opt(model, {.lr = 0.05, .momentum = 0.9});
    std::vector<float> losses;
    auto go = [&](auto policy_tag) {
      train::Step step(model, opt, exec, policy_tag);
      for (int s = 0; s < 6; ++s) {
        if (s == 3) nn::freeze(model.layer<0>());
        OwnedBatch b = random_batch(8, 40 + std::uint64_t(s));
        step(b.batch());
        for (float l : step.take_losses()) losses.push_back(l);
      }
      if constexpr (decltype(step)::captures) {
        CHECK(step.captures_made().counts().captured_steps == 2);
        CHECK(step.captures_made().counts().replays == 4);
      }
    };
    if (capture) go(policy<mode::reduce_overhead>{});
    else go(policy<>{});
    std::vector<float> out = values_of(model);
    out.insert(out.end(), losses.begin(), losses.end());
    return out;
  };
  CHECK(run(true) == run(false));
}

TEST_CASE("reduce_overhead: the step's launches are counted at replay as at capture") {
  CpuExecutor exec(1);
  Mlp model(2);
  optim::AdamW opt(model, {.lr = 1e-3});
  train::Step step(model, opt, exec, policy<mode::reduce_overhead>{});
  OwnedBatch b = random_batch(8, 9);
  std::vector<std::size_t> per_step;
  for (int s = 0; s < 3; ++s) {
    const std::size_t before = exec.stats().launches();
    step(b.batch());
    per_step.push_back(exec.stats().launches() - before);
  }
  CHECK(per_step[1] == per_step[0]);
  CHECK(per_step[2] == per_step[0]);
  CHECK(index_t(per_step[0]) == step.predicted_launches());
  CHECK(step.describe().find("mode reduce_overhead") != std::string::npos);
}
