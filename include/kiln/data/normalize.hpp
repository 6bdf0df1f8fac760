// kiln/data/normalize.hpp — feature scaling and standardisation, fitted on one dataset and
// applied to others.
//
// Statistics come from the training set only and are then applied unchanged to the test set:
// computing them on the test set would leak it into preprocessing.
//
//   auto norm = kiln::data::fit_normalizer(train, {.scale = 1.0f / 255, .standardize =
//                                                  kiln::data::Standardize::global});
//   norm.apply(train);
//   norm.apply(test);
#pragma once

#include <kiln/config.hpp>
#include <kiln/core/error.hpp>
#include <kiln/data/dataset.hpp>

#include <cmath>
#include <span>
#include <vector>

namespace kiln::data {

enum class Standardize {
  none,         // only multiply by scale
  global,       // one mean and std over every feature value (MNIST's 0.1307 / 0.3081 style)
  per_feature,  // a mean and std for each of the d columns
};

struct NormalizeOptions {
  float scale = 1.0f;  // applied first, e.g. 1/255 for bytes; statistics are of scaled values
  Standardize standardize = Standardize::none;
  // A standard deviation below this (a constant column such as an always-blank image border)
  // is treated as 1: the column is centred but not blown up by a near-zero divisor.
  float min_std = 1e-6f;
};

// x ← (x · scale − mean[j]) · inv_std[j], with j the feature (per_feature) or 0 (global); mean
// and inv_std are empty for Standardize::none.
struct Normalizer {
  float scale = 1.0f;
  Standardize standardize = Standardize::none;
  std::vector<float> mean;
  std::vector<float> inv_std;
  index_t d = 0;  // the feature count it was fitted on; apply() checks it

  // Normalises rows of a [rows × d] buffer in place (e.g. a batch).
  void apply(std::span<float> values, index_t dim) const {
    KILN_CHECK(dim == d, ValueError, "Normalizer: fitted on ", d, " features, applied to ", dim);
    KILN_CHECK(dim == 0 || values.size() % static_cast<std::size_t>(dim) == 0, ValueError,
               "Normalizer: ", values.size(), " values are not whole rows of ", dim);
    if (standardize == Standardize::none) {
      for (float& x : values) x *= scale;
      return;
    }
    const bool per_feature = standardize == Standardize::per_feature;
    for (std::size_t i = 0; i < values.size(); ++i) {
      const std::size_t j = per_feature ? i % static_cast<std::size_t>(dim) : 0;
      values[i] = (values[i] * scale - mean[j]) * inv_std[j];
    }
  }
  // In-memory datasets only: an on-demand one (Dataset::produce) normalises inside produce.
  void apply(Dataset& ds) const {
    KILN_CHECK(!ds.produce, ValueError,
               "Normalizer: the dataset makes its rows on demand (Dataset::produce); normalise them there "
               "(ImageTransform's mean and stddev) or in the loader's transform");
    apply(ds.features, ds.d);
  }
};

// Fits scale and statistics on `ds` (population std, accumulated in double). Throws ValueError for
// an on-demand dataset (Dataset::produce): its rows are not in memory to fit on.
KILN_COMPILED Normalizer fit_normalizer(const Dataset& ds, const NormalizeOptions& options = {});

}  // namespace kiln::data

#if KILN_HEADER_BODIES
#include "kiln/data/normalize_bodies.hpp"
#endif
