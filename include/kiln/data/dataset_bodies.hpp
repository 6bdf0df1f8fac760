// kiln/data/dataset_bodies.hpp — the bodies of dataset.hpp's functions: included by it when kiln
// is header-only, compiled once into kiln::kernels otherwise (KILN_COMPILED, kiln/config.hpp).
#pragma once

#include "kiln/data/dataset.hpp"

namespace kiln::data {

KILN_COMPILED Dataset subset(const Dataset& ds, std::span<const index_t> rows) {
  Dataset out;
  out.n = static_cast<index_t>(rows.size());
  out.d = ds.d;
  out.num_classes = ds.num_classes;
  out.sample_shape = ds.sample_shape;
  if (!ds.produce) out.features.resize(static_cast<std::size_t>(out.n * out.d));
  out.labels.resize(rows.size());
  for (std::size_t k = 0; k < rows.size(); ++k) {
    const index_t i = rows[k];
    KILN_CHECK(i >= 0 && i < ds.n, ValueError, "subset: row ", i, " is outside [0, ", ds.n, ")");
    if (!ds.produce && ds.d > 0)
      std::memcpy(out.features.data() + static_cast<index_t>(k) * ds.d,
                  ds.features.data() + i * ds.d, static_cast<std::size_t>(ds.d) * sizeof(float));
    out.labels[k] = ds.labels[static_cast<std::size_t>(i)];
  }
  if (ds.produce) {
    // The parent's produce and the row map, both by value: the subset outlives nothing.
    out.produce = [parent = ds.produce, map = std::vector<index_t>(rows.begin(), rows.end())](
                      index_t row, index_t epoch, std::span<float> values) {
      parent(map[static_cast<std::size_t>(row)], epoch, values);
    };
  }
  return out;
}

KILN_COMPILED Split split(const Dataset& ds, index_t first_count, const SplitOptions& options) {
  KILN_CHECK(first_count >= 0 && first_count <= ds.n, ValueError,
             "split: first_count = ", first_count, " is outside [0, ", ds.n, "]");
  std::vector<index_t> order(static_cast<std::size_t>(ds.n));
  std::iota(order.begin(), order.end(), index_t{0});
  if (options.shuffle) Generator(options.seed).shuffle(order);
  if (options.stratified && ds.n > 0) {
    // Take floor(first_count × class share) of each class in permutation order, then top up
    // from the remaining rows in permutation order; both halves keep permutation order.
    const std::vector<index_t> counts = ds.class_counts();
    std::vector<index_t> quota(counts.size());
    for (std::size_t c = 0; c < counts.size(); ++c) quota[c] = counts[c] * first_count / ds.n;
    std::vector<char> in_first(static_cast<std::size_t>(ds.n), 0);
    index_t taken = 0;
    for (index_t i : order) {
      const auto y = static_cast<std::size_t>(ds.labels[static_cast<std::size_t>(i)]);
      if (y < quota.size() && quota[y] > 0) {
        --quota[y];
        in_first[static_cast<std::size_t>(i)] = 1;
        ++taken;
      }
    }
    for (index_t i : order) {
      if (taken == first_count) break;
      if (!in_first[static_cast<std::size_t>(i)]) {
        in_first[static_cast<std::size_t>(i)] = 1;
        ++taken;
      }
    }
    std::stable_partition(order.begin(), order.end(),
                          [&](index_t i) { return in_first[static_cast<std::size_t>(i)] != 0; });
  }
  const auto cut = order.begin() + first_count;
  const std::vector<index_t> head(order.begin(), cut), tail(cut, order.end());
  return Split{subset(ds, head), subset(ds, tail)};
}

}  // namespace kiln::data
