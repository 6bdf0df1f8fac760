// kiln/data/dataset.hpp — an in-memory labelled dataset, row subsets and a seeded split.
//
// Features are float and row-major [n × d] so a batch is a run of whole rows that a loader copies
// with memcpy; labels are int32 class indices because that is what a cross-entropy kernel
// indexes with. Scaling and standardisation live in kiln/data/normalize.hpp.
#pragma once

#include <kiln/config.hpp>
#include <kiln/core/error.hpp>
#include <kiln/core/random.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <span>
#include <vector>

namespace kiln::data {

struct Dataset {
  std::vector<float> features;       // n × d, row-major
  std::vector<std::int32_t> labels;  // n, each in [0, num_classes)
  index_t n = 0;                     // samples
  index_t d = 0;                     // features per sample
  int num_classes = 0;
  // The shape of one sample before flattening (e.g. {20, 20} for an image); its product is d.
  // Models that need the spatial layout (convolutions) read it; {d} when there is none.
  std::vector<index_t> sample_shape;

  std::span<const float> row(index_t i) const {
    return {features.data() + i * d, static_cast<std::size_t>(d)};
  }
  std::span<float> row(index_t i) { return {features.data() + i * d, static_cast<std::size_t>(d)}; }

  // Samples of each class: counts[c] for c in [0, num_classes).
  std::vector<index_t> class_counts() const {
    std::vector<index_t> counts(static_cast<std::size_t>(std::max(num_classes, 0)), 0);
    for (std::int32_t y : labels)
      if (y >= 0 && y < num_classes) ++counts[static_cast<std::size_t>(y)];
    return counts;
  }

  // Ensures the sizes agree and every label lies in [0, num_classes); throws ValueError naming
  // the first inconsistency. Loaders call it so that a hand-built dataset fails early.
  void validate() const {
    KILN_CHECK(n >= 0 && d >= 0, ValueError, "Dataset: n = ", n, " and d = ", d,
               " must not be negative");
    KILN_CHECK(features.size() == static_cast<std::size_t>(n * d), ValueError,
               "Dataset: features holds ", features.size(), " values, n × d = ", n, " × ", d, " = ",
               n * d);
    KILN_CHECK(labels.size() == static_cast<std::size_t>(n), ValueError, "Dataset: labels holds ",
               labels.size(), " values for n = ", n, " samples");
    KILN_CHECK(num_classes > 0, ValueError, "Dataset: num_classes = ", num_classes,
               " must be positive");
    for (index_t i = 0; i < n; ++i) {
      const std::int32_t y = labels[static_cast<std::size_t>(i)];
      KILN_CHECK(y >= 0 && y < num_classes, ValueError, "Dataset: label ", y, " of sample ", i,
                 " is outside [0, ", num_classes, ")");
    }
    if (!sample_shape.empty()) {
      index_t product = 1;
      for (index_t s : sample_shape) product *= s;
      KILN_CHECK(product == d, ValueError, "Dataset: sample_shape has ", product,
                 " elements but d = ", d);
    }
  }
};

// The rows `rows` of `ds`, in that order (repeats allowed). Throws ValueError for a row outside
// [0, n).
inline Dataset subset(const Dataset& ds, std::span<const index_t> rows) {
  Dataset out;
  out.n = static_cast<index_t>(rows.size());
  out.d = ds.d;
  out.num_classes = ds.num_classes;
  out.sample_shape = ds.sample_shape;
  out.features.resize(static_cast<std::size_t>(out.n * out.d));
  out.labels.resize(rows.size());
  for (std::size_t k = 0; k < rows.size(); ++k) {
    const index_t i = rows[k];
    KILN_CHECK(i >= 0 && i < ds.n, ValueError, "subset: row ", i, " is outside [0, ", ds.n, ")");
    if (ds.d > 0)
      std::memcpy(out.features.data() + static_cast<index_t>(k) * ds.d,
                  ds.features.data() + i * ds.d, static_cast<std::size_t>(ds.d) * sizeof(float));
    out.labels[k] = ds.labels[static_cast<std::size_t>(i)];
  }
  return out;
}

struct Split {
  Dataset first;
  Dataset second;
};

// Splits `ds` into `first_count` rows and the rest. With `shuffle` the rows are drawn by a
// permutation from Generator(seed), so the same seed gives the same split on every machine;
// without it the first rows stay first (for files that are already shuffled). With `stratified`
// each class is split in the same proportion (rounded down per class, the remainder filled from
// the shuffled rest), so a small validation set still sees every class.
struct SplitOptions {
  bool shuffle = true;
  std::uint64_t seed = 0;
  bool stratified = false;
};

inline Split split(const Dataset& ds, index_t first_count, const SplitOptions& options = {}) {
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
