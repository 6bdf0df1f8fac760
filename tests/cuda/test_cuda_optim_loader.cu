// The CUDA optimizer step, gradient norm / clipping and the device loader, each against its CPU
// counterpart: the CPU optimizers run on the same parameters and gradients, the host Loader
// delivers the batches the DeviceLoader must reproduce.
//
// Parameters without a gradient (a has_grad flag that is false) must be skipped as on the CPU:
// the device's value and state of such a parameter are checked unchanged to the bit. So must a
// whole step whose guard (optim::StepGuard, a flag in device memory) is set — decided on the
// device for the fused step, which is checked by capturing it into a CUDA graph and replaying it.
// Both stances (fused, force_eager) run against the CPU's fused step, and every step's launches
// against Opt::launches(eager, options, tensors).
//
// Optimizer results agree to rounding, not to the bit: nvcc contracts a * b + c into fused
// multiply-adds, the host compiler need not. A host experiment (the CPU optimizers built with and
// without -mfma -ffp-contract=fast, on these sizes, options and steps) put the largest difference
// of parameters and state at 4.4e-7 * max(|a|, |b|, 1) for SGD (lr 0.1) and 2.4e-7 for Adam(W).
// Purely relative error is unbounded near 0 (one rounding of a term that nearly cancels), so
// mismatches() allows 1e-6 relative to max(|a|, |b|, 1): about 8 ulps for values of order 1.
#include <cuda_runtime_api.h>
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
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/backend/cpu/executor.hpp"
#include "kiln/backend/cuda/allocator.cuh"
#include "kiln/backend/cuda/check.cuh"
#include "kiln/backend/cuda/executor.cuh"
#include "kiln/core/error.hpp"
#include "kiln/core/stats.hpp"
#include "kiln/data/dataset.hpp"
#include "kiln/data/device_loader.cuh"
#include "kiln/data/loader.hpp"
#include "kiln/nn/cuda.cuh"
#include "kiln/nn/linear.hpp"
#include "kiln/nn/sequential.hpp"
#include "kiln/optim/adam.hpp"
#include "kiln/optim/clip.hpp"
#include "kiln/optim/cuda_step.cuh"
#include "kiln/optim/param.hpp"
#include "kiln/optim/sgd.hpp"
#include "kiln/policy/stance.hpp"

#include "support.hpp"

using kiln::CpuExecutor;
using kiln::CudaExecutor;
using kiln::index_t;
using kiln::cu::DeviceBuffer;
using kiln::optim::ParamTable;

namespace {

// A stream of our own, non-blocking, so nothing orders it with the default stream for free.
struct TestStream {
  cudaStream_t s = nullptr;
  TestStream() { KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~TestStream() { (void)cudaStreamDestroy(s); }
  TestStream(const TestStream&) = delete;
  TestStream& operator=(const TestStream&) = delete;
};

template <class T>
void upload(T* d, const std::vector<T>& h, cudaStream_t s) {
  if (h.empty()) return;
  KILN_CUDA_CHECK(cudaMemcpyAsync(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice, s));
  KILN_CUDA_CHECK(cudaStreamSynchronize(s));  // h is pageable and may change right after
}

template <class T>
std::vector<T> download(const T* d, index_t n, cudaStream_t s) {
  std::vector<T> h(static_cast<std::size_t>(n));
  if (n == 0) return h;
  KILN_CUDA_CHECK(cudaMemcpyAsync(h.data(), d, h.size() * sizeof(T), cudaMemcpyDeviceToHost, s));
  KILN_CUDA_CHECK(cudaStreamSynchronize(s));
  return h;
}

// Counts the elements of got and want that differ by more than 1e-6 * max(|got|, |want|, 1)
// (NaN matches NaN), and reports the first one.
index_t mismatches(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  REQUIRE(got.size() == want.size());
  index_t bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double a = got[i], b = want[i];
    if (std::isnan(a) && std::isnan(b)) continue;
    const double scale = std::max({std::fabs(a), std::fabs(b), 1.0});
    if (!(std::fabs(a - b) <= 1e-6 * scale)) {
      if (bad == 0) MESSAGE(what << "[" << i << "]: cuda " << a << ", cpu " << b);
      ++bad;
    }
  }
  return bad;
}

// Parameters of many sizes — empty ones, a single element, a chunk and one more, and one over 1M
// elements — on the host (for the CPU optimizer) and mirrored on the device.
struct Model {
  std::vector<index_t> sizes{0, 1, 3, 4096, 4097, (index_t(1) << 20) + 7, 0, 1000};
  std::vector<std::vector<float>> value, grad;
  std::vector<DeviceBuffer<float>> d_value, d_grad;
  // One "has a gradient" flag per parameter, shared by the host and the device table (flags
  // live on the host in both cases); attached only to tables asked for with `flagged`.
  std::unique_ptr<bool[]> flag = std::make_unique<bool[]>(sizes.size());
  std::mt19937 rng{12345};

  Model() {
    for (std::size_t k = 0; k < sizes.size(); ++k) flag[k] = true;
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (index_t n : sizes) {
      value.emplace_back(std::size_t(n));
      grad.emplace_back(std::size_t(n), 0.0f);
      for (float& x : value.back()) x = u(rng);
      d_value.emplace_back(n);
      d_grad.emplace_back(n);
    }
  }
  index_t total() const {
    index_t t = 0;
    for (index_t n : sizes) t += n;
    return t;
  }
  ParamTable host_table(bool flagged = false) {
    ParamTable t;
    for (std::size_t k = 0; k < sizes.size(); ++k)
      t.add(value[k].data(), grad[k].data(), sizes[k], flagged ? &flag[k] : nullptr);
    return t;
  }
  ParamTable device_table(bool flagged = false) {
    ParamTable t;
    for (std::size_t k = 0; k < sizes.size(); ++k)
      t.add(d_value[k].data(), d_grad[k].data(), sizes[k], flagged ? &flag[k] : nullptr);
    return t;
  }
  // Parameter k's piece of a flat (table-order) vector.
  std::vector<float> piece(const std::vector<float>& flat, std::size_t k) const {
    if (flat.empty()) return {};
    index_t off = 0;
    for (std::size_t j = 0; j < k; ++j) off += sizes[j];
    return std::vector<float>(flat.begin() + off, flat.begin() + off + sizes[k]);
  }
  void upload_values(cudaStream_t s) {
    for (std::size_t k = 0; k < sizes.size(); ++k) upload(d_value[k].data(), value[k], s);
  }
  // New random gradients, the same on both sides.
  void new_grads(cudaStream_t s, float scale = 1.0f) {
    std::uniform_real_distribution<float> u(-scale, scale);
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      for (float& x : grad[k]) x = u(rng);
      upload(d_grad[k].data(), grad[k], s);
    }
  }
  // Concatenated in table order: the flat index space.
  std::vector<float> flat(const std::vector<std::vector<float>>& parts) const {
    std::vector<float> out;
    for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
    return out;
  }
  std::vector<float> device_flat(const std::vector<DeviceBuffer<float>>& parts, cudaStream_t s) const {
    std::vector<float> out;
    for (std::size_t k = 0; k < parts.size(); ++k) {
      const std::vector<float> h = download(parts[k].data(), sizes[k], s);
      out.insert(out.end(), h.begin(), h.end());
    }
    return out;
  }
};

// Every state buffer of a CUDA optimizer, downloaded (an empty vector for one not allocated).
std::vector<std::vector<float>> device_state(const kiln::optim::SGD<kiln::cuda>& o, index_t n, cudaStream_t s) {
  if (o.d_momentum_buffer() == nullptr) return {{}};
  return {download(o.d_momentum_buffer(), n, s)};
}
template <class Opt>
std::vector<std::vector<float>> device_state(const Opt& o, index_t n, cudaStream_t s) {
  std::vector<std::vector<float>> out{download(o.d_exp_avg(), n, s), download(o.d_exp_avg_sq(), n, s)};
  if (o.d_max_exp_avg_sq() != nullptr) out.push_back(download(o.d_max_exp_avg_sq(), n, s));
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// One step in a stance chosen at run time.
template <class Opt, class Exec>
void step_in(Opt& opt, Exec& exec, bool eager, kiln::optim::StepGuard guard = {}) {
  if (eager) opt.template step<kiln::stance::force_eager>(exec, guard);
  else opt.step(exec, guard);
}

// Per-parameter state a step advances: Adam's counts, SGD's buffer starts.
template <class Opt>
std::vector<index_t> counts_of(const Opt& o, std::size_t n) {
  std::vector<index_t> out;
  for (std::size_t k = 0; k < n; ++k) {
    if constexpr (requires { o.param_steps(0); }) out.push_back(o.param_steps(index_t(k)));
    else out.push_back(o.has_momentum_buffer(index_t(k)) ? 1 : 0);
  }
  return out;
}

// Which parameters have a gradient at step s.
using Activity = std::function<bool(int step, std::size_t k)>;

// Runs `steps` steps of a CPU (fused) and a CUDA optimizer (fused or force_eager) side by side
// (the lr changed half way), checking each step's launches against CudaOpt::launches, then the
// parameters, every state buffer and the per-parameter counts. With `active`, the tables carry
// has_grad flags set from it before each step, and the device's value and state of every
// parameter without a gradient are checked unchanged to the bit by that step.
template <class CpuOpt, class CudaOpt, class Options, class CheckState>
void compare_steps(const Options& options, double second_lr, CheckState check_state, const Activity& active = {},
                   bool eager = false) {
  CAPTURE(eager);
  TestStream stream;
  Model model;
  model.upload_values(stream.s);
  CpuExecutor cpu_exec(1);
  CudaExecutor exec(stream.s);
  const bool flagged = bool(active);
  CpuOpt cpu(model.host_table(flagged), options);
  CudaOpt gpu(model.device_table(flagged), options);
  CHECK(gpu.device_table().total_size() == model.total());
  const int steps = 5;
  for (int s = 0; s < steps; ++s) {
    CAPTURE(s);
    if (s == steps / 2) {
      cpu.set_lr(second_lr);
      gpu.set_lr(second_lr);
    }
    model.new_grads(stream.s);  // a parameter without a gradient keeps a stale, non-zero buffer
    index_t tensors = 0;
    for (std::size_t k = 0; k < model.sizes.size(); ++k) {
      if (flagged) model.flag[k] = active(s, k);
      if (model.flag[k]) ++tensors;
    }
    const std::vector<float> value_before = model.device_flat(model.d_value, stream.s);
    const auto state_before = device_state(gpu, model.total(), stream.s);
    cpu.step(cpu_exec);
    exec.stats().reset();
    step_in(gpu, exec, eager);
    CHECK(exec.stats().launches() == std::size_t(CudaOpt::launches(eager, gpu.options(), tensors)));
    if (!flagged) continue;
    const std::vector<float> value_after = model.device_flat(model.d_value, stream.s);
    const auto state_after = device_state(gpu, model.total(), stream.s);
    for (std::size_t k = 0; k < model.sizes.size(); ++k) {
      if (model.flag[k] || model.sizes[k] == 0) continue;
      CAPTURE(k);
      CHECK(same_bits(model.piece(value_after, k), model.piece(value_before, k)));
      for (std::size_t b = 0; b < state_after.size(); ++b)
        if (b < state_before.size() && !state_before[b].empty())
          CHECK(same_bits(model.piece(state_after[b], k), model.piece(state_before[b], k)));
    }
  }
  CHECK(gpu.steps() == cpu.steps());
  CHECK(counts_of(gpu, model.sizes.size()) == counts_of(cpu, model.sizes.size()));
  CHECK(mismatches(model.device_flat(model.d_value, stream.s), model.flat(model.value), "value") == 0);
  check_state(cpu, gpu, model.total(), stream.s);
}

// Parameters 1 and 5 (the large one) start late, 3 skips steps 1 and 3, only 7 has a gradient at
// step 4: mixed step counts (Adam's per-parameter bias corrections), buffers starting late
// (SGD), and uniform steps in between.
bool mixed_activity(int step, std::size_t k) {
  switch (step) {
    case 0: return k != 1 && k != 5;
    case 1: return k != 3;
    case 2: return true;
    case 3: return k != 3;
    default: return k == 7;
  }
}

// The state buffers of a CPU and a CUDA Adam(W) after the same steps.
struct AdamState {
  void operator()(const auto& cpu, const auto& gpu, index_t n, cudaStream_t s) const {
    auto host = [](std::span<const float> x) { return std::vector<float>(x.begin(), x.end()); };
    CHECK(mismatches(download(gpu.d_exp_avg(), n, s), host(cpu.exp_avg()), "exp_avg") == 0);
    CHECK(mismatches(download(gpu.d_exp_avg_sq(), n, s), host(cpu.exp_avg_sq()), "exp_avg_sq") == 0);
    if (gpu.options().amsgrad) {
      CHECK(mismatches(download(gpu.d_max_exp_avg_sq(), n, s), host(cpu.max_exp_avg_sq()), "max_exp_avg_sq") == 0);
    } else {
      CHECK(gpu.d_max_exp_avg_sq() == nullptr);
    }
  }
};

// The momentum buffers of a CPU and a CUDA SGD after the same steps.
struct SgdState {
  void operator()(const auto& cpu, const auto& gpu, index_t n, cudaStream_t s) const {
    if (gpu.options().momentum == 0.0) {
      CHECK(gpu.d_momentum_buffer() == nullptr);
      return;
    }
    const auto buf = cpu.momentum_buffer();
    CHECK(mismatches(download(gpu.d_momentum_buffer(), n, s), std::vector<float>(buf.begin(), buf.end()),
                     "momentum_buffer") == 0);
  }
};

// A step guard's flag in device memory.
struct DeviceFlag {
  DeviceBuffer<float> d{1};
  void set(float v, cudaStream_t s) { upload(d.data(), std::vector<float>{v}, s); }
  kiln::optim::StepGuard guard() const { return {d.data()}; }
};

// Guarded steps on the device: steps 0 and 1 run (flag 0), step 2 is tried with the flag set to
// 1, NaN and -inf in turn — each must leave values, state and per-parameter counts bit for bit
// (parameter 3 would start its buffer / count there) — then steps 3 and 4 run. The CPU optimizer
// never sees step 2; the two must agree at the end. Launches: a skipped fused step still counts
// (and runs) its one kernel, a skipped eager step launches nothing.
template <class CpuOpt, class CudaOpt, class Options, class CheckState>
void guarded_steps(const Options& options, CheckState check_state, bool eager) {
  CAPTURE(eager);
  TestStream stream;
  Model model;
  model.upload_values(stream.s);
  CpuExecutor cpu_exec(1);
  CudaExecutor exec(stream.s);
  CpuOpt cpu(model.host_table(true), options);
  CudaOpt gpu(model.device_table(true), options);
  DeviceFlag flag;
  flag.set(0.0f, stream.s);
  auto activity = [&](int s) {
    for (std::size_t k = 0; k < model.sizes.size(); ++k) model.flag[k] = !(k == 3 && s < 2) && !(k == 5 && s == 1);
  };
  for (int s = 0; s < 5; ++s) {
    CAPTURE(s);
    model.new_grads(stream.s);
    activity(s);
    if (s != 2) {
      cpu.step(cpu_exec);
      step_in(gpu, exec, eager, flag.guard());
      continue;
    }
    for (const float f : {1.0f, std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
      CAPTURE(f);
      const std::vector<float> value_before = model.device_flat(model.d_value, stream.s);
      const auto state_before = device_state(gpu, model.total(), stream.s);
      const auto counts_before = counts_of(gpu, model.sizes.size());
      flag.set(f, stream.s);
      exec.stats().reset();
      step_in(gpu, exec, eager, flag.guard());
      CHECK(exec.stats().launches() == (eager ? 0u : 1u));
      flag.set(0.0f, stream.s);
      CHECK(same_bits(model.device_flat(model.d_value, stream.s), value_before));
      const auto state_after = device_state(gpu, model.total(), stream.s);
      REQUIRE(state_after.size() == state_before.size());
      for (std::size_t b = 0; b < state_after.size(); ++b) CHECK(same_bits(state_after[b], state_before[b]));
      CHECK(counts_of(gpu, model.sizes.size()) == counts_before);
    }
  }
  CHECK(counts_of(gpu, model.sizes.size()) == counts_of(cpu, model.sizes.size()));
  CHECK(mismatches(model.device_flat(model.d_value, stream.s), model.flat(model.value), "value") == 0);
  check_state(cpu, gpu, model.total(), stream.s);
}

// The fused guarded step captured into a CUDA graph (capture fails on any synchronising call),
// then replayed four times with the same kernel arguments: the device's counts and buffer starts
// must advance on each replay but the third, which runs with the flag set and must be skipped.
// The CPU optimizer steps for the other replays; the two must agree.
template <class CpuOpt, class CudaOpt, class Options, class CheckState>
void replay_graph(const Options& options, CheckState check_state) {
  TestStream stream;
  Model model;
  model.upload_values(stream.s);
  CpuExecutor cpu_exec(1);
  CudaExecutor exec(stream.s);
  CpuOpt cpu(model.host_table(), options);
  CudaOpt gpu(model.device_table(), options);
  DeviceFlag flag;
  flag.set(0.0f, stream.s);
  model.new_grads(stream.s);
  gpu.step(exec, flag.guard());  // allocates SGD's momentum buffer outside the capture
  cpu.step(cpu_exec);
  cudaGraph_t graph = nullptr;
  KILN_CUDA_CHECK(cudaStreamBeginCapture(stream.s, cudaStreamCaptureModeGlobal));
  gpu.step(exec, flag.guard());
  KILN_CUDA_CHECK(cudaStreamEndCapture(stream.s, &graph));
  cudaGraphExec_t instance = nullptr;
  KILN_CUDA_CHECK(cudaGraphInstantiate(&instance, graph, 0));
  for (int r = 0; r < 4; ++r) {
    if (r == 2) flag.set(1.0f, stream.s);
    KILN_CUDA_CHECK(cudaGraphLaunch(instance, stream.s));
    if (r == 2) flag.set(0.0f, stream.s);
    else cpu.step(cpu_exec);
  }
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream.s));
  KILN_CUDA_CHECK(cudaGraphExecDestroy(instance));
  KILN_CUDA_CHECK(cudaGraphDestroy(graph));
  CHECK(counts_of(gpu, model.sizes.size()) == counts_of(cpu, model.sizes.size()));
  CHECK(mismatches(model.device_flat(model.d_value, stream.s), model.flat(model.value), "value") == 0);
  check_state(cpu, gpu, model.total(), stream.s);
}

}  // namespace

TEST_SUITE("cuda optimizers") {
  using namespace kiln::optim;
  using kiln::cuda;
  using kiln::host;

  TEST_CASE("AdamW<cuda> and Adam<cuda> match the CPU step for step, fused and force_eager") {
    for (const bool eager : {false, true}) {
      SUBCASE("AdamW defaults") {
        compare_steps<AdamW<host>, AdamW<cuda>>(AdamWOptions{}, 3e-3, AdamState{}, {}, eager);
      }
      SUBCASE("AdamW amsgrad, maximize, strong decay") {
        compare_steps<AdamW<host>, AdamW<cuda>>(
            AdamWOptions{.lr = 1e-2, .weight_decay = 0.1, .amsgrad = true, .maximize = true}, 5e-3, AdamState{}, {},
            eager);
      }
      SUBCASE("Adam defaults") { compare_steps<Adam<host>, Adam<cuda>>(AdamOptions{}, 3e-3, AdamState{}, {}, eager); }
      SUBCASE("Adam amsgrad with L2 decay") {
        compare_steps<Adam<host>, Adam<cuda>>(AdamOptions{.lr = 1e-2, .beta1 = 0.8, .weight_decay = 0.1, .amsgrad = true},
                                              5e-3, AdamState{}, {}, eager);
      }
    }
  }

  TEST_CASE("CUDA optimizers skip parameters without a gradient exactly as the CPU ones, in both stances") {
    for (const bool eager : {false, true}) {
      SUBCASE("AdamW") {
        compare_steps<AdamW<host>, AdamW<cuda>>(AdamWOptions{.weight_decay = 0.1}, 3e-3, AdamState{}, mixed_activity,
                                                eager);
      }
      SUBCASE("AdamW amsgrad") {
        compare_steps<AdamW<host>, AdamW<cuda>>(AdamWOptions{.lr = 1e-2, .weight_decay = 0.1, .amsgrad = true}, 5e-3,
                                                AdamState{}, mixed_activity, eager);
      }
      SUBCASE("Adam with L2 decay, maximize") {
        compare_steps<Adam<host>, Adam<cuda>>(AdamOptions{.lr = 1e-2, .weight_decay = 0.1, .maximize = true}, 5e-3,
                                              AdamState{}, mixed_activity, eager);
      }
      SUBCASE("Adam amsgrad") {
        compare_steps<Adam<host>, Adam<cuda>>(AdamOptions{.lr = 1e-2, .amsgrad = true}, 5e-3, AdamState{},
                                              mixed_activity, eager);
      }
      SUBCASE("SGD plain") {
        compare_steps<SGD<host>, SGD<cuda>>(SgdOptions{.lr = 0.1}, 0.05, SgdState{}, mixed_activity, eager);
      }
      SUBCASE("SGD nesterov momentum with weight decay") {
        compare_steps<SGD<host>, SGD<cuda>>(
            SgdOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-2, .nesterov = true}, 0.05, SgdState{},
            mixed_activity, eager);
      }
      SUBCASE("SGD dampened momentum") {
        compare_steps<SGD<host>, SGD<cuda>>(SgdOptions{.lr = 0.1, .momentum = 0.9, .dampening = 0.1}, 0.05,
                                            SgdState{}, mixed_activity, eager);
      }
      SUBCASE("after the first step no parameter has a gradient: nothing moves") {
        compare_steps<AdamW<host>, AdamW<cuda>>(AdamWOptions{}, 3e-3, AdamState{},
                                                [](int s, std::size_t) { return s == 0; }, eager);
      }
    }
  }

  TEST_CASE("SGD<cuda> matches the CPU step for step, fused and force_eager") {
    for (const bool eager : {false, true}) {
      SUBCASE("plain") { compare_steps<SGD<host>, SGD<cuda>>(SgdOptions{.lr = 0.1}, 0.05, SgdState{}, {}, eager); }
      SUBCASE("nesterov momentum with weight decay") {
        compare_steps<SGD<host>, SGD<cuda>>(
            SgdOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-2, .nesterov = true}, 0.05, SgdState{}, {}, eager);
      }
      SUBCASE("dampened momentum, maximize") {
        compare_steps<SGD<host>, SGD<cuda>>(
            SgdOptions{.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .maximize = true}, 0.05, SgdState{}, {}, eager);
      }
    }
  }

  TEST_CASE("a guarded step is a no-op decided on the device, bit for bit, in both stances") {
    for (const bool eager : {false, true}) {
      SUBCASE("AdamW amsgrad") {
        guarded_steps<AdamW<host>, AdamW<cuda>>(AdamWOptions{.lr = 1e-2, .weight_decay = 0.1, .amsgrad = true},
                                                AdamState{}, eager);
      }
      SUBCASE("Adam L2, maximize") {
        guarded_steps<Adam<host>, Adam<cuda>>(AdamOptions{.lr = 1e-2, .weight_decay = 0.1, .maximize = true},
                                              AdamState{}, eager);
      }
      SUBCASE("SGD nesterov") {
        guarded_steps<SGD<host>, SGD<cuda>>(
            SgdOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-2, .nesterov = true}, SgdState{}, eager);
      }
      SUBCASE("SGD dampened, maximize") {
        guarded_steps<SGD<host>, SGD<cuda>>(
            SgdOptions{.lr = 0.05, .momentum = 0.5, .dampening = 0.3, .weight_decay = 0.1, .maximize = true},
            SgdState{}, eager);
      }
      SUBCASE("SGD plain") { guarded_steps<SGD<host>, SGD<cuda>>(SgdOptions{.lr = 0.1}, SgdState{}, eager); }
    }
  }

  TEST_CASE("the fused guarded step needs no host synchronisation: captured in a CUDA graph, it replays") {
    SUBCASE("AdamW amsgrad") {
      replay_graph<AdamW<host>, AdamW<cuda>>(AdamWOptions{.lr = 1e-2, .weight_decay = 0.1, .amsgrad = true},
                                             AdamState{});
    }
    SUBCASE("Adam") { replay_graph<Adam<host>, Adam<cuda>>(AdamOptions{.lr = 1e-2}, AdamState{}); }
    SUBCASE("SGD dampened momentum") {
      replay_graph<SGD<host>, SGD<cuda>>(SgdOptions{.lr = 0.1, .momentum = 0.9, .dampening = 0.1}, SgdState{});
    }
  }

  TEST_CASE("SGD<cuda> starts its momentum buffer when momentum is switched on, as SGD<host> does") {
    TestStream stream;
    Model model;
    model.upload_values(stream.s);
    CpuExecutor cpu_exec(1);
    CudaExecutor exec(stream.s);
    SGD<host> cpu(model.host_table(), {.lr = 0.05});
    SGD<cuda> gpu(model.device_table(), {.lr = 0.05});
    for (int s = 0; s < 4; ++s) {
      if (s == 2) {
        cpu.set_momentum(0.9);
        gpu.set_momentum(0.9);
      }
      model.new_grads(stream.s);
      cpu.step(cpu_exec);
      gpu.step(exec);
      CHECK((gpu.d_momentum_buffer() != nullptr) == (s >= 2));
    }
    CHECK(mismatches(model.device_flat(model.d_value, stream.s), model.flat(model.value), "value") == 0);
    SgdState{}(cpu, gpu, model.total(), stream.s);
  }

  TEST_CASE("optimizers deduce kiln::cuda from a CUDA model, and the old names are aliases") {
    using Net = kiln::nn::Sequential<kiln::nn::Linear<4, 3>, kiln::nn::Linear<3, 2>>::on<cuda>;
    Net net(1);
    AdamW adamw(net, {.lr = 1e-2});
    SGD sgd(net, {.lr = 0.1});
    static_assert(std::is_same_v<decltype(adamw), AdamW<cuda>>);
    static_assert(std::is_same_v<decltype(sgd), SGD<cuda>>);
    static_assert(std::is_same_v<CudaAdamW, AdamW<cuda>> && std::is_same_v<CudaAdam, Adam<cuda>> &&
                  std::is_same_v<CudaSgd, SGD<cuda>>);
    static_assert(AdamW<cuda>::launches(true, {.lr = 1e-2}, 4) == AdamW<host>::launches(true, {.lr = 1e-2}, 4));
    CHECK(adamw.table().count() == 4);
    CHECK(adamw.table()[0].value == net.param_table()[0].value);
  }

  TEST_CASE("zero_grad is one launch and zeroes every gradient") {
    TestStream stream;
    Model model;
    model.new_grads(stream.s);
    CudaExecutor exec(stream.s);
    AdamW<cuda> opt(model.device_table(), {});
    opt.zero_grad(exec);
    CHECK(exec.stats().launches() == 1);
    CHECK(exec.stats().launches(kiln::kind::elementwise) == 1);
    const std::vector<float> g = model.device_flat(model.d_grad, stream.s);
    CHECK(std::count(g.begin(), g.end(), 0.0f) == std::ptrdiff_t(g.size()));
  }

  TEST_CASE("zero_grad: set_to_none clears flags without a launch; set_to_none = false fills and sets them") {
    TestStream stream;
    Model model;
    model.new_grads(stream.s);
    CudaExecutor exec(stream.s);
    ParamTable table = model.device_table(true);
    DeviceBuffer<float> w(5), dw(5);
    upload(dw.data(), std::vector<float>(5, 3.0f), stream.s);
    table.add(w.data(), dw.data(), 5);  // no flag: zero-filled in both modes
    AdamW<cuda> opt(table, {});
    opt.zero_grad(exec);
    CHECK(exec.stats().launches() == 1);  // the unflagged parameter only
    for (std::size_t k = 0; k < model.sizes.size(); ++k) CHECK_FALSE(model.flag[k]);
    CHECK(mismatches(model.device_flat(model.d_grad, stream.s), model.flat(model.grad), "untouched grad") == 0);
    CHECK(download(dw.data(), 5, stream.s) == std::vector<float>(5, 0.0f));

    exec.stats().reset();
    cuda_zero_grad(CudaParamTable(model.device_table(true)), exec);
    CHECK(exec.stats().launches() == 0);  // every parameter flagged: nothing to fill

    opt.zero_grad(exec, false);
    CHECK(exec.stats().launches() == 1);
    for (std::size_t k = 0; k < model.sizes.size(); ++k) CHECK(model.flag[k]);
    const std::vector<float> g = model.device_flat(model.d_grad, stream.s);
    CHECK(std::count(g.begin(), g.end(), 0.0f) == std::ptrdiff_t(g.size()));
  }

  TEST_CASE("a table of empty parameters steps (its counts advance) and the options are checked as on the CPU") {
    CudaExecutor exec;
    ParamTable empty;
    empty.add(nullptr, nullptr, 0);
    Adam<cuda> adam(empty, {});
    SGD<cuda> sgd(empty, {.momentum = 0.5});
    adam.step(exec);
    sgd.step(exec);
    adam.zero_grad(exec);
    exec.synchronize();
    CHECK(exec.stats().launches(kiln::kind::optimizer) == 2);
    CHECK(adam.param_steps(0) == 1);  // as Adam<host>: a parameter with a gradient counts its step
    CHECK(sgd.has_momentum_buffer(0));
    CHECK(cuda_grad_norm(adam.device_table(), exec) == 0.0);

    CHECK_THROWS_AS(AdamW<cuda>(ParamTable{}, {.lr = -1.0}), kiln::ValueError);
    CHECK_THROWS_AS(Adam<cuda>(ParamTable{}, {.beta2 = 1.0}), kiln::ValueError);
    CHECK_THROWS_AS(SGD<cuda>(ParamTable{}, {.nesterov = true}), kiln::ValueError);
    CHECK_THROWS_AS(sgd.set_lr(std::numeric_limits<double>::quiet_NaN()), kiln::ValueError);
    CHECK(sgd.lr() == 1e-3);  // a rejected value leaves the options as they were
  }

  TEST_CASE("a table of pageable host pointers is refused where the device cannot read them") {
    int device = 0, pageable = 0;
    KILN_CUDA_CHECK(cudaGetDevice(&device));
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, device));
    std::vector<float> v(8), g(8);
    ParamTable t;
    t.add(v.data(), g.data(), 8);
    if (pageable == 0) CHECK_THROWS_AS(SGD<cuda>(t, {}), kiln::ValueError);
    else MESSAGE("this device reads pageable memory: host pointers are accepted");
  }
}

TEST_SUITE("cuda grad norm") {
  using namespace kiln::optim;

  TEST_CASE("cuda_grad_norm equals grad_norm for every norm type, and repeats to the bit") {
    TestStream stream;
    Model model;
    model.new_grads(stream.s, 3.0f);
    CpuExecutor cpu_exec(1);
    CudaExecutor exec(stream.s);
    const ParamTable host = model.host_table();
    const CudaParamTable dev(model.device_table());
    for (double p : {2.0, 1.0, 3.0, 0.5, std::numeric_limits<double>::infinity()}) {
      CAPTURE(p);
      const double want = grad_norm(host, cpu_exec, p);
      const double got = cuda_grad_norm(dev, exec, p);
      CHECK(std::fabs(got - want) <= 1e-10 * want);
      CHECK(cuda_grad_norm(dev, exec, p) == got);  // deterministic: same partials, same tree
    }
    CHECK(exec.stats().launches(kiln::kind::reduce) == 10);
    CHECK_THROWS_AS(cuda_grad_norm(dev, exec, 0.0), kiln::ValueError);
  }

  TEST_CASE("cuda_grad_norm and cuda_clip_grad_norm leave out parameters without a gradient, as the CPU") {
    TestStream stream;
    Model model;
    model.new_grads(stream.s);
    model.grad[5][12345] = 1e6f;  // stale, in a parameter without a gradient: would dominate
    upload(model.d_grad[5].data(), model.grad[5], stream.s);
    model.flag[5] = false;
    model.flag[2] = false;
    CpuExecutor cpu_exec(1);
    CudaExecutor exec(stream.s);
    const ParamTable host = model.host_table(true);
    const CudaParamTable dev(model.device_table(true));
    for (double p : {2.0, 1.0, 3.0, std::numeric_limits<double>::infinity()}) {
      CAPTURE(p);
      const double want = grad_norm(host, cpu_exec, p);
      CHECK(want < 1e5);
      CHECK(std::fabs(cuda_grad_norm(dev, exec, p) - want) <= 1e-10 * want);
    }
    const std::vector<float> stale = model.grad[5];
    const double want = clip_grad_norm(host, 1.0, cpu_exec);
    CHECK(cuda_clip_grad_norm(dev, 1.0, exec) == doctest::Approx(want).epsilon(1e-10));
    CHECK(model.grad[5] == stale);  // the CPU left it alone
    CHECK(mismatches(model.device_flat(model.d_grad, stream.s), model.flat(model.grad), "clipped grad") == 0);
    CHECK(same_bits(download(model.d_grad[5].data(), model.sizes[5], stream.s), stale));
    for (std::size_t k = 0; k < model.sizes.size(); ++k) model.flag[k] = false;
    CHECK(cuda_grad_norm(dev, exec) == 0.0);
  }

  TEST_CASE("a NaN gradient makes the norm NaN, and error_if_nonfinite throws before touching grads") {
    TestStream stream;
    Model model;
    model.new_grads(stream.s);
    model.grad[5][777777] = std::numeric_limits<float>::quiet_NaN();
    upload(model.d_grad[5].data(), model.grad[5], stream.s);
    CudaExecutor exec(stream.s);
    const CudaParamTable dev(model.device_table());
    CHECK(std::isnan(cuda_grad_norm(dev, exec)));
    CHECK(std::isnan(cuda_grad_norm(dev, exec, std::numeric_limits<double>::infinity())));
    CHECK_THROWS_AS(cuda_clip_grad_norm(dev, 1.0, exec, 2.0, true), kiln::NumericError);
    CHECK(mismatches(model.device_flat(model.d_grad, stream.s), model.flat(model.grad), "grad") == 0);
  }

  TEST_CASE("cuda_clip_grad_norm scales as clip_grad_norm, and only when it must") {
    TestStream stream;
    Model model;
    model.new_grads(stream.s);
    CpuExecutor cpu_exec(1);
    CudaExecutor exec(stream.s);
    const ParamTable host = model.host_table();
    const CudaParamTable dev(model.device_table());
    const double big = 1e9;  // no clipping: one reduction, no scaling pass
    CHECK(cuda_clip_grad_norm(dev, big, exec) == doctest::Approx(clip_grad_norm(host, big, cpu_exec)).epsilon(1e-10));
    CHECK(exec.stats().launches() == 1);
    const double want = clip_grad_norm(host, 2.0, cpu_exec);
    const double got = cuda_clip_grad_norm(dev, 2.0, exec);
    CHECK(got == doctest::Approx(want).epsilon(1e-10));
    CHECK(exec.stats().launches() == 3);
    CHECK(exec.stats().launches(kiln::kind::elementwise) == 1);
    CHECK(mismatches(model.device_flat(model.d_grad, stream.s), model.flat(model.grad), "clipped grad") == 0);
    CHECK(cuda_grad_norm(dev, exec) == doctest::Approx(2.0).epsilon(1e-5));
  }
}

// ---- the device loader -------------------------------------------------------------------------

namespace {

using kiln::data::Batch;
using kiln::data::Dataset;
using kiln::data::DeviceBatch;
using kiln::data::DeviceLoader;
using kiln::data::Loader;
using kiln::data::LoaderOptions;

Dataset make_dataset(index_t n, index_t d) {
  Dataset ds;
  ds.n = n;
  ds.d = d;
  ds.num_classes = 10;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  ds.features.resize(std::size_t(n * d));
  for (float& x : ds.features) x = u(rng);
  for (index_t i = 0; i < n; ++i) ds.labels.push_back(std::int32_t(rng() % 10));
  return ds;
}

// Checks `db` against the host loader's batch `hb`: metadata, and the data copied back.
void check_batch(const DeviceBatch& db, const Batch& hb, cudaStream_t s) {
  CHECK(db.size == hb.size);
  CHECK(db.dim == hb.dim);
  CHECK(db.index == hb.index);
  CHECK(db.epoch == hb.epoch);
  const std::vector<float> f = download(db.features, db.size * db.dim, s);
  const std::vector<std::int32_t> l = download(db.labels, db.size, s);
  CHECK(f == std::vector<float>(hb.features.begin(), hb.features.end()));
  CHECK(l == std::vector<std::int32_t>(hb.labels.begin(), hb.labels.end()));
}

}  // namespace

TEST_SUITE("cuda device loader") {
  TEST_CASE("DeviceLoader delivers exactly the host loader's batches, over two epochs") {
    const Dataset ds = make_dataset(1000, 37);  // 1000 = 15 × 64 + 40: a partial last batch
    for (bool drop_last : {false, true}) {
      for (int workers : {0, 2}) {
        CAPTURE(drop_last);
        CAPTURE(workers);
        const LoaderOptions opt{.batch_size = 64, .seed = 3, .drop_last = drop_last, .workers = workers};
        Loader host(ds, opt), reference(ds, opt);
        TestStream consumer;
        DeviceLoader loader(host, consumer.s);
        CHECK(loader.batches_per_epoch() == (drop_last ? 15 : 16));
        for (index_t epoch : {0, 1}) {
          loader.start_epoch(epoch);
          reference.start_epoch(epoch);
          index_t count = 0, last_size = 0;
          while (const DeviceBatch* db = loader.next()) {
            const Batch* hb = reference.next();
            REQUIRE(hb != nullptr);
            check_batch(*db, *hb, consumer.s);
            ++count;
            last_size = db->size;
          }
          CHECK(reference.next() == nullptr);
          CHECK(loader.next() == nullptr);  // and stays exhausted
          CHECK(count == (drop_last ? 15 : 16));
          CHECK(last_size == (drop_last ? 64 : 40));
        }
        CHECK(loader.batches_served() == (drop_last ? 30 : 32));
        CHECK(loader.wait_seconds() >= 0.0);
      }
    }
  }

  TEST_CASE("a new DeviceLoader's first uploads wait for the consumer stream's work on the memory they reuse") {
    // Issue 32: a slot's first upload waited on an event never recorded (no wait), into device
    // buffers the allocator may have just taken back from work still queued on the consumer
    // stream — here a late write into the block the first slot's features get.
    const Dataset ds = make_dataset(256, 33);
    const LoaderOptions opt{.batch_size = 64, .seed = 5, .workers = 0};
    Loader host(ds, opt), reference(ds, opt);
    TestStream consumer;
    {
      DeviceBuffer<float> freed(64 * 33);  // a slot's features: its block serves the loader next
      kiln_cuda_test::spin<><<<1, 1, 0, consumer.s>>>(400'000'000);  // ~0.2 s
      KILN_CUDA_CHECK(cudaGetLastError());
      KILN_CUDA_CHECK(cudaMemsetAsync(freed.data(), 0xFF, freed.size_bytes(), consumer.s));
    }  // back to the allocator with the write still queued
    DeviceLoader loader(host, consumer.s);
    loader.start_epoch(0);
    reference.start_epoch(0);
    const DeviceBatch* db = loader.next();
    REQUIRE(db != nullptr);
    const Batch* hb = reference.next();
    REQUIRE(hb != nullptr);
    check_batch(*db, *hb, consumer.s);  // NaNs where the late write landed on the upload
  }

  TEST_CASE("a slot is not overwritten while the consumer stream still reads it") {
    // The consumer never waits on the host: each batch is copied (device to device) into a
    // transcript behind a spin, while next() keeps uploading ahead. Only the events keep batch i's
    // buffer intact until the consumer's copy of it has run.
    const Dataset ds = make_dataset(1000, 129);
    const LoaderOptions opt{.batch_size = 64, .seed = 11, .workers = 1};
    Loader host(ds, opt), reference(ds, opt);
    TestStream consumer;
    DeviceLoader loader(host, consumer.s);
    for (index_t epoch : {0, 1}) {
      DeviceBuffer<float> transcript(ds.n * ds.d);
      DeviceBuffer<std::int32_t> transcript_labels(ds.n);
      loader.start_epoch(epoch);
      index_t row = 0;
      while (const DeviceBatch* db = loader.next()) {
        kiln_cuda_test::spin<><<<1, 1, 0, consumer.s>>>(200000);
        KILN_CUDA_CHECK(cudaGetLastError());
        KILN_CUDA_CHECK(cudaMemcpyAsync(transcript.data() + row * ds.d, db->features,
                                        std::size_t(db->size * db->dim) * sizeof(float), cudaMemcpyDeviceToDevice,
                                        consumer.s));
        KILN_CUDA_CHECK(cudaMemcpyAsync(transcript_labels.data() + row, db->labels,
                                        std::size_t(db->size) * sizeof(std::int32_t), cudaMemcpyDeviceToDevice,
                                        consumer.s));
        row += db->size;
      }
      REQUIRE(row == ds.n);
      const std::vector<float> f = download(transcript.data(), ds.n * ds.d, consumer.s);
      const std::vector<std::int32_t> l = download(transcript_labels.data(), ds.n, consumer.s);
      reference.start_epoch(epoch);
      index_t at = 0;
      while (const Batch* hb = reference.next()) {
        CAPTURE(hb->index);
        CHECK(std::memcmp(f.data() + at * ds.d, hb->features.data(), hb->features.size_bytes()) == 0);
        CHECK(std::memcmp(l.data() + at, hb->labels.data(), hb->labels.size_bytes()) == 0);
        at += hb->size;
      }
    }
  }

  TEST_CASE("restarting mid-epoch, and the contract's errors") {
    const Dataset ds = make_dataset(300, 5);
    std::function<void(Batch&)> fail_at_2 = [](Batch& b) {
      if (b.epoch == 7 && b.index == 2) throw std::runtime_error("transform failed");
    };
    const LoaderOptions opt{.batch_size = 32, .seed = 5, .workers = 0, .transform = fail_at_2};
    Loader host(ds, opt), reference(ds, opt);
    TestStream consumer;
    DeviceLoader loader(host, consumer.s);
    CHECK_THROWS_AS(loader.next(), kiln::ValueError);  // before start_epoch

    loader.start_epoch(0);
    for (int i = 0; i < 3; ++i) REQUIRE(loader.next() != nullptr);
    loader.start_epoch(1);  // abandons epoch 0 with an upload in flight
    reference.start_epoch(1);
    index_t count = 0;
    while (const DeviceBatch* db = loader.next()) {
      const Batch* hb = reference.next();
      REQUIRE(hb != nullptr);
      check_batch(*db, *hb, consumer.s);
      ++count;
    }
    CHECK(count == 10);

    // The transform's exception surfaces when the consumer reaches batch 2, and stays.
    loader.start_epoch(7);
    CHECK(loader.next()->index == 0);
    CHECK(loader.next()->index == 1);
    CHECK_THROWS_AS(loader.next(), std::runtime_error);
    CHECK_THROWS_AS(loader.next(), std::runtime_error);
    loader.start_epoch(2);
    CHECK(loader.next()->index == 0);
  }
}

TEST_CASE("a captured step keeps the gradient flags of its capture: eager calls with other flags do not change its replays") {
  // Issue 32: the flags went through a pinned staging block copied by cudaMemcpyAsync, whose
  // address a captured graph kept — a replay read whatever later eager calls had staged there —
  // and the blocks' reuse waited on events (cudaEventSynchronize, not allowed in a capture).
  CudaExecutor exec;
  DeviceBuffer<float> v0(4), g0(4), v1(4), g1(4);
  bool has0 = true, has1 = false;
  kiln::optim::CudaParamTable table(ParamTable{{v0.data(), g0.data(), 4, &has0}, {v1.data(), g1.data(), 4, &has1}});
  const std::vector<float> ones(4, 1.0f);
  for (DeviceBuffer<float>* g : {&g0, &g1})
    KILN_CUDA_CHECK(cudaMemcpy(g->data(), ones.data(), g->size_bytes(), cudaMemcpyHostToDevice));
  auto scale = [&](float c) {
    kiln::optim::detail::with_active_slots(table, exec.stream(), [&](const kiln::optim::SlotStep* slots) {
      table.apply(exec, kiln::optim::detail::ScaleGradOp{c, slots});
    });
  };
  kiln::cu::StepGraph graph;
  exec.begin_capture(graph);
  scale(2.0f);  // parameter 0 has a gradient, parameter 1 not
  exec.end_capture();
  REQUIRE_MESSAGE(graph.replayable(), graph.not_replayable());
  has0 = false;
  has1 = true;
  for (int i = 0; i < 5; ++i) scale(3.0f);  // eager, the other way round: g1 becomes 3^5
  graph.replay(exec.stream(), exec.stats(), false);
  KILN_CUDA_CHECK(cudaStreamSynchronize(exec.stream()));
  std::vector<float> got0(4), got1(4);
  KILN_CUDA_CHECK(cudaMemcpy(got0.data(), g0.data(), g0.size_bytes(), cudaMemcpyDeviceToHost));
  KILN_CUDA_CHECK(cudaMemcpy(got1.data(), g1.data(), g1.size_bytes(), cudaMemcpyDeviceToHost));
  CHECK(got0 == std::vector<float>(4, 2.0f));    // scaled by the replay alone
  CHECK(got1 == std::vector<float>(4, 243.0f));  // by the eager calls alone
}
