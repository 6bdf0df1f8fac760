// kiln/core/row_parts.hpp — how a device splits long reduced rows over several blocks.
//
// A per-channel reduction (a batch norm's statistics, its backward sums, a convolution's bias
// gradient) is a few rows of many elements: ResNet-50's first batch norms are 64 rows of 100,352
// at batch 32, so one block per row would leave most of an H200's 132 SMs idle. A row instead
// takes `count` consecutive parts of `chunk` elements, each reduced by one block into a partial
// result; a second kernel combines each row's partials in part order (for_each_row_in_parts,
// kiln/backend/cuda/executor.cuh). The split is a function of (rows, len) alone, so a result never
// depends on the device, and no atomics are used: the same data gives the same bits every run.
#pragma once

#include "kiln/config.hpp"

namespace kiln {

struct RowParts {
  index_t count = 1;  // parts per row
  index_t chunk = 0;  // elements per part (the last may be shorter)

  // Rows x parts reaching 1024 blocks (about 8 per SM of an H200, as the column sums' tiles), with
  // at least min_part elements per part (16 per thread of a 256-thread block: fewer would spend
  // more on the block's reductions than on reading).
  static constexpr index_t target_blocks = 1024;
  static constexpr index_t min_part = 4096;
  static constexpr RowParts of(index_t rows, index_t len) {
    const index_t want = rows > 0 ? (target_blocks + rows - 1) / rows : 1;
    const index_t most = len / min_part;
    index_t count = want < most ? want : most;
    if (count < 1) count = 1;
    const index_t chunk = (len + count - 1) / count;
    // No empty part: ceil(len / count) parts of chunk may already cover len.
    if (chunk > 0) count = (len + chunk - 1) / chunk;
    return {count < 1 ? 1 : count, chunk};
  }
  KILN_HOST_DEVICE index_t begin(index_t part) const { return part * chunk; }
  KILN_HOST_DEVICE index_t end(index_t part, index_t len) const {
    const index_t e = (part + 1) * chunk;
    return e < len ? e : len;
  }
};

}  // namespace kiln
