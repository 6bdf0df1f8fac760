// kiln/dist/data_parallel.hpp — what makes a training step data-parallel: every rank holds the
// same parameters, runs forward and backward on its shard of the batch, and before the optimizer
// step the gradients are averaged over the ranks, so every rank takes the same step.
//
// GradientReducer, on the optimizer's parameter table:
// - check_same_model(): the ranks compare their parameter counts and sizes; the first difference
//   is a DistError naming the parameter, its size on this rank and on rank 0.
// - broadcast_parameters(): rank 0's values to every rank (a run starts from one model).
// - average_gradients(): the gradients in buckets of about bucket_bytes (25 MB, as PyTorch's DDP),
//   filled in reverse table order (the order backward finishes them: last layer first), one
//   all-reduce per bucket; parameters without a gradient this step (frozen, unused) are left out
//   on every rank alike (the ranks run one model, so the flags agree).
// With gradient accumulation the step averages once per optimizer step, not per micro-batch. With
// a loss scaler the check for inf / NaN runs after the average: an overflow on any rank reaches
// every rank's gradients (inf + x = inf, NaN + x = NaN), so every rank skips the same step.
//
// Host tensors only so far (MPI); gradients on a device wait for the NCCL group.
#pragma once

#include <algorithm>
#include <cstring>
#include <vector>

#include "kiln/config.hpp"
#include "kiln/core/error.hpp"
#include "kiln/dist/process_group.hpp"
#include "kiln/optim/param.hpp"

namespace kiln::dist {

struct DataParallelOptions {
  // Bytes of gradients reduced per all-reduce (at least one parameter per bucket).
  index_t bucket_bytes = index_t{25} << 20;
};

class GradientReducer {
 public:
  GradientReducer(ProcessGroup& group, const optim::ParamTable& table, DataParallelOptions options = {})
      : group_(&group), table_(&table), options_(options) {
    KILN_CHECK(options.bucket_bytes > 0, ValueError, "dist::GradientReducer: bucket_bytes = ", options.bucket_bytes,
               " must be positive");
  }

  ProcessGroup& group() const { return *group_; }

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

  // Every gradient becomes its average over the ranks (see the file comment).
  void average_gradients() {
    if (group_->size() == 1) return;
    const index_t per_bucket = std::max<index_t>(1, options_.bucket_bytes / index_t(sizeof(float)));
    std::vector<index_t> bucket;  // table slots, in the order backward finishes them
    index_t elements = 0;
    for (index_t k = table_->count() - 1; k >= 0; --k) {
      const optim::ParamSlot& slot = (*table_)[k];
      if (slot.size == 0 || !slot.has_gradient()) continue;
      if (!bucket.empty() && elements + slot.size > per_bucket) {
        reduce(bucket, elements);
        bucket.clear();
        elements = 0;
      }
      bucket.push_back(k);
      elements += slot.size;
    }
    if (!bucket.empty()) reduce(bucket, elements);
  }

  index_t buckets_reduced() const { return buckets_; }

 private:
  void reduce(const std::vector<index_t>& slots, index_t elements) {
    ++buckets_;
    if (slots.size() == 1) {  // one parameter: in place, no packing
      group_->all_reduce((*table_)[slots[0]].grad, elements, ReduceOp::average);
      return;
    }
    packed_.resize(std::size_t(elements));
    index_t at = 0;
    for (index_t k : slots) {
      const optim::ParamSlot& slot = (*table_)[k];
      std::memcpy(packed_.data() + at, slot.grad, std::size_t(slot.size) * sizeof(float));
      at += slot.size;
    }
    group_->all_reduce(packed_.data(), elements, ReduceOp::average);
    at = 0;
    for (index_t k : slots) {
      const optim::ParamSlot& slot = (*table_)[k];
      std::memcpy(slot.grad, packed_.data() + at, std::size_t(slot.size) * sizeof(float));
      at += slot.size;
    }
  }

  ProcessGroup* group_;
  const optim::ParamTable* table_;
  DataParallelOptions options_;
  std::vector<float> packed_;
  index_t buckets_ = 0;
};

}  // namespace kiln::dist
