// kiln/backend/cuda/cudnn_conv.cuh — 2-D convolution on the GPU through cuDNN's graph (backend)
// API: forward, backward-data and backward-filter, NCHW, float or double, the same
// cpu::Conv2dShape and the same weight layout ([Cout, Cin, KH, KW]) as the CPU kernels.
//
//   kiln::cu::CudnnConv conv;                             // one cuDNN handle; plans cached per shape
//   conv.forward(s, d_x, d_w, d_y, stream);               // y = conv(x, w)
//   conv.backward_data(s, d_dy, d_w, d_dx, stream);       // dx = conv^T(dy, w)
//   conv.backward_filter(s, d_x, d_dy, d_dw, stream);     // dw = sum over n of dy * x
// The backward passes take `accumulate`: add into dx / dw (cuDNN's beta = 1) instead of
// overwriting them — a gradient that already holds a contribution.
//
// Why the graph API and not cudnn-frontend: the legacy cudnnConvolutionForward family is
// deprecated in cuDNN 9, and the graph API is plain C in cudnn_backend.h (shipped with the
// toolkit here), so it costs no new dependency; cudnn-frontend is a header-only C++ layer over
// the same calls that would have to be vendored. The ~150 lines of descriptor plumbing below are
// what it would save.
//
// Engines: heuristics (CUDNN_HEUR_MODE_A) rank the engine configurations of each shape; the first
// that finalises and fits the policy is kept in a per-shape cache, with its workspace size. When
// none of mode A's does, CUDNN_HEUR_MODE_FALLBACK's engines are tried the same way.
// Policy: fp32 means fp32 — engines that down-convert inputs (TF32 tensor cores) are skipped unless
// `allow_tf32`; `deterministic` skips engines marked non-deterministic (bit-identical reruns, as
// PyTorch's torch.backends.cudnn.deterministic). Workspace comes from kiln's caching allocator.
//
// Status: compiled on every CI run; NOT YET RUN on a GPU (no device was lent when it was written).
// tests/cuda/test_cuda_conv.cu compares it with the CPU kernels on the first machine that has one.
#pragma once

#if defined(KILN_HAVE_CUDNN)

#include <cudnn.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/backend/cpu/conv2d.hpp"
#include "kiln/backend/cuda/allocator.cuh"
#include "kiln/backend/cuda/check.cuh"

namespace kiln::cu {

namespace detail {

// One backend descriptor, destroyed with its owner.
class BackendDesc {
 public:
  explicit BackendDesc(cudnnBackendDescriptorType_t type) { KILN_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &d_)); }
  BackendDesc(const BackendDesc&) = delete;
  BackendDesc& operator=(const BackendDesc&) = delete;
  ~BackendDesc() {
    if (d_) cudnnBackendDestroyDescriptor(d_);
  }
  cudnnBackendDescriptor_t get() const { return d_; }
  template <class V>
  BackendDesc& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, std::int64_t count,
                   const V* values) {
    KILN_CUDNN_CHECK(cudnnBackendSetAttribute(d_, name, type, count, values));
    return *this;
  }
  BackendDesc& set_desc(cudnnBackendAttributeName_t name, const BackendDesc& other) {
    cudnnBackendDescriptor_t o = other.get();
    return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &o);
  }
  void finalize() { KILN_CUDNN_CHECK(cudnnBackendFinalize(d_)); }
  cudnnStatus_t try_finalize() { return cudnnBackendFinalize(d_); }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

template <class T>
constexpr cudnnDataType_t cudnn_type() {
  if constexpr (std::is_same_v<T, double>) return CUDNN_DATA_DOUBLE;
  else return CUDNN_DATA_FLOAT;
}

// A packed tensor descriptor of logical dims [n, c, h, w] (NCHW strides) whose data is aligned
// to `align` bytes.
inline std::unique_ptr<BackendDesc> nchw_tensor(std::int64_t uid, cudnnDataType_t type, std::int64_t n,
                                                std::int64_t c, std::int64_t h, std::int64_t w, std::int64_t align) {
  auto t = std::make_unique<BackendDesc>(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const std::array<std::int64_t, 4> dims{n, c, h, w}, strides{c * h * w, h * w, w, 1};
  t->set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type)
      .set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data())
      .set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data())
      .set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid)
      .set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
  t->finalize();
  return t;
}

// Whether an engine configuration fits the policy, from its engine's numerical notes.
inline bool engine_allowed(cudnnBackendDescriptor_t cfg, bool allow_tf32, bool deterministic) {
  BackendDesc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  cudnnBackendDescriptor_t e = engine.get();
  std::int64_t got = 0;
  if (cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &got, &e) !=
      CUDNN_STATUS_SUCCESS)
    return false;
  std::array<cudnnBackendNumericalNote_t, 16> notes{};
  std::int64_t count = 0;
  if (cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                               std::int64_t(notes.size()), &count, notes.data()) != CUDNN_STATUS_SUCCESS)
    return false;
  for (std::int64_t i = 0; i < count; ++i) {
    const auto note = notes[std::size_t(i)];
    if (!allow_tf32 && (note == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS || note == CUDNN_NUMERICAL_NOTE_TENSOR_CORE))
      return false;
    if (deterministic && note == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) return false;
  }
  return true;
}

}  // namespace detail

enum class ConvPass { forward, backward_data, backward_filter };

struct CudnnConvOptions {
  bool allow_tf32 = false;     // let fp32 convolutions run on TF32 tensor cores (policy tf32)
  bool deterministic = false;  // only engines that give the same bits on every run
};

class CudnnConv {
 public:
  explicit CudnnConv(CudnnConvOptions options = {}, CachingAllocator& allocator = default_allocator())
      : options_(options), allocator_(&allocator) {
    KILN_CUDNN_CHECK(cudnnCreate(&handle_));
  }
  CudnnConv(const CudnnConv&) = delete;
  CudnnConv& operator=(const CudnnConv&) = delete;
  ~CudnnConv() {
    plans_.clear();  // plans hold descriptors made with the handle
    if (handle_) cudnnDestroy(handle_);
    // The workspaces go back to an allocator that is not stream-aware: not while a queued
    // convolution may still use them.
    if (workspace_bytes_ > 0) (void)cudaDeviceSynchronize();
  }

  // y = conv(x, w) (y overwritten). Device pointers; runs on `stream`.
  template <class T>
  void forward(const cpu::Conv2dShape& s, const T* x, const T* w, T* y, cudaStream_t stream) {
    run<T>(ConvPass::forward, s, {const_cast<T*>(x), const_cast<T*>(w), y}, stream);
  }
  // dx = the gradient of sum(y * dy) with respect to x (dx overwritten).
  template <class T>
  void backward_data(const cpu::Conv2dShape& s, const T* dy, const T* w, T* dx, cudaStream_t stream,
                     bool accumulate = false) {
    run<T>(ConvPass::backward_data, s, {dx, const_cast<T*>(w), const_cast<T*>(dy)}, stream, accumulate);
  }
  // dw = the gradient of sum(y * dy) with respect to w (dw overwritten).
  template <class T>
  void backward_filter(const cpu::Conv2dShape& s, const T* x, const T* dy, T* dw, cudaStream_t stream,
                       bool accumulate = false) {
    run<T>(ConvPass::backward_filter, s, {const_cast<T*>(x), dw, const_cast<T*>(dy)}, stream, accumulate);
  }

  // Plans built so far (one per pass, accumulation, type and shape).
  std::size_t cached_plans() const { return plans_.size(); }

 private:
  // The tensors of a pass by unique id: x (or dx), w (or dw), y (or dy).
  static constexpr std::int64_t uid_x = 1, uid_w = 2, uid_y = 3;

  struct Plan {
    std::vector<std::unique_ptr<detail::BackendDesc>> keep;  // what the plan refers to
    std::unique_ptr<detail::BackendDesc> plan;
    std::int64_t workspace = 0;
  };
  // pass, accumulate, element bytes, the tensors' promised byte alignment, then the shape.
  using Key = std::tuple<int, bool, int, int, index_t, index_t, index_t, index_t, index_t, index_t, index_t, index_t,
                         index_t, index_t, index_t, index_t, index_t>;

  template <class T>
  void run(ConvPass pass, const cpu::Conv2dShape& s, std::array<T*, 3> data, cudaStream_t stream,
           bool accumulate = false) {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                  "kiln::cu::CudnnConv: float or double tensors");
    s.check("kiln::cu::CudnnConv");
    KILN_CUDNN_CHECK(cudnnSetStream(handle_, stream));
    // The alignment the plan may assume: 16 bytes where every pointer has it (whole tensors from
    // the caching allocator are 256-byte aligned), which admits the vectorised and tensor-core
    // engines that sizeof(T) excluded; else the element's size. Plans are cached per alignment.
    bool aligned16 = true;
    for (const T* ptr : data) aligned16 = aligned16 && reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0;
    Plan& p = plan<T>(pass, s, accumulate, aligned16 ? 16 : int(sizeof(T)));
    std::array<std::int64_t, 3> uids{uid_x, uid_w, uid_y};
    std::array<void*, 3> ptrs{data[0], data[1], data[2]};
    void* ws = workspace(std::size_t(p.workspace));
    detail::BackendDesc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uids.data())
        .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, ptrs.data())
        .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
    pack.finalize();
    KILN_CUDNN_CHECK(cudnnBackendExecute(handle_, p.plan->get(), pack.get()));
  }

  // The handle's workspace, at least `bytes`: kept across calls, so a convolution neither
  // allocates nor waits for the device (a cudaStreamSynchronize per call broke every CUDA-graph
  // capture — convnets fell back to eager under reduce_overhead — and cost a host wait per
  // convolution). Grown geometrically when a plan needs more; the smaller buffers it replaces
  // stay allocated until the handle goes, since work still queued, or a captured graph, may use
  // them (the allocator is not stream-aware). A growth inside a capture takes its block from the
  // graph's pool, which stays alive while the block is held.
  void* workspace(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    if (bytes > workspace_bytes_) {
      const std::size_t grown = std::max(bytes, 2 * workspace_bytes_);
      retired_.push_back(std::move(workspace_));
      workspace_ = DeviceBuffer<unsigned char>(index_t(grown), *allocator_);
      workspace_bytes_ = grown;
    }
    return workspace_.data();
  }

  template <class T>
  Plan& plan(ConvPass pass, const cpu::Conv2dShape& s, bool accumulate, int alignment) {
    const Key key{int(pass), accumulate, int(sizeof(T)), alignment, s.n, s.c_in, s.h, s.w, s.c_out, s.kh, s.kw, s.stride_h,
                  s.stride_w, s.pad_h, s.pad_w, s.dil_h, s.dil_w};
    if (auto it = plans_.find(key); it != plans_.end()) return it->second;
    Plan p;
    const cudnnDataType_t type = detail::cudnn_type<T>();
    p.keep.push_back(detail::nchw_tensor(uid_x, type, s.n, s.c_in, s.h, s.w, alignment));
    p.keep.push_back(detail::nchw_tensor(uid_w, type, s.c_out, s.c_in, s.kh, s.kw, alignment));
    p.keep.push_back(detail::nchw_tensor(uid_y, type, s.n, s.c_out, s.out_h(), s.out_w(), alignment));
    const auto& x = *p.keep[0];
    const auto& w = *p.keep[1];
    const auto& y = *p.keep[2];

    auto conv = std::make_unique<detail::BackendDesc>(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
    const std::int64_t dims = 2;
    const std::array<std::int64_t, 2> dil{s.dil_h, s.dil_w}, stride{s.stride_h, s.stride_w}, pad{s.pad_h, s.pad_w};
    const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;  // PyTorch's "convolution"
    conv->set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type)
        .set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode)
        .set(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &dims)
        .set(CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dil.data())
        .set(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, stride.data())
        .set(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pad.data())
        .set(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pad.data());
    conv->finalize();

    // alpha = 1, beta = 0 (overwrite) or 1 (accumulate), in the compute type.
    const T alpha = 1, beta = accumulate ? 1 : 0;
    const cudnnBackendAttributeType_t scalar = std::is_same_v<T, double> ? CUDNN_TYPE_DOUBLE : CUDNN_TYPE_FLOAT;
    auto op = std::make_unique<detail::BackendDesc>(
        pass == ConvPass::forward         ? CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR
        : pass == ConvPass::backward_data ? CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR
                                          : CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR);
    if (pass == ConvPass::forward) {
      op->set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, x)
          .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, w)
          .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, y)
          .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, *conv)
          .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, scalar, 1, &alpha)
          .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, scalar, 1, &beta);
    } else if (pass == ConvPass::backward_data) {
      op->set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, x)
          .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, w)
          .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY, y)
          .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, *conv)
          .set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA, scalar, 1, &alpha)
          .set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA, scalar, 1, &beta);
    } else {
      op->set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X, x)
          .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW, w)
          .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY, y)
          .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC, *conv)
          .set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA, scalar, 1, &alpha)
          .set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA, scalar, 1, &beta);
    }
    op->finalize();

    auto graph = std::make_unique<detail::BackendDesc>(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    cudnnBackendDescriptor_t ops = op->get();
    graph->set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &ops)
        .set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_);
    graph->finalize();

    // Mode A's ranked engines first; when none of them finalises under the policy (fp32 excludes
    // the tensor-core engines, and nothing promises that mode A lists another), FALLBACK's, which
    // cover every shape, slower.
    std::int64_t candidates = 0;
    for (const cudnnBackendHeurMode_t heur_mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
      detail::BackendDesc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
      heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, *graph).set(CUDNN_ATTR_ENGINEHEUR_MODE,
                                                                       CUDNN_TYPE_HEUR_MODE, 1, &heur_mode);
      heur.finalize();
      std::int64_t count = 0;
      KILN_CUDNN_CHECK(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr));
      std::vector<std::unique_ptr<detail::BackendDesc>> configs;
      std::vector<cudnnBackendDescriptor_t> raw;
      for (std::int64_t i = 0; i < count; ++i) {
        configs.push_back(std::make_unique<detail::BackendDesc>(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
        raw.push_back(configs.back()->get());
      }
      std::int64_t got = 0;
      if (count > 0)
        KILN_CUDNN_CHECK(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, raw.data()));
      candidates += got;
      for (std::int64_t i = 0; i < got && !p.plan; ++i) {
        if (!detail::engine_allowed(raw[std::size_t(i)], options_.allow_tf32, options_.deterministic)) continue;
        auto candidate = std::make_unique<detail::BackendDesc>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
        candidate->set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_)
            .set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, *configs[std::size_t(i)]);
        if (candidate->try_finalize() != CUDNN_STATUS_SUCCESS) continue;  // not for this shape: next
        std::int64_t ws = 0, n = 0;
        KILN_CUDNN_CHECK(cudnnBackendGetAttribute(candidate->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                                  CUDNN_TYPE_INT64, 1, &n, &ws));
        p.plan = std::move(candidate);
        p.workspace = ws;
        p.keep.push_back(std::move(configs[std::size_t(i)]));
      }
      if (p.plan) break;
    }
    KILN_CHECK(p.plan != nullptr, CudaError, "kiln::cu::CudnnConv: cuDNN offers no engine for this ",
               pass == ConvPass::forward ? "forward" : pass == ConvPass::backward_data ? "backward-data" : "backward-filter",
               " convolution (n=", s.n, " c_in=", s.c_in, " h=", s.h, " w=", s.w, " c_out=", s.c_out, " kernel ", s.kh,
               "x", s.kw, ") under the policy (allow_tf32 ", options_.allow_tf32, ", deterministic ",
               options_.deterministic, "): ", candidates, " heuristic candidates (modes A and fallback)");
    p.keep.push_back(std::move(conv));
    p.keep.push_back(std::move(op));
    p.keep.push_back(std::move(graph));
    return plans_.emplace(key, std::move(p)).first->second;
  }

  CudnnConvOptions options_;
  CachingAllocator* allocator_;
  cudnnHandle_t handle_ = nullptr;
  std::map<Key, Plan> plans_;
  DeviceBuffer<unsigned char> workspace_;
  std::size_t workspace_bytes_ = 0;
  std::vector<DeviceBuffer<unsigned char>> retired_;  // outgrown workspaces (see workspace())
};

}  // namespace kiln::cu

#endif  // KILN_HAVE_CUDNN
