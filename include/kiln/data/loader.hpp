// kiln/data/loader.hpp — mini-batches over an in-memory Dataset, shuffled per epoch, optionally
// assembled ahead of time on worker threads.
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
  Loader(const Dataset& dataset, LoaderOptions options) : ds_(&dataset), opt_(std::move(options)) {
    dataset.validate();
    KILN_CHECK(opt_.batch_size > 0, ValueError, "Loader: batch_size = ", opt_.batch_size,
               " must be positive");
    KILN_CHECK(opt_.workers >= 0, ValueError, "Loader: workers = ", opt_.workers,
               " must not be negative");
    KILN_CHECK(opt_.workers == 0 || opt_.prefetch >= 1, ValueError,
               "Loader: prefetch = ", opt_.prefetch,
               " must be at least 1 when workers > 0 (use workers = 0 for none)");
    KILN_CHECK(opt_.shard.count >= 1 && opt_.shard.rank >= 0 && opt_.shard.rank < opt_.shard.count, ValueError,
               "Loader: shard rank ", opt_.shard.rank, " of ", opt_.shard.count,
               " (the rank must lie in [0, count), count >= 1)");
    KILN_CHECK(opt_.shard.count == 1 || ds_->n > 0, ValueError, "Loader: an empty dataset cannot be sharded over ",
               opt_.shard.count, " ranks");
    rows_per_epoch_ = (ds_->n + opt_.shard.count - 1) / opt_.shard.count;
    const index_t n = rows_per_epoch_, b = opt_.batch_size;
    batches_per_epoch_ = opt_.drop_last ? n / b : (n + b - 1) / b;
    const std::size_t slots = opt_.workers == 0 ? 1 : static_cast<std::size_t>(opt_.prefetch) + 1;
    slots_.resize(slots);
    for (Slot& s : slots_) {
      s.features.resize(static_cast<std::size_t>(b * ds_->d));
      s.labels.resize(static_cast<std::size_t>(b));
    }
  }

  // A temporary dataset would dangle: the loader keeps a pointer to it.
  Loader(Dataset&&, LoaderOptions) = delete;

  Loader(const Loader&) = delete;  // workers hold `this`
  Loader& operator=(const Loader&) = delete;

  // Stops the workers, even mid-epoch: they finish at most the batch they are assembling.
  ~Loader() { stop_workers(); }

  // Begins epoch `epoch` (any order of epochs; restarting one is allowed) and abandons whatever
  // is left of the current one. With first_batch > 0 the epoch starts at that batch, as if the
  // ones before had been taken: a run resumed from a checkpoint (kiln/train/checkpoint.hpp) sees
  // the batches the interrupted run would have seen next.
  void start_epoch(index_t epoch, index_t first_batch = 0) {
    KILN_CHECK(epoch >= 0, ValueError, "Loader: epoch = ", epoch, " must not be negative");
    KILN_CHECK(first_batch >= 0 && first_batch <= batches_per_epoch_, ValueError, "Loader: first_batch = ",
               first_batch, " is outside the epoch's ", batches_per_epoch_, " batches");
    stop_workers();
    order_.resize(static_cast<std::size_t>(ds_->n));
    std::iota(order_.begin(), order_.end(), index_t{0});
    if (opt_.shuffle)
      Generator(opt_.seed, reserved_stream_base | static_cast<std::uint32_t>(epoch & 0x7fffffff))
          .shuffle(order_);
    if (opt_.shard.count > 1) {  // padded by repeating from the start, then every count-th
      std::vector<index_t> mine(static_cast<std::size_t>(rows_per_epoch_));
      for (index_t i = 0; i < rows_per_epoch_; ++i)
        mine[std::size_t(i)] = order_[std::size_t((opt_.shard.rank + i * opt_.shard.count) % ds_->n)];
      order_ = std::move(mine);
    }
    epoch_ = epoch;
    started_ = true;
    taken_ = next_claim_ = released_ = first_batch;
    failed_at_ = -1;
    error_ = nullptr;
    for (Slot& s : slots_) s.ready = -1;
    stop_ = false;
    for (int w = 0; w < opt_.workers; ++w) workers_.emplace_back([this] { worker_loop(); });
  }

  // The next batch of the epoch, or nullptr once the epoch is exhausted. Blocks until the batch
  // is ready; the time spent blocked (with workers = 0: spent assembling) adds to wait_seconds().
  const Batch* next() {
    KILN_CHECK(started_, ValueError, "Loader: call start_epoch(epoch) before next()");
    // Without workers error_ is consumer state; with workers it is read under the lock below.
    if (opt_.workers == 0 && error_) std::rethrow_exception(error_);
    if (taken_ >= batches_per_epoch_) return nullptr;
    const index_t k = taken_;
    Slot& slot = slots_[static_cast<std::size_t>(k) % slots_.size()];
    const auto t0 = std::chrono::steady_clock::now();
    if (opt_.workers == 0) {
      try {
        assemble(slot, k);
      } catch (...) {
        error_ = std::current_exception();
        failed_at_ = k;
        wait_ += std::chrono::steady_clock::now() - t0;
        throw;
      }
    } else {
      std::unique_lock lock(mutex_);
      // Handing out batch k frees the buffer of batch k - 1: workers may now fill batches up to
      // k - 1 + slot count.
      released_ = k;
      space_.notify_all();
      ready_.wait(lock, [&] { return slot.ready == k || (error_ && failed_at_ <= k); });
      if (slot.ready != k) {
        wait_ += std::chrono::steady_clock::now() - t0;
        std::rethrow_exception(error_);
      }
    }
    wait_ += std::chrono::steady_clock::now() - t0;
    ++taken_;
    ++served_;
    return &slot.batch;
  }

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

  // Copies the rows of batch k into `slot`; reads only immutable state (dataset, order_).
  void assemble(Slot& slot, index_t k) {
    const index_t n = rows_per_epoch_, d = ds_->d, b = opt_.batch_size;
    const index_t first = k * b, size = std::min(b, n - first);
    slot.rows.assign(order_.begin() + first, order_.begin() + first + size);
    for (index_t r = 0; r < size; ++r) {
      const index_t i = slot.rows[static_cast<std::size_t>(r)];
      if (d > 0)
        std::memcpy(slot.features.data() + r * d, ds_->features.data() + i * d,
                    static_cast<std::size_t>(d) * sizeof(float));
      slot.labels[static_cast<std::size_t>(r)] = ds_->labels[static_cast<std::size_t>(i)];
    }
    Batch& batch = slot.batch;
    batch.features = {slot.features.data(), static_cast<std::size_t>(size * d)};
    batch.labels = {slot.labels.data(), static_cast<std::size_t>(size)};
    batch.rows = slot.rows;
    batch.size = size;
    batch.dim = d;
    batch.index = k;
    batch.epoch = epoch_;
    if (opt_.transform) opt_.transform(slot.batch);
  }

  void worker_loop() {
    const auto slot_count = static_cast<index_t>(slots_.size());
    for (;;) {
      index_t k = 0;
      {
        std::unique_lock lock(mutex_);
        // Batch k's buffer last held batch k - slot_count, which must have been released.
        space_.wait(lock, [&] {
          return stop_ || error_ || next_claim_ >= batches_per_epoch_ ||
                 next_claim_ < released_ + slot_count;
        });
        if (stop_ || error_ || next_claim_ >= batches_per_epoch_) return;
        k = next_claim_++;
      }
      Slot& slot = slots_[static_cast<std::size_t>(k % slot_count)];
      try {
        assemble(slot, k);  // outside the lock: the copy is the work being overlapped
      } catch (...) {
        std::lock_guard lock(mutex_);
        // Keep the earliest failure: batches before it are still delivered, as without workers.
        if (!error_ || k < failed_at_) {
          error_ = std::current_exception();
          failed_at_ = k;
        }
        ready_.notify_all();
        space_.notify_all();
        return;
      }
      {
        // Notifying under the lock costs nothing here and keeps race detectors
        // (helgrind, DRD) quiet about signals sent without the mutex.
        std::lock_guard lock(mutex_);
        slot.ready = k;
        ready_.notify_all();
      }
    }
  }

  void stop_workers() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
      released_ = 0;
      space_.notify_all();
    }
    for (std::thread& t : workers_) t.join();
    workers_.clear();
  }

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
