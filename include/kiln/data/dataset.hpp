// kiln/data/dataset.hpp — a labelled dataset (rows in memory or made on demand), row subsets and
// a seeded split.
//
// Features are float and row-major [n × d] so a batch is a run of whole rows that a loader copies
// with memcpy; labels are int32 class indices because that is what a cross-entropy kernel
// indexes with. Scaling and standardisation live in kiln/data/normalize.hpp.
//
// A dataset too large for memory (12,000 photographs at 3 × 224 × 224 floats are 7 GB) sets
// `produce` instead of filling `features`: the loader calls it for each row of a batch, on its
// worker threads, so decoding overlaps training (kiln/data/image_folder.hpp builds one).
#pragma once

#include <kiln/config.hpp>
#include <kiln/core/error.hpp>
#include <kiln/core/random.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <numeric>
#include <span>
#include <vector>

namespace kiln::data {

struct Dataset {
  std::vector<float> features;       // n × d, row-major; empty when `produce` makes the rows
  std::vector<std::int32_t> labels;  // n, each in [0, num_classes)
  index_t n = 0;                     // samples
  index_t d = 0;                     // features per sample
  int num_classes = 0;
  // The shape of one sample before flattening (e.g. {20, 20} for an image); its product is d.
  // Models that need the spatial layout (convolutions) read it; {d} when there is none.
  std::vector<index_t> sample_shape;
  // Rows made on demand: produce(row, epoch, out) writes row `row` as epoch `epoch` sees it (a
  // random augmentation may differ between epochs) into out (d values). Set, `features` stays
  // empty. It is called from several threads at once (the loader's workers), so it must be
  // thread-safe, and its result must depend on (row, epoch) alone so that batches do not depend
  // on the worker count. A copy of the dataset shares it: capture state by value or shared_ptr.
  std::function<void(index_t row, index_t epoch, std::span<float> out)> produce;

  bool on_demand() const { return static_cast<bool>(produce); }

  // Row i of epoch `epoch` into out (d values): a copy from `features`, or produce's output.
  void read_row(index_t i, index_t epoch, std::span<float> out) const {
    if (produce) {
      produce(i, epoch, out);
    } else if (d > 0) {
      std::memcpy(out.data(), features.data() + i * d, static_cast<std::size_t>(d) * sizeof(float));
    }
  }

  // Row i of `features` (in-memory datasets only; read_row serves both kinds).
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
    if (produce) {
      KILN_CHECK(features.empty(), ValueError, "Dataset: features holds ", features.size(),
                 " values and produce is set (rows come from one or the other: clear features)");
    } else {
      KILN_CHECK(features.size() == static_cast<std::size_t>(n * d), ValueError,
                 "Dataset: features holds ", features.size(), " values, n × d = ", n, " × ", d, " = ",
                 n * d);
    }
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
// [0, n). A subset of an on-demand dataset produces too: its row k is ds's row rows[k], made by
// ds's produce (so random choices follow ds's row: a row repeated in the subset is augmented
// alike within an epoch).
KILN_COMPILED Dataset subset(const Dataset& ds, std::span<const index_t> rows);

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

KILN_COMPILED Split split(const Dataset& ds, index_t first_count, const SplitOptions& options = {});

}  // namespace kiln::data

#if KILN_HEADER_BODIES
#include "kiln/data/dataset_bodies.hpp"
#endif
