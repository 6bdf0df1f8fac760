// kiln/data/batch_loader.hpp — batches in a model's memory space: the one loader a training loop
// needs, whatever the backend.
//
//   kiln::data::BatchLoader<Model::space> loader(train, {.batch_size = 64, .seed = 0}, exec);
//   for (index_t epoch = 0; epoch < epochs; ++epoch) {
//     loader.start_epoch(epoch);
//     while (const auto* batch = loader.next()) step(*batch);   // kiln::train::Step
//   }
//
// kiln::host: the Loader itself (data::Batch: spans into its buffers, assembled ahead by worker
// threads). kiln::cuda (kiln/data/device_loader.cuh): a Loader feeding a DeviceLoader (pinned
// staging, an async copy on its own stream, events ordering it with the executor's stream;
// data::DeviceBatch: device pointers). Both batch types say their `space`, so a training step
// refuses a batch from the wrong one at compile time.
#pragma once

#include <type_traits>
#include <utility>

#include "kiln/core/space.hpp"
#include "kiln/data/loader.hpp"

namespace kiln::data {

template <class Space>
class BatchLoader;

// A batch's features or labels as a pointer: a host batch holds spans, a device batch pointers.
template <class P>
const auto* pointer_of(const P& p) {
  if constexpr (std::is_pointer_v<P>) return p;
  else return p.data();
}

template <>
class BatchLoader<host> : public Loader {
 public:
  // The executor is where batches are consumed; on the host nothing is copied for it.
  template <class Exec>
  BatchLoader(const Dataset& dataset, LoaderOptions options, Exec&) : Loader(dataset, std::move(options)) {}
  BatchLoader(Dataset&&, LoaderOptions, auto&) = delete;  // the loader keeps a pointer to the dataset
};

}  // namespace kiln::data
