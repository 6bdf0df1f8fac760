// kiln/backend/cuda/executor.cuh — the CUDA executor: every elementwise assignment is ONE
// grid-stride kernel templated on its evaluator; GEMMs go to cuBLASLt; reductions are block
// reductions (CUB's BlockReduce) inside our own kernels, deterministic run to run; row-wise ops
// and column sums take a warp or block per row and tiled column sums (rowwise.cuh).
//
// Index arithmetic: a flat index's division by the row length is 32-bit when the range has fewer
// than 2^31 elements (the grid-stride loop's unsigned index then cannot pass 2^32) and 64-bit
// otherwise — the GPU has no 64-bit divider, and the emulated division costs more than the rest
// of a typical elementwise kernel.
//
// Elementwise kernels, by what the operands allow:
//   packet — flat, every leaf and the destination 16-byte aligned, 2- or 4-byte elements: each
//            thread loads and stores 16 bytes at a time (flat_packet), the last n % V elements
//            one by one in the same launch;
//   flat   — flat but misaligned (a view at an odd offset) or other element sizes;
//   2-D    — strided or broadcast leaves, strided destinations.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cub/block/block_reduce.cuh>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kiln/backend/cuda/check.cuh"
#include "kiln/backend/cuda/cublaslt.cuh"
#include "kiln/backend/cuda/epilogue.cuh"
#include "kiln/backend/cuda/lt_tuner.cuh"
#include "kiln/backend/cuda/memory.cuh"
#include "kiln/backend/cuda/rowwise.cuh"
#include "kiln/backend/cuda/step_graph.cuh"
#include "kiln/core/dtype.hpp"
#include "kiln/core/epilogue.hpp"
#include "kiln/core/stats.hpp"
#include "kiln/core/temp_pool.hpp"
#include "kiln/core/view.hpp"
#include "kiln/expr/evaluator.hpp"
#include "kiln/expr/reduce_ops.hpp"

namespace kiln::cu::kernels {

// I, the flat index type: std::uint32_t or index_t (file comment).
template <class I, class T, class Ev>
KILN_GLOBAL void elementwise_flat(T* out, Ev ev, I n) {
  for (I i = I(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += I(gridDim.x) * blockDim.x)
    out[i] = convert<T>(ev.flat(index_t(i)));
}

// Packets p = first, first + stride, ... cover [0, n - n % V); the tail [n - n % V, n) goes
// element by element. Requires out and every leaf aligned to alignof(Packet<., V>) (16 bytes).
template <int V, class I, class T, class Ev>
KILN_GLOBAL void elementwise_packet(T* out, Ev ev, I n) {
  const I first = I(blockIdx.x) * blockDim.x + threadIdx.x;
  const I stride = I(gridDim.x) * blockDim.x;
  const I packets = n / V;
  for (I p = first; p < packets; p += stride) {
    const auto in = ev.template flat_packet<V>(index_t(p) * V);
    Packet<T, V> o;
    for (int k = 0; k < V; ++k) o.v[k] = convert<T>(in.v[k]);
    kiln::detail::store_packet(out + index_t(p) * V, o);
  }
  for (I i = packets * V + first; i < n; i += stride) out[i] = convert<T>(ev.flat(index_t(i)));
}

template <class I, class T, class Ev>
KILN_GLOBAL void elementwise_2d(T* out, index_t drs, index_t dcs, Ev ev, I rows, I cols) {
  const I n = rows * cols;
  for (I i = I(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += I(gridDim.x) * blockDim.x) {
    const I r = i / cols, c = i - r * cols;
    out[index_t(r) * drs + index_t(c) * dcs] = convert<T>(ev.at(index_t(r), index_t(c)));
  }
}

template <class I, class K>
KILN_GLOBAL void for_each_element(K k, I rows, I cols) {
  const I n = rows * cols;
  for (I i = I(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += I(gridDim.x) * blockDim.x) {
    const I r = i / cols;
    k(index_t(r), index_t(i - r * cols));
  }
}

// C = beta * C over an [m, n] matrix with row stride ldc (a GEMM with k == 0); beta == 0
// writes zeros without reading C, as BLAS does.
template <class C>
struct ScaleRows {
  C* c;
  index_t ldc;
  float beta;
  KILN_HOST_DEVICE void operator()(index_t r, index_t j) const {
    C& x = c[r * ldc + j];
    x = beta == 0.f ? convert<C>(0.f) : convert<C>(convert<float>(x) * beta);
  }
};

template <class Op, class T>
struct Merge {
  template <class A>
  KILN_HOST_DEVICE A operator()(const A& a, const A& b) const {
    return Op::merge(a, b);
  }
};

inline constexpr int reduce_threads = 256;

// One block per row (per_row) or per slice of the flat range; writes finished results
// (per_row) or partial accumulators. I: the flat index type (file comment).
template <class Op, class I, class R, class Acc, class Ev>
KILN_GLOBAL void reduce_rows(R* out, Acc* partial, Ev ev, I rows, I cols, bool per_row, I slice, bool accumulate) {
  using T = typename Ev::value_type;
  using BlockReduce = cub::BlockReduce<Acc, reduce_threads>;
  __shared__ typename BlockReduce::TempStorage storage;
  Acc acc = Op::template init<T>();
  if (per_row) {
    const index_t r = blockIdx.x;
    for (I c = threadIdx.x; c < cols; c += reduce_threads) acc = Op::combine(acc, T(ev.at(r, index_t(c))), index_t(c));
  } else {
    const I n = rows * cols, b = I(blockIdx.x) * slice, e = b + slice < n ? b + slice : n;
    for (I i = b + threadIdx.x; i < e; i += reduce_threads) {
      const I r = i / cols;
      acc = Op::combine(acc, T(ev.at(index_t(r), index_t(i - r * cols))), index_t(i));
    }
  }
  const Acc total = BlockReduce(storage).Reduce(acc, Merge<Op, T>{});
  if (threadIdx.x == 0) {
    if (per_row) {
      const auto v = Op::finish(total, cols);
      red::store(out[blockIdx.x], v, accumulate);
    } else {
      partial[blockIdx.x] = total;
    }
  }
}

template <class Op, class R, class Acc>
KILN_GLOBAL void reduce_partials(R* out, const Acc* partial, index_t count, index_t n, bool accumulate) {
  using BlockReduce = cub::BlockReduce<Acc, reduce_threads>;
  __shared__ typename BlockReduce::TempStorage storage;
  using T = decltype(Op::finish(partial[0], n));
  // Thread t merges partials t, t + 256, ... in order; only threads that hold one take part.
  Acc acc = partial[threadIdx.x < count ? threadIdx.x : 0];
  for (index_t i = threadIdx.x + reduce_threads; i < count; i += reduce_threads) acc = Op::merge(acc, partial[i]);
  const Acc total = BlockReduce(storage).Reduce(acc, Merge<Op, T>{}, int(count < reduce_threads ? count : reduce_threads));
  if (threadIdx.x == 0) {
    const auto v = Op::finish(total, n);
    red::store(out[0], v, accumulate);
  }
}

}  // namespace kiln::cu::kernels

namespace kiln::cu::detail {
// Evaluators that can run the packet kernel with V lanes (all of kiln's do).
template <class Ev, int V>
concept packet_evaluator = requires(const Ev& ev, index_t i, std::size_t bytes) {
  ev.template flat_packet<V>(i);
  { ev.aligned(bytes) } -> std::convertible_to<bool>;
};

// Lanes of the packet kernel for destination elements T: 16 bytes of them, or 0 (no packet
// kernel) for 1- and 8-byte elements, which keep the scalar kernels.
template <class T>
inline constexpr int packet_lanes_for = sizeof(T) == 4 ? 4 : (sizeof(T) == 2 ? 8 : 0);
}  // namespace kiln::cu::detail

namespace kiln::dist {
class DeviceGradientReducer;  // kiln/dist/device_reducer.cuh (kiln/cuda.cuh includes it)
}  // namespace kiln::dist

namespace kiln {

class CudaExecutor {
 public:
  using space = cuda;
  static constexpr const char* name = "cuda";

  explicit CudaExecutor(cudaStream_t stream = nullptr) : stream_(stream) {}
  // Waits for the work this executor queued before its temporaries and its cuBLASLt workspace go
  // back to the process-wide caching allocator: the allocator does not track streams, so a block
  // returned while a GEMM still uses it could be handed to work on another stream (issue 8's
  // choice: synchronise here, as a stream-aware allocator would cost an event per free).
  ~CudaExecutor() {
    (void)cudaStreamSynchronize(stream_);
    if (capture_event_) (void)cudaEventDestroy(capture_event_);
    if (capture_stream_) (void)cudaStreamDestroy(capture_stream_);
  }
  CudaExecutor(const CudaExecutor&) = delete;
  CudaExecutor& operator=(const CudaExecutor&) = delete;

  cudaStream_t stream() const { return stream_; }
  LaunchStats& stats() { return stats_; }
  const LaunchStats& stats() const { return stats_; }
  TempPool<cuda>& temps() { return temps_; }
  cu::Lt& lt() { return lt_; }
  void synchronize() { KILN_CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  // precision::tf32: float GEMMs multiply in TF32 on the tensor cores (cuBLASLt's
  // 32F_FAST_TF32 compute type), accumulating in float.
  void allow_tf32(bool on) { allow_tf32_ = on; }
  bool tf32() const { return allow_tf32_; }
  // Whether the current device computes in bfloat16 (compute capability 8.0 or newer), and its name.
  static bool supports_bf16() {
    int device = 0, major = 0;
    KILN_CUDA_CHECK(cudaGetDevice(&device));
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    return major >= 8;
  }
  // Whether the current device has TF32 tensor cores (compute capability 8.0 or newer).
  static bool tf32_units() { return supports_bf16(); }
  static std::string device_name() {
    int device = 0;
    KILN_CUDA_CHECK(cudaGetDevice(&device));
    cudaDeviceProp prop{};
    KILN_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    return std::string("device ") + std::to_string(device) + " (" + prop.name + ", compute capability " +
           std::to_string(prop.major) + "." + std::to_string(prop.minor) + ")";
  }
  // ---- mode::max_autotune (kiln/backend/cuda/lt_tuner.cuh) ----------------------------------
  // train::Step installs an LtTuner: each new cuBLASLt plan times the heuristic's top algorithms.
  using gemm_tuner = cu::LtTuner;
  void set_gemm_chooser(cu::LtAlgoChooser* chooser) { lt_.set_algo_chooser(chooser); }
  cu::LtAlgoChooser* gemm_chooser() const { return lt_.algo_chooser(); }

  // ---- data-parallel training: train::Step averages gradients over the ranks on NCCL ------------
  using gradient_reducer = dist::DeviceGradientReducer;

  // ---- CUDA-graph capture (mode::reduce_overhead, kiln/backend/cuda/step_graph.cuh) ----------
  using step_graph = cu::StepGraph;
  // Captured work does not run until the graph is launched: train::Step replays it once right
  // after the capture.
  static constexpr bool capture_runs_work = false;
  // From here until end_capture(), the executor's work goes into `graph`: on the executor's own
  // capture stream (it starts after what the executor's stream has queued), allocations on this
  // thread from the graph's private pool.
  // throws: ValueError when a capture is under way; CudaError when the stream cannot be captured.
  void begin_capture(cu::StepGraph& graph) {
    KILN_CHECK(capture_ == nullptr, ValueError, "CudaExecutor::begin_capture: a capture is already under way");
    if (!capture_stream_) KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&capture_stream_, cudaStreamNonBlocking));
    if (!capture_event_) KILN_CUDA_CHECK(cudaEventCreateWithFlags(&capture_event_, cudaEventDisableTiming));
    KILN_CUDA_CHECK(cudaEventRecord(capture_event_, stream_));
    KILN_CUDA_CHECK(cudaStreamWaitEvent(capture_stream_, capture_event_, 0));
    KILN_CUDA_CHECK(cudaStreamBeginCapture(capture_stream_, cudaStreamCaptureModeRelaxed));
    outer_stream_ = std::exchange(stream_, capture_stream_);
    capture_ = &graph;
    records_before_ = stats_.records().size();
    was_recording_ = stats_.recording();
    stats_.set_recording(true);
    stats_.watch_capture(true, /*launches_must_be_inside=*/false);
    cu::default_allocator().begin_private(graph.pool());
    temps_.set_direct(true);
  }
  // Ends the capture and instantiates the graph; a capture CUDA invalidated (a synchronisation
  // or an uncapturable call inside it), or one that met host-side state or an opaque function,
  // leaves the graph not replayable, saying why.
  void end_capture() {
    if (!capture_) return;
    cu::StepGraph& graph = *std::exchange(capture_, nullptr);
    cu::default_allocator().end_private();
    temps_.set_direct(false);
    cudaGraph_t g = nullptr;
    const cudaError_t status = cudaStreamEndCapture(stream_, &g);
    stream_ = outer_stream_;
    std::string why = stats_.uncaptured();
    stats_.watch_capture(false);
    std::vector<LaunchRecord> launches(stats_.records().begin() + std::ptrdiff_t(records_before_),
                                       stats_.records().end());
    if (!was_recording_) {
      stats_.drop_records_from(records_before_);
      stats_.set_recording(false);
    }
    if (status != cudaSuccess || g == nullptr) {
      (void)cudaGetLastError();
      if (why.empty()) why = std::string("CUDA could not capture the step: ") + cudaGetErrorString(status);
    }
    cudaGraphExec_t e = nullptr;
    if (why.empty()) {
      const cudaError_t made = cudaGraphInstantiate(&e, g, 0);
      if (made != cudaSuccess) {
        (void)cudaGetLastError();
        why = std::string("instantiating the step's graph failed: ") + cudaGetErrorString(made);
      }
    }
    if (!why.empty()) {
      if (g) (void)cudaGraphDestroy(g);
      graph.set_not_replayable(why);
      return;
    }
    graph.set_graph(g, e, std::move(launches));
  }
  bool capturing() const { return capture_ != nullptr; }
  // Queues a captured step on the executor's stream (count: add its launches to stats()).
  void replay(const cu::StepGraph& graph, bool count = true) { graph.replay(stream_, stats_, count); }

  // Copies `bytes` within device memory, ordered on the stream (no kernel is counted).
  void copy(void* dst, const void* src, std::size_t bytes) {
    if (bytes) KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  }

  // An expression with an erased form (kiln/expr/evaluator.hpp, detail::erased_evaluator_t: its
  // static sizes dropped) runs as that form: its six kernels (packet, flat, 2-D, each with 32- and
  // 64-bit indices) are compiled once for every size the model's layers have.
  template <class T, class Ext, class Ev>
  void elementwise(const View<T, cuda, Ext>& dst, const Ev& ev, const std::string& name) {
    if constexpr (kiln::detail::runs_erased_v<Ev, Ext>)
      elementwise(View<T, cuda, kiln::detail::dyn_extents_t<Ext>>(dst.data(), dst.shape(), dst.strides()),
                  kiln::detail::erased_evaluator_t<Ev>(ev), name);
    else
      elementwise_now(dst, ev, name);
  }

 private:
  template <class T, class Ext, class Ev>
  void elementwise_now(const View<T, cuda, Ext>& dst, const Ev& ev, const std::string& name) {
    const Shape& s = dst.shape();
    const index_t n = s.size();
    stats_.count(kind::elementwise, name, n, std::size_t(n) * sizeof(T));
    if (n == 0) return;
    constexpr int V = cu::detail::packet_lanes_for<T>;
    if (packet_lanes(dst, ev) != 0) {
      if constexpr (V != 0)  // packet_lanes is 0 when V is; this keeps Packet<T, 0> unnamed
        with_index(n, [&](auto i) {
          using I = decltype(i);
          cu::kernels::elementwise_packet<V><<<blocks((n + V - 1) / V), threads, 0, stream_>>>(dst.data(), ev, I(n));
        });
    } else if (ev.flat_ok() && dst.is_contiguous()) {
      with_index(n, [&](auto i) {
        using I = decltype(i);
        cu::kernels::elementwise_flat<<<blocks(n), threads, 0, stream_>>>(dst.data(), ev, I(n));
      });
    } else {
      const LeafStrides d = fold_strides(s, dst.strides(), false, s);
      KILN_CHECK(d.nlead == 0, ShapeError, "the CUDA executor writes destinations whose leading dimensions one "
                 "stride walks; the view of shape ", s.str(), " is not such a view (copy through a contiguous tensor)");
      const index_t drs = d.rs, dcs = d.cs;
      with_index(n, [&](auto i) {
        using I = decltype(i);
        cu::kernels::elementwise_2d<<<blocks(n), threads, 0, stream_>>>(dst.data(), drs, dcs, ev, I(s.rows()),
                                                                       I(s.cols()));
      });
    }
    KILN_CUDA_CHECK(cudaGetLastError());
  }

 public:
  // The lanes per packet elementwise(dst, ev) runs with, or 0 when it runs a scalar kernel
  // (strided or broadcast operands, a misaligned leaf or destination, 1- or 8-byte elements).
  template <class T, class Ext, class Ev>
  static int packet_lanes(const View<T, cuda, Ext>& dst, const Ev& ev) {
    constexpr int V = cu::detail::packet_lanes_for<T>;
    if constexpr (V == 0) {
      return 0;
    } else if constexpr (!cu::detail::packet_evaluator<Ev, V>) {
      return 0;
    } else {
      // 16 bytes for every leaf: a leaf of other-sized elements loads V of them from an offset
      // that is a multiple of V elements, so its packets are aligned to their own size too.
      const bool ok = ev.flat_ok() && dst.is_contiguous() && kiln::detail::is_aligned(dst.data(), 16) &&
                      ev.aligned(16);
      return ok ? V : 0;
    }
  }

  template <class Kernel>
  void for_each_element(index_t rows, index_t cols, const Kernel& kernel, const char* k, const std::string& name,
                        std::size_t bytes) {
    stats_.count(k, name, rows * cols, bytes);
    launch_elements(rows, cols, kernel);
  }

  // f.row(team, r) for every row r < rows of `len` elements, with a warp or a block of threads per
  // row (cu::WarpTeam / cu::BlockTeam, rowwise.cuh): ONE launch. Runs for rows > 0 even when
  // len == 0 (a row may still write a result, as a loss's sum over no rows does).
  template <class F>
  void for_each_row(index_t rows, index_t len, const F& f, const char* k, const std::string& name, std::size_t bytes) {
    stats_.count(k, name, rows * len, bytes);
    launch_rows(rows, len, f);
  }

  // f.row's result for every row, the long rows split over several blocks (kiln/core/row_parts.hpp,
  // rowwise.cuh): f.part per part, then f.finish per row over its partials in part order. Counted
  // as ONE launch, as column_sums is; rows that fit one part take launch_rows (f.row) alone.
  template <class F>
  void for_each_row_in_parts(index_t rows, index_t len, const F& f, const char* k, const std::string& name,
                             std::size_t bytes) {
    stats_.count(k, name, rows * len, bytes);
    launch_row_parts(rows, len, f);
  }

  // Column sums of f's terms over an [rows, cols] range, handed to f.finish per column
  // (rowwise.cuh): tiled and deterministic. Counted as ONE launch, as reduce() is: a second
  // kernel adds the tiles' sums when the rows span more than one tile.
  template <class F>
  void column_sums(index_t rows, index_t cols, const F& f, const char* k, const std::string& name, std::size_t bytes) {
    stats_.count(k, name, rows * cols, bytes);
    launch_column_sums(rows, cols, f);
  }

  // accumulate adds each result to what out holds instead of overwriting it (same launches).
  template <class Op, class R, class Ev>
  void reduce(R* out, const Ev& ev, index_t rows, index_t cols, bool per_row, bool accumulate = false) {
    using T = typename Ev::value_type;
    using Acc = typename Op::template acc_t<T>;
    const index_t n = rows * cols;
    stats_.count(kind::reduce, Op::name, n, std::size_t(n) * sizeof(T));
    if (per_row) {
      if (rows == 0) return;
      with_index(n, [&](auto i) {
        using I = decltype(i);
        cu::kernels::reduce_rows<Op, I, R, Acc><<<unsigned(rows), cu::kernels::reduce_threads, 0, stream_>>>(
            out, static_cast<Acc*>(nullptr), ev, I(rows), I(cols), true, I(0), accumulate);
      });
    } else {
      // Slices of reduce_slice(n) elements: up to 1024 blocks, so a million elements already give
      // 132 SMs 256 blocks; a function of n alone keeps results identical run to run and across
      // devices. The partials then fit reduce_partials' one block.
      const index_t slice = reduce_slice(n);
      const index_t count = std::max<index_t>(1, (n + slice - 1) / slice);
      auto buf = temps_.take(std::size_t(count) * sizeof(Acc));
      Acc* partial = static_cast<Acc*>(buf.get());
      // The real cols: with cols == 0 the range is empty and the kernel never divides by it (a
      // cols of 1 here would read rows elements of an empty operand).
      with_index(n + slice, [&](auto i) {
        using I = decltype(i);
        cu::kernels::reduce_rows<Op, I, R, Acc><<<unsigned(count), cu::kernels::reduce_threads, 0, stream_>>>(
            out, partial, ev, I(rows), I(cols), false, I(slice), false);
      });
      cu::kernels::reduce_partials<Op, R, Acc><<<1, cu::kernels::reduce_threads, 0, stream_>>>(out, partial, count, n,
                                                                                             accumulate);
    }
    KILN_CUDA_CHECK(cudaGetLastError());
  }

  template <class T, class C>
  void gemm(bool ta, bool tb, index_t m, index_t n, index_t k, float alpha, const T* a, index_t lda, const T* b,
            index_t ldb, float beta, C* c, index_t ldc) {
    stats_.count(kind::gemm, "gemm", m * n, std::size_t(m * k + k * n + m * n) * sizeof(T));
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, f16> || std::is_same_v<T, bf16>,
                  "kiln: CUDA GEMM takes float, f16 or bf16 inputs");
    static_assert(std::is_same_v<C, float> || std::is_same_v<C, T>, "kiln: CUDA GEMM writes float or the input type");
    // cuBLASLt refuses empty sizes; the CPU executor takes them, so do the same here.
    if (m == 0 || n == 0) return;
    if (k == 0) return launch_elements(m, n, cu::kernels::ScaleRows<C>{c, ldc, beta});
    plain_gemm<T, C>(lt_args(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc));
  }

  // ---- GEMM epilogues (kiln/core/epilogue.hpp) ---------------------------------------------
  // ReLU and the tanh GELU, the bias and the bias gradients are cuBLASLt's own epilogues: ONE
  // library call. Other activations take the GEMM plus one kernel (epilogue.cuh).

  // Bytes of the aux buffer BiasAct<Act, T> writes for an [m, n] output (formats: epilogue.cuh).
  template <class Act, class T>
  static std::size_t act_aux_bytes(index_t m, index_t n) {
    if constexpr (is_identity_act_v<Act>) return 0;
    else if constexpr (std::is_same_v<Act, fn::Relu>) return std::size_t(cu::relu_mask_bytes(m, n));
    else return std::size_t(m * cu::act_aux_ld<Act>(n)) * sizeof(T);
  }
  // Whether Act's aux buffer has padding a backward may read but no forward writes: the ReLU
  // bit-mask's rows run to relu_mask_ld(n) bits, and what cuBLASLt writes past n is unmeasured
  // (issue 32: compute-sanitizer's initcheck). Such buffers start zeroed (TempPool::take).
  template <class Act>
  static constexpr bool act_aux_padded = std::is_same_v<Act, fn::Relu>;
  // on = false computes every GEMM epilogue with a plain GEMM and kiln's kernels instead of
  // cuBLASLt's, as happens by itself, per GEMM, where cuBLASLt has no kernel for the request (cu::Lt
  // remembers those plan keys; other shapes keep their epilogues); for tests and comparisons. Safe
  // to switch at any time: a backward runs cuBLASLt's DRELU only on a mask cuBLASLt's forward wrote.
  void use_lt_epilogues(bool on) { lt_epilogues_ = on; }
  bool lt_epilogues() const { return lt_epilogues_; }
  // GEMMs whose epilogue cuBLASLt has but which ran as a plain GEMM and kiln's kernel instead (no
  // algorithm for the shape, epilogues switched off, no cuBLASLt ReLU mask to read, or k = 1).
  std::size_t lt_fallbacks() const { return lt_fallbacks_; }
  // Plain GEMMs cuBLASLt had no kernel for, run by kiln's own (slow, correct) kernel instead.
  std::size_t gemm_fallbacks() const { return gemm_fallbacks_; }

  // Whether a GEMM with inner size k can take a DAct epilogue: cuBLASLt's DRELU / DGELU refuse
  // k = 1 (the producer then runs its own dact kernel).
  template <class Act>
  static constexpr bool folds_dact(index_t k) {
    return !cu::lt_activation_v<Act> || k >= 2;
  }

  // C = act(alpha·op(A)·op(B) + beta·C + bias[j]), what act' needs saved to ep.aux (unless null).
  template <class T, class Act>
  void gemm(bool ta, bool tb, index_t m, index_t n, index_t k, float alpha, const T* a, index_t lda, const T* b,
            index_t ldb, float beta, T* c, index_t ldc, const BiasAct<Act, T>& ep) {
    stats_.count(kind::gemm, bias_act_name<Act>(ep.bias != nullptr), m * n,
                 std::size_t(m * k + k * n + 2 * m * n) * sizeof(T));
    if (m == 0 || n == 0) return;
    KILN_CHECK(k > 0, ShapeError, "a GEMM with a bias or activation epilogue needs k > 0 (got an inner size of 0)");
    cu::MatmulArgs x = lt_args(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    const bool save = ep.aux != nullptr;
    if constexpr (is_identity_act_v<Act>) {
      if (!ep.bias) return plain_gemm<T, T>(x);
      x.epilogue = cu::Epilogue::bias;
      x.bias = const_cast<compute_t<T>*>(ep.bias);
      x.bias_f32 = true;
      if (try_lt(x)) return;
      ++lt_fallbacks_;
      x = lt_args(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    } else if constexpr (cu::lt_activation_v<Act>) {
      constexpr bool relu = std::is_same_v<Act, fn::Relu>;
      if (lt_epilogues_ && (relu ? lt_relu_keeps_nan() : lt_gelu_accurate())) {
        using E = cu::Epilogue;
        if (ep.bias && relu) x.epilogue = save ? E::relu_aux_bias : E::relu_bias;
        else if (ep.bias) x.epilogue = save ? E::gelu_aux_bias : E::gelu_bias;
        else if (relu) x.epilogue = save ? E::relu_aux : E::relu;
        else x.epilogue = save ? E::gelu_aux : E::gelu;
        x.bias = const_cast<compute_t<T>*>(ep.bias);
        x.bias_f32 = true;
        if (save) {
          x.aux = ep.aux;
          x.aux_ld = cu::act_aux_ld<Act>(n);
        }
        if (try_lt(x)) {
          if (relu && save) note_relu_mask(ep.aux, m, n);
          return;
        }
        x = lt_args(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      }
      ++lt_fallbacks_;
      if (relu && save) relu_masks_.erase(ep.aux);  // the kernel below writes no mask there
    }
    // The GEMM, then ONE kernel: z = C + bias, saved (except for ReLU, whose backward reads the
    // output's sign), C = act(z).
    plain_gemm<T, T>(x);
    T* aux = save && !std::is_same_v<Act, fn::Relu> ? static_cast<T*>(ep.aux) : nullptr;
    with_index(m * n, [&](auto i) {
      using I = decltype(i);
      cu::kernels::bias_act<Act><<<blocks(m * n), threads, 0, stream_>>>(c, ldc, ep.bias, aux,
                                                                          cu::act_aux_ld<Act>(n), I(m), I(n));
    });
    KILN_CUDA_CHECK(cudaGetLastError());
  }

  // C = (alpha·op(A)·op(B)) * act'(aux), and ep.dbias[j] (=|+=) the column sums of C.
  template <class T, class Act>
  void gemm(bool ta, bool tb, index_t m, index_t n, index_t k, float alpha, const T* a, index_t lda, const T* b,
            index_t ldb, float beta, T* c, index_t ldc, const DAct<Act, T>& ep) {
    KILN_CHECK(beta == 0.f, ValueError, "a GEMM with a d", Act::name, " epilogue writes its output (beta must be 0)");
    stats_.count(kind::gemm, dact_name<Act>(ep.dbias != nullptr), m * n,
                 std::size_t(m * k + k * n + 3 * m * n) * sizeof(T));
    if (m == 0 || n == 0) return;
    KILN_CHECK(k > 0, ShapeError, "a GEMM with a d", Act::name, " epilogue needs k > 0 (got an inner size of 0)");
    if constexpr (cu::lt_activation_v<Act>) {
      // DRELU reads cuBLASLt's bit-mask, which only its RELU_AUX forward writes: where that forward
      // fell back to bias_act for its shape (or ran with the epilogues off), no mask exists and the
      // kernel below reads the output's sign instead. Tracking the masks cuBLASLt wrote keeps the
      // mask's layout cuBLASLt's business (writing it from kiln's kernel would rely on an
      // undocumented bit order); GELU's aux is the same matrix on both paths.
      constexpr bool relu = std::is_same_v<Act, fn::Relu>;
      if (folds_dact<Act>(k) && lt_epilogues_ && (relu ? lt_wrote_mask(ep.aux, m, n) : lt_gelu_accurate())) {
        cu::MatmulArgs x = lt_args(ta, tb, m, n, k, alpha, a, lda, b, ldb, 0.f, c, ldc);
        using E = cu::Epilogue;
        x.epilogue = ep.dbias ? (relu ? E::drelu_bgrad : E::dgelu_bgrad) : (relu ? E::drelu : E::dgelu);
        x.bias_f32 = true;
        x.aux = const_cast<void*>(ep.aux);
        x.aux_ld = cu::act_aux_ld<Act>(n);
        if (lt_with_bias_grad(x, ep.dbias, ep.add_dbias, n)) return;
      }
      ++lt_fallbacks_;
    }
    plain_gemm<T, T>(lt_args(ta, tb, m, n, k, alpha, a, lda, b, ldb, 0.f, c, ldc));
    launch_dact<Act>(m, n, c, ldc, ep.aux, ep.out, c, ldc, false, ep.dbias, ep.add_dbias);
  }

  // C = alpha·op(A)·op(B) + beta·C, and ep.dbias[i] (=|+=) sum_p op(A)[i, p]; needs ta. C is float
  // (the float master weights' gradient under mixed precision) or T.
  template <class T, class C>
  void gemm(bool ta, bool tb, index_t m, index_t n, index_t k, float alpha, const T* a, index_t lda, const T* b,
            index_t ldb, float beta, C* c, index_t ldc, const BGradA<T>& ep) {
    KILN_CHECK(ta, ValueError, "a GEMM with a bgrada epilogue needs a transposed A (its rows are summed over k)");
    stats_.count(kind::gemm, "gemm+bgrada", m * n, std::size_t(m * k + k * n + m * n) * sizeof(T));
    if (m == 0 || n == 0) return;
    if (k == 0) {  // a weight gradient over a batch of 0 rows (as the CPU executor): C = beta·C, bias sums of nothing
      launch_elements(m, n, cu::kernels::ScaleRows<C>{c, ldc, beta});
      if (ep.dbias && !ep.add_dbias) launch_elements(1, m, cu::kernels::ScaleRows<compute_t<T>>{ep.dbias, m, 0.f});
      return;
    }
    cu::MatmulArgs x = lt_args(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    if (!ep.dbias) return plain_gemm<T, C>(x);
    x.epilogue = cu::Epilogue::bgrada;
    x.bias_f32 = true;
    if (lt_with_bias_grad(x, ep.dbias, ep.add_dbias, m)) return;
    ++lt_fallbacks_;
    // A is stored [k, m]: its column sums are the bias gradient.
    plain_gemm<T, C>(lt_args(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc));
    launch_dact<fn::Identity>(k, m, a, lda, nullptr, static_cast<const T*>(nullptr), static_cast<T*>(nullptr), 0,
                              false, ep.dbias, ep.add_dbias);
  }

  // d (=|+=) g * act'(aux) and dbias[j] (=|+=) its column sums, for an [m, n] gradient g with
  // row stride n; `out` is the activation's output (ReLU reads its sign). d or dbias may be
  // null. ONE elementwise launch.
  template <class Act, class T>
  void dact(index_t m, index_t n, const T* g, const void* aux, const T* out, T* d, bool add_d, compute_t<T>* dbias,
            bool add_dbias) {
    stats_.count(kind::elementwise, "dact", m * n, std::size_t(3 * m * n) * sizeof(T));
    if (m == 0 || n == 0) return;
    launch_dact<Act>(m, n, g, n, aux, out, d, n, add_d, dbias, add_dbias);
  }

  static constexpr int threads = 256;

 private:
  template <class T>
  static cu::LtType lt_type() {
    if constexpr (std::is_same_v<T, f16>) return cu::LtType::f16;
    else if constexpr (std::is_same_v<T, bf16>) return cu::LtType::bf16;
    else return cu::LtType::f32;
  }
  template <class T, class C>
  cu::MatmulArgs lt_args(bool ta, bool tb, index_t m, index_t n, index_t k, float alpha, const T* a,
                                index_t lda, const T* b, index_t ldb, float beta, C* c, index_t ldc) {
    cu::MatmulArgs x;
    x.m = m;
    x.n = n;
    x.k = k;
    x.trans_a = ta;
    x.trans_b = tb;
    x.in_type = lt_type<T>();
    x.out_type = lt_type<C>();
    x.alpha = alpha;
    x.beta = beta;
    x.a = a;
    x.lda = lda;
    x.b = b;
    x.ldb = ldb;
    x.c = c;
    x.ldc = ldc;
    x.d = c;
    x.ldd = ldc;
    x.allow_tf32 = allow_tf32_;
    return x;
  }

  // Runs x through cuBLASLt with its epilogue (unless use_lt_epilogues(false)); false, with nothing
  // enqueued, when cuBLASLt has no algorithm for x's plan key — cu::Lt remembers that per key, so a
  // repeat costs neither a heuristic query nor an exception. The caller then computes the same
  // result with a plain GEMM and its own kernel, for this GEMM only.
  // x (no epilogue) through cuBLASLt or, where it has no kernel for the shape (cu::Lt remembers),
  // through kiln's own kernel: a GEMM the executor is asked for always runs.
  template <class T, class C>
  void plain_gemm(const cu::MatmulArgs& x) {
    if (lt_.try_matmul(x, stream_)) return;
    ++gemm_fallbacks_;
    cu::kernels::gemm_fallback<<<blocks(x.m * x.n), threads, 0, stream_>>>(
        x.trans_a, x.trans_b, x.m, x.n, x.k, x.alpha, static_cast<const T*>(x.a), x.lda, static_cast<const T*>(x.b),
        x.ldb, x.beta, static_cast<const C*>(x.c), x.ldc, static_cast<C*>(x.d), x.ldd);
    KILN_CUDA_CHECK(cudaGetLastError());
  }

  bool try_lt(const cu::MatmulArgs& x) { return lt_epilogues_ && lt_.try_matmul(x, stream_); }

 public:
  // Whether cuBLASLt's ReLU epilogue keeps kiln's contract relu(NaN) = NaN (README, "ReLU and
  // NaN"): NVIDIA does not document it, and an fmax-style ReLU gives 0. Probed once per executor,
  // on its stream, with a 16 x 16 x 16 GEMM whose bias holds a NaN (the host waits for it) —
  // RELU_BIAS, then RELU_AUX_BIAS and DRELU_BGRAD, whose mask must give relu'(NaN) = 0;
  // false makes every ReLU epilogue take the GEMM and kiln's kernel (counted in lt_fallbacks).
  // Inside a capture before the first probe: false, not remembered (a probe cannot wait there).
  // Also true when cuBLASLt has no ReLU epilogue for the probe's shape (nothing to keep then).
  bool lt_relu_keeps_nan() {
    if (relu_nan_probe_) return *relu_nan_probe_;
    if (capture_ != nullptr) return false;
    constexpr index_t n = 16;
    cu::DeviceBuffer<float> buf(3 * n * n + n);
    float* a = buf.data();
    float* b = a + n * n;
    float* d = b + n * n;
    float* bias = d + n * n;
    std::vector<float> host(std::size_t(3 * n * n + n), 0.5f);
    host[std::size_t(3 * n * n + 3)] = std::numeric_limits<float>::quiet_NaN();  // bias[3]
    KILN_CUDA_CHECK(cudaMemcpyAsync(a, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice, stream_));
    cu::MatmulArgs x = lt_args(false, true, n, n, n, 1.f, a, n, b, n, 0.f, d, n);
    x.epilogue = cu::Epilogue::relu_bias;
    x.bias = bias;
    x.bias_f32 = true;
    bool keeps = true;
    if (lt_.try_matmul(x, stream_)) {
      KILN_CUDA_CHECK(cudaMemcpyAsync(host.data(), d, std::size_t(n * n) * sizeof(float), cudaMemcpyDeviceToHost,
                                      stream_));
      KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));
      for (index_t i = 0; i < n; ++i) keeps = keeps && std::isnan(host[std::size_t(i * n + 3)]);
    } else {
      KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));  // buf goes back to the allocator
    }
    // Training runs the other pair, RELU_AUX_BIAS forward and DRELU_BGRAD backward: the NaN must
    // survive the forward there too, and its mask bit must give relu'(NaN) = 0 (kiln's contract,
    // the CPU's: a NaN is not > 0), so the column's gradient and bias gradient are 0.
    if (keeps) keeps = lt_relu_aux_keeps_nan(a, b, bias);
    relu_nan_probe_ = keeps;
    return keeps;
  }

  // Whether cuBLASLt's GELU epilogues compute tanh-GELU to float accuracy, as kiln's kernel and the
  // CPU do: within 2e-5 |x| + 1e-6 over x in [-5, 5]. NVIDIA documents the tanh form, not its
  // accuracy, and a hardware tanh approximation would be off by a few 1e-4 |x| (a GPT's logits then
  // differ from the CPU's in the fourth digit). Probed once per executor as the ReLU one is (a
  // GEMM of zeros, so the output is GELU of the bias alone); false sends every GELU epilogue,
  // forward and backward, to the GEMM and kiln's kernel (counted in lt_fallbacks). Inside a
  // capture before the first probe: false, not remembered. True where cuBLASLt has no GELU
  // epilogue for the probe's shape.
  bool lt_gelu_accurate() {
    if (gelu_probe_) return *gelu_probe_;
    if (capture_ != nullptr) return false;
    constexpr index_t m = 16, n = 256, k = 16;
    cu::DeviceBuffer<float> buf(m * k + k * n + m * n + n);
    float* a = buf.data();
    float* b = a + m * k;
    float* d = b + k * n;
    float* bias = d + m * n;
    std::vector<float> host(std::size_t(m * k + k * n + m * n + n), 0.0f);
    float* xs = host.data() + (m * k + k * n + m * n);
    for (index_t j = 0; j < n; ++j) xs[j] = -5.0f + 10.0f * float(j) / float(n - 1);
    KILN_CUDA_CHECK(cudaMemcpyAsync(a, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice, stream_));
    cu::MatmulArgs x = lt_args(false, false, m, n, k, 1.f, a, k, b, n, 0.f, d, n);
    x.epilogue = cu::Epilogue::gelu_bias;
    x.bias = bias;
    x.bias_f32 = true;
    bool accurate = true;
    if (lt_.try_matmul(x, stream_)) {
      std::vector<float> got(std::size_t(m * n));
      KILN_CUDA_CHECK(cudaMemcpyAsync(got.data(), d, got.size() * sizeof(float), cudaMemcpyDeviceToHost, stream_));
      KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));
      for (index_t i = 0; i < m; ++i)
        for (index_t j = 0; j < n; ++j) {
          const double v = double(xs[j]), want = fn::GeluTanh{}(v);
          accurate = accurate && std::abs(double(got[std::size_t(i * n + j)]) - want) <= 2e-5 * std::abs(v) + 1e-6;
        }
    } else {
      KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));  // buf goes back to the allocator
    }
    gelu_probe_ = accurate;
    return accurate;
  }

 private:
  // lt_relu_keeps_nan's second half: a, b hold 0.5 everywhere and bias[3] is NaN ([16, 16], on the
  // device). True also where cuBLASLt has no algorithm for either epilogue (then none is used).
  bool lt_relu_aux_keeps_nan(const float* a, const float* b, const float* bias) {
    constexpr index_t n = 16;
    const index_t mask_ld = cu::relu_mask_ld(n);
    const std::size_t mask_bytes = std::size_t(cu::relu_mask_bytes(n, n));
    cu::DeviceBuffer<float> buf(2 * n * n + n);
    cu::DeviceBuffer<std::uint8_t> mask{index_t(mask_bytes)};
    float* h = buf.data();
    float* dz = h + n * n;
    float* dbias = dz + n * n;
    KILN_CUDA_CHECK(cudaMemsetAsync(mask.data(), 0, mask_bytes, stream_));
    cu::MatmulArgs fwd = lt_args(false, true, n, n, n, 1.f, a, n, b, n, 0.f, h, n);
    fwd.epilogue = cu::Epilogue::relu_aux_bias;
    fwd.bias = const_cast<float*>(bias);
    fwd.bias_f32 = true;
    fwd.aux = mask.data();
    fwd.aux_ld = mask_ld;
    bool keeps = true;
    if (lt_.try_matmul(fwd, stream_)) {
      // dZ = (A B) * relu'(Z) with A = B = 0.5: every product is 4, so a gradient of 0 in column 3
      // (and a bias gradient of 0 there) is the mask's doing.
      cu::MatmulArgs bwd = lt_args(false, false, n, n, n, 1.f, a, n, b, n, 0.f, dz, n);
      bwd.epilogue = cu::Epilogue::drelu_bgrad;
      bwd.bias = dbias;
      bwd.bias_f32 = true;
      bwd.aux = mask.data();
      bwd.aux_ld = mask_ld;
      const bool backward = lt_.try_matmul(bwd, stream_);
      std::vector<float> host(std::size_t(2 * n * n + n));
      KILN_CUDA_CHECK(cudaMemcpyAsync(host.data(), h, host.size() * sizeof(float), cudaMemcpyDeviceToHost, stream_));
      KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));
      for (index_t i = 0; i < n; ++i) {
        keeps = keeps && std::isnan(host[std::size_t(i * n + 3)]);
        if (backward) keeps = keeps && host[std::size_t(n * n + i * n + 3)] == 0.0f;
      }
      if (backward) keeps = keeps && host[std::size_t(2 * n * n + 3)] == 0.0f;
    } else {
      KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the buffers go back to the allocator
    }
    return keeps;
  }

  // try_lt for x, whose epilogue writes a bias gradient (length `len`): to dbias or, when the
  // gradient must be added (cuBLASLt only overwrites), to scratch that one more kernel adds.
  template <class T>
  bool lt_with_bias_grad(cu::MatmulArgs& x, T* dbias, bool add, index_t len) {
    if (!lt_epilogues_) return false;
    TempPool<cuda>::Buffer scratch;
    if (dbias && add) scratch = temps_.take(std::size_t(len) * sizeof(T));
    x.bias_f32 = std::is_same_v<T, float>;
    x.bias = scratch.get() ? scratch.get() : static_cast<void*>(dbias);
    if (!try_lt(x)) return false;
    if (scratch.get()) {
      cu::kernels::add_vector<<<blocks(len), threads, 0, stream_>>>(dbias, static_cast<const T*>(scratch.get()), len);
      KILN_CUDA_CHECK(cudaGetLastError());
    }
    return true;
  }

  // The masks cuBLASLt's RELU_AUX forward wrote, by address, with their [m, n]. A forward that
  // falls back erases its aux address; the map is cleared when it grows past any training loop's
  // needs (a backward then falls back to the kernel: slower, never wrong).
  void note_relu_mask(const void* aux, index_t m, index_t n) {
    if (relu_masks_.size() >= 4096) relu_masks_.clear();
    relu_masks_[aux] = {m, n};
  }
  bool lt_wrote_mask(const void* aux, index_t m, index_t n) const {
    const auto it = relu_masks_.find(aux);
    return it != relu_masks_.end() && it->second == std::pair<index_t, index_t>(m, n);
  }

  // The dact kernel with act' read the way this executor's aux format allows: elementwise when no
  // bias gradient is asked for, else tiled column sums (rowwise.cuh).
  template <class Act, class T>
  void launch_dact(index_t m, index_t n, const T* g, index_t ldg, const void* aux, const T* out, T* d, index_t ldd,
                   bool add_d, compute_t<T>* dbias, bool add_dbias) {
    auto run = [&](const auto& deriv) {
      const cu::DactTerms<std::decay_t<decltype(deriv)>, T, compute_t<T>> f{g, ldg, deriv, d, ldd, add_d, dbias,
                                                                            add_dbias};
      if (dbias) launch_column_sums(m, n, f);
      else launch_elements(m, n, f);
    };
    if constexpr (is_identity_act_v<Act>) run(cu::UnitDeriv{});
    else if constexpr (std::is_same_v<Act, fn::Relu>) run(cu::ReluDerivFromOutput<T>{out, n});
    else run(cu::DerivFromInput<Act, T>{static_cast<const T*>(aux), cu::act_aux_ld<Act>(n)});
  }

  // f(r, c) over an [rows, cols] range, one element per thread of a grid-stride loop.
  template <class K>
  void launch_elements(index_t rows, index_t cols, const K& kernel) {
    if (rows * cols == 0) return;
    with_index(rows * cols, [&](auto i) {
      using I = decltype(i);
      cu::kernels::for_each_element<<<blocks(rows * cols), threads, 0, stream_>>>(kernel, I(rows), I(cols));
    });
    KILN_CUDA_CHECK(cudaGetLastError());
  }

  template <class F>
  void launch_rows(index_t rows, index_t len, const F& f) {
    if (rows <= 0) return;
    const index_t max_grid = index_t(1) << 30;  // the kernels loop over rows beyond the grid
    if (len <= cu::warp_row_limit) {
      const index_t grid = std::min((rows + cu::rows_per_warp_block - 1) / cu::rows_per_warp_block, max_grid);
      cu::kernels::rows_by_warp<<<unsigned(grid), cu::row_threads, 0, stream_>>>(f, rows);
    } else {
      cu::kernels::rows_by_block<<<unsigned(std::min(rows, max_grid)), cu::row_threads, 0, stream_>>>(f, rows);
    }
    KILN_CUDA_CHECK(cudaGetLastError());
  }

  template <class F>
  void launch_row_parts(index_t rows, index_t len, const F& f) {
    using P = typename F::part_type;
    if (rows <= 0) return;
    const RowParts parts = RowParts::of(rows, len);
    if (parts.count == 1) return launch_rows(rows, len, f);
    auto buf = temps_.take(std::size_t(rows * parts.count) * sizeof(P));
    P* partial = static_cast<P*>(buf.get());
    const index_t max_grid = index_t(1) << 30;  // the kernel loops over parts beyond the grid
    cu::kernels::row_parts<<<unsigned(std::min(rows * parts.count, max_grid)), cu::row_threads, 0, stream_>>>(
        f, rows, len, parts, partial);
    cu::kernels::row_parts_finish<<<unsigned((rows + threads - 1) / threads), threads, 0, stream_>>>(
        f, rows, parts.count, partial);
    KILN_CUDA_CHECK(cudaGetLastError());
  }

  template <class F>
  void launch_column_sums(index_t rows, index_t cols, const F& f) {
    using S = typename F::sum_type;
    if (cols <= 0) return;
    const index_t tile_rows = cu::column_tile_rows(rows);
    const index_t tiles = std::max<index_t>(1, (rows + tile_rows - 1) / tile_rows);
    const index_t column_blocks = (cols + cu::column_tile - 1) / cu::column_tile;
    TempPool<cuda>::Buffer buf;
    if (tiles > 1) buf = temps_.take(std::size_t(tiles * F::sums * cols) * sizeof(S));
    S* partial = static_cast<S*>(buf.get());
    const dim3 grid{unsigned(column_blocks), unsigned(tiles)}, block{unsigned(cu::column_tile), unsigned(cu::column_lanes)};
    cu::kernels::column_partials<<<grid, block, 0, stream_>>>(f, rows, cols, tile_rows, partial);
    if (tiles > 1)
      cu::kernels::column_finish<<<unsigned((cols + threads - 1) / threads), threads, 0, stream_>>>(f, cols, tiles,
                                                                                                   partial);
    KILN_CUDA_CHECK(cudaGetLastError());
  }

  // Runs f with a value of the flat index type for n elements: std::uint32_t when n < 2^31,
  // index_t otherwise (file comment).
  template <class F>
  static void with_index(index_t n, F&& f) {
    if (n <= index_t(INT32_MAX)) f(std::uint32_t{});
    else f(index_t{});
  }

  // Elements per block of reduce()'s flat path: n / 1024 rounded up to 256, at least 4096.
  static index_t reduce_slice(index_t n) {
    const index_t per = (n + 1023) / 1024;
    return std::max<index_t>(4096, (per + 255) / 256 * 256);
  }

  static unsigned blocks(index_t n) {
    // Enough blocks to fill an H200 (132 SMs × 8 resident blocks); the grid-stride loop does the rest.
    return unsigned(std::min<index_t>((n + threads - 1) / threads, index_t(132) * 8));
  }

  cudaStream_t stream_;
  bool allow_tf32_ = false;
  bool lt_epilogues_ = true;
  std::optional<bool> relu_nan_probe_;  // lt_relu_keeps_nan's answer, once probed
  std::optional<bool> gelu_probe_;      // lt_gelu_accurate's answer, once probed
  std::size_t lt_fallbacks_ = 0;
  std::size_t gemm_fallbacks_ = 0;
  std::unordered_map<const void*, std::pair<index_t, index_t>> relu_masks_;
  LaunchStats stats_;
  TempPool<cuda> temps_;
  cu::Lt lt_;
  // Graph capture: the stream work is captured on, and the executor's own while it lasts.
  cudaStream_t capture_stream_ = nullptr, outer_stream_ = nullptr;
  cudaEvent_t capture_event_ = nullptr;
  cu::StepGraph* capture_ = nullptr;
  std::size_t records_before_ = 0;
  bool was_recording_ = false;
};

template <>
struct executor_for<cuda> {
  using type = CudaExecutor;
};
template <>
inline CudaExecutor make_executor<cuda>(int) {
  return CudaExecutor();
}

}  // namespace kiln
