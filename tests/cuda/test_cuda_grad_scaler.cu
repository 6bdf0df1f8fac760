// GradScaler<kiln::cuda> against GradScaler<kiln::host>: the same gradients and the same injected
// inf / NaN, step by step, must give the same state block (scale, found_inf, tracker, counts, the
// floor's step) and the same unscaled gradients, bit for bit — the unscale is one float multiply
// and the update products are double, so nothing is left to contraction. Also: the launch counts,
// a rebuilt table, and a skipped AdamW<kiln::cuda> step leaving device parameters and moments
// untouched.
#include <cuda_runtime_api.h>
#include <doctest/doctest.h>

#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kiln/backend/cpu/executor.hpp"
#include "kiln/backend/cuda/allocator.cuh"
#include "kiln/backend/cuda/check.cuh"
#include "kiln/backend/cuda/executor.cuh"
#include "kiln/core/error.hpp"
#include "kiln/optim/adam.hpp"
#include "kiln/optim/cuda_step.cuh"
#include "kiln/optim/param.hpp"
#include "kiln/train/grad_scaler.cuh"

#include "support.hpp"

using kiln::CpuExecutor;
using kiln::CudaExecutor;
using kiln::index_t;
using kiln::cu::DeviceBuffer;
using kiln::optim::ParamTable;
using kiln::train::GradScaler;
using kiln::train::GradScalerOptions;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// A non-blocking stream of our own: nothing orders it with the default stream for free.
struct ScalerStream {
  cudaStream_t s = nullptr;
  ScalerStream() { KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~ScalerStream() { (void)cudaStreamDestroy(s); }
  ScalerStream(const ScalerStream&) = delete;
  ScalerStream& operator=(const ScalerStream&) = delete;
};

// The same parameters on the host and on the device, with a has_grad flag per slot each.
struct Twin {
  std::vector<std::vector<float>> value, grad;  // host
  std::vector<DeviceBuffer<float>> d_value, d_grad;
  std::unique_ptr<bool[]> flag, d_flag;
  ParamTable host, device;

  explicit Twin(const std::vector<index_t>& sizes)
      : flag(std::make_unique<bool[]>(sizes.size())), d_flag(std::make_unique<bool[]>(sizes.size())) {
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      value.emplace_back(std::size_t(sizes[k]), 0.25f);
      grad.emplace_back(std::size_t(sizes[k]), 0.0f);
      d_value.emplace_back(sizes[k]);
      d_grad.emplace_back(sizes[k]);
      flag[k] = d_flag[k] = true;
    }
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      host.add(value[k].data(), grad[k].data(), sizes[k], &flag[k]);
      device.add(d_value[k].data(), d_grad[k].data(), sizes[k], &d_flag[k]);
    }
  }
  void set_flag(std::size_t k, bool on) { flag[k] = d_flag[k] = on; }
  // Host values and gradients to the device, on `stream` (waits: the sources are pageable).
  void upload(cudaStream_t stream) {
    for (std::size_t k = 0; k < value.size(); ++k) {
      if (value[k].empty()) continue;
      KILN_CUDA_CHECK(cudaMemcpyAsync(d_value[k].data(), value[k].data(), d_value[k].size_bytes(),
                                      cudaMemcpyHostToDevice, stream));
      KILN_CUDA_CHECK(cudaMemcpyAsync(d_grad[k].data(), grad[k].data(), d_grad[k].size_bytes(),
                                      cudaMemcpyHostToDevice, stream));
    }
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  std::vector<float> device_grad(std::size_t k, cudaStream_t stream) const {
    std::vector<float> out(grad[k].size());
    if (!out.empty())
      KILN_CUDA_CHECK(cudaMemcpyAsync(out.data(), d_grad[k].data(), d_grad[k].size_bytes(), cudaMemcpyDeviceToHost,
                                      stream));
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
    return out;
  }
};

std::vector<float> download(const float* d, std::size_t n, cudaStream_t stream) {
  std::vector<float> out(n);
  if (n) KILN_CUDA_CHECK(cudaMemcpyAsync(out.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost, stream));
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

bool same_state(const kiln::train::detail::ScalerState& a, const kiln::train::detail::ScalerState& b) {
  return std::memcmp(&a.scale, &b.scale, sizeof(float)) == 0 &&
         std::memcmp(&a.found_inf, &b.found_inf, sizeof(float)) == 0 && a.growth_tracker == b.growth_tracker &&
         a.steps == b.steps && a.skipped == b.skipped && a.floor_step == b.floor_step;
}

}  // namespace

TEST_CASE("GradScaler on CUDA equals the CPU bit for bit, step by step") {
  ScalerStream stream;
  CudaExecutor dev(stream.s);
  CpuExecutor cpu;
  // Several chunks (4096 elements each on the device) in slot 1, an empty slot, and slot 3 whose
  // gradient comes and goes (the device then takes the per-slot flags path).
  Twin t({7, 3 * 4096 + 5, 0, 9, 3});
  const GradScalerOptions o{.init_scale = 8.0, .growth_factor = 2.0, .backoff_factor = 0.5, .growth_interval = 3,
                            .min_scale = 1.0};
  GradScaler<kiln::host> hs(o);
  GradScaler<kiln::cuda> ds(o);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  // 0: clean; otherwise the value injected at (slot, element) — growth, backoff, floor crossing
  struct Inject {
    float bad;
    std::size_t slot, i;
  };
  const Inject plan[] = {{0, 0, 0},    {0, 0, 0},        {0, 0, 0},    {0, 0, 0},    {kInf, 0, 0},
                         {0, 0, 0},    {0, 0, 0},        {kNaN, 1, 4096 * 2 + 1}, {0, 0, 0}, {0, 0, 0},
                         {0, 0, 0},    {-kInf, 4, 2},    {kNaN, 1, 0}, {kInf, 1, 3 * 4096 + 4},
                         {0, 0, 0},    {kInf, 3, 8},     {kNaN, 0, 6}, {0, 0, 0},    {kInf, 3, 0}};
  index_t step = 0;
  for (const Inject& in : plan) {
    ++step;
    CAPTURE(step);
    const bool slot3 = step % 2 == 0;
    t.set_flag(3, slot3);
    const float scale = hs.scale();
    for (auto& g : t.grad)
      for (float& x : g) x = u(rng) * scale;
    if (in.bad != 0.0f) t.grad[in.slot][in.i] = in.bad;
    t.upload(stream.s);
    dev.stats().reset();
    hs.unscale_and_check(t.host, cpu);
    ds.unscale_and_check(t.device, dev);
    CHECK(same_state(ds.state(), hs.state()));
    CHECK(ds.found_inf() == hs.found_inf());
    for (std::size_t k = 0; k < t.grad.size(); ++k) {
      CAPTURE(k);
      CHECK(same_bits(t.device_grad(k, stream.s), t.grad[k]));
    }
    hs.update(cpu);
    ds.update(dev);
    CHECK(dev.stats().launches() == std::size_t(GradScaler<kiln::cuda>::launches_per_step(true)));
    CHECK(dev.stats().launches(kiln::kind::optimizer) == 2);
    const auto h = hs.state(), d = ds.state();
    CHECK(same_state(d, h));
    CHECK(d.found_inf == 0.0f);
  }
  // The floor was crossed (step 16 on both): the device's check names the same step.
  CHECK(hs.state().floor_step == 16);
  std::string host_msg, device_msg;
  try {
    hs.check();
  } catch (const kiln::NumericError& e) {
    host_msg = e.what();
  }
  try {
    ds.check();
  } catch (const kiln::NumericError& e) {
    device_msg = e.what();
  }
  CHECK(device_msg.find("optimizer step 16") != std::string::npos);
  CHECK(device_msg == host_msg);

}

TEST_CASE("GradScaler on CUDA: the cached device table follows the table it is given") {
  ScalerStream stream;
  CudaExecutor dev(stream.s);
  CpuExecutor cpu;
  Twin a({5, 4097}), b({3, 2, 9000});
  const GradScalerOptions o{.init_scale = 4.0, .growth_interval = 1};  // the scale doubles every clean step
  GradScaler<kiln::host> hs(o);
  GradScaler<kiln::cuda> ds(o);
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Twin* order[] = {&a, &b, &a, &a, &b};
  for (Twin* t : order) {
    for (auto& g : t->grad)
      for (float& x : g) x = u(rng);
    t->upload(stream.s);
    hs.unscale_and_check(t->host, cpu);
    ds.unscale_and_check(t->device, dev);
    hs.update(cpu);
    ds.update(dev);
    for (std::size_t k = 0; k < t->grad.size(); ++k) CHECK(same_bits(t->device_grad(k, stream.s), t->grad[k]));
    CHECK(same_state(ds.state(), hs.state()));
  }
  CHECK(ds.scale() == 128.0f);
}

TEST_CASE("GradScaler on CUDA: a new table never frees the device table a queued pass still reads") {
  // Issue 32: a table change freed the old upload at once, and the new upload (a legacy-stream
  // copy) refilled the same blocks while the pass queued on the executor's non-blocking stream
  // had not yet read them: that pass then unscaled the new table's gradients instead of its own.
  ScalerStream stream;
  CudaExecutor dev(stream.s);
  CpuExecutor cpu;
  Twin a({3 * 4096 + 1, 7}), b({3 * 4096 + 1, 7});  // the same sizes: the freed blocks serve the new upload
  const GradScalerOptions o{.init_scale = 4.0, .growth_interval = 1000};
  GradScaler<kiln::host> hs(o);
  GradScaler<kiln::cuda> ds(o);
  std::mt19937 rng(12);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (Twin* t : {&a, &b}) {
    for (auto& g : t->grad)
      for (float& x : g) x = u(rng);
    t->upload(stream.s);
  }
  hs.unscale_and_check(a.host, cpu);
  hs.update(cpu);
  hs.unscale_and_check(b.host, cpu);
  hs.update(cpu);
  kiln_cuda_test::spin<><<<1, 1, 0, stream.s>>>(400'000'000);  // ~0.2 s: the passes below wait behind it
  KILN_CUDA_CHECK(cudaGetLastError());
  ds.unscale_and_check(a.device, dev);  // queued: reads a's table when the spin ends
  ds.update(dev);
  ds.unscale_and_check(b.device, dev);  // a new table while a's pass is still queued
  ds.update(dev);
  for (Twin* t : {&a, &b})
    for (std::size_t k = 0; k < t->grad.size(); ++k) CHECK(same_bits(t->device_grad(k, stream.s), t->grad[k]));
  CHECK(same_state(ds.state(), hs.state()));
}

TEST_CASE("GradScaler on CUDA: a skipped AdamW step leaves device parameters and moments bit for bit") {
  ScalerStream stream;
  CudaExecutor dev(stream.s);
  Twin t({6, 5000, 3});
  t.upload(stream.s);
  kiln::optim::AdamW<kiln::cuda> opt(t.device, {.lr = 1e-2, .weight_decay = 0.1});
  GradScaler<kiln::cuda> scaler({.init_scale = 1024.0, .growth_interval = 2});
  const std::size_t n = std::size_t(t.device.total_size());
  const float scales_after[] = {1024, 2048, 1024, 1024, 512, 512};  // growth every 2 clean steps
  for (int step = 0; step < 6; ++step) {
    CAPTURE(step);
    const bool inject = step == 2 || step == 4;
    const float scale = scaler.scale();
    for (auto& g : t.grad)
      for (float& x : g) x = 0.5f * scale;
    if (inject) t.grad[1][4999] = step == 2 ? kNaN : kInf;
    for (std::size_t k = 0; k < t.grad.size(); ++k)
      KILN_CUDA_CHECK(cudaMemcpyAsync(t.d_grad[k].data(), t.grad[k].data(), t.d_grad[k].size_bytes(),
                                      cudaMemcpyHostToDevice, stream.s));
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream.s));
    std::vector<std::vector<float>> before;
    for (std::size_t k = 0; k < t.d_value.size(); ++k)
      before.push_back(download(t.d_value[k].data(), t.value[k].size(), stream.s));
    const auto m = download(opt.d_exp_avg(), n, stream.s), v = download(opt.d_exp_avg_sq(), n, stream.s);
    scaler.unscale_and_check(opt.table(), dev);
    opt.step(dev, {.found_inf = scaler.found_inf_ptr()});
    scaler.update(dev);
    bool values_same = true;
    for (std::size_t k = 0; k < t.d_value.size(); ++k)
      values_same = values_same && same_bits(download(t.d_value[k].data(), t.value[k].size(), stream.s), before[k]);
    const bool moments_same =
        same_bits(download(opt.d_exp_avg(), n, stream.s), m) && same_bits(download(opt.d_exp_avg_sq(), n, stream.s), v);
    CHECK(values_same == inject);  // skipped: untouched; otherwise training continues
    CHECK(moments_same == inject);
    CHECK(scaler.scale() == scales_after[step]);
    if (inject) CHECK(scaler.scale() == scale * 0.5f);
  }
  CHECK(scaler.skipped_steps() == 2);
  CHECK_NOTHROW(scaler.check());
}
