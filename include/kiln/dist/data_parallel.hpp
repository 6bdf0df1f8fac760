// kiln/dist/data_parallel.hpp — what makes a training step data-parallel: every rank holds the
// same parameters, runs forward and backward on its shard of the batch, and before the optimizer
// step the gradients are averaged over the ranks, so every rank takes the same step.
//
// GradientReducer, on the optimizer's parameter table (host memory, MPI):
// - check_same_model(), broadcast_parameters(): one model on every rank, rank 0's values
//   (kiln/dist/buckets.hpp names the first difference).
// - Buckets of about bucket_bytes (kiln/dist/buckets.hpp), rebuilt in backward's order.
// - Overlap (DataParallelOptions::overlap, on by default): during the backward of the last
//   micro-batch before an optimizer step, the tape says when each parameter's gradient is final
//   (ag::BackwardOptions::on_leaf_ready); a bucket whose parameters are all final goes to a
//   communication thread, which packs it, all-reduces it and writes the averages back while
//   backward goes on. That thread needs a core: where the ranks' compute threads already fill
//   every core (2 ranks on the 2-core development machine), overlap hid about 10% of the
//   averaging but made the step about 3% slower than averaging after backward (batch 256 per
//   rank, bench/data_parallel); turn it off there. The MLP's first weight, 75% of its gradient
//   bytes, is finished by backward's last GEMM, so at most a quarter could hide there anyway.
//   finish() waits for those and reduces, in order, the buckets that did not go early (overlap
//   off, a replayed step that runs no tape, mixed precision's master gradients). Every rank
//   issues the same collectives in the same order, and the averages are bit for bit those of
//   reducing after backward.
// - Parameters without a gradient this step (frozen, unused) are left out on every rank alike
//   (the ranks run one model, so the flags agree).
// With gradient accumulation the step averages once per optimizer step, not per micro-batch. With
// a loss scaler the check for inf / NaN runs after the average: an overflow on any rank reaches
// every rank's gradients (inf + x = inf, NaN + x = NaN), so every rank skips the same step.
//
// Gradients on a device are averaged by dist::DeviceGradientReducer (kiln/dist/device_reducer.cuh,
// on NCCL); train::Step picks the reducer its executor names.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "kiln/autograd/var.hpp"
#include "kiln/config.hpp"
#include "kiln/core/error.hpp"
#include "kiln/dist/buckets.hpp"
#include "kiln/dist/process_group.hpp"
#include "kiln/optim/param.hpp"

namespace kiln::dist {

struct DataParallelOptions {
  // Bytes of gradients reduced per all-reduce (at least one parameter per bucket).
  index_t bucket_bytes = index_t{25} << 20;
  // All-reduce a bucket during backward as soon as its gradients are final (see above).
  bool overlap = true;
};

class GradientReducer {
 public:
  GradientReducer(ProcessGroup& group, const optim::ParamTable& table, DataParallelOptions options = {})
      : group_(&group), table_(&table), options_(options), plan_(table, options.bucket_bytes),
        packed_(std::size_t(plan_.count())) {}
  // The form train::Step uses for every executor (a host reducer needs nothing of it).
  template <class Exec>
  GradientReducer(ProcessGroup& group, const optim::ParamTable& table, DataParallelOptions options, Exec&)
      : GradientReducer(group, table, options) {}
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;
  ~GradientReducer() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    if (worker_.joinable()) worker_.join();
  }

  ProcessGroup& group() const { return *group_; }
  index_t buckets() const { return plan_.count(); }
  // The bucket a table slot's gradient travels in (-1: none, an empty parameter).
  index_t bucket_of(index_t slot) const { return plan_.bucket_of(slot); }

  // throws: DistError naming the first parameter whose count or size differs from rank 0's.
  void check_same_model() {
    dist::check_same_model(*table_, group_->size(), [&](const std::int64_t* in, index_t n, std::int64_t* out) {
      group_->all_gather(in, n, out);
    });
  }

  // Rank 0's parameter values on every rank.
  void broadcast_parameters() {
    if (group_->size() == 1) return;
    for (index_t k = 0; k < table_->count(); ++k) group_->broadcast((*table_)[k].value, (*table_)[k].size, 0);
  }

  // Whether the next backward should report its final gradients (leaf_ready).
  bool overlaps() const { return options_.overlap && group_->size() > 1; }

  // Before the backward whose gradients the next optimizer step takes.
  void begin_backward() { plan_.begin(); }

  // The tape's word that a leaf's gradient is final (ag::BackwardOptions::on_leaf_ready): its
  // bucket goes to the communication thread once all of the bucket's parameters are.
  void leaf_ready(const ag::VarNode& node) {
    const index_t b = plan_.leaf_ready(node);
    if (b < 0) return;
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(b);
      ++in_flight_;
    }
    if (!worker_.joinable()) worker_ = std::thread([this] { work(); });
    wake_.notify_one();
  }

  // Every gradient becomes its average over the ranks: waits for the buckets sent during
  // backward, then reduces the others in order.
  // throws: DistError from a collective (also one the communication thread ran).
  void finish() {
    if (group_->size() == 1) return;
    const auto t0 = std::chrono::steady_clock::now();
    {
      std::unique_lock lock(mutex_);
      done_.wait(lock, [&] { return in_flight_ == 0; });
      if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
    }
    for (index_t b = 0; b < plan_.count(); ++b) {
      if (plan_.launched(b)) ++overlapped_;
      else reduce(b);
    }
    plan_.end_step();
    packed_.resize(std::size_t(plan_.count()));
    exposed_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  // Seconds finish() kept the step waiting for, or running, gradient averaging (with overlap off,
  // all of the averaging), and seconds the communication thread spent averaging buckets while
  // backward ran (bench/data_parallel compares them).
  double exposed_seconds() const { return exposed_seconds_; }
  double concurrent_seconds() const {
    std::lock_guard lock(mutex_);
    return concurrent_seconds_;
  }
  // Buckets averaged by the communication thread (sent during backward).
  index_t buckets_overlapped() const { return overlapped_; }
  void reset_timing() {
    std::lock_guard lock(mutex_);
    exposed_seconds_ = concurrent_seconds_ = 0;
    overlapped_ = 0;
  }

 private:
  // The communication thread: reduces the buckets backward hands it. (A non-blocking
  // MPI_Iallreduce polled from here or from backward's steps was slower: MPI moves a started
  // collective only inside its calls, and its non-blocking algorithms are not its tuned blocking
  // ones — bench/data_parallel measured 3 to 8 times the exposed time.)
  void work() {
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_
      const index_t b = queue_.front();
      queue_.pop_front();
      lock.unlock();
      const auto t0 = std::chrono::steady_clock::now();
      std::exception_ptr failed;
      try {
        reduce(b);
      } catch (...) {
        failed = std::current_exception();
      }
      const double spent = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      lock.lock();
      concurrent_seconds_ += spent;
      if (failed && !error_) error_ = failed;
      if (--in_flight_ == 0) done_.notify_all();
    }
  }

  // Bucket b's gradients (those that have one this step) packed into its buffer, all-reduced, and
  // the sums, divided by the rank count, written back.
  void reduce(index_t b) {
    std::vector<float>& packed = packed_[std::size_t(b)];
    packed.resize(std::size_t(plan_.elements(b)));
    index_t at = 0;
    for (index_t k : plan_.slots(b)) {
      const optim::ParamSlot& slot = (*table_)[k];
      if (!slot.has_gradient()) continue;
      std::memcpy(packed.data() + at, slot.grad, std::size_t(slot.size) * sizeof(float));
      at += slot.size;
    }
    group_->all_reduce(packed.data(), index_t(packed.size()));
    const float scale = 1.0f / float(group_->size());
    at = 0;
    for (index_t k : plan_.slots(b)) {
      const optim::ParamSlot& slot = (*table_)[k];
      if (!slot.has_gradient()) continue;
      for (index_t i = 0; i < slot.size; ++i) slot.grad[i] = packed[std::size_t(at + i)] * scale;
      at += slot.size;
    }
  }

  ProcessGroup* group_;
  const optim::ParamTable* table_;
  DataParallelOptions options_;
  BucketPlan plan_;
  std::vector<std::vector<float>> packed_;  // a buffer per bucket (the thread and finish() use different ones)
  index_t overlapped_ = 0;
  double exposed_seconds_ = 0;
  // The communication thread and what it shares with finish() (under mutex_).
  std::thread worker_;
  mutable std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::deque<index_t> queue_;
  index_t in_flight_ = 0;
  std::exception_ptr error_;
  bool stop_ = false;
  double concurrent_seconds_ = 0;
};

}  // namespace kiln::dist
