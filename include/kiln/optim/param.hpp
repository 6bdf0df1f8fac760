// kiln/optim/param.hpp — parameters as an optimizer sees them: a table of (value, grad, size).
//
// The optimizers treat all parameters as ONE flat index space, the concatenation of the table's
// slots in order, so a step is one fused loop (one kernel on a device) however many tensors the
// model has. Optimizer state (momentum, exp_avg, ...) lives in one contiguous buffer per kind,
// where parameter k's state starts at offset(k).
//
//   kiln::optim::ParamTable table;
//   table.add(w.data(), dw.data(), w.size());
//   table.add(b.data(), db.data(), b.size());
//   kiln::optim::AdamW opt(table, {.lr = 1e-3});
#pragma once

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <vector>

#include "kiln/backend/cpu/executor.hpp"
#include "kiln/config.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/stats.hpp"

namespace kiln::optim {

// One parameter: `size` floats at `value`, its gradient at `grad`. The table does not own them.
// requires: value and grad do not overlap (the update loops read grad while writing value).
struct ParamSlot {
  float* value = nullptr;
  float* grad = nullptr;
  index_t size = 0;
};

class ParamTable {
 public:
  ParamTable() = default;
  ParamTable(std::initializer_list<ParamSlot> slots) {
    for (const ParamSlot& s : slots) add(s);
  }

  // Appends a parameter; returns its index in the table.
  index_t add(const ParamSlot& slot) {
    KILN_CHECK(slot.size >= 0, ValueError, "ParamTable::add: parameter ", slots_.size(), " has size ", slot.size,
               "; sizes must be >= 0");
    KILN_CHECK(slot.size == 0 || (slot.value != nullptr && slot.grad != nullptr), ValueError,
               "ParamTable::add: parameter ", slots_.size(), " of size ", slot.size,
               " needs non-null value and grad pointers");
    slots_.push_back(slot);
    offsets_.push_back(offsets_.back() + slot.size);
    return index_t(slots_.size()) - 1;
  }
  index_t add(float* value, float* grad, index_t size) { return add(ParamSlot{value, grad, size}); }

  // Number of parameters (tensors) in the table.
  index_t count() const { return index_t(slots_.size()); }
  // Number of elements over all parameters: the length of each optimizer state buffer.
  index_t total_size() const { return offsets_.back(); }
  // Where parameter k starts in the flat index space.
  index_t offset(index_t k) const { return offsets_[std::size_t(k)]; }

  const ParamSlot& operator[](index_t k) const { return slots_[std::size_t(k)]; }
  const std::vector<ParamSlot>& slots() const { return slots_; }
  auto begin() const { return slots_.begin(); }
  auto end() const { return slots_.end(); }

  // Calls f(slot, local_begin, local_end, flat_begin) for each piece of the flat range [b, e)
  // that lies in one parameter, in order. flat_begin is the flat index of local_begin, so the
  // state of element i of the piece sits at state[flat_begin + (i - local_begin)].
  // requires: 0 <= b <= e <= total_size().
  template <class F>
  void for_each_span(index_t b, index_t e, F&& f) const {
    if (b >= e) return;
    // The last slot starting at or before b; empty slots share their successor's offset, and
    // upper_bound steps past them.
    std::size_t k = std::size_t(std::upper_bound(offsets_.begin(), offsets_.end(), b) - offsets_.begin()) - 1;
    while (b < e) {
      const index_t off = offsets_[k], stop = std::min(e, offsets_[k + 1]);
      if (stop > b) f(slots_[k], b - off, stop - off, b);
      b = std::max(b, stop);
      ++k;
    }
  }

 private:
  std::vector<ParamSlot> slots_;
  std::vector<index_t> offsets_{0};  // count() + 1 entries: offsets_[k] .. offsets_[k + 1] is slot k
};

// Sets every gradient in the table to 0 as one launch (counted as an elementwise fill).
inline void zero_grad(const ParamTable& table, CpuExecutor& exec) {
  const index_t n = table.total_size();
  exec.stats().count(kind::elementwise, "zero_grad", n, std::size_t(n) * sizeof(float));
  exec.parallel_for(n, CpuExecutor::grain, [&](index_t b, index_t e) {
    table.for_each_span(b, e, [](const ParamSlot& s, index_t lb, index_t le, index_t) {
      std::fill(s.grad + lb, s.grad + le, 0.0f);
    });
  });
}

}  // namespace kiln::optim
