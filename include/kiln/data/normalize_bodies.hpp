// kiln/data/normalize_bodies.hpp — the bodies of normalize.hpp's functions: included by it when kiln
// is header-only, compiled once into kiln::kernels otherwise (KILN_COMPILED, kiln/config.hpp).
#pragma once

#include "kiln/data/normalize.hpp"

namespace kiln::data {

KILN_COMPILED Normalizer fit_normalizer(const Dataset& ds, const NormalizeOptions& options) {
  Normalizer out;
  out.scale = options.scale;
  out.standardize = options.standardize;
  out.d = ds.d;
  if (options.standardize == Standardize::none) return out;
  KILN_CHECK(!ds.produce, ValueError,
             "fit_normalizer: the dataset makes its rows on demand (Dataset::produce), so there are no "
             "features in memory to fit statistics on; fit them on an in-memory sample instead");
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
