// kiln/data/loader_bodies.hpp — the bodies of loader.hpp's functions: included by it when kiln
// is header-only, compiled once into kiln::kernels otherwise (KILN_COMPILED, kiln/config.hpp).
#pragma once

#include "kiln/data/loader.hpp"

namespace kiln::data {

KILN_COMPILED Loader::Loader(const Dataset& dataset, LoaderOptions options)
    : ds_(&dataset), opt_(std::move(options)) {
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

KILN_COMPILED Loader::~Loader() { stop_workers(); }

KILN_COMPILED void Loader::start_epoch(index_t epoch, index_t first_batch) {
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

KILN_COMPILED const Batch* Loader::next() {
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

KILN_COMPILED void Loader::assemble(Slot& slot, index_t k) {
  const index_t n = rows_per_epoch_, d = ds_->d, b = opt_.batch_size;
  const index_t first = k * b, size = std::min(b, n - first);
  slot.rows.assign(order_.begin() + first, order_.begin() + first + size);
  for (index_t r = 0; r < size; ++r) {
    const index_t i = slot.rows[static_cast<std::size_t>(r)];
    // An on-demand dataset's rows are made here, on this worker thread (Dataset::produce).
    ds_->read_row(i, epoch_, {slot.features.data() + r * d, static_cast<std::size_t>(d)});
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

KILN_COMPILED void Loader::worker_loop() {
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

KILN_COMPILED void Loader::stop_workers() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
    released_ = 0;
    space_.notify_all();
  }
  for (std::thread& t : workers_) t.join();
  workers_.clear();
}

}  // namespace kiln::data
