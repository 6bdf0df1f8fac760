// kiln/data/loader.hpp — mini-batches over a Dataset (in memory or produced on demand), shuffled
// per epoch, optionally assembled ahead of time on worker threads.
//
// Iteration (the one API):
//
//   kiln::data::Loader loader(train, {.batch_size = 64, .seed = 1});
//   for (index_t epoch = 0; epoch < epochs; ++epoch) {
//     loader.start_epoch(epoch);
//     while (const kiln::data::Batch* batch = loader.next()) { ... batch->features ... }
//   }
//
// Contract:
// - The order of epoch e is a pure function of (seed, e): the permutation comes from
//   Generator(seed, reserved_stream_base | e), so a run restarted at epoch e sees the same batches,
//   and the number of workers never changes which rows land in which batch.
// - The Batch and the memory its spans point to stay valid until the next call of next(),
//   start_epoch() or the destructor; the loader then reuses the buffer.
// - With workers > 0, up to `prefetch` batches are assembled ahead into a bounded ring of
//   prefetch + 1 buffers (the extra one is the batch the consumer holds). An exception thrown
//   while assembling (by the transform) is re-thrown from next() when the consumer reaches that
//   batch, and again from every later next() until start_epoch().
// - The dataset is referenced, not copied: it must outlive the loader and stay unchanged.
// - A dataset whose rows are made on demand (Dataset::produce, e.g. decoded images) has them made
//   while a batch is assembled: on the workers, in parallel with each other (one batch per
//   worker; up to prefetch + 1 batches are in flight, so prefetch >= workers keeps every worker
//   busy) and with training. produce(row, epoch) is given the dataset row and this epoch, so the
//   batches are still the same whatever the worker count; what it throws reaches next() as a
//   transform's exception does.
// - The loader object itself is used from one thread (the consumer).
#pragma once

#include <kiln/config.hpp>
#include <kiln/core/error.hpp>
#include <kiln/core/random.hpp>
#include <kiln/core/space.hpp>
#include <kiln/data/dataset.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <numeric>
#include <span>
#include <thread>
#include <utility>
#include <vector>

namespace kiln::data {

// One mini-batch: `size` rows of `dim` features, row-major and contiguous.
struct Batch {
  using space = kiln::host;        // where features and labels live
  std::span<float> features;       // size × dim
  std::span<std::int32_t> labels;  // size
  std::span<const index_t> rows;   // the dataset rows it holds, in batch order
  index_t size = 0;
  index_t dim = 0;
  index_t index = 0;  // position within the epoch, from 0
  index_t epoch = 0;
};

struct LoaderOptions {
  index_t batch_size = 32;
  bool shuffle = true;  // false: rows in dataset order every epoch
  std::uint64_t seed = 0;
  bool drop_last = false;  // true: omit a final batch smaller than batch_size
  int workers = 1;         // threads assembling batches; 0 = in next(), on the caller's thread
  int prefetch = 2;        // batches assembled ahead (with workers > 0), at least 1
  // A data-parallel job's share of every epoch (PyTorch's DistributedSampler, drop_last = false):
  // every rank draws the same permutation (the same seed), pads it to a multiple of `count` by
  // repeating its first rows, and rank r takes positions r, r + count, r + 2 count, ... So each
  // rank sees ceil(n / count) rows an epoch, the shares are disjoint but for the padding, and
  // batch k of every rank together hold the rows of one process's batch k at count times the
  // batch size. The default is the whole epoch.
  struct Shard {
    int rank = 0, count = 1;
  };
  Shard shard = {};
  // Runs on each assembled batch (on a worker thread when workers > 0), e.g. augmentation or
  // normalisation. Must be thread-safe when workers > 1; for randomness, derive it from
  // (epoch, index) with kiln/core/random.hpp so results do not depend on thread timing.
  std::function<void(Batch&)> transform = {};
};

class Loader {
 public:
  // Throws ValueError for an invalid dataset or options.
  Loader(const Dataset& dataset, LoaderOptions options);

  // A temporary dataset would dangle: the loader keeps a pointer to it.
  Loader(Dataset&&, LoaderOptions) = delete;

  Loader(const Loader&) = delete;  // workers hold `this`
  Loader& operator=(const Loader&) = delete;

  // Stops the workers, even mid-epoch: they finish at most the batch they are assembling.
  ~Loader();

  // Begins epoch `epoch` (any order of epochs; restarting one is allowed) and abandons whatever
  // is left of the current one. With first_batch > 0 the epoch starts at that batch, as if the
  // ones before had been taken: a run resumed from a checkpoint (kiln/train/checkpoint.hpp) sees
  // the batches the interrupted run would have seen next.
  void start_epoch(index_t epoch, index_t first_batch = 0);

  // The next batch of the epoch, or nullptr once the epoch is exhausted. Blocks until the batch
  // is ready; the time spent blocked (with workers = 0: spent assembling) adds to wait_seconds().
  const Batch* next();

  index_t batches_per_epoch() const { return batches_per_epoch_; }
  // Rows an epoch hands out: the dataset's, or this shard's (LoaderOptions::shard).
  index_t rows_per_epoch() const { return rows_per_epoch_; }
  // The epoch start_epoch() began last, and how many of its batches next() has handed out (the
  // position a checkpoint records).
  index_t epoch() const { return epoch_; }
  index_t batches_taken() const { return taken_; }
  index_t batch_size() const { return opt_.batch_size; }
  const Dataset& dataset() const { return *ds_; }

  // Seconds next() spent blocked waiting for data, and batches handed out, since construction
  // or reset_stats(), over all epochs.
  double wait_seconds() const { return std::chrono::duration<double>(wait_).count(); }
  index_t batches_served() const { return served_; }
  void reset_stats() {
    wait_ = {};
    served_ = 0;
  }

 private:
  struct Slot {
    std::vector<float> features;
    std::vector<std::int32_t> labels;
    std::vector<index_t> rows;
    Batch batch;
    index_t ready = -1;  // the batch index this buffer holds, once assembled (under mutex_)
  };

  // Copies (or produces) the rows of batch k into `slot`; reads only immutable state (dataset,
  // order_, epoch_).
  void assemble(Slot& slot, index_t k);

  void worker_loop();

  void stop_workers();

  const Dataset* ds_;
  LoaderOptions opt_;
  index_t batches_per_epoch_ = 0;
  index_t rows_per_epoch_ = 0;  // this shard's rows (the dataset's without sharding)
  std::vector<index_t> order_;
  std::vector<Slot> slots_;
  std::vector<std::thread> workers_;

  std::mutex mutex_;
  std::condition_variable space_;  // workers wait for a free buffer
  std::condition_variable ready_;  // the consumer waits for its batch
  bool stop_ = false;
  index_t next_claim_ = 0;  // next batch index a worker may take
  index_t released_ = 0;    // batches 0 .. released_-1 no longer need their buffers
  index_t failed_at_ = -1;
  std::exception_ptr error_;

  // Consumer-thread state.
  index_t epoch_ = 0;
  bool started_ = false;
  index_t taken_ = 0;
  index_t served_ = 0;
  std::chrono::steady_clock::duration wait_{};
};

}  // namespace kiln::data

#if KILN_HEADER_BODIES
#include "kiln/data/loader_bodies.hpp"
#endif
