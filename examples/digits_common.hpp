// examples/digits_common.hpp — what train_digits and finetune_digits share: the MLP, the digits20
// data (standardised as in MNIST recipes) and a subset of its classes ("0-4", "5-9", "0,3,7").
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "kiln/data/dataset.hpp"
#include "kiln/data/idx.hpp"
#include "kiln/data/normalize.hpp"
#include "kiln/nn/activation.hpp"
#include "kiln/nn/linear.hpp"
#include "kiln/nn/sequential.hpp"

namespace kiln_example {

using DigitsMlp = kiln::nn::Sequential<kiln::nn::Linear<400, 256>, kiln::nn::ReLU, kiln::nn::Linear<256, 128>,
                                       kiln::nn::ReLU, kiln::nn::Linear<128, 10>>;

struct DigitsData {
  kiln::data::Dataset train, test;
};

// digits20 from dir, standardised with one mean and std from the training set.
inline DigitsData load_digits(const std::string& data_dir) {
  const std::string dir = data_dir + "/";
  DigitsData d{kiln::data::load_idx_classification(dir + "digits20-train-images-idx3-ubyte.gz",
                                                   dir + "digits20-train-labels-idx1-ubyte.gz", 10),
               kiln::data::load_idx_classification(dir + "digits20-test-images-idx3-ubyte.gz",
                                                   dir + "digits20-test-labels-idx1-ubyte.gz", 10)};
  auto norm = kiln::data::fit_normalizer(d.train, {.scale = 1.0f / 255, .standardize = kiln::data::Standardize::global});
  norm.apply(d.train);
  norm.apply(d.test);
  return d;
}

// Which digits a list such as "0-4" or "1,3,5-7" names ("all" or "" = all ten).
// throws: ValueError naming the list when it is not one.
inline std::vector<bool> parse_digits(const std::string& list) {
  std::vector<bool> keep(10, list.empty() || list == "all");
  if (list.empty() || list == "all") return keep;
  std::size_t i = 0;
  auto digit = [&](std::size_t at) {
    KILN_CHECK(at < list.size() && list[at] >= '0' && list[at] <= '9', kiln::ValueError, "--digits \"", list,
               "\": expected digits like 0-4 or 1,3,5-7");
    return list[at] - '0';
  };
  while (i < list.size()) {
    const int lo = digit(i);
    int hi = lo;
    i += 1;
    if (i < list.size() && list[i] == '-') {
      hi = digit(i + 1);
      i += 2;
    }
    KILN_CHECK(lo <= hi, kiln::ValueError, "--digits \"", list, "\": range ", lo, "-", hi, " runs backwards");
    for (int k = lo; k <= hi; ++k) keep[std::size_t(k)] = true;
    if (i < list.size()) {
      KILN_CHECK(list[i] == ',', kiln::ValueError, "--digits \"", list, "\": expected ',' at character ", i + 1);
      ++i;
    }
  }
  return keep;
}

// The samples of `ds` whose label is kept (labels unchanged: the model keeps its 10 outputs).
inline kiln::data::Dataset only_digits(const kiln::data::Dataset& ds, const std::vector<bool>& keep) {
  kiln::data::Dataset out;
  out.d = ds.d;
  out.num_classes = ds.num_classes;
  out.sample_shape = ds.sample_shape;
  for (kiln::index_t i = 0; i < ds.n; ++i) {
    if (!keep[std::size_t(ds.labels[std::size_t(i)])]) continue;
    const auto row = ds.row(i);
    out.features.insert(out.features.end(), row.begin(), row.end());
    out.labels.push_back(ds.labels[std::size_t(i)]);
    ++out.n;
  }
  return out;
}

}  // namespace kiln_example
