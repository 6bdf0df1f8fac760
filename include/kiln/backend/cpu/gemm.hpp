// kiln/backend/cpu/gemm.hpp — C = alpha * op(A) * op(B) + beta * C on the CPU.
//
// Row-major with BLAS semantics: op(A) is m x k, op(B) is k x n, C is m x n; element (i, j) of a
// matrix with leading dimension ld sits at [i * ld + j]. beta == 0 never reads C (NaN garbage in
// C is overwritten); alpha == 0 or k == 0 reads neither A nor B. float and double multiply in
// their own type; kiln::f16 and kiln::bf16 inputs are summed and written in float. bf16 runs on
// AMX tiles where the target has them and Linux grants them (gemm_bf16_path::amx, the default
// there), else on AVX512-BF16's vdpbf16ps where the target has it (gemm_bf16_path::native),
// otherwise as an exact emulation in float; they differ in the last bits of sums and in
// denormals (see detail/gemm_kernel_bf16.hpp), not in the error bound.
//
//   kiln::cpu::gemm(trans::no, trans::yes, batch, 256, 400, 1.0f, x, 400, w, 400, 0.0f, y, 256);
//
// gemm() takes the backend chosen with set_gemm_backend (kiln's own kernel by default; CBLAS, when
// the build has one, is an explicit choice for float and double); gemm_own() always runs kiln's
// own blocked kernel.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kiln/config.hpp"
#include "kiln/core/bf16_bulk.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/core/error.hpp"

// Detail headers refuse to compile unless KILN_INTERNAL_INCLUDE is defined; push/pop leaves the
// macro as the includer had it (also when another kiln header already defined it).
#pragma push_macro("KILN_INTERNAL_INCLUDE")
#ifndef KILN_INTERNAL_INCLUDE
#define KILN_INTERNAL_INCLUDE
#endif
#include "kiln/backend/cpu/detail/gemm_args.hpp"
#include "kiln/backend/cpu/detail/gemm_cblas.hpp"
#include "kiln/backend/cpu/detail/gemm_driver.hpp"
#include "kiln/backend/cpu/detail/gemm_kernel_amx.hpp"
#include "kiln/backend/cpu/detail/gemm_kernel_bf16.hpp"
#pragma pop_macro("KILN_INTERNAL_INCLUDE")

namespace kiln::cpu {

// op(X) = X (no) or X^T (yes).
enum class trans { no, yes };

// Who runs float/double products in gemm(). f16/bf16 always run on kiln's own kernel.
enum class gemm_backend { own, cblas };

// True when kiln was built against a CBLAS (KILN_HAVE_CBLAS).
inline constexpr bool gemm_have_cblas =
#if defined(KILN_HAVE_CBLAS)
    true;
#else
    false;
#endif

namespace detail {
inline std::atomic<gemm_backend>& gemm_backend_setting() {
  // kiln's own kernel by default: it measured faster than OpenBLAS on the MLP shapes
  // (bench/gemm, bench/train_step --gemm); CBLAS is an explicit choice.
  static std::atomic<gemm_backend> setting{gemm_backend::own};
  return setting;
}
}  // namespace detail

// Process-wide choice for gemm(). Throws ValueError for cblas in a build without one.
inline void set_gemm_backend(gemm_backend b) {
  KILN_CHECK(b != gemm_backend::cblas || gemm_have_cblas, ValueError,
             "kiln::cpu::set_gemm_backend(cblas): this build has no CBLAS (KILN_HAVE_CBLAS is not "
             "defined); install OpenBLAS and reconfigure, or use gemm_backend::own");
  detail::gemm_backend_setting().store(b, std::memory_order_relaxed);
}
inline gemm_backend current_gemm_backend() noexcept {
  return detail::gemm_backend_setting().load(std::memory_order_relaxed);
}

// How kiln's own kernel multiplies kiln::bf16 inputs:
//   native   AVX512-BF16 vdpbf16ps on bf16 pairs, fp32 accumulators (gemm_have_bf16_native);
//   emulate  converted to float while packing, fp32 FMA kernel: every product exact, sums in
//            float with IEEE denormals;
//   amx      AMX tdpbf16ps on 16 x 16 tiles (gemm_have_bf16_amx()), vdpbf16ps's numerics.
enum class gemm_bf16_path { native, emulate, amx };

// True when the vdpbf16ps kernel is compiled in: the target has AVX512-BF16 (e.g. -march=native
// on Zen 4/5, Cooper Lake, Sapphire Rapids) and KILN_GEMM_BF16_EMULATE is not defined.
inline constexpr bool gemm_have_bf16_native = KILN_GEMM_BF16_NATIVE != 0;

// True when the AMX kernel is compiled in (the target has AMX-TILE and AMX-BF16, e.g.
// -march=native on Sapphire Rapids) and Linux lets this process use the tiles.
inline bool gemm_have_bf16_amx() {
#if KILN_GEMM_BF16_AMX
  return detail::amx_tiles_usable();
#else
  return false;
#endif
}

namespace detail {
inline std::atomic<gemm_bf16_path>& gemm_bf16_setting() {
  static std::atomic<gemm_bf16_path> setting{gemm_have_bf16_amx()      ? gemm_bf16_path::amx
                                             : gemm_have_bf16_native ? gemm_bf16_path::native
                                                                     : gemm_bf16_path::emulate};
  return setting;
}
}  // namespace detail

// Process-wide choice for bf16 products (both gemm and gemm_own): amx by default where it is
// usable, else native where it is compiled in. Throws ValueError for a kernel this build or
// process lacks.
inline void set_gemm_bf16_path(gemm_bf16_path p) {
  KILN_CHECK(p != gemm_bf16_path::native || gemm_have_bf16_native, ValueError,
             "kiln::cpu::set_gemm_bf16_path(native): this build has no vdpbf16ps kernel (the "
             "target lacks AVX512-BF16, or KILN_GEMM_BF16_EMULATE is defined); use "
             "gemm_bf16_path::emulate");
  KILN_CHECK(p != gemm_bf16_path::amx || gemm_have_bf16_amx(), ValueError,
             "kiln::cpu::set_gemm_bf16_path(amx): no AMX kernel here (the target lacks AMX-TILE / "
             "AMX-BF16, KILN_GEMM_BF16_EMULATE is defined, or Linux refused the tile state); use "
             "gemm_bf16_path::native or emulate");
  detail::gemm_bf16_setting().store(p, std::memory_order_relaxed);
}
inline gemm_bf16_path current_gemm_bf16_path() noexcept {
  return detail::gemm_bf16_setting().load(std::memory_order_relaxed);
}

// The type of alpha, beta and C for inputs of type T: float for float/f16/bf16, double for double.
template <class T>
using gemm_acc_t = typename detail::gemm_types<T>::acc;

namespace detail {
template <class T>
void gemm_dispatch(const char* fn, bool use_cblas, trans ta, trans tb, index_t m, index_t n,
                   index_t k, gemm_acc_t<T> alpha, const T* a, index_t lda, const T* b, index_t ldb,
                   gemm_acc_t<T> beta, gemm_acc_t<T>* c, index_t ldc, int threads,
                   const gemm_tuning& tuning = {}) {
  use_cblas = use_cblas || tuning.cblas;
  const bool at = ta == trans::yes, bt = tb == trans::yes;
  check_gemm_args(fn, at, bt, m, n, k, a, lda, b, ldb, c, ldc, threads);
#if defined(KILN_HAVE_CBLAS)
  if constexpr (std::is_same_v<T, gemm_acc_t<T>>) {
    if (use_cblas && cblas_can_take(m, n, k, lda, ldb, ldc)) {
      cblas_gemm(at, bt, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, threads);
      return;
    }
  }
#else
  (void)use_cblas;
#endif
  // op(A)(i, p) = a[i * a_rs + p * a_cs], op(B)(p, j) = b[p * b_ks + j * b_js], C(i, j) = c[i * ldc
  // + j].
  const gemm_problem<T, gemm_acc_t<T>> g{m, n, k, alpha, beta, a, at ? 1 : lda, at ? lda : 1,
                                         b, bt ? 1 : ldb, bt ? ldb : 1, c, ldc, 1};
#if KILN_GEMM_BF16_AMX
  if constexpr (std::is_same_v<T, bf16>) {
    if (current_gemm_bf16_path() == gemm_bf16_path::amx) {
      gemm_blocked<gemm_kernel_amx>(g, threads, tuning);
      return;
    }
  }
#endif
#if KILN_GEMM_BF16_NATIVE
  if constexpr (std::is_same_v<T, bf16>) {
    if (current_gemm_bf16_path() == gemm_bf16_path::native) {
      gemm_blocked<gemm_kernel_bf16>(g, threads, tuning);
      return;
    }
  }
#endif
  gemm_blocked<gemm_kernel_fp<T, gemm_acc_t<T>>>(g, threads, tuning);
}
}  // namespace detail

// Run-time choices for one product (see detail::gemm_tuning); mode::max_autotune picks them.
using detail::gemm_tuning;

// Who picks the tuning of each product an executor runs (mode::max_autotune's tuner,
// kiln/tune/gemm_tuner.hpp); CpuExecutor::set_gemm_chooser installs one.
enum class gemm_type { f32, f64, f16, bf16 };
template <class T>
inline constexpr gemm_type gemm_type_of = std::is_same_v<T, float>    ? gemm_type::f32
                                          : std::is_same_v<T, double> ? gemm_type::f64
                                          : std::is_same_v<T, bf16>   ? gemm_type::bf16
                                                                      : gemm_type::f16;
//
// A function pointer, not a virtual function: at a virtual call GCC speculates on the overriders
// it can see (-fdevirtualize-speculatively) — the autotuner, with its timing code for every GEMM
// type — and compiled them into every program that runs a GEMM, tuned or not (30 KB of object
// code, a second or more of -O3, per translation unit).
class GemmChooser {
 public:
  gemm_tuning choose(gemm_type type, bool ta, bool tb, index_t m, index_t n, index_t k, int threads) {
    return choose_(this, type, ta, tb, m, n, k, threads);
  }

 protected:
  using ChooseFn = gemm_tuning (*)(GemmChooser* self, gemm_type type, bool ta, bool tb, index_t m, index_t n,
                                   index_t k, int threads);
  explicit GemmChooser(ChooseFn choose) : choose_(choose) {}
  ~GemmChooser() = default;

 private:
  ChooseFn choose_;
};

// Block extents and register tile of kiln's own kernel for inputs of type T (the autotuner's
// candidates are built around them).
template <class T>
struct gemm_shape_facts {
  index_t kc, kstep;
  int mr, nr;
  bool prefers_transposed;  // the heuristic's orientation for an m x n product
};
template <class T>
gemm_shape_facts<T> gemm_facts(index_t m, index_t n) {
#if KILN_GEMM_BF16_AMX
  if constexpr (std::is_same_v<T, bf16>)
    if (current_gemm_bf16_path() == gemm_bf16_path::amx) {
      using K = detail::gemm_kernel_amx;
      return {K::kc, K::kstep, K::mr, K::nr, detail::prefer_transposed<K>(m, n)};
    }
#endif
#if KILN_GEMM_BF16_NATIVE
  if constexpr (std::is_same_v<T, bf16>)
    if (current_gemm_bf16_path() == gemm_bf16_path::native) {
      using K = detail::gemm_kernel_bf16;
      return {K::kc, K::kstep, K::mr, K::nr, detail::prefer_transposed<K>(m, n)};
    }
#endif
  using K = detail::gemm_kernel_fp<T, gemm_acc_t<T>>;
  return {K::kc, K::kstep, K::mr, K::nr, detail::prefer_transposed<K>(m, n)};
}

// The packing workspace kiln's own GEMM takes for an m x n x k product of T on `threads` threads
// (one grow-only buffer per calling thread; the memory planner counts the largest).
template <class T>
std::size_t gemm_workspace_bytes(index_t m, index_t n, index_t k, int threads = 1) {
#if KILN_GEMM_BF16_AMX
  if constexpr (std::is_same_v<T, bf16>)
    if (current_gemm_bf16_path() == gemm_bf16_path::amx)
      return detail::gemm_workspace_bytes<detail::gemm_kernel_amx>(m, n, k, threads);
#endif
#if KILN_GEMM_BF16_NATIVE
  if constexpr (std::is_same_v<T, bf16>)
    if (current_gemm_bf16_path() == gemm_bf16_path::native)
      return detail::gemm_workspace_bytes<detail::gemm_kernel_bf16>(m, n, k, threads);
#endif
  return detail::gemm_workspace_bytes<detail::gemm_kernel_fp<T, gemm_acc_t<T>>>(m, n, k, threads);
}

// kiln's own cache-blocked kernel, whatever the backend setting.
// requires: m, n, k >= 0; lda >= row length of A as stored (k when ta == no, m when ta == yes),
//   ldb >= (tb == no ? n : k), ldc >= n, otherwise ShapeError; threads >= 0, otherwise ValueError.
// threads: upper bound on OpenMP threads, 0 = omp_get_max_threads(); small products and calls
//   from inside a parallel region use one. Results do not depend on the thread count.
// Steady state allocates nothing: packing buffers are reused per calling thread.
template <class T>
void gemm_own(trans ta, trans tb, index_t m, index_t n, index_t k, gemm_acc_t<T> alpha, const T* a,
              index_t lda, const T* b, index_t ldb, gemm_acc_t<T> beta, gemm_acc_t<T>* c,
              index_t ldc, int threads = 0) {
  detail::gemm_dispatch("kiln::cpu::gemm_own", false, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta,
                        c, ldc, threads);
}

// gemm_own with the choices `tuning` makes instead of the heuristics' (tuning.cblas: CBLAS for
// float / double where the build has one).
template <class T>
void gemm_tuned(trans ta, trans tb, index_t m, index_t n, index_t k, gemm_acc_t<T> alpha, const T* a,
                index_t lda, const T* b, index_t ldb, gemm_acc_t<T> beta, gemm_acc_t<T>* c, index_t ldc,
                int threads, const gemm_tuning& tuning) {
  detail::gemm_dispatch("kiln::cpu::gemm_tuned", false, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc,
                        threads, tuning);
}

// Same contract as gemm_own; float/double go to CBLAS when current_gemm_backend() is cblas (with
// OpenBLAS, threads > 0 becomes OpenBLAS's process-wide thread count).
template <class T>
void gemm(trans ta, trans tb, index_t m, index_t n, index_t k, gemm_acc_t<T> alpha, const T* a,
          index_t lda, const T* b, index_t ldb, gemm_acc_t<T> beta, gemm_acc_t<T>* c, index_t ldc,
          int threads = 0) {
  detail::gemm_dispatch("kiln::cpu::gemm", current_gemm_backend() == gemm_backend::cblas, ta, tb, m,
                        n, k, alpha, a, lda, b, ldb, beta, c, ldc, threads);
}

// C = round_bf16(op(A) * op(B) + bias [+ C]) for bf16 A, B and C: each value rounded once from its
// float sum (the sum gemm() forms over k in one block: for k past the kernel's block, the last
// bits may differ from gemm()'s) plus column j's bias[j] where column_bias is given (nullptr:
// none), plus C's old value with accumulate (a gradient that already holds a contribution:
// round(float(C) + sum)). On AMX the tiles are rounded as they leave the kernel — no float C in
// memory, which for a convolution's output is 4 bytes written and read back per value; other
// kernels run gemm() into scratch and round. Same requirements as gemm_own; threads likewise.
template <class T>
void gemm_rounded(trans ta, trans tb, index_t m, index_t n, index_t k, const T* a, index_t lda, const T* b,
                  index_t ldb, T* c, index_t ldc, int threads = 0, const float* column_bias = nullptr,
                  bool accumulate = false) {
  static_assert(std::is_same_v<T, bf16>, "kiln::cpu::gemm_rounded: T must be kiln::bf16");
  const bool at = ta == trans::yes, bt = tb == trans::yes;
  detail::check_gemm_args("kiln::cpu::gemm_rounded", at, bt, m, n, k, a, lda, b, ldb, c, ldc, threads);
#if KILN_GEMM_BF16_AMX
  if (current_gemm_bf16_path() == gemm_bf16_path::amx && k > 0) {
    detail::gemm_problem<bf16, float> g{m, n, k, 1.0f, 0.0f, a, at ? 1 : lda, at ? lda : 1,
                                        b, bt ? 1 : ldb, bt ? ldb : 1, nullptr, ldc, 1};
    g.c_low = c;
    g.c_low_bias = column_bias;
    g.c_low_accumulate = accumulate;
    detail::gemm_blocked<detail::gemm_kernel_amx>(g, threads);
    return;
  }
#endif
  thread_local std::vector<float> scratch;
  if (scratch.size() < std::size_t(m * n)) scratch.resize(std::size_t(m * n));
  gemm_own<bf16>(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, scratch.data(), n, threads);
  for (index_t i = 0; i < m; ++i) {
    float* row = scratch.data() + i * n;
    if (column_bias)
      for (index_t j = 0; j < n; ++j) row[j] += column_bias[j];
    if (accumulate) add_round_to_bf16(row, c + i * ldc, n);
    else round_to_bf16(row, c + i * ldc, n);
  }
}

// Rows of an implicit bf16 op(A) (a convolution's patches gathered from the image): rows(ctx, r0,
// count, p0, kc, dst, ld) writes rows [r0, r0 + count) x columns [p0, p0 + kc) of op(A) at
// dst + r * ld (r from 0), kc values each and nothing past them. Called from every thread of the
// product at once, for disjoint rows.
struct gemm_bf16_row_source {
  void (*rows)(const void* ctx, index_t r0, index_t count, index_t p0, index_t kc, bf16* dst, index_t ld);
  const void* ctx;
};

#if KILN_GEMM_BF16_AMX
namespace detail {
// A row source as the AMX kernel's A panels (gemm_kernel_amx.hpp): rows of kw = amx_packed_k(kc)
// words, panel after panel, so every row is 2 * kw values after the one before it; the source
// writes the values, this zeroes each row's tail past kc and the rows past the live ones.
struct amx_rows_from_source {
  const gemm_bf16_row_source* src;
  static void pack(const void* ctx, index_t r0, index_t rows, index_t p0, index_t kc, std::uint32_t* dst) {
    const gemm_bf16_row_source& a = *static_cast<const amx_rows_from_source*>(ctx)->src;
    const index_t ld = 2 * amx_packed_k(kc), padded = round_up(rows, gemm_kernel_amx::mr);
    bf16* out = reinterpret_cast<bf16*>(dst);
    a.rows(a.ctx, r0, rows, p0, kc, out, ld);
    if (kc < ld)
      for (index_t r = 0; r < rows; ++r) std::fill(out + r * ld + kc, out + (r + 1) * ld, bf16{});
    std::fill(out + rows * ld, out + padded * ld, bf16{});
  }
};
}  // namespace detail
#endif

// gemm_rounded (bias and accumulate as there) with op(A) given by its rows (above) instead of a
// matrix in memory, where the bf16 path reads A as rows of k values (AMX: a tile row is 32
// consecutive values of one row of A), so the rows are written straight into the kernel's A
// panels, in cache — for a 3x3 convolution no column matrix of 9x the input is written to memory
// and read back. The same tiles in the same order as gemm_rounded on the explicit matrix: the
// same bits. Returns false, computing nothing, where the current path packs A otherwise
// (vdpbf16ps, the emulation) or k is 0: the caller then writes the matrix and calls gemm_rounded.
template <class T>
bool gemm_rounded_with_a_source(index_t m, index_t n, index_t k, const gemm_bf16_row_source& a, trans tb,
                                const T* b, index_t ldb, T* c, index_t ldc, int threads,
                                const float* column_bias = nullptr, bool accumulate = false) {
  static_assert(std::is_same_v<T, bf16>, "kiln::cpu::gemm_rounded_with_a_source: T must be kiln::bf16");
  const bool bt = tb == trans::yes;
  KILN_CHECK(m >= 0 && n >= 0 && k >= 0 && ldb >= (bt ? k : n) && ldc >= n && threads >= 0 && a.rows != nullptr,
             ShapeError, "kiln::cpu::gemm_rounded_with_a_source: m=", m, " n=", n, " k=", k, " ldb=", ldb,
             " ldc=", ldc, " threads=", threads, a.rows ? "" : " (no row source)");
#if KILN_GEMM_BF16_AMX
  if (current_gemm_bf16_path() != gemm_bf16_path::amx || k == 0) return false;
  detail::gemm_problem<bf16, float> g{m, n, k, 1.0f, 0.0f, nullptr, 0, 0, b, bt ? 1 : ldb, bt ? ldb : 1, nullptr, ldc, 1};
  g.c_low = c;
  g.c_low_bias = column_bias;
  g.c_low_accumulate = accumulate;
  const detail::amx_rows_from_source adapter{&a};
  const detail::gemm_a_source<std::uint32_t> src{&detail::amx_rows_from_source::pack, &adapter};
  detail::gemm_blocked<detail::gemm_kernel_amx>(g, threads, {}, &src);
  return true;
#else
  (void)b, (void)c, (void)column_bias, (void)accumulate;
  return false;
#endif
}

// C = op(A) * op(B) + beta * C where op(A), m x k, packs its own panels (detail::gemm_a_source:
// rows [r0, r0 + rows) x columns [p0, p0 + kc) into panels of gemm_source_rows<T> rows, k-major,
// padding rows zero) instead of being read from memory — an implicit matrix, such as a
// convolution's patches gathered from the image. kiln's own kernel, float or double, whatever
// the backend setting; never computed as C^T. k blocks are at most gemm_source_kc<T>. Same
// blocks, same products, same order as gemm_own on the explicit matrix: the same bits.
template <class T>
inline constexpr int gemm_source_rows = detail::gemm_blocking<T>::mr;
template <class T>
inline constexpr index_t gemm_source_kc = detail::gemm_blocking<T>::kc;
template <class T>
void gemm_with_a_source(index_t m, index_t n, index_t k, const detail::gemm_a_source<T>& a, trans tb,
                        const T* b, index_t ldb, T beta, T* c, index_t ldc, int threads) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "kiln::cpu::gemm_with_a_source: T must be float or double");
  const bool bt = tb == trans::yes;
  KILN_CHECK(m >= 0 && n >= 0 && k >= 0 && ldb >= (bt ? k : n) && ldc >= n && threads >= 0, ShapeError,
             "kiln::cpu::gemm_with_a_source: m=", m, " n=", n, " k=", k, " ldb=", ldb, " ldc=", ldc,
             " threads=", threads);
  const detail::gemm_problem<T, T> g{m, n, k, T(1), beta, nullptr, 0, 0, b, bt ? 1 : ldb, bt ? ldb : 1, c, ldc, 1};
  detail::gemm_blocked<detail::gemm_kernel_fp<T, T>>(g, threads, {}, &a);
}

// kiln::kernels (kiln/config.hpp) compiles the GEMM entry points once per element type — kiln's
// own kernels, packing and blocking, the dispatch to CBLAS — in src/kernels/gemm.cpp.
#define KILN_CPU_GEMM_INSTANCES(EXTERN, T)                                                                   \
  EXTERN template void gemm<T>(trans, trans, index_t, index_t, index_t, gemm_acc_t<T>, const T*, index_t,      \
                               const T*, index_t, gemm_acc_t<T>, gemm_acc_t<T>*, index_t, int);                \
  EXTERN template void gemm_own<T>(trans, trans, index_t, index_t, index_t, gemm_acc_t<T>, const T*, index_t,  \
                                   const T*, index_t, gemm_acc_t<T>, gemm_acc_t<T>*, index_t, int);            \
  EXTERN template void gemm_tuned<T>(trans, trans, index_t, index_t, index_t, gemm_acc_t<T>, const T*, index_t, \
                                     const T*, index_t, gemm_acc_t<T>, gemm_acc_t<T>*, index_t, int,            \
                                     const gemm_tuning&);
#define KILN_CPU_GEMM_SOURCE_INSTANCES(EXTERN, T)                                                    \
  EXTERN template void gemm_with_a_source<T>(index_t, index_t, index_t, const detail::gemm_a_source<T>&, trans, \
                                             const T*, index_t, T, T*, index_t, int);
#define KILN_CPU_GEMM_ROUNDED_INSTANCES(EXTERN) \
  EXTERN template void gemm_rounded<bf16>(trans, trans, index_t, index_t, index_t, const bf16*, index_t, const bf16*, \
                                          index_t, bf16*, index_t, int, const float*, bool);    \
  EXTERN template bool gemm_rounded_with_a_source<bf16>(index_t, index_t, index_t, const gemm_bf16_row_source&, trans, \
                                                        const bf16*, index_t, bf16*, index_t, int, const float*, bool);
#if KILN_EXTERN_KERNELS
KILN_CPU_GEMM_ROUNDED_INSTANCES(extern)
KILN_CPU_GEMM_SOURCE_INSTANCES(extern, float)
KILN_CPU_GEMM_SOURCE_INSTANCES(extern, double)
KILN_CPU_GEMM_INSTANCES(extern, float)
KILN_CPU_GEMM_INSTANCES(extern, double)
KILN_CPU_GEMM_INSTANCES(extern, bf16)
KILN_CPU_GEMM_INSTANCES(extern, f16)
#endif

}  // namespace kiln::cpu
