// kiln/dist/buckets_bodies.hpp — the bodies of buckets.hpp's functions: included by it when kiln
// is header-only, compiled once into kiln::kernels otherwise (KILN_COMPILED, kiln/config.hpp).
#pragma once

#include "kiln/dist/buckets.hpp"

namespace kiln::dist {

KILN_COMPILED BucketPlan::BucketPlan(const optim::ParamTable& table, index_t bucket_bytes)
    : table_(&table), bucket_bytes_(bucket_bytes) {
  KILN_CHECK(bucket_bytes > 0, ValueError, "dist: bucket_bytes = ", bucket_bytes, " must be positive");
  std::vector<index_t> order;  // until a backward shows the real order: reverse table order
  for (index_t k = table.count() - 1; k >= 0; --k) {
    if (table[k].size > 0) order.push_back(k);
    if (table[k].has_grad != nullptr) slot_of_flag_[table[k].has_grad] = k;
  }
  build(order);
}

KILN_COMPILED index_t BucketPlan::leaf_ready(const ag::VarNode& node) {
  const auto it = slot_of_flag_.find(&node.grad_valid);
  if (it == slot_of_flag_.end()) return -1;  // not a parameter of this table (an input, a frozen one)
  if (!rebuilt_) ready_order_.push_back(it->second);
  const index_t b = slot_bucket_[std::size_t(it->second)];
  Bucket& bucket = buckets_[std::size_t(b)];
  if (++bucket.ready < index_t(bucket.slots.size())) return -1;
  for (index_t k : bucket.slots)  // a bucket with a slot that has no gradient waits for finish()
    if (!(*table_)[k].has_gradient()) return -1;
  bucket.launched = true;
  return b;
}

KILN_COMPILED void BucketPlan::end_step() {
  begin();
  if (rebuilt_ || ready_order_.empty()) return;
  std::vector<index_t> seen = ready_order_, all;
  std::sort(seen.begin(), seen.end());
  for (index_t k = 0; k < table_->count(); ++k)
    if ((*table_)[k].size > 0) all.push_back(k);
  if (seen == all) {
    build(ready_order_);
    rebuilt_ = true;
  }
  ready_order_.clear();
}

KILN_COMPILED void BucketPlan::build(const std::vector<index_t>& order) {
  const index_t per_bucket = std::max<index_t>(1, bucket_bytes_ / index_t(sizeof(float)));
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

}  // namespace kiln::dist
