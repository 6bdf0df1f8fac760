// kiln/dist/buckets.hpp — what every gradient reducer (host on MPI, device on NCCL) shares: the
// check that the ranks run one model, and the buckets gradients travel in.
//
// check_same_model: every rank gathers every rank's parameter count and sizes, so every rank
// throws the same DistError naming the first difference (no rank is left waiting in a collective
// the others never reach).
//
// BucketPlan: about bucket_bytes of gradients a bucket (25 MB, as PyTorch's DDP), one all-reduce
// each; first in reverse table order (last layer first), then, after the first backward that
// reported every parameter, in the order backward really finished them (as DDP rebuilds its
// buckets): a layer's bias and weight travel together, not with the next layer's. Every rank runs
// one model and one backward, so every rank builds the same buckets and issues the same
// collectives in the same order.
#pragma once

#include <algorithm>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "kiln/autograd/var.hpp"
#include "kiln/config.hpp"
#include "kiln/core/error.hpp"
#include "kiln/dist/process_group.hpp"
#include "kiln/optim/param.hpp"

namespace kiln::dist {

// throws: DistError naming the first rank and parameter whose count or size differs from rank 0's.
// `gather(in, n, out)` is an all-gather of n int64 values (out holds ranks * n).
template <class Gather>
void check_same_model(const optim::ParamTable& table, int ranks, Gather&& gather) {
  if (ranks == 1) return;
  const std::int64_t count = table.count();
  std::vector<std::int64_t> counts(std::size_t(ranks), 0);
  gather(&count, 1, counts.data());
  for (int r = 1; r < ranks; ++r)
    KILN_CHECK(counts[std::size_t(r)] == counts[0], DistError, "dist: the ranks disagree on the model: rank ", r,
               " has ", counts[std::size_t(r)], " parameters, rank 0 has ", counts[0]);
  std::vector<std::int64_t> sizes(static_cast<std::size_t>(count)), all(static_cast<std::size_t>(count * ranks));
  for (index_t k = 0; k < count; ++k) sizes[std::size_t(k)] = table[k].size;
  gather(sizes.data(), count, all.data());
  for (index_t k = 0; k < count; ++k)
    for (int r = 1; r < ranks; ++r) {
      const std::int64_t theirs = all[std::size_t(r * count + k)], root = all[std::size_t(k)];
      KILN_CHECK(theirs == root, DistError, "dist: the ranks disagree on the model: parameter ", k, " has ", theirs,
                 " elements on rank ", r, " but ", root, " on rank 0");
    }
}

class BucketPlan {
 public:
  BucketPlan(const optim::ParamTable& table, index_t bucket_bytes);

  index_t count() const { return index_t(buckets_.size()); }
  const std::vector<index_t>& slots(index_t b) const { return buckets_[std::size_t(b)].slots; }
  // The bucket a table slot's gradient travels in (-1: none, an empty parameter).
  index_t bucket_of(index_t slot) const { return slot_bucket_[std::size_t(slot)]; }
  bool launched(index_t b) const { return buckets_[std::size_t(b)].launched; }
  // Floats of gradient bucket b carries this step (its slots that have a gradient).
  index_t elements(index_t b) const {
    index_t n = 0;
    for (index_t k : slots(b))
      if ((*table_)[k].has_gradient()) n += (*table_)[k].size;
    return n;
  }

  // Before the backward whose gradients the next optimizer step takes.
  void begin() {
    for (Bucket& b : buckets_) b.ready = 0, b.launched = false;
  }
  // The tape's word that a leaf's gradient is final: returns the bucket that is now complete, its
  // every parameter final and holding a gradient (marked launched), or -1.
  index_t leaf_ready(const ag::VarNode& node);
  // After the step's gradients are reduced: clears the marks and, after the first backward that
  // reported every parameter, rebuilds the buckets in the order gradients became final.
  void end_step();

 private:
  struct Bucket {
    std::vector<index_t> slots;  // table slots, in the order backward finishes them
    index_t ready = 0;
    bool launched = false;
  };

  void build(const std::vector<index_t>& order);

  const optim::ParamTable* table_;
  index_t bucket_bytes_;
  std::vector<Bucket> buckets_;
  std::vector<index_t> slot_bucket_;                       // table slot -> its bucket
  std::unordered_map<const bool*, index_t> slot_of_flag_;  // a parameter's grad_valid -> its slot
  std::vector<index_t> ready_order_;                       // slots in the order the first backward finished them
  bool rebuilt_ = false;                                   // the buckets follow that order
};

}  // namespace kiln::dist

#if KILN_HEADER_BODIES
#include "kiln/dist/buckets_bodies.hpp"
#endif
