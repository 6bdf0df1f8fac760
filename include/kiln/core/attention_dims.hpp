// kiln/core/attention_dims.hpp — the sizes of one causal-attention call, shared by the CPU kernel
// (kiln/backend/cpu/attention.hpp) and the CUDA one (kiln/backend/cuda/attention.cuh).
//
// Queries, keys and values come packed as one GEMM's output, qkv [B, T, 3 * H * hd] (q, then k,
// then v, each H heads of hd features: nanoGPT's c_attn split without a transpose); the result is
// [B, T, H * hd]; the log-sum-exp of row i of pair (b, h) is lse[(b * H + h) * T + i].
#pragma once

#include <cstdint>

#include "kiln/config.hpp"

namespace kiln {

struct AttentionDims {
  index_t batch = 0, length = 0, heads = 0, head_dim = 0;
  double scale = 0;  // usually 1 / sqrt(head_dim)
  // Dropout on the probabilities (nanoGPT's attn_dropout): probability p of (pair, query i, key
  // j) is kept when uniform01(seed, offset + (pair * T + i) * T + j) >= dropout and scaled by
  // 1 / (1 - dropout) — the same test as nn::Dropout's, so the CPU and a GPU draw the same mask.
  float dropout = 0;
  std::uint64_t seed = 0, offset = 0;
  KILN_HOST_DEVICE index_t width() const { return heads * head_dim; }
  KILN_HOST_DEVICE index_t pairs() const { return batch * heads; }
  // What the mask draws: one counter per (pair, query, key).
  KILN_HOST_DEVICE std::uint64_t mask_counters() const { return std::uint64_t(pairs() * length * length); }
  // The Philox counter of (pair, query i, key j).
  KILN_HOST_DEVICE std::uint64_t mask_counter(index_t pair, index_t i, index_t j) const {
    return offset + std::uint64_t((pair * length + i) * length + j);
  }
};

}  // namespace kiln
