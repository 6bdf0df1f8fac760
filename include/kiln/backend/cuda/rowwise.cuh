// kiln/backend/cuda/rowwise.cuh — the CUDA executor's kernels for work reduced along rows or down
// columns: softmax, layer_norm and cross-entropy rows and a loss's sum over its rows (for_each_row),
// layer_norm's affine gradients and the GEMM-epilogue fallback's bias gradient (column_sums), and
// a few long rows split over several blocks each (row_parts: batch norm's per-channel sums).
//
// Rows: the functor gives `row(team, r)`. A team of threads works on row r — a warp when the row
// has at most warp_row_limit elements, else a block of row_threads. Member rank() reads elements
// rank(), rank() + size(), ... (neighbouring threads, neighbouring addresses: coalesced), and
// team.sum / team.max reduce across the team (warp shuffles, or CUB's BlockReduce) and hand every
// member the same value. The team's shape depends on the row length only and its reductions run
// in a fixed tree order, so a row's result does not depend on the run, the device or the number
// of rows.
//
// Rows in parts: the functor gives `part_type`, `part(team, r, begin, end)` — its reduction of
// elements [begin, end) of row r, the same in every member — and `finish(r, parts, count)`, which
// combines row r's count partials in part order and writes the result. How a row is split
// depends on (rows, len) only (kiln/core/row_parts.hpp), so results are again a fixed function of
// the data and the shape.
//
// Columns: the functor gives `sum_type`, `sums` (K), `terms(r, c, v)` — the K values at (r, c)
// summed down column c (it may also write per-element outputs) — and `finish(c, s)`, which takes
// column c's K sums. Pass 1: a block of 32 columns x 8 lanes covers a tile of column_tile_rows(rows)
// rows; lane y adds rows y, y + 8, ... of its column in order, then the 8 lane sums are added in
// lane order. One tile: pass 1 calls finish. More: pass 1 stores each tile's sums and pass 2 (a
// thread per column) adds them in tile order. No atomics: results are a fixed function of the
// data and (rows, cols), identical run to run.
#pragma once

#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>

#include "kiln/config.hpp"
#include "kiln/core/row_parts.hpp"

namespace kiln::cu {

inline constexpr int warp_size = 32;
inline constexpr int row_threads = 256;  // a block team; the warp kernel runs 8 warps per block
inline constexpr int rows_per_warp_block = row_threads / warp_size;
// Rows up to this long take a warp (at most 32 elements per thread, no block barriers); longer
// ones a block, so that a few long rows still spread over many SMs.
inline constexpr index_t warp_row_limit = 1024;

inline constexpr int column_tile = 32;  // columns per block: a warp reads 32 neighbours of a row
inline constexpr int column_lanes = 8;  // warps per block, each a lane of rows
// Rows per tile of the column sums: at least 256 (32 per lane, to amortise the tile's reduction)
// and at most 1024 tiles, so that tall inputs still give 132 SMs plenty of blocks and pass 2 stays
// short. A function of rows alone: the summation order never depends on the device.
constexpr index_t column_tile_rows(index_t rows) {
  const index_t per = (rows + 1023) / 1024;
  const index_t lanes = (per + column_lanes - 1) / column_lanes * column_lanes;
  return lanes > 256 ? lanes : 256;
}

struct SumOp {
  template <class V>
  KILN_DEVICE V operator()(const V& a, const V& b) const {
    return a + b;
  }
};
// As a left-to-right scan keeps its maximum; NaN makes it order-dependent, which is why a team
// hands every member one thread's result.
struct MaxOp {
  template <class V>
  KILN_DEVICE V operator()(const V& a, const V& b) const {
    return b > a ? b : a;
  }
};

struct WarpTeam {
  int lane;
  KILN_DEVICE int rank() const { return lane; }
  KILN_DEVICE static constexpr int size() { return warp_size; }
  // Butterfly over the 32 lanes, then lane 0's value to all.
  template <class V, class Op>
  KILN_DEVICE V reduce(V v, Op op) const {
    for (int offset = warp_size / 2; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return __shfl_sync(0xffffffffu, v, 0);
  }
  template <class V>
  KILN_DEVICE V sum(V v) const {
    return reduce(v, SumOp{});
  }
  template <class V>
  KILN_DEVICE V max(V v) const {
    return reduce(v, MaxOp{});
  }
};

template <int Threads>
struct BlockTeam {
  KILN_DEVICE int rank() const { return int(threadIdx.x); }
  KILN_DEVICE static constexpr int size() { return Threads; }
  template <class V, class Op>
  KILN_DEVICE V reduce(V v, Op op) const {
    using Reduce = cub::BlockReduce<V, Threads>;
    __shared__ typename Reduce::TempStorage storage;
    __shared__ V result;
    const V total = Reduce(storage).Reduce(v, op);  // valid in thread 0
    if (threadIdx.x == 0) result = total;
    __syncthreads();
    const V out = result;
    __syncthreads();  // the team's next reduction reuses storage and result
    return out;
  }
  template <class V>
  KILN_DEVICE V sum(V v) const {
    return reduce(v, SumOp{});
  }
  template <class V>
  KILN_DEVICE V max(V v) const {
    return reduce(v, MaxOp{});
  }
};

}  // namespace kiln::cu

namespace kiln::cu::kernels {

// Row r = a warp of the block; a grid-stride loop over row groups when rows exceed the grid.
template <class F>
__global__ void __launch_bounds__(row_threads) rows_by_warp(F f, index_t rows) {
  const int warp = int(threadIdx.x) / warp_size;
  const WarpTeam team{int(threadIdx.x) % warp_size};
  for (index_t r = index_t(blockIdx.x) * rows_per_warp_block + warp; r < rows;
       r += index_t(gridDim.x) * rows_per_warp_block)
    f.row(team, r);  // the whole warp takes the same branch: its shuffles see all 32 lanes
}

// Row r = the whole block.
template <class F>
__global__ void __launch_bounds__(row_threads) rows_by_block(F f, index_t rows) {
  const BlockTeam<row_threads> team;
  for (index_t r = blockIdx.x; r < rows; r += gridDim.x) f.row(team, r);
}

// Rows in parts (kiln/core/row_parts.hpp): block b reduces part b % parts.count of row
// b / parts.count with f.part(team, r, begin, end) into partial[b]; a grid-stride loop when the
// parts exceed the grid.
template <class F>
__global__ void __launch_bounds__(row_threads)
    row_parts(F f, index_t rows, index_t len, RowParts parts, typename F::part_type* partial) {
  const BlockTeam<row_threads> team;
  for (index_t b = blockIdx.x; b < rows * parts.count; b += gridDim.x) {
    const index_t r = b / parts.count, p = b % parts.count;
    const auto v = f.part(team, r, parts.begin(p), parts.end(p, len));
    if (threadIdx.x == 0) partial[b] = v;
  }
}

// Row r's partials combined in part order by f.finish (a thread per row).
template <class F>
__global__ void row_parts_finish(F f, index_t rows, index_t count, const typename F::part_type* partial) {
  const index_t r = index_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r < rows) f.finish(r, partial + r * count, count);
}

// Pass 1 of the column sums over rows [tile * tile_rows, ...) of an [rows, cols] range; a block is
// column_tile x column_lanes threads, grid (column tiles, row tiles). partial[(tile * K + k) * cols
// + c] receives the tile's sums when there is more than one tile.
template <class F>
__global__ void __launch_bounds__(column_tile * column_lanes)
    column_partials(F f, index_t rows, index_t cols, index_t tile_rows, typename F::sum_type* partial) {
  using S = typename F::sum_type;
  constexpr int K = F::sums;
  __shared__ S lane_sums[K][column_lanes][column_tile];
  const index_t c = index_t(blockIdx.x) * column_tile + threadIdx.x;
  const index_t begin = index_t(blockIdx.y) * tile_rows;
  const index_t end = begin + tile_rows < rows ? begin + tile_rows : rows;
  S acc[K];
  for (int k = 0; k < K; ++k) acc[k] = S(0);
  if (c < cols) {
    for (index_t r = begin + threadIdx.y; r < end; r += column_lanes) {
      S v[K];
      f.terms(r, c, v);
      for (int k = 0; k < K; ++k) acc[k] += v[k];
    }
  }
  for (int k = 0; k < K; ++k) lane_sums[k][threadIdx.y][threadIdx.x] = acc[k];
  __syncthreads();
  if (threadIdx.y != 0 || c >= cols) return;
  S s[K];
  for (int k = 0; k < K; ++k) {
    s[k] = lane_sums[k][0][threadIdx.x];
    for (int y = 1; y < column_lanes; ++y) s[k] += lane_sums[k][y][threadIdx.x];
  }
  if (gridDim.y == 1) {
    f.finish(c, s);
  } else {
    for (int k = 0; k < K; ++k) partial[(index_t(blockIdx.y) * K + k) * cols + c] = s[k];
  }
}

// Pass 2: column c's tile sums added in tile order, then finish.
template <class F>
__global__ void column_finish(F f, index_t cols, index_t tiles, const typename F::sum_type* partial) {
  using S = typename F::sum_type;
  constexpr int K = F::sums;
  const index_t c = index_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  S s[K];
  for (int k = 0; k < K; ++k) {
    s[k] = partial[index_t(k) * cols + c];
    for (index_t t = 1; t < tiles; ++t) s[k] += partial[(t * K + k) * cols + c];
  }
  f.finish(c, s);
}

}  // namespace kiln::cu::kernels
