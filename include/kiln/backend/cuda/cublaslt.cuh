// kiln/backend/cuda/cublaslt.cuh — row-major GEMM with fused epilogues through cuBLASLt.
//
//   kiln::cu::Lt lt;
//   lt.matmul({.m = batch, .n = out, .k = in, .trans_b = true,              // Y = X W^T + b
//              .in_type = LtType::bf16, .out_type = LtType::bf16,
//              .a = d_x, .lda = in, .b = d_w, .ldb = in, .d = d_y, .ldd = out,
//              .epilogue = Epilogue::relu_bias, .bias = d_b}, stream);
//
// ---- Row-major on a column-major library -------------------------------------------------------
// kiln stores matrices row-major; cuBLASLt describes them column-major. A row-major X[r, c] with
// row stride ld has exactly the bytes of a column-major X^T[c, r] with leading dimension ld. So
// instead of D = op(A) op(B) we ask cuBLASLt for the transposed product
//
//     D^T[n, m] = op(B)^T[n, k] · op(A)^T[k, m]
//
// which it writes column-major — the same bytes as row-major D[m, n]. Concretely:
//   cuBLASLt "A" := kiln B (its layout: rows = trans_b ? k : n, cols = the other, ld = ldb),
//                   cuBLASLt TRANSA := kiln trans_b;
//   cuBLASLt "B" := kiln A (rows = trans_a ? m : k, ld = lda), TRANSB := kiln trans_a;
//   cuBLASLt (M, N, K) := kiln (n, m, k); C and D are column-major n x m with ld = ldc / ldd.
// No data moves; only the names swap.
//
// ---- What that does to the epilogues -----------------------------------------------------------
// (cuBLASLt's conventions from cublasLt.h, CUDA 13.0, cublasLtEpilogue_t and
// cublasLtMatmulDescAttributes_t.)
// * BIAS: "Bias vector length must match matrix D rows … broadcasted to all columns". The rows of
//   the column-major D^T are the COLUMNS of kiln's row-major D, so the bias has n entries, one per
//   output column (per output feature of Y = X W^T + b) — the convention a Linear layer wants.
//   It is added to alpha op(A) op(B) + beta C, before the activation ("added before applying
//   final postprocessing"); the runtime tests pin this down with beta != 0.
// * DRELU_BGRAD / DGELU_BGRAD: the bias gradient has one entry per row of D^T, summed along its
//   columns: in kiln terms db[j] = sum_i D[i, j] (column sums of D, length n), D being the
//   gradient AFTER the activation derivative is applied — i.e. the gradient of the bias that fed
//   the forward activation.
// * BGRADA ("bias gradient based on the input matrix A … size = rows of D, reduction over k") and
//   BGRADB ("… matrix B … size = columns of D") swap along with A and B:
//     kiln bgrada: db[i] = sum_k op(A)[i, k], length m  -> CUBLASLT_EPILOGUE_BGRADB
//     kiln bgradb: db[j] = sum_k op(B)[k, j], length n  -> CUBLASLT_EPILOGUE_BGRADA
//   Typical use: Linear weight gradient dW[out, in] = dY^T[out, batch] X[batch, in] with
//   trans_a = true, and bgrada gives db = column sums of dY in the same call.
//   cuBLASLt supports BGRADB only with its B transposed and BGRADA only with its A not
//   transposed. Sources: NVIDIA nvmath-python, tests/nvmath_tests/distributed/test_matmul.py
//   ("CUBLASLT_EPILOGUE_BGRADA only works with non-transposed A", "... BGRADB only works with
//   transposed B") and nvmath/linalg/advanced/matmulmod.py ("this epilog [BGRADB] requires B to
//   be transposed"); Apex-style fused_dense code calls BGRADB with transb = T and BGRADA with
//   transa = N. After the swap: kiln bgrada requires trans_a = true, kiln bgradb requires
//   trans_b = false; matmul() rejects the other combinations with a ValueError that says so.
// * AUX (the ReLU bit-mask / the GELU input saved for backward) is a column-major matrix with
//   "rows of the output matrix" = n rows and ld >= n: in kiln terms a row-major [m, n] matrix
//   with row stride aux_ld. Its ld rules (cublasLt.h, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD):
//     ReLU bit-mask (relu_aux_bias, drelu, drelu_bgrad): aux_ld counts BITS and "must be
//       divisible by 128" — size it with relu_mask_ld(n) and relu_mask_bytes(m, n);
//     GELU input (gelu_aux_bias, dgelu, dgelu_bgrad): aux_ld counts elements of out_type and
//       "must be divisible by 8" — size it with gelu_aux_ld(n).
//   The mask's bit order is cuBLASLt's business: treat it as opaque, produced by relu_aux_bias
//   and consumed by drelu/drelu_bgrad of the same m, n and aux_ld.
// * DRELU / DGELU need k >= 2 (nvmath-python, nvmath/linalg/_internal/epilog_protocol.py: "K=1
//   is not supported by cuBLAS", for both); matmul() rejects k == 1 for them.
// * GELU is the tanh approximation, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): PyTorch's
//   decomposition of _addmm_activation (which calls cuBLASLt's GELU_BIAS on CUDA) uses
//   gelu(approximate="tanh") exactly when the tensor is on CUDA. DGELU is its derivative. The
//   runtime tests check this form with a tolerance that the erf form would fail.
// * Types: the bias vector, the bias gradient and the GELU aux matrix all have the OUTPUT type
//   (cuBLASLt's default when CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE / AUX_DATA_TYPE are unset).
// * The bias gradient is always overwritten, never accumulated — also when beta != 0 makes D
//   accumulate (dW += ...). Callers that accumulate gradients must add db themselves.
//
// ---- Plans -------------------------------------------------------------------------------------
// A plan (matmul descriptor, four layouts, the heuristic's algorithm) is built once per distinct
// (sizes, transposes, types, compute mode, epilogue, leading dimensions, pointer alignments) and
// cached: the heuristic query costs far more than the GEMM for small shapes. Pointer alignments
// belong to the key because the heuristic picks kernels by them (and, for bias and aux, by the
// pointer set on the descriptor when it runs); a plan is reused only for equally aligned data.
// Plans are never evicted (a training loop sees a handful of shapes); clear_plans() drops them.
// A key for which the heuristic found no algorithm is remembered too: a repeat fails at once
// (LtNoAlgorithm from matmul, false from try_matmul) without asking the heuristic again, and only
// that key — every other shape and epilogue keeps its plan. So is a key whose planned call
// cublasLtMatmul refused with CUBLAS_STATUS_NOT_SUPPORTED: its plan is dropped and the caller
// falls back, as if the heuristic had found nothing.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "kiln/backend/cuda/allocator.cuh"
#include "kiln/backend/cuda/check.cuh"
#include "kiln/config.hpp"
#include "kiln/core/error.hpp"

namespace kiln::cu {

// cuBLASLt's heuristic found no kernel for a valid request (some epilogue, type and layout
// combinations have none): callers with another way to compute the result catch this one.
class LtNoAlgorithm : public CudaError {
 public:
  using CudaError::CudaError;
};

// Element types of the matrices cuBLASLt reads and writes. (A local enum: the CUDA backend must
// not depend on how the host-side dtype is spelled; mapping one to the other is one switch.)
enum class LtType { f32, f16, bf16 };

// Fused epilogues; names follow cuBLASLt's, with bgrada / bgradb named for KILN's A and B (see the
// file comment: they map to cuBLASLt's BGRADB / BGRADA).
enum class Epilogue {
  none,           // D = alpha op(A) op(B) + beta C
  bias,           // D = ... + bias[j]                                (reads bias, length n)
  relu,           // D = relu(...)
  relu_bias,      // D = relu(... + bias[j])                          (reads bias)
  gelu,           // D = gelu_tanh(...)
  gelu_bias,      // D = gelu_tanh(... + bias[j])                     (reads bias)
  relu_aux,       // relu, and writes the ReLU bit-mask to aux        (writes aux)
  relu_aux_bias,  // relu_bias, and writes the ReLU bit-mask to aux   (reads bias, writes aux)
  gelu_aux,       // gelu, and writes the GELU input to aux           (writes aux)
  gelu_aux_bias,  // gelu_bias, and writes the GELU input to aux      (reads bias, writes aux)
  drelu,          // D = (...) * [pre > 0] from the mask in aux       (reads aux)
  drelu_bgrad,    // drelu, and bias = column sums of D               (reads aux, writes bias[n])
  dgelu,          // D = (...) * gelu_tanh'(aux)                      (reads aux)
  dgelu_bgrad,    // dgelu, and bias = column sums of D               (reads aux, writes bias[n])
  bgrada,         // bias[i] = sum_k op(A)[i, k]; needs trans_a       (writes bias[m])
  bgradb,         // bias[j] = sum_k op(B)[k, j]; needs !trans_b      (writes bias[n])
};

inline const char* to_string(LtType t) noexcept {
  switch (t) {
    case LtType::f32: return "f32";
    case LtType::f16: return "f16";
    case LtType::bf16: return "bf16";
  }
  return "?";
}

inline const char* to_string(Epilogue e) noexcept {
  switch (e) {
    case Epilogue::none: return "none";
    case Epilogue::bias: return "bias";
    case Epilogue::relu: return "relu";
    case Epilogue::relu_bias: return "relu_bias";
    case Epilogue::gelu: return "gelu";
    case Epilogue::gelu_bias: return "gelu_bias";
    case Epilogue::relu_aux: return "relu_aux";
    case Epilogue::relu_aux_bias: return "relu_aux_bias";
    case Epilogue::gelu_aux: return "gelu_aux";
    case Epilogue::gelu_aux_bias: return "gelu_aux_bias";
    case Epilogue::drelu: return "drelu";
    case Epilogue::drelu_bgrad: return "drelu_bgrad";
    case Epilogue::dgelu: return "dgelu";
    case Epilogue::dgelu_bgrad: return "dgelu_bgrad";
    case Epilogue::bgrada: return "bgrada";
    case Epilogue::bgradb: return "bgradb";
  }
  return "?";
}

constexpr bool epilogue_reads_bias(Epilogue e) noexcept {
  return e == Epilogue::bias || e == Epilogue::relu_bias || e == Epilogue::gelu_bias ||
         e == Epilogue::relu_aux_bias || e == Epilogue::gelu_aux_bias;
}
constexpr bool epilogue_writes_bias_grad(Epilogue e) noexcept {
  return e == Epilogue::drelu_bgrad || e == Epilogue::dgelu_bgrad || e == Epilogue::bgrada ||
         e == Epilogue::bgradb;
}
// Epilogues whose aux matrix is the ReLU bit-mask (written by relu_aux_bias, read by the others).
constexpr bool epilogue_uses_relu_mask(Epilogue e) noexcept {
  return e == Epilogue::relu_aux || e == Epilogue::relu_aux_bias || e == Epilogue::drelu ||
         e == Epilogue::drelu_bgrad;
}
// Epilogues whose aux matrix is the GELU input (written by gelu_aux_bias, read by the others).
constexpr bool epilogue_uses_gelu_aux(Epilogue e) noexcept {
  return e == Epilogue::gelu_aux || e == Epilogue::gelu_aux_bias || e == Epilogue::dgelu ||
         e == Epilogue::dgelu_bgrad;
}
constexpr bool epilogue_uses_aux(Epilogue e) noexcept {
  return epilogue_uses_relu_mask(e) || epilogue_uses_gelu_aux(e);
}
// Length of the bias / bias-gradient vector for an m x n output.
constexpr index_t epilogue_bias_length(Epilogue e, index_t m, index_t n) noexcept {
  return e == Epilogue::bgrada ? m : n;
}

// The smallest legal aux_ld (in bits) of a ReLU bit-mask for an output with n columns.
constexpr index_t relu_mask_ld(index_t n) noexcept { return (n + 127) / 128 * 128; }
// Bytes of a ReLU bit-mask for an m x n output stored with aux_ld = relu_mask_ld(n).
constexpr index_t relu_mask_bytes(index_t m, index_t n) noexcept { return m * relu_mask_ld(n) / 8; }
// The smallest legal aux_ld (in elements of out_type) of a GELU aux matrix with n columns.
constexpr index_t gelu_aux_ld(index_t n) noexcept { return (n + 7) / 8 * 8; }

// One row-major GEMM: D[m, n] = epilogue(alpha op(A)[m, k] op(B)[k, n] + beta C[m, n]).
// Leading dimensions are row strides in elements: A is stored [m, k] (lda >= k), or [k, m]
// (lda >= m) when trans_a; B is stored [k, n] (ldb >= n), or [n, k] (ldb >= k) when trans_b;
// C and D are [m, n] (ldc, ldd >= n). Designated initialisers keep call sites readable.
struct MatmulArgs {
  index_t m = 0;
  index_t n = 0;
  index_t k = 0;
  bool trans_a = false;
  bool trans_b = false;
  LtType in_type = LtType::f32;   // A and B
  LtType out_type = LtType::f32;  // C, D, bias / bias gradient, GELU aux: f32 or in_type
  bool allow_tf32 = false;        // f32 inputs only: multiply in TF32 (10-bit mantissa), add in f32
  float alpha = 1.0f;
  float beta = 0.0f;
  const void* a = nullptr;
  index_t lda = 0;
  const void* b = nullptr;
  index_t ldb = 0;
  const void* c = nullptr;  // read when beta != 0 (required then); may equal d (with ldc == ldd)
  index_t ldc = 0;
  void* d = nullptr;
  index_t ldd = 0;
  Epilogue epilogue = Epilogue::none;
  void* bias = nullptr;  // device vector of out_type: read by *bias epilogues, written by *bgrad*
  bool bias_f32 = false;  // the bias vector is f32 whatever out_type (mixed precision's float bias)
  void* aux = nullptr;   // device aux matrix (see file comment): written by *_aux_bias, read by d*
  index_t aux_ld = 0;    // bits for the ReLU mask (multiple of 128), elements for GELU (of 8)
};

namespace detail {

inline cudaDataType_t lt_cuda_type(LtType t) noexcept {
  switch (t) {
    case LtType::f32: return CUDA_R_32F;
    case LtType::f16: return CUDA_R_16F;
    case LtType::bf16: return CUDA_R_16BF;
  }
  return CUDA_R_32F;
}

inline cublasLtEpilogue_t lt_epilogue(Epilogue e) noexcept {
  switch (e) {
    case Epilogue::none: return CUBLASLT_EPILOGUE_DEFAULT;
    case Epilogue::bias: return CUBLASLT_EPILOGUE_BIAS;
    case Epilogue::relu: return CUBLASLT_EPILOGUE_RELU;
    case Epilogue::relu_bias: return CUBLASLT_EPILOGUE_RELU_BIAS;
    case Epilogue::gelu: return CUBLASLT_EPILOGUE_GELU;
    case Epilogue::gelu_bias: return CUBLASLT_EPILOGUE_GELU_BIAS;
    case Epilogue::relu_aux: return CUBLASLT_EPILOGUE_RELU_AUX;
    case Epilogue::relu_aux_bias: return CUBLASLT_EPILOGUE_RELU_AUX_BIAS;
    case Epilogue::gelu_aux: return CUBLASLT_EPILOGUE_GELU_AUX;
    case Epilogue::gelu_aux_bias: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case Epilogue::drelu: return CUBLASLT_EPILOGUE_DRELU;
    case Epilogue::drelu_bgrad: return CUBLASLT_EPILOGUE_DRELU_BGRAD;
    case Epilogue::dgelu: return CUBLASLT_EPILOGUE_DGELU;
    case Epilogue::dgelu_bgrad: return CUBLASLT_EPILOGUE_DGELU_BGRAD;
    // Swapped on purpose: kiln's A is cuBLASLt's B (see the file comment).
    case Epilogue::bgrada: return CUBLASLT_EPILOGUE_BGRADB;
    case Epilogue::bgradb: return CUBLASLT_EPILOGUE_BGRADA;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

// The largest power of two (up to 256) that divides the address; the heuristic needs it to rule
// out vectorised kernels for misaligned data. nullptr counts as fully aligned.
inline std::uint32_t pointer_alignment(const void* p) noexcept {
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t align = 256;
  while (align > 1 && addr % align != 0) align /= 2;
  return align;
}

inline std::string describe(const MatmulArgs& x) {
  return ::kiln::detail::concat(
      "matmul D[", x.m, "x", x.n, "] = op(A)[", x.m, "x", x.k, "] op(B)[", x.k, "x", x.n,
      "] (trans_a=", x.trans_a ? "true" : "false", ", trans_b=", x.trans_b ? "true" : "false", ", ",
      to_string(x.in_type), "->", to_string(x.out_type),
      x.allow_tf32 && x.in_type == LtType::f32 ? ", tf32" : "",
      ", epilogue=", to_string(x.epilogue), ", lda=", x.lda, ", ldb=", x.ldb, ", ldc=", x.ldc,
      ", ldd=", x.ldd, ", aux_ld=", x.aux_ld, ")");
}

// RAII for the three cuBLASLt descriptor kinds.
struct LtDescDeleter {
  void operator()(cublasLtMatmulDescOpaque_t* p) const noexcept { cublasLtMatmulDescDestroy(p); }
};
struct LtLayoutDeleter {
  void operator()(cublasLtMatrixLayoutOpaque_t* p) const noexcept {
    cublasLtMatrixLayoutDestroy(p);
  }
};
struct LtPrefDeleter {
  void operator()(cublasLtMatmulPreferenceOpaque_t* p) const noexcept {
    cublasLtMatmulPreferenceDestroy(p);
  }
};
using LtDescPtr = std::unique_ptr<cublasLtMatmulDescOpaque_t, LtDescDeleter>;
using LtLayoutPtr = std::unique_ptr<cublasLtMatrixLayoutOpaque_t, LtLayoutDeleter>;
using LtPrefPtr = std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, LtPrefDeleter>;

// Everything about one GEMM that does not change from call to call.
struct LtPlan {
  LtDescPtr desc;
  LtLayoutPtr a, b, c, d;  // cuBLASLt's A, B, C, D (= kiln's B, A, C, D)
  cublasLtMatmulAlgo_t algo{};
  std::size_t workspace_bytes = 0;
};

template <class T>
void lt_set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value) {
  KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)));
}
template <class T>
void lt_set(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr,
            const T& value) {
  KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)));
}

inline LtLayoutPtr lt_layout(LtType type, index_t rows, index_t cols, index_t ld) {
  cublasLtMatrixLayout_t layout = nullptr;
  KILN_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&layout, lt_cuda_type(type), static_cast<std::uint64_t>(rows),
                                 static_cast<std::uint64_t>(cols), static_cast<std::int64_t>(ld)));
  return LtLayoutPtr(layout);
}

}  // namespace detail

// The plan key: everything a plan (and a tuned algorithm) is chosen for.
using LtKey = std::array<std::int64_t, 21>;

// What an algorithm chooser is shown when a new plan is built: the request, its plan's descriptor
// and layouts (ready to run), and the heuristic's algorithms, best first.
struct LtChoiceRequest {
  const MatmulArgs& args;
  const LtKey& key;
  cublasLtHandle_t handle;
  const detail::LtPlan& plan;
  const cublasLtMatmulHeuristicResult_t* found;
  int count;
  cudaStream_t stream;
  CachingAllocator& allocator;
};

// Chooses among the heuristic's algorithms for each new plan (mode::max_autotune's LtTuner,
// kiln/backend/cuda/lt_tuner.cuh, times them). Called with the Lt's lock held: it must not call
// back into the Lt. Never called while `stream` is being captured into a CUDA graph (timing
// synchronises); the heuristic's first algorithm serves then.
class LtAlgoChooser {
 public:
  virtual ~LtAlgoChooser() = default;
  // How many of the heuristic's algorithms to ask for (at most Lt::max_candidates).
  virtual int candidates() const = 0;
  // An index into request.found.
  virtual int choose(const LtChoiceRequest& request) = 0;
};

// A cuBLASLt handle, a per-stream workspace and a plan cache. Thread-safe (calls serialise on a
// mutex while they enqueue; the GEMMs themselves run asynchronously on the given stream).
// Destroy an Lt only once the work it queued no longer needs its workspace, or when all that
// work and later users of the allocator share one stream (see allocator.cuh).
class Lt {
 public:
  static constexpr std::size_t default_workspace_bytes = std::size_t{32} << 20;
  // The most heuristic algorithms an LtAlgoChooser is shown.
  static constexpr int max_candidates = 32;

  // workspace_bytes: scratch each GEMM may use (more lets the heuristic choose split-K kernels
  // for small-m/n, large-k shapes); taken from `allocator` on first use per stream.
  explicit Lt(std::size_t workspace_bytes = default_workspace_bytes,
              CachingAllocator& allocator = default_allocator())
      : workspace_bytes_(workspace_bytes), allocator_(&allocator) {
    KILN_CUBLAS_CHECK(cublasLtCreate(&handle_));
  }

  Lt(const Lt&) = delete;
  Lt& operator=(const Lt&) = delete;

  ~Lt() {
    plans_.clear();
    workspaces_.clear();
    cublasLtDestroy(handle_);
  }

  // Every check matmul() makes before touching the GPU; usable without a device.
  // throws: ShapeError (sizes, leading dimensions, aux_ld), ValueError (null pointers, types,
  // epilogue arguments, combinations cuBLASLt does not support).
  static void validate(const MatmulArgs& x) {
    const auto what = [&x] { return detail::describe(x); };
    KILN_CHECK(x.m >= 1 && x.n >= 1 && x.k >= 1, ShapeError, "kiln::cu::Lt: ", what(),
               ": m, n and k must all be at least 1");
    KILN_CHECK(x.a != nullptr && x.b != nullptr && x.d != nullptr, ValueError,
               "kiln::cu::Lt: ", what(),
               ": A, B and D must be device pointers, got a null pointer");

    const index_t a_row = x.trans_a ? x.m : x.k;
    KILN_CHECK(x.lda >= a_row, ShapeError, "kiln::cu::Lt: ", what(), ": A is stored row-major as ",
               x.trans_a ? x.k : x.m, "x", a_row, ", so lda must be at least ", a_row, ", got ",
               x.lda);
    const index_t b_row = x.trans_b ? x.k : x.n;
    KILN_CHECK(x.ldb >= b_row, ShapeError, "kiln::cu::Lt: ", what(), ": B is stored row-major as ",
               x.trans_b ? x.n : x.k, "x", b_row, ", so ldb must be at least ", b_row, ", got ",
               x.ldb);
    KILN_CHECK(x.ldd >= x.n, ShapeError, "kiln::cu::Lt: ", what(), ": D is ", x.m, "x", x.n,
               ", so ldd must be at least ", x.n, ", got ", x.ldd);
    if (x.c != nullptr) {
      KILN_CHECK(x.ldc >= x.n, ShapeError, "kiln::cu::Lt: ", what(), ": C is ", x.m, "x", x.n,
                 ", so ldc must be at least ", x.n, ", got ", x.ldc);
      KILN_CHECK(x.c != x.d || x.ldc == x.ldd, ShapeError, "kiln::cu::Lt: ", what(),
                 ": C and D are the same matrix, so ldc must equal ldd");
    }
    KILN_CHECK(x.beta == 0.0f || x.c != nullptr, ValueError, "kiln::cu::Lt: ", what(),
               ": beta = ", x.beta, " reads C, but C is null (pass c = d to accumulate into D)");

    KILN_CHECK(x.out_type == LtType::f32 || x.out_type == x.in_type, ValueError,
               "kiln::cu::Lt: ", what(), ": the output type must be f32 or the input type (",
               to_string(x.in_type), "), got ", to_string(x.out_type));

    const Epilogue e = x.epilogue;
    const bool wants_bias = epilogue_reads_bias(e) || epilogue_writes_bias_grad(e);
    KILN_CHECK(!wants_bias || x.bias != nullptr, ValueError, "kiln::cu::Lt: ", what(),
               ": this epilogue needs a bias vector of ", epilogue_bias_length(e, x.m, x.n), " ",
               to_string(x.out_type), " elements, but bias is null");
    KILN_CHECK(wants_bias || x.bias == nullptr, ValueError, "kiln::cu::Lt: ", what(),
               ": a bias pointer was given, but this epilogue neither reads a bias nor writes a "
               "bias gradient");
    const bool wants_aux = epilogue_uses_aux(e);
    KILN_CHECK(!wants_aux || x.aux != nullptr, ValueError, "kiln::cu::Lt: ", what(),
               ": this epilogue needs an aux matrix, but aux is null");
    KILN_CHECK(wants_aux || x.aux == nullptr, ValueError, "kiln::cu::Lt: ", what(),
               ": an aux pointer was given, but this epilogue has no aux matrix");
    if (epilogue_uses_relu_mask(e)) {
      KILN_CHECK(x.aux_ld >= x.n && x.aux_ld % 128 == 0, ShapeError, "kiln::cu::Lt: ", what(),
                 ": the ReLU bit-mask's aux_ld counts bits and must be a multiple of 128 and at "
                 "least n = ",
                 x.n, " (use relu_mask_ld(n) = ", relu_mask_ld(x.n), "), got ", x.aux_ld);
    }
    if (epilogue_uses_gelu_aux(e)) {
      KILN_CHECK(x.aux_ld >= x.n && x.aux_ld % 8 == 0, ShapeError, "kiln::cu::Lt: ", what(),
                 ": the GELU aux matrix's aux_ld must be a multiple of 8 and at least n = ", x.n,
                 " (use gelu_aux_ld(n) = ", gelu_aux_ld(x.n), "), got ", x.aux_ld);
    }
    if (e == Epilogue::drelu || e == Epilogue::drelu_bgrad || e == Epilogue::dgelu ||
        e == Epilogue::dgelu_bgrad) {
      KILN_CHECK(x.k >= 2, ShapeError, "kiln::cu::Lt: ", what(), ": cuBLASLt's ", to_string(e),
                 " epilogue does not support k = 1");
    }
    KILN_CHECK(e != Epilogue::bgrada || x.trans_a, ValueError, "kiln::cu::Lt: ", what(),
               ": bgrada needs trans_a = true (cuBLASLt reduces that operand only when it is "
               "transposed); store A as [k, m] or compute the bias gradient separately");
    KILN_CHECK(e != Epilogue::bgradb || !x.trans_b, ValueError, "kiln::cu::Lt: ", what(),
               ": bgradb needs trans_b = false (cuBLASLt reduces that operand only when it is "
               "not transposed); store B as [k, n] or compute the bias gradient separately");
  }

  // Enqueues the GEMM on `stream`. Pointers must stay valid until it has run.
  // throws: LtNoAlgorithm when the heuristic has no kernel for x's plan key (now or before).
  void matmul(const MatmulArgs& x, cudaStream_t stream = nullptr) {
    if (!try_matmul(x, stream)) {
      cublasStatus_t status = CUBLAS_STATUS_NOT_SUPPORTED;
      {
        std::lock_guard<std::mutex> lock(mutex_);  // clear_plans() may have run in between
        if (auto it = no_algorithm_.find(key_of(x)); it != no_algorithm_.end()) status = it->second;
      }
      throw LtNoAlgorithm(::kiln::detail::concat(
          "kiln::cu::Lt: ", detail::describe(x), ": cuBLASLt has no algorithm for this combination (",
          cublas_status_name(status),
          "; asked once per plan); try other transposes, aligned leading dimensions or no epilogue"));
    }
  }

  // matmul() for callers with another way to compute the result: false, and nothing enqueued,
  // when the heuristic has no kernel for x's plan key (remembered: no second query, no throw).
  bool try_matmul(const MatmulArgs& x, cudaStream_t stream = nullptr) {
    validate(x);
    std::lock_guard<std::mutex> lock(mutex_);
    detail::LtPlan* found = plan_for_locked(x, stream);
    if (found == nullptr) return false;
    detail::LtPlan& plan = *found;
    cublasLtMatmulDesc_t desc = plan.desc.get();
    // Pointers change from call to call; the plan was chosen for equally aligned ones.
    if (x.bias != nullptr) detail::lt_set(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, x.bias);
    if (x.aux != nullptr) detail::lt_set(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, x.aux);
    void* workspace = plan.workspace_bytes > 0 ? workspace_for_locked(stream) : nullptr;
    const void* c = x.c != nullptr ? x.c : x.d;  // beta == 0 here: C is not read
    const cublasStatus_t status =
        refuse_execution_ && refuse_execution_(x)
            ? CUBLAS_STATUS_NOT_SUPPORTED
            : cublasLtMatmul(handle_, desc, &x.alpha, x.b, plan.a.get(), x.a, plan.b.get(), &x.beta, c,
                             plan.c.get(), x.d, plan.d.get(), &plan.algo, workspace, plan.workspace_bytes, stream);
    if (status == CUBLAS_STATUS_NOT_SUPPORTED) {
      // The heuristic offered the algorithm and the call refused it (whether cuBLASLt does this
      // is unmeasured: issue 32). Nothing was enqueued: the key is remembered as having no
      // algorithm, and the caller computes the product its other way.
      const Key key = key_of(x);
      plans_.erase(key);
      no_algorithm_.emplace(key, status);
      return false;
    }
    KILN_CUBLAS_CHECK(status);
    return true;
  }

  std::size_t cached_plans() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return plans_.size();
  }

  // Plan keys remembered as having no algorithm.
  std::size_t cached_no_algorithm() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return no_algorithm_.size();
  }

  // Drops the plans and the remembered refusals.
  void clear_plans() {
    std::lock_guard<std::mutex> lock(mutex_);
    plans_.clear();
    no_algorithm_.clear();
  }

  // For tests of the fallbacks on a device where every kernel exists: a new plan key whose
  // arguments satisfy `refuse` is treated as if the heuristic had found no algorithm (and
  // remembered so, until clear_plans()). An empty function stops refusing.
  void simulate_no_algorithm(std::function<bool(const MatmulArgs&)> refuse) {
    std::lock_guard<std::mutex> lock(mutex_);
    refuse_ = std::move(refuse);
  }

  // The same at execution: a planned call whose arguments satisfy `refuse` behaves as if
  // cublasLtMatmul had returned CUBLAS_STATUS_NOT_SUPPORTED (try_matmul: false, key remembered).
  void simulate_not_supported(std::function<bool(const MatmulArgs&)> refuse) {
    std::lock_guard<std::mutex> lock(mutex_);
    refuse_execution_ = std::move(refuse);
  }

  // Lets `chooser` pick each new plan's algorithm among the heuristic's (nullptr: the heuristic's
  // first, as by default). Plans built before are dropped, so every shape meets the chooser.
  void set_algo_chooser(LtAlgoChooser* chooser) {
    std::lock_guard<std::mutex> lock(mutex_);
    chooser_ = chooser;
    plans_.clear();
  }
  LtAlgoChooser* algo_chooser() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return chooser_;
  }

  std::size_t workspace_bytes() const noexcept { return workspace_bytes_; }
  cublasLtHandle_t handle() const noexcept { return handle_; }

  using Key = LtKey;
  static Key key_of(const MatmulArgs& x) {
    const bool tf32 = x.allow_tf32 && x.in_type == LtType::f32;
    const void* c = x.c != nullptr ? x.c : x.d;
    const index_t ldc = x.c != nullptr ? x.ldc : x.ldd;
    return Key{x.m,
               x.n,
               x.k,
               x.trans_a,
               x.trans_b,
               static_cast<std::int64_t>(x.in_type),
               static_cast<std::int64_t>(x.out_type),
               tf32,
               static_cast<std::int64_t>(x.epilogue),
               x.lda,
               x.ldb,
               ldc,
               x.ldd,
               epilogue_uses_aux(x.epilogue) ? x.aux_ld : 0,
               detail::pointer_alignment(x.a),
               detail::pointer_alignment(x.b),
               detail::pointer_alignment(c),
               detail::pointer_alignment(x.d),
               detail::pointer_alignment(x.bias),
               detail::pointer_alignment(x.aux),
               x.bias_f32 && x.out_type != LtType::f32};
  }

 private:
  // x's plan, built on first use; nullptr when the heuristic has (or had) no algorithm for it.
  detail::LtPlan* plan_for_locked(const MatmulArgs& x, cudaStream_t stream) {
    const Key key = key_of(x);
    if (auto it = plans_.find(key); it != plans_.end()) return it->second.get();
    if (no_algorithm_.count(key) != 0) return nullptr;
    if (refuse_ && refuse_(x)) {
      no_algorithm_.emplace(key, CUBLAS_STATUS_NOT_SUPPORTED);
      return nullptr;
    }

    auto plan = std::make_unique<detail::LtPlan>();
    const bool tf32 = x.allow_tf32 && x.in_type == LtType::f32;
    cublasLtMatmulDesc_t desc = nullptr;
    KILN_CUBLAS_CHECK(cublasLtMatmulDescCreate(
        &desc, tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F));
    plan->desc.reset(desc);

    // The swap: cuBLASLt's A is kiln's B and vice versa (file comment).
    const cublasOperation_t op_a = x.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = x.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    detail::lt_set(desc, CUBLASLT_MATMUL_DESC_TRANSA, op_a);
    detail::lt_set(desc, CUBLASLT_MATMUL_DESC_TRANSB, op_b);
    const cublasLtEpilogue_t epilogue = detail::lt_epilogue(x.epilogue);
    detail::lt_set(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue);
    // The heuristic reads the bias / aux pointers' alignment from the descriptor, so set the
    // real ones before asking it.
    if (x.bias != nullptr) detail::lt_set(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, x.bias);
    // A float bias beside a half-precision output; where cuBLASLt has no kernel for the pair its
    // heuristic finds none (LtNoAlgorithm) and the executor falls back to its own kernel.
    if (x.bias_f32 && x.out_type != LtType::f32)
      detail::lt_set(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<std::int32_t>(CUDA_R_32F));
    if (x.aux != nullptr) {
      detail::lt_set(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, x.aux);
      detail::lt_set(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                     static_cast<std::int64_t>(x.aux_ld));
    }

    const index_t ldc = x.c != nullptr ? x.ldc : x.ldd;
    plan->a = x.trans_b ? detail::lt_layout(x.in_type, x.k, x.n, x.ldb)
                        : detail::lt_layout(x.in_type, x.n, x.k, x.ldb);
    plan->b = x.trans_a ? detail::lt_layout(x.in_type, x.m, x.k, x.lda)
                        : detail::lt_layout(x.in_type, x.k, x.m, x.lda);
    plan->c = detail::lt_layout(x.out_type, x.n, x.m, ldc);
    plan->d = detail::lt_layout(x.out_type, x.n, x.m, x.ldd);

    cublasLtMatmulPreference_t pref_raw = nullptr;
    KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref_raw));
    detail::LtPrefPtr pref(pref_raw);
    detail::lt_set(pref_raw, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                   static_cast<std::uint64_t>(workspace_bytes_));
    const void* c = x.c != nullptr ? x.c : x.d;
    detail::lt_set(pref_raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                   detail::pointer_alignment(x.b));
    detail::lt_set(pref_raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                   detail::pointer_alignment(x.a));
    detail::lt_set(pref_raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                   detail::pointer_alignment(c));
    detail::lt_set(pref_raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                   detail::pointer_alignment(x.d));

    // A chooser sees several of the heuristic's algorithms, except during a graph capture.
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    if (chooser_ != nullptr) KILN_CUDA_CHECK(cudaStreamIsCapturing(stream, &capturing));
    const bool choose = chooser_ != nullptr && capturing == cudaStreamCaptureStatusNone;
    // (A std::array: nvcc 13.0 fails with an internal error on std::vector of this struct.)
    std::array<cublasLtMatmulHeuristicResult_t, max_candidates> results{};
    const int asked = choose ? std::clamp(chooser_->candidates(), 1, max_candidates) : 1;
    int found = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
        handle_, desc, plan->a.get(), plan->b.get(), plan->c.get(), plan->d.get(), pref_raw,
        asked, results.data(), &found);
    if (status != CUBLAS_STATUS_SUCCESS || found == 0) {
      no_algorithm_.emplace(key, status == CUBLAS_STATUS_SUCCESS ? CUBLAS_STATUS_NOT_SUPPORTED : status);
      return nullptr;
    }
    int chosen = 0;
    if (choose) {
      chosen = chooser_->choose(
          LtChoiceRequest{x, key, handle_, *plan, results.data(), found, stream, *allocator_});
      KILN_CHECK(chosen >= 0 && chosen < found, ValueError, "kiln::cu::Lt: the algorithm chooser picked #",
                 chosen, " of ", found, " for ", detail::describe(x));
    }
    plan->algo = results[static_cast<std::size_t>(chosen)].algo;
    plan->workspace_bytes = results[static_cast<std::size_t>(chosen)].workspaceSize;

    return plans_.emplace(key, std::move(plan)).first->second.get();
  }

  void* workspace_for_locked(cudaStream_t stream) {
    // One workspace per stream: GEMMs queued on different streams may run at the same time.
    for (auto& [s, buffer] : workspaces_)
      if (s == stream) return buffer.data();
    workspaces_.emplace_back(
        stream, DeviceBuffer<std::byte>(static_cast<index_t>(workspace_bytes_), *allocator_));
    return workspaces_.back().second.data();
  }

  cublasLtHandle_t handle_ = nullptr;
  std::size_t workspace_bytes_;
  CachingAllocator* allocator_;
  mutable std::mutex mutex_;
  std::map<Key, std::unique_ptr<detail::LtPlan>> plans_;
  std::map<Key, cublasStatus_t> no_algorithm_;  // keys the heuristic found nothing for, and why
  std::function<bool(const MatmulArgs&)> refuse_;  // simulate_no_algorithm's filter
  std::function<bool(const MatmulArgs&)> refuse_execution_;  // simulate_not_supported's filter
  LtAlgoChooser* chooser_ = nullptr;                 // set_algo_chooser's
  std::vector<std::pair<cudaStream_t, DeviceBuffer<std::byte>>> workspaces_;
};

}  // namespace kiln::cu
