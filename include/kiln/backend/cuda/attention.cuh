// kiln/backend/cuda/attention.cuh — causal scaled-dot-product attention on the GPU: kiln's own
// kernels, FlashAttention-2's scheme, the CPU kernel's layout and mask (kiln/core/attention_dims.hpp;
// kiln/backend/cpu/attention.hpp is the oracle). Storage in fp32, fp64, bf16 or fp16; arithmetic
// in compute_t (float for the half types: values widened as they load, results rounded once as
// they store; the log-sum-exp kept in float).
//
//   cu::causal_attention_forward(dims, qkv, out, lse, stream);                 // ONE launch
//   cu::causal_attention_backward(dims, qkv, out, dout, lse, dqkv, add, stream);  // ONE launch
//
// Forward: a block per (64 query rows, pair), a thread per query row. Key and value rows come
// through shared memory in tiles; each thread keeps its row's q, its running max and sum and its
// output in registers, rescaling the output only when the max grows (the online softmax, one key
// at a time, so no tile of scores is held). Keys after the query are never read. Saves each row's
// log-sum-exp, nothing else: memory is linear in T.
// Backward: ONE launch of two kinds of blocks (gridDim.z = 2), each recomputing the probabilities
// from the saved log-sum-exp, P = exp(S − lse):
//   z = 0, a thread per query row i:  dQ_i = Σ_j dS_ij K_j · scale,
//   z = 1, a thread per key row j:    dV_j = Σ_i P̃_ij dO_i,  dK_j = Σ_i dS_ij Q_i · scale,
// with dP_ij = dO_i·V_j (times the dropout factor), Δ_i = dO_i·O_i and dS = P ∘ (dP − Δ). The two
// kinds write different columns of dqkv (q, or k and v), so no atomics: every sum runs in one
// thread in a fixed order and results are identical run to run.
// Dropout draws the CPU's mask: uniform01(seed, dims.mask_counter(pair, i, j)) >= p, in both passes.
//
// Status: compiled on every CI run; NOT YET RUN on a GPU (no device was lent when it was written).
// tests/cuda/test_cuda_gpt.cu compares it with the CPU kernel on the first machine that has one.
// It is the correct, general path (any T, head widths up to 128, fp64 for gradient checks), not
// the fast one: no tensor cores, a thread per row. cuDNN's fused attention would be the fast
// bf16 / fp16 path; it is not written (a graph nobody could run here would be guesswork).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kiln/backend/cuda/check.cuh"
#include "kiln/config.hpp"
#include "kiln/core/attention_dims.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/random.hpp"

namespace kiln::cu {

inline constexpr int attention_rows = 64;  // query (or key) rows per block, a thread each
inline constexpr index_t attention_max_head_dim = 128;

// Rows per shared-memory tile: two tiles of HD values in at most 32 KiB (static shared memory
// stays under the 48 KiB every device allows), at most 64.
template <class T, int HD>
constexpr int attention_tile_rows() {
  const int rows = 32768 / (2 * HD * int(sizeof(T)));
  return rows > 64 ? 64 : rows;
}

namespace kernels {

template <class T>
KILN_DEVICE T attention_exp(T x) {
  if constexpr (std::is_same_v<T, float>) return ::expf(x);
  else return ::exp(x);
}
template <class T>
KILN_DEVICE T attention_log(T x) {
  if constexpr (std::is_same_v<T, float>) return ::logf(x);
  else return ::log(x);
}

// The dropout factor of (pair, i, j): 1 / (1 - p) kept, 0 dropped (1 without dropout).
template <class T>
KILN_DEVICE T attention_keep(const AttentionDims& d, index_t pair, index_t i, index_t j, T keep) {
  if (d.dropout <= 0.f) return T(1);
  return uniform01(d.seed, d.mask_counter(pair, i, j)) >= d.dropout ? keep : T(0);
}

// Loads rows [r0, r0 + n) of a [*, row]-strided operand's hd features into tile[c][f] (zeros past
// n rows and hd features), the block's threads striding over the tile.
template <class C, int HD, int Rows, class T>
KILN_DEVICE void load_tile(C (&tile)[Rows][HD], const T* base, index_t row, index_t r0, index_t n, index_t hd) {
  for (int e = int(threadIdx.x); e < Rows * HD; e += int(blockDim.x)) {
    const int c = e / HD, f = e % HD;
    tile[c][f] = (c < n && f < hd) ? convert<C>(base[(r0 + c) * row + f]) : C(0);
  }
}

template <class S, int HD>
KILN_GLOBAL void __launch_bounds__(attention_rows)
    causal_attention_forward(const S* __restrict__ qkv, S* __restrict__ out, compute_t<S>* __restrict__ lse,
                             AttentionDims d) {
  using T = compute_t<S>;  // S is stored, T computed in
  constexpr int Rows = attention_tile_rows<T, HD>();
  __shared__ T ks[Rows][HD];
  __shared__ T vs[Rows][HD];
  const index_t L = d.length, H = d.heads, hd = d.head_dim, W = d.width(), row = 3 * W;
  const index_t pair = blockIdx.y, b = pair / H, h = pair % H;
  const index_t i0 = index_t(blockIdx.x) * attention_rows, i = i0 + threadIdx.x;
  const bool active = i < L;
  const S* q_base = qkv + b * L * row + h * hd;
  const S* k_base = q_base + W;
  const S* v_base = q_base + 2 * W;
  const T scale = T(d.scale), keep = T(1) / (T(1) - T(d.dropout));
  T q[HD], acc[HD];
#pragma unroll
  for (int f = 0; f < HD; ++f) {
    q[f] = (active && f < hd) ? convert<T>(q_base[i * row + f]) : T(0);
    acc[f] = T(0);
  }
  T m = -T(INFINITY), l = T(0);
  const index_t last = (i0 + attention_rows < L ? i0 + attention_rows : L) - 1;  // the block's last row
  for (index_t j0 = 0; j0 <= last; j0 += Rows) {
    const index_t n = L - j0 < Rows ? L - j0 : Rows;
    __syncthreads();  // the previous tile is read by every thread
    load_tile(ks, k_base, row, j0, n, hd);
    load_tile(vs, v_base, row, j0, n, hd);
    __syncthreads();
    if (!active || j0 > i) continue;
    const int cn = int(i + 1 - j0 < n ? i + 1 - j0 : n);  // the causal mask: keys j <= i only
    for (int c = 0; c < cn; ++c) {
      T s = T(0);
#pragma unroll
      for (int f = 0; f < HD; ++f) s += q[f] * ks[c][f];
      s *= scale;
      if (s > m) {  // the max grows: rescale what was summed under the old one (0 at the first key)
        const T alpha = attention_exp(m - s);
        l *= alpha;
#pragma unroll
        for (int f = 0; f < HD; ++f) acc[f] *= alpha;
        m = s;
      }
      const T p = attention_exp(s - m);
      l += p;  // the normaliser: every probability, dropped or not
      const T pz = p * attention_keep(d, pair, i, j0 + c, keep);
#pragma unroll
      for (int f = 0; f < HD; ++f) acc[f] += pz * vs[c][f];
    }
  }
  if (!active) return;
  S* o = out + (b * L + i) * W + h * hd;
  const T inv = T(1) / l;
#pragma unroll
  for (int f = 0; f < HD; ++f)
    if (f < hd) o[f] = convert<S>(acc[f] * inv);
  lse[pair * L + i] = m + attention_log(l);
}

// Δ_i = dO_i · O_i for query row i of pair (b, h), in S's compute type.
template <class S>
KILN_DEVICE compute_t<S> attention_delta(const S* out, const S* dout, index_t b, index_t h, index_t i,
                                         const AttentionDims& d) {
  using T = compute_t<S>;
  const index_t W = d.width(), at = (b * d.length + i) * W + h * d.head_dim;
  T s = T(0);
  for (index_t f = 0; f < d.head_dim; ++f) s += convert<T>(dout[at + f]) * convert<T>(out[at + f]);
  return s;
}

// The backward's shared memory, one set for both kinds of block (32 KiB of tiles at most).
template <class T, int HD>
struct AttentionBackwardTiles {
  static constexpr int rows = attention_tile_rows<T, HD>();
  T a[rows][HD], b[rows][HD];  // keys and values (z = 0), or queries and dO rows (z = 1)
  T lse[rows], delta[rows];
};

template <class S, int HD>
KILN_DEVICE void attention_backward_query(const S* __restrict__ qkv, const S* __restrict__ out,
                                          const S* __restrict__ dout, const compute_t<S>* __restrict__ lse,
                                          S* __restrict__ dqkv, bool add, const AttentionDims& d,
                                          AttentionBackwardTiles<compute_t<S>, HD>& tiles) {
  using T = compute_t<S>;
  constexpr int Rows = attention_tile_rows<T, HD>();
  auto& ks = tiles.a;
  auto& vs = tiles.b;
  const index_t L = d.length, H = d.heads, hd = d.head_dim, W = d.width(), row = 3 * W;
  const index_t pair = blockIdx.y, b = pair / H, h = pair % H;
  const index_t i0 = index_t(blockIdx.x) * attention_rows, i = i0 + threadIdx.x;
  const bool active = i < L;
  const S* q_base = qkv + b * L * row + h * hd;
  const S* k_base = q_base + W;
  const S* v_base = q_base + 2 * W;
  const S* g_row = dout + (b * L + i) * W + h * hd;
  const T scale = T(d.scale), keep = T(1) / (T(1) - T(d.dropout));
  T q[HD], g[HD], dq[HD];
#pragma unroll
  for (int f = 0; f < HD; ++f) {
    q[f] = (active && f < hd) ? convert<T>(q_base[i * row + f]) : T(0);
    g[f] = (active && f < hd) ? convert<T>(g_row[f]) : T(0);
    dq[f] = T(0);
  }
  const T delta = active ? attention_delta(out, dout, b, h, i, d) : T(0);
  const T li = active ? lse[pair * L + i] : T(0);
  const index_t last = (i0 + attention_rows < L ? i0 + attention_rows : L) - 1;
  for (index_t j0 = 0; j0 <= last; j0 += Rows) {
    const index_t n = L - j0 < Rows ? L - j0 : Rows;
    __syncthreads();
    load_tile(ks, k_base, row, j0, n, hd);
    load_tile(vs, v_base, row, j0, n, hd);
    __syncthreads();
    if (!active || j0 > i) continue;
    const int cn = int(i + 1 - j0 < n ? i + 1 - j0 : n);
    for (int c = 0; c < cn; ++c) {
      T s = T(0), dp = T(0);
#pragma unroll
      for (int f = 0; f < HD; ++f) {
        s += q[f] * ks[c][f];
        dp += g[f] * vs[c][f];
      }
      const T p = attention_exp(s * scale - li);
      dp *= attention_keep(d, pair, i, j0 + c, keep);
      const T ds = p * (dp - delta) * scale;
#pragma unroll
      for (int f = 0; f < HD; ++f) dq[f] += ds * ks[c][f];
    }
  }
  if (!active) return;
  S* dst = dqkv + (b * L + i) * row + h * hd;
#pragma unroll
  for (int f = 0; f < HD; ++f)
    if (f < hd) dst[f] = convert<S>(add ? convert<T>(dst[f]) + dq[f] : dq[f]);
}

template <class S, int HD>
KILN_DEVICE void attention_backward_key(const S* __restrict__ qkv, const S* __restrict__ out,
                                        const S* __restrict__ dout, const compute_t<S>* __restrict__ lse,
                                        S* __restrict__ dqkv, bool add, const AttentionDims& d,
                                        AttentionBackwardTiles<compute_t<S>, HD>& tiles) {
  using T = compute_t<S>;
  constexpr int Rows = attention_tile_rows<T, HD>();
  auto& qs = tiles.a;
  auto& gs = tiles.b;
  auto& lse_s = tiles.lse;
  auto& delta_s = tiles.delta;
  const index_t L = d.length, H = d.heads, hd = d.head_dim, W = d.width(), row = 3 * W;
  const index_t pair = blockIdx.y, b = pair / H, h = pair % H;
  const index_t j_first = index_t(blockIdx.x) * attention_rows, j = j_first + threadIdx.x;
  const bool active = j < L;
  const S* q_base = qkv + b * L * row + h * hd;
  const S* g_base = dout + b * L * W + h * hd;
  const T scale = T(d.scale), keep = T(1) / (T(1) - T(d.dropout));
  T k[HD], v[HD], dk[HD], dv[HD];
#pragma unroll
  for (int f = 0; f < HD; ++f) {
    k[f] = (active && f < hd) ? convert<T>(q_base[j * row + W + f]) : T(0);
    v[f] = (active && f < hd) ? convert<T>(q_base[j * row + 2 * W + f]) : T(0);
    dk[f] = T(0);
    dv[f] = T(0);
  }
  // Query rows i >= j see key j: tiles from the block's first key row on.
  for (index_t i0 = j_first; i0 < L; i0 += Rows) {
    const index_t n = L - i0 < Rows ? L - i0 : Rows;
    __syncthreads();
    load_tile(qs, q_base, row, i0, n, hd);
    load_tile(gs, g_base, W, i0, n, hd);
    if (index_t(threadIdx.x) < n) {
      lse_s[threadIdx.x] = lse[pair * L + i0 + threadIdx.x];
      delta_s[threadIdx.x] = attention_delta(out, dout, b, h, i0 + threadIdx.x, d);
    }
    __syncthreads();
    if (!active) continue;
    for (int c = 0; c < n; ++c) {
      const index_t i = i0 + c;
      if (i < j) continue;
      T s = T(0), dp = T(0);
#pragma unroll
      for (int f = 0; f < HD; ++f) {
        s += qs[c][f] * k[f];
        dp += gs[c][f] * v[f];
      }
      const T p = attention_exp(s * scale - lse_s[c]);
      const T z = attention_keep(d, pair, i, j, keep);
      const T ds = p * (dp * z - delta_s[c]) * scale;
      const T pz = p * z;
#pragma unroll
      for (int f = 0; f < HD; ++f) {
        dv[f] += pz * gs[c][f];
        dk[f] += ds * qs[c][f];
      }
    }
  }
  if (!active) return;
  S* dst = dqkv + (b * L + j) * row + W + h * hd;
#pragma unroll
  for (int f = 0; f < HD; ++f)
    if (f < hd) {
      dst[f] = convert<S>(add ? convert<T>(dst[f]) + dk[f] : dk[f]);
      dst[W + f] = convert<S>(add ? convert<T>(dst[W + f]) + dv[f] : dv[f]);
    }
}

template <class S, int HD>
KILN_GLOBAL void __launch_bounds__(attention_rows)
    causal_attention_backward(const S* __restrict__ qkv, const S* __restrict__ out, const S* __restrict__ dout,
                              const compute_t<S>* __restrict__ lse, S* __restrict__ dqkv, bool add, AttentionDims d) {
  __shared__ AttentionBackwardTiles<compute_t<S>, HD> tiles;
  if (blockIdx.z == 0) attention_backward_query<S, HD>(qkv, out, dout, lse, dqkv, add, d, tiles);
  else attention_backward_key<S, HD>(qkv, out, dout, lse, dqkv, add, d, tiles);
}

}  // namespace kernels

namespace detail {

// f(integral_constant<int, HD>) for the smallest compiled head width >= d.head_dim.
template <class F>
void with_attention_head_dim(const AttentionDims& d, F&& f) {
  KILN_CHECK(d.head_dim > 0 && d.head_dim <= attention_max_head_dim, ShapeError,
             "causal_attention on CUDA: head width ", d.head_dim, " is outside the kernel's (0, ",
             attention_max_head_dim, "]");
  if (d.head_dim <= 16) f(std::integral_constant<int, 16>{});
  else if (d.head_dim <= 32) f(std::integral_constant<int, 32>{});
  else if (d.head_dim <= 64) f(std::integral_constant<int, 64>{});
  else f(std::integral_constant<int, 128>{});
}

inline dim3 attention_grid(const AttentionDims& d, unsigned kinds) {
  KILN_CHECK(d.pairs() <= 65535, ShapeError, "causal_attention on CUDA: ", d.batch, " samples x ", d.heads,
             " heads = ", d.pairs(), " pairs, more than the grid's 65535");
  return dim3(unsigned((d.length + attention_rows - 1) / attention_rows), unsigned(d.pairs()), kinds);
}

}  // namespace detail

template <class T>
inline constexpr bool attention_type_v = std::is_same_v<T, float> || std::is_same_v<T, double> ||
                                         std::is_same_v<T, bf16> || std::is_same_v<T, f16>;

// out [B, T, H·hd] and lse [B·H·T] from qkv [B, T, 3·H·hd] (device pointers), on `stream`.
template <class T>
void causal_attention_forward(const AttentionDims& d, const T* qkv, T* out, compute_t<T>* lse, cudaStream_t stream) {
  static_assert(attention_type_v<T>, "kiln::cu::causal_attention_forward: float, double, bf16 or f16");
  if (d.length == 0 || d.pairs() == 0) return;
  detail::with_attention_head_dim(d, [&](auto hd) {
    kernels::causal_attention_forward<T, decltype(hd)::value>
        <<<detail::attention_grid(d, 1), attention_rows, 0, stream>>>(qkv, out, lse, d);
  });
  KILN_CUDA_CHECK(cudaGetLastError());
}

// dqkv (=, or += when add) from dout [B, T, H·hd] and what the forward saved, on `stream`.
template <class T>
void causal_attention_backward(const AttentionDims& d, const T* qkv, const T* out, const T* dout,
                               const compute_t<T>* lse, T* dqkv, bool add, cudaStream_t stream) {
  static_assert(attention_type_v<T>, "kiln::cu::causal_attention_backward: float, double, bf16 or f16");
  if (d.length == 0 || d.pairs() == 0) return;
  detail::with_attention_head_dim(d, [&](auto hd) {
    kernels::causal_attention_backward<T, decltype(hd)::value>
        <<<detail::attention_grid(d, 2), attention_rows, 0, stream>>>(qkv, out, dout, lse, dqkv, add, d);
  });
  KILN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace kiln::cu
