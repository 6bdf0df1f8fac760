// Copies and lifetimes with an executor on a NON-BLOCKING stream — work there is not ordered
// with the legacy default stream, so a copy or a memset on the legacy stream can overtake it:
//   - to_host(t, exec) waits for the kernel on exec's stream that produced t;
//   - to_device(t, exec) lands before a kernel on exec's stream reads it;
//   - the parameters' initial values and zero-filled gradients are visible to such an executor,
//     so a training step there gives bit for bit what it gives on the default stream (kiln's
//     kernels and GEMM plans do not depend on the stream);
//   - ~CudaExecutor waits for its stream before its temporaries and cuBLASLt workspace go back
//     to the shared caching allocator.
// The producing kernels are made long (2^26-element chains) so that a copy that does not wait
// would see the old contents.
#include <doctest/doctest.h>

#include <kiln/train.cuh>

#include <cstdint>
#include <vector>

namespace {

using kiln::dyn;
using kiln::index_t;
using Device = kiln::cuda;

// A non-blocking stream for one test.
struct NonBlockingStream {
  cudaStream_t s = nullptr;
  NonBlockingStream() { KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~NonBlockingStream() { (void)cudaStreamDestroy(s); }
  NonBlockingStream(const NonBlockingStream&) = delete;
  NonBlockingStream& operator=(const NonBlockingStream&) = delete;
};

constexpr index_t big = index_t(1) << 26;

}  // namespace

TEST_CASE("to_host(t, exec) waits for the kernel on a non-blocking stream that produced t") {
  NonBlockingStream stream;
  kiln::CudaExecutor exec(stream.s);
  kiln::Tensor<float, Device, dyn> x(big), y(big);
  KILN_CUDA_CHECK(cudaMemsetAsync(x.data(), 0, x.bytes(), stream.s));
  KILN_CUDA_CHECK(cudaMemsetAsync(y.data(), 0, y.bytes(), stream.s));
  // y = ((x + 1) * 3 + 1) * 3 + ... : 7 rounds, each a full pass, all queued at once.
  for (int round = 0; round < 7; ++round) kiln::assign(y, (y + 1.f) * 3.f + x, exec);
  const auto h = kiln::to_host(y, exec);
  float expect = 0.f;
  for (int round = 0; round < 7; ++round) expect = (expect + 1.f) * 3.f;
  CHECK(h.data()[0] == expect);
  CHECK(h.data()[big / 2] == expect);
  CHECK(h.data()[big - 1] == expect);
}

TEST_CASE("to_device(t, exec) lands before a kernel on exec's non-blocking stream reads it") {
  NonBlockingStream stream;
  kiln::CudaExecutor exec(stream.s);
  kiln::Tensor<float, kiln::host, dyn> h(big);
  for (index_t i = 0; i < big; ++i) h.data()[i] = float(i % 1000);
  const auto d = kiln::to_device(h, exec);
  kiln::Tensor<float, Device, dyn> out(big);
  kiln::assign(out, d * 2.f, exec);
  const auto back = kiln::to_host(out, exec);
  for (index_t i : {index_t(0), index_t(999), big / 3, big - 1}) CHECK(back.data()[i] == 2.f * float(i % 1000));
}

TEST_CASE("a training step on a non-blocking stream gives the default stream's parameters bit for bit") {
  using Mlp = kiln::nn::Sequential<kiln::nn::Linear<16, 64>, kiln::nn::ReLU, kiln::nn::Linear<64, 4>>;
  kiln::data::Dataset data;
  data.n = 64;
  data.d = 16;
  data.num_classes = 4;
  data.sample_shape = {16};
  kiln::Generator g(11);
  for (index_t i = 0; i < data.n * data.d; ++i) data.features.push_back(g.uniform(-1.f, 1.f));
  for (index_t i = 0; i < data.n; ++i) data.labels.push_back(std::int32_t(g.below(4)));

  auto run = [&](cudaStream_t s) {
    kiln::CudaExecutor exec(s);
    Mlp::on<Device> model(7);  // values copied and gradients zeroed device-wide
    kiln::optim::AdamW opt(model, {.lr = 1e-2});
    kiln::train::Step step(model, opt, exec, kiln::policy<>{});
    kiln::data::BatchLoader<Device> loader(data, {.batch_size = 16, .shuffle = false, .workers = 0}, exec);
    for (int epoch = 0; epoch < 3; ++epoch) {
      loader.start_epoch(epoch);
      while (const auto* b = loader.next()) step(*b);
    }
    std::vector<float> out;
    model.for_each_parameter([&](const auto& v) {
      const auto h = kiln::to_host(v.value(), exec);
      out.insert(out.end(), h.data(), h.data() + h.size());
    });
    return out;
  };
  NonBlockingStream stream;
  const auto on_default = run(nullptr);
  const auto on_non_blocking = run(stream.s);
  REQUIRE(on_default.size() == on_non_blocking.size());
  CHECK(on_default == on_non_blocking);
}

TEST_CASE("~CudaExecutor waits for the work it queued") {
  NonBlockingStream stream;
  {
    kiln::CudaExecutor exec(stream.s);
    kiln::Tensor<float, Device, dyn> y(big);
    KILN_CUDA_CHECK(cudaMemsetAsync(y.data(), 0, y.bytes(), stream.s));
    for (int round = 0; round < 7; ++round) kiln::assign(y, y * 0.5f + 1.f, exec);
    // A GEMM too: its cuBLASLt workspace returns to the shared allocator with the executor.
    kiln::Tensor<float, Device, dyn, dyn> a(512, 512), c(512, 512);
    KILN_CUDA_CHECK(cudaMemsetAsync(a.data(), 0, a.bytes(), stream.s));
    exec.gemm(false, false, 512, 512, 512, 1.f, a.data(), 512, a.data(), 512, 0.f, c.data(), 512);
    // y's and c's blocks go back to the allocator first (declared after exec); then exec waits.
  }
  CHECK(cudaStreamQuery(stream.s) == cudaSuccess);
}
