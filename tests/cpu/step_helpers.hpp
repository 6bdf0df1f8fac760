// What the CPU suites around train::Step share (test_step.cpp, test_mixed.cpp): a host batch over
// owned buffers, and a model's parameters flattened for comparison.
#pragma once

#include <kiln/train.hpp>

#include <cstdint>
#include <vector>

namespace kiln_step_test {

// A host batch over owned buffers of `dim` features per row, shaped like data::Batch.
struct OwnedBatch {
  std::vector<float> x;
  std::vector<std::int32_t> y;
  kiln::index_t dim = 12;
  kiln::data::Batch batch() {
    kiln::data::Batch b;
    b.features = x;
    b.labels = y;
    b.size = kiln::index_t(y.size());
    b.dim = dim;
    return b;
  }
};

// rows x 12 features uniform in [-1, 1] and labels in [0, 4), drawn from `seed`.
inline OwnedBatch random_batch(kiln::index_t rows, std::uint64_t seed) {
  kiln::Generator g(seed);
  OwnedBatch b;
  for (kiln::index_t i = 0; i < rows * 12; ++i) b.x.push_back(g.uniform(-1.f, 1.f));
  for (kiln::index_t r = 0; r < rows; ++r) b.y.push_back(std::int32_t(g.below(4)));
  return b;
}

// Every parameter of a host model, in for_each_parameter's order.
template <class Model>
std::vector<float> values_of(const Model& m) {
  std::vector<float> out;
  m.for_each_parameter([&](const auto& v) { out.insert(out.end(), v.value().data(), v.value().data() + v.value().size()); });
  return out;
}

}  // namespace kiln_step_test
