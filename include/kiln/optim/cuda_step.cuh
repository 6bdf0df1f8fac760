// kiln/optim/cuda_step.cuh — SGD<kiln::cuda>, Adam<kiln::cuda> and AdamW<kiln::cuda>: the
// optimizers of kiln/optim/sgd.hpp and adam.hpp on a CUDA device, same options, checks and
// per-element math. Include it in nvcc translation units only; it also brings the multi-tensor
// machinery (multi_tensor.cuh: CudaParamTable, cuda_zero_grad) and clipping (cuda_clip.cuh).
//
// A fused step is ONE multi-tensor kernel over every parameter. Results agree with the CPU to
// rounding, not bit for bit: nvcc contracts a * b + c into fused multiply-adds, a host compiler
// usually does not.
//
// Skipped steps and per-parameter state. A step guard (optim::StepGuard, found_inf in device
// memory) is read by the kernel itself: every block reads the flag once and, when it is non-zero,
// runs no chunk. The state a step advances per parameter lives in device memory and advances in
// the same kernel, only when the step is not skipped:
//   Adam(W): t[k], the parameter's step count (PyTorch's state[p]["step"]), an index_t per parameter;
//   SGD:     started[k], whether its momentum buffer has started (one byte per parameter).
// Blocks read t[k] / started[k] per chunk (Adam's bias corrections are computed then, in double,
// once per chunk and cached while consecutive chunks share a count); the last block to finish
// advances them, once per parameter, after every other block has counted itself done on an
// atomic counter (kernels::multi_tensor_apply's finish hook) — no race, no host involvement, and
// the kernel's arguments do not change from step to step, so a captured step replays correctly.
// Which parameters have a gradient (has_grad, host flags) still comes from the host per call.
// The host keeps a mirror of the counts for the eager stance and the accessors; it is exact
// until a guarded fused step (whose outcome only the device knows) and is then re-read from the
// device, with a synchronisation, when next needed.
//
// force_eager steps run the same update as kiln expressions tensor by tensor (as on the CPU);
// they read a guard's flag on the host, which synchronises the stream: that stance is for
// debugging and for measuring fusion.
//
//   kiln::optim::AdamW opt(model, {.lr = 3e-4});     // a Model::on<kiln::cuda>: AdamW<kiln::cuda>
//   kiln::CudaExecutor exec(stream);
//   ... backward ...
//   kiln::optim::cuda_clip_grad_norm(opt.device_table(), 1.0, exec);
//   opt.step(exec);                                  // one launch of kind::optimizer
//   opt.zero_grad(exec);                             // set to none: no launch for a model's table
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/backend/cuda/allocator.cuh"
#include "kiln/backend/cuda/check.cuh"
#include "kiln/backend/cuda/executor.cuh"
#include "kiln/config.hpp"
#include "kiln/core/space.hpp"
#include "kiln/core/stats.hpp"
#include "kiln/optim/adam.hpp"
#include "kiln/optim/cuda_clip.cuh"
#include "kiln/optim/multi_tensor.cuh"
#include "kiln/optim/param.hpp"
#include "kiln/optim/sgd.hpp"
#include "kiln/policy/stance.hpp"

namespace kiln::optim {

namespace detail {

// What every optimizer kernel reads per step besides its state.
struct DeviceStep {
  const SlotStep* slots;   // nullptr: every parameter has a gradient
  const float* found_inf;  // nullptr: unguarded
  KILN_DEVICE bool active(index_t k) const { return slots == nullptr || slots[k].active; }
  KILN_DEVICE bool skipped() const { return found_inf != nullptr && *found_inf != 0.0f; }
};

template <bool Momentum>
struct SgdOp {
  static constexpr bool per_param_state = Momentum;
  SgdParams h;
  float* buf;              // the momentum buffer (Momentum only)
  unsigned char* started;  // per parameter: its buffer has started (Momentum only)
  unsigned* done;          // the last-block counter (Momentum only)
  DeviceStep step;
  KILN_DEVICE bool skipped() const { return step.skipped(); }
  KILN_DEVICE bool select(index_t slot, const CudaParamEntry&) {
    if constexpr (Momentum) h.init_buffer = started[slot] == 0;
    return step.active(slot);
  }
  KILN_DEVICE void finish(index_t k) const {
    if (step.active(k)) started[k] = 1;
  }
  KILN_DEVICE void operator()(const CudaParamEntry& e, index_t i) const {
    float p = e.value[i];
    const float g = e.grad[i];
    if constexpr (Momentum) {
      float* b = buf + e.offset + i;
      float bv = h.init_buffer ? 0.0f : *b;  // sgd_update overwrites it on the buffer's first step
      sgd_update(p, g, bv, h);
      *b = bv;
    } else {
      sgd_update(p, g, h);
    }
    e.value[i] = p;
  }
};

template <bool Decoupled, bool Amsgrad>
struct AdamOp {
  static constexpr bool per_param_state = true;
  AdamParams h;  // the step-free scalars; select sets the bias corrections of the chunk's t
  double lr, beta1, beta2;
  float* m;
  float* v;
  float* v_max;  // Amsgrad only
  index_t* t;    // per parameter: its step count before this step
  unsigned* done;
  DeviceStep step;
  index_t h_t;  // the t h's bias corrections are for (0: none yet)
  float weight_decay, decay;  // h's weight-decay terms for the group that decays
  KILN_DEVICE bool skipped() const { return step.skipped(); }
  KILN_DEVICE bool select(index_t slot, const CudaParamEntry& e) {
    if (!step.active(slot)) return false;
    // The group without weight decay: L2 term 0, decoupled factor 1 (as the host's AdamBase).
    h.weight_decay = e.decays ? weight_decay : 0.0f;
    h.decay = e.decays ? decay : 1.0f;
    const index_t tk = t[slot] + 1;
    if (tk != h_t) {
      set_adam_step(h, lr, beta1, beta2, tk);
      h_t = tk;
    }
    return true;
  }
  KILN_DEVICE void finish(index_t k) const {
    if (step.active(k)) t[k] += 1;
  }
  KILN_DEVICE void operator()(const CudaParamEntry& e, index_t i) const {
    const index_t f = e.offset + i;
    float p = e.value[i];
    const float g = e.grad[i];
    float mi = m[f], vi = v[f];
    if constexpr (Amsgrad) {
      float vm = v_max[f];
      if constexpr (Decoupled) adamw_update(p, g, mi, vi, vm, h);
      else adam_update(p, g, mi, vi, vm, h);
      v_max[f] = vm;
    } else {
      if constexpr (Decoupled) adamw_update(p, g, mi, vi, h);
      else adam_update(p, g, mi, vi, h);
    }
    e.value[i] = p;
    m[f] = mi;
    v[f] = vi;
  }
};

// Whether a guard skips this step, read on the host: waits for exec's stream (force_eager only).
inline bool device_guard_skips(const StepGuard& guard, cudaStream_t stream) {
  if (guard.found_inf == nullptr) return false;
  float flag = 0.0f;
  KILN_CUDA_CHECK(cudaMemcpyAsync(&flag, guard.found_inf, sizeof(float), cudaMemcpyDeviceToHost, stream));
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
  return flag != 0.0f;
}

// Copies n elements between the host mirror and device state on `stream`; a download waits for it.
template <class T>
void download_state(std::vector<T>& host, const T* device, cudaStream_t stream) {
  if (host.empty()) return;
  KILN_CUDA_CHECK(cudaMemcpyAsync(host.data(), device, host.size() * sizeof(T), cudaMemcpyDeviceToHost, stream));
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
}
template <class T>
void upload_state(T* device, const std::vector<T>& host, cudaStream_t stream) {
  // Pageable source: the call returns once the bytes are staged, so the host may change them after.
  if (!host.empty())
    KILN_CUDA_CHECK(cudaMemcpyAsync(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, stream));
}

// The scratch tensor of an eager step: the largest parameter's size (nothing when not needed).
inline TempPool<cuda>::Buffer eager_scratch(CudaExecutor& exec, const ParamTable& table, bool needed) {
  index_t largest = 0;
  for (const ParamSlot& s : table) largest = std::max(largest, s.size);
  return needed ? exec.temps().take(std::size_t(largest) * sizeof(float)) : TempPool<cuda>::Buffer{};
}

}  // namespace detail

// SGD on the device, as SGD<kiln::host>. The momentum buffer is allocated on the first step
// that uses momentum, as PyTorch's.
template <>
class SGD<cuda> {
 public:
  using space = cuda;
  using Options = SgdOptions;
  static constexpr const char* name = "SGD";

  // Synchronises the device once (the table's upload and the zeroed per-parameter state).
  SGD(ParamTable table, const SgdOptions& options)
      : opt_(checked(options)), table_(std::move(table)), slots_(table_.count()), started_(table_.count()), done_(1) {
    detail::zero_device(started_.data(), started_.size());
    detail::zero_device(done_.data(), 1);
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
  }
  // From a model on kiln::cuda: its param_table().
  template <param_model M>
  SGD(const M& model, const SgdOptions& options) : SGD(model.param_table(), options) {
    static_assert(std::is_same_v<typename M::space, cuda>,
                  "kiln::optim::SGD<kiln::cuda>: the model's parameters live in another memory space; write "
                  "optim::SGD opt(model, ...) to take the model's space");
  }

  static constexpr index_t launches(bool eager, const SgdOptions& options, index_t tensors) {
    return SGD<host>::launches(eager, options, tensors);
  }

  // One update of every parameter that has a gradient, on exec's stream. Fused: one launch of
  // kind::optimizer (counted always; no kernel runs when no parameter has a gradient), a guard
  // decided on the device. force_eager: kiln expressions tensor by tensor, a guard read on the host.
  template <class Stance = stance::fused>
  void step(CudaExecutor& exec, StepGuard guard = {}) {
    static_assert(stance::is_stance_v<Stance>, "kiln::optim::SGD::step: the template argument is a stance "
                  "(kiln::stance::fused or kiln::stance::force_eager)");
    ++steps_;
    const bool use_buffer = opt_.momentum != 0.0;
    const index_t work = slots_.read_flags(table_.table());
    constexpr bool fused = std::is_same_v<Stance, stance::fused>;
    if constexpr (fused)
      exec.stats().count(kind::optimizer, "sgd", work, std::size_t(work) * sizeof(float) * (use_buffer ? 5 : 3));
    if (!fused && detail::device_guard_skips(guard, exec.stream())) return;
    if (use_buffer && !has_buffer_) {
      // Zeroed on exec's stream: a parameter's part reads 0 until its first step with a gradient.
      momentum_buffer_ = cu::DeviceBuffer<float>(table_.total_size());
      if (table_.total_size() > 0)
        KILN_CUDA_CHECK(cudaMemsetAsync(momentum_buffer_.data(), 0, momentum_buffer_.size_bytes(), exec.stream()));
      has_buffer_ = true;
    }
    if (!slots_.any_active()) return;
    const SgdParams h = detail::sgd_params(opt_);
    if constexpr (fused) fused_step(exec, guard, h, use_buffer);
    else eager_step(exec, h, use_buffer);
  }

  // cuda_zero_grad over the table: set_to_none clears flagged parameters and zero-fills the others.
  void zero_grad(CudaExecutor& exec, bool set_to_none = true) const { cuda_zero_grad(table_, exec, set_to_none); }

  double lr() const { return opt_.lr; }
  void set_lr(double lr) {
    SgdOptions next = opt_;
    next.lr = lr;
    opt_ = checked(next);
  }
  double momentum() const { return opt_.momentum; }
  void set_momentum(double momentum) {
    SgdOptions next = opt_;
    next.momentum = momentum;
    opt_ = checked(next);
  }

  const SgdOptions& options() const { return opt_; }
  const ParamTable& table() const { return table_.table(); }
  const CudaParamTable& device_table() const { return table_; }
  // Number of step() calls (guard-skipped ones included).
  index_t steps() const { return steps_; }
  // Whether parameter k's momentum buffer has started (PyTorch's state[p]["momentum_buffer"]).
  // After a guarded fused step this reads the device's record (synchronising the device).
  bool has_momentum_buffer(index_t k) const {
    sync_mirror(nullptr);
    return slots_.has_buffer(k);
  }
  // The momentum buffer (device memory, total_size() floats laid out by table().offset(k), 0
  // where a parameter's buffer has not started); nullptr until a step has used momentum.
  float* d_momentum_buffer() { return has_buffer_ ? momentum_buffer_.data() : nullptr; }
  const float* d_momentum_buffer() const { return has_buffer_ ? momentum_buffer_.data() : nullptr; }

  // Checkpoint state (optim::StateBuffer, device pointers), as SGD<host>'s.
  static constexpr const char* counter_name = "momentum_started";
  std::vector<StateBuffer> state_buffers() {
    if (opt_.momentum == 0.0) return {};
    if (!has_buffer_) {
      momentum_buffer_ = cu::DeviceBuffer<float>(table_.total_size());
      if (momentum_buffer_.size() > 0) KILN_CUDA_CHECK(cudaMemset(momentum_buffer_.data(), 0, momentum_buffer_.size_bytes()));
      has_buffer_ = true;
    }
    return {{"momentum_buffer", momentum_buffer_.data()}};
  }
  std::vector<index_t> param_counters() const {
    sync_mirror(nullptr);
    std::vector<index_t> out;
    for (index_t k = 0; k < table_.count(); ++k) out.push_back(slots_.has_buffer(k) ? 1 : 0);
    return out;
  }
  void set_param_counters(const std::vector<index_t>& started) {
    KILN_CHECK(index_t(started.size()) == table_.count(), ValueError, "SGD::set_param_counters: ", started.size(),
               " flags for ", table_.count(), " parameters");
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    for (std::size_t k = 0; k < started.size(); ++k) slots_.buffer_bits()[k] = started[k] != 0;
    detail::upload_state(reinterpret_cast<char*>(started_.data()), slots_.buffer_bits(), nullptr);
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    mirror_ok_ = true;
  }
  void set_steps(index_t steps) { steps_ = steps; }

 private:
  static const SgdOptions& checked(const SgdOptions& o) {
    detail::check_sgd(o);
    return o;
  }

  void fused_step(CudaExecutor& exec, const StepGuard& guard, const SgdParams& h, bool use_buffer) {
    // The device decides a guarded step; the mirror follows the device only while it can know.
    if (guard.found_inf != nullptr) mirror_ok_ = false;
    else if (use_buffer) slots_.mark_buffers();
    auto launch = [&](const SlotStep* slots) {
      const detail::DeviceStep ds{slots, guard.found_inf};
      if (use_buffer)
        table_.apply(exec, detail::SgdOp<true>{h, momentum_buffer_.data(), started_.data(), done_.data(), ds});
      else table_.apply(exec, detail::SgdOp<false>{h, nullptr, nullptr, nullptr, ds});
    };
    detail::with_active_slots(table_, exec.stream(), launch);
  }

  void eager_step(CudaExecutor& exec, const SgdParams& h, bool use_buffer) {
    sync_mirror(exec.stream());
    auto scratch = detail::eager_scratch(exec, table_.table(), opt_.maximize || opt_.weight_decay != 0.0);
    for (index_t k = 0; k < table_.count(); ++k) {
      if (!slots_.active(k)) continue;
      float* buf = use_buffer ? momentum_buffer_.data() + table_.offset(k) : nullptr;
      detail::sgd_eager_tensor(exec, table_.table()[k], buf, static_cast<float*>(scratch.get()), opt_, h,
                               slots_.has_buffer(k));
    }
    if (use_buffer) {
      slots_.mark_buffers();
      detail::upload_state(reinterpret_cast<char*>(started_.data()), slots_.buffer_bits(), exec.stream());
    }
  }

  // Re-reads the buffer starts from the device when a guarded fused step made the mirror stale
  // (on `stream`, or after synchronising the device when there is none).
  void sync_mirror(cudaStream_t stream) const {
    if (mirror_ok_) return;
    if (stream == nullptr) KILN_CUDA_CHECK(cudaDeviceSynchronize());
    detail::download_state(slots_.buffer_bits(), reinterpret_cast<const char*>(started_.data()), stream);
    mirror_ok_ = true;
  }

  SgdOptions opt_;
  CudaParamTable table_;
  mutable detail::SgdSlots slots_;  // this step's flags; the mirror of started_
  mutable bool mirror_ok_ = true;
  cu::DeviceBuffer<unsigned char> started_;
  cu::DeviceBuffer<unsigned> done_;
  cu::DeviceBuffer<float> momentum_buffer_;
  bool has_buffer_ = false;
  index_t steps_ = 0;
};

namespace detail {

// Adam<kiln::cuda> (Decoupled = false) and AdamW<kiln::cuda> (true), as detail::AdamBase on the
// host. State buffers and counts are zeroed at construction (which synchronises the device once).
template <bool Decoupled>
class CudaAdamBase {
 public:
  using space = cuda;
  using Options = std::conditional_t<Decoupled, AdamWOptions, AdamOptions>;
  static constexpr const char* name = Decoupled ? "AdamW" : "Adam";

  CudaAdamBase(ParamTable table, const Options& options)
      : opt_(checked(options)),
        table_(std::move(table)),
        slots_(table_.count()),
        t_(table_.count()),
        done_(1),
        exp_avg_(table_.total_size()),
        exp_avg_sq_(table_.total_size()) {
    const index_t n = table_.total_size();
    zero_device(exp_avg_.data(), n);
    zero_device(exp_avg_sq_.data(), n);
    if (opt_.amsgrad) {
      max_exp_avg_sq_ = cu::DeviceBuffer<float>(n);
      zero_device(max_exp_avg_sq_.data(), n);
    }
    zero_device(t_.data(), t_.size());
    zero_device(done_.data(), 1);
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
  }
  // From a model on kiln::cuda: its param_table().
  template <param_model M>
  CudaAdamBase(const M& model, const Options& options) : CudaAdamBase(model.param_table(), options) {
    static_assert(std::is_same_v<typename M::space, cuda>,
                  "kiln::optim::Adam<kiln::cuda> / AdamW<kiln::cuda>: the model's parameters live in another memory "
                  "space; write optim::AdamW opt(model, ...) to take the model's space");
  }

  static constexpr index_t launches(bool eager, const Options& options, index_t tensors) {
    return AdamBase<Decoupled>::launches(eager, options, tensors);
  }

  // One update of every parameter that has a gradient, on exec's stream. Fused: one launch of
  // kind::optimizer (counted always; no kernel runs when no parameter has a gradient), a guard
  // and the per-parameter counts read and advanced on the device. force_eager: kiln expressions
  // tensor by tensor, a guard read on the host.
  template <class Stance = stance::fused>
  void step(CudaExecutor& exec, StepGuard guard = {}) {
    static_assert(stance::is_stance_v<Stance>, "kiln::optim::Adam(W)::step: the template argument is a stance "
                  "(kiln::stance::fused or kiln::stance::force_eager)");
    ++steps_;
    const index_t work = slots_.read_flags(table_.table());
    const bool ams = opt_.amsgrad;
    constexpr bool fused = std::is_same_v<Stance, stance::fused>;
    if constexpr (fused)
      exec.stats().count(kind::optimizer, Decoupled ? "adamw" : "adam", work,
                         std::size_t(work) * sizeof(float) * (ams ? 9 : 7));
    if (!slots_.any_active()) return;
    if constexpr (fused) fused_step(exec, guard);
    else if (!device_guard_skips(guard, exec.stream())) eager_step(exec);
  }

  // cuda_zero_grad over the table: set_to_none clears flagged parameters and zero-fills the others.
  void zero_grad(CudaExecutor& exec, bool set_to_none = true) const { cuda_zero_grad(table_, exec, set_to_none); }

  double lr() const { return opt_.lr; }
  void set_lr(double lr) {
    Options next = opt_;
    next.lr = lr;
    opt_ = checked(next);
  }
  double beta1() const { return opt_.beta1; }
  void set_beta1(double beta1) {
    Options next = opt_;
    next.beta1 = beta1;
    opt_ = checked(next);
  }

  const Options& options() const { return opt_; }
  const ParamTable& table() const { return table_.table(); }
  const CudaParamTable& device_table() const { return table_; }
  // Number of step() calls (guard-skipped ones included).
  index_t steps() const { return steps_; }
  // Steps that updated parameter k, its own t (PyTorch's state[p]["step"]). After a guarded
  // fused step this reads the device's count (synchronising the device).
  index_t param_steps(index_t k) const {
    sync_mirror(nullptr);
    return slots_.steps(k);
  }
  // Per-parameter counts (device memory, one index_t per parameter).
  const index_t* d_param_steps() const { return t_.data(); }
  // State buffers (device memory, total_size() floats laid out by table().offset(k));
  // d_max_exp_avg_sq is nullptr without amsgrad.
  const float* d_exp_avg() const { return exp_avg_.data(); }
  const float* d_exp_avg_sq() const { return exp_avg_sq_.data(); }
  const float* d_max_exp_avg_sq() const { return max_exp_avg_sq_.data(); }

  // Checkpoint state (optim::StateBuffer, device pointers), as Adam(W)<host>'s.
  static constexpr const char* counter_name = "step";
  std::vector<StateBuffer> state_buffers() {
    std::vector<StateBuffer> out{{"exp_avg", exp_avg_.data()}, {"exp_avg_sq", exp_avg_sq_.data()}};
    if (opt_.amsgrad) out.push_back({"max_exp_avg_sq", max_exp_avg_sq_.data()});
    return out;
  }
  std::vector<index_t> param_counters() const {
    sync_mirror(nullptr);
    return slots_.counts();
  }
  void set_param_counters(const std::vector<index_t>& counts) {
    KILN_CHECK(index_t(counts.size()) == table_.count(), ValueError, name, "::set_param_counters: ", counts.size(),
               " counts for ", table_.count(), " parameters");
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    slots_.counts() = counts;
    upload_state(t_.data(), slots_.counts(), nullptr);
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    mirror_ok_ = true;
  }
  void set_steps(index_t steps) { steps_ = steps; }

 private:
  static const Options& checked(const Options& o) {
    check_adam(o, name);
    return o;
  }

  void fused_step(CudaExecutor& exec, const StepGuard& guard) {
    if (guard.found_inf != nullptr) mirror_ok_ = false;
    else slots_.advance();
    // The step-free scalars; each block sets the bias corrections of its chunks' counts.
    const AdamParams h = adam_params<Decoupled>(opt_, 1);
    auto launch = [&](const SlotStep* slots) {
      const DeviceStep ds{slots, guard.found_inf};
      float* m = exp_avg_.data();
      float* v = exp_avg_sq_.data();
      if (opt_.amsgrad)
        table_.apply(exec, AdamOp<Decoupled, true>{h, opt_.lr, opt_.beta1, opt_.beta2, m, v, max_exp_avg_sq_.data(),
                                                   t_.data(), done_.data(), ds, 0, h.weight_decay, h.decay});
      else
        table_.apply(exec, AdamOp<Decoupled, false>{h, opt_.lr, opt_.beta1, opt_.beta2, m, v, nullptr, t_.data(),
                                                    done_.data(), ds, 0, h.weight_decay, h.decay});
    };
    with_active_slots(table_, exec.stream(), launch);
  }

  void eager_step(CudaExecutor& exec) {
    sync_mirror(exec.stream());
    slots_.advance();
    const bool l2 = !Decoupled && opt_.weight_decay != 0.0;
    auto scratch = eager_scratch(exec, table_.table(), opt_.maximize || l2);
    index_t t_prev = 0;
    AdamParams h{};
    for (index_t k = 0; k < table_.count(); ++k) {
      if (!slots_.active(k)) continue;
      const index_t t = slots_.steps(k);
      if (t != t_prev) h = adam_params<Decoupled>(opt_, t);
      t_prev = t;
      const index_t off = table_.offset(k);
      float* vmax = opt_.amsgrad ? max_exp_avg_sq_.data() + off : nullptr;
      // The group without weight decay takes the options with none.
      Options o = opt_;
      AdamParams hk = h;
      if (!table_.table()[k].decays) {
        o.weight_decay = 0.0;
        hk.weight_decay = 0.0f;
        hk.decay = 1.0f;
      }
      adam_eager_tensor<Decoupled>(exec, table_.table()[k], exp_avg_.data() + off, exp_avg_sq_.data() + off, vmax,
                                   static_cast<float*>(scratch.get()), o, hk);
    }
    upload_state(t_.data(), slots_.counts(), exec.stream());
  }

  // Re-reads the counts from the device when a guarded fused step made the mirror stale (on
  // `stream`, or after synchronising the device when there is none).
  void sync_mirror(cudaStream_t stream) const {
    if (mirror_ok_) return;
    if (stream == nullptr) KILN_CUDA_CHECK(cudaDeviceSynchronize());
    download_state(slots_.counts(), t_.data(), stream);
    mirror_ok_ = true;
  }

  Options opt_;
  CudaParamTable table_;
  mutable AdamSlots slots_;  // this step's flags; the mirror of t_
  mutable bool mirror_ok_ = true;
  cu::DeviceBuffer<index_t> t_;
  cu::DeviceBuffer<unsigned> done_;
  cu::DeviceBuffer<float> exp_avg_, exp_avg_sq_, max_exp_avg_sq_;
  index_t steps_ = 0;
};

}  // namespace detail

template <>
class Adam<cuda> : public detail::CudaAdamBase<false> {
 public:
  using CudaAdamBase::CudaAdamBase;
};

template <>
class AdamW<cuda> : public detail::CudaAdamBase<true> {
 public:
  using CudaAdamBase::CudaAdamBase;
};

// Old spellings; examples move to SGD<kiln::cuda> / Adam<kiln::cuda> / AdamW<kiln::cuda> (or
// deduce the space from the model).
using CudaSgd = SGD<cuda>;
using CudaAdam = Adam<cuda>;
using CudaAdamW = AdamW<cuda>;

}  // namespace kiln::optim
