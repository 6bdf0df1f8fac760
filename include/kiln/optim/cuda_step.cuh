// kiln/optim/cuda_step.cuh — the optimizers' step, gradient zeroing and gradient-norm clipping on
// a CUDA device, each ONE kernel launch over every parameter (a "multi-tensor apply").
//
// A CudaParamTable uploads a ParamTable (whose pointers are device memory) once: a device-side
// table of (value, grad, size, flat offset) per parameter, and a list of chunks — pieces of at
// most chunk_size elements that never straddle two parameters — mapping each chunk to
// (parameter, first element). Blocks walk the chunk list, so a model of any number of tensors,
// empty ones included, costs one launch per step. Optimizer state (momentum / exp_avg /
// exp_avg_sq / max_exp_avg_sq) is one contiguous device buffer per kind laid out by flat offset,
// as on the CPU, so parameter k's state starts at table().offset(k).
//
// The per-element math is the CPU optimizers' own (sgd_update, adam_update, adamw_update with the
// scalars of make_adam_params), so both backends follow PyTorch's semantics to the same formulas.
// Results agree with the CPU to rounding, not bit for bit: nvcc contracts a * b + c into fused
// multiply-adds, a host compiler usually does not.
//
// Parameters without a gradient (ParamSlot::has_grad, read on the host at each call) are skipped
// as on the CPU. In the common case — every non-empty parameter has a gradient and, for Adam, all
// share one step count — the step's scalars travel by value in the kernel's arguments, as before.
// Otherwise a small per-parameter array (SlotStep: has a gradient, its own bias corrections, its
// momentum buffer starting) is copied to the device with cudaMemcpyAsync from a pinned staging
// block ahead of the launch, so the host does not wait for the device (CudaParamTable::
// launch_with_slot_steps). The CUDA-graph issue will move this per-step information, and the
// per-parameter counts it comes from, into device memory, so a captured step needs no host work.
//
//   kiln::optim::ParamTable table;              // device pointers
//   table.add(d_w, d_dw, w_size);
//   kiln::optim::CudaAdamW opt(table, {.lr = 3e-4});
//   kiln::CudaExecutor exec(stream);
//   ... backward ...
//   kiln::optim::cuda_clip_grad_norm(opt.device_table(), 1.0, exec);
//   opt.step(exec);                             // one launch of kind::optimizer
//   opt.zero_grad(exec);                        // set to none: no launch for a model's table
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cub/block/block_reduce.cuh>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/backend/cuda/allocator.cuh"
#include "kiln/backend/cuda/check.cuh"
#include "kiln/backend/cuda/executor.cuh"
#include "kiln/backend/cuda/pinned.cuh"
#include "kiln/config.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/stats.hpp"
#include "kiln/optim/adam.hpp"
#include "kiln/optim/clip.hpp"
#include "kiln/optim/param.hpp"
#include "kiln/optim/sgd.hpp"

namespace kiln::optim {

// One parameter as the kernels see it: `size` floats at value and grad (device memory); its
// optimizer state starts at `offset` in every state buffer. flagged: its slot has a has_grad flag
// (zero_grad's set_to_none clears the flag instead of filling the gradient).
struct CudaParamEntry {
  float* value;
  float* grad;
  index_t size;
  index_t offset;
  bool flagged;
};

// What one step needs per parameter when the parameters differ (see the header comment).
struct SlotStep {
  float step_size;              // Adam(W): lr / (1 - beta1^t), t this parameter's own count
  float bias_correction2_sqrt;  // Adam(W): sqrt(1 - beta2^t)
  bool active;                  // false: no gradient this step, the kernel leaves the parameter alone
  bool init_buffer;             // SGD: this parameter's momentum buffer starts now (buf = d)
};

// A piece of parameter `slot`: elements [begin, min(begin + chunk_size, size)).
struct ParamChunk {
  index_t slot;
  index_t begin;
};

}  // namespace kiln::optim

namespace kiln::cu::kernels {

inline constexpr int multi_tensor_threads = 256;

// Applies op(entry, i) to every element i of every parameter. Block b takes chunks b,
// b + gridDim.x, ...; the chunk's parameter and start are uniform over the block, so their loads
// are broadcasts. An op with select(slot, entry) gets a private copy per chunk that select may
// specialise to the parameter (its SlotStep); select returning false skips the chunk, uniformly
// over the block.
template <class Op>
KILN_GLOBAL void multi_tensor_apply(const optim::CudaParamEntry* entries, const optim::ParamChunk* chunks,
                                    index_t chunk_count, index_t chunk_size, Op op) {
  for (index_t c = blockIdx.x; c < chunk_count; c += gridDim.x) {
    const optim::ParamChunk ch = chunks[c];
    const optim::CudaParamEntry e = entries[ch.slot];
    Op local = op;
    if constexpr (requires { local.select(ch.slot, e); }) {
      if (!local.select(ch.slot, e)) continue;
    }
    const index_t end = ch.begin + chunk_size < e.size ? ch.begin + chunk_size : e.size;
    for (index_t i = ch.begin + threadIdx.x; i < end; i += multi_tensor_threads) local(e, i);
  }
}

// The kinds of gradient norm: sum of squares (2), sum of |x| (1), max |x| (infinity), sum of
// |x|^p (any other p). Accumulated in double, as the CPU's grad_norm does.
enum class NormKind { l2, l1, linf, lp };

template <NormKind K>
struct NormMerge {
  KILN_HOST_DEVICE double operator()(double a, double b) const {
    if constexpr (K == NormKind::linf) return a != a || a >= b ? a : b;  // NaN wins, as torch's max
    else return a + b;
  }
};

template <NormKind K>
KILN_DEVICE double norm_term(float g, double p) {
  const double a = ::fabs(double(g));
  if constexpr (K == NormKind::l2) return a * a;
  else if constexpr (K == NormKind::lp) return ::pow(a, p);
  else return a;
}

// One partial per chunk: partial[c] is chunk c's sum (or max) of norm terms. Each thread walks
// its elements in a fixed order and the block tree is fixed, so the partials — and the norm —
// are the same on every run and for any grid size. slots (nullptr: every parameter counts): a
// chunk of a parameter without a gradient contributes 0, the identity of both merges.
template <NormKind K>
KILN_GLOBAL void grad_norm_partials(const optim::CudaParamEntry* entries, const optim::ParamChunk* chunks,
                                    index_t chunk_count, index_t chunk_size, double p,
                                    const optim::SlotStep* slots, double* partial) {
  using BlockReduce = cub::BlockReduce<double, multi_tensor_threads>;
  __shared__ typename BlockReduce::TempStorage storage;
  const NormMerge<K> merge{};
  for (index_t c = blockIdx.x; c < chunk_count; c += gridDim.x) {
    const optim::ParamChunk ch = chunks[c];
    if (slots != nullptr && !slots[ch.slot].active) {
      if (threadIdx.x == 0) partial[c] = 0.0;
      continue;  // uniform over the block: `storage` is not touched
    }
    const optim::CudaParamEntry e = entries[ch.slot];
    const index_t end = ch.begin + chunk_size < e.size ? ch.begin + chunk_size : e.size;
    double acc = 0.0;
    for (index_t i = ch.begin + threadIdx.x; i < end; i += multi_tensor_threads)
      acc = merge(acc, norm_term<K>(e.grad[i], p));
    const double total = BlockReduce(storage).Reduce(acc, merge);
    if (threadIdx.x == 0) partial[c] = total;
    __syncthreads();  // the next chunk reuses `storage`
  }
}

// One block: thread t merges partials t, t + 256, ... in order, then a fixed block tree.
// 0 is the identity of both the sum and the max of absolute values.
template <NormKind K>
KILN_GLOBAL void grad_norm_finalize(const double* partial, index_t count, double* out) {
  using BlockReduce = cub::BlockReduce<double, multi_tensor_threads>;
  __shared__ typename BlockReduce::TempStorage storage;
  const NormMerge<K> merge{};
  double acc = 0.0;
  for (index_t i = threadIdx.x; i < count; i += multi_tensor_threads) acc = merge(acc, partial[i]);
  const double total = BlockReduce(storage).Reduce(acc, merge);
  if (threadIdx.x == 0) out[0] = total;
}

}  // namespace kiln::cu::kernels

namespace kiln::optim {

// A ParamTable mirrored on the device for multi-tensor kernels; uploaded once, immutable after
// (the has_grad flags stay on the host and are read at each call).
// requires: every value and grad pointer in the table is memory the current device can read and
//   write (device, managed or pinned memory; pageable host memory only on devices with pageable
//   memory access), and stays valid as long as this object — checked at construction, throws
//   ValueError naming the parameter otherwise. Used from one host thread at a time.
// Construction synchronises the device (the upload must land before any stream uses it).
class CudaParamTable {
 public:
  // Elements per chunk: 16 per thread of a 256-thread block, enough work to hide the chunk lookup.
  static constexpr index_t chunk_size = index_t(kiln::cu::kernels::multi_tensor_threads) * 16;

  CudaParamTable() = default;
  explicit CudaParamTable(ParamTable table) : table_(std::move(table)) {
    check_pointers();
    std::vector<CudaParamEntry> entries;
    std::vector<ParamChunk> chunks;
    entries.reserve(std::size_t(table_.count()));
    for (index_t k = 0; k < table_.count(); ++k) {
      const ParamSlot& s = table_[k];
      entries.push_back({s.value, s.grad, s.size, table_.offset(k), s.has_grad != nullptr});
      for (index_t b = 0; b < s.size; b += chunk_size) chunks.push_back({k, b});
    }
    entries_ = cu::DeviceBuffer<CudaParamEntry>(index_t(entries.size()));
    chunks_ = cu::DeviceBuffer<ParamChunk>(index_t(chunks.size()));
    if (!entries.empty())
      KILN_CUDA_CHECK(cudaMemcpy(entries_.data(), entries.data(), entries_.size_bytes(), cudaMemcpyHostToDevice));
    if (!chunks.empty())
      KILN_CUDA_CHECK(cudaMemcpy(chunks_.data(), chunks.data(), chunks_.size_bytes(), cudaMemcpyHostToDevice));
    // A pageable cudaMemcpy may return before its DMA lands, ordered only on the default stream;
    // the kernels run on the executor's stream, which may be a non-blocking one.
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    int device = 0, sms = 0;
    KILN_CUDA_CHECK(cudaGetDevice(&device));
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    max_blocks_ = index_t(std::max(sms, 1)) * 8;
  }

  const ParamTable& table() const { return table_; }
  index_t count() const { return table_.count(); }
  index_t total_size() const { return table_.total_size(); }
  index_t offset(index_t k) const { return table_.offset(k); }
  index_t chunk_count() const { return chunks_.size(); }
  const CudaParamEntry* d_entries() const { return entries_.data(); }
  const ParamChunk* d_chunks() const { return chunks_.data(); }

  // Launches op(entry, i) for every element of every parameter on exec's stream: one kernel, none
  // when the table holds no elements. Counting the launch is the caller's business.
  // requires: Op is trivially copyable with a device operator()(const CudaParamEntry&, index_t).
  template <class Op>
  void apply(CudaExecutor& exec, const Op& op) const {
    static_assert(std::is_trivially_copyable_v<Op>, "kiln: a multi-tensor op is passed to a kernel by value: "
                  "it must be trivially copyable (hold device pointers and scalars, not containers)");
    const index_t chunks = chunk_count();
    if (chunks == 0) return;
    cu::kernels::multi_tensor_apply<<<grid(), cu::kernels::multi_tensor_threads, 0, exec.stream()>>>(
        entries_.data(), chunks_.data(), chunks, chunk_size, op);
    KILN_CUDA_CHECK(cudaGetLastError());
  }

  // Blocks for a launch over the chunk list: the device's resident capacity at most.
  unsigned grid() const { return unsigned(std::min(chunk_count(), max_blocks_)); }

  // Runs fill(host) to write count() SlotSteps, copies them to the device on `stream` and runs
  // launch(d_steps), which enqueues the kernels that read them on `stream`. Nothing waits for the
  // device: the copy reads a pinned staging block (a pageable source may synchronise), and each of
  // the `staging_depth` blocks is rewritten only after the event recorded behind its kernels has
  // passed — the host waits only when it runs that many such launches ahead of the device.
  // The blocks are allocated on first use.
  template <class Fill, class Launch>
  void launch_with_slot_steps(cudaStream_t stream, Fill&& fill, Launch&& launch) const {
    if (staging_.empty())
      for (int i = 0; i < staging_depth; ++i)
        staging_.push_back({cu::PinnedBuffer<SlotStep>(count()), cu::DeviceBuffer<SlotStep>(count()), {}});
    StagingBlock& b = staging_[next_block_];
    next_block_ = (next_block_ + 1) % staging_.size();
    KILN_CUDA_CHECK(cudaEventSynchronize(b.done.get()));  // normally long passed
    fill(std::span<SlotStep>(b.host.data(), std::size_t(count())));
    if (count() > 0)
      KILN_CUDA_CHECK(cudaMemcpyAsync(b.device.data(), b.host.data(), b.device.size_bytes(), cudaMemcpyHostToDevice,
                                      stream));
    launch(static_cast<const SlotStep*>(b.device.data()));
    KILN_CUDA_CHECK(cudaEventRecord(b.done.get(), stream));
  }
  static constexpr int staging_depth = 4;

 private:
  // An event for ordering only; a fresh one counts as passed.
  class Event {
   public:
    Event() { KILN_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming)); }
    Event(Event&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}
    Event& operator=(Event&&) = delete;
    Event(const Event&) = delete;
    ~Event() {
      if (event_ != nullptr && cudaEventDestroy(event_) != cudaSuccess) (void)cudaGetLastError();
    }
    cudaEvent_t get() const noexcept { return event_; }

   private:
    cudaEvent_t event_ = nullptr;
  };
  struct StagingBlock {
    cu::PinnedBuffer<SlotStep> host;
    cu::DeviceBuffer<SlotStep> device;
    Event done;  // recorded behind the last kernels that read `device`
  };

  void check_pointers() const {
    int device = 0, pageable = 0;
    KILN_CUDA_CHECK(cudaGetDevice(&device));
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, device));
    for (index_t k = 0; k < table_.count(); ++k) {
      const ParamSlot& s = table_[k];
      if (s.size == 0) continue;
      check_pointer(s.value, k, "value", pageable != 0);
      check_pointer(s.grad, k, "grad", pageable != 0);
    }
  }
  static void check_pointer(const float* p, index_t k, const char* what, bool pageable_ok) {
    cudaPointerAttributes attr{};
    KILN_CUDA_CHECK(cudaPointerGetAttributes(&attr, p));
    KILN_CHECK(attr.type != cudaMemoryTypeUnregistered || pageable_ok, ValueError,
               "kiln::optim::CudaParamTable: parameter ", k, "'s ", what, " pointer ", static_cast<const void*>(p),
               " is pageable host memory, which this device cannot access; the CUDA optimizers take device "
               "pointers (a kiln::Tensor<float, kiln::cuda>'s data() or a kiln::cu::DeviceBuffer<float>)");
  }

  ParamTable table_;
  cu::DeviceBuffer<CudaParamEntry> entries_;
  cu::DeviceBuffer<ParamChunk> chunks_;
  index_t max_blocks_ = 1;
  mutable std::vector<StagingBlock> staging_;
  mutable std::size_t next_block_ = 0;
};

namespace detail {
// Whether every parameter that holds elements has a gradient now: the kernels then need no
// per-parameter information.
inline bool all_have_gradients(const ParamTable& table) {
  for (const ParamSlot& s : table)
    if (s.size > 0 && !s.has_gradient()) return false;
  return true;
}
}  // namespace detail

namespace detail {

// The kernels' per-element bodies: the CPU optimizers' update functions on one element. Those
// with a `slots` pointer take per-parameter information from it when it is not null (select).

// unflagged_only: zero only parameters without a has_grad flag (set_to_none clears the others).
struct ZeroGradOp {
  bool unflagged_only;
  KILN_DEVICE bool select(index_t, const CudaParamEntry& e) const { return !(unflagged_only && e.flagged); }
  KILN_DEVICE void operator()(const CudaParamEntry& e, index_t i) const { e.grad[i] = 0.0f; }
};

struct ScaleGradOp {
  float c;
  const SlotStep* slots;  // nullptr: every parameter has a gradient
  KILN_DEVICE bool select(index_t slot, const CudaParamEntry&) const { return slots == nullptr || slots[slot].active; }
  KILN_DEVICE void operator()(const CudaParamEntry& e, index_t i) const { e.grad[i] = e.grad[i] * c; }
};

template <bool Momentum>
struct SgdOp {
  SgdParams h;
  float* buf;             // the momentum buffer (Momentum only)
  const SlotStep* slots;  // nullptr: every parameter has a gradient, h.init_buffer serves all
  KILN_DEVICE bool select(index_t slot, const CudaParamEntry&) {
    if (slots == nullptr) return true;
    const SlotStep s = slots[slot];
    h.init_buffer = s.init_buffer;
    return s.active;
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
  AdamParams h;
  float* m;
  float* v;
  float* v_max;           // Amsgrad only
  const SlotStep* slots;  // nullptr: every parameter has a gradient and h's bias corrections
  KILN_DEVICE bool select(index_t slot, const CudaParamEntry&) {
    if (slots == nullptr) return true;
    const SlotStep s = slots[slot];
    h.step_size = s.step_size;
    h.bias_correction2_sqrt = s.bias_correction2_sqrt;
    return s.active;
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

// Fills a SlotStep per parameter with only `active` meaningful (grad norm and clipping).
inline void fill_active(const ParamTable& table, std::span<SlotStep> out) {
  for (index_t k = 0; k < table.count(); ++k) out[std::size_t(k)] = {0.0f, 0.0f, table[k].has_gradient(), false};
}

// Zeroes n floats on the default stream; the caller synchronises the device before any other
// stream (blocking or not) may read them.
inline void zero_device(float* d, index_t n) {
  if (n > 0) KILN_CUDA_CHECK(cudaMemset(d, 0, std::size_t(n) * sizeof(float)));
}

}  // namespace detail

// optim::zero_grad on the device: with set_to_none (the default) flagged parameters are set to
// "no gradient" on the host and the others zero-filled; without it every gradient is zero-filled
// and flagged parameters hold a gradient. The fill is one launch, counted as kind::elementwise
// "zero_grad", none when no parameter needs it.
inline void cuda_zero_grad(const CudaParamTable& table, CudaExecutor& exec, bool set_to_none = true) {
  index_t n = 0;
  bool any = false;
  for (const ParamSlot& s : table.table()) {
    const bool fill = !set_to_none || s.has_grad == nullptr;
    if (fill) n += s.size;
    any = any || fill;
  }
  if (any) {
    exec.stats().count(kind::elementwise, "zero_grad", n, std::size_t(n) * sizeof(float));
    if (n > 0) table.apply(exec, detail::ZeroGradOp{set_to_none});
  }
  for (const ParamSlot& s : table.table())
    if (s.has_grad != nullptr) *s.has_grad = !set_to_none;
}

// SGD on the device, as kiln::optim::Sgd (same options, checks and per-element math).
// The momentum buffer is allocated on the first step that uses momentum, as PyTorch's.
class CudaSgd {
 public:
  CudaSgd(ParamTable table, const SgdOptions& options)
      : opt_(checked(options)), table_(std::move(table)), slots_(table_.count()) {}

  // One update of every parameter that has a gradient, on exec's stream: one launch of
  // kind::optimizer (none when no element has a gradient; it is counted all the same).
  void step(CudaExecutor& exec) {
    const index_t n = table_.total_size();
    const bool use_buffer = opt_.momentum != 0.0;
    if (use_buffer && !has_buffer_) {
      // Zeroed on exec's stream: a parameter's part reads 0 until its first step with a gradient.
      momentum_buffer_ = cu::DeviceBuffer<float>(n);
      if (n > 0)
        KILN_CUDA_CHECK(cudaMemsetAsync(momentum_buffer_.data(), 0, momentum_buffer_.size_bytes(), exec.stream()));
      has_buffer_ = true;
    }
    SgdParams h{float(opt_.lr),           float(opt_.momentum), float(1.0 - opt_.dampening),
                float(opt_.weight_decay), opt_.nesterov,        opt_.maximize,
                false};
    const index_t work = slots_.read_flags(table_.table());
    exec.stats().count(kind::optimizer, "sgd", work, std::size_t(work) * sizeof(float) * (use_buffer ? 5 : 3));
    float* buf = use_buffer ? momentum_buffer_.data() : nullptr;
    auto launch = [&](const SlotStep* slots) {
      if (use_buffer) table_.apply(exec, detail::SgdOp<true>{h, buf, slots});
      else table_.apply(exec, detail::SgdOp<false>{h, nullptr, slots});
    };
    if (work > 0) {
      if (const std::optional<bool> init = slots_.uniform_init_buffer(table_.table(), use_buffer)) {
        h.init_buffer = *init;
        launch(nullptr);
      } else {
        table_.launch_with_slot_steps(
            exec.stream(),
            [&](std::span<SlotStep> out) {
              for (index_t k = 0; k < table_.count(); ++k)
                out[std::size_t(k)] = {0.0f, 0.0f, slots_.active(k), use_buffer && !slots_.has_buffer(k)};
            },
            launch);
      }
    }
    if (use_buffer) slots_.mark_buffers();
    ++steps_;
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
  // Number of step() calls.
  index_t steps() const { return steps_; }
  // Whether parameter k's momentum buffer has started (PyTorch's state[p]["momentum_buffer"]).
  bool has_momentum_buffer(index_t k) const { return slots_.has_buffer(k); }
  // The momentum buffer (device memory, total_size() floats laid out by table().offset(k), 0
  // where a parameter's buffer has not started); nullptr until a step has used momentum.
  float* d_momentum_buffer() { return has_buffer_ ? momentum_buffer_.data() : nullptr; }
  const float* d_momentum_buffer() const { return has_buffer_ ? momentum_buffer_.data() : nullptr; }

 private:
  // Sgd's own checks (and messages): constructing one over an empty table runs them.
  static const SgdOptions& checked(const SgdOptions& o) {
    (void)Sgd(ParamTable{}, o);
    return o;
  }

  SgdOptions opt_;
  CudaParamTable table_;
  detail::SgdSlots slots_;
  cu::DeviceBuffer<float> momentum_buffer_;
  bool has_buffer_ = false;
  index_t steps_ = 0;
};

namespace detail {

// CudaAdam (Decoupled = false) and CudaAdamW (true), as detail::AdamBase on the CPU.
// State buffers are zeroed at construction (which synchronises the device once).
template <bool Decoupled>
class CudaAdamBase {
 public:
  using Options = std::conditional_t<Decoupled, AdamWOptions, AdamOptions>;

  CudaAdamBase(ParamTable table, const Options& options)
      : opt_(checked(options)), table_(std::move(table)), slots_(table_.count()) {
    const index_t n = table_.total_size();
    exp_avg_ = cu::DeviceBuffer<float>(n);
    exp_avg_sq_ = cu::DeviceBuffer<float>(n);
    zero_device(exp_avg_.data(), n);
    zero_device(exp_avg_sq_.data(), n);
    if (opt_.amsgrad) {
      max_exp_avg_sq_ = cu::DeviceBuffer<float>(n);
      zero_device(max_exp_avg_sq_.data(), n);
    }
    if (n > 0) KILN_CUDA_CHECK(cudaDeviceSynchronize());
  }

  // One update of every parameter that has a gradient, on exec's stream: one launch of
  // kind::optimizer (none when no element has a gradient; it is counted all the same).
  void step(CudaExecutor& exec) {
    ++steps_;
    const index_t work = slots_.advance(table_.table());
    const bool ams = opt_.amsgrad;
    exec.stats().count(kind::optimizer, Decoupled ? "adamw" : "adam", work,
                       std::size_t(work) * sizeof(float) * (ams ? 9 : 7));
    if (work == 0) return;
    auto params = [&](index_t t) {
      return make_adam_params(opt_.lr, opt_.beta1, opt_.beta2, opt_.eps, opt_.weight_decay, Decoupled, opt_.maximize,
                              t);
    };
    auto launch = [&](const AdamParams& h, const SlotStep* slots) {
      if (ams)
        table_.apply(exec, AdamOp<Decoupled, true>{h, exp_avg_.data(), exp_avg_sq_.data(), max_exp_avg_sq_.data(), slots});
      else
        table_.apply(exec, AdamOp<Decoupled, false>{h, exp_avg_.data(), exp_avg_sq_.data(), nullptr, slots});
    };
    if (const index_t t = slots_.uniform_step(table_.table()); t > 0) {
      launch(params(t), nullptr);
      return;
    }
    // The parameters differ: each gets its own bias corrections (computed once per distinct t).
    table_.launch_with_slot_steps(
        exec.stream(),
        [&](std::span<SlotStep> out) {
          index_t t_prev = 0;
          AdamParams h{};
          for (index_t k = 0; k < table_.count(); ++k) {
            const index_t t = slots_.steps(k);
            if (slots_.active(k) && t != t_prev) {
              h = params(t);
              t_prev = t;
            }
            out[std::size_t(k)] = {h.step_size, h.bias_correction2_sqrt, slots_.active(k), false};
          }
        },
        [&](const SlotStep* slots) { launch(params(steps_), slots); });  // the step-free scalars
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
  // Number of step() calls.
  index_t steps() const { return steps_; }
  // Steps that updated parameter k, its own t (PyTorch's state[p]["step"]).
  index_t param_steps(index_t k) const { return slots_.steps(k); }
  // State buffers (device memory, total_size() floats laid out by table().offset(k));
  // d_max_exp_avg_sq is nullptr without amsgrad.
  const float* d_exp_avg() const { return exp_avg_.data(); }
  const float* d_exp_avg_sq() const { return exp_avg_sq_.data(); }
  const float* d_max_exp_avg_sq() const { return max_exp_avg_sq_.data(); }

 private:
  // AdamBase's own checks (and messages): constructing one over an empty table runs them.
  static const Options& checked(const Options& o) {
    (void)AdamBase<Decoupled>(ParamTable{}, o);
    return o;
  }

  Options opt_;
  CudaParamTable table_;
  AdamSlots slots_;
  cu::DeviceBuffer<float> exp_avg_, exp_avg_sq_, max_exp_avg_sq_;
  index_t steps_ = 0;
};

}  // namespace detail

// Adam on the device: AdamOptions, L2 weight decay, as kiln::optim::Adam.
class CudaAdam : public detail::CudaAdamBase<false> {
 public:
  using CudaAdamBase::CudaAdamBase;
};

// AdamW on the device: AdamWOptions, decoupled weight decay, as kiln::optim::AdamW.
class CudaAdamW : public detail::CudaAdamBase<true> {
 public:
  using CudaAdamBase::CudaAdamBase;
};

namespace detail {

template <cu::kernels::NormKind K>
void launch_grad_norm(const CudaParamTable& table, cudaStream_t stream, double p, const SlotStep* slots,
                      double* partial, double* out) {
  const index_t chunks = table.chunk_count();
  cu::kernels::grad_norm_partials<K><<<table.grid(), cu::kernels::multi_tensor_threads, 0, stream>>>(
      table.d_entries(), table.d_chunks(), chunks, CudaParamTable::chunk_size, p, slots, partial);
  cu::kernels::grad_norm_finalize<K><<<1, cu::kernels::multi_tensor_threads, 0, stream>>>(partial, chunks, out);
}

// Runs launch(slots) with slots nullptr when every parameter has a gradient, else with a device
// array of SlotSteps whose `active` says which do.
template <class Launch>
void with_active_slots(const CudaParamTable& table, cudaStream_t stream, Launch&& launch) {
  if (all_have_gradients(table.table())) launch(static_cast<const SlotStep*>(nullptr));
  else table.launch_with_slot_steps(stream, [&](std::span<SlotStep> out) { fill_active(table.table(), out); }, launch);
}

}  // namespace detail

// The norm_type-norm of all gradients in the table (of the parameters that have one, as
// grad_norm on the CPU; 0 when none has): one fused reduction over the table (a partial per
// chunk, then a one-block finalize; counted as one kind::reduce launch), deterministic run to
// run. Blocks the host until exec's stream has computed it.
// requires: norm_type > 0; std::numeric_limits<double>::infinity() gives the max-abs norm.
inline double cuda_grad_norm(const CudaParamTable& table, CudaExecutor& exec, double norm_type = 2.0) {
  detail::check_norm_type(norm_type, "cuda_grad_norm");
  const index_t work = size_with_gradient(table.table());
  exec.stats().count(kind::reduce, "grad_norm", work, std::size_t(work) * sizeof(float));
  if (work == 0) return 0.0;
  using cu::kernels::NormKind;
  const bool is_max = std::isinf(norm_type);
  auto buf = exec.temps().take(std::size_t(table.chunk_count() + 1) * sizeof(double));
  double* partial = static_cast<double*>(buf.get());
  double* d_total = partial + table.chunk_count();
  const cudaStream_t stream = exec.stream();
  detail::with_active_slots(table, stream, [&](const SlotStep* slots) {
    if (is_max) detail::launch_grad_norm<NormKind::linf>(table, stream, norm_type, slots, partial, d_total);
    else if (norm_type == 2.0) detail::launch_grad_norm<NormKind::l2>(table, stream, norm_type, slots, partial, d_total);
    else if (norm_type == 1.0) detail::launch_grad_norm<NormKind::l1>(table, stream, norm_type, slots, partial, d_total);
    else detail::launch_grad_norm<NormKind::lp>(table, stream, norm_type, slots, partial, d_total);
    KILN_CUDA_CHECK(cudaGetLastError());
  });
  double total = 0.0;
  KILN_CUDA_CHECK(cudaMemcpyAsync(&total, d_total, sizeof(double), cudaMemcpyDeviceToHost, stream));
  // Before `buf` goes back to the pool: its next user may run on another stream.
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (is_max) return total;
  if (norm_type == 2.0) return std::sqrt(total);
  if (norm_type == 1.0) return total;
  return std::pow(total, 1.0 / norm_type);
}

// Scales all gradients so their norm is at most max_norm, as clip_grad_norm on the CPU (and
// torch.nn.utils.clip_grad_norm_): coef = max_norm / (norm + 1e-6); grads *= coef when coef < 1,
// parameters without a gradient left out of both. Returns the norm before clipping. Launches:
// one reduction, plus one elementwise pass when it clips. Blocks the host until the norm is known
// (the decision to clip is made on the host).
// requires: max_norm >= 0 (infinity never clips); norm_type > 0 or infinity.
// error_if_nonfinite: throw NumericError when the norm is NaN or infinite (the grads untouched).
inline double cuda_clip_grad_norm(const CudaParamTable& table, double max_norm, CudaExecutor& exec,
                                  double norm_type = 2.0, bool error_if_nonfinite = false) {
  KILN_CHECK(max_norm >= 0.0, ValueError, "cuda_clip_grad_norm: max_norm must be >= 0, got ", max_norm);
  detail::check_norm_type(norm_type, "cuda_clip_grad_norm");
  const double norm = cuda_grad_norm(table, exec, norm_type);
  KILN_CHECK(!error_if_nonfinite || std::isfinite(norm), NumericError, "cuda_clip_grad_norm: the total ", norm_type,
             "-norm of the gradients is ", norm, "; they hold NaN or infinity");
  const double coef = max_norm / (norm + 1e-6);
  if (!(coef < 1.0) && !std::isnan(coef)) return norm;
  const index_t work = size_with_gradient(table.table());
  exec.stats().count(kind::elementwise, "clip_grad_norm", work, std::size_t(work) * sizeof(float) * 2);
  detail::with_active_slots(table, exec.stream(),
                            [&](const SlotStep* slots) { table.apply(exec, detail::ScaleGradOp{float(coef), slots}); });
  return norm;
}

}  // namespace kiln::optim
