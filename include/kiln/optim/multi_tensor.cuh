// kiln/optim/multi_tensor.cuh — one kernel over every parameter of a table (a "multi-tensor
// apply"), the machinery under the CUDA optimizers, gradient zeroing and clipping.
//
// A CudaParamTable uploads a ParamTable (whose pointers are device memory) once: a device-side
// table of (value, grad, size, flat offset) per parameter, and a list of chunks — pieces of at
// most chunk_size elements that never straddle two parameters — mapping each chunk to
// (parameter, first element). Blocks walk the chunk list, so a model of any number of tensors,
// empty ones included, costs one launch. Optimizer state is one contiguous device buffer per
// kind laid out by flat offset, as on the CPU, so parameter k's state starts at offset(k).
//
// Which parameters have a gradient is read on the host at each call (ParamSlot::has_grad). When
// every one has, the kernels need no per-parameter information; otherwise the flags travel as a
// kernel argument (a bit set, by value) to a one-block kernel that writes them into the table's
// device array of SlotSteps ahead of the launch (launch_with_slot_steps): the host never waits,
// and a CUDA graph that captures the step holds the flags of the moment it was captured. (A
// pinned staging block copied with cudaMemcpyAsync, as before, baked the block's address into a
// captured graph, whose replays then read whatever later eager steps had written there, and its
// reuse waited on events — cudaEventSynchronize is not allowed inside a capture.)
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/backend/cuda/allocator.cuh"
#include "kiln/backend/cuda/check.cuh"
#include "kiln/backend/cuda/executor.cuh"
#include "kiln/config.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/stats.hpp"
#include "kiln/optim/param.hpp"

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
  bool decays;  // in the group with weight decay (ParamSlot::decays)
};

// What a kernel needs per parameter when the parameters differ: whether it has a gradient now.
struct SlotStep {
  bool active;  // false: no gradient this step, the kernel leaves the parameter alone
};

// A piece of parameter `slot`: elements [begin, min(begin + chunk_size, size)).
struct ParamChunk {
  index_t slot;
  index_t begin;
};

// Up to `capacity` SlotSteps' `active` flags as bits, passed by value to write_slot_steps (256
// bytes of kernel arguments: far inside the 4 KiB limit); more slots take more launches.
struct SlotStepBits {
  static constexpr index_t capacity = 2048;
  index_t first = 0, count = 0;  // slots [first, first + count)
  std::uint32_t words[capacity / 32] = {};
};

}  // namespace kiln::optim

namespace kiln::cu::kernels {

inline constexpr int multi_tensor_threads = 256;

// out[first + i].active = bit i of the argument, for i < count. (A template, as every kernel of
// a header: one definition whichever files include it.)
template <int = 0>
KILN_GLOBAL void write_slot_steps(optim::SlotStepBits bits, optim::SlotStep* out) {
  for (index_t i = threadIdx.x; i < bits.count; i += blockDim.x)
    out[bits.first + i].active = ((bits.words[i >> 5] >> (i & 31)) & 1u) != 0;
}

// Whether an op keeps per-parameter state that advances once per launch (see below).
template <class Op>
inline constexpr bool per_param_state_v = requires { requires Op::per_param_state; };

// Applies op(entry, i) to every element i of every parameter. Block b takes chunks b,
// b + gridDim.x, ...; the chunk's parameter and start are uniform over the block, so their loads
// are broadcasts. Each block works on its own copy of op. Optional hooks, each uniform over a block:
//   bool skipped()            read once per block before any chunk; true: no chunk runs (a step
//                             guard's flag in device memory, decided here, not on the host)
//   bool select(slot, entry)  once per chunk, before its elements: may specialise the block's
//                             copy to the parameter (its step count, its buffer start) and may
//                             cache across chunks; false skips the chunk
//   per_param_state (static constexpr bool), finish(k) and `unsigned* done`: once every block has
//                             run its chunks, the last block to finish (counted on *done, a zeroed
//                             device counter it resets for the next launch) calls finish(k) for
//                             every parameter k — empty ones included — unless skipped(). Every
//                             other block read the state it needed before counting itself done,
//                             so finish may advance it without a race (threadFenceReduction's
//                             pattern); no grid-wide synchronisation, nothing for the host to do.
template <class Op>
KILN_GLOBAL void multi_tensor_apply(const optim::CudaParamEntry* entries, const optim::ParamChunk* chunks,
                                    index_t chunk_count, index_t chunk_size, index_t param_count, Op op) {
  Op local = op;
  bool skip = false;
  if constexpr (requires { local.skipped(); }) skip = local.skipped();
  if (!skip) {
    for (index_t c = blockIdx.x; c < chunk_count; c += gridDim.x) {
      const optim::ParamChunk ch = chunks[c];
      const optim::CudaParamEntry e = entries[ch.slot];
      if constexpr (requires { local.select(ch.slot, e); }) {
        if (!local.select(ch.slot, e)) continue;
      }
      const index_t end = ch.begin + chunk_size < e.size ? ch.begin + chunk_size : e.size;
      for (index_t i = ch.begin + threadIdx.x; i < end; i += multi_tensor_threads) local(e, i);
    }
  }
  if constexpr (per_param_state_v<Op>) {
    __shared__ bool last;
    __threadfence();  // this block's reads and writes come before its count
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(local.done, 1u) == gridDim.x - 1;
    __syncthreads();
    if (last) {
      __threadfence();
      if (!skip)
        for (index_t k = threadIdx.x; k < param_count; k += multi_tensor_threads) local.finish(k);
      if (threadIdx.x == 0) atomicExch(local.done, 0u);
    }
  }
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
      entries.push_back({s.value, s.grad, s.size, table_.offset(k), s.has_grad != nullptr, s.decays});
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

  // Launches op(entry, i) for every element of every parameter on exec's stream: one kernel (see
  // kernels::multi_tensor_apply for the hooks an op may have). None when the table holds no
  // elements, unless the op keeps per-parameter state and the table has parameters (their state
  // advances even when they are empty). Counting the launch is the caller's business.
  // requires: Op is trivially copyable with a device operator()(const CudaParamEntry&, index_t).
  template <class Op>
  void apply(CudaExecutor& exec, const Op& op) const {
    static_assert(std::is_trivially_copyable_v<Op>, "kiln: a multi-tensor op is passed to a kernel by value: "
                  "it must be trivially copyable (hold device pointers and scalars, not containers)");
    const index_t chunks = chunk_count();
    if (chunks == 0 && !(cu::kernels::per_param_state_v<Op> && count() > 0)) return;
    cu::kernels::multi_tensor_apply<<<std::max(grid(), 1u), cu::kernels::multi_tensor_threads, 0, exec.stream()>>>(
        entries_.data(), chunks_.data(), chunks, chunk_size, count(), op);
    KILN_CUDA_CHECK(cudaGetLastError());
  }

  // Blocks for a launch over the chunk list: the device's resident capacity at most.
  unsigned grid() const { return unsigned(std::min(chunk_count(), max_blocks_)); }

  // Runs fill(host) to write count() SlotSteps on the host, writes them into the table's device
  // array on `stream` (write_slot_steps, the flags as its argument) and runs launch(d_steps),
  // which enqueues the kernels that read them on `stream`. Nothing waits for the device, nothing
  // is staged in host memory, and all of it can be captured. The device array is reused by the
  // next call: callers run on one stream (the executor's), which orders each call's kernels
  // after the previous call's readers.
  template <class Fill, class Launch>
  void launch_with_slot_steps(cudaStream_t stream, Fill&& fill, Launch&& launch) const {
    if (slot_steps_.size() < count()) slot_steps_ = cu::DeviceBuffer<SlotStep>(count());
    host_steps_.resize(std::size_t(count()));
    fill(std::span<SlotStep>(host_steps_.data(), host_steps_.size()));
    for (index_t first = 0; first < count(); first += SlotStepBits::capacity) {
      SlotStepBits bits;
      bits.first = first;
      bits.count = std::min(SlotStepBits::capacity, count() - first);
      for (index_t i = 0; i < bits.count; ++i)
        if (host_steps_[std::size_t(first + i)].active) bits.words[i >> 5] |= 1u << (i & 31);
      cu::kernels::write_slot_steps<><<<1, cu::kernels::multi_tensor_threads, 0, stream>>>(bits, slot_steps_.data());
      KILN_CUDA_CHECK(cudaGetLastError());
    }
    launch(static_cast<const SlotStep*>(slot_steps_.data()));
  }

 private:
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
  mutable cu::DeviceBuffer<SlotStep> slot_steps_;  // launch_with_slot_steps' device array
  mutable std::vector<SlotStep> host_steps_;        // and its host side, filled per call
};

namespace detail {

// Whether every parameter holds a gradient now, empty ones included: the kernels then need no
// per-parameter information (an empty parameter's step count still advances).
inline bool all_have_gradients(const ParamTable& table) {
  for (const ParamSlot& s : table)
    if (!s.has_gradient()) return false;
  return true;
}

// Fills a SlotStep per parameter from the has_grad flags.
inline void fill_active(const ParamTable& table, std::span<SlotStep> out) {
  for (index_t k = 0; k < table.count(); ++k) out[std::size_t(k)] = {table[k].has_gradient()};
}

// Runs launch(slots) with slots nullptr when every parameter has a gradient, else with a device
// array of SlotSteps whose `active` says which do.
template <class Launch>
void with_active_slots(const CudaParamTable& table, cudaStream_t stream, Launch&& launch) {
  if (all_have_gradients(table.table())) launch(static_cast<const SlotStep*>(nullptr));
  else table.launch_with_slot_steps(stream, [&](std::span<SlotStep> out) { fill_active(table.table(), out); }, launch);
}

// Zeroes n elements on the default stream; the caller synchronises the device before any other
// stream (blocking or not) may read them.
template <class T>
void zero_device(T* d, index_t n) {
  if (n > 0) KILN_CUDA_CHECK(cudaMemset(d, 0, std::size_t(n) * sizeof(T)));
}

// unflagged_only: zero only parameters without a has_grad flag (set_to_none clears the others).
struct ZeroGradOp {
  bool unflagged_only;
  KILN_DEVICE bool select(index_t, const CudaParamEntry& e) const { return !(unflagged_only && e.flagged); }
  KILN_DEVICE void operator()(const CudaParamEntry& e, index_t i) const { e.grad[i] = 0.0f; }
};

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

}  // namespace kiln::optim
