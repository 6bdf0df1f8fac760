// kiln/train/evaluate.hpp — a classifier's accuracy on a dataset, in the model's memory space.
//
//   const double acc = kiln::train::accuracy(model, exec, test);
//
// The dataset goes through a BatchLoader in dataset order (no shuffle), each batch through the
// model in eval mode with nothing recorded (nn::EvalScope), the arg-max of each row is compared
// with its label. On a device only the predicted classes come back to the host.
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/autograd/tape.hpp"
#include "kiln/core/memory.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/data/batch_loader.hpp"
#include "kiln/expr/assign.hpp"
#include "kiln/nn/module.hpp"
#include "kiln/ops/reduce.hpp"

namespace kiln::train {

// The fraction of rows whose largest output is their label (0 for an empty dataset).
// requires: the model's output has one column per class of the dataset.
template <class Model, class Exec>
double accuracy(Model& model, Exec& exec, const data::Dataset& dataset, index_t batch_size = 1024) {
  using S = typename Model::space;
  static_assert(Model::in_features != dyn, "kiln::train::accuracy: the model's first layer must fix its input size");
  if (dataset.n == 0) return 0.0;
  nn::EvalScope evaluating(model);
  ag::Tape<Exec> tape(exec);
  data::BatchLoader<S> loader(dataset, {.batch_size = batch_size, .shuffle = false, .workers = 0}, exec);
  loader.start_epoch(0);
  ag::Var<float, S, dyn, Model::in_features> x;
  Tensor<std::int64_t, S, dyn> predicted;
  std::vector<std::int64_t> host_predicted;
  index_t right = 0, first = 0;
  while (const auto* batch = loader.next()) {
    KILN_CHECK(batch->dim == Model::in_features, ShapeError, "train::accuracy: the dataset has ", batch->dim,
               " features per row but the model's input size is ", Model::in_features);
    x.value().resize(Shape{batch->size, Model::in_features});
    exec.copy(x.value().data(), data::pointer_of(batch->features), std::size_t(x.value().size()) * sizeof(float));
    auto logits = model.forward(tape, x);
    predicted.resize(Shape{batch->size});
    assign(predicted, argmax<reduce_over::last_axis>(logits.value()), exec);
    host_predicted.resize(std::size_t(batch->size));
    memory_traits<S>::copy_to_host(host_predicted.data(), predicted.data(), host_predicted.size() * sizeof(std::int64_t));
    for (index_t i = 0; i < batch->size; ++i)
      right += host_predicted[std::size_t(i)] == dataset.labels[std::size_t(first + i)];
    first += batch->size;
  }
  return double(right) / double(dataset.n);
}

}  // namespace kiln::train
