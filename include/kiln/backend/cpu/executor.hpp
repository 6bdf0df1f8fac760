// kiln/backend/cpu/executor.hpp — the CPU executor: one loop per elementwise assignment.
//
// The loop over a flat (all-contiguous) expression is a plain indexed loop the compiler
// vectorises; OpenMP splits it across threads when it is large enough to pay for the fork.
// Everything the executor runs is counted in its LaunchStats, and goes through launch(): while a
// training step is captured (mode::reduce_overhead, kiln/backend/cpu/step_graph.hpp) each launch
// is also kept, with its arguments, to be run again on the same buffers.
#pragma once

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/config.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/core/epilogue.hpp"
#include "kiln/core/stats.hpp"
#include "kiln/core/temp_pool.hpp"
#include "kiln/core/view.hpp"
#include "kiln/expr/evaluator.hpp"
#include "kiln/expr/reduce_ops.hpp"
#include "kiln/backend/cpu/epilogue.hpp"
#include "kiln/backend/cpu/gemm.hpp"
#include "kiln/backend/cpu/step_graph.hpp"

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace kiln {

namespace cpu::detail {
using ChunkBody = void (*)(void* body, index_t begin, index_t end);
// [0, n) in t contiguous chunks, body(begin, end) for each: on t OpenMP threads when t > 1. Not
// inlined, so the compiler sees one call through a pointer and keeps each body in one copy.
[[gnu::noinline]] inline void run_chunks(int t, index_t n, ChunkBody f, void* body) {
  if (t <= 1) {
    f(body, 0, n);
    return;
  }
#if defined(_OPENMP)
#pragma omp parallel for num_threads(t) schedule(static)
  for (int k = 0; k < t; ++k) {
    const index_t b = n * k / t, e = n * (k + 1) / t;
    if (b < e) f(body, b, e);
  }
#else
  f(body, 0, n);
#endif
}
}  // namespace cpu::detail

class CpuExecutor {
 public:
  using space = host;
  static constexpr const char* name = "cpu";

  // threads = 0: all OpenMP threads (1 without OpenMP).
  explicit CpuExecutor(int threads = 0) : threads_(threads > 0 ? threads : hardware_threads()) {}

  int threads() const { return threads_; }
  LaunchStats& stats() { return stats_; }
  const LaunchStats& stats() const { return stats_; }
  TempPool<host>& temps() { return temps_; }
  // precision::tf32 asks for TF32 GEMMs; the CPU has no TF32 units, so its GEMMs stay float (a
  // training step says so at start). Kept so a step reads the same on both executors.
  void allow_tf32(bool on) { allow_tf32_ = on; }
  bool tf32() const { return allow_tf32_; }
  // bf16 runs everywhere on the CPU: storage is bf16, arithmetic float (round to nearest even at
  // every store), the same numbers a device computes.
  static constexpr bool supports_bf16() { return true; }
  static constexpr bool tf32_units() { return false; }
  static std::string device_name() { return "the CPU"; }
  // Copies `bytes` within host memory (no kernel is counted).
  void copy(void* dst, const void* src, std::size_t bytes) {
    if (bytes) launch("copy", [dst, src, bytes](std::string_view) { std::memcpy(dst, src, bytes); });
  }

  // Runs f(name) now, as one launch. While a step is captured (begin_capture) a copy of f is also
  // kept in the graph, and StepGraph::replay() runs it again: so f must capture by value, and
  // every buffer it touches must outlive the graph at its address (the capture's pool sees to
  // the buffers allocated during the capture). Launches inside a launch are part of it.
  template <class F>
  void launch(std::string_view name, const F& f) {
    if (capture_ && depth_ == 0) capture_->add(name, f);
    struct Depth {
      CpuExecutor* e;
      explicit Depth(CpuExecutor* x) : e(x) {
        if (e->depth_++ == 0) e->stats_.set_in_launch(true);
      }
      ~Depth() {
        if (--e->depth_ == 0) e->stats_.set_in_launch(false);
      }
    } depth(this);
    f(name);
  }
  using step_graph = cpu::StepGraph;
  // A capture runs the step as it keeps its launches (a CUDA capture does not).
  static constexpr bool capture_runs_work = true;
  // From here until end_capture(), launches are kept in `graph` and host allocations on this
  // thread come from its pool (kiln/core/host_graph_pool.hpp).
  // throws: ValueError when a capture is already under way.
  void begin_capture(cpu::StepGraph& graph) {
    KILN_CHECK(capture_ == nullptr, ValueError, "CpuExecutor::begin_capture: a capture is already under way");
    capture_ = &graph;
    stats_.watch_capture(true);
    detail::capturing_host_pool() = &graph.pool();
  }
  // Ends the capture; the graph is not replayable when a launch was counted outside launch().
  void end_capture() {
    if (!capture_) return;
    capture_->set_not_replayable(stats_.uncaptured());
    stats_.watch_capture(false);
    detail::capturing_host_pool() = nullptr;
    capture_ = nullptr;
  }
  bool capturing() const { return capture_ != nullptr; }
  // Runs a captured step again (its launches count as they run).
  void replay(const cpu::StepGraph& graph, bool = true) { graph.replay(); }

  // mode::max_autotune: every GEMM asks `chooser` for its tuning (null: the heuristics).
  void set_gemm_chooser(cpu::GemmChooser* chooser) { chooser_ = chooser; }
  cpu::GemmChooser* gemm_chooser() const { return chooser_; }

  static int hardware_threads() {
#if defined(_OPENMP)
    return omp_get_max_threads();
#else
    return 1;
#endif
  }

  // Runs body(begin, end) over [0, n) split into contiguous chunks, in parallel when n is at
  // least `grain` and more than one thread is allowed. The body is compiled once, behind a
  // function pointer that one loop calls (detail::run_chunks): inlined here, it would be compiled
  // twice per kernel (serial and OpenMP-outlined), the largest share of a training program's
  // object code. One indirect call per chunk costs nothing beside a kernel's work.
  template <class Body>
  void parallel_for(index_t n, index_t grain, Body&& body) const {
    if (n <= 0) return;
    const int t = int(std::min<index_t>(threads_, std::max<index_t>(1, n / std::max<index_t>(grain, 1))));
    using B = std::remove_reference_t<Body>;
    cpu::detail::run_chunks(t, n, [](void* b, index_t begin, index_t end) { (*static_cast<B*>(b))(begin, end); },
                            const_cast<void*>(static_cast<const void*>(&body)));
  }

  // dst = ev over dst's 2-D fold, as one "kernel". An expression with an erased form
  // (detail::erased_evaluator_t: its static sizes dropped) runs as that form, so one loop is
  // compiled for every size the model's layers have.
  template <class T, class Ext, class Ev>
  void elementwise(const View<T, host, Ext>& dst, const Ev& ev, const std::string& name) {
    if constexpr (detail::runs_erased_v<Ev, Ext>) {
      using DynExt = detail::dyn_extents_t<Ext>;
      elementwise(View<T, host, DynExt>(dst.data(), dst.shape(), dst.strides()), detail::erased_evaluator_t<Ev>(ev),
                  name);
    } else {
      launch(name, [this, dst, ev](std::string_view nm) { elementwise_now(dst, ev, nm); });
    }
  }

  // Runs kernel(r, c) for every element of a [rows, cols] fold as one "kernel" of kind k.
  // The kernel must only write locations owned by its element (parallel execution).
  template <class Kernel>
  void for_each_element(index_t rows, index_t cols, const Kernel& kernel, const char* k, const std::string& name,
                        std::size_t bytes) {
    launch(name, [this, rows, cols, kernel, k, bytes](std::string_view nm) {
      for_each_element_now(rows, cols, kernel, k, nm, bytes);
    });
  }

 private:
  template <class T, class Ext, class Ev>
  void elementwise_now(const View<T, host, Ext>& dst, const Ev& ev, std::string_view name) {
    const Shape& s = dst.shape();
    const index_t n = s.size();
    stats_.count(kind::elementwise, name, n, std::size_t(n) * sizeof(T));
    if (n == 0) return;
    T* KILN_RESTRICT out = dst.data();
    if (ev.flat_ok() && dst.is_contiguous()) {
      parallel_for(n, grain, [&](index_t b, index_t e) {
        const Ev local = ev;  // a private copy keeps its pointers in registers
        index_t i = b;
        if constexpr (Ev::costly_ops >= 2) {  // a chain of transcendentals: tile by tile
          for (; i + flat_tile <= e; i += flat_tile) {
            if constexpr (std::is_same_v<T, typename Ev::value_type>) {
              local.template flat_tile<flat_tile>(i, out + i);  // in place is fine: index j reads only j
            } else {
              typename Ev::value_type tile[flat_tile];
              local.template flat_tile<flat_tile>(i, tile);
              for (int j = 0; j < flat_tile; ++j) out[i + j] = convert<T>(tile[j]);
            }
          }
        }
        for (; i < e; ++i) out[i] = convert<T>(local.flat(i));
      });
      return;
    }
    const index_t rows = s.rows(), cols = s.cols();
    // The destination walks its 2-D fold like a leaf that is not broadcast.
    const LeafStrides d = fold_strides(s, dst.strides(), false, s);
    const index_t dcs = d.cs;
    auto row_start = [&d](index_t r) {
      if (d.nlead == 0) return r * d.rs;
      index_t off = 0;
      for (int i = 0; i < d.nlead; ++i) {
        off += (r % d.lead_dims[std::size_t(i)]) * d.lead_strides[std::size_t(i)];
        r /= d.lead_dims[std::size_t(i)];
      }
      return off;
    };
    if (rows >= threads_ || rows * cols < grain) {
      parallel_for(rows, std::max<index_t>(1, grain / std::max<index_t>(cols, 1)), [&](index_t rb, index_t re) {
        const Ev local = ev;
        for (index_t r = rb; r < re; ++r) {
          T* KILN_RESTRICT row = out + row_start(r);
          for (index_t c = 0; c < cols; ++c) row[c * dcs] = convert<T>(local.at(r, c));
        }
      });
    } else {  // few long rows: split the columns
      for (index_t r = 0; r < rows; ++r) {
        T* KILN_RESTRICT row = out + row_start(r);
        parallel_for(cols, grain, [&](index_t cb, index_t ce) {
          const Ev local = ev;
          for (index_t c = cb; c < ce; ++c) row[c * dcs] = convert<T>(local.at(r, c));
        });
      }
    }
  }

  template <class Kernel>
  void for_each_element_now(index_t rows, index_t cols, const Kernel& kernel, const char* k, std::string_view name,
                            std::size_t bytes) {
    stats_.count(k, name, rows * cols, bytes);
    if (rows == 1) {
      parallel_for(cols, grain, [&](index_t cb, index_t ce) {
        if constexpr (requires { kernel.run_flat(cb, ce); }) {
          if (kernel.flat) return kernel.run_flat(cb, ce);
        }
        for (index_t c = cb; c < ce; ++c) kernel(index_t(0), c);
      });
      return;
    }
    parallel_for(rows, std::max<index_t>(1, grain / std::max<index_t>(cols, 1)), [&](index_t rb, index_t re) {
      for (index_t r = rb; r < re; ++r)
        for (index_t c = 0; c < cols; ++c) kernel(r, c);
    });
  }

 public:
  // C = alpha·op(A)·op(B) + beta·C, row-major (see kiln/backend/cpu/gemm.hpp). C is float (the
  // accumulation type) or T; a half-precision C is rounded once from the float result.
  template <class T, class C>
  void gemm(bool ta, bool tb, index_t m, index_t n, index_t k, float alpha, const T* a, index_t lda, const T* b,
            index_t ldb, float beta, C* c, index_t ldc) {
    const std::size_t bytes = std::size_t(m * k + k * n + m * n) * sizeof(T);
    if constexpr (std::is_same_v<C, cpu::gemm_acc_t<T>>) {
      launch("gemm", [=, this](std::string_view nm) {
        stats_.count(kind::gemm, nm, m * n, bytes);
        run_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      });
    } else {
      static_assert(std::is_same_v<C, T>, "kiln: a CPU GEMM writes float or its input type");
      auto scratch = temps_.take(std::size_t(m * n) * sizeof(cpu::gemm_acc_t<T>));
      auto* f = static_cast<cpu::gemm_acc_t<T>*>(scratch.get());
      launch("gemm", [=, this](std::string_view nm) {
        stats_.count(kind::gemm, nm, m * n, bytes);
        run_gemm_rounded(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, f);
      });
    }
  }

  // ---- GEMM epilogues (kiln/core/epilogue.hpp) ---------------------------------------------
  // Each is ONE counted gemm launch: the GEMM, then one pass over the output it just wrote.

  // Bytes of the aux buffer BiasAct<Act, T> writes for an [m, n] output: the pre-activation z.
  template <class Act, class T>
  static constexpr std::size_t act_aux_bytes(index_t m, index_t n) {
    return is_identity_act_v<Act> ? 0 : std::size_t(m * n) * sizeof(T);
  }
  // Whether a GEMM with inner size k can take a DAct epilogue (always, on the CPU).
  template <class Act>
  static constexpr bool folds_dact(index_t) {
    return true;
  }

  // C = act(alpha·op(A)·op(B) + beta·C + bias[j]), the pre-activation saved to ep.aux (unless
  // null: a forward with no backward to come).
  template <class T, class Act>
  void gemm(bool ta, bool tb, index_t m, index_t n, index_t k, float alpha, const T* a, index_t lda, const T* b,
            index_t ldb, float beta, T* c, index_t ldc, const BiasAct<Act, T>& ep) {
    const std::size_t bytes = std::size_t(m * k + k * n + 2 * m * n) * sizeof(T);
    using Acc = compute_t<T>;
    T* aux = static_cast<T*>(ep.aux);
    const auto* bias = ep.bias;
    if constexpr (std::is_same_v<T, Acc>) {
      launch(bias_act_name<Act>(bias != nullptr), [=, this](std::string_view nm) {
        stats_.count(kind::gemm, nm, m * n, bytes);
        run_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        if (is_identity_act_v<Act> && !bias) return;
        parallel_for(m, std::max<index_t>(1, grain / std::max<index_t>(n, 1)), [&](index_t rb, index_t re) {
          cpu::bias_act_rows<Act>(rb, re, n, c, ldc, c, ldc, bias, aux);
        });
      });
    } else {
      KILN_CHECK(beta == 0.f, ValueError, "a half-precision GEMM with a bias epilogue writes its output (beta must be 0)");
      auto scratch = temps_.take(std::size_t(m * n) * sizeof(Acc));
      Acc* f = static_cast<Acc*>(scratch.get());
      launch(bias_act_name<Act>(bias != nullptr), [=, this](std::string_view nm) {
        stats_.count(kind::gemm, nm, m * n, bytes);
        run_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, 0.f, f, n);
        parallel_for(m, std::max<index_t>(1, grain / std::max<index_t>(n, 1)), [&](index_t rb, index_t re) {
          cpu::bias_act_rows<Act>(rb, re, n, f, n, c, ldc, bias, aux);
        });
      });
    }
  }

  // C = (alpha·op(A)·op(B)) * act'(aux), and ep.dbias[j] (=|+=) the column sums of C.
  template <class T, class Act>
  void gemm(bool ta, bool tb, index_t m, index_t n, index_t k, float alpha, const T* a, index_t lda, const T* b,
            index_t ldb, float beta, T* c, index_t ldc, const DAct<Act, T>& ep) {
    KILN_CHECK(beta == 0.f, ValueError, "gemm with a d", Act::name, " epilogue writes its output (beta must be 0)");
    const std::size_t bytes = std::size_t(m * k + k * n + 3 * m * n) * sizeof(T);
    using Acc = compute_t<T>;
    const T* aux = static_cast<const T*>(ep.aux);
    auto* dbias = ep.dbias;
    const bool add_dbias = ep.add_dbias;
    if constexpr (std::is_same_v<T, Acc>) {
      launch(dact_name<Act>(dbias != nullptr), [=, this](std::string_view nm) {
        stats_.count(kind::gemm, nm, m * n, bytes);
        run_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, 0.f, c, ldc);
        run_dact<Act>(m, n, c, ldc, aux, c, ldc, false, dbias, add_dbias);
      });
    } else {
      auto scratch = temps_.take(std::size_t(m * n) * sizeof(Acc));
      Acc* f = static_cast<Acc*>(scratch.get());
      launch(dact_name<Act>(dbias != nullptr), [=, this](std::string_view nm) {
        stats_.count(kind::gemm, nm, m * n, bytes);
        run_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, 0.f, f, n);
        run_dact<Act>(m, n, static_cast<const Acc*>(f), n, aux, c, ldc, false, dbias, add_dbias);
      });
    }
  }

  // C = alpha·op(A)·op(B) + beta·C, and ep.dbias[i] (=|+=) sum_p op(A)[i, p]; needs ta. C is
  // float (a weight gradient of the float master weights) or T.
  template <class T, class C>
  void gemm(bool ta, bool tb, index_t m, index_t n, index_t k, float alpha, const T* a, index_t lda, const T* b,
            index_t ldb, float beta, C* c, index_t ldc, const BGradA<T>& ep) {
    KILN_CHECK(ta, ValueError, "gemm with a bgrada epilogue needs a transposed A (its rows are summed over k)");
    const std::size_t bytes = std::size_t(m * k + k * n + m * n) * sizeof(T);
    auto* dbias = ep.dbias;
    const bool add_dbias = ep.add_dbias;
    TempPool<host>::Buffer scratch;
    cpu::gemm_acc_t<T>* f = nullptr;
    if constexpr (!std::is_same_v<C, cpu::gemm_acc_t<T>>) {
      scratch = temps_.take(std::size_t(m * n) * sizeof(cpu::gemm_acc_t<T>));
      f = static_cast<cpu::gemm_acc_t<T>*>(scratch.get());
    }
    launch("gemm+bgrada", [=, this](std::string_view nm) {
      stats_.count(kind::gemm, nm, m * n, bytes);
      if constexpr (std::is_same_v<C, cpu::gemm_acc_t<T>>) run_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      else run_gemm_rounded(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, f);
      if (!dbias) return;
      parallel_for(m, std::max<index_t>(1, grain / std::max<index_t>(k, 1)), [&](index_t cb, index_t ce) {
        cpu::col_sums(k, cb, ce, a, lda, dbias, add_dbias);
      });
    });
  }

  // d (=|+=) g * act'(aux) and dbias[j] (=|+=) its column sums, for an [m, n] gradient g with
  // row stride n (aux from a BiasAct epilogue; `out`, the activation's output, is unused here).
  // d or dbias may be null. ONE elementwise launch.
  template <class Act, class T>
  void dact(index_t m, index_t n, const T* g, const void* aux, const T* out, T* d, bool add_d, compute_t<T>* dbias,
            bool add_dbias) {
    (void)out;
    const T* z = static_cast<const T*>(aux);
    launch("dact", [=, this](std::string_view nm) {
      stats_.count(kind::elementwise, nm, m * n, std::size_t(3 * m * n) * sizeof(T));
      run_dact<Act>(m, n, g, n, z, d, n, add_d, dbias, add_dbias);
    });
  }

  // Reduces ev over each row (per_row: out[r] for r < rows) or over everything (out[0]).
  // Sums are pairwise over fixed blocks, so the result does not depend on the thread count.
  // accumulate adds each result to what out holds (a gradient's later contribution) instead of
  // overwriting it, in the same launch.
  // A view's (or variable's) evaluator is reduced as its canonical leaf (detail::canonical_leaf_t:
  // static sizes erased), so one reduction is compiled for every size — once, in kiln::kernels,
  // for the common operators and types (below the class).
  template <class Op, class R, class Ev>
  void reduce(R* out, const Ev& ev, index_t rows, index_t cols, bool per_row, bool accumulate = false) {
    using Leaf = detail::canonical_leaf_t<Ev>;
    if constexpr (!std::is_void_v<Leaf> && !std::is_same_v<Leaf, Ev>)
      reduce_as<Op>(out, Leaf(ev), rows, cols, per_row, accumulate);
    else
      reduce_as<Op>(out, ev, rows, cols, per_row, accumulate);
  }

 private:
  template <class Op, class R, class Ev>
  void reduce_as(R* out, const Ev& ev, index_t rows, index_t cols, bool per_row, bool accumulate) {
    using T = typename Ev::value_type;
    using Acc = typename Op::template acc_t<T>;
    static_assert(std::is_trivially_copyable_v<Acc> && std::is_trivially_destructible_v<Acc>);
    const index_t n = rows * cols;
    const index_t blocks = per_row ? 0 : ev.flat_ok() ? (n + reduce_block - 1) / reduce_block : rows;
    TempPool<host>::Buffer scratch;
    if (!per_row) scratch = temps_.take(std::size_t(std::max<index_t>(blocks, 1)) * sizeof(Acc));
    Acc* partial = static_cast<Acc*>(scratch.get());
    launch(Op::name, [=, this](std::string_view) { reduce_now<Op>(out, ev, rows, cols, per_row, accumulate, partial); });
  }

 private:
  template <class Op, class R, class Ev, class Acc>
  void reduce_now(R* out, const Ev& ev, index_t rows, index_t cols, bool per_row, bool accumulate, Acc* partial);

 public:
  // Elements per block of a whole-tensor reduction: fixed, so results are reproducible.
  static constexpr index_t reduce_block = index_t(1) << 14;

  // Elements per tile when a fused chain holds two or more costly functors (Evaluator's
  // flat_tile): each node's loop over a tile is one short vector loop, and the tiles of a chain
  // stay in L1.
  static constexpr int flat_tile = 256;

  // Elements per thread below which forking threads costs more than it saves.
  static constexpr index_t grain = index_t(1) << 15;

 private:
  // Pairwise (cascade) reduction over [b, e): eight interleaved accumulators at the leaves, so
  // the loop vectorises and rounding error grows like log(n), not n. Never inlined: inlined into
  // itself, a few levels deep, it was one copy of the leaf loop per level.
  template <class Op, class T, class Get>
  [[gnu::noinline]] static auto pairwise(Get&& get, index_t b, index_t e) {
    using Acc = typename Op::template acc_t<T>;
    if (e - b <= 256) {
      Acc lane[8];
      for (auto& l : lane) l = Op::template init<T>();
      index_t i = b;
      for (; i + 8 <= e; i += 8)
        for (int j = 0; j < 8; ++j) lane[j] = Op::combine(lane[j], T(get(i + j)), i + j);
      for (; i < e; ++i) lane[0] = Op::combine(lane[0], T(get(i)), i);
      return Op::merge(Op::merge(Op::merge(lane[0], lane[1]), Op::merge(lane[2], lane[3])),
                       Op::merge(Op::merge(lane[4], lane[5]), Op::merge(lane[6], lane[7])));
    }
    const index_t mid = b + ((e - b) / 2 + 7) / 8 * 8;
    return Op::merge(pairwise<Op, T>(get, b, mid), pairwise<Op, T>(get, mid, e));
  }
  template <class Op, class T, class Acc>
  static Acc merge_tree(const Acc* p, index_t b, index_t e) {
    if (e - b == 1) return p[b];
    const index_t mid = b + (e - b) / 2;
    return Op::merge(merge_tree<Op, T>(p, b, mid), merge_tree<Op, T>(p, mid, e));
  }

  template <class T, class C>
  void run_gemm(bool ta, bool tb, index_t m, index_t n, index_t k, float alpha, const T* a, index_t lda, const T* b,
                index_t ldb, float beta, C* c, index_t ldc) const {
    using Acc = cpu::gemm_acc_t<T>;
    const auto at = ta ? cpu::trans::yes : cpu::trans::no, bt = tb ? cpu::trans::yes : cpu::trans::no;
    if (chooser_) {
      const cpu::gemm_tuning tuning = chooser_->choose(cpu::gemm_type_of<T>, ta, tb, m, n, k, threads_);
      cpu::gemm_tuned<T>(at, bt, m, n, k, Acc(alpha), a, lda, b, ldb, Acc(beta), c, ldc, threads_, tuning);
      return;
    }
    cpu::gemm<T>(at, bt, m, n, k, Acc(alpha), a, lda, b, ldb, Acc(beta), c, ldc, threads_);
  }
  // C (T's compute type, or T) = alpha·op(A)·op(B) + beta·C through a float scratch buffer: a
  // half-precision output is rounded once, from the float result.
  template <class T, class C>
  void run_gemm_rounded(bool ta, bool tb, index_t m, index_t n, index_t k, float alpha, const T* a, index_t lda,
                        const T* b, index_t ldb, float beta, C* c, index_t ldc, cpu::gemm_acc_t<T>* f) {
    using Acc = cpu::gemm_acc_t<T>;
    if (beta != 0.f)
      for (index_t i = 0; i < m; ++i)
        for (index_t j = 0; j < n; ++j) f[i * n + j] = convert<Acc>(c[i * ldc + j]);
    run_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, f, n);
    parallel_for(m, std::max<index_t>(1, grain / std::max<index_t>(n, 1)),
                 [&](index_t rb, index_t re) { cpu::store_rows<C>(rb, re, n, f, n, c, ldc); });
  }
  template <class Act, class T, class G>
  void run_dact(index_t m, index_t n, const G* g, index_t ldg, const T* z, T* d, index_t ldd, bool add_d,
                compute_t<T>* dbias, bool add_dbias) const {
    parallel_for(n, std::max<index_t>(1, grain / std::max<index_t>(m, 1)), [&](index_t cb, index_t ce) {
      cpu::dact_cols<Act>(m, cb, ce, n, g, ldg, z, d, ldd, add_d, dbias, add_dbias);
    });
  }

  int threads_;
  bool allow_tf32_ = false;
  LaunchStats stats_;
  TempPool<host> temps_;
  cpu::StepGraph* capture_ = nullptr;  // the graph being captured, if any
  cpu::GemmChooser* chooser_ = nullptr;  // mode::max_autotune's tuner, if any
  int depth_ = 0;                      // launches under way (a launch may run others)
};

template <class Op, class R, class Ev, class Acc>
void CpuExecutor::reduce_now(R* out, const Ev& ev, index_t rows, index_t cols, bool per_row, bool accumulate,
                           Acc* partial) {
  using T = typename Ev::value_type;
  const index_t n = rows * cols;
  stats_.count(kind::reduce, Op::name, n, std::size_t(n) * sizeof(T));
  if (per_row) {
    parallel_for(rows, std::max<index_t>(1, grain / std::max<index_t>(cols, 1)), [&](index_t rb, index_t re) {
      const Ev local = ev;
      for (index_t r = rb; r < re; ++r) {
        const auto v = Op::finish(pairwise<Op, T>([&](index_t c) { return local.at(r, c); }, 0, cols), cols);
        red::store(out[r], v, accumulate);
      }
    });
    return;
  }
  const bool flat = ev.flat_ok();
  const index_t block = flat ? reduce_block : std::max<index_t>(cols, 1);
  const index_t blocks = flat ? (n + block - 1) / block : rows;
  std::uninitialized_fill_n(partial, std::max<index_t>(blocks, 1), Op::template init<T>());
  parallel_for(blocks, std::max<index_t>(1, grain / block), [&](index_t bb, index_t be) {
    const Ev local = ev;
    for (index_t k = bb; k < be; ++k) {
      if (flat) {
        const index_t b = k * block, e = std::min(n, b + block);
        partial[k] = pairwise<Op, T>([&](index_t i) { return local.flat(i); }, b, e);
      } else {
        Acc a = pairwise<Op, T>([&](index_t c) { return local.at(k, c); }, 0, cols);
        if constexpr (requires { a.i; }) a.i = a.i < 0 ? a.i : a.i + k * cols;  // row index -> flat index
        partial[k] = a;
      }
    }
  });
  const auto v = Op::finish(merge_tree<Op, T>(partial, 0, std::max<index_t>(blocks, 1)), n);
  red::store(out[0], v, accumulate);
}

// kiln::kernels (kiln/config.hpp) compiles the reductions of plain views of float and double —
// sum, mean, max, min over everything or per row, argmax / argmin — once (src/kernels/reduce.cpp).
#define KILN_CPU_REDUCE_INSTANCE(EXTERN, Op, R, T, Ext)                                                         \
  EXTERN template void CpuExecutor::reduce_now<Op, R, Evaluator<View<const T, host, Ext>>,                      \
                                               typename Op::template acc_t<T>>(                                 \
      R*, const Evaluator<View<const T, host, Ext>>&, index_t, index_t, bool, bool, typename Op::template acc_t<T>*);
#define KILN_CPU_REDUCE_TYPE(EXTERN, T, Ext)                                 \
  KILN_CPU_REDUCE_INSTANCE(EXTERN, red::Sum, T, T, Ext)                      \
  KILN_CPU_REDUCE_INSTANCE(EXTERN, red::Mean, T, T, Ext)                     \
  KILN_CPU_REDUCE_INSTANCE(EXTERN, red::Max, T, T, Ext)                      \
  KILN_CPU_REDUCE_INSTANCE(EXTERN, red::Min, T, T, Ext)                      \
  KILN_CPU_REDUCE_INSTANCE(EXTERN, red::ArgMax, std::int64_t, T, Ext)        \
  KILN_CPU_REDUCE_INSTANCE(EXTERN, red::ArgMin, std::int64_t, T, Ext)
namespace cpu::detail {
using matrix_extents = extents<dyn, dyn>;  // the canonical leaf's extents up to rank 2
}  // namespace cpu::detail
#define KILN_CPU_REDUCTIONS(EXTERN)                                \
  KILN_CPU_REDUCE_TYPE(EXTERN, float, cpu::detail::matrix_extents) \
  KILN_CPU_REDUCE_TYPE(EXTERN, double, cpu::detail::matrix_extents)
#if KILN_EXTERN_KERNELS
KILN_CPU_REDUCTIONS(extern)
#endif

template <>
struct executor_for<host> {
  using type = CpuExecutor;
};
template <>
inline CpuExecutor make_executor<host>(int cpu_threads) {
  return CpuExecutor(cpu_threads);
}

}  // namespace kiln
