// Data-parallel training on MPI (kiln/dist/), run by ctest under mpirun with 2 and 3 ranks (every
// rank runs every case, in order: the cases are collective).
// - Collectives against known values: rank r contributes r * 100 + i at element i, so a sum is
//   100 W (W - 1) / 2 + W i; broadcast from the first and the last rank; all-gather.
// - The data-parallel step: K optimizer steps on W ranks at batch B each (their shards of one
//   permutation) give the parameters one process gets at batch W B — the process computes that
//   reference itself, alone — within fp32 rounding; the same with 2 accumulated micro-batches.
// - Buckets all-reduced during backward (overlap) give bit for bit what reducing after backward
//   gives, with accumulation too (once per optimizer step).
// - The ranks start from rank 0's parameters; ranks whose models differ all fail, naming it.
// - fp16_mixed with the loss scaler: a batch that overflows on one rank skips that step on every
//   rank, which stay identical.
#include <doctest/doctest.h>

#include <kiln/train.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "../cpu/step_helpers.hpp"

using kiln::index_t;
using kiln_step_test::values_of;
namespace dist = kiln::dist;
namespace nn = kiln::nn;

namespace {

dist::ProcessGroup& group() { return dist::ProcessGroup::world(); }

using Mlp = nn::Sequential<nn::Linear<12, 32>, nn::ReLU, nn::Linear<32, 4>>::on<kiln::host>;

kiln::data::Dataset dataset(index_t n) {
  kiln::data::Dataset d;
  d.n = n;
  d.d = 12;
  d.num_classes = 4;
  kiln::Generator g(77);
  for (index_t i = 0; i < n * 12; ++i) d.features.push_back(g.uniform(-1.f, 1.f));
  for (index_t i = 0; i < n; ++i) d.labels.push_back(std::int32_t(g.below(4)));
  return d;
}

double worst_difference(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(double(a[i]) - double(b[i])));
  return worst;
}

// `steps` optimizer steps of the MLP at `batch` rows per micro-batch, `accumulate` micro-batches
// per step, over `shard` of each epoch, data-parallel over `over` (null: alone). The model starts
// from seed 5 + rank when `differ_per_rank` (the broadcast must make them one).
struct Trained {
  std::vector<float> params;
  index_t overlapped = 0;  // buckets all-reduced during backward
};

template <class Policy = kiln::policy<kiln::accumulate<kiln::dyn>>>
Trained train(index_t batch, int accumulate, int steps, kiln::data::LoaderOptions::Shard shard,
              dist::ProcessGroup* over, bool differ_per_rank = false, dist::DataParallelOptions dp = {}) {
  kiln::CpuExecutor exec(1);
  Mlp model(differ_per_rank ? 5 + std::uint64_t(group().rank()) : 5);
  kiln::optim::AdamW opt(model, {.lr = 1e-2});
  kiln::train::Step step(model, opt, exec, Policy{}, kiln::train::CrossEntropy{},
                         {.accumulate = accumulate, .data_parallel = over, .data_parallel_options = dp});
  const auto data = dataset(96);
  kiln::data::BatchLoader<kiln::host> loader(data, {.batch_size = batch, .seed = 3, .workers = 0, .shard = shard},
                                             exec);
  int micro = 0;
  for (index_t epoch = 0; micro < steps * accumulate; ++epoch) {
    loader.start_epoch(epoch);
    while (const auto* b = loader.next()) {
      if (b->size != batch) continue;  // whole batches only: the reference's last one differs
      step(*b);
      if (++micro == steps * accumulate) break;
    }
  }
  return {values_of(model), step.reducer() ? step.reducer()->buckets_overlapped() : 0};
}

}  // namespace

TEST_CASE("all_reduce sums and averages float, double, int32 and int64 across the ranks") {
  const int w = group().size(), r = group().rank();
  MESSAGE(group().describe());
  REQUIRE(w >= 2);
  CHECK(std::string(group().backend()) == "mpi");
  std::vector<float> f(1000);
  std::vector<double> d(1000);
  std::vector<std::int32_t> i32(5);
  std::vector<std::int64_t> i64(5);
  for (std::size_t i = 0; i < f.size(); ++i) f[i] = float(r * 100 + int(i % 50)), d[i] = double(r * 100) + double(i);
  for (std::size_t i = 0; i < i32.size(); ++i) i32[i] = r * 100 + int(i), i64[i] = (std::int64_t(r) << 40) + std::int64_t(i);
  group().all_reduce(f.data(), index_t(f.size()));
  group().all_reduce(d.data(), index_t(d.size()), dist::ReduceOp::average);
  group().all_reduce(i32.data(), index_t(i32.size()));
  group().all_reduce(i64.data(), index_t(i64.size()));
  const int rank_sum = w * (w - 1) / 2;
  for (std::size_t i = 0; i < f.size(); ++i) {
    CHECK(f[i] == float(100 * rank_sum + w * int(i % 50)));
    CHECK(d[i] == doctest::Approx(double(100 * rank_sum) / w + double(i)).epsilon(1e-15));
  }
  for (std::size_t i = 0; i < i32.size(); ++i) {
    CHECK(i32[i] == 100 * rank_sum + w * int(i));
    CHECK(i64[i] == (std::int64_t(rank_sum) << 40) + w * std::int64_t(i));
  }
  group().all_reduce(f.data(), 0);  // nothing to do, on every rank alike
}

TEST_CASE("broadcast gives every rank the root's bytes; all_gather puts rank r's block at r") {
  const int w = group().size(), r = group().rank();
  for (int root : {0, w - 1}) {
    std::vector<std::int32_t> v(7, r == root ? 1000 + root : -1);
    group().broadcast(v.data(), index_t(v.size()), root);
    for (std::int32_t x : v) CHECK(x == 1000 + root);
  }
  const float mine[3] = {float(r), float(r) + 0.5f, float(10 * r)};
  std::vector<float> all(std::size_t(3 * w), -1.f);
  group().all_gather(mine, 3, all.data());
  for (int q = 0; q < w; ++q) {
    CHECK(all[std::size_t(3 * q)] == float(q));
    CHECK(all[std::size_t(3 * q + 1)] == float(q) + 0.5f);
    CHECK(all[std::size_t(3 * q + 2)] == float(10 * q));
  }
  CHECK_THROWS_WITH_AS(group().broadcast(all.data(), 1, w), doctest::Contains("broadcast from rank"), dist::DistError);
}

TEST_CASE("data-parallel steps on W ranks at batch B give one process's parameters at batch W B") {
  const int w = group().size(), r = group().rank();
  for (int accumulate : {1, 2}) {
    CAPTURE(accumulate);
    const auto parallel = train(8, accumulate, 4, {r, w}, &group(), /*differ_per_rank=*/true).params;
    const auto alone = train(8 * w, accumulate, 4, {0, 1}, nullptr).params;
    CHECK(worst_difference(parallel, alone) <= 2e-6);
    // Every rank holds the same parameters, bit for bit (one average, the same optimizer step).
    std::vector<float> root = parallel;
    group().broadcast(root.data(), index_t(root.size()), 0);
    CHECK(root == parallel);
  }
}

TEST_CASE("gradients all-reduced during backward give, bit for bit, what reducing after backward gives") {
  const int w = group().size(), r = group().rank();
  // Buckets of one parameter each (the MLP's largest is 1.5 kB): four all-reduces per step, the
  // first three able to start while backward still runs.
  for (int accumulate : {1, 3}) {
    CAPTURE(accumulate);
    const auto during = train(8, accumulate, 5, {r, w}, &group(), false, {.bucket_bytes = 4, .overlap = true});
    const auto after = train(8, accumulate, 5, {r, w}, &group(), false, {.bucket_bytes = 4, .overlap = false});
    CHECK(during.params == after.params);
    CHECK(during.overlapped == 5 * 4);  // every bucket of every step went during backward
    CHECK(after.overlapped == 0);
    const auto big = train(8, accumulate, 5, {r, w}, &group(), false, {.overlap = true});  // one 25 MB bucket
    CHECK(big.params == after.params);
  }
}

TEST_CASE("after the first backward the buckets follow the order backward finished the gradients") {
  const int w = group().size(), r = group().rank();
  kiln::CpuExecutor exec(1);
  Mlp model(5);  // table: W1 [32 x 12], b1 [32], W2 [4 x 32], b2 [4]
  kiln::optim::AdamW opt(model, {.lr = 1e-2});
  // 175 floats a bucket: in reverse table order b2, W2 and b1 share one, so W2's would wait for b1,
  // which backward finishes last.
  kiln::train::Step step(model, opt, exec, kiln::policy<>{}, kiln::train::CrossEntropy{},
                         {.data_parallel = &group(), .data_parallel_options = {.bucket_bytes = 700}});
  dist::GradientReducer& reducer = *step.reducer();
  CHECK(reducer.bucket_of(1) == reducer.bucket_of(2));
  const auto data = dataset(96);
  kiln::data::BatchLoader<kiln::host> loader(data, {.batch_size = 8, .seed = 3, .workers = 0, .shard = {r, w}}, exec);
  loader.start_epoch(0);
  step(*loader.next());
  CHECK(reducer.bucket_of(2) == reducer.bucket_of(3));  // W2 with b2
  CHECK(reducer.bucket_of(1) != reducer.bucket_of(2));  // b1 no longer with them
  CHECK(reducer.bucket_of(0) != reducer.bucket_of(2));
  step(*loader.next());
  CHECK(reducer.buckets_overlapped() >= 2);
}

TEST_CASE("ranks whose models differ all fail at the start, the differing rank naming the parameter") {
  const int r = group().rank();
  using Wide = nn::Sequential<nn::Linear<12, 33>, nn::ReLU, nn::Linear<33, 4>>::on<kiln::host>;
  kiln::CpuExecutor exec(1);
  Mlp same(1);
  Wide wide(1);
  const kiln::optim::ParamTable table = r == 1 ? wide.param_table() : same.param_table();
  dist::GradientReducer reducer(group(), table);
  if (r == 1)
    CHECK_THROWS_WITH_AS(reducer.check_same_model(), doctest::Contains("parameter 0 has 396 elements on rank 1"),
                         dist::DistError);
  else
    CHECK_THROWS_WITH_AS(reducer.check_same_model(), doctest::Contains("disagree on the model"), dist::DistError);
}

TEST_CASE("fp16_mixed: a batch that overflows on one rank skips that step on every rank") {
  const int r = group().rank(), w = group().size();
  kiln::CpuExecutor exec(1);
  Mlp model(5);
  kiln::optim::AdamW opt(model, {.lr = 1e-2});
  kiln::train::Step step(model, opt, exec, kiln::policy<kiln::precision::fp16_mixed>{}, kiln::train::CrossEntropy{},
                         {.data_parallel = &group()});
  const auto data = dataset(160);  // at least 5 batches of 8 on each of 3 ranks
  kiln::data::BatchLoader<kiln::host> loader(data, {.batch_size = 8, .seed = 3, .workers = 0, .shard = {r, w}}, exec);
  loader.start_epoch(0);
  std::vector<float> before;
  for (int s = 1; s <= 5; ++s) {
    const auto* b = loader.next();
    REQUIRE(b != nullptr);
    // Step 3 on the last rank: a feature beyond fp16's range; its gradients come out inf / NaN
    // during backward, and the average carries them to every rank.
    std::vector<float> features(b->features.begin(), b->features.end());
    if (s == 3 && r == w - 1) features[5] = 1e30f;
    before = values_of(model);
    step.run(features.data(), b->labels.data(), b->size, b->dim);
    if (s == 3) CHECK(values_of(model) == before);  // skipped on every rank
    else CHECK(values_of(model) != before);
  }
  CHECK(step.scaler().skipped_steps() == 1);
  std::vector<float> root = values_of(model);
  group().broadcast(root.data(), index_t(root.size()), 0);
  CHECK(root == values_of(model));
}
