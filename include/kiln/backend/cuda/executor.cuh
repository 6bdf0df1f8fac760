// kiln/backend/cuda/executor.cuh — the CUDA executor: every elementwise assignment is ONE
// grid-stride kernel templated on its evaluator; GEMMs go to cuBLASLt; reductions are block
// reductions (CUB's BlockReduce) inside our own kernels, deterministic run to run.
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
#include <concepts>
#include <cstddef>
#include <cub/block/block_reduce.cuh>
#include <string>
#include <type_traits>

#include "kiln/backend/cuda/check.cuh"
#include "kiln/backend/cuda/cublaslt.cuh"
#include "kiln/backend/cuda/epilogue.cuh"
#include "kiln/backend/cuda/memory.cuh"
#include "kiln/core/dtype.hpp"
#include "kiln/core/epilogue.hpp"
#include "kiln/core/stats.hpp"
#include "kiln/core/temp_pool.hpp"
#include "kiln/core/view.hpp"
#include "kiln/expr/evaluator.hpp"
#include "kiln/expr/reduce_ops.hpp"

namespace kiln::cu::kernels {

template <class T, class Ev>
KILN_GLOBAL void elementwise_flat(T* out, Ev ev, index_t n) {
  for (index_t i = index_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += index_t(gridDim.x) * blockDim.x)
    out[i] = convert<T>(ev.flat(i));
}

// Packets p = first, first + stride, ... cover [0, n - n % V); the tail [n - n % V, n) goes
// element by element. Requires out and every leaf aligned to alignof(Packet<., V>) (16 bytes).
template <int V, class T, class Ev>
KILN_GLOBAL void elementwise_packet(T* out, Ev ev, index_t n) {
  const index_t first = index_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const index_t stride = index_t(gridDim.x) * blockDim.x;
  const index_t packets = n / V;
  for (index_t p = first; p < packets; p += stride) {
    const auto in = ev.template flat_packet<V>(p * V);
    Packet<T, V> o;
    for (int k = 0; k < V; ++k) o.v[k] = convert<T>(in.v[k]);
    kiln::detail::store_packet(out + p * V, o);
  }
  for (index_t i = packets * V + first; i < n; i += stride) out[i] = convert<T>(ev.flat(i));
}

template <class T, class Ev>
KILN_GLOBAL void elementwise_2d(T* out, index_t drs, index_t dcs, Ev ev, index_t rows, index_t cols) {
  const index_t n = rows * cols;
  for (index_t i = index_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += index_t(gridDim.x) * blockDim.x) {
    const index_t r = i / cols, c = i - r * cols;
    out[r * drs + c * dcs] = convert<T>(ev.at(r, c));
  }
}

template <class K>
KILN_GLOBAL void for_each_element(K k, index_t rows, index_t cols) {
  const index_t n = rows * cols;
  for (index_t i = index_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += index_t(gridDim.x) * blockDim.x) {
    const index_t r = i / cols;
    k(r, i - r * cols);
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
// (per_row) or partial accumulators.
template <class Op, class R, class Acc, class Ev>
KILN_GLOBAL void reduce_rows(R* out, Acc* partial, Ev ev, index_t rows, index_t cols, bool per_row, index_t slice,
                             bool accumulate) {
  using T = typename Ev::value_type;
  using BlockReduce = cub::BlockReduce<Acc, reduce_threads>;
  __shared__ typename BlockReduce::TempStorage storage;
  Acc acc = Op::template init<T>();
  if (per_row) {
    const index_t r = blockIdx.x;
    for (index_t c = threadIdx.x; c < cols; c += reduce_threads) acc = Op::combine(acc, T(ev.at(r, c)), c);
  } else {
    const index_t n = rows * cols, b = index_t(blockIdx.x) * slice, e = b + slice < n ? b + slice : n;
    for (index_t i = b + threadIdx.x; i < e; i += reduce_threads) {
      const index_t r = i / cols;
      acc = Op::combine(acc, T(ev.at(r, i - r * cols)), i);
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

namespace kiln {

class CudaExecutor {
 public:
  using space = cuda;
  static constexpr const char* name = "cuda";

  explicit CudaExecutor(cudaStream_t stream = nullptr) : stream_(stream) {}

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
  // Copies `bytes` within device memory, ordered on the stream (no kernel is counted).
  void copy(void* dst, const void* src, std::size_t bytes) {
    if (bytes) KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  }

  template <class T, class Ext, class Ev>
  void elementwise(const View<T, cuda, Ext>& dst, const Ev& ev, const std::string& name) {
    const Shape& s = dst.shape();
    const index_t n = s.size();
    stats_.count(kind::elementwise, name, n, std::size_t(n) * sizeof(T));
    if (n == 0) return;
    constexpr int V = cu::detail::packet_lanes_for<T>;
    if (packet_lanes(dst, ev) != 0) {
      if constexpr (V != 0)  // packet_lanes is 0 when V is; this keeps Packet<T, 0> unnamed
        cu::kernels::elementwise_packet<V><<<blocks((n + V - 1) / V), threads, 0, stream_>>>(dst.data(), ev, n);
    } else if (ev.flat_ok() && dst.is_contiguous()) {
      cu::kernels::elementwise_flat<<<blocks(n), threads, 0, stream_>>>(dst.data(), ev, n);
    } else {
      const LeafStrides d = fold_strides(s, dst.strides(), false, s);
      KILN_CHECK(d.nlead == 0, ShapeError, "the CUDA executor writes destinations whose leading dimensions one "
                 "stride walks; the view of shape ", s.str(), " is not such a view (copy through a contiguous tensor)");
      const index_t drs = d.rs, dcs = d.cs;
      cu::kernels::elementwise_2d<<<blocks(n), threads, 0, stream_>>>(dst.data(), drs, dcs, ev, s.rows(), s.cols());
    }
    KILN_CUDA_CHECK(cudaGetLastError());
  }

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
    if (rows * cols == 0) return;
    cu::kernels::for_each_element<<<blocks(rows * cols), threads, 0, stream_>>>(kernel, rows, cols);
    KILN_CUDA_CHECK(cudaGetLastError());
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
      cu::kernels::reduce_rows<Op, R, Acc><<<unsigned(rows), cu::kernels::reduce_threads, 0, stream_>>>(
          out, static_cast<Acc*>(nullptr), ev, rows, cols, true, 0, accumulate);
    } else {
      // Fixed slices (not a function of the device) keep results reproducible across runs.
      const index_t slice = index_t(1) << 16;
      const index_t count = std::max<index_t>(1, (n + slice - 1) / slice);
      auto buf = temps_.take(std::size_t(count) * sizeof(Acc));
      Acc* partial = static_cast<Acc*>(buf.get());
      // The real cols: with cols == 0 the range is empty and the kernel never divides by it (a
      // cols of 1 here would read rows elements of an empty operand).
      cu::kernels::reduce_rows<Op, R, Acc><<<unsigned(count), cu::kernels::reduce_threads, 0, stream_>>>(
          out, partial, ev, rows, cols, false, slice, false);
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
    if (k == 0) {
      cu::kernels::for_each_element<<<blocks(m * n), threads, 0, stream_>>>(cu::kernels::ScaleRows<C>{c, ldc, beta}, m,
                                                                            n);
      KILN_CUDA_CHECK(cudaGetLastError());
      return;
    }
    lt_.matmul(lt_args(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc), stream_);
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
  // on = false computes every GEMM epilogue with a plain GEMM and kiln's kernels instead of
  // cuBLASLt's, as happens by itself for a kind of epilogue cuBLASLt has no kernel for; for tests
  // and comparisons. Switch between training steps, not inside one: a backward with cuBLASLt's
  // DRELU reads the mask only a forward with cuBLASLt's RELU_AUX writes.
  void use_lt_epilogues(bool on) { lt_bias_ok_ = lt_bgrad_ok_ = lt_relu_ok_ = lt_gelu_ok_ = on; }

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
      if (!ep.bias) return lt_.matmul(x, stream_);
      x.epilogue = cu::Epilogue::bias;
      x.bias = const_cast<compute_t<T>*>(ep.bias);
      x.bias_f32 = true;
      if (try_lt(x, lt_bias_ok_)) return;
      x = lt_args(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    } else if constexpr (cu::lt_activation_v<Act>) {
      if (lt_act_ok<Act>()) {
        constexpr bool relu = std::is_same_v<Act, fn::Relu>;
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
        if (try_lt(x, lt_act_ok<Act>())) return;
        x = lt_args(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      }
    }
    // The GEMM, then ONE kernel: z = C + bias, saved (except for ReLU, whose backward reads the
    // output's sign), C = act(z).
    lt_.matmul(x, stream_);
    T* aux = save && !std::is_same_v<Act, fn::Relu> ? static_cast<T*>(ep.aux) : nullptr;
    cu::kernels::bias_act<Act><<<blocks(m * n), threads, 0, stream_>>>(c, ldc, ep.bias, aux, cu::act_aux_ld<Act>(n),
                                                                        m, n);
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
      // Only while the forward epilogues work too: the ReLU mask exists only if they ran.
      if (folds_dact<Act>(k) && lt_act_ok<Act>()) {
        cu::MatmulArgs x = lt_args(ta, tb, m, n, k, alpha, a, lda, b, ldb, 0.f, c, ldc);
        constexpr bool relu = std::is_same_v<Act, fn::Relu>;
        using E = cu::Epilogue;
        x.epilogue = ep.dbias ? (relu ? E::drelu_bgrad : E::dgelu_bgrad) : (relu ? E::drelu : E::dgelu);
        x.bias_f32 = true;
        x.aux = const_cast<void*>(ep.aux);
        x.aux_ld = cu::act_aux_ld<Act>(n);
        if (lt_with_bias_grad(x, ep.dbias, ep.add_dbias, n, lt_act_ok<Act>())) return;
      }
    }
    lt_.matmul(lt_args(ta, tb, m, n, k, alpha, a, lda, b, ldb, 0.f, c, ldc), stream_);
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
    KILN_CHECK(k > 0, ShapeError, "a GEMM with a bgrada epilogue needs k > 0 (got an inner size of 0)");
    cu::MatmulArgs x = lt_args(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    if (!ep.dbias) return lt_.matmul(x, stream_);
    x.epilogue = cu::Epilogue::bgrada;
    x.bias_f32 = true;
    if (lt_with_bias_grad(x, ep.dbias, ep.add_dbias, m, lt_bgrad_ok_)) return;
    // A is stored [k, m]: its column sums are the bias gradient.
    lt_.matmul(lt_args(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc), stream_);
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

  // Runs x through cuBLASLt unless its kind of epilogue already found no kernel here (`ok`); false
  // (and `ok` cleared, so later calls skip the query) when cuBLASLt has no algorithm for it: the
  // caller then computes the same result with a plain GEMM and its own kernel.
  bool try_lt(const cu::MatmulArgs& x, bool& ok) {
    if (!ok) return false;
    try {
      lt_.matmul(x, stream_);
      return true;
    } catch (const cu::LtNoAlgorithm&) {
      ok = false;
      return false;
    }
  }

  // try_lt for x, whose epilogue writes a bias gradient (length `len`): to dbias or, when the
  // gradient must be added (cuBLASLt only overwrites), to scratch that one more kernel adds.
  template <class T>
  bool lt_with_bias_grad(cu::MatmulArgs& x, T* dbias, bool add, index_t len, bool& ok) {
    TempPool<cuda>::Buffer scratch;
    if (dbias && add) scratch = temps_.take(std::size_t(len) * sizeof(T));
    x.bias_f32 = std::is_same_v<T, float>;
    x.bias = scratch.get() ? scratch.get() : static_cast<void*>(dbias);
    if (!try_lt(x, ok)) return false;
    if (scratch.get()) {
      cu::kernels::add_vector<<<blocks(len), threads, 0, stream_>>>(dbias, static_cast<const T*>(scratch.get()), len);
      KILN_CUDA_CHECK(cudaGetLastError());
    }
    return true;
  }

  // Whether cuBLASLt's epilogues for Act have worked so far on this executor.
  template <class Act>
  bool& lt_act_ok() {
    if constexpr (std::is_same_v<Act, fn::Relu>) return lt_relu_ok_;
    else return lt_gelu_ok_;
  }

  // The dact kernel with act' read the way this executor's aux format allows.
  template <class Act, class T>
  void launch_dact(index_t m, index_t n, const T* g, index_t ldg, const void* aux, const T* out, T* d, index_t ldd,
                   bool add_d, compute_t<T>* dbias, bool add_dbias) {
    const unsigned grid = unsigned((n + threads - 1) / threads);
    auto run = [&](const auto& deriv) {
      cu::kernels::dact_columns<<<grid, threads, 0, stream_>>>(m, n, g, ldg, deriv, d, ldd, add_d, dbias, add_dbias);
    };
    if constexpr (is_identity_act_v<Act>) run(cu::UnitDeriv{});
    else if constexpr (std::is_same_v<Act, fn::Relu>) run(cu::ReluDerivFromOutput<T>{out, n});
    else run(cu::DerivFromInput<Act, T>{static_cast<const T*>(aux), cu::act_aux_ld<Act>(n)});
    KILN_CUDA_CHECK(cudaGetLastError());
  }

  static unsigned blocks(index_t n) {
    // Enough blocks to fill an H200 (132 SMs × 8 resident blocks); the grid-stride loop does the rest.
    return unsigned(std::min<index_t>((n + threads - 1) / threads, index_t(132) * 8));
  }

  cudaStream_t stream_;
  bool allow_tf32_ = false;
  bool lt_bias_ok_ = true, lt_bgrad_ok_ = true, lt_relu_ok_ = true, lt_gelu_ok_ = true;
  LaunchStats stats_;
  TempPool<cuda> temps_;
  cu::Lt lt_;
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
