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
  void apply(Dataset& ds) const { apply(ds.features, ds.d); }
};

// Fits scale and statistics on `ds` (population std, accumulated in double).
inline Normalizer fit_normalizer(const Dataset& ds, const NormalizeOptions& options = {}) {
  Normalizer out;
  out.scale = options.scale;
  out.standardize = options.standardize;
  out.d = ds.d;
  if (options.standardize == Standardize::none) return out;
  KILN_CHECK(ds.n > 0 && ds.d > 0, ValueError,
             "fit_normalizer: standardisation needs a non-empty dataset (n = ", ds.n,
             ", d = ", ds.d, ")");
  const std::size_t groups =
      options.standardize == Standardize::per_feature ? static_cast<std::size_t>(ds.d) : 1;
  std::vector<double> sum(groups, 0.0), sum_sq(groups, 0.0);
  // Two passes (mean, then squared deviations) avoid the cancellation of E[x²] − E[x]².
  for (std::size_t i = 0; i < ds.features.size(); ++i)
    sum[groups == 1 ? 0 : i % groups] += double{ds.features[i]} * options.scale;
  const double per_group = static_cast<double>(ds.features.size()) / static_cast<double>(groups);
  for (double& s : sum) s /= per_group;
  for (std::size_t i = 0; i < ds.features.size(); ++i) {
    const std::size_t j = groups == 1 ? 0 : i % groups;
    const double dev = double{ds.features[i]} * options.scale - sum[j];
    sum_sq[j] += dev * dev;
  }
  out.mean.resize(groups);
  out.inv_std.resize(groups);
  for (std::size_t j = 0; j < groups; ++j) {
    const double sd = std::sqrt(sum_sq[j] / per_group);
    out.mean[j] = static_cast<float>(sum[j]);
    out.inv_std[j] = sd < options.min_std ? 1.0f : static_cast<float>(1.0 / sd);
  }
  return out;
}

}  // namespace kiln::data
