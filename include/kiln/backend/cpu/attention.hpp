// kiln/backend/cpu/attention.hpp — causal scaled-dot-product attention on the CPU, FlashAttention's way.
//
// Queries, keys and values come packed as one GEMM's output, qkv [B, T, 3 * H * hd] (q, then k, then
// v, each H heads of hd features: nanoGPT's c_attn split without a transpose), the result is
// [B, T, H * hd] (the heads side by side, ready for the output projection). Per (sample, head):
//   forward — keys and values in tiles of attention_tile_keys; for every query row that sees a
//     tile, its scores q·kᵀ·scale, the causal mask applied in the tile (keys after the query are
//     never read), an online softmax (running max and sum per row, the row's output rescaled as
//     the max grows); no T×T matrix exists, only a tile's row. Saves each row's log-sum-exp.
//   backward — FlashAttention-2's scheme: Δ_i = dO_i·O_i, then per key tile the probabilities are
//     recomputed from the saved log-sum-exp, P = exp(S − lse), and
//       dV_j += Pᵀ dO,  dP = dO Vᵀ,  dS = P ∘ (dP − Δ),  dQ += dS K·scale,  dK_j += dSᵀ Q·scale.
// With dropout on the probabilities the mask is drawn, not stored: a counter per (pair, query,
// key) of a Philox stream, drawn again by the backward (FlashAttention's way; no T×T mask either).
// Work items are (sample, head) pairs, each summed in one fixed order by one thread: results are
// the same bits at any thread count. Memory is O(tile) per thread plus dQ's T × hd rows.
// Inner loops run over a key tile transposed to [hd][keys] or over hd contiguous features, so the
// compiler vectorises them without reassociating a sum.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <type_traits>
#include <vector>

#include "kiln/config.hpp"
#include "kiln/core/attention_dims.hpp"
#include "kiln/core/random.hpp"
#include "kiln/expr/vmath_float.hpp"

namespace kiln::cpu {

// The sizes of one call (kiln/core/attention_dims.hpp: shared with the CUDA kernel).
using AttentionDims = kiln::AttentionDims;

inline constexpr index_t attention_tile_keys = 64;

namespace detail {

// exp for the probabilities: kiln's inline vector exp for float (libm's expf call would keep the
// loops scalar), std::exp for double (gradient checks).
template <class T>
inline T attention_exp(T x) {
  if constexpr (std::is_same_v<T, float>) return vmath::exp(x);
  else return std::exp(x);
}

// The head width: HD when the kernel was compiled for it (the common 16, 32, 64, 128: the feature
// loops then have fixed trip counts and stay in vector registers), else the run-time value.
// The dropout factor of probability (query i, key j0 + c) for c < n: 1 / (1 - p) kept, 0 dropped.
template <class T>
void dropout_factors(const AttentionDims& dims, index_t pair, index_t i, index_t j0, index_t n, T* z) {
  const T keep = T(1) / (T(1) - T(dims.dropout));
  const std::uint64_t base = dims.mask_counter(pair, i, j0);
  // uniform01(seed, counter) for each counter, from one Philox block per four (a block holds the
  // words of four consecutive counters; uniform01 would compute it again for each of them).
  PhiloxCounter block{};
  std::uint64_t held = ~std::uint64_t(0);
  for (index_t c = 0; c < n; ++c) {
    const std::uint64_t counter = base + std::uint64_t(c);
    if ((counter >> 2) != held) {
      block = random_block(dims.seed, counter);
      held = counter >> 2;
    }
    z[c] = kiln::detail::unit_float_open1(block.v[counter & 3]) >= dims.dropout ? keep : T(0);
  }
}

template <index_t HD>
struct HeadWidth {
  index_t runtime;
  constexpr index_t operator()() const { return HD > 0 ? HD : runtime; }
};

// Kt[d * tile_keys + c] = key (or value) row j0 + c, feature d, for c < n.
template <class T, index_t HD>
void transpose_tile(const T* base, index_t row_stride, index_t j0, index_t n, HeadWidth<HD> hw, T* KILN_RESTRICT kt) {
  const index_t hd = hw();
  for (index_t c = 0; c < n; ++c) {
    const T* r = base + (j0 + c) * row_stride;
    for (index_t d = 0; d < hd; ++d) kt[d * attention_tile_keys + c] = r[d];
  }
}

// s[c] = scale * q · key c of the transposed tile, c < n.
template <class T, index_t HD>
void tile_scores(const T* KILN_RESTRICT q, const T* KILN_RESTRICT kt, index_t n, HeadWidth<HD> hw, T scale,
                 T* KILN_RESTRICT s) {
  const index_t hd = hw();
  for (index_t c = 0; c < n; ++c) s[c] = T(0);
  for (index_t d = 0; d < hd; ++d) {
    const T qd = q[d];
    const T* k = kt + d * attention_tile_keys;
    for (index_t c = 0; c < n; ++c) s[c] += qd * k[c];
  }
  for (index_t c = 0; c < n; ++c) s[c] *= scale;
}

template <class T, index_t HD>
void attention_forward_pairs(const T* qkv, T* out, T* lse, const AttentionDims& dims, index_t begin, index_t end) {
  const HeadWidth<HD> hw{dims.head_dim};
  const index_t T_ = dims.length, H = dims.heads, hd = hw(), W = dims.width(), row = 3 * W;
  const T scale = T(dims.scale);
  constexpr index_t Bc = attention_tile_keys;
  std::vector<T> kt(static_cast<std::size_t>(hd * Bc)), sv(static_cast<std::size_t>(Bc)), zv(static_cast<std::size_t>(Bc));
  std::vector<T> acc(static_cast<std::size_t>(T_ * hd)), m(static_cast<std::size_t>(T_)), l(static_cast<std::size_t>(T_));
  T* KILN_RESTRICT s = sv.data();
  T* KILN_RESTRICT z = zv.data();
  // Dropout is a branch per (query, tile), not a template argument: the same speed, half the
  // instantiations to compile.
  const bool drop = dims.dropout > 0;
  for (index_t p = begin; p < end; ++p) {
    const index_t b = p / H, h = p % H;
    const T* q_base = qkv + b * T_ * row + h * hd;
    const T* k_base = q_base + W;
    const T* v_base = q_base + 2 * W;
    std::fill(acc.begin(), acc.end(), T(0));
    std::fill(m.begin(), m.end(), -std::numeric_limits<T>::infinity());
    std::fill(l.begin(), l.end(), T(0));
    for (index_t j0 = 0; j0 < T_; j0 += Bc) {
      const index_t n = std::min(Bc, T_ - j0);
      transpose_tile(k_base, row, j0, n, hw, kt.data());
      for (index_t i = j0; i < T_; ++i) {
        const index_t cn = std::min(n, i + 1 - j0);  // the causal mask: keys j <= i only
        tile_scores(q_base + i * row, kt.data(), cn, hw, scale, s);
        T mx = s[0];
        for (index_t c = 1; c < cn; ++c) mx = s[c] > mx ? s[c] : mx;
        const T m_old = m[std::size_t(i)];
        const T m_new = mx > m_old ? mx : m_old;
        const T alpha = std::exp(m_old - m_new);  // 0 for the first tile (m_old = -inf)
        T sum = T(0);
        for (index_t c = 0; c < cn; ++c) s[c] = attention_exp(s[c] - m_new);
        for (index_t c = 0; c < cn; ++c) sum += s[c];
        l[std::size_t(i)] = l[std::size_t(i)] * alpha + sum;  // the normaliser: every probability
        m[std::size_t(i)] = m_new;
        if (drop) {  // the output: only the kept ones, scaled
          dropout_factors(dims, p, i, j0, cn, z);
          for (index_t c = 0; c < cn; ++c) s[c] *= z[c];
        }
        T* KILN_RESTRICT a = acc.data() + i * hd;
        if (j0 > 0)
          for (index_t d = 0; d < hd; ++d) a[d] *= alpha;
        for (index_t c = 0; c < cn; ++c) {
          const T pc = s[c];
          const T* KILN_RESTRICT v = v_base + (j0 + c) * row;
          for (index_t d = 0; d < hd; ++d) a[d] += pc * v[d];
        }
      }
    }
    T* o_base = out + b * T_ * W + h * hd;
    T* l_base = lse + p * T_;
    for (index_t i = 0; i < T_; ++i) {
      T* KILN_RESTRICT o = o_base + i * W;
      const T inv = T(1) / l[std::size_t(i)];
      const T* KILN_RESTRICT a = acc.data() + i * hd;
      for (index_t d = 0; d < hd; ++d) o[d] = a[d] * inv;
      l_base[i] = m[std::size_t(i)] + std::log(l[std::size_t(i)]);
    }
  }
}

template <class T, index_t HD>
void attention_backward_pairs(const T* qkv, const T* out, const T* dout, const T* lse, T* dqkv, bool add,
                              const AttentionDims& dims, index_t begin, index_t end) {
  const HeadWidth<HD> hw{dims.head_dim};
  const index_t T_ = dims.length, H = dims.heads, hd = hw(), W = dims.width(), row = 3 * W;
  const T scale = T(dims.scale);
  constexpr index_t Bc = attention_tile_keys;
  std::vector<T> kt(static_cast<std::size_t>(hd * Bc)), vt(static_cast<std::size_t>(hd * Bc));
  std::vector<T> sv(static_cast<std::size_t>(Bc)), dpv(static_cast<std::size_t>(Bc)), dsv(static_cast<std::size_t>(Bc));
  std::vector<T> zv(static_cast<std::size_t>(Bc)), pzv(static_cast<std::size_t>(Bc));
  std::vector<T> dk(static_cast<std::size_t>(Bc * hd)), dv(static_cast<std::size_t>(Bc * hd));
  std::vector<T> dq(static_cast<std::size_t>(T_ * hd)), delta(static_cast<std::size_t>(T_));
  T* KILN_RESTRICT s = sv.data();
  T* KILN_RESTRICT dp = dpv.data();
  T* KILN_RESTRICT ds = dsv.data();
  T* KILN_RESTRICT z = zv.data();
  T* KILN_RESTRICT pz = pzv.data();  // the probabilities as the output used them (dropped, scaled)
  const bool drop = dims.dropout > 0;
  for (index_t p = begin; p < end; ++p) {
    const index_t b = p / H, h = p % H;
    const T* q_base = qkv + b * T_ * row + h * hd;
    const T* k_base = q_base + W;
    const T* v_base = q_base + 2 * W;
    const T* o_base = out + b * T_ * W + h * hd;
    const T* g_base = dout + b * T_ * W + h * hd;
    const T* l_base = lse + p * T_;
    T* dq_base = dqkv + b * T_ * row + h * hd;
    for (index_t i = 0; i < T_; ++i) {
      const T* KILN_RESTRICT o = o_base + i * W;
      const T* KILN_RESTRICT g = g_base + i * W;
      T d = T(0);
      for (index_t f = 0; f < hd; ++f) d += g[f] * o[f];
      delta[std::size_t(i)] = d;
    }
    std::fill(dq.begin(), dq.end(), T(0));
    for (index_t j0 = 0; j0 < T_; j0 += Bc) {
      const index_t n = std::min(Bc, T_ - j0);
      transpose_tile(k_base, row, j0, n, hw, kt.data());
      transpose_tile(v_base, row, j0, n, hw, vt.data());
      std::fill(dk.begin(), dk.end(), T(0));
      std::fill(dv.begin(), dv.end(), T(0));
      for (index_t i = j0; i < T_; ++i) {  // query rows that see some key of this tile
        const index_t cn = std::min(n, i + 1 - j0);
        const T* KILN_RESTRICT q = q_base + i * row;
        const T* KILN_RESTRICT g = g_base + i * W;
        tile_scores(q, kt.data(), cn, hw, scale, s);
        const T li = l_base[i];
        for (index_t c = 0; c < cn; ++c) s[c] = attention_exp(s[c] - li);  // P
        for (index_t c = 0; c < cn; ++c) dp[c] = T(0);
        for (index_t f = 0; f < hd; ++f) {
          const T gf = g[f];
          const T* KILN_RESTRICT v = vt.data() + f * Bc;
          for (index_t c = 0; c < cn; ++c) dp[c] += gf * v[c];
        }
        const T di = delta[std::size_t(i)];
        if (drop) {  // dP of the kept, scaled probabilities; Δ = dO·O already has the mask in O
          dropout_factors(dims, p, i, j0, cn, z);
          for (index_t c = 0; c < cn; ++c) {
            pz[c] = s[c] * z[c];
            dp[c] *= z[c];
          }
        } else {  // P itself (a copy of a tile's row: a branch here, not in the loops below)
          for (index_t c = 0; c < cn; ++c) pz[c] = s[c];
        }
        for (index_t c = 0; c < cn; ++c) ds[c] = s[c] * (dp[c] - di) * scale;
        T* KILN_RESTRICT dqi = dq.data() + i * hd;
        for (index_t c = 0; c < cn; ++c) {
          const T pc = pz[c], dsc = ds[c];
          T* KILN_RESTRICT dvc = dv.data() + c * hd;
          T* KILN_RESTRICT dkc = dk.data() + c * hd;
          const T* KILN_RESTRICT k = k_base + (j0 + c) * row;
          for (index_t f = 0; f < hd; ++f) dvc[f] += pc * g[f];
          for (index_t f = 0; f < hd; ++f) dkc[f] += dsc * q[f];
          for (index_t f = 0; f < hd; ++f) dqi[f] += dsc * k[f];
        }
      }
      for (index_t c = 0; c < n; ++c) {
        T* KILN_RESTRICT dk_row = dq_base + (j0 + c) * row + W;
        T* KILN_RESTRICT dv_row = dk_row + W;
        const T* KILN_RESTRICT dkc = dk.data() + c * hd;
        const T* KILN_RESTRICT dvc = dv.data() + c * hd;
        if (add) {
          for (index_t f = 0; f < hd; ++f) dk_row[f] += dkc[f];
          for (index_t f = 0; f < hd; ++f) dv_row[f] += dvc[f];
        } else {
          for (index_t f = 0; f < hd; ++f) dk_row[f] = dkc[f];
          for (index_t f = 0; f < hd; ++f) dv_row[f] = dvc[f];
        }
      }
    }
    for (index_t i = 0; i < T_; ++i) {
      T* KILN_RESTRICT dq_row = dq_base + i * row;
      const T* KILN_RESTRICT dqi = dq.data() + i * hd;
      if (add)
        for (index_t f = 0; f < hd; ++f) dq_row[f] += dqi[f];
      else
        for (index_t f = 0; f < hd; ++f) dq_row[f] = dqi[f];
    }
  }
}

// f<HD>() for the head width's compiled form.
template <class F>
void with_head_width(index_t hd, F&& f) {
  switch (hd) {
    case 16: f(std::integral_constant<index_t, 16>{}); break;
    case 32: f(std::integral_constant<index_t, 32>{}); break;
    case 64: f(std::integral_constant<index_t, 64>{}); break;
    case 128: f(std::integral_constant<index_t, 128>{}); break;
    default: f(std::integral_constant<index_t, 0>{}); break;
  }
}

}  // namespace detail

// Forward for the (sample, head) pairs [begin, end): out's head columns and lse[(b * H + h) * T + i].
// Key tiles outermost (each transposed once), every query row that sees the tile inside, each row
// keeping its running max, sum and output (T × (hd + 2) values per thread).
template <class T>
void causal_attention_forward(const T* qkv, T* out, T* lse, const AttentionDims& dims, index_t begin, index_t end) {
  detail::with_head_width(dims.head_dim, [&](auto hd) {
    detail::attention_forward_pairs<T, decltype(hd)::value>(qkv, out, lse, dims, begin, end);
  });
}

// Backward for the pairs [begin, end): dqkv's columns of those heads (=, or += when add).
template <class T>
void causal_attention_backward(const T* qkv, const T* out, const T* dout, const T* lse, T* dqkv, bool add,
                               const AttentionDims& dims, index_t begin, index_t end) {
  detail::with_head_width(dims.head_dim, [&](auto hd) {
    detail::attention_backward_pairs<T, decltype(hd)::value>(qkv, out, dout, lse, dqkv, add, dims, begin, end);
  });
}

#if KILN_EXTERN_KERNELS
extern template void causal_attention_forward<float>(const float*, float*, float*, const AttentionDims&, index_t,
                                                     index_t);
extern template void causal_attention_backward<float>(const float*, const float*, const float*, const float*, float*,
                                                      bool, const AttentionDims&, index_t, index_t);
#endif

}  // namespace kiln::cpu
