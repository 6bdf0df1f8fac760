// kiln/backend/cpu/detail/gemm_driver.hpp — the cache-blocked loop nest of kiln's own GEMM
// (GotoBLAS / BLIS order), its packing workspace and its OpenMP split.
//
//   for jc (nc columns of C)            B block kc x nc packed once, shared by all threads (L3)
//     for pc (kc of k)
//       for ic (mc rows of C)   <- split across threads; each packs its own A block (L2)
//         for jr (nr columns)          one B micro-panel stays in L1 ...
//           for ir (mr rows)           ... while the A micro-panels stream past it
//             microkernel
#pragma once

#ifndef KILN_INTERNAL_INCLUDE
#error "kiln/backend/cpu/detail/gemm_driver.hpp is internal: include <kiln/backend/cpu/gemm.hpp>"
#endif

#include <algorithm>
#include <cstddef>
#include <new>

#include "kiln/backend/cpu/detail/gemm_kernel.hpp"
#include "kiln/backend/cpu/detail/gemm_pack.hpp"
#include "kiln/config.hpp"
#include "kiln/core/dtype.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace kiln::cpu::detail {

inline constexpr index_t ceil_div(index_t a, index_t b) { return (a + b - 1) / b; }
inline constexpr index_t round_up(index_t a, index_t b) { return ceil_div(a, b) * b; }

// Below this many multiply-adds a fork/join of the OpenMP team costs more than it saves.
inline constexpr index_t gemm_parallel_min_fma = index_t(1) << 19;

// One grow-only, 64-byte aligned buffer per calling thread: after the first call of a given size
// no GEMM allocates. Worker threads get slices of their caller's buffer, so every allocation (and
// its std::bad_alloc) happens before the parallel region starts.
class gemm_workspace {
 public:
  gemm_workspace() = default;
  gemm_workspace(const gemm_workspace&) = delete;
  gemm_workspace& operator=(const gemm_workspace&) = delete;
  ~gemm_workspace() { release(); }

  void* get(std::size_t bytes) {
    if (bytes > bytes_) {
      release();
      data_ = ::operator new (bytes, std::align_val_t{64});
      bytes_ = bytes;
    }
    return data_;
  }

  static gemm_workspace& this_thread() {
    thread_local gemm_workspace ws;
    return ws;
  }

 private:
  void release() {
    if (data_) ::operator delete (data_, std::align_val_t{64});
    data_ = nullptr;
    bytes_ = 0;
  }
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

// Team size for an m x n x k product: `threads` is an upper bound (0 = OpenMP's default), reduced
// to one for small products and inside an enclosing parallel region (no oversubscription).
inline int gemm_team_size(int threads, index_t m, index_t n, index_t k) {
#ifdef _OPENMP
  if (threads == 1 || m * n * k < gemm_parallel_min_fma) return 1;
  if (threads == 0) {
    if (omp_in_parallel()) return 1;
    threads = omp_get_max_threads();
  }
  return std::max(threads, 1);
#else
  (void)threads, (void)m, (void)n, (void)k;
  return 1;
#endif
}

// [begin, end) of part `i` when `count` items are split into `parts` near-equal ranges.
struct item_range {
  index_t begin, end;
};
inline item_range split_range(index_t count, index_t parts, index_t i) {
  const index_t base = count / parts, extra = count % parts;
  const index_t begin = i * base + std::min(i, extra);
  return {begin, begin + base + (i < extra ? 1 : 0)};
}

// C = beta * C on an m x n block; beta == 0 writes zeros without reading C.
template <class Acc>
inline void scale_c(index_t m, index_t n, Acc beta, Acc* c, index_t ldc) {
  for (index_t i = 0; i < m; ++i) {
    Acc* ci = c + i * ldc;
    if (beta == Acc(0)) {
      std::fill(ci, ci + n, Acc(0));
    } else if (beta != Acc(1)) {
      for (index_t j = 0; j < n; ++j) ci[j] *= beta;
    }
  }
}

// Operands and output of one blocked product, with op(A)(i, p) = a[i * a_rs + p * a_cs],
// op(B)(p, j) = b[p * b_ks + j * b_js] and C(i, j) = c[i * c_rs + j * c_cs]. Strides, not
// transpose flags, so that swapping the roles of A and B is a relabelling (see transposed()).
template <class T, class Acc>
struct gemm_problem {
  index_t m, n, k;
  Acc alpha, beta;
  const T* a;
  index_t a_rs, a_cs;
  const T* b;
  index_t b_ks, b_js;
  Acc* c;
  index_t c_rs, c_cs;
  // Where set (a kernel with tile_rounded, alpha 1, beta 0, C row-major): C is written here
  // instead, each value rounded to bf16 from its sum over the whole of k (one k block), and c
  // is not used. c_low_bias (optional, with c_low): column j's value added to the sum before it
  // is rounded (a convolution's bias, with no float C pass to add it in). c_low_accumulate: C's
  // old value is added too (a gradient that already holds a contribution), each value then
  // round(float(old) + sum), as a pass over a float C would do.
  bf16* c_low = nullptr;
  const float* c_low_bias = nullptr;
  bool c_low_accumulate = false;
};

// The same product written as C^T = op(B)^T op(A)^T.
template <class T, class Acc>
gemm_problem<T, Acc> transposed(const gemm_problem<T, Acc>& g) {
  return {g.n,    g.m, g.k,    g.alpha, g.beta, g.b,    g.b_js,
          g.b_ks, g.a, g.a_cs, g.a_rs,  g.c,    g.c_cs, g.c_rs};
}

// What the loop nest needs from a microkernel, K:
//   packed                   element type of the packed panels
//   mr, nr; kc, mc, nc       register tile and block extents (see gemm_blocking)
//   kstep                    k blocks other than the last are multiples of it
//   packed_k(k)              packed elements per panel row for k values of k
//   pack_a / pack_b(rows, k, src, rs, cs, dst)     gemm_pack.hpp's contract, panels of mr / nr
//   tile(k, ap, bp, c, rs_c, cs_c, alpha, beta, mr, nr)  microkernel's contract
//   tile_rounded(k, ap, bp, c_low, rs_c, bias, acc, mr, nr)   optional: C = round_bf16(Ap * Bp +
//                            bias [+ C]) (c_low above; bias: the tile's nr column values, or
//                            nullptr; acc: C's old values added)
//   reads_a_in_place(kc, lda), tile_in_place(k, a, lda, bp, c, rs_c, cs_c, alpha, beta, nr),
//   tile_rounded_in_place(k, a, lda, bp, c_low, rs_c, bias, acc, nr)   optional: whole mr-row panels of an
//                            op(A) whose rows hold k contiguously are read where they lie, not packed
// gemm_kernel_fp: inputs converted to Acc while packing, multiplied in Acc (f16 and bf16 inputs
// this way are the exact emulation: their products are exact in float). The bf16 kernel is
// gemm_kernel_bf16 (gemm_kernel_bf16.hpp).
template <class T, class Acc>
struct gemm_kernel_fp {
  using packed = Acc;
  using blk = gemm_blocking<Acc>;
  static constexpr int mr = blk::mr, nr = blk::nr;
  static constexpr index_t kc = blk::kc, mc = blk::mc, nc = blk::nc, kstep = 1;
  static constexpr index_t packed_k(index_t k) { return k; }
  static void pack_a(index_t rows, index_t k, const T* src, index_t rs, index_t cs, Acc* dst) {
    pack_panels<mr>(rows, k, src, rs, cs, dst);
  }
  static void pack_b(index_t rows, index_t k, const T* src, index_t rs, index_t cs, Acc* dst) {
    pack_panels<nr>(rows, k, src, rs, cs, dst);
  }
  static void tile(index_t k, const Acc* ap, const Acc* bp, Acc* c, index_t rs_c, index_t cs_c,
                   Acc alpha, Acc beta, int m_live, int n_live) {
    microkernel(k, ap, bp, c, rs_c, cs_c, alpha, beta, m_live, n_live);
  }
#if KILN_GEMM_AVX2
  // fp32 with AVX-512 or AVX2: whole tiles of A (12 or 6 rows) read where they lie
  // (microkernel_rows), unless the rows are a multiple of 2 KiB apart — then the tile's rows' lines
  // fall into one or two L1 sets, beside the B panel's, and evict each other; those are packed as
  // before.
  static constexpr bool reads_a_in_place(index_t, index_t lda)
    requires(std::is_same_v<T, float> && std::is_same_v<Acc, float>)
  {
    return lda % 512 != 0;
  }
  static void tile_in_place(index_t k, const T* a, index_t lda, const Acc* bp, Acc* c, index_t rs_c, index_t cs_c,
                            Acc alpha, Acc beta, int n_live)
    requires(std::is_same_v<T, float> && std::is_same_v<Acc, float>)
  {
    microkernel_rows(k, a, lda, bp, c, rs_c, cs_c, alpha, beta, n_live);
  }
#endif
};

// Share of the multiply-adds that land in C rather than in the zero padding of partial tiles.
template <class K>
double tile_use(index_t m, index_t n) {
  return double(m) / double(round_up(m, K::mr)) * (double(n) / double(round_up(n, K::nr)));
}

// A narrow C (n well under nr, e.g. the 10 logits of a classifier) wastes most of each nr-wide
// tile; computing C^T puts the narrow side on the mr rows instead (n = 10: 83% of the work is
// useful instead of 62%). The transposed tile store costs a few shuffles, hence the margin.
template <class K>
bool prefer_transposed(index_t m, index_t n) {
  return tile_use<K>(n, m) > 1.15 * tile_use<K>(m, n);
}

// Run-time choices for one product, which mode::max_autotune measures (kiln/tune/gemm_tuner.hpp);
// zeros leave each to the heuristics below. Every choice gives a correct product; orientation and
// team give the same bits (each element sums k in the same blocks), another kc sums k in other
// blocks (the last bits may differ).
struct gemm_tuning {
  int orientation = 0;  // 0: prefer_transposed decides; 1: as given; 2: computed as C^T
  int team = 0;         // 0: gemm_team_size decides; otherwise this many threads
  index_t kc = 0;       // 0: balanced k blocks of at most K::kc; otherwise of at most this
  bool cblas = false;   // float / double on CBLAS, where the build has one
  bool operator==(const gemm_tuning&) const = default;
};

// Sizes of one run of the loop nest, fixed before the threads start.
struct gemm_plan {
  index_t kc, mc, nc;  // largest block extents (k blocks and m blocks are balanced)
  index_t mblocks;     // number of ic blocks
  index_t nsplit;      // each ic block's jr range is split this many ways (small m, many threads)
};

// The plan of an m x n x k product (after prefer_transposed) run by `team` threads.
template <class K>
gemm_plan make_gemm_plan(index_t m, index_t n, index_t k, int team, index_t kc_max = K::kc) {
  gemm_plan plan{};
  plan.nc = std::min(K::nc, round_up(n, K::nr));
  // Balanced k blocks, e.g. k = 400 -> 2 x 200 rather than 256 + 144 (fp32, kc = 256).
  plan.kc = std::min(round_up(ceil_div(k, ceil_div(k, kc_max)), K::kstep), k);
  plan.mblocks = ceil_div(m, K::mc);
  plan.nsplit = 1;
  if (team > 1 && plan.mblocks >= team) {
    plan.mblocks = round_up(plan.mblocks, team);  // equal row blocks, one set per thread
  } else if (team > 1) {
    // Too few rows for a block each: threads share a row block (each packs it) and split its
    // columns, which divide evenly down to single panels.
    plan.nsplit = ceil_div(team, plan.mblocks);
  }
  plan.mc = round_up(ceil_div(m, plan.mblocks), K::mr);
  plan.mblocks = ceil_div(m, plan.mc);
  return plan;
}
// Packed elements of the shared B block and of one thread's A block, each 64-byte aligned.
template <class K>
index_t gemm_b_length(const gemm_plan& plan) {
  return round_up(K::packed_k(plan.kc) * plan.nc, index_t(64 / sizeof(typename K::packed)));
}
template <class K>
index_t gemm_a_length(const gemm_plan& plan) {
  return round_up(K::packed_k(plan.kc) * plan.mc, index_t(64 / sizeof(typename K::packed)));
}
// The workspace bytes gemm_blocked<K> takes for an m x n x k product on `threads` (the memory
// planner counts the largest: the buffer only grows).
template <class K>
std::size_t gemm_workspace_bytes(index_t m, index_t n, index_t k, int threads) {
  if (m == 0 || n == 0 || k == 0) return 0;
  if (prefer_transposed<K>(m, n)) std::swap(m, n);
  const int team = gemm_team_size(threads, m, n, k);
  const gemm_plan plan = make_gemm_plan<K>(m, n, k, team);
  return std::size_t(gemm_b_length<K>(plan) + gemm_a_length<K>(plan) * team) * sizeof(typename K::packed);
}

// An op(A) that packs its own panels instead of being read from memory (an implicit matrix: a
// convolution's patches gathered straight from the image, with no column matrix in between).
// pack(ctx, r0, rows, p0, kc, dst) writes rows [r0, r0 + rows) x columns [p0, p0 + kc) of op(A)
// as pack_panels<K::mr> would: panels of mr rows, each k-major, rows past `rows` zero. Called
// from every thread of the product at once, for disjoint row blocks.
template <class P>
struct gemm_a_source {
  void (*pack)(const void* ctx, index_t r0, index_t rows, index_t p0, index_t kc, P* dst);
  const void* ctx;
};

// The loop nest as run by thread `tid` of `team`; with team == 1 it is the whole product.
// a_src: op(A)'s panels come from it (g.a is not read).
template <class K, class T, class Acc>
void gemm_run(const gemm_problem<T, Acc>& g, const gemm_plan& plan, typename K::packed* bbuf,
              typename K::packed* abuf, int tid, int team,
              const gemm_a_source<typename K::packed>* a_src = nullptr) {
  constexpr int MR = K::mr;
  constexpr int NR = K::nr;
  for (index_t jc = 0; jc < g.n; jc += plan.nc) {
    const index_t nc = std::min(plan.nc, g.n - jc);
    const index_t npanels = ceil_div(nc, NR);
    for (index_t pc = 0; pc < g.k; pc += plan.kc) {
      const index_t kc = std::min(plan.kc, g.k - pc);
      const index_t kw = K::packed_k(kc);  // packed elements per panel row
      // Later k blocks add onto what the first one stored.
      const Acc beta = pc == 0 ? g.beta : Acc(1);

      const item_range mine = split_range(npanels, team, tid);
      if (mine.begin < mine.end) {
        const index_t col0 = mine.begin * NR;
        K::pack_b(std::min(nc, mine.end * NR) - col0, kc,
                             g.b + pc * g.b_ks + (jc + col0) * g.b_js, g.b_js, g.b_ks,
                             bbuf + col0 * kw);
      }
#ifdef _OPENMP
      if (team > 1) {
#pragma omp barrier
      }
#endif
      const index_t tasks = plan.mblocks * plan.nsplit;
      for (index_t t = tid; t < tasks; t += team) {
        const index_t ib = t / plan.nsplit;
        const index_t ic = ib * plan.mc;
        const index_t mc = std::min(plan.mc, g.m - ic);
        // A read in place where the kernel can (k contiguous in op(A)'s rows): its whole panels
        // straight from op(A), the last partial one packed alone into abuf.
        bool in_place = false;
        if constexpr (requires { K::reads_a_in_place(kc, g.a_rs); })
          in_place = !a_src && g.a_cs == 1 && K::reads_a_in_place(kc, g.a_rs);
        const index_t whole = in_place ? mc / MR : 0;  // panels read in place
        if (a_src) a_src->pack(a_src->ctx, ic, mc, pc, kc, abuf);
        else if (!in_place) K::pack_a(mc, kc, g.a + ic * g.a_rs + pc * g.a_cs, g.a_rs, g.a_cs, abuf);
        else if (mc % MR) K::pack_a(mc % MR, kc, g.a + (ic + whole * MR) * g.a_rs + pc, g.a_rs, 1, abuf);
        const item_range cols = split_range(npanels, plan.nsplit, t % plan.nsplit);
        for (index_t jp = cols.begin; jp < cols.end; ++jp) {
          const int nr = static_cast<int>(std::min<index_t>(NR, nc - jp * NR));
          const typename K::packed* bp = bbuf + jp * NR * kw;
          Acc* cj = g.c ? g.c + ic * g.c_rs + (jc + jp * NR) * g.c_cs : nullptr;  // null: c_low is written
          const float* bias_j = g.c_low_bias ? g.c_low_bias + jc + jp * NR : nullptr;
          for (index_t ip = 0; ip * MR < mc; ++ip) {
            const int mr = static_cast<int>(std::min<index_t>(MR, mc - ip * MR));
            if constexpr (requires { K::reads_a_in_place(kc, g.a_rs); }) {
              if (ip < whole) {
                const T* ai = g.a + (ic + ip * MR) * g.a_rs + pc;
                if constexpr (requires { K::tile_rounded_in_place(kc, ai, g.a_rs, bp, g.c_low, g.c_rs, bias_j, true, nr); }) {
                  if (g.c_low) {
                    K::tile_rounded_in_place(kc, ai, g.a_rs, bp, g.c_low + (ic + ip * MR) * g.c_rs + jc + jp * NR,
                                             g.c_rs, bias_j, g.c_low_accumulate, nr);
                    continue;
                  }
                }
                K::tile_in_place(kc, ai, g.a_rs, bp, cj + ip * MR * g.c_rs, g.c_rs, g.c_cs, g.alpha, beta, nr);
                continue;
              }
            }
            const typename K::packed* ap = in_place ? abuf : abuf + ip * MR * kw;
            if constexpr (requires { K::tile_rounded(kc, abuf, bp, g.c_low, g.c_rs, bias_j, true, mr, nr); }) {
              if (g.c_low) {
                K::tile_rounded(kc, ap, bp, g.c_low + (ic + ip * MR) * g.c_rs + jc + jp * NR, g.c_rs, bias_j,
                                g.c_low_accumulate, mr, nr);
                continue;
              }
            }
            K::tile(kc, ap, bp, cj + ip * MR * g.c_rs, g.c_rs, g.c_cs, g.alpha, beta, mr, nr);
          }
        }
      }
#ifdef _OPENMP
      // Nobody repacks the shared B block while another thread still reads it.
      if (team > 1) {
#pragma omp barrier
      }
#endif
    }
  }
}

// kiln's own GEMM on validated arguments, with the microkernel and packing of K (above).
// requires: m, n, k >= 0, strides valid for the extents, C row-major (c_cs == 1).
// a_src: op(A) packs itself (see gemm_a_source); the product is then never transposed.
template <class K, class T, class Acc>
void gemm_blocked(gemm_problem<T, Acc> g, int threads, const gemm_tuning& tuning = {},
                  const gemm_a_source<typename K::packed>* a_src = nullptr) {
  using P = typename K::packed;
  if (g.m == 0 || g.n == 0) return;
  if (g.k == 0 || g.alpha == Acc(0)) {  // BLAS: A and B are not read when alpha == 0
    scale_c(g.m, g.n, g.beta, g.c, g.c_rs);
    return;
  }
  if (a_src == nullptr && g.c_low == nullptr &&
      (tuning.orientation == 0 ? prefer_transposed<K>(g.m, g.n) : tuning.orientation == 2))
    g = transposed(g);
  int team = gemm_team_size(threads, g.m, g.n, g.k);
#ifdef _OPENMP
  if (tuning.team > 0) team = omp_in_parallel() ? 1 : tuning.team;
#endif
  // Rounded output: the whole of k in one block, each value rounded once from its whole sum.
  const index_t kc_max = g.c_low ? round_up(g.k, K::kstep) : tuning.kc > 0 ? tuning.kc : K::kc;
  const gemm_plan plan = make_gemm_plan<K>(g.m, g.n, g.k, team, kc_max);

  // Workspace: the shared B block, then one A block per thread, each 64-byte aligned.
  const index_t b_len = gemm_b_length<K>(plan), a_len = gemm_a_length<K>(plan);
  const std::size_t ws_bytes = static_cast<std::size_t>(b_len + a_len * team) * sizeof(P);
  P* ws = static_cast<P*>(gemm_workspace::this_thread().get(ws_bytes));


#ifdef _OPENMP
  if (team > 1) {
#pragma omp parallel num_threads(team)
    {
      // The team may be smaller than asked (OMP_THREAD_LIMIT, dynamic adjustment): use its size.
      const int tid = omp_get_thread_num();
      gemm_run<K>(g, plan, ws, ws + b_len + a_len * tid, tid, omp_get_num_threads(), a_src);
    }
    return;
  }
#endif
  gemm_run<K>(g, plan, ws, ws + b_len, 0, 1, a_src);
}

}  // namespace kiln::cpu::detail
