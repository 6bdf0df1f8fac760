// Data-parallel training on a GPU (kiln/dist/nccl.cuh, kiln/dist/device_reducer.cuh) with the
// world-size-1 NCCL group a single process gets: the collectives on device memory against known
// values, and the data-parallel Step (every collective runs: broadcast, the buckets' averages)
// against the same Step alone — bit for bit, since an average over one rank is exact — with
// overlap on and off, accumulation, mixed precision and CUDA-graph replay. Several ranks need
// several GPUs: scripts/gpu_check.sh runs train_digits under mpirun where a node has them. A build
// without NCCL compiles one case that says so.
#include <doctest/doctest.h>

#include <kiln/train.cuh>

#include <cstdint>
#include <vector>

#include "step_support.hpp"

#if KILN_HAVE_NCCL
using kiln::index_t;
namespace dist = kiln::dist;
using kiln_cuda_step_test::dataset;
using kiln_cuda_step_test::Mlp;
using kiln_cuda_step_test::values_of;

namespace {

dist::ProcessGroup& world() { return dist::ProcessGroup::world(); }

template <class T>
std::vector<T> from_device(const T* p, index_t n) {
  std::vector<T> out(static_cast<std::size_t>(n));
  KILN_CUDA_CHECK(cudaMemcpy(out.data(), p, std::size_t(n) * sizeof(T), cudaMemcpyDeviceToHost));
  return out;
}

// Four optimizer steps of `accumulate` micro-batches of 16 rows on the GPU, data-parallel over the
// world (size 1 here) when `dp`; the parameters after them and the buckets averaged during backward.
template <class Policy>
std::vector<float> train(bool dp, dist::DataParallelOptions options, int accumulate, index_t* overlapped = nullptr) {
  const auto data = dataset(64);
  kiln::CudaExecutor exec;
  Mlp::on<kiln::cuda> model(3);
  kiln::optim::AdamW opt(model, {.lr = 1e-2});
  kiln::train::Step step(model, opt, exec, Policy{}, kiln::train::CrossEntropy{},
                         {.accumulate = accumulate, .data_parallel = dp ? &world() : nullptr,
                          .data_parallel_options = options});
  kiln::data::BatchLoader<kiln::cuda> loader(data, {.batch_size = 16, .seed = 2, .workers = 0}, exec);
  int micro = 0;
  for (index_t epoch = 0; micro < 4 * accumulate; ++epoch) {
    loader.start_epoch(epoch);
    while (const auto* b = loader.next()) {
      step(*b);
      if (++micro == 4 * accumulate) break;
    }
  }
  (void)step.take_losses(true);
  if (overlapped != nullptr) *overlapped = step.reducer() ? step.reducer()->buckets_overlapped() : 0;
  return values_of(model);
}

}  // namespace

TEST_CASE("a world-size-1 NCCL group: all-reduce, broadcast and all-gather on device memory") {
  REQUIRE(world().size() == 1);
  dist::use_local_device(world());
  dist::NcclGroup nccl(world());
  CHECK(nccl.size() == 1);
  CHECK(nccl.describe() == "rank 0 of 1 (nccl)");
  cudaStream_t stream = nullptr;
  KILN_CUDA_CHECK(cudaStreamCreate(&stream));
  const index_t n = 1000;
  std::vector<float> host(static_cast<std::size_t>(n));
  for (index_t i = 0; i < n; ++i) host[std::size_t(i)] = 0.25f * float(i) - 7.0f;
  float* a = nullptr;
  float* gathered = nullptr;
  KILN_CUDA_CHECK(cudaMalloc(&a, std::size_t(n) * sizeof(float)));
  KILN_CUDA_CHECK(cudaMalloc(&gathered, std::size_t(n) * sizeof(float)));
  KILN_CUDA_CHECK(cudaMemcpy(a, host.data(), std::size_t(n) * sizeof(float), cudaMemcpyHostToDevice));
  nccl.batched([&] {
    nccl.all_reduce(a, n, dist::ReduceOp::sum, stream);
    nccl.all_reduce(a, n, dist::ReduceOp::average, stream);
  });
  nccl.broadcast(a, n, 0, stream);
  nccl.all_gather(a, n, gathered, stream);
  nccl.wait(stream, "the test's collectives");
  CHECK(from_device(a, n) == host);  // one rank: its sum, its average and root's values are its own
  CHECK(from_device(gathered, n) == host);
  std::int64_t sizes[2] = {3, -4}, all[2] = {};
  nccl.all_gather_host(sizes, 2, all);
  CHECK(all[0] == 3);
  CHECK(all[1] == -4);
  double loss = 2.5;
  nccl.all_reduce_host(&loss, 1, dist::ReduceOp::average);
  CHECK(loss == 2.5);
  CHECK_THROWS_WITH_AS(nccl.broadcast(a, n, 1, stream), doctest::Contains("broadcast from rank 1 in a group of 1"),
                       dist::DistError);
  CHECK_FALSE(nccl.failed());
  KILN_CUDA_CHECK(cudaFree(a));
  KILN_CUDA_CHECK(cudaFree(gathered));
  KILN_CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST_CASE("the data-parallel Step on one GPU averages through NCCL and trains exactly as the Step alone") {
  using Fp32 = kiln::policy<kiln::accumulate<kiln::dyn>>;
  const auto alone = train<Fp32>(false, {}, 1);
  index_t overlapped = 0;
  // Small buckets: several per step, most of them all-reduced while backward runs.
  const auto during = train<Fp32>(true, {.bucket_bytes = 512, .overlap = true}, 1, &overlapped);
  CHECK(overlapped > 0);
  const auto after = train<Fp32>(true, {.bucket_bytes = 512, .overlap = false}, 1, &overlapped);
  CHECK(overlapped == 0);
  CHECK(during == alone);
  CHECK(after == alone);
  // Accumulation: one average per optimizer step.
  CHECK(train<Fp32>(true, {}, 2) == train<Fp32>(false, {}, 2));
}

TEST_CASE("the data-parallel Step on one GPU: fp16_mixed with its loss scaler, and CUDA-graph replay") {
  using Fp16 = kiln::policy<kiln::precision::fp16_mixed, kiln::accumulate<kiln::dyn>>;
  CHECK(train<Fp16>(true, {.bucket_bytes = 512}, 1) == train<Fp16>(false, {}, 1));
  using Replay = kiln::policy<kiln::mode::reduce_overhead, kiln::accumulate<kiln::dyn>>;
  index_t overlapped = 0;
  CHECK(train<Replay>(true, {.bucket_bytes = 512}, 1, &overlapped) == train<Replay>(false, {}, 1));
}

TEST_CASE("the data-parallel Step on one GPU rebuilds its buckets in the order backward finished them") {
  kiln::CudaExecutor exec;
  Mlp::on<kiln::cuda> model(3);  // table: W1 [32 x 12], b1, W2 [16 x 32], b2, W3 [4 x 16], b3
  kiln::optim::AdamW opt(model, {.lr = 1e-2});
  kiln::train::Step step(model, opt, exec, kiln::policy<>{}, kiln::train::CrossEntropy{},
                         {.data_parallel = &world(), .data_parallel_options = {.bucket_bytes = 300}});
  auto& reducer = *step.reducer();
  const index_t before = reducer.buckets();
  const auto data = dataset(64);
  kiln::data::BatchLoader<kiln::cuda> loader(data, {.batch_size = 16, .seed = 2, .workers = 0}, exec);
  loader.start_epoch(0);
  step(*loader.next());
  CHECK(reducer.buckets() >= before - 1);
  CHECK(reducer.bucket_of(4) == reducer.bucket_of(5));  // W3 travels with b3
  step(*loader.next());
  CHECK(reducer.buckets_overlapped() >= 2);
  (void)step.take_losses(true);
}

TEST_CASE("the gradient reducer works on the executor's stream of the moment: its capture stream while a step is captured") {
  // Issue 32: the reducer asked its construction-time stream whether a capture was under way,
  // and queued its events there; under reduce_overhead the step runs on the executor's capture
  // stream, so the all-reduce ran eagerly on the previous step's gradients and skipped the real
  // ones — invisible at world size 1 (an average over one rank is exact), ranks apart from step 2.
  kiln::CudaExecutor exec;
  Mlp::on<kiln::cuda> model(3);
  kiln::optim::AdamW opt(model, {.lr = 1e-2});
  kiln::train::Step step(model, opt, exec, kiln::policy<>{}, kiln::train::CrossEntropy{},
                         {.data_parallel = &world()});
  auto& reducer = *step.reducer();
  const cudaStream_t eager = exec.stream();
  CHECK(reducer.stream() == eager);
  kiln::cu::StepGraph graph;
  exec.begin_capture(graph);
  const cudaStream_t captured = exec.stream();
  CHECK(captured != eager);
  CHECK(reducer.stream() == captured);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  KILN_CUDA_CHECK(cudaStreamIsCapturing(reducer.stream(), &status));
  CHECK(status == cudaStreamCaptureStatusActive);
  exec.end_capture();
  CHECK(reducer.stream() == eager);
}
#else
// A build without NCCL (the GPU check names it missing): its device collectives throw DistError by
// design, so these cases have nothing to run.
TEST_CASE("data parallelism on CUDA: this build has no NCCL") {
  MESSAGE("kiln was built without NCCL: the data-parallel cases on device memory did not run");
}
#endif
