// kiln/dist/data_parallel.hpp — what makes a training step data-parallel: every rank holds the
// same parameters, runs forward and backward on its shard of the batch, and before the optimizer
// step the gradients are averaged over the ranks, so every rank takes the same step.
//
// GradientReducer, on the optimizer's parameter table:
// - check_same_model(): the ranks compare their parameter counts and sizes; the first difference
//   is a DistError naming the parameter, its size on this rank and on rank 0.
// - broadcast_parameters(): rank 0's values to every rank (a run starts from one model).
// - Buckets: about bucket_bytes of gradients each (25 MB, as PyTorch's DDP), one all-reduce per
//   bucket; first in reverse table order (last layer first), then, after the first backward that
//   reported every parameter, in the order backward really finished them (as DDP rebuilds its
//   buckets): a layer's bias and weight travel together, not with the next layer's.
// - Overlap (DataParallelOptions::overlap, on by default): during the backward of the last
//   micro-batch before an optimizer step, the tape says when each parameter's gradient is final
//   (ag::BackwardOptions::on_leaf_ready); a bucket whose parameters are all final goes to a
//   communication thread, which packs it, all-reduces it and writes the averages back while
//   backward goes on. That thread needs a core: where the ranks' compute threads already fill
//   every core (2 ranks on the 2-core development machine), overlap hid about 10% of the
//   averaging but made the step about 3% slower than averaging after backward (batch 256 per
//   rank, bench/data_parallel); turn it off there. The MLP's first weight, 75% of its gradient
//   bytes, is finished by backward's last GEMM, so at most a quarter could hide there anyway. finish() waits for those and reduces, in order, the buckets that did
//   not go early (overlap off, a replayed step that runs no tape, mixed precision's master
//   gradients). Every rank runs
//   the same model and the same backward, so every rank issues the same collectives in the same
//   order, and the averages are bit for bit those of reducing after backward.
// - Parameters without a gradient this step (frozen, unused) are left out on every rank alike
//   (the ranks run one model, so the flags agree).
// With gradient accumulation the step averages once per optimizer step, not per micro-batch. With
// a loss scaler the check for inf / NaN runs after the average: an overflow on any rank reaches
// every rank's gradients (inf + x = inf, NaN + x = NaN), so every rank skips the same step.
//
// Host tensors only so far (MPI); gradients on a device wait for the NCCL group.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kiln/autograd/var.hpp"
#include "kiln/config.hpp"
#include "kiln/core/error.hpp"
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
      : group_(&group), table_(&table), options_(options) {
    KILN_CHECK(options.bucket_bytes > 0, ValueError, "dist::GradientReducer: bucket_bytes = ", options.bucket_bytes,
               " must be positive");
    std::vector<index_t> order;  // until a backward shows the real order: reverse table order
    for (index_t k = table.count() - 1; k >= 0; --k) {
      if (table[k].size > 0) order.push_back(k);
      if (table[k].has_grad != nullptr) slot_of_flag_[table[k].has_grad] = k;
    }
    build_buckets(order);
  }
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
  index_t buckets() const { return index_t(buckets_.size()); }
  // The bucket a table slot's gradient travels in (-1: none, an empty parameter).
  index_t bucket_of(index_t slot) const { return slot_bucket_[std::size_t(slot)]; }

  // throws: DistError naming the first parameter whose count or size differs from rank 0's.
  void check_same_model() {
    if (group_->size() == 1) return;
    const index_t count = table_->count();
    std::vector<std::int64_t> counts(std::size_t(group_->size()));
    const std::int64_t mine = count;
    group_->all_gather(&mine, 1, counts.data());
    for (int r = 0; r < group_->size(); ++r)
      KILN_CHECK(counts[std::size_t(r)] == counts[0], DistError, "dist: the ranks disagree on the model: rank ", r,
                 " has ", counts[std::size_t(r)], " parameters, rank 0 has ", counts[0]);
    std::vector<std::int64_t> sizes(static_cast<std::size_t>(count)), root(static_cast<std::size_t>(count));
    for (index_t k = 0; k < count; ++k) sizes[std::size_t(k)] = root[std::size_t(k)] = (*table_)[k].size;
    group_->broadcast(root.data(), count, 0);
    // Every rank learns whether any differs, so that all fail together (none is left waiting).
    std::int32_t differs = sizes == root ? 0 : 1;
    group_->all_reduce(&differs, 1);
    if (differs == 0) return;
    for (index_t k = 0; k < count; ++k)
      KILN_CHECK(sizes[std::size_t(k)] == root[std::size_t(k)], DistError,
                 "dist: the ranks disagree on the model: parameter ", k, " has ", sizes[std::size_t(k)],
                 " elements on ", group_->describe(), " but ", root[std::size_t(k)], " on rank 0");
    throw DistError(::kiln::detail::concat("dist: the ranks disagree on the model: ", differs,
                                           " rank(s) have parameter sizes unlike rank 0's (their errors name them)"));
  }

  // Rank 0's parameter values on every rank.
  void broadcast_parameters() {
    if (group_->size() == 1) return;
    for (index_t k = 0; k < table_->count(); ++k) group_->broadcast((*table_)[k].value, (*table_)[k].size, 0);
  }

  // Whether the next backward should report its final gradients (leaf_ready).
  bool overlaps() const { return options_.overlap && group_->size() > 1; }

  // Before the backward whose gradients the next optimizer step takes.
  void begin_backward() {
    for (Bucket& b : buckets_) b.ready = 0, b.launched = false;
  }

  // The tape's word that a leaf's gradient is final (ag::BackwardOptions::on_leaf_ready): its
  // bucket goes to the communication thread once all of the bucket's parameters are.
  void leaf_ready(const ag::VarNode& node) {
    const auto it = slot_of_flag_.find(&node.grad_valid);
    if (it == slot_of_flag_.end()) return;  // not a parameter of this table (an input, a frozen one)
    if (!rebuilt_) ready_order_.push_back(it->second);
    const index_t b = slot_bucket_[std::size_t(it->second)];
    Bucket& bucket = buckets_[std::size_t(b)];
    if (++bucket.ready < index_t(bucket.slots.size())) return;
    for (index_t k : bucket.slots)  // a bucket with a slot that has no gradient waits for finish()
      if (!(*table_)[k].has_gradient()) return;
    bucket.launched = true;
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
    for (Bucket& b : buckets_) {
      if (b.launched) {
        ++overlapped_;
      } else {
        pack(b);
        group_->all_reduce(b.packed.data(), index_t(b.packed.size()));
        unpack(b);
      }
      b.launched = false;
      b.ready = 0;
    }
    // After the first backward that reported every parameter: buckets in the order gradients
    // became final (as DDP rebuilds its buckets), so that no bucket waits for a parameter
    // backward finishes late. The same on every rank: one model, one backward.
    if (!rebuilt_ && !ready_order_.empty()) {
      std::vector<index_t> seen = ready_order_;
      std::sort(seen.begin(), seen.end());
      std::vector<index_t> all;
      for (index_t k = 0; k < table_->count(); ++k)
        if ((*table_)[k].size > 0) all.push_back(k);
      if (seen == all) {
        build_buckets(ready_order_);
        rebuilt_ = true;
      }
      ready_order_.clear();
    }
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
  struct Bucket {
    std::vector<index_t> slots;  // table slots, in the order backward finishes them
    std::vector<float> packed;
    index_t ready = 0;
    bool launched = false;
  };

  // Buckets of about bucket_bytes over the slots in `order` (the order backward finishes them).
  void build_buckets(const std::vector<index_t>& order) {
    const index_t per_bucket = std::max<index_t>(1, options_.bucket_bytes / index_t(sizeof(float)));
    buckets_.clear();
    slot_bucket_.assign(std::size_t(table_->count()), -1);
    index_t elements = 0;
    for (index_t k : order) {
      if (buckets_.empty() || elements + (*table_)[k].size > per_bucket) {
        buckets_.emplace_back();
        elements = 0;
      }
      buckets_.back().slots.push_back(k);
      elements += (*table_)[k].size;
      slot_bucket_[std::size_t(k)] = index_t(buckets_.size()) - 1;
    }
  }

  // The communication thread: packs a bucket, all-reduces it and writes the averages back. (A
  // non-blocking MPI_Iallreduce polled from here or from backward's steps was slower: MPI moves a
  // started collective only inside its calls, and its non-blocking algorithms are not its tuned
  // blocking ones — bench/data_parallel measured 3 to 8 times the exposed time.)
  void work() {
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_
      Bucket& bucket = buckets_[std::size_t(queue_.front())];
      queue_.pop_front();
      lock.unlock();
      const auto t0 = std::chrono::steady_clock::now();
      std::exception_ptr failed;
      try {
        pack(bucket);
        group_->all_reduce(bucket.packed.data(), index_t(bucket.packed.size()));
        unpack(bucket);
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

  // The bucket's gradients, those that have one this step, into its buffer.
  void pack(Bucket& bucket) {
    index_t elements = 0;
    for (index_t k : bucket.slots)
      if ((*table_)[k].has_gradient()) elements += (*table_)[k].size;
    bucket.packed.resize(std::size_t(elements));
    index_t at = 0;
    for (index_t k : bucket.slots) {
      const optim::ParamSlot& slot = (*table_)[k];
      if (!slot.has_gradient()) continue;
      std::memcpy(bucket.packed.data() + at, slot.grad, std::size_t(slot.size) * sizeof(float));
      at += slot.size;
    }
  }
  // The summed buffer, divided by the rank count, back into the gradients.
  void unpack(Bucket& bucket) {
    const float scale = 1.0f / float(group_->size());
    index_t at = 0;
    for (index_t k : bucket.slots) {
      const optim::ParamSlot& slot = (*table_)[k];
      if (!slot.has_gradient()) continue;
      for (index_t i = 0; i < slot.size; ++i) slot.grad[i] = bucket.packed[std::size_t(at + i)] * scale;
      at += slot.size;
    }
  }

  ProcessGroup* group_;
  const optim::ParamTable* table_;
  DataParallelOptions options_;
  std::vector<Bucket> buckets_;
  std::vector<index_t> slot_bucket_;                       // table slot -> its bucket
  std::unordered_map<const bool*, index_t> slot_of_flag_;  // a parameter's grad_valid -> its slot
  index_t overlapped_ = 0;
  double exposed_seconds_ = 0;
  std::vector<index_t> ready_order_;  // slots in the order the first backward finished them
  bool rebuilt_ = false;              // the buckets follow that order
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
