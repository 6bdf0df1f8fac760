// Fine-tuning with frozen parameters (nn/freeze.hpp): a frozen layer gets no gradient buffer and
// no optimizer state and keeps its values bit for bit; the trainable layers get exactly the
// gradients they would get with nothing frozen; and the launches a step runs are those predicted
// for the frozen model (fewer than with every layer trainable), for MLPs, LayerNorm and convnets
// with residual blocks, in both stances and under mixed precision; a frozen batch norm keeps its
// running statistics.
#include <kiln/train.hpp>
#include <kiln/train/checkpoint.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <unistd.h>

#include "step_helpers.hpp"

using namespace kiln;

namespace {

using kiln_step_test::OwnedBatch;
using kiln_step_test::random_batch;
using kiln_step_test::values_of;

using Mlp = nn::Sequential<nn::Linear<12, 16>, nn::ReLU, nn::Linear<16, 8>, nn::ReLU, nn::Linear<8, 4>>;
using PlainMlp = nn::Sequential<nn::Linear<12, 16>, nn::Linear<16, 8, false>, nn::Linear<8, 4>>;
using NormMlp = nn::Sequential<nn::Linear<12, 16>, nn::LayerNorm<16>, nn::ReLU, nn::Linear<16, 4>>;
using Cnn = nn::Sequential<nn::Unflatten<3, 2, 2>, nn::Conv2d<3, 4, 3, 1, 1>, nn::BatchNorm2d<4>, nn::ReLU,
                           nn::Residual<nn::Sequential<nn::Conv2d<4, 4, 3, 1, 1>, nn::ReLU>>, nn::Flatten,
                           nn::Linear<16, 4>>;

// Values of the parameters whose requires_grad is `trainable`, in order.
template <class Model>
std::vector<float> values_where(const Model& m, bool trainable) {
  std::vector<float> out;
  m.for_each_parameter([&](const auto& v) {
    if (v.requires_grad() == trainable) out.insert(out.end(), v.value().data(), v.value().data() + v.value().size());
  });
  return out;
}

// Trains a copy of the model frozen by `freeze` for 3 steps of 2 micro-batches under Policy and
// checks what a frozen layer promises. Returns the launches of one step.
template <class Model, class Policy>
index_t check_frozen_training(const std::function<void(Model&)>& freeze, const char* what) {
  CAPTURE(what);
  CpuExecutor exec(1);
  Model model(11);
  freeze(model);
  const std::vector<float> frozen_before = values_where(model, false);
  optim::AdamW opt(model, {.lr = 1e-2});
  CHECK(opt.table().count() == model.trainable_parameter_tensors());
  train::Step step(model, opt, exec, Policy{}, {}, {.accumulate = 2});
  index_t per_step = 0;
  for (int s = 0; s < 3; ++s) {
    const auto before = exec.stats().launches();
    for (int m = 0; m < 2; ++m) {
      OwnedBatch b = random_batch(5, 30 + std::uint64_t(2 * s + m));
      step(b.batch());
    }
    per_step = index_t(exec.stats().launches() - before);
    CHECK(per_step == step.predicted_launches());
  }
  CHECK(values_where(model, false) == frozen_before);  // bit for bit
  model.for_each_parameter([](const auto& v) {
    if (!v.requires_grad()) CHECK(v.data()->grad.size() == 0);  // no gradient buffer was made
  });
  return per_step;
}

// A way to freeze a model, and whether it saves launches (a frozen bias whose gradient rides the
// weight gradient's GEMM saves none).
template <class Model>
struct Pattern {
  const char* what;
  std::function<void(Model&)> freeze;
  bool fewer = true;
};

template <class Model>
void check_patterns(const std::vector<Pattern<Model>>& patterns) {
  using Fused = kiln::policy<kiln::accumulate<kiln::dyn>>;
  using Eager = kiln::policy<kiln::stance::force_eager, kiln::accumulate<kiln::dyn>>;
  const index_t all_fused = check_frozen_training<Model, Fused>([](Model&) {}, "nothing frozen, fused");
  const index_t all_eager = check_frozen_training<Model, Eager>([](Model&) {}, "nothing frozen, eager");
  for (const auto& [what, freeze, fewer] : patterns) {
    const index_t fused = check_frozen_training<Model, Fused>(freeze, what);
    const index_t eager = check_frozen_training<Model, Eager>(freeze, what);
    CHECK(fused <= all_fused);
    CHECK(eager < all_eager);
    if (fewer) CHECK(fused < all_fused);
  }
}

}  // namespace

TEST_CASE("freeze: an MLP trains with any of its layers or parameters frozen, in both stances") {
  check_patterns<Mlp>({
      {"first layer", [](Mlp& m) { nn::freeze(m.layer<0>()); }},
      {"all but the last layer", [](Mlp& m) {
         nn::freeze(m);
         nn::unfreeze(m.layer<4>());
       }},
      {"the middle layer", [](Mlp& m) { nn::freeze(m.layer<2>()); }},
      {"one bias", [](Mlp& m) { nn::set_requires_grad(m.layer<4>().bias(), false); }, false},
      {"one weight", [](Mlp& m) { nn::set_requires_grad(m.layer<2>().weight(), false); }},
      {"all but the first layer", [](Mlp& m) {
         nn::freeze(m.layer<2>());
         nn::freeze(m.layer<4>());
       }},
  });
}

TEST_CASE("freeze: Linear without activations, LayerNorm, and a convnet with a residual block") {
  check_patterns<PlainMlp>({
      {"first layer", [](PlainMlp& m) { nn::freeze(m.layer<0>()); }},
      {"last weight only (its bias then a reduction of its own)",
       [](PlainMlp& m) { nn::set_requires_grad(m.layer<2>().weight(), false); }, false},
      {"middle (no bias)", [](PlainMlp& m) { nn::freeze(m.layer<1>()); }},
  });
  check_patterns<NormMlp>({
      {"first layer and the norm", [](NormMlp& m) {
         nn::freeze(m.layer<0>());
         nn::freeze(m.layer<1>());
       }},
      {"the norm only", [](NormMlp& m) { nn::freeze(m.layer<1>()); }},
  });
  check_patterns<Cnn>({
      {"stem conv and batch norm", [](Cnn& m) {
         nn::freeze(m.layer<1>());
         nn::freeze(m.layer<2>());
       }},
      {"everything but the head", [](Cnn& m) {
         nn::freeze(m);
         nn::unfreeze(m.layer<6>());
       }},
      {"the residual block", [](Cnn& m) { nn::freeze(m.layer<4>()); }},
      // On the CPU one pass computes a convolution's filter and bias gradients together.
      {"the stem conv's bias", [](Cnn& m) { nn::set_requires_grad(m.layer<1>().bias(), false); }, false},
  });
}

TEST_CASE("freeze: under mixed precision the count still holds and frozen master weights stay put") {
  auto check = [&]<class Policy>() {
    const index_t all = check_frozen_training<Mlp, Policy>([](Mlp&) {}, "nothing frozen");
    CHECK(check_frozen_training<Mlp, Policy>([](Mlp& m) { nn::freeze(m.layer<0>()); }, "first layer") < all);
  };
  check.template operator()<kiln::policy<kiln::precision::bf16_mixed, kiln::accumulate<kiln::dyn>>>();
  check.template operator()<kiln::policy<kiln::precision::fp16_mixed, kiln::accumulate<kiln::dyn>>>();
}

TEST_CASE("freeze: trainable layers get exactly the gradients they get with nothing frozen") {
  CpuExecutor exec(1);
  ag::Tape<CpuExecutor> tape(exec);
  OwnedBatch b = random_batch(7, 5);
  Tensor<float, host, dyn, 12> xt(7, 12);
  std::copy(b.x.begin(), b.x.end(), xt.data());
  const ag::Var<float, host, dyn, 12> x(std::move(xt));
  auto gradients = [&](auto& model) {
    (void)model.parameters();  // gradient buffers for the trainable parameters
    model.zero_grad();
    tape.backward(nn::cross_entropy(tape, model.forward(tape, x), b.y.data()));
    std::vector<std::vector<float>> out;
    model.for_each_parameter([&](const auto& v) {
      if (v.requires_grad()) out.emplace_back(v.data()->grad.data(), v.data()->grad.data() + v.value().size());
      else out.emplace_back();
    });
    return out;
  };
  for (int pattern = 0; pattern < 3; ++pattern) {
    CAPTURE(pattern);
    Mlp all(3), frozen(3);
    if (pattern == 0) nn::freeze(frozen.layer<0>());
    if (pattern == 1) nn::freeze(frozen.layer<2>());
    if (pattern == 2) nn::set_requires_grad(frozen.layer<4>().weight(), false);
    const auto want = gradients(all), got = gradients(frozen);
    REQUIRE(want.size() == got.size());
    int compared = 0;
    for (std::size_t k = 0; k < want.size(); ++k) {
      if (got[k].empty()) continue;
      CHECK(got[k] == want[k]);
      ++compared;
    }
    CHECK(compared >= 3);
  }
}

TEST_CASE("freeze: counts, describe, unfreeze, and an optimizer built before freezing skips the layer") {
  Mlp model(2);
  const index_t total = model.parameter_count();
  CHECK(model.trainable_parameter_count() == total);
  nn::freeze(model.layer<0>());
  CHECK(model.trainable_parameter_count() == total - (12 * 16 + 16));
  CHECK(model.trainable_parameter_tensors() == 4);
  CHECK(!nn::any_trainable(model.layer<0>()));
  CHECK(nn::any_trainable(model));
  CHECK(!nn::all_trainable(model));
  CHECK(model.describe().find("trainable)") != std::string::npos);
  CHECK(model.parameters().size() == 4);
  nn::unfreeze(model);
  CHECK(nn::all_trainable(model));
  CHECK(model.describe().find("trainable") == std::string::npos);

  // Built first, then frozen: the optimizer still lists the layer but its gradient is never valid
  // again, so it is skipped and keeps its values.
  CpuExecutor exec(1);
  Mlp late(4);
  optim::AdamW opt(late, {.lr = 1e-2});
  train::Step step(late, opt, exec);
  OwnedBatch b = random_batch(5, 1);
  step(b.batch());
  nn::freeze(late.layer<0>());
  const std::vector<float> first = values_where(late, false);
  for (int s = 0; s < 3; ++s) step(b.batch());
  CHECK(values_where(late, false) == first);
}

TEST_CASE("freeze: a frozen batch norm normalises with its running statistics and leaves them, in train mode too") {
  CpuExecutor exec(1);
  Cnn model(5);
  auto& bn = model.layer<2>();
  auto stats = [&] {
    const auto& buf = bn.buffers();
    std::vector<float> v(buf.running_mean.data(), buf.running_mean.data() + 4);
    v.insert(v.end(), buf.running_var.data(), buf.running_var.data() + 4);
    v.push_back(float(buf.batches_tracked));
    return v;
  };
  optim::AdamW opt(model, {.lr = 1e-2});
  train::Step step(model, opt, exec);
  for (int s = 0; s < 3; ++s) {  // statistics away from their initial values
    OwnedBatch b = random_batch(5, 60 + std::uint64_t(s));
    step(b.batch());
  }
  const auto moved = stats();
  CHECK(moved.back() == 3.0f);

  nn::freeze(bn);
  CHECK(bn.training());  // still in train mode: being frozen is what keeps its statistics
  CHECK_FALSE(bn.updates_statistics());
  // Its model's output in train mode is the output in eval mode, bit for bit.
  ag::Tape<CpuExecutor> tape(exec);
  OwnedBatch in = random_batch(6, 70);
  Tensor<float, host, dyn, 12> xt(6, 12);
  std::copy(in.x.begin(), in.x.end(), xt.data());
  const ag::Var<float, host, dyn, 12> x(std::move(xt));
  auto output = [&] {
    ag::NoGrad no_grad;
    const auto y = model.forward(tape, x);
    return std::vector<float>(y.value().data(), y.value().data() + y.value().size());
  };
  const auto in_train_mode = output();
  model.eval();
  const auto in_eval_mode = output();
  model.train();
  CHECK(in_train_mode == in_eval_mode);

  // Training around it (the optimizer built before, so it still lists the layer) leaves it.
  for (int s = 0; s < 3; ++s) {
    OwnedBatch b = random_batch(5, 80 + std::uint64_t(s));
    step(b.batch());
  }
  CHECK(stats() == moved);
  // Unfrozen, its statistics move again.
  nn::unfreeze(bn);
  CHECK(bn.updates_statistics());
  OwnedBatch b = random_batch(5, 90);
  step(b.batch());
  CHECK(stats() != moved);
}

TEST_CASE("freeze: a checkpoint of a frozen run resumes into a frozen run and refuses an unfrozen one") {
  namespace fs = std::filesystem;
  const fs::path file = fs::temp_directory_path() / ("kiln_freeze_" + std::to_string(::getpid()) + ".safetensors");
  CpuExecutor exec(1);
  Mlp a(6);
  nn::freeze(a.layer<0>());
  optim::AdamW opt_a(a, {.lr = 1e-2});
  train::Step step_a(a, opt_a, exec);
  for (int s = 0; s < 3; ++s) {
    OwnedBatch b = random_batch(5, 50 + std::uint64_t(s));
    step_a(b.batch());
  }
  train::save_checkpoint(file.string(), step_a, {.epoch = 0, .batch = 3});

  Mlp b(99);
  nn::freeze(b.layer<0>());
  optim::AdamW opt_b(b, {.lr = 1e-2});
  train::Step step_b(b, opt_b, exec);
  (void)train::load_checkpoint(file.string(), step_b);
  CHECK(values_of(a) == values_of(b));
  for (int s = 3; s < 5; ++s) {
    OwnedBatch batch = random_batch(5, 50 + std::uint64_t(s));
    step_a(batch.batch());
    step_b(batch.batch());
  }
  CHECK(values_of(a) == values_of(b));  // the optimizer state came along

  Mlp c(99);
  optim::AdamW opt_c(c, {.lr = 1e-2});
  train::Step step_c(c, opt_c, exec);
  const std::vector<float> before = values_of(c);
  CHECK_THROWS_AS((void)train::load_checkpoint(file.string(), step_c), DataError);
  CHECK(values_of(c) == before);  // nothing applied
  fs::remove(file);
}
