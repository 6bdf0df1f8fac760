// kiln/optim/cuda_clip.cuh — gradient norm and clipping over a CudaParamTable, as
// kiln/optim/clip.hpp on the CPU (torch.nn.utils.clip_grad_norm_): one fused, deterministic
// reduction over every parameter that has a gradient, then one scaling pass when it clips.
//
//   const double norm = kiln::optim::cuda_clip_grad_norm(opt.device_table(), 1.0, exec);
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cub/block/block_reduce.cuh>

#include "kiln/backend/cuda/check.cuh"
#include "kiln/backend/cuda/executor.cuh"
#include "kiln/config.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/stats.hpp"
#include "kiln/optim/clip.hpp"
#include "kiln/optim/multi_tensor.cuh"
#include "kiln/optim/param.hpp"

namespace kiln::cu::kernels {

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

namespace detail {

struct ScaleGradOp {
  float c;
  const SlotStep* slots;  // nullptr: every parameter has a gradient
  KILN_DEVICE bool select(index_t slot, const CudaParamEntry&) const { return slots == nullptr || slots[slot].active; }
  KILN_DEVICE void operator()(const CudaParamEntry& e, index_t i) const { e.grad[i] = e.grad[i] * c; }
};

// Scales every gradient by min(1, max_norm / (sqrt(*total) + 1e-6)), read on the device (NaN
// stays NaN, as the host's clip scales by it).
struct ScaleGradByNormOp {
  const double* total;  // the sum of squares
  double max_norm;
  const SlotStep* slots;
  float c = 1.0f;
  KILN_DEVICE bool select(index_t slot, const CudaParamEntry&) {
    if (slots != nullptr && !slots[slot].active) return false;
    const double coef = max_norm / (::sqrt(*total) + 1e-6);
    c = coef < 1.0 || coef != coef ? float(coef) : 1.0f;
    return true;
  }
  KILN_DEVICE void operator()(const CudaParamEntry& e, index_t i) const { e.grad[i] = e.grad[i] * c; }
};

template <cu::kernels::NormKind K>
void launch_grad_norm(const CudaParamTable& table, cudaStream_t stream, double p, const SlotStep* slots,
                      double* partial, double* out) {
  const index_t chunks = table.chunk_count();
  cu::kernels::grad_norm_partials<K><<<table.grid(), cu::kernels::multi_tensor_threads, 0, stream>>>(
      table.d_entries(), table.d_chunks(), chunks, CudaParamTable::chunk_size, p, slots, partial);
  cu::kernels::grad_norm_finalize<K><<<1, cu::kernels::multi_tensor_threads, 0, stream>>>(partial, chunks, out);
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

// cuda_clip_grad_norm (2-norm) without a host wait, so a captured step can hold it (mode
// reduce_overhead's CUDA graph; torch's foreach clip_grad_norm_ works the same way): the norm stays
// in device memory and the scaling pass always runs, with a factor of 1 when the norm is within
// max_norm. The same gradients as cuda_clip_grad_norm. Launches: one reduction, one elementwise
// pass (two, always).
inline void cuda_clip_grad_norm_on_device(const CudaParamTable& table, double max_norm, CudaExecutor& exec) {
  KILN_CHECK(max_norm >= 0.0, ValueError, "cuda_clip_grad_norm_on_device: max_norm must be >= 0, got ", max_norm);
  const index_t work = size_with_gradient(table.table());
  exec.stats().count(kind::reduce, "grad_norm", work, std::size_t(work) * sizeof(float));
  exec.stats().count(kind::elementwise, "clip_grad_norm", work, std::size_t(work) * sizeof(float) * 2);
  if (work == 0) return;
  auto buf = exec.temps().take(std::size_t(table.chunk_count() + 1) * sizeof(double));
  double* partial = static_cast<double*>(buf.get());
  double* d_total = partial + table.chunk_count();
  const cudaStream_t stream = exec.stream();
  detail::with_active_slots(table, stream, [&](const SlotStep* slots) {
    detail::launch_grad_norm<cu::kernels::NormKind::l2>(table, stream, 2.0, slots, partial, d_total);
    KILN_CUDA_CHECK(cudaGetLastError());
    table.apply(exec, detail::ScaleGradByNormOp{d_total, max_norm, slots});
  });
  // `buf` goes back to the pool still queued on this stream: its next user is on the same stream
  // (the executor's temporaries), which orders it after these two kernels.
}

}  // namespace kiln::optim
